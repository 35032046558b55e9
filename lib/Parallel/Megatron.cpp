// Megatron-LM's hand-written plan (include/soap/Parallel/Megatron.h): the
// tensor-parallel split is found by following which tensor dim of each value
// is split t ways, op by op in topological order, through the ops' index
// maps (so it needs no knowledge of "attention" or "MLP": the column split
// of the first weight matmul makes its output split on the hidden dim, the
// ops that index that dim keep it split, and the weight matmul that reduces
// over it is split by rows, whose partial sums are all-reduced).
#include "soap/Parallel/Megatron.h"

#include "TensorDims.h"
#include "soap/Support/Error.h"
#include <algorithm>

namespace soap {

using namespace detail;

namespace {

int sampleLoopOf(const OpSemantics &sem) {
  for (size_t l = 0; l < sem.loops.size(); ++l)
    if (sem.loops[l].cls == DimClass::Sample)
      return int(l);
  return -1;
}

/// The loop op `o` splits t ways and the tensor dim of its first output
/// that is then split (-1: whole), given which dim of each value is split.
/// `vocabLoop` (-1: none) is the op's padded-vocabulary loop, which may
/// split unevenly (Strategy::vocabPadding).
std::pair<int, int> tensorSplit(const Graph &g, const Op &op,
                                const std::vector<int> &splitDim, int32_t t,
                                int vocabLoop) {
  const OpSemantics &sem = op.sem;
  auto splits = [&](int l) {
    const LoopDim &loop = sem.loops[size_t(l)];
    return divides(loop, t) || (l == vocabLoop && splitsUnevenly(loop, t));
  };
  // Megatron-LM's VocabParallelEmbedding: the token table split by rows,
  // each rank looking up the tokens in its rows (zeros elsewhere), the
  // partial sums reduced over the group (reduce-scattered along the
  // sequence with sequence parallelism).
  if (op.kind == "Gather" && vocabLoop >= 0 &&
      sem.loops[size_t(vocabLoop)].cls == DimClass::Reduction &&
      splits(vocabLoop))
    return {vocabLoop, -1};
  auto outDim = [&](int l) {
    if (op.outputs.empty() || op.outputs[0] == kNoValue)
      return -1;
    const TensorMap &om = sem.outputs[0];
    return tensorDimOf(om, g.value(op.outputs[0]).shape.dims, dimOfLoop(om, l));
  };
  auto isWeight = [&](size_t i) {
    return std::find(sem.weightInputs.begin(), sem.weightInputs.end(),
                     int(i)) != sem.weightInputs.end();
  };
  // The loop that indexes a split input's split dim.
  int fromInput = -1;
  for (size_t i = 0; i < op.inputs.size() && fromInput < 0; ++i) {
    ValueId v = op.inputs[i];
    if (v == kNoValue || isWeight(i) || splitDim[size_t(v)] < 0 ||
        !sem.inputs[i].present)
      continue;
    int l = loopOf(sem.inputs[i], mapDimOf(sem.inputs[i], g.value(v).shape.dims,
                                           splitDim[size_t(v)]));
    // A split class axis of the loss is Megatron's vocabulary-parallel
    // cross-entropy (its statistics all-reduced); other statistics
    // (LayerNorm's hidden axis) are not split.
    if (l >= 0 && splits(l) &&
        (!sem.loops[size_t(l)].statReduced ||
         op.kind == "SoftmaxCrossEntropyLoss"))
      fromInput = l;
  }
  bool weightMatmul =
      !sem.weightInputs.empty() && (op.kind == "MatMul" || op.kind == "Gemm");
  if (!weightMatmul)
    return fromInput >= 0 ? std::make_pair(fromInput, outDim(fromInput))
                          : std::make_pair(-1, -1);
  // Row parallel: the input arrives split on the dim the matmul reduces.
  if (fromInput >= 0 && sem.loops[size_t(fromInput)].cls == DimClass::Reduction)
    return {fromInput, -1};
  // Column parallel: split the weight's output features, the loop of the
  // output's last dim that also indexes the weight (a Gemm with transB,
  // such as a tied LM head, holds them in the weight's first dim).
  int w = sem.weightInputs[0];
  const TensorMap &wm = sem.inputs[size_t(w)];
  const TensorMap &om = sem.outputs[0];
  int l = loopOf(om, int(om.dims.size()) - 1);
  if (l >= 0 && dimOfLoop(wm, l) >= 0 && splits(l) && outDim(l) >= 0)
    return {l, outDim(l)};
  return {-1, -1};
}

bool isWeightInput(const OpSemantics &sem, size_t i) {
  return std::find(sem.weightInputs.begin(), sem.weightInputs.end(), int(i)) !=
         sem.weightInputs.end();
}

/// Calls `f(map, value)` for each present activation operand of `op`: its
/// outputs, then its inputs that are not weights.
template <typename F> void forEachActivation(const Op &op, F f) {
  for (size_t j = 0; j < op.outputs.size(); ++j)
    if (op.outputs[j] != kNoValue && op.sem.outputs[j].present)
      f(op.sem.outputs[j], op.outputs[j]);
  for (size_t i = 0; i < op.inputs.size(); ++i)
    if (op.inputs[i] != kNoValue && op.sem.inputs[i].present &&
        !isWeightInput(op.sem, i))
      f(op.sem.inputs[i], op.inputs[i]);
}

/// The query-sequence loop of an attention op (isAttentionOp): FlashAttention's
/// "q", an eager [batch, heads, q, k] softmax's third loop.
int queryLoop(const Op &op) {
  for (size_t l = 0; l < op.sem.loops.size(); ++l)
    if (op.sem.loops[l].name == "q")
      return int(l);
  return op.kind == "FlashAttention" ? -1 : 2;
}

} // namespace

std::vector<int> vocabularyLoops(const Graph &g) {
  std::vector<int> out(g.numOps(), -1);
  // The loss's class loop: the one its softmax's statistics reduce.
  int64_t vocab = 0;
  for (const Op &op : g.ops())
    if (op.kind == "SoftmaxCrossEntropyLoss")
      for (const LoopDim &l : op.sem.loops)
        if (l.statReduced)
          vocab = l.size;
  // A vocabulary only where a token embedding has that many rows (a
  // classifier's classes are not padded).
  bool embedded = false;
  for (const Op &op : g.ops())
    if (op.kind == "Gather" && !op.inputs.empty() &&
        op.inputs[0] != kNoValue && isWeightInput(op.sem, 0)) {
      const std::vector<int64_t> &dims = g.value(op.inputs[0]).shape.dims;
      embedded = embedded || (!dims.empty() && dims[0] == vocab);
    }
  if (vocab <= 1 || !embedded)
    return out;
  for (const Op &op : g.ops())
    for (size_t l = 0; l < op.sem.loops.size(); ++l)
      if (op.sem.loops[l].size == vocab) {
        out[size_t(op.id)] = int(l);
        break;
      }
  return out;
}

bool hasSequence(const Graph &g) {
  std::vector<int> loops = sequenceLoops(g);
  return std::any_of(loops.begin(), loops.end(), [](int l) { return l >= 0; });
}

int32_t megatronVocabPadding(const Graph &g) {
  std::vector<int> loops = vocabularyLoops(g);
  return std::any_of(loops.begin(), loops.end(), [](int l) { return l >= 0; })
             ? kMegatronVocabPadding
             : 0;
}

std::vector<int> sequenceLoops(const Graph &g) {
  // Per value, its sequence dim: seeded from the attention's query loop,
  // then carried through the ops' index maps both ways until nothing
  // changes (an op's sequence loop is the one that indexes an operand's
  // sequence dim; the dims that loop indexes in its other operands are
  // theirs). Weights are not followed (a tied embedding is not a
  // sequence).
  std::vector<int> dim(g.numValues(), -1);
  std::vector<int> loop(g.numOps(), -1);
  auto spread = [&](const Op &op, int l) {
    bool grew = false;
    loop[size_t(op.id)] = l;
    forEachActivation(op, [&](const TensorMap &m, ValueId v) {
      int d = tensorDimOf(m, g.value(v).shape.dims, dimOfLoop(m, l));
      if (d >= 0 && dim[size_t(v)] < 0) {
        dim[size_t(v)] = d;
        grew = true;
      }
    });
    return grew;
  };
  bool any = false;
  for (const Op &op : g.ops())
    if (isAttentionOp(op)) {
      int q = queryLoop(op);
      if (q >= 0 && size_t(q) < op.sem.loops.size()) {
        spread(op, q);
        any = true;
      }
    }
  if (!any)
    return loop;
  auto visit = [&](const Op &op) {
    if (loop[size_t(op.id)] >= 0)
      return spread(op, loop[size_t(op.id)]);
    int l = -1;
    forEachActivation(op, [&](const TensorMap &m, ValueId v) {
      if (l < 0 && dim[size_t(v)] >= 0)
        l = loopOf(m, mapDimOf(m, g.value(v).shape.dims, dim[size_t(v)]));
    });
    return l >= 0 && spread(op, l);
  };
  for (bool grew = true; grew;) {
    grew = false;
    for (const Op &op : g.ops())
      grew |= visit(op);
    for (size_t o = g.numOps(); o-- > 0;)
      grew |= visit(g.op(OpId(o)));
  }
  return loop;
}

std::vector<OpConfig> megatronGroupConfigs(const Graph &g, int32_t t, int64_t d,
                                           bool sequence, bool padVocab) {
  std::vector<OpConfig> configs;
  std::vector<int> splitDim(g.numValues(), -1);
  std::vector<int> seq;
  if (sequence && t > 1)
    seq = sequenceLoops(g);
  std::vector<int> vocab;
  if (padVocab && t > 1)
    vocab = vocabularyLoops(g);
  for (const Op &op : g.ops()) {
    const OpSemantics &sem = op.sem;
    int vl = vocab.empty() ? -1 : vocab[size_t(op.id)];
    auto [tl, od] =
        t > 1 ? tensorSplit(g, op, splitDim, t, vl) : std::make_pair(-1, -1);
    if (!op.outputs.empty() && op.outputs[0] != kNoValue)
      splitDim[size_t(op.outputs[0])] = od;
    // Every other output the split loop indexes is split too (Split's K
    // and V beside Q).
    for (size_t j = 1; j < op.outputs.size() && tl >= 0; ++j) {
      ValueId v = op.outputs[j];
      if (v == kNoValue || !sem.outputs[j].present)
        continue;
      const TensorMap &om = sem.outputs[j];
      splitDim[size_t(v)] =
          tensorDimOf(om, g.value(v).shape.dims, dimOfLoop(om, tl));
    }
    int sl = sampleLoopOf(sem);
    OpConfig c = OpConfig::single(sem, 0);
    bool dataSplit = sl >= 0 && divides(sem.loops[size_t(sl)], d);
    if (dataSplit)
      c.degree[size_t(sl)] = int32_t(d);
    // Sequence parallelism: an op the tensor-parallel group would replicate
    // is split along the sequence instead (its outputs stay whole as far as
    // the tensor split is concerned: the next column-parallel GEMM gathers
    // them).
    if (tl < 0 && !seq.empty()) {
      int q = seq[size_t(op.id)];
      if (q >= 0 && q != sl && divides(sem.loops[size_t(q)], t) &&
          sem.loops[size_t(q)].cls != DimClass::Reduction &&
          !sem.loops[size_t(q)].statReduced)
        tl = q;
    }
    if (tl >= 0)
      c.degree[size_t(tl)] = t;
    // Replicated over the tensor-parallel group (and over the data-parallel
    // one when the op has no sample loop to split).
    c.replicas = (tl >= 0 ? 1 : t) * (dataSplit ? 1 : int32_t(d));
    c.devices.assign(size_t(c.numTasks()), 0);
    for (int64_t k = 0; k < c.numTiles(); ++k) {
      int64_t si = dataSplit ? c.coordinate(k, size_t(sl)) : 0;
      for (int32_t r = 0; r < c.replicas; ++r) {
        int64_t ti = tl >= 0 ? c.coordinate(k, size_t(tl)) : r % t;
        if (!dataSplit)
          si = r / (tl >= 0 ? 1 : t);
        c.devices[size_t(k * c.replicas + r)] = DeviceId(si * t + ti);
      }
    }
    configs.push_back(std::move(c));
  }
  return configs;
}

std::vector<OpConfig> megatronStagedConfigs(const Graph &g,
                                            const Pipeline &pipeline, int32_t t,
                                            int64_t d, bool sequence,
                                            bool padVocab) {
  std::vector<OpConfig> configs =
      megatronGroupConfigs(g, t, d, sequence, padVocab);
  for (const Op &op : g.ops())
    for (DeviceId &dev : configs[size_t(op.id)].devices)
      dev += DeviceId(pipeline.group(pipeline.stage(op.id)) * d * t);
  return configs;
}

Strategy megatronInterleaved(const Graph &g, const Topology &topo,
                             const Strategy &s, int32_t t, bool sequence,
                             int32_t v) {
  int32_t stages = s.pipeline.numStages();
  Strategy i = s;
  i.pipeline.chunks = v;
  i.pipeline.stageOf = layerStages(g, stages * v);
  int64_t d = int64_t(topo.numDevices()) / (int64_t(stages) * t);
  i.configs = megatronStagedConfigs(g, i.pipeline, t, d, sequence,
                                    i.vocabPadding > 0);
  return i;
}

std::vector<int32_t> balancedStages(const Graph &g, int32_t stages) {
  std::vector<double> flops;
  double total = 0;
  for (const Op &op : g.ops()) {
    flops.push_back(op.sem.tileFlops(Pass::Forward, op.sem.fullTile()));
    total += flops.back();
  }
  std::vector<int32_t> stageOf(g.numOps(), 0);
  double before = 0;
  size_t n = g.numOps();
  for (size_t i = 0; i < n; ++i) {
    // The stage of the op's FLOP midpoint, kept non-decreasing and leaving
    // at least one op for each later stage.
    double mid = total > 0 ? (before + flops[i] / 2) / total : double(i) / n;
    int32_t s = std::min<int32_t>(stages - 1, int32_t(mid * stages));
    if (i > 0)
      s = std::max(s, stageOf[i - 1]);
    s = std::min<int32_t>(s, int32_t(i));
    s = std::max<int32_t>(s, stages - int32_t(n - i));
    stageOf[i] = s;
    before += flops[i];
  }
  return stageOf;
}

bool isAttentionOp(const Op &op) {
  if (op.kind == "FlashAttention")
    return true;
  return (op.kind == "Softmax" || op.kind == "FusedSoftmax") &&
         op.sem.loops.size() == 4 && op.getInt("axis", -1) == 3;
}

std::vector<OpId> transformerLayerStarts(const Graph &g) {
  std::vector<OpId> attention;
  for (const Op &op : g.ops())
    if (isAttentionOp(op))
      attention.push_back(op.id);
  if (attention.empty())
    return {};
  // A layer starts after the residual-stream point (a checkpoint) before
  // its attention; the first takes everything before it (the embedding).
  std::vector<OpId> cps = checkpointOps(g);
  std::vector<OpId> starts;
  for (OpId a : attention) {
    OpId start = 0;
    for (OpId c : cps)
      if (c < a)
        start = c + 1;
    if (!starts.empty() && start <= starts.back())
      return {}; // two attentions in one block: not a layer stack
    starts.push_back(start);
  }
  starts[0] = 0;
  return starts;
}

std::vector<int32_t> layerStages(const Graph &g, int32_t stages) {
  std::vector<OpId> starts = transformerLayerStarts(g);
  int64_t layers = int64_t(starts.size());
  if (layers == 0 || layers % stages != 0)
    return balancedStages(g, stages);
  std::vector<int32_t> stageOf(g.numOps(), 0);
  int64_t layer = 0;
  for (const Op &op : g.ops()) {
    while (layer + 1 < layers && op.id >= starts[size_t(layer + 1)])
      ++layer;
    stageOf[size_t(op.id)] = int32_t(layer * stages / layers);
  }
  return stageOf;
}

llvm::Expected<Strategy> megatronStrategy(const Graph &g, const Topology &topo,
                                          const MegatronShape &shape) {
  int64_t devices = int64_t(topo.numDevices());
  int64_t perNode = int64_t(topo.devicesPerNode());
  int32_t t = shape.tensor, p = shape.pipeline;
  if (t < 1 || p < 1 || perNode % t != 0 || devices % (int64_t(t) * p) != 0)
    return inputError("megatron: tensor parallel {} x pipeline {} does not "
                      "fit {} devices of {} per node",
                      t, p, devices, perNode);
  if (size_t(p) > g.numOps())
    return inputError("megatron: {} stages for {} ops", p, g.numOps());
  int64_t d = devices / (int64_t(t) * p); // data-parallel degree
  // m: 4 x stages (gradient accumulation over 4 without a pipeline),
  // halved until every sample loop divides into m x d.
  int32_t m = shape.microBatches > 0 ? shape.microBatches : 4 * p;
  auto fits = [&](int32_t mm) {
    for (const Op &op : g.ops()) {
      int s = sampleLoopOf(op.sem);
      if (s < 0 || !divides(op.sem.loops[size_t(s)], int64_t(mm) * d))
        return false;
    }
    return true;
  };
  while (m > 1 && !fits(m))
    m = shape.microBatches > 0 ? 0 : m / 2;
  if (m < 1 || !fits(m))
    return inputError("megatron: the batch does not split into {} "
                      "data-parallel groups x {} micro-batches",
                      d, std::max(m, 1));

  Strategy s;
  s.pipeline.microBatches = m;
  s.pipeline.schedule = PipelineSchedule::OneFOneB;
  if (p > 1)
    s.pipeline.stageOf = layerStages(g, p);
  s.vocabPadding = megatronVocabPadding(g);
  s.configs = megatronStagedConfigs(g, s.pipeline, t, d, shape.sequence,
                                    s.vocabPadding > 0);
  // With sequence parallelism its collectives overlap the GEMMs, as in
  // NeMo's recipes (MegatronConfig::tpCommOverlap's default).
  s.gradSync.tpCommOverlap = shape.sequence;
  if (auto err = verifyStrategy(s, g, topo))
    return llvm::Error(std::move(err));
  return s;
}

} // namespace soap
