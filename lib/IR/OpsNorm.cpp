// Ops that reduce for statistics or sums: BatchNormalization (training mode,
// synchronised), LayerNormalization, Softmax/LogSoftmax, ReduceMean/Sum and
// the softmax cross-entropy loss. A dim indexed in the output and reduced for
// statistics is marked statReduced: splitting it costs an all-reduce of the
// statistics, never a change of what is computed.
#include "OpBuilder.h"

namespace soap {
namespace detail {

namespace {

std::vector<int> identityLoops(SemBuilder &b, const Value &x) {
  std::vector<int> loops;
  for (size_t d = 0; d < x.shape.rank(); ++d)
    loops.push_back(b.addLoop(
        "d" + std::to_string(d),
        b.classOf(&x, d, d == 0 ? DimClass::Sample : DimClass::Attribute),
        x.shape[d]));
  return loops;
}

std::vector<DimMap> loopMaps(const std::vector<int> &loops) {
  std::vector<DimMap> m;
  for (int l : loops)
    m.push_back(DimMap::loop(l));
  return m;
}

llvm::Expected<OpSemantics> buildBatchNorm(const Op &op, const Graph &g) {
  SemBuilder b(op, g);
  auto x = b.need(0, "X");
  if (!x)
    return x.takeError();
  const Value &X = **x;
  if (X.shape.rank() < 2)
    return inputError("input '{}' {} has no channel dim", X.name,
                      X.shape.str());
  int64_t C = X.shape[1];
  std::vector<int> loops = identityLoops(b, X);
  b.sem.loops[loops[1]].cls = DimClass::Parameter;
  b.sem.loops[loops[1]].name = "c";
  for (size_t d = 0; d < loops.size(); ++d)
    if (d != 1)
      b.sem.loops[loops[d]].statReduced = true;
  b.setInput(0, loopMaps(loops));
  for (size_t i = 1; i < 5; ++i) {
    auto v = b.need(i, "scale, B, mean and var");
    if (!v)
      return v.takeError();
    if ((*v)->shape.dims != std::vector<int64_t>{C})
      return inputError("'{}' {} is not [{}]", (*v)->name, (*v)->shape.str(),
                        C);
    b.setInput(i, {DimMap::loop(loops[1])});
  }
  b.setOutput(0, loopMaps(loops));
  for (size_t j = 1; j < b.numOut(); ++j)
    if (b.out(j))
      b.setOutput(j, {DimMap::loop(loops[1])});
  b.flops(Pass::Forward, 8, b.allLoops());
  b.flops(Pass::BackwardData, 12, b.allLoops());
  b.flops(Pass::BackwardWeight, 2, b.allLoops());
  b.saveInput(0);
  return b.finish();
}

llvm::Expected<OpSemantics> buildLayerNorm(const Op &op, const Graph &g) {
  SemBuilder b(op, g);
  auto x = b.need(0, "X");
  if (!x)
    return x.takeError();
  const Value &X = **x;
  int64_t rank = X.shape.rank();
  auto axis = normAxis(op.getInt("axis", -1), rank, "axis");
  if (!axis)
    return axis.takeError();
  std::vector<int> loops = identityLoops(b, X);
  for (int64_t d = *axis; d < rank; ++d)
    b.sem.loops[loops[d]].statReduced = true;
  b.setInput(0, loopMaps(loops));
  for (size_t i = 1; i < 3; ++i)
    if (b.in(i))
      if (auto err = b.setBroadcastInput(i, loops, X.shape.dims))
        return llvm::Error(std::move(err));
  b.setOutput(0, loopMaps(loops));
  std::vector<DimMap> stats;
  for (int64_t d = 0; d < rank; ++d)
    stats.push_back(d < *axis ? DimMap::loop(loops[d]) : DimMap::constant(0));
  for (size_t j = 1; j < b.numOut(); ++j)
    if (b.out(j))
      b.setOutput(j, stats);
  // RMSNorm has no mean to subtract and no bias.
  bool rms = op.kind == "RMSNormalization";
  b.flops(Pass::Forward, rms ? 5 : 8, b.allLoops());
  b.flops(Pass::BackwardData, rms ? 7 : 10, b.allLoops());
  if (b.numIn() > 1 && b.in(1))
    b.flops(Pass::BackwardWeight, rms ? 1 : 2, b.allLoops());
  b.saveInput(0);
  return b.finish();
}

llvm::Expected<OpSemantics> buildSoftmax(const Op &op, const Graph &g) {
  SemBuilder b(op, g);
  auto x = b.need(0, "input");
  if (!x)
    return x.takeError();
  const Value &X = **x;
  auto axis = normAxis(op.getInt("axis", -1), X.shape.rank(), "axis");
  if (!axis)
    return axis.takeError();
  std::vector<int> loops = identityLoops(b, X);
  b.sem.loops[loops[*axis]].statReduced = true;
  b.setInput(0, loopMaps(loops));
  b.setOutput(0, loopMaps(loops));
  b.flops(Pass::Forward, 5, b.allLoops());
  b.flops(Pass::BackwardData, 3, b.allLoops());
  b.saveOutput(0);
  return b.finish();
}

llvm::Expected<OpSemantics> buildReduce(const Op &op, const Graph &g) {
  SemBuilder b(op, g);
  auto x = b.need(0, "data");
  if (!x)
    return x.takeError();
  const Value &X = **x;
  int64_t rank = X.shape.rank();
  std::vector<int64_t> axes = op.getInts("axes");
  std::vector<bool> reduced(rank, axes.empty());
  for (int64_t a : axes) {
    auto n = normAxis(a, rank, "axis");
    if (!n)
      return n.takeError();
    reduced[*n] = true;
  }
  bool keep = op.getInt("keepdims", 1);
  std::vector<int> loops = identityLoops(b, X);
  std::vector<DimMap> ym;
  for (int64_t d = 0; d < rank; ++d) {
    if (reduced[d]) {
      b.sem.loops[loops[d]].cls = DimClass::Reduction;
      if (keep)
        ym.push_back(DimMap::constant(0));
    } else {
      ym.push_back(DimMap::loop(loops[d]));
    }
  }
  b.setInput(0, loopMaps(loops));
  b.setOutput(0, ym);
  b.flops(Pass::Forward, 1, b.allLoops());
  b.flops(Pass::BackwardData, 1, b.allLoops());
  return b.finish();
}

/// Softmax cross-entropy over a class axis (1 in ONNX; `class_axis` when
/// soapc appended the loss to logits [N, T, V]). The mean over samples makes
/// every non-class loop a reduction into the scalar loss.
llvm::Expected<OpSemantics> buildLoss(const Op &op, const Graph &g) {
  SemBuilder b(op, g);
  auto s = b.need(0, "scores");
  if (!s)
    return s.takeError();
  auto l = b.need(1, "labels");
  if (!l)
    return l.takeError();
  const Value &S = **s, &Lb = **l;
  int64_t rank = S.shape.rank();
  if (rank < 2)
    return inputError("scores '{}' {} need rank >= 2", S.name, S.shape.str());
  auto axis = normAxis(op.getInt("class_axis", 1), rank, "class_axis");
  if (!axis)
    return axis.takeError();
  std::vector<int> loops = identityLoops(b, S);
  b.sem.loops[loops[*axis]].cls = DimClass::Parameter;
  b.sem.loops[loops[*axis]].statReduced = true;
  std::vector<DimMap> lm;
  std::vector<int64_t> lshape;
  for (int64_t d = 0; d < rank; ++d)
    if (d != *axis) {
      lm.push_back(DimMap::loop(loops[d]));
      lshape.push_back(S.shape[d]);
    }
  if (Lb.shape.dims != lshape)
    return inputError("labels '{}' {} do not match scores {}", Lb.name,
                      Lb.shape.str(), S.shape.str());
  b.setInput(0, loopMaps(loops));
  b.setInput(1, lm);
  if (b.in(2))
    b.setInput(2, {DimMap::loop(loops[*axis])});
  std::string reduction = op.getString("reduction", "mean");
  b.setOutput(0, reduction == "none" ? lm : std::vector<DimMap>{});
  if (b.out(1))
    b.setOutput(1, loopMaps(loops));
  b.flops(Pass::Forward, 6, b.allLoops());
  b.flops(Pass::BackwardData, 2, b.allLoops());
  b.saveInput(0); // the log-probabilities, scores-sized
  return b.finish();
}

} // namespace

void registerNormOps(OpRegistry &r) {
  r.add({"BatchNormalization",
         "batch normalisation (training mode, synchronised statistics)",
         buildBatchNorm, {1, 2}, false, {3, 4}});
  r.add({"LayerNormalization", "layer normalisation over trailing axes",
         buildLayerNorm, {1, 2}, false, {}});
  r.add({"RMSNormalization",
         "root-mean-square normalisation over trailing axes (soapc "
         "--kernels fused|no-flash, from x * rsqrt(mean(x^2) + eps) * w)",
         buildLayerNorm, {1}, false, {}});
  r.add({"Softmax", "softmax along an axis", buildSoftmax, {}, false, {}});
  r.add({"LogSoftmax", "log-softmax along an axis", buildSoftmax, {}, false,
         {}});
  r.add({"ReduceMean", "mean over axes", buildReduce, {}, false, {}});
  r.add({"ReduceSum", "sum over axes", buildReduce, {}, false, {}});
  r.add({"SoftmaxCrossEntropyLoss", "softmax cross-entropy loss",
         buildLoss, {}, false, {}});
}

} // namespace detail
} // namespace soap
