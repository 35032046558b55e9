// Small hand-built IR graphs for unit tests (no ONNX involved).
#ifndef SOAP_TEST_IR_TESTGRAPHS_H
#define SOAP_TEST_IR_TESTGRAPHS_H

#include "soap/IR/Graph.h"
#include "soap/IR/OpRegistry.h"
#include "soap/Support/Error.h"
#include <catch2/catch.hpp>
#include <string>
#include <vector>

namespace soap::test {

/// Builds a graph one op at a time; values are named v0, v1, ...
class GraphBuilder {
public:
  GraphBuilder() { g.sourcePath = "test.onnx"; }
  Graph g;

  ValueId input(std::vector<int64_t> shape, DType t = DType::F32) {
    Value v;
    v.name = "in" + std::to_string(g.numValues());
    v.shape = TensorShape(shape);
    v.dtype = t;
    v.kind = ValueKind::Input;
    v.dimClasses.assign(shape.size(), DimClass::Attribute);
    if (!shape.empty())
      v.dimClasses[0] = DimClass::Sample;
    ValueId id = g.addValue(v);
    g.inputs.push_back(id);
    return id;
  }
  ValueId weight(std::vector<int64_t> shape) {
    return constant(shape, ValueKind::Weight);
  }
  ValueId constant(std::vector<int64_t> shape, ValueKind kind,
                   std::vector<double> data = {}, DType t = DType::F32) {
    Value v;
    v.name = "c" + std::to_string(g.numValues());
    v.shape = TensorShape(shape);
    v.dtype = t;
    v.kind = kind;
    v.data = std::move(data);
    v.hasData = !v.data.empty();
    return g.addValue(v);
  }
  /// Adds an op whose outputs have the given shapes; returns its output ids.
  std::vector<ValueId> op(std::string kind, std::vector<ValueId> inputs,
                          std::vector<std::vector<int64_t>> outShapes,
                          std::map<std::string, AttrValue> attrs = {},
                          DType outType = DType::F32) {
    Op o;
    o.kind = kind;
    o.name = kind + "_" + std::to_string(g.numOps());
    o.inputs = std::move(inputs);
    o.attrs = std::move(attrs);
    std::vector<ValueId> outs;
    for (auto &s : outShapes) {
      Value v;
      v.name = o.name + "_out" + std::to_string(outs.size());
      v.shape = TensorShape(s);
      v.dtype = outType;
      outs.push_back(g.addValue(v));
    }
    o.outputs = outs;
    g.addOp(std::move(o));
    return outs;
  }
};

using Ints = std::vector<int64_t>;

/// The attributes of a FlashAttention over [batch, seq, heads, dim] Q, K, V
/// and O (the fused op the importer writes), without dropout; causal with
/// `where` as the mask kind.
inline std::map<std::string, AttrValue> flashAttentionAttrs(double scale,
                                                            bool causal) {
  return {{"q_dims", Ints{0, 2, 1, 3}},
          {"k_dims", Ints{0, 2, 1, 3}},
          {"v_dims", Ints{0, 2, 1, 3}},
          {"o_dims", Ints{0, 2, 1, 3}},
          {"batch_dims", int64_t(2)},
          {"scale", scale},
          {"causal", int64_t(causal)},
          {"mask", causal ? std::string("where") : std::string()},
          {"mask_fill", -3.4028234663852886e38},
          {"dropout_ratio", 0.0},
          {"dropout_name", std::string()}};
}

/// Fails the test with the error's message when `err` is set.
inline void requireOk(llvm::Error err) {
  if (err)
    FAIL(errorMessage(std::move(err)));
}

} // namespace soap::test

#endif // SOAP_TEST_IR_TESTGRAPHS_H
