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
  Expand
};

/// The function of an op kind ("Relu" -> Relu); nullopt for other kinds.
inline std::optional<ElemFn> elemFnOf(std::string_view kind) {
  static constexpr std::string_view kNames[] = {
      "Add",     "Sub",     "Mul",  "Div",       "Pow",  "Max",
      "Min",     "Where",   "Equal", "Less",     "Greater", "Relu",
      "LeakyRelu", "Gelu",  "Sigmoid", "Tanh",   "Erf",  "Exp",
      "Log",     "Sqrt",    "Reciprocal", "Neg", "Abs",  "Not",
      "Cast",    "Identity", "Expand"};
  for (int i = 0; i < static_cast<int>(sizeof(kNames) / sizeof(kNames[0]));
       ++i)
    if (kNames[i] == kind)
      return static_cast<ElemFn>(i);
  return std::nullopt;
}

} // namespace exec
} // namespace soap

#endif // SOAP_LIB_EXEC_ELEMENTWISEFN_H
