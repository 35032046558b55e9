// Pipelines: schedules and the order each device group runs its items in,
// micro-batch tiles, and the check of a strategy's stages.
#include "soap/Parallel/Strategy.h"

#include "soap/Support/Error.h"
#include <algorithm>
#include <fmt/format.h>
#include <map>
#include <set>

namespace soap {

llvm::StringRef scheduleName(PipelineSchedule s) {
  switch (s) {
  case PipelineSchedule::GPipe:
    return "gpipe";
  case PipelineSchedule::OneFOneB:
    return "1f1b";
  case PipelineSchedule::ZbH1:
    return "zb-h1";
  }
  return "1f1b";
}

std::optional<PipelineSchedule> parseSchedule(llvm::StringRef name) {
  for (PipelineSchedule s : {PipelineSchedule::GPipe,
                             PipelineSchedule::OneFOneB,
                             PipelineSchedule::ZbH1})
    if (name == scheduleName(s))
      return s;
  return std::nullopt;
}

int32_t Pipeline::numStages() const {
  int32_t n = 1;
  for (int32_t s : stageOf)
    n = std::max(n, s + 1);
  return n;
}

int32_t Pipeline::inFlight(int32_t s) const {
  if (schedule == PipelineSchedule::GPipe)
    return microBatches;
  if (chunks <= 1 && schedule == PipelineSchedule::OneFOneB)
    return std::min(microBatches, numStages() - s);
  // Walk the group's order: a micro-batch is held from its forward to the
  // item that ends its backward (its weight gradients under zb-h1); take
  // each stage's count at the first moment the group's total peaks.
  int32_t grp = group(s);
  int32_t groups = numGroups();
  std::vector<int32_t> held(size_t(chunks), 0), atPeak = held;
  int32_t total = 0, peak = -1;
  for (const PipeItem &it : order(grp)) {
    int32_t c = it.stage / groups;
    if (it.pass == PipePass::Forward) {
      ++held[size_t(c)];
      if (++total > peak) {
        peak = total;
        atPeak = held;
      }
    } else if (it.pass == (splitsWeightGrad() ? PipePass::Weight
                                              : PipePass::Backward)) {
      --held[size_t(c)];
      --total;
    }
  }
  return atPeak[size_t(s / groups)];
}

std::vector<PipeItem> Pipeline::order(int32_t grp) const {
  std::vector<PipeItem> o;
  int32_t m = microBatches;
  auto fwd = [&](int32_t st, int32_t j) {
    o.push_back({st, j, PipePass::Forward});
  };
  auto bwd = [&](int32_t st, int32_t j) {
    o.push_back({st, j, PipePass::Backward});
  };
  if (schedule == PipelineSchedule::GPipe) {
    for (int32_t j = 0; j < m; ++j)
      fwd(grp, j);
    for (int32_t j = 0; j < m; ++j)
      bwd(grp, j);
    return o;
  }
  int32_t p = numGroups();
  if (chunks > 1) {
    // Megatron's interleaved 1F1B: the k-th forward runs chunk (k / p) % v
    // of micro-batch (k / (p v)) p + k % p, the k-th backward the chunks
    // in reverse; (p - r - 1) 2 + (v - 1) p warm-up forwards (all of them
    // when m == p), then one forward and one backward in turn, then the
    // remaining backwards. verifyPipeline requires m % p == 0.
    int32_t v = chunks, total = m * v;
    auto mbOf = [&](int32_t k) { return (k / (p * v)) * p + k % p; };
    auto f = [&](int32_t k) { fwd(((k / p) % v) * p + grp, mbOf(k)); };
    auto b = [&](int32_t k) { bwd((v - 1 - (k / p) % v) * p + grp, mbOf(k)); };
    int32_t warm = m == p ? total
                          : std::min(total, (p - grp - 1) * 2 + (v - 1) * p);
    for (int32_t k = 0; k < warm; ++k)
      f(k);
    for (int32_t k = 0; k < total - warm; ++k) {
      f(k + warm);
      b(k);
    }
    for (int32_t k = std::max(0, total - warm); k < total; ++k)
      b(k);
    return o;
  }
  // Megatron's 1F1B: p - s - 1 warm-up forwards, then forward j + warm-up
  // and backward j in turn, then the remaining backwards. zb-h1 runs the
  // same forwards and backwards (backward-data only) and stage s's weight
  // gradients of micro-batch j after the backward of j + s: every stage
  // then holds p micro-batches, as the first does under 1F1B, and the
  // delayed weight gradients fill the drain, where 1F1B waits.
  int32_t s = grp;
  bool zb = splitsWeightGrad();
  int32_t nextW = 0;
  auto back = [&](int32_t j) {
    bwd(s, j);
    if (zb && j - s >= 0)
      o.push_back({s, nextW++, PipePass::Weight});
  };
  int32_t warm = std::min(m, p - s - 1);
  for (int32_t j = 0; j < warm; ++j)
    fwd(s, j);
  for (int32_t j = 0; j < m - warm; ++j) {
    fwd(s, j + warm);
    back(j);
  }
  for (int32_t j = m - warm; j < m; ++j)
    back(j);
  if (zb)
    while (nextW < m)
      o.push_back({s, nextW++, PipePass::Weight});
  return o;
}

Box microBatchTile(const OpConfig &c, const OpSemantics &sem, int64_t k,
                   int32_t mb, int32_t m) {
  Box b = c.tile(sem, k);
  if (m <= 1)
    return b;
  for (size_t l = 0; l < sem.loops.size(); ++l)
    if (sem.loops[l].cls == DimClass::Sample) {
      int64_t per = sem.loops[l].size / m;
      b.lo[l] = mb * per + b.lo[l] / m;
      b.hi[l] = mb * per + b.hi[l] / m;
      break;
    }
  return b;
}

int sampleLoop(const OpSemantics &sem) {
  for (size_t l = 0; l < sem.loops.size(); ++l)
    if (sem.loops[l].cls == DimClass::Sample)
      return int(l);
  return -1;
}

bool microBatchesDivide(const OpSemantics &sem,
                        const std::vector<int32_t> &degree, int32_t m) {
  if (m <= 1)
    return true;
  int l = sampleLoop(sem);
  if (l < 0)
    return false;
  const LoopDim &ld = sem.loops[size_t(l)];
  int64_t parts = int64_t(m) * degree[size_t(l)];
  return ld.size % parts == 0 &&
         (ld.size / parts) % std::max<int64_t>(1, ld.granule) == 0;
}

llvm::Error verifyPipeline(const Strategy &s, const Graph &g) {
  const Pipeline &p = s.pipeline;
  if (p.microBatches < 1)
    return inputError("{}: the pipeline has {} micro-batches; at least 1",
                      g.sourcePath, p.microBatches);
  if (!p.stageOf.empty() && p.stageOf.size() != g.numOps())
    return inputError("{}: the pipeline gives stages to {} ops, the graph "
                      "has {}",
                      g.sourcePath, p.stageOf.size(), g.numOps());
  int32_t stages = p.numStages();
  if (p.chunks < 1)
    return inputError("{}: the pipeline has {} model chunks per device "
                      "group; at least 1",
                      g.sourcePath, p.chunks);
  if (p.chunks > 1) {
    if (stages % p.chunks != 0)
      return inputError("{}: {} pipeline stages do not divide into {} model "
                        "chunks per device group",
                        g.sourcePath, stages, p.chunks);
    if (p.schedule != PipelineSchedule::OneFOneB)
      return inputError("{}: {} model chunks per device group need the "
                        "1f1b (interleaved) schedule, not {}",
                        g.sourcePath, p.chunks, scheduleName(p.schedule));
    if (p.microBatches % p.numGroups() != 0)
      return inputError("{}: the interleaved schedule runs micro-batches in "
                        "rounds of one per device group: {} micro-batches "
                        "are not a multiple of {} groups",
                        g.sourcePath, p.microBatches, p.numGroups());
  }
  int32_t numGroups = p.numGroups();
  std::vector<std::set<DeviceId>> groups(static_cast<size_t>(numGroups));
  std::vector<bool> used(static_cast<size_t>(stages), false);
  for (const Op &o : g.ops()) {
    int32_t st = p.stage(o.id);
    if (st < 0)
      return inputError("{}: stage {} is negative", g.where(o.id), st);
    used[size_t(st)] = true;
    for (DeviceId d : s.configs[o.id].devices)
      groups[size_t(p.group(st))].insert(d);
    // Stages contiguous in a topological order: no tensor flows back.
    for (ValueId v : o.inputs) {
      if (v == kNoValue || g.value(v).producer < 0)
        continue;
      OpId pr = g.value(v).producer;
      if (p.stage(pr) > st)
        return inputError("{}: stage {} reads '{}' from op '{}' of the later "
                          "stage {}; stages must be contiguous in a "
                          "topological order",
                          g.where(o.id), st, g.value(v).name, g.op(pr).name,
                          p.stage(pr));
    }
    if (p.microBatches > 1) {
      int l = sampleLoop(o.sem);
      if (l < 0)
        return inputError("{}: no sample loop, so it cannot run in "
                          "{} micro-batches",
                          g.where(o.id), p.microBatches);
      const LoopDim &ld = o.sem.loops[size_t(l)];
      if (!microBatchesDivide(o.sem, s.configs[o.id].degree, p.microBatches))
        return inputError("{}: {} micro-batches x degree {} do not divide "
                          "its sample loop '{}' of {}",
                          g.where(o.id), p.microBatches,
                          s.configs[o.id].degree[size_t(l)], ld.name, ld.size);
    }
  }
  for (int32_t a = 0; a < stages; ++a)
    if (!used[size_t(a)])
      return inputError("{}: pipeline stage {} has no ops", g.sourcePath, a);
  for (int32_t a = 0; a < numGroups; ++a)
    for (int32_t b = a + 1; b < numGroups; ++b)
      for (DeviceId d : groups[size_t(a)])
        if (groups[size_t(b)].count(d)) {
          if (p.chunks == 1)
            return inputError("{}: device {} is in pipeline stages {} and "
                              "{}; stages run on disjoint device groups",
                              g.sourcePath, d, a, b);
          return inputError("{}: device {} is in pipeline device groups {} "
                            "and {} (stages {} mod {} and {} mod {}); groups "
                            "are disjoint",
                            g.sourcePath, d, a, b, a, numGroups, b,
                            numGroups);
        }
  return llvm::Error::success();
}

} // namespace soap
