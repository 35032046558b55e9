// The IR graph: construction, semantics derivation and structural checks.
#include "soap/IR/Graph.h"

#include <algorithm>

#include "soap/IR/OpRegistry.h"
#include "soap/Support/Error.h"
#include <set>

namespace soap {

llvm::StringRef valueKindName(ValueKind k) {
  static const char *names[] = {"input", "weight", "state", "constant",
                                "activation"};
  return names[static_cast<int>(k)];
}

int64_t Value::bytes() const {
  return shape.numElements().value_or(0) * dtypeBytes(dtype);
}

int64_t Op::getInt(llvm::StringRef key, int64_t dflt) const {
  auto it = attrs.find(key.str());
  if (it == attrs.end())
    return dflt;
  if (auto *i = std::get_if<int64_t>(&it->second))
    return *i;
  if (auto *d = std::get_if<double>(&it->second))
    return static_cast<int64_t>(*d);
  return dflt;
}

double Op::getFloat(llvm::StringRef key, double dflt) const {
  auto it = attrs.find(key.str());
  if (it == attrs.end())
    return dflt;
  if (auto *d = std::get_if<double>(&it->second))
    return *d;
  if (auto *i = std::get_if<int64_t>(&it->second))
    return static_cast<double>(*i);
  return dflt;
}

std::string Op::getString(llvm::StringRef key, llvm::StringRef dflt) const {
  auto it = attrs.find(key.str());
  if (it == attrs.end())
    return dflt.str();
  if (auto *s = std::get_if<std::string>(&it->second))
    return *s;
  return dflt.str();
}

std::vector<int64_t> Op::getInts(llvm::StringRef key,
                                 std::vector<int64_t> dflt) const {
  auto it = attrs.find(key.str());
  if (it == attrs.end())
    return dflt;
  if (auto *v = std::get_if<std::vector<int64_t>>(&it->second))
    return *v;
  if (auto *i = std::get_if<int64_t>(&it->second))
    return {*i};
  return dflt;
}

ValueId Graph::addValue(Value v) {
  v.id = static_cast<ValueId>(values_.size());
  valueByName_.emplace(v.name, v.id);
  values_.push_back(std::move(v));
  return values_.back().id;
}

OpId Graph::addOp(Op op) {
  op.id = static_cast<OpId>(ops_.size());
  for (ValueId in : op.inputs)
    if (in != kNoValue && in < static_cast<ValueId>(values_.size()))
      values_[in].users.push_back(op.id);
  for (size_t j = 0; j < op.outputs.size(); ++j) {
    ValueId out = op.outputs[j];
    if (out != kNoValue && out < static_cast<ValueId>(values_.size())) {
      values_[out].producer = op.id;
      values_[out].producerOutput = static_cast<int>(j);
      values_[out].kind = ValueKind::Activation;
    }
  }
  opByName_.emplace(op.name, op.id);
  ops_.push_back(std::move(op));
  return ops_.back().id;
}

std::string Graph::where(OpId id) const {
  const Op &o = ops_[id];
  return fmt::format("{}: node '{}' ({})", sourcePath, o.name, o.kind);
}

llvm::Error Graph::computeSemantics() {
  registerAllOps();
  for (Value &v : values_)
    v.needsGrad = v.kind == ValueKind::Weight;
  for (Op &o : ops_) {
    const OpKindInfo *info = OpRegistry::instance().lookup(o.kind);
    if (!info)
      return inputError("{}: unsupported operator '{}'", where(o.id), o.kind);
    auto sem = info->build(o, *this);
    if (!sem)
      return withContext(sem.takeError(), where(o.id) + ": ");
    o.sem = std::move(*sem);
    // Transformer Engine saves an FP8 GEMM's activation inputs for its
    // weight gradient in FP8, 1 byte an element.
    if (o.fp8)
      for (SavedOperand &so : o.sem.saved)
        if (!so.isOutput)
          so.bytesPerElement = 1;
    // Each output dim takes the class of the loop that indexes it.
    for (size_t j = 0; j < o.outputs.size(); ++j) {
      if (o.outputs[j] == kNoValue)
        continue;
      Value &v = values_[o.outputs[j]];
      const TensorMap &m = o.sem.outputs[j];
      if (m.isView || m.shape != v.shape.dims)
        return inputError("{}: output '{}' has shape {}, the op's semantics "
                          "give {}",
                          where(o.id), v.name, v.shape.str(),
                          TensorShape(m.shape).str());
      v.dimClasses.assign(v.shape.rank(), DimClass::Attribute);
      // A dim indexed by several loops of one class (grouped-query heads,
      // kv head x query head of each) has that class.
      for (size_t d = 0; d < m.dims.size(); ++d) {
        const auto &terms = m.dims[d].terms;
        if (terms.empty())
          continue;
        DimClass cls = o.sem.loops[terms[0].loop].cls;
        bool one = std::all_of(terms.begin(), terms.end(), [&](IndexTerm t) {
          return o.sem.loops[t.loop].cls == cls;
        });
        if (terms.size() == 1 || (one && cls == DimClass::Parameter))
          v.dimClasses[d] = cls;
      }
    }
    auto needs = [&](int i) {
      return size_t(i) < o.inputs.size() && o.inputs[size_t(i)] != kNoValue &&
             values_[o.inputs[size_t(i)]].needsGrad;
    };
    o.sem.backwardDataNeeded =
        std::any_of(o.sem.gradInputs.begin(), o.sem.gradInputs.end(), needs);
    bool out = o.sem.backwardDataNeeded ||
               std::any_of(o.sem.weightInputs.begin(), o.sem.weightInputs.end(),
                           needs);
    for (ValueId v : o.outputs)
      if (v != kNoValue)
        values_[v].needsGrad = out;
  }
  return llvm::Error::success();
}

llvm::Error Graph::verify() const {
  std::vector<int> producedBy(values_.size(), -1);
  for (const Value &v : values_) {
    auto n = v.shape.numElements();
    for (int64_t d : v.shape.dims)
      if (d <= 0)
        return inputError("{}: tensor '{}': dim {} in shape {} is not positive",
                          sourcePath, v.name, d, v.shape.str());
    if (!n || !checkedMul(*n, dtypeBytes(v.dtype)))
      return inputError("{}: tensor '{}': shape {} overflows int64", sourcePath,
                        v.name, v.shape.str());
  }
  std::vector<bool> available(values_.size(), false);
  for (const Value &v : values_)
    if (v.kind != ValueKind::Activation)
      available[v.id] = true;
  for (const Op &o : ops_) {
    for (ValueId in : o.inputs) {
      if (in == kNoValue)
        continue;
      if (in < 0 || in >= static_cast<ValueId>(values_.size()))
        return internalError("{}: input id {} out of range", where(o.id), in);
      if (!available[in])
        return inputError("{}: input '{}' is used before it is produced",
                          where(o.id), values_[in].name);
    }
    for (ValueId out : o.outputs) {
      if (out == kNoValue)
        continue;
      if (producedBy[out] != -1)
        return inputError("{}: tensor '{}' is produced twice", where(o.id),
                          values_[out].name);
      producedBy[out] = o.id;
      available[out] = true;
    }
  }
  for (ValueId out : outputs)
    if (!available[out])
      return inputError("{}: graph output '{}' is never produced", sourcePath,
                        values_[out].name);
  return llvm::Error::success();
}

int64_t Graph::parameterCount() const {
  int64_t n = 0;
  for (const Value &v : values_)
    if (v.kind == ValueKind::Weight)
      n += v.shape.numElements().value_or(0);
  return n;
}

double Graph::forwardFlops() const {
  double f = 0;
  for (const Op &o : ops_)
    f += o.sem.tileFlops(Pass::Forward, o.sem.fullTile());
  return f;
}

bool isLayoutKind(llvm::StringRef k) {
  return k == "Reshape" || k == "Transpose" || k == "Squeeze" ||
         k == "Unsqueeze" || k == "Flatten" || k == "Identity";
}

bool isViewKind(llvm::StringRef k) {
  return (isLayoutKind(k) && k != "Transpose") || k == "Split";
}

/// Whether `op`'s output reaches a loss or a graph output through layout
/// ops alone (the logits of an LM head or classifier).
static bool feedsLogits(const Graph &g, const Op &op) {
  std::vector<ValueId> work(op.outputs.begin(), op.outputs.end());
  while (!work.empty()) {
    ValueId v = work.back();
    work.pop_back();
    if (v == kNoValue)
      continue;
    if (std::find(g.outputs.begin(), g.outputs.end(), v) != g.outputs.end())
      return true;
    for (OpId u : g.value(v).users) {
      const Op &user = g.op(u);
      llvm::StringRef k = user.kind;
      if (k.endswith("Loss"))
        return true;
      if (isLayoutKind(k))
        work.insert(work.end(), user.outputs.begin(), user.outputs.end());
    }
  }
  return false;
}

llvm::Error Graph::setPrecision(Precision p) {
  if (p == Precision::FP32)
    return llvm::Error::success();
  for (Value &v : values_)
    if (v.dtype == DType::F32 &&
        (v.kind == ValueKind::Activation || v.kind == ValueKind::Input ||
         v.kind == ValueKind::Weight))
      v.dtype = DType::BF16;
  fp8_ = p == Precision::FP8;
  for (Op &o : ops_) {
    o.fp8 = fp8_ && (o.kind == "MatMul" || o.kind == "Gemm") &&
            !o.sem.weightInputs.empty() && !feedsLogits(*this, o);
    if (o.fp8)
      for (int i : o.sem.weightInputs)
        values_[size_t(o.inputs[size_t(i)])].fp8Copy = true;
  }
  return computeSemantics();
}

Precision Graph::precision() const {
  if (fp8_)
    return Precision::FP8;
  for (const Value &v : values_)
    if (v.dtype == DType::BF16 &&
        (v.kind == ValueKind::Activation || v.kind == ValueKind::Weight))
      return Precision::BF16;
  return Precision::FP32;
}

OpId Graph::findOp(llvm::StringRef name) const {
  auto it = opByName_.find(name.str());
  return it == opByName_.end() ? -1 : it->second;
}

ValueId Graph::findValue(llvm::StringRef name) const {
  auto it = valueByName_.find(name.str());
  return it == valueByName_.end() ? kNoValue : it->second;
}

} // namespace soap
