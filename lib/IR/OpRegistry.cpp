// The op registry and the builder helpers shared by every op kind.
#include <algorithm>
#include "soap/IR/OpRegistry.h"

#include "OpBuilder.h"

namespace soap {

OpRegistry &OpRegistry::instance() {
  static OpRegistry registry;
  return registry;
}

void OpRegistry::add(OpKindInfo info) {
  std::string name = info.name;
  kinds_[name] = std::move(info);
}

const OpKindInfo *OpRegistry::lookup(llvm::StringRef kind) const {
  auto it = kinds_.find(kind.str());
  return it == kinds_.end() ? nullptr : &it->second;
}

void registerAllOps() {
  OpRegistry &r = OpRegistry::instance();
  if (!r.kinds().empty())
    return;
  detail::registerConvOps(r);
  detail::registerLinearOps(r);
  detail::registerElementwiseOps(r);
  detail::registerNormOps(r);
  detail::registerShapeOps(r);
  detail::registerRnnOps(r);
  detail::registerFusedOps(r);
}

namespace detail {

SemBuilder::SemBuilder(const Op &o, const Graph &g) : op(o), graph(g) {
  sem.inputs.resize(op.inputs.size());
  sem.outputs.resize(op.outputs.size());
  for (auto &m : sem.inputs)
    m.present = false;
  for (auto &m : sem.outputs)
    m.present = false;
}

const Value *SemBuilder::in(size_t i) const {
  ValueId id = op.input(i);
  return id == kNoValue ? nullptr : &graph.value(id);
}

const Value *SemBuilder::out(size_t j) const {
  ValueId id = op.output(j);
  return id == kNoValue ? nullptr : &graph.value(id);
}

llvm::Expected<const Value *> SemBuilder::need(size_t i,
                                               llvm::StringRef what) const {
  if (const Value *v = in(i))
    return v;
  return inputError("missing required input {} ({})", i, what.str());
}

llvm::Expected<const Value *> SemBuilder::needOut(size_t j,
                                                  llvm::StringRef what) const {
  if (const Value *v = out(j))
    return v;
  return inputError("missing required output {} ({})", j, what.str());
}

int SemBuilder::addLoop(std::string name, DimClass cls, int64_t size,
                        bool splittable) {
  LoopDim l;
  l.name = std::move(name);
  l.cls = cls;
  l.size = size;
  l.splittable = splittable && size > 1;
  sem.loops.push_back(std::move(l));
  return static_cast<int>(sem.loops.size()) - 1;
}

DimClass SemBuilder::classOf(const Value *v, int64_t dim, DimClass dflt) const {
  if (!v || dim < 0 || dim >= static_cast<int64_t>(v->dimClasses.size()))
    return dflt;
  return v->dimClasses[dim];
}

void SemBuilder::setInput(size_t i, std::vector<DimMap> dims) {
  TensorMap &m = sem.inputs[i];
  m.dims = std::move(dims);
  m.shape = in(i)->shape.dims;
  m.present = true;
}

void SemBuilder::setInputView(size_t i, std::vector<int64_t> viewShape,
                              std::vector<DimMap> dims) {
  TensorMap &m = sem.inputs[i];
  m.dims = std::move(dims);
  m.shape = std::move(viewShape);
  m.present = true;
  m.isView = true;
}

void SemBuilder::setOutput(size_t j, std::vector<DimMap> dims) {
  TensorMap &m = sem.outputs[j];
  m.dims = std::move(dims);
  m.shape.clear();
  for (const DimMap &d : m.dims) {
    int64_t extent = 1;
    if (!d.terms.empty()) {
      // Output maps are plain loop indices (plus a stride for grouped dims).
      int64_t hi = d.offset;
      for (const IndexTerm &t : d.terms)
        hi += t.coeff * (sem.loops[t.loop].size - 1);
      extent = hi / d.divisor + 1;
    }
    m.shape.push_back(extent);
  }
  m.present = true;
}

llvm::Error SemBuilder::setBroadcastInput(size_t i,
                                          const std::vector<int> &outLoops,
                                          const std::vector<int64_t> &outShape) {
  const Value *v = in(i);
  int64_t rank = static_cast<int64_t>(v->shape.rank());
  int64_t outRank = static_cast<int64_t>(outShape.size());
  if (rank > outRank)
    return inputError("operand '{}' of shape {} has a higher rank than the "
                      "result {}",
                      v->name, v->shape.str(), TensorShape(outShape).str());
  std::vector<DimMap> dims;
  for (int64_t d = 0; d < rank; ++d) {
    int64_t od = outRank - rank + d;
    int64_t size = v->shape[d];
    if (size == outShape[od])
      dims.push_back(DimMap::loop(outLoops[od]));
    else if (size == 1)
      dims.push_back(DimMap::constant(0));
    else
      return inputError("operand '{}' of shape {} does not broadcast to {}",
                        v->name, v->shape.str(), TensorShape(outShape).str());
  }
  setInput(i, std::move(dims));
  return llvm::Error::success();
}

uint64_t SemBuilder::allLoops() const {
  size_t n = sem.loops.size();
  return n >= 64 ? ~uint64_t(0) : (uint64_t(1) << n) - 1;
}

void SemBuilder::saveInput(int i, double bytesPerElem) {
  if (!in(i))
    return;
  sem.saved.push_back(
      {false, i, bytesPerElem > 0 ? bytesPerElem
                                  : static_cast<double>(dtypeBytes(in(i)->dtype))});
}

void SemBuilder::saveOutput(int j, double bytesPerElem) {
  if (!out(j))
    return;
  sem.saved.push_back(
      {true, j, bytesPerElem > 0 ? bytesPerElem
                                 : static_cast<double>(dtypeBytes(out(j)->dtype))});
}

llvm::Expected<OpSemantics> SemBuilder::finish() {
  if (sem.loops.size() > 63)
    return inputError("op has {} loop dimensions; at most 63 are supported",
                      sem.loops.size());
  for (size_t i = 0; i < op.inputs.size(); ++i) {
    const Value *v = in(i);
    TensorMap &m = sem.inputs[i];
    if (!v) {
      m.present = false;
      continue;
    }
    if (!m.present)
      return internalError("input {} ('{}') has no index map", i, v->name);
    if (!m.isView && m.dims.size() != v->shape.rank())
      return internalError("input {} map has rank {}, tensor has rank {}", i,
                           m.dims.size(), v->shape.rank());
    if (v->kind == ValueKind::Weight)
      sem.weightInputs.push_back(static_cast<int>(i));
    else if (v->isActivationLike() && isFloating(v->dtype))
      sem.gradInputs.push_back(static_cast<int>(i));
  }
  for (size_t j = 0; j < op.outputs.size(); ++j)
    if (!out(j))
      sem.outputs[j].present = false;
    else if (!sem.outputs[j].present)
      return internalError("output {} has no index map", j);
  // The backward-weight pass computes the gradient of a contraction's
  // second operand (MatMul's B, Conv's filter). When that operand is an
  // activation (attention's Q K^T and P V), its gradient is still computed,
  // as part of the backward-data pass.
  bool activationSecond = sem.weightInputs.empty() &&
                          std::any_of(sem.gradInputs.begin(),
                                      sem.gradInputs.end(),
                                      [](int i) { return i > 0; });
  auto &bwdW = sem.flops[static_cast<int>(Pass::BackwardWeight)];
  if (activationSecond && !bwdW.empty()) {
    auto &bwdD = sem.flops[static_cast<int>(Pass::BackwardData)];
    bwdD.insert(bwdD.end(), bwdW.begin(), bwdW.end());
    bwdW.clear();
  }
  return std::move(sem);
}

llvm::Expected<int64_t> normAxis(int64_t axis, int64_t rank,
                                 llvm::StringRef what) {
  int64_t a = axis < 0 ? axis + rank : axis;
  if (a < 0 || a >= rank)
    return inputError("{} {} is out of range for rank {}", what.str(), axis,
                      rank);
  return a;
}

} // namespace detail
} // namespace soap
