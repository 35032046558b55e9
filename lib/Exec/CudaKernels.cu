// CUDA kernels of the reference executor: one thread per point of a tile's
// loop space, operands addressed through the ops' index maps exactly as the
// CPU PointIter does, so every op that the CPU contraction and element-wise
// kernels run (Gemm, MatMul, Conv with stride/dilation/padding/groups, and
// the broadcasting element-wise ops) runs here unchanged.
#include "CudaKernels.h"

#include <cuda_runtime.h>

namespace soap {
namespace exec {
namespace cuda {

namespace {

__device__ int64_t floorDiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0)))
    --q;
  return q;
}

/// The offsets of point `p` (mixed radix, last loop fastest) in every
/// operand; -1 where it maps outside the tensor.
__device__ void offsetsOf(const DevSpace &s, int64_t p, int64_t *offs) {
  int64_t i[kMaxLoops];
  for (int l = s.numLoops - 1; l >= 0; --l) {
    i[l] = s.lo[l] + p % s.extent[l];
    p /= s.extent[l];
  }
  for (int o = 0; o < s.numOperands; ++o) {
    const DevOperand &op = s.ops[o];
    int64_t off = 0;
    for (int d = 0; d < op.numDims; ++d) {
      const DevDim &dm = op.dims[d];
      int64_t v = dm.offset;
      for (int l = 0; l < s.numLoops; ++l)
        v += dm.coeff[l] * i[l];
      int64_t idx = dm.divisor == 1 ? v : floorDiv(v, dm.divisor);
      if (idx < 0 || idx >= dm.size) {
        off = -1;
        break;
      }
      off += (idx - dm.lo) * dm.stride;
    }
    offs[o] = off;
  }
}

#define SOAP_POINTS(s)                                                         \
  for (int64_t p = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;             \
       p < (s).points; p += int64_t(gridDim.x) * blockDim.x)

__global__ void kContractionFwd(DevSpace s, float *y, const float *a,
                                const float *b, float alpha) {
  int64_t o[kMaxOperands];
  SOAP_POINTS(s) {
    offsetsOf(s, p, o);
    if (o[1] >= 0 && o[2] >= 0)
      atomicAdd(y + o[0], alpha * a[o[1]] * b[o[2]]);
  }
}

__global__ void kContractionBwd(DevSpace s, const float *dy, const float *a,
                                const float *b, float *da, float *db,
                                float alpha) {
  int64_t o[kMaxOperands];
  SOAP_POINTS(s) {
    offsetsOf(s, p, o);
    if (o[1] >= 0 && o[2] >= 0) {
      float g = alpha * dy[o[0]];
      atomicAdd(da + o[1], g * b[o[2]]);
      atomicAdd(db + o[2], g * a[o[1]]);
    }
  }
}

__global__ void kBiasFwd(DevSpace s, float *y, const float *c, float beta) {
  int64_t o[kMaxOperands];
  SOAP_POINTS(s) {
    offsetsOf(s, p, o);
    atomicAdd(y + o[0], beta * c[o[1]]);
  }
}

__global__ void kBiasBwd(DevSpace s, const float *dy, float *dc, float beta) {
  int64_t o[kMaxOperands];
  SOAP_POINTS(s) {
    offsetsOf(s, p, o);
    atomicAdd(dc + o[1], beta * dy[o[0]]);
  }
}

constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;
constexpr float kTwoOverSqrtPi = 1.12837916709551257f;

__device__ float apply(DevFn fn, float alpha, float beta, const float *x) {
  switch (fn) {
  case DevFn::Add:
    return x[0] + x[1];
  case DevFn::Sub:
    return x[0] - x[1];
  case DevFn::Mul:
    return x[0] * x[1];
  case DevFn::Div:
    return x[0] / x[1];
  case DevFn::Pow:
    return powf(x[0], x[1]);
  case DevFn::Max:
    return fmaxf(x[0], x[1]);
  case DevFn::Min:
    return fminf(x[0], x[1]);
  case DevFn::Where:
    return x[0] != 0 ? x[1] : x[2];
  case DevFn::Equal:
    return x[0] == x[1];
  case DevFn::Less:
    return x[0] < x[1];
  case DevFn::Greater:
    return x[0] > x[1];
  case DevFn::Relu:
    return x[0] > 0 ? x[0] : 0.0f;
  case DevFn::LeakyRelu:
    return x[0] > 0 ? x[0] : alpha * x[0];
  case DevFn::Gelu:
    return 0.5f * x[0] * (1 + erff(x[0] * kInvSqrt2));
  case DevFn::Sigmoid:
    return 1 / (1 + expf(-x[0]));
  case DevFn::Tanh:
    return tanhf(x[0]);
  case DevFn::Erf:
    return erff(x[0]);
  case DevFn::Exp:
    return expf(x[0]);
  case DevFn::Log:
    return logf(x[0]);
  case DevFn::Sqrt:
    return sqrtf(x[0]);
  case DevFn::Reciprocal:
    return 1 / x[0];
  case DevFn::Neg:
    return -x[0];
  case DevFn::Abs:
    return fabsf(x[0]);
  case DevFn::Not:
    return x[0] == 0;
  case DevFn::Cast:
  case DevFn::Identity:
  case DevFn::Expand:
    return x[0];
  case DevFn::Clip:
    return x[0] < alpha ? alpha : x[0] > beta ? beta : x[0];
  case DevFn::HardSigmoid: {
    float t = alpha * x[0] + beta;
    return t <= 0 ? 0.0f : t >= 1 ? 1.0f : t;
  }
  case DevFn::HardSwish:
    return x[0] <= -3 ? 0.0f : x[0] >= 3 ? x[0] : x[0] * (x[0] + 3) / 6;
  }
  return 0;
}

__device__ float partial(DevFn fn, float alpha, float beta, const float *x,
                         float y, int i) {
  switch (fn) {
  case DevFn::Add:
    return 1;
  case DevFn::Sub:
    return i == 0 ? 1.0f : -1.0f;
  case DevFn::Mul:
    return x[1 - i];
  case DevFn::Div:
    return i == 0 ? 1 / x[1] : -x[0] / (x[1] * x[1]);
  case DevFn::Pow:
    return i == 0 ? x[1] * powf(x[0], x[1] - 1) : y * logf(x[0]);
  case DevFn::Max:
    return (i == 0) == (x[0] >= x[1]) ? 1.0f : 0.0f;
  case DevFn::Min:
    return (i == 0) == (x[0] <= x[1]) ? 1.0f : 0.0f;
  case DevFn::Where:
    return i == 0 ? 0.0f : (i == 1) == (x[0] != 0) ? 1.0f : 0.0f;
  case DevFn::Equal:
  case DevFn::Less:
  case DevFn::Greater:
  case DevFn::Not:
    return 0;
  case DevFn::Relu:
    return x[0] > 0 ? 1.0f : 0.0f;
  case DevFn::LeakyRelu:
    return x[0] > 0 ? 1.0f : alpha;
  case DevFn::Gelu:
    return 0.5f * (1 + erff(x[0] * kInvSqrt2)) +
           x[0] * kInvSqrt2Pi * expf(-0.5f * x[0] * x[0]);
  case DevFn::Sigmoid:
    return y * (1 - y);
  case DevFn::Tanh:
    return 1 - y * y;
  case DevFn::Erf:
    return kTwoOverSqrtPi * expf(-x[0] * x[0]);
  case DevFn::Exp:
    return y;
  case DevFn::Log:
    return 1 / x[0];
  case DevFn::Sqrt:
    return 0.5f / y;
  case DevFn::Reciprocal:
    return -y * y;
  case DevFn::Neg:
    return -1;
  case DevFn::Abs:
    return x[0] > 0 ? 1.0f : x[0] < 0 ? -1.0f : 0.0f;
  case DevFn::Cast:
  case DevFn::Identity:
  case DevFn::Expand:
    return 1;
  case DevFn::Clip:
    return x[0] > alpha && x[0] < beta ? 1.0f : 0.0f;
  case DevFn::HardSigmoid: {
    float t = alpha * x[0] + beta;
    return t > 0 && t < 1 ? alpha : 0.0f;
  }
  case DevFn::HardSwish:
    return x[0] < -3 ? 0.0f : x[0] <= 3 ? (2 * x[0] + 3) / 6 : 1.0f;
  }
  return 0;
}

__global__ void kEltFwd(DevSpace s, DevFn fn, float alpha, float beta, int n,
                        float *y, const float *x0, const float *x1,
                        const float *x2) {
  int64_t o[kMaxOperands];
  const float *xs[3] = {x0, x1, x2};
  SOAP_POINTS(s) {
    offsetsOf(s, p, o);
    float x[3] = {0, 0, 0};
    for (int i = 0; i < n; ++i)
      x[i] = xs[i][o[1 + i]];
    y[o[0]] = apply(fn, alpha, beta, x);
  }
}

__global__ void kEltBwd(DevSpace s, DevFn fn, float alpha, float beta, int n,
                        const float *y, const float *dy, const float *x0,
                        const float *x1, const float *x2, float *dx0,
                        float *dx1, float *dx2) {
  int64_t o[kMaxOperands];
  const float *xs[3] = {x0, x1, x2};
  float *dxs[3] = {dx0, dx1, dx2};
  SOAP_POINTS(s) {
    offsetsOf(s, p, o);
    float x[3] = {0, 0, 0};
    for (int i = 0; i < n; ++i)
      x[i] = xs[i][o[1 + i]];
    for (int i = 0; i < n; ++i)
      if (dxs[i])
        atomicAdd(dxs[i] + o[1 + i],
                  partial(fn, alpha, beta, x, y[o[0]], i) * dy[o[0]]);
  }
}

unsigned blocksFor(int64_t points) {
  int64_t b = (points + 255) / 256;
  return static_cast<unsigned>(b < 65535 ? (b < 1 ? 1 : b) : 65535);
}

} // namespace

void contractionForward(const DevSpace &s, float *y, const float *a,
                        const float *b, float alpha) {
  kContractionFwd<<<blocksFor(s.points), 256>>>(s, y, a, b, alpha);
}

void contractionBackward(const DevSpace &s, const float *dy, const float *a,
                         const float *b, float *da, float *db, float alpha) {
  kContractionBwd<<<blocksFor(s.points), 256>>>(s, dy, a, b, da, db, alpha);
}

void biasForward(const DevSpace &s, float *y, const float *c, float beta) {
  kBiasFwd<<<blocksFor(s.points), 256>>>(s, y, c, beta);
}

void biasBackward(const DevSpace &s, const float *dy, float *dc, float beta) {
  kBiasBwd<<<blocksFor(s.points), 256>>>(s, dy, dc, beta);
}

void eltForward(const DevSpace &s, DevFn fn, float alpha, float beta, int n,
                float *y, const float *x0, const float *x1, const float *x2) {
  kEltFwd<<<blocksFor(s.points), 256>>>(s, fn, alpha, beta, n, y, x0, x1, x2);
}

void eltBackward(const DevSpace &s, DevFn fn, float alpha, float beta, int n,
                 const float *y, const float *dy, const float *x0,
                 const float *x1, const float *x2, float *dx0, float *dx1,
                 float *dx2) {
  kEltBwd<<<blocksFor(s.points), 256>>>(s, fn, alpha, beta, n, y, dy, x0, x1,
                                        x2, dx0, dx1, dx2);
}

const char *lastError() {
  cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

} // namespace cuda
} // namespace exec
} // namespace soap
