// The element-wise functions' values and local partial derivatives, on the
// CPU: one definition for the element-wise kernel and the fused chain
// (KernelsPointwise.cpp, KernelsFused.cpp; private to lib/Exec).
#ifndef SOAP_EXEC_ELEMENTWISEMATH_H
#define SOAP_EXEC_ELEMENTWISEMATH_H

#include "ElementwiseFn.h"

#include <algorithm>
#include <cmath>
#include <cstddef>

namespace soap {
namespace exec {

struct ElemParams {
  ElemFn fn = ElemFn::Identity;
  float alpha = 0.01f, beta = 0; ///< ElemScalars
  bool toInt = false, toBool = false;
};

constexpr float kEltInvSqrt2 = 0.70710678118654752f;
constexpr float kEltInvSqrt2Pi = 0.39894228040143268f;
constexpr float kEltTwoOverSqrtPi = 1.12837916709551257f;

inline float elemApply(const ElemParams &p, const float *x) {
  switch (p.fn) {
  case ElemFn::Add:
    return x[0] + x[1];
  case ElemFn::Sub:
    return x[0] - x[1];
  case ElemFn::Mul:
    return x[0] * x[1];
  case ElemFn::Div:
    return x[0] / x[1];
  case ElemFn::Pow:
    return std::pow(x[0], x[1]);
  case ElemFn::Max:
    return std::max(x[0], x[1]);
  case ElemFn::Min:
    return std::min(x[0], x[1]);
  case ElemFn::Where:
    return x[0] != 0 ? x[1] : x[2];
  case ElemFn::Equal:
    return x[0] == x[1];
  case ElemFn::Less:
    return x[0] < x[1];
  case ElemFn::Greater:
    return x[0] > x[1];
  case ElemFn::Relu:
    return x[0] > 0 ? x[0] : 0.0f;
  case ElemFn::LeakyRelu:
    return x[0] > 0 ? x[0] : p.alpha * x[0];
  case ElemFn::Gelu:
    return 0.5f * x[0] * (1 + std::erf(x[0] * kEltInvSqrt2));
  case ElemFn::Sigmoid:
    return 1 / (1 + std::exp(-x[0]));
  case ElemFn::Tanh:
    return std::tanh(x[0]);
  case ElemFn::Erf:
    return std::erf(x[0]);
  case ElemFn::Exp:
    return std::exp(x[0]);
  case ElemFn::Log:
    return std::log(x[0]);
  case ElemFn::Sqrt:
    return std::sqrt(x[0]);
  case ElemFn::Reciprocal:
    return 1 / x[0];
  case ElemFn::Neg:
    return -x[0];
  case ElemFn::Abs:
    return std::fabs(x[0]);
  case ElemFn::Not:
    return x[0] == 0;
  case ElemFn::Cast:
    return p.toBool ? (x[0] != 0) : p.toInt ? std::trunc(x[0]) : x[0];
  case ElemFn::Identity:
  case ElemFn::Expand:
    return x[0];
  case ElemFn::Clip:
    return x[0] < p.alpha ? p.alpha : x[0] > p.beta ? p.beta : x[0];
  case ElemFn::HardSigmoid: {
    float t = p.alpha * x[0] + p.beta;
    return t <= 0 ? 0.0f : t >= 1 ? 1.0f : t;
  }
  case ElemFn::HardSwish:
    return x[0] <= -3 ? 0.0f : x[0] >= 3 ? x[0] : x[0] * (x[0] + 3) / 6;
  }
  return 0;
}

/// d y / d x[i] at the point (y is the forward output there).
inline float elemPartial(const ElemParams &p, const float *x, float y,
                         size_t i) {
  switch (p.fn) {
  case ElemFn::Add:
    return 1;
  case ElemFn::Sub:
    return i == 0 ? 1.0f : -1.0f;
  case ElemFn::Mul:
    return x[1 - i];
  case ElemFn::Div:
    return i == 0 ? 1 / x[1] : -x[0] / (x[1] * x[1]);
  case ElemFn::Pow:
    return i == 0 ? x[1] * std::pow(x[0], x[1] - 1) : y * std::log(x[0]);
  case ElemFn::Max:
    return (i == 0) == (x[0] >= x[1]) ? 1.0f : 0.0f;
  case ElemFn::Min:
    return (i == 0) == (x[0] <= x[1]) ? 1.0f : 0.0f;
  case ElemFn::Where:
    return i == 0 ? 0.0f : (i == 1) == (x[0] != 0) ? 1.0f : 0.0f;
  case ElemFn::Equal:
  case ElemFn::Less:
  case ElemFn::Greater:
  case ElemFn::Not:
    return 0;
  case ElemFn::Relu:
    return x[0] > 0 ? 1.0f : 0.0f;
  case ElemFn::LeakyRelu:
    return x[0] > 0 ? 1.0f : p.alpha;
  case ElemFn::Gelu:
    return 0.5f * (1 + std::erf(x[0] * kEltInvSqrt2)) +
           x[0] * kEltInvSqrt2Pi * std::exp(-0.5f * x[0] * x[0]);
  case ElemFn::Sigmoid:
    return y * (1 - y);
  case ElemFn::Tanh:
    return 1 - y * y;
  case ElemFn::Erf:
    return kEltTwoOverSqrtPi * std::exp(-x[0] * x[0]);
  case ElemFn::Exp:
    return y;
  case ElemFn::Log:
    return 1 / x[0];
  case ElemFn::Sqrt:
    return 0.5f / y;
  case ElemFn::Reciprocal:
    return -y * y;
  case ElemFn::Neg:
    return -1;
  case ElemFn::Abs:
    return x[0] > 0 ? 1.0f : x[0] < 0 ? -1.0f : 0.0f;
  case ElemFn::Cast:
    return p.toInt || p.toBool ? 0.0f : 1.0f;
  case ElemFn::Identity:
  case ElemFn::Expand:
    return 1;
  // At the kinks, PyTorch's choices: Clip and HardSigmoid pass no gradient
  // at their bounds, HardSwish's slope is (2x + 3) / 6 on [-3, 3].
  case ElemFn::Clip:
    return x[0] > p.alpha && x[0] < p.beta ? 1.0f : 0.0f;
  case ElemFn::HardSigmoid: {
    float t = p.alpha * x[0] + p.beta;
    return t > 0 && t < 1 ? p.alpha : 0.0f;
  }
  case ElemFn::HardSwish:
    return x[0] < -3 ? 0.0f : x[0] <= 3 ? (2 * x[0] + 3) / 6 : 1.0f;
  }
  return 0;
}

} // namespace exec
} // namespace soap

#endif // SOAP_EXEC_ELEMENTWISEMATH_H
