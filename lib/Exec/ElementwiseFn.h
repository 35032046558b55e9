// The element-wise functions the executor's kernels compute, one list for
// the CPU and the CUDA kernels (plain C++: nvcc compiles it too).
#ifndef SOAP_LIB_EXEC_ELEMENTWISEFN_H
#define SOAP_LIB_EXEC_ELEMENTWISEFN_H

#include <optional>
#include <string_view>

namespace soap {
namespace exec {

enum class ElemFn : int {
  Add,
  Sub,
  Mul,
  Div,
  Pow,
  Max,
  Min,
  Where,
  Equal,
  Less,
  Greater,
  Relu,
  LeakyRelu,
  Gelu,
  Sigmoid,
  Tanh,
  Erf,
  Exp,
  Log,
  Sqrt,
  Reciprocal,
  Neg,
  Abs,
  Not,
  Cast,
  Identity,
  Expand,
  Clip,
  HardSigmoid,
  HardSwish
};

/// The function of an op kind ("Relu" -> Relu); nullopt for other kinds.
inline std::optional<ElemFn> elemFnOf(std::string_view kind) {
  static constexpr std::string_view kNames[] = {
      "Add",        "Sub",    "Mul",       "Div",         "Pow",
      "Max",        "Min",    "Where",     "Equal",       "Less",
      "Greater",    "Relu",   "LeakyRelu", "Gelu",        "Sigmoid",
      "Tanh",       "Erf",    "Exp",       "Log",         "Sqrt",
      "Reciprocal", "Neg",    "Abs",       "Not",         "Cast",
      "Identity",   "Expand", "Clip",      "HardSigmoid", "HardSwish"};
  for (int i = 0; i < static_cast<int>(sizeof(kNames) / sizeof(kNames[0])); ++i)
    if (kNames[i] == kind)
      return static_cast<ElemFn>(i);
  return std::nullopt;
}

/// The two scalars an element-wise function takes from its attributes:
/// LeakyRelu's alpha; Clip's min and max (the importer makes its bound
/// operands attributes); HardSigmoid's alpha and beta. `get(name, dflt)`
/// reads a float attribute.
struct ElemScalars {
  float a = 0, b = 0;
};
template <class Get> ElemScalars elemScalars(ElemFn fn, Get get) {
  switch (fn) {
  case ElemFn::LeakyRelu:
    return {float(get("alpha", 0.01)), 0};
  case ElemFn::Clip:
    return {float(get("min", -3.4028234663852886e38)),
            float(get("max", 3.4028234663852886e38))};
  case ElemFn::HardSigmoid:
    return {float(get("alpha", 0.2)), float(get("beta", 0.5))};
  default:
    return {};
  }
}

} // namespace exec
} // namespace soap

#endif // SOAP_LIB_EXEC_ELEMENTWISEFN_H
