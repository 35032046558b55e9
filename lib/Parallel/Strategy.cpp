// OpConfig tiles and device placement; configuration and strategy checks.
#include "soap/Parallel/Strategy.h"

#include "soap/Support/Error.h"
#include <algorithm>
#include <fmt/format.h>
#include <map>
#include <set>

namespace soap {

int64_t OpConfig::numTiles() const {
  int64_t n = 1;
  for (int32_t d : degree)
    n *= d;
  return n;
}

Box OpConfig::tile(const OpSemantics &sem, int64_t k) const {
  Box b;
  size_t n = sem.loops.size();
  b.lo.assign(n, 0);
  b.hi.assign(n, 0);
  for (size_t l = n; l-- > 0;) {
    int64_t d = degree[l];
    int64_t c = k % d;
    k /= d;
    int64_t chunk = sem.loops[l].size / d;
    b.lo[l] = c * chunk;
    b.hi[l] = (c + 1) * chunk;
  }
  return b;
}

std::vector<DeviceId> OpConfig::deviceSet() const {
  std::vector<DeviceId> s = devices;
  std::sort(s.begin(), s.end());
  s.erase(std::unique(s.begin(), s.end()), s.end());
  return s;
}

bool OpConfig::operator<(const OpConfig &o) const {
  if (degree != o.degree)
    return degree < o.degree;
  if (replicas != o.replicas)
    return replicas < o.replicas;
  return devices < o.devices;
}

static std::string deviceRanges(const std::vector<DeviceId> &devs) {
  std::string s;
  for (size_t i = 0; i < devs.size();) {
    size_t j = i;
    while (j + 1 < devs.size() && devs[j + 1] == devs[j] + 1)
      ++j;
    if (!s.empty())
      s += ",";
    s += j > i ? fmt::format("{}-{}", devs[i], devs[j])
               : std::to_string(devs[i]);
    i = j + 1;
  }
  return s;
}

std::string OpConfig::str(const OpSemantics &sem) const {
  std::string s;
  for (size_t l = 0; l < degree.size(); ++l)
    if (degree[l] > 1)
      s += fmt::format("{}{}={}", s.empty() ? "" : " ", sem.loops[l].name,
                       degree[l]);
  if (s.empty())
    s = "unsplit";
  if (replicas > 1)
    s += fmt::format(" x{}", replicas);
  return s + " @" + deviceRanges(devices);
}

OpConfig OpConfig::single(const OpSemantics &sem, DeviceId d) {
  OpConfig c;
  c.degree.assign(sem.loops.size(), 1);
  c.devices = {d};
  return c;
}

llvm::Error verifyConfig(const OpConfig &c, const OpSemantics &sem,
                         size_t numDevices, llvm::StringRef where) {
  if (c.degree.size() != sem.loops.size())
    return inputError("{}: {} degrees for {} loop dimensions", where.str(),
                      c.degree.size(), sem.loops.size());
  for (size_t l = 0; l < sem.loops.size(); ++l) {
    const LoopDim &loop = sem.loops[l];
    int64_t d = c.degree[l];
    if (d < 1)
      return inputError("{}: degree {} of loop '{}' is not positive",
                        where.str(), d, loop.name);
    if (d == 1)
      continue;
    if (!loop.splittable)
      return inputError("{}: loop '{}' cannot be split (degree {})",
                        where.str(), loop.name, d);
    if (loop.size % d != 0)
      return inputError("{}: degree {} does not divide loop '{}' of size {}",
                        where.str(), d, loop.name, loop.size);
    if ((loop.size / d) % loop.granule != 0)
      return inputError("{}: degree {} of loop '{}' makes tiles of {} that "
                        "are not multiples of {}",
                        where.str(), d, loop.name, loop.size / d, loop.granule);
  }
  if (c.replicas < 1)
    return inputError("{}: replicas must be at least 1, got {}", where.str(),
                      c.replicas);
  if (static_cast<int64_t>(c.devices.size()) != c.numTasks())
    return inputError("{}: {} tiles x {} replicas need {} devices, the "
                      "configuration lists {}",
                      where.str(), c.numTiles(), c.replicas, c.numTasks(),
                      c.devices.size());
  for (DeviceId d : c.devices)
    if (d >= numDevices)
      return inputError("{}: device {} is not in the topology ({} devices)",
                        where.str(), d, numDevices);
  // Each task of an op on its own device: the space never puts two tiles
  // (or two replicas of one) on one device, and the executor and the
  // simulator's memory accounting assume it.
  std::map<DeviceId, size_t> first;
  for (size_t i = 0; i < c.devices.size(); ++i) {
    auto [it, fresh] = first.emplace(c.devices[i], i);
    if (!fresh)
      return inputError("{}: device {} is listed twice (tasks {} and {}); "
                        "each task of an op runs on its own device",
                        where.str(), c.devices[i], it->second, i);
  }
  return llvm::Error::success();
}

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

llvm::StringRef weightGradOrderName(WeightGradOrder o) {
  switch (o) {
  case WeightGradOrder::Next:
    return "next";
  case WeightGradOrder::Last:
    return "last";
  case WeightGradOrder::Now:
    return "now";
  }
  return "next";
}

std::optional<WeightGradOrder> parseWeightGradOrder(llvm::StringRef name) {
  for (WeightGradOrder o :
       {WeightGradOrder::Next, WeightGradOrder::Last, WeightGradOrder::Now})
    if (name == weightGradOrderName(o))
      return o;
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

bool savesActivations(const OpSemantics &sem) {
  return !sem.saved.empty() || !sem.savedExtraBytes.empty();
}

Bytes keptBytes(const Graph &g, const Strategy &s, OpId o, const Box &tile) {
  const Op &op = g.op(o);
  std::vector<DType> none;
  if (!s.recomputes(o))
    return op.sem.savedBytes(tile, none, none);
  // Recomputed: its forward runs again in backward and reads every
  // activation input, saved or not (a recomputed Relu reads its MatMul's
  // whole output, not the 1-byte mask a kept Relu saves). Those that kept
  // ops or the graph's inputs gave it are held from the forward on; those
  // of recomputed producers are made again.
  double bytes = 0;
  for (size_t i = 0; i < op.inputs.size(); ++i) {
    ValueId v = op.inputs[i];
    if (v == kNoValue || !op.sem.inputs[i].present ||
        !g.value(v).isActivationLike())
      continue;
    OpId producer = g.value(v).producer;
    if (producer >= 0 && s.recomputes(producer))
      continue;
    bytes += double(op.sem.inputRegion(int(i), tile).volume()) *
             double(dtypeBytes(g.value(v).dtype));
  }
  return Bytes(bytes);
}

bool recomputeMatters(const Graph &g, const Strategy &s, OpId o) {
  const Op &op = g.op(o);
  if (savesActivations(op.sem))
    return true;
  for (ValueId v : op.outputs)
    if (v != kNoValue)
      for (OpId u : g.value(v).users)
        if (s.recomputes(u))
          return true;
  return false;
}

std::vector<OpId> checkpointOps(const Graph &g) {
  // Walk the ops in id (topological) order, counting the activations
  // produced so far that a later op still reads. Only the batch's count
  // (outputs of ops with a sample loop): a mask or position table that
  // every block reads is small, and kept or made again where it is read.
  std::vector<int64_t> readers(g.numValues(), 0);
  for (const Op &op : g.ops())
    if (sampleLoop(op.sem) >= 0)
      for (ValueId v : op.outputs)
        if (v != kNoValue)
          for (OpId u : std::set<OpId>(g.value(v).users.begin(),
                                       g.value(v).users.end()))
            readers[size_t(v)] += u > op.id;
  std::vector<OpId> cuts;
  int64_t live = 0;
  for (const Op &op : g.ops()) {
    for (size_t j = 0; j < op.inputs.size(); ++j) {
      ValueId v = op.inputs[j];
      // Each reading op (not each input slot) retires one reader.
      if (v == kNoValue || readers[size_t(v)] == 0 ||
          g.value(v).producer >= op.id ||
          std::find(op.inputs.begin(), op.inputs.begin() + long(j), v) !=
              op.inputs.begin() + long(j))
        continue;
      if (--readers[size_t(v)] == 0)
        --live;
    }
    int64_t mine = 0;
    for (ValueId v : op.outputs)
      if (v != kNoValue && readers[size_t(v)] > 0)
        ++mine;
    live += mine;
    if (mine == 1 && live == 1 && size_t(op.id) + 1 < g.numOps())
      cuts.push_back(op.id);
  }
  return cuts;
}

std::vector<uint8_t> recomputePolicy(const Graph &g, bool full) {
  std::vector<uint8_t> r(g.numOps(), 0);
  if (!full) {
    for (const Op &op : g.ops())
      r[size_t(op.id)] =
          savesActivations(op.sem) && op.sem.weightInputs.empty();
    return r;
  }
  for (const Op &op : g.ops())
    r[size_t(op.id)] = 1;
  for (OpId o : checkpointOps(g))
    r[size_t(o)] = 0;
  // Readers come after their producers: one pass from the end drops every
  // op whose recomputation would mean nothing.
  Strategy s;
  s.recompute = r;
  for (size_t u = g.numOps(); u-- > 0;)
    if (s.recompute[u] && !recomputeMatters(g, s, OpId(u)))
      s.recompute[u] = 0;
  return s.recompute;
}

int weightZeroStage(const Graph &g, const Strategy &s, ValueId w) {
  int stage = 0;
  if (!s.zero.empty())
    for (OpId u : g.value(w).users)
      stage = std::max(stage, s.zeroStage(u));
  return stage;
}

bool hasDataParallelGroup(const Graph &g, const Strategy &s, OpId o) {
  const Op &op = g.op(o);
  for (int i : op.sem.weightInputs) {
    ValueId w = op.inputs[size_t(i)];
    // Every shard of the weight, over all its users; one of o's shards
    // overlapping a shard on another device makes a group.
    std::vector<std::pair<Box, DeviceId>> all, mine;
    for (OpId u : g.value(w).users) {
      const Op &uo = g.op(u);
      const OpConfig &c = s.configs[size_t(u)];
      for (size_t j = 0; j < uo.inputs.size(); ++j) {
        if (uo.inputs[j] != w)
          continue;
        for (int64_t k = 0; k < c.numTiles(); ++k) {
          Box b = uo.sem.inputRegion(int(j), c.tile(uo.sem, k));
          for (int32_t r = 0; r < c.replicas; ++r) {
            all.emplace_back(b, c.device(k, r));
            if (u == o)
              mine.emplace_back(b, c.device(k, r));
          }
        }
      }
    }
    for (const auto &[b, d] : mine)
      for (const auto &[b2, d2] : all)
        if (d2 != d && !b.intersect(b2).empty())
          return true;
  }
  return false;
}

void dropIdleZero(const Graph &g, Strategy &s) {
  if (s.zero.empty())
    return;
  bool any = false;
  for (const Op &op : g.ops()) {
    uint8_t &z = s.zero[size_t(op.id)];
    if (z && !hasDataParallelGroup(g, s, op.id))
      z = 0;
    any |= z != 0;
  }
  if (!any)
    s.zero.clear();
}

std::vector<uint8_t> zeroPolicy(const Graph &g, const Strategy &s, int stage) {
  std::vector<uint8_t> z(g.numOps(), 0);
  for (const Op &op : g.ops())
    if (hasDataParallelGroup(g, s, op.id))
      z[size_t(op.id)] = uint8_t(stage);
  return z;
}

llvm::Error verifyStrategy(const Strategy &s, const Graph &g,
                           const Topology &topo) {
  if (!s.recompute.empty()) {
    if (s.recompute.size() != g.numOps())
      return inputError("{}: the strategy marks {} ops for recomputation, "
                        "the graph has {}",
                        g.sourcePath, s.recompute.size(), g.numOps());
    for (const Op &o : g.ops())
      if (s.recomputes(o.id) && !recomputeMatters(g, s, o.id))
        return inputError("{}: recomputed, but it saves nothing for "
                          "backward and no recomputed op reads its output",
                          g.where(o.id));
  }
  if (!s.zero.empty()) {
    if (s.zero.size() != g.numOps())
      return inputError("{}: the strategy gives {} ops a ZeRO stage, the "
                        "graph has {}",
                        g.sourcePath, s.zero.size(), g.numOps());
    for (const Op &o : g.ops()) {
      if (s.zeroStage(o.id) > 3)
        return inputError("{}: ZeRO stage {}; the stages are 0 to 3",
                          g.where(o.id), s.zeroStage(o.id));
      if (s.zeroStage(o.id) && o.sem.weightInputs.empty())
        return inputError("{}: ZeRO stage {}, but the op has no weights",
                          g.where(o.id), s.zeroStage(o.id));
    }
  }
  if (!s.weightGrad.empty()) {
    if (s.weightGrad.size() != g.numOps())
      return inputError("{}: the strategy orders the weight gradients of {} "
                        "ops, the graph has {}",
                        g.sourcePath, s.weightGrad.size(), g.numOps());
    for (const Op &o : g.ops()) {
      if (s.weightGrad[size_t(o.id)] > uint8_t(WeightGradOrder::Now))
        return inputError("{}: weight-gradient order {}; the orders are 0 "
                          "(next), 1 (last) and 2 (now)",
                          g.where(o.id), s.weightGrad[size_t(o.id)]);
      if (s.weightGradOrder(o.id) != WeightGradOrder::Next &&
          o.sem.weightInputs.empty())
        return inputError("{}: weight gradients '{}', but the op has no "
                          "weights",
                          g.where(o.id),
                          weightGradOrderName(s.weightGradOrder(o.id)));
    }
  }
  if (s.gradSync.bucketParams < 0)
    return inputError("{}: a gradient bucket of {} parameters", g.sourcePath,
                      s.gradSync.bucketParams);
  if (s.configs.size() != g.numOps())
    return inputError("{}: the strategy configures {} ops, the graph has {}",
                      g.sourcePath, s.configs.size(), g.numOps());
  for (const Op &o : g.ops())
    if (auto err = verifyConfig(s.configs[o.id], o.sem, topo.numDevices(),
                                g.where(o.id)))
      return err;
  return verifyPipeline(s, g);
}

} // namespace soap
