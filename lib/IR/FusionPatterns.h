// Kernel fusion's fixed patterns that become one op of their own kind
// (private to lib/IR; Fusion.cpp emits them): RMSNorm written out as
// element-wise ops and a mean, and rotary position embedding written as
// slices, a negation, a concatenation and products with cos/sin tables.
#ifndef SOAP_LIB_IR_FUSIONPATTERNS_H
#define SOAP_LIB_IR_FUSIONPATTERNS_H

#include "soap/IR/Graph.h"

#include <map>
#include <string>
#include <vector>

namespace soap::detail {

/// One matched pattern and the op that replaces it.
struct FusedPattern {
  std::vector<OpId> members; ///< ascending
  std::string kind;
  std::string scope; ///< the fused op is named "<scope>/<kind>"
  std::vector<ValueId> inputs, outputs;
  std::map<std::string, AttrValue> attrs;
};

/// x · rsqrt(mean(x², last axis) + eps) [· w] (Pow or Mul for the square,
/// Div(1, Sqrt) or Reciprocal(Sqrt)) as RMSNormalization(x[, w]) with
/// `axis` and `epsilon`, as ONNX opset 23 defines it.
std::vector<FusedPattern> matchRmsNorms(const Graph &g);

/// x · cos + rotate_half(x) · sin, rotate_half(x) = concat(-x[h:], x[:h])
/// over the last axis of length 2h, as RotaryEmbedding(x, cos, sin) (ONNX
/// opset 23's op, non-interleaved). `taken` marks ops already in a
/// pattern.
std::vector<FusedPattern> matchRotaries(const Graph &g,
                                        const std::vector<bool> &taken);

} // namespace soap::detail

#endif // SOAP_LIB_IR_FUSIONPATTERNS_H
