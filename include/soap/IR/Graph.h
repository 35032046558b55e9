// The IR graph: values (tensors) and ops in topological order. It holds only
// tensor computation; ONNX shape arithmetic has been folded by the importer.
#ifndef SOAP_IR_GRAPH_H
#define SOAP_IR_GRAPH_H

#include "soap/IR/OpSemantics.h"
#include "soap/IR/Types.h"
#include "llvm/Support/Error.h"
#include <map>
#include <string>
#include <variant>
#include <vector>

namespace soap {

/// Whether an op of `kind` only moves or relabels its input's elements
/// (Reshape, Transpose, Squeeze, Unsqueeze, Flatten, Identity).
bool isLayoutKind(llvm::StringRef kind);
/// The kinds a fused graph runs as views (Op::view): the layout kinds that
/// keep the element order (all but Transpose, whose copy is priced where
/// it stands), and Split.
bool isViewKind(llvm::StringRef kind);

using ValueId = int32_t;
using OpId = int32_t;
constexpr ValueId kNoValue = -1;

enum class ValueKind : uint8_t {
  Input,      ///< a graph input: data or labels (synthetic when executed)
  Weight,     ///< a trainable parameter (counts toward parameters)
  State,      ///< a non-trainable buffer (BatchNorm running statistics)
  Constant,   ///< a constant operand (scalars, masks); not trained
  Activation, ///< produced by an op
};
llvm::StringRef valueKindName(ValueKind k);

/// A tensor of the graph.
struct Value {
  ValueId id = kNoValue;
  std::string name;
  DType dtype = DType::F32;
  TensorShape shape;
  ValueKind kind = ValueKind::Activation;
  OpId producer = -1; ///< -1 unless kind == Activation
  int producerOutput = -1;
  std::vector<OpId> users; ///< in topological order, an op once per use
  /// The class of each tensor dimension (its "role"), set for graph inputs by
  /// the importer and for activations by their producer's semantics.
  std::vector<DimClass> dimClasses;
  /// For Weight/State/Constant: whether the file held the data (stripped
  /// weights keep dims only).
  bool hasData = false;
  /// Values of small constants (scalars, axes) when known, as doubles.
  std::vector<double> data;
  /// For a constant whose values were known at import (kept or not): its
  /// last two dims hold a causal mask, nonzero exactly where column <= row,
  /// the same in every leading index (what kernel fusion recognises as
  /// causal attention).
  bool lowerTriangular = false;
  /// Whether the gradient of some weight flows through this value: a weight,
  /// or an op's output whose weights or gradient inputs need one
  /// (Graph::computeSemantics). Graph inputs, constants and what is computed
  /// from them alone need none.
  bool needsGrad = false;
  /// A weight an FP8 GEMM reads (Op::fp8): Transformer Engine keeps an
  /// FP8 copy of it beside the bf16 weight, 1 byte per element.
  bool fp8Copy = false;

  bool isActivationLike() const {
    return kind == ValueKind::Activation || kind == ValueKind::Input;
  }
  int64_t bytes() const;
};

using AttrValue = std::variant<int64_t, double, std::string,
                               std::vector<int64_t>, std::vector<double>>;

/// An op: a kind from the registry, operands, attributes, and the semantics
/// the registry derived for it.
struct Op {
  OpId id = -1;
  std::string name;
  std::string kind; ///< ONNX op type, or a soapc kind (e.g. "LSTMCell")
  std::vector<ValueId> inputs;  ///< kNoValue for an absent optional input
  std::vector<ValueId> outputs; ///< kNoValue for an absent optional output
  std::map<std::string, AttrValue> attrs;
  OpSemantics sem;
  /// --precision fp8: a linear layer's GEMM that Transformer Engine runs in
  /// FP8 (E4M3 operands forward, E5M2 gradients backward, bf16 output),
  /// saving its activation inputs in FP8 (Graph::setPrecision).
  bool fp8 = false;
  /// An op that runs no kernel of its own (fuseKernels sets it; the eager
  /// graph has none):
  ///  - --kernels fused and no-flash: a reshape-like op or a Split, which
  ///    production stacks run as a view of its input (Megatron's view() of
  ///    the QKV projection, torch.split; isViewKind);
  ///  - --kernels fused: a bias added to a GEMM's output that nothing else
  ///    reads, which Transformer Engine's Linear adds in the GEMM's epilogue
  ///    (cuBLASLt's BIAS forward, BGRADB with the weight gradient).
  bool absorbed = false;

  bool hasAttr(llvm::StringRef key) const { return attrs.count(key.str()); }
  int64_t getInt(llvm::StringRef key, int64_t dflt) const;
  double getFloat(llvm::StringRef key, double dflt) const;
  std::string getString(llvm::StringRef key, llvm::StringRef dflt) const;
  std::vector<int64_t> getInts(llvm::StringRef key,
                               std::vector<int64_t> dflt = {}) const;
  ValueId input(size_t i) const {
    return i < inputs.size() ? inputs[i] : kNoValue;
  }
  ValueId output(size_t i) const {
    return i < outputs.size() ? outputs[i] : kNoValue;
  }
};

/// A training graph: ops topologically ordered, every value shaped.
class Graph {
public:
  std::string name;
  /// The file it came from (for error messages).
  std::string sourcePath;

  ValueId addValue(Value v);
  /// Appends an op and records it as producer/user of its values.
  OpId addOp(Op op);

  Value &value(ValueId id) { return values_[id]; }
  const Value &value(ValueId id) const { return values_[id]; }
  Op &op(OpId id) { return ops_[id]; }
  const Op &op(OpId id) const { return ops_[id]; }
  const std::vector<Value> &values() const { return values_; }
  const std::vector<Op> &ops() const { return ops_; }
  size_t numOps() const { return ops_.size(); }
  size_t numValues() const { return values_.size(); }

  std::vector<ValueId> inputs;  ///< graph inputs (kind Input), in file order
  std::vector<ValueId> outputs; ///< graph outputs

  /// Derives every op's semantics from the registry, in topological order,
  /// setting activation dim classes, which values need a gradient and which
  /// ops run a backward-data pass; checks shapes against the semantics.
  /// Errors name the file and the node.
  llvm::Error computeSemantics();
  /// Structural checks: ids in range, ops in topological order, each
  /// activation produced exactly once, shapes positive, no int64 overflow.
  llvm::Error verify() const;

  /// Trainable parameter count: elements of Weight values (each once).
  int64_t parameterCount() const;
  /// Forward FLOPs of the whole graph (every op's full tile).
  double forwardFlops() const;
  /// Mixed precision: every fp32 activation, input and weight becomes bf16
  /// (the fp32 master weights and optimizer state are the cost model's
  /// weightBytes; integer values and constants keep their types); the
  /// semantics are derived again (bytes saved for backward halve). FP8 is
  /// bf16 with Transformer Engine's FP8 linear layers: every MatMul or Gemm
  /// with a weight becomes Op::fp8 and its weight Value::fp8Copy, but the
  /// one whose output reaches the loss (or a graph output) through layout
  /// ops only: the LM head, which Megatron-Core builds outside Transformer
  /// Engine, stays bf16; so do attention's GEMMs (no weights), as TE's
  /// fused attention runs them in bf16 unless fp8_dpa is set.
  llvm::Error setPrecision(Precision p);
  /// FP8 after setPrecision(FP8); else BF16 when any weight or activation
  /// is bf16, else FP32.
  Precision precision() const;
  /// The op whose name is `name`, or -1.
  OpId findOp(llvm::StringRef name) const;
  ValueId findValue(llvm::StringRef name) const;
  /// "file.onnx: node 'conv1' (Conv)"; used to prefix errors.
  std::string where(OpId id) const;

private:
  std::vector<Value> values_;
  std::vector<Op> ops_;
  std::map<std::string, ValueId> valueByName_;
  std::map<std::string, OpId> opByName_;
  bool fp8_ = false; ///< setPrecision(FP8)
};

} // namespace soap

#endif // SOAP_IR_GRAPH_H
