// What the importer's stages share: the parsed model, the constants known so
// far and the tensor types from the latest shape inference. Private to
// lib/Import.
#ifndef SOAP_IMPORT_IMPORTSTATE_H
#define SOAP_IMPORT_IMPORTSTATE_H

#include "ConstTensor.h"
#include "soap/IR/Graph.h"
#include "soap/IR/OpRegistry.h"
#include "soap/Import/OnnxImporter.h"
#include <fmt/format.h>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace soap {
namespace import {

/// A tensor's type as shape inference left it.
struct TensorInfo {
  int32_t elemType = 0;
  bool hasShape = false;
  std::vector<int64_t> dims; ///< -1 where unknown
  bool fullyKnown() const {
    if (!hasShape)
      return false;
    for (int64_t d : dims)
      if (d < 0)
        return false;
    return true;
  }
};

struct ImportState {
  std::string path;
  /// The file's bytes when importing from memory (then `path` only names
  /// it); nullptr to read `path`.
  const llvm::StringRef *buffer = nullptr;
  ImportOptions opts;
  /// The model; after loadModel its nodes are in topological order and its
  /// graph inputs carry the batch instead of symbolic dims.
  onnx::ModelProto model;
  /// Opset version of the default domain.
  int64_t opset = 0;
  /// Unique display name of each node: its own, or "<op_type>_<index>".
  std::vector<std::string> nodeNames;
  /// Nodes evaluated away by constant folding.
  std::vector<bool> folded;
  /// Constants: integer initializers with data, Constant nodes and folded
  /// node outputs (hasData false when too large to keep).
  std::map<std::string, ConstTensor> consts;
  /// Initializer name -> index in graph().initializer().
  std::map<std::string, int> initializers;
  /// Graph inputs that are not initializers, in file order, and which of
  /// their dims were symbolic (the sample dim).
  std::vector<std::string> inputNames;
  std::map<std::string, std::vector<bool>> symbolicDims;
  /// Tensor -> index of the node producing it.
  std::map<std::string, int> producer;
  /// Types after the latest shape inference (every tensor it saw).
  std::map<std::string, TensorInfo> infos;
  /// Output types that soapc infers where ONNX's inference does not
  /// (Einsum), given to each inference as value_info.
  std::map<std::string, TensorInfo> inferredHere;

  const onnx::GraphProto &graph() const { return model.graph(); }
  /// "model.onnx: node 'conv1'"
  std::string where(int node) const {
    return fmt::format("{}: node '{}'", path, nodeNames[node]);
  }
  /// "tensor 'x' (output of node 'n')", "(graph input)", "(initializer)"
  std::string describe(const std::string &tensor) const;
  /// The tensor's dims, or the error "shape unknown after shape inference".
  llvm::Expected<std::vector<int64_t>>
  knownDims(const std::string &tensor) const;
  /// Input k of node i as a constant with data; nullptr when absent; an
  /// error when present but not constant.
  llvm::Expected<const ConstTensor *> constInput(int i, int k,
                                                 llvm::StringRef what) const;
};

/// A remaining ONNX node in the form the IR wants.
struct IrNode {
  int node = -1;
  /// The op's name when not the ONNX node's (ops a rewrite adds).
  std::string name;
  std::string kind;
  std::vector<std::string> inputs, outputs; ///< "" for absent
  std::map<std::string, AttrValue> attrs;
  const OpKindInfo *info = nullptr;
};

bool isReduceOp(const std::string &op);
/// Ops whose operands after the first become attributes.
bool keepsOnlyData(const std::string &op);
/// Turns constant operands of node i into the attributes the op registry
/// expects and drops them from ir.inputs; normalises axes.
llvm::Error applyConventions(const ImportState &s, int i, IrNode &ir);

/// Folds a zero constant Pad into the Conv / AveragePool that consume it
/// (PyTorch exports avg_pool2d(padding=1) as Pad + AveragePool).
void fusePads(ImportState &s);

/// Parses the file, checks external-data paths and the graph's structure
/// (dangling inputs, cycles), sorts the nodes topologically and replaces the
/// symbolic dims of the graph inputs by the batch.
llvm::Error loadModel(ImportState &s);

/// Alternates ONNX shape inference and constant folding until nothing
/// changes; leaves the final types in s.infos.
llvm::Error foldAndInfer(ImportState &s);

/// Where a sample dim sits inside the rows of a 2-D Gemm but not first
/// (PyTorch's multi-head attention: [T, N*h, d] -> [T*N, E] -> out_proj ->
/// [T, N, E]), the merge would lose it: rewrites Reshape(X -> [R, E]) ->
/// Gemm(B, C) -> Reshape(-> [d..., E']) into Reshape(X -> [d..., E]) ->
/// MatMul(B, transposed when transB) -> Add(C), the same numbers with the
/// rows unmerged. `g` is the graph built from `nodes` (its dim classes say
/// where the sample dim is). Returns whether anything changed.
bool unmergeSampleRows(ImportState &s, const Graph &g,
                       std::vector<IrNode> &nodes);

/// Whether node `n` is lowered to several IR ops rather than imported as
/// one (Einsum).
bool isLoweredOp(const onnx::NodeProto &n);
/// The output dims of Einsum node i from its operands' dims in s.infos;
/// nullopt while they are unknown or when lowerEinsum would refuse it
/// (ONNX's own inference gives only the rank).
std::optional<std::vector<int64_t>> einsumDims(const ImportState &s, int i);
/// Einsum node i as Transpose / ReduceSum / Reshape / MatMul nodes, the
/// last writing the Einsum's output; an equation it cannot lower is an
/// inputError naming the node and the equation.
llvm::Expected<std::vector<IrNode>> lowerEinsum(ImportState &s, int i);

/// Builds, checks and returns the IR graph (loss appended when asked).
llvm::Expected<std::unique_ptr<Graph>> buildGraph(ImportState &s);

} // namespace import
} // namespace soap

#endif // SOAP_IMPORT_IMPORTSTATE_H
