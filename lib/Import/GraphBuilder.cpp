// Builds the IR graph from the folded ONNX graph: operand conventions of the
// op registry, value kinds (input, weight, state, constant) and the loss.
#include "ImportState.h"

#include "soap/IR/OpRegistry.h"
#include "soap/Support/Error.h"
#include <algorithm>
#include <fmt/ranges.h>
#include <limits>

namespace soap {
namespace import {
namespace {

llvm::Expected<DType> toDType(int32_t elemType) {
  using TP = onnx::TensorProto;
  switch (elemType) {
  case TP::FLOAT:
    return DType::F32;
  case TP::FLOAT16:
    return DType::F16;
  case TP::BFLOAT16:
    return DType::BF16;
  case TP::DOUBLE:
    return DType::F64;
  case TP::INT64:
    return DType::I64;
  case TP::INT32:
    return DType::I32;
  case TP::INT8:
    return DType::I8;
  case TP::UINT8:
    return DType::U8;
  case TP::BOOL:
    return DType::Bool;
  default:
    return inputError("element type {} is not supported",
                      elemTypeName(elemType));
  }
}

/// Whether the last two dims of `t` are nonzero exactly on and below the
/// diagonal, in every leading index (a causal attention mask).
bool isCausalMask(const ConstTensor &t) {
  size_t r = t.dims.size();
  if (r < 2 || !t.hasData)
    return false;
  int64_t rows = t.dims[r - 2], cols = t.dims[r - 1];
  int64_t n = t.numElements(), plane = rows * cols;
  if (plane <= 1 || n <= 0)
    return false;
  for (int64_t i = 0; i < n; ++i) {
    int64_t in = i % plane, row = in / cols, col = in % cols;
    if ((t.getDouble(i) != 0) != (col <= row))
      return false;
  }
  return true;
}

class Builder {
public:
  explicit Builder(ImportState &s) : s_(s), g_(s.graph()) {}
  llvm::Expected<std::unique_ptr<Graph>> run();
  llvm::Expected<std::unique_ptr<Graph>>
  buildFrom(const std::vector<IrNode> &nodes);

private:
  ImportState &s_;
  const onnx::GraphProto &g_;
  std::unique_ptr<Graph> graph_;
  /// What an op that computes nothing reads (an Identity or Cast of an
  /// initializer, a Cast to its input's own type).
  std::map<std::string, std::string> alias_;
  std::map<std::string, ValueId> ids_;
  std::map<std::string, ValueKind> constKind_;
  std::set<std::string> used_; ///< tensors read by IR ops or graph outputs

  /// The most elements of a constant whose values the IR gets.
  int64_t keptElements() const {
    return s_.opts.keepConstantData ? std::numeric_limits<int64_t>::max()
                                    : kMaxKeptConstData;
  }
  /// The tensor `name` aliases through a chain of aliases (itself if none).
  const std::string &resolve(const std::string &name) const {
    const std::string *at = &name;
    for (auto it = alias_.find(*at); it != alias_.end();
         it = alias_.find(*at))
      at = &it->second;
    return *at;
  }
  std::string kindOf(const onnx::NodeProto &n) const {
    return n.domain().empty() || n.domain() == "ai.onnx"
               ? n.op_type()
               : n.domain() + "." + n.op_type();
  }
  bool isAlias(int i) const;
  ValueKind classifyUse(
      const std::string &name, bool bigEnough, const std::vector<IrNode> &nodes,
      const std::map<std::string, std::vector<std::pair<size_t, int>>> &readers)
      const;
  llvm::Error markLive(std::vector<bool> &live);
  llvm::Expected<IrNode> convert(int i);
  llvm::Expected<ValueId> valueFor(const std::string &name);
  llvm::Expected<ValueId> outputValue(const std::string &name);
  llvm::Expected<ValueId> addChecked(Value v, int32_t elemType);
  llvm::Error appendLoss();
};

/// Ops that only move or convert their first operand's elements (and, for
/// Concat, every operand's): a weight read through them is still a weight.
bool passesValuesThrough(const std::string &kind, int slot) {
  static const std::set<std::string> dataOps = {
      "Transpose", "Reshape",  "Flatten", "Squeeze", "Unsqueeze", "Expand",
      "Cast",      "Identity", "Split",   "Slice",   "Tile",      "Pad"};
  return kind == "Concat" || (slot == 0 && dataOps.count(kind));
}

/// How initializer `name` is used: Weight when some op reads it, directly
/// or through ops that pass values through, in a weight slot (or, for
/// `bigEnough` tensors, in any slot of an op whose operands are all
/// weights); State when read in a state slot; Constant otherwise.
ValueKind Builder::classifyUse(
    const std::string &name, bool bigEnough, const std::vector<IrNode> &nodes,
    const std::map<std::string, std::vector<std::pair<size_t, int>>> &readers)
    const {
  ValueKind kind = ValueKind::Constant;
  std::vector<std::string> work = {name};
  std::set<std::string> seen = {name};
  while (!work.empty()) {
    std::string v = std::move(work.back());
    work.pop_back();
    auto it = readers.find(v);
    if (it == readers.end())
      continue;
    bool direct = v == name;
    for (const auto &reader : it->second) {
      const IrNode &ir = nodes[reader.first];
      int k = reader.second;
      auto slot = [&](const std::vector<int> &slots) {
        return std::find(slots.begin(), slots.end(), k) != slots.end();
      };
      if (slot(ir.info->weightSlots) ||
          (ir.info->anyOperandIsWeight && bigEnough))
        return ValueKind::Weight;
      if (direct && slot(ir.info->stateSlots))
        kind = ValueKind::State;
      if (passesValuesThrough(ir.kind, k))
        for (const std::string &out : ir.outputs)
          if (!out.empty() && seen.insert(out).second)
            work.push_back(out);
    }
  }
  return kind;
}

bool Builder::isAlias(int i) const {
  const onnx::NodeProto &n = g_.node(i);
  if ((n.op_type() != "Identity" && n.op_type() != "Cast") ||
      !n.domain().empty() || n.input_size() < 1 || n.output_size() != 1)
    return false;
  auto init = s_.initializers.find(n.input(0));
  if (init == s_.initializers.end()) {
    // A Cast to the type its input already has (transformers' RMSNorm and
    // softmax cast float32 to float32) computes nothing.
    auto info = s_.infos.find(n.input(0));
    return n.op_type() == "Cast" && info != s_.infos.end() &&
           info->second.elemType != 0 &&
           intAttr(n, "to", -1) == info->second.elemType;
  }
  return n.op_type() == "Identity" ||
         intAttr(n, "to", -1) == g_.initializer(init->second).data_type();
}

/// Live nodes: every registered op, and what graph outputs and live nodes
/// read. A live node that is neither registered nor folded is an error.
llvm::Error Builder::markLive(std::vector<bool> &live) {
  std::vector<std::string> work;
  for (const auto &vi : g_.output())
    work.push_back(vi.name());
  for (int i = 0; i < g_.node_size(); ++i)
    if (!s_.folded[i] &&
        (OpRegistry::instance().lookup(kindOf(g_.node(i))) ||
         isLoweredOp(g_.node(i))) &&
        !isAlias(i)) {
      live[i] = true;
      const onnx::NodeProto &n = g_.node(i);
      int keep = keepsOnlyData(n.op_type()) ? 1 : n.input_size();
      for (int k = 0; k < keep && k < n.input_size(); ++k)
        work.push_back(n.input(k));
    }
  while (!work.empty()) {
    std::string t = work.back();
    work.pop_back();
    if (t.empty() || !used_.insert(t).second)
      continue;
    auto p = s_.producer.find(t);
    if (p == s_.producer.end() || s_.folded[p->second] || live[p->second])
      continue;
    int i = p->second;
    const onnx::NodeProto &n = g_.node(i);
    if (isAlias(i)) {
      alias_[n.output(0)] = n.input(0);
      work.push_back(n.input(0));
      continue;
    }
    if (!OpRegistry::instance().lookup(kindOf(n)) && !isLoweredOp(n))
      return inputError("{}: unsupported operator '{}' (domain '{}'){}",
                        s_.where(i), n.op_type(), n.domain(),
                        isFoldableOp(n) ? ": its inputs are not constant, so "
                                          "it cannot be folded"
                                        : "");
    live[i] = true;
  }
  return llvm::Error::success();
}

llvm::Expected<IrNode> Builder::convert(int i) {
  const onnx::NodeProto &n = g_.node(i);
  IrNode ir;
  ir.node = i;
  ir.kind = kindOf(n);
  ir.info = OpRegistry::instance().lookup(ir.kind);
  ir.inputs.assign(n.input().begin(), n.input().end());
  ir.outputs.assign(n.output().begin(), n.output().end());
  for (const auto &a : n.attribute()) {
    using AP = onnx::AttributeProto;
    switch (a.type()) {
    case AP::INT:
      ir.attrs[a.name()] = static_cast<int64_t>(a.i());
      break;
    case AP::FLOAT:
      ir.attrs[a.name()] = static_cast<double>(a.f());
      break;
    case AP::STRING:
      ir.attrs[a.name()] = a.s();
      break;
    case AP::INTS:
      ir.attrs[a.name()] =
          std::vector<int64_t>(a.ints().begin(), a.ints().end());
      break;
    case AP::FLOATS:
      ir.attrs[a.name()] =
          std::vector<double>(a.floats().begin(), a.floats().end());
      break;
    case AP::STRINGS: // LSTM activations: the IR has no string lists
      ir.attrs[a.name()] =
          llvm::join(a.strings().begin(), a.strings().end(), ",");
      break;
    default: // tensors and graphs: no op kind of the registry takes them
      break;
    }
  }
  if (auto err = applyConventions(s_, i, ir))
    return err;
  for (std::string &in : ir.inputs)
    in = resolve(in);
  return ir;
}

/// The IR value of an initializer, constant or graph input, made on first use.
llvm::Expected<ValueId> Builder::valueFor(const std::string &name) {
  auto it = ids_.find(name);
  if (it != ids_.end())
    return it->second;
  Value v;
  v.name = name;
  int32_t elemType;
  auto init = s_.initializers.find(name);
  auto c = s_.consts.find(name);
  if (init != s_.initializers.end()) {
    const onnx::TensorProto &t = g_.initializer(init->second);
    elemType = t.data_type();
    v.shape.dims.assign(t.dims().begin(), t.dims().end());
    v.hasData = protoHasData(t);
    auto k = constKind_.find(name);
    v.kind = k == constKind_.end() ? ValueKind::Constant : k->second;
    // Every dim of a weight indexes parameters, also where the weight is
    // read through a shape op (Transpose(W) before a MatMul).
    if (v.kind == ValueKind::Weight)
      v.dimClasses.assign(v.shape.rank(), DimClass::Parameter);
    if (v.kind == ValueKind::Constant && v.hasData) {
      auto ct = constFromProto(t, keptElements());
      if (!ct)
        return withContext(ct.takeError(),
                           fmt::format("{}: {}: ", s_.path, s_.describe(name)));
      if (ct->hasData)
        v.data = ct->asDoubles();
    }
  } else if (c != s_.consts.end()) {
    elemType = c->second.elemType;
    v.shape.dims = c->second.dims;
    v.kind = ValueKind::Constant;
    v.hasData = c->second.hasData;
    v.lowerTriangular = c->second.lowerTriangular;
    if (c->second.hasData) {
      v.lowerTriangular = isCausalMask(c->second);
      if (c->second.numElements() <= keptElements())
        v.data = c->second.asDoubles();
    }
  } else {
    return internalError("{}: tensor '{}' has no value before its use", s_.path,
                         name);
  }
  return addChecked(std::move(v), elemType);
}

/// The activation value of a node output; kNoValue for an absent or unused
/// optional output whose shape inference could not give.
llvm::Expected<ValueId> Builder::outputValue(const std::string &name) {
  if (name.empty())
    return kNoValue;
  auto info = s_.infos.find(name);
  if (!used_.count(name) &&
      (info == s_.infos.end() || !info->second.fullyKnown()))
    return kNoValue;
  auto dims = s_.knownDims(name);
  if (!dims)
    return dims.takeError();
  Value v;
  v.name = name;
  v.kind = ValueKind::Activation;
  v.shape.dims = *dims;
  return addChecked(std::move(v), info->second.elemType);
}

/// Adds `v` once its element type is known and its dims are positive with
/// an element count that fits int64.
llvm::Expected<ValueId> Builder::addChecked(Value v, int32_t elemType) {
  const std::string name = v.name;
  auto dt = toDType(elemType);
  if (!dt)
    return withContext(dt.takeError(),
                       fmt::format("{}: {}: ", s_.path, s_.describe(name)));
  v.dtype = *dt;
  for (size_t d = 0; d < v.shape.rank(); ++d)
    if (v.shape[d] <= 0)
      return inputError("{}: {}: dim {} is {}; dims must be positive", s_.path,
                        s_.describe(name), d, v.shape[d]);
  if (!v.shape.numElements())
    return inputError("{}: {}: the element count of shape {} overflows int64",
                      s_.path, s_.describe(name), v.shape.str());
  ValueId id = graph_->addValue(std::move(v));
  ids_[name] = id;
  return id;
}

llvm::Expected<std::unique_ptr<Graph>> Builder::run() {
  registerAllOps();
  std::vector<bool> live(g_.node_size(), false);
  if (auto err = markLive(live))
    return err;
  std::vector<IrNode> nodes;
  for (int i = 0; i < g_.node_size(); ++i) {
    if (!live[i])
      continue;
    if (isLoweredOp(g_.node(i))) {
      auto lowered = lowerEinsum(s_, i);
      if (!lowered)
        return lowered.takeError();
      for (IrNode &ir : *lowered) {
        for (std::string &in : ir.inputs)
          in = resolve(in);
        nodes.push_back(std::move(ir));
      }
      continue;
    }
    auto ir = convert(i);
    if (!ir)
      return ir.takeError();
    nodes.push_back(std::move(*ir));
  }
  auto g = buildFrom(nodes);
  // The dim classes of a build say where a Reshape would merge the sample
  // dim away; build again once those merges are undone, until none is left
  // (each round can find the next layer's: its input now has the dim).
  while (g && unmergeSampleRows(s_, **g, nodes))
    g = buildFrom(nodes);
  return g;
}

llvm::Expected<std::unique_ptr<Graph>>
Builder::buildFrom(const std::vector<IrNode> &nodes) {
  graph_ = std::make_unique<Graph>();
  graph_->name = g_.name();
  graph_->sourcePath = s_.path;
  ids_.clear();
  constKind_.clear();
  // Initializer kinds from how the registry says their consumers use them.
  std::set<std::string> weights, states;
  std::map<std::string, std::vector<std::pair<size_t, int>>> readers;
  for (size_t j = 0; j < nodes.size(); ++j)
    for (size_t k = 0; k < nodes[j].inputs.size(); ++k)
      if (!nodes[j].inputs[k].empty())
        readers[nodes[j].inputs[k]].push_back({j, static_cast<int>(k)});
  for (const auto &[name, index] : s_.initializers) {
    const onnx::TensorProto &t = g_.initializer(index);
    if (!isFloatElemType(t.data_type()))
      continue;
    auto n = elementCount({t.dims().data(), size_t(t.dims_size())});
    // Follow the values through shape and type ops (Transpose, Expand,
    // Concat, ... : a class token expanded and concatenated, a weight
    // transposed before a MatMul) to the ops that compute with them.
    auto use = classifyUse(name, n && *n > 1, nodes, readers);
    if (use == ValueKind::Weight)
      weights.insert(name);
    else if (use == ValueKind::State)
      states.insert(name);
  }
  for (const std::string &w : states)
    constKind_[w] = ValueKind::State;
  for (const std::string &w : weights) // a weight anywhere is a weight
    constKind_[w] = ValueKind::Weight;

  for (const std::string &name : s_.inputNames) {
    Value v;
    v.name = name;
    v.kind = ValueKind::Input;
    const TensorInfo &info = s_.infos[name];
    v.shape.dims = info.dims;
    auto dt = toDType(info.elemType);
    if (!dt)
      return withContext(dt.takeError(),
                         fmt::format("{}: {}: ", s_.path, s_.describe(name)));
    v.dtype = *dt;
    for (bool sym : s_.symbolicDims[name])
      v.dimClasses.push_back(sym ? DimClass::Sample : DimClass::Attribute);
    ValueId id = graph_->addValue(std::move(v));
    ids_[name] = id;
    graph_->inputs.push_back(id);
  }
  for (const IrNode &ir : nodes) {
    Op op;
    op.name = ir.name.empty() ? s_.nodeNames[ir.node] : ir.name;
    op.kind = ir.kind;
    op.attrs = ir.attrs;
    for (const std::string &in : ir.inputs) {
      if (in.empty()) {
        op.inputs.push_back(kNoValue);
        continue;
      }
      auto id = valueFor(in);
      if (!id)
        return id.takeError();
      op.inputs.push_back(*id);
    }
    for (const std::string &out : ir.outputs) {
      auto id = outputValue(out);
      if (!id)
        return id.takeError();
      op.outputs.push_back(*id);
    }
    graph_->addOp(std::move(op));
  }
  for (const auto &vi : g_.output()) {
    auto id = valueFor(resolve(vi.name()));
    if (!id)
      return id.takeError();
    graph_->outputs.push_back(*id);
  }
  if (s_.opts.appendLoss)
    if (auto err = appendLoss())
      return err;
  if (auto err = graph_->computeSemantics())
    return err;
  if (auto err = graph_->verify())
    return err;
  return std::move(graph_);
}

llvm::Error Builder::appendLoss() {
  for (const Op &o : graph_->ops())
    if (o.kind == "SoftmaxCrossEntropyLoss" ||
        o.kind == "NegativeLogLikelihoodLoss")
      return llvm::Error::success();
  if (graph_->outputs.empty())
    return inputError("{}: the graph has no output to append the loss to",
                      s_.path);
  ValueId logitsId = graph_->outputs[0];
  {
    const Value &logits = graph_->value(logitsId);
    if (!isFloating(logits.dtype) || logits.shape.rank() < 2)
      return inputError("{}: cannot append the loss: the first graph output "
                        "'{}' ({} {}) is not floating logits of rank >= 2",
                        s_.path, logits.name, dtypeName(logits.dtype).str(),
                        logits.shape.str());
  }
  // The logits' dim classes come from their producer's semantics.
  if (auto err = graph_->computeSemantics())
    return err;
  const Value &logits = graph_->value(logitsId);
  int64_t classAxis = static_cast<int64_t>(logits.shape.rank()) - 1;
  auto freshName = [&](const std::string &base) {
    std::string name = base;
    for (int k = 1; graph_->findValue(name) != kNoValue; ++k)
      name = fmt::format("soapc.{}{}", base, k > 1 ? std::to_string(k) : "");
    return name;
  };
  Value labels;
  labels.name = freshName("labels");
  labels.kind = ValueKind::Input;
  labels.dtype = DType::I64;
  for (int64_t d = 0; d < classAxis; ++d) {
    labels.shape.dims.push_back(logits.shape[d]);
    labels.dimClasses.push_back(
        d < static_cast<int64_t>(logits.dimClasses.size())
            ? logits.dimClasses[d]
            : (d == 0 ? DimClass::Sample : DimClass::Attribute));
  }
  Value loss;
  loss.name = freshName("loss");
  loss.kind = ValueKind::Activation;
  loss.dtype = DType::F32;
  ValueId labelsId = graph_->addValue(std::move(labels));
  graph_->inputs.push_back(labelsId);
  ValueId lossId = graph_->addValue(std::move(loss));
  Op op;
  op.name = "soapc.loss";
  op.kind = "SoftmaxCrossEntropyLoss";
  op.inputs = {logitsId, labelsId};
  op.outputs = {lossId};
  op.attrs["class_axis"] = classAxis;
  op.attrs["reduction"] = std::string("mean");
  graph_->addOp(std::move(op));
  graph_->outputs = {lossId};
  return llvm::Error::success();
}

} // namespace

llvm::Expected<std::unique_ptr<Graph>> buildGraph(ImportState &s) {
  return Builder(s).run();
}

} // namespace import
} // namespace soap
