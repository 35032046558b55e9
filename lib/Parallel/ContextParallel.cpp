// Context parallelism for the Megatron what-if
// (include/soap/Parallel/ContextParallel.h): which loop of each op is the
// sequence, found the way Megatron.cpp finds the tensor-parallel split, by
// following a split tensor dim through the index maps.
#include "soap/Parallel/ContextParallel.h"

#include "TensorDims.h"
#include "soap/Parallel/Megatron.h"
#include "soap/Support/Error.h"
#include <algorithm>
#include <map>

namespace soap {

using namespace detail;

int64_t attentionSequence(const Graph &g) {
  for (const Op &op : g.ops()) {
    if (!isAttentionOp(op))
      continue;
    for (const LoopDim &l : op.sem.loops)
      if (l.name == "q")
        return l.size;
    if (op.sem.loops.size() == 4)
      return op.sem.loops[2].size;
  }
  return 0;
}

bool hasCausalAttention(const Graph &g) {
  return std::any_of(g.ops().begin(), g.ops().end(), [](const Op &op) {
    return op.kind == "FlashAttention" && op.getInt("causal", 0) != 0;
  });
}

namespace {

/// Per op, its sequence loop (-1: none), following the sequence dim from
/// the graph inputs of shape [batch, seq, ...].
std::vector<int> sequenceLoops(const Graph &g, int64_t seq) {
  std::vector<int> splitDim(g.numValues(), -1);
  for (size_t v = 0; v < g.numValues(); ++v) {
    const Value &val = g.value(ValueId(v));
    if (val.kind == ValueKind::Input && val.shape.rank() >= 2 &&
        val.shape[1] == seq)
      splitDim[v] = 1;
  }
  std::vector<int> loops(g.numOps(), -1);
  for (const Op &op : g.ops()) {
    const OpSemantics &sem = op.sem;
    int loop = -1;
    for (size_t i = 0; i < op.inputs.size() && loop < 0; ++i) {
      ValueId v = op.inputs[i];
      if (v == kNoValue || i >= sem.inputs.size() || !sem.inputs[i].present ||
          splitDim[size_t(v)] < 0 ||
          std::find(sem.weightInputs.begin(), sem.weightInputs.end(),
                    int(i)) != sem.weightInputs.end())
        continue;
      int l = loopOf(sem.inputs[i], mapDimOf(sem.inputs[i],
                                             g.value(v).shape.dims,
                                             splitDim[size_t(v)]));
      // The sequence as a key loop (FlashAttention's K and V, an eager
      // attention's second matmul) is not a split of the op's rows.
      if (l >= 0 && sem.loops[size_t(l)].cls != DimClass::Reduction &&
          sem.loops[size_t(l)].size == seq)
        loop = l;
    }
    loops[size_t(op.id)] = loop;
    for (size_t j = 0; j < op.outputs.size() && loop >= 0; ++j) {
      ValueId v = op.outputs[j];
      if (v == kNoValue || j >= sem.outputs.size() || !sem.outputs[j].present)
        continue;
      const TensorMap &om = sem.outputs[j];
      splitDim[size_t(v)] =
          tensorDimOf(om, g.value(v).shape.dims, dimOfLoop(om, loop));
    }
  }
  return loops;
}

} // namespace

llvm::Expected<std::vector<OpConfig>>
contextParallelConfigs(const Graph &g, const std::vector<OpConfig> &configs,
                       int32_t t, int32_t cp, int32_t microBatches,
                       bool sequenceParallel) {
  if (cp <= 1)
    return configs;
  int64_t seq = attentionSequence(g);
  if (seq <= 0)
    return inputError("--strategy megatron: cp={} splits the attention's "
                      "sequence, and the model has no attention",
                      cp);
  std::vector<int> seqLoop = sequenceLoops(g, seq);
  int64_t batch = 0;
  for (const Op &op : g.ops())
    if (int sl = sampleLoop(op.sem); sl >= 0 && batch == 0)
      batch = op.sem.loops[size_t(sl)].size;
  std::vector<OpConfig> out;
  out.reserve(configs.size());
  for (const Op &op : g.ops()) {
    const OpSemantics &sem = op.sem;
    const OpConfig &oc = configs[size_t(op.id)];
    int cl = seqLoop[size_t(op.id)];
    // Sequence parallelism's split of the sequence over the tensor-parallel
    // ranks, which the cp split goes outside of.
    int32_t inner = 1;
    if (cl >= 0 && oc.degree[size_t(cl)] != 1) {
      if (sequenceParallel && oc.degree[size_t(cl)] == t)
        inner = t;
      else
        cl = -1; // already split (tensor parallel): replicated over cp
    }
    // Where the tokens are merged into one [batch x sequence] dim (the LM
    // head behind a Reshape), that dim is split dp x cp ways, part
    // si * cp + ci on dp rank si and cp rank ci: with mbs=1 exactly the
    // rows that rank holds, else contiguous rows (correct, some moved).
    int merged = -1;
    int sl = sampleLoop(sem);
    if (cl < 0 && sl >= 0 && sem.loops[size_t(sl)].size == batch * seq &&
        divides(sem.loops[size_t(sl)],
                int64_t(oc.degree[size_t(sl)]) * cp * microBatches))
      merged = sl;
    if (cl >= 0 && !divides(sem.loops[size_t(cl)], int64_t(cp) * inner))
      return inputError("--strategy megatron: cp={}{} does not divide the "
                        "sequence loop '{}' ({}) of {}",
                        cp, inner > 1 ? fmt::format(" x sp's tp={}", inner) : "",
                        sem.loops[size_t(cl)].name,
                        sem.loops[size_t(cl)].size, g.where(op.id));
    OpConfig nc = oc;
    if (cl >= 0)
      nc.degree[size_t(cl)] = cp * inner;
    else if (merged >= 0)
      nc.degree[size_t(merged)] *= cp;
    else
      nc.replicas = oc.replicas * cp;
    // The old tile of each new tile: the same box with the sequence whole.
    std::map<std::vector<int64_t>, int64_t> oldTile;
    for (int64_t k = 0; k < oc.numTiles(); ++k)
      oldTile.emplace(oc.tile(sem, k).lo, k);
    nc.devices.assign(size_t(nc.numTasks()), 0);
    for (int64_t k = 0; k < nc.numTiles(); ++k) {
      Box b = nc.tile(sem, k);
      int64_t ci = 0;
      if (cl >= 0) {
        // Part j of cp x inner: cp rank j / inner, and of the old tiles
        // (the sequence cut inner ways) the one at j % inner.
        int64_t size = sem.loops[size_t(cl)].size;
        int64_t j = b.lo[size_t(cl)] / (size / (int64_t(cp) * inner));
        ci = j / inner;
        b.lo[size_t(cl)] = (j % inner) * (size / inner);
      }
      if (merged >= 0) {
        int64_t part = sem.loops[size_t(merged)].size / nc.degree[size_t(merged)];
        ci = (b.lo[size_t(merged)] / part) % cp;
        b.lo[size_t(merged)] -= ci * part;
      }
      int64_t ko = oldTile.at(b.lo);
      bool split = cl >= 0 || merged >= 0;
      for (int32_t r = 0; r < nc.replicas; ++r) {
        int32_t ro = split ? r : r / cp;
        if (!split)
          ci = r % cp;
        DeviceId x = oc.device(ko, ro);
        int64_t si = x / t, ti = x % t;
        nc.devices[size_t(k * nc.replicas + r)] =
            DeviceId(ti + t * (ci + cp * si));
      }
    }
    out.push_back(std::move(nc));
  }
  return out;
}

} // namespace soap
