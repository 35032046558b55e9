// mcmc's structural proposals: pipeline moves (stage boundary, micro-batch
// count, device count of a stage).
#include "soap/Search/McmcMoves.h"

#include <algorithm>
#include <limits>
#include <numeric>

namespace soap {

std::vector<DeviceRange> stageDeviceRanges(const Strategy &s,
                                           size_t numDevices) {
  // Per device group (a stage's own with one model chunk per group).
  const Pipeline &pl = s.pipeline;
  std::vector<DeviceRange> g(size_t(pl.numGroups()),
                             {std::numeric_limits<DeviceId>::max(), 0});
  for (size_t o = 0; o < s.configs.size(); ++o) {
    auto &r = g[size_t(pl.group(pl.stage(OpId(o))))];
    for (DeviceId d : s.configs[o].devices) {
      r.first = std::min(r.first, d);
      r.second = std::max(r.second, d);
    }
  }
  // A device between two stages (a stage that uses less than its range
  // after a device move) stays its left stage's to use; those before the
  // first stage are the first's, those after the last the last's.
  for (size_t k = 0; k + 1 < g.size(); ++k)
    if (g[k + 1].first > 0 && g[k + 1].first - 1 > g[k].second)
      g[k].second = g[k + 1].first - 1;
  if (!g.empty() && numDevices > 0) {
    g.front().first = 0;
    g.back().second =
        std::max(g.back().second, DeviceId(numDevices - 1));
  }
  if (pl.chunks <= 1)
    return g;
  std::vector<DeviceRange> stages;
  for (int32_t st = 0; st < pl.numStages(); ++st)
    stages.push_back(g[size_t(pl.group(st))]);
  return stages;
}

bool placeInRange(DeviceRange range, OpConfig &c) {
  auto [lo, hi] = range;
  DeviceId size = hi - lo + 1;
  DeviceId first = *std::min_element(c.devices.begin(), c.devices.end());
  DeviceId last = *std::max_element(c.devices.begin(), c.devices.end());
  if (last - first + 1 > size)
    return false;
  // Keep the placement's offset within a range-sized window.
  DeviceId shift = lo + (first % size) - first;
  if ((first % size) + (last - first) >= size)
    shift = lo - first;
  for (DeviceId &d : c.devices)
    d += shift;
  return true;
}

/// Whether `c`'s sample loop divides into `m` micro-batches of its degree
/// (verifyPipeline's rule); true for m = 1.
static bool dividesMicroBatches(const OpSemantics &sem, const OpConfig &c,
                                int32_t m) {
  if (m <= 1)
    return true;
  for (size_t l = 0; l < sem.loops.size(); ++l)
    if (sem.loops[l].cls == DimClass::Sample) {
      int64_t parts = int64_t(m) * c.degree[l];
      const LoopDim &ld = sem.loops[l];
      return ld.size % parts == 0 && (ld.size / parts) % ld.granule == 0;
    }
  return false;
}

std::optional<OpConfig> resizeConfig(const Graph &g, const ConfigSpace &space,
                                     OpId o, const OpConfig &c, DeviceRange from,
                                     DeviceRange to, int32_t microBatches) {
  const OpSemantics &sem = g.op(o).sem;
  int64_t oldSize = int64_t(from.second) - int64_t(from.first) + 1;
  int64_t newSize = int64_t(to.second) - int64_t(to.first) + 1;
  int64_t n = c.numTasks();
  DeviceId first = *std::min_element(c.devices.begin(), c.devices.end());
  // An op that uses more than half its range uses as much of it as its
  // shape allowed (a stage of 7 whose ops split into 4): it scales with
  // the range; one that uses half or less was placed beside others.
  bool whole = 2 * n > oldSize;
  int64_t offset = whole ? 0 : int64_t(first) - int64_t(from.first);
  // Loops to scale, best first: the sample loop, then by degree.
  std::vector<size_t> order(sem.loops.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    bool sa = sem.loops[a].cls == DimClass::Sample;
    bool sb = sem.loops[b].cls == DimClass::Sample;
    if (sa != sb)
      return sa;
    return c.degree[a] > c.degree[b];
  });
  int64_t tiles = c.numTiles();
  for (int64_t tasks = whole ? newSize : std::min(n, newSize); tasks >= 1;
       --tasks) {
    if (tasks % c.replicas != 0)
      continue;
    int64_t newTiles = tasks / c.replicas;
    for (size_t l : order) {
      if ((int64_t(c.degree[l]) * newTiles) % tiles != 0)
        continue;
      OpConfig r = c;
      r.degree[l] = int32_t(int64_t(c.degree[l]) * newTiles / tiles);
      if (r.numTasks() != tasks)
        continue;
      r.devices.resize(size_t(tasks));
      std::iota(r.devices.begin(), r.devices.end(), DeviceId(0));
      if (!space.contains(o, r) || !dividesMicroBatches(sem, r, microBatches))
        continue;
      int64_t at = offset + tasks <= newSize ? offset : 0;
      for (DeviceId &d : r.devices)
        d += DeviceId(int64_t(to.first) + at);
      return r;
    }
  }
  return std::nullopt;
}

std::optional<Strategy> moveStageDevices(const Strategy &cur, const Graph &g,
                                         const ConfigSpace &space,
                                         const std::vector<DeviceRange> &ranges,
                                         Rng &rng) {
  int32_t stages = cur.pipeline.numStages();
  if (stages < 2)
    return std::nullopt;
  size_t b = rng.uniform(size_t(stages - 1)); // b | b + 1
  DeviceId lo = ranges[b].first, cut = ranges[b + 1].first,
           hi = ranges[b + 1].second;
  int64_t left = int64_t(cut) - int64_t(lo), right = int64_t(hi) - cut + 1;
  bool down = rng.uniform(2) == 0; // stage b gives devices to b + 1
  int64_t giver = down ? left : right, receiver = down ? right : left;
  // One device, half the giver's, or as many as the receiver has (its
  // count doubled): the giver keeps at least one.
  std::vector<int64_t> counts;
  for (int64_t k : {int64_t(1), giver / 2, receiver})
    if (k >= 1 && k < giver &&
        std::find(counts.begin(), counts.end(), k) == counts.end())
      counts.push_back(k);
  if (counts.empty())
    return std::nullopt;
  int64_t k = counts[rng.uniform(counts.size())];
  DeviceId newCut = DeviceId(down ? int64_t(cut) - k : int64_t(cut) + k);
  DeviceRange next[2] = {{lo, newCut - 1}, {newCut, hi}};
  Strategy s = cur;
  for (size_t o = 0; o < s.configs.size(); ++o) {
    int32_t st = s.pipeline.stage(OpId(o));
    if (st != int32_t(b) && st != int32_t(b) + 1)
      continue;
    size_t side = size_t(st) - b;
    auto r = resizeConfig(g, space, OpId(o), s.configs[o], ranges[size_t(st)],
                          next[side], s.pipeline.microBatches);
    if (!r)
      return std::nullopt;
    s.configs[o] = std::move(*r);
  }
  return s;
}

std::optional<Strategy> pipelineMove(const Strategy &cur, const Graph &g,
                                     const ConfigSpace &space,
                                     const std::vector<DeviceRange> &ranges,
                                     Rng &rng) {
  Strategy s = cur;
  Pipeline &pl = s.pipeline;
  int32_t stages = pl.numStages();
  size_t kind = stages == 1 ? 0 : rng.uniform(4);
  if (kind == 3) {
    // The schedule: 1F1B and zb-h1 (one model chunk per group; the
    // interleaved order is 1F1B's).
    if (pl.chunks > 1 || pl.schedule == PipelineSchedule::GPipe)
      return std::nullopt;
    pl.schedule = pl.schedule == PipelineSchedule::ZbH1
                      ? PipelineSchedule::OneFOneB
                      : PipelineSchedule::ZbH1;
    return s;
  }
  if (kind == 0) {
    if (rng.uniform(2) == 0)
      pl.microBatches *= 2;
    else if (pl.microBatches % 2 == 0)
      pl.microBatches /= 2;
    else
      return std::nullopt;
    return s;
  }
  if (kind == 2)
    return pl.chunks > 1 ? std::nullopt
                         : moveStageDevices(cur, g, space, ranges, rng);
  int32_t b = int32_t(rng.uniform(size_t(stages - 1))); // b | b + 1
  size_t n = s.configs.size();
  // The last op of stage b, or the first of stage b + 1.
  size_t last = 0;
  while (last + 1 < n && pl.stageOf[last + 1] <= b)
    ++last;
  bool down = rng.uniform(2) == 0; // last op of b joins b + 1
  size_t o = down ? last : last + 1;
  int32_t from = pl.stageOf[o], to = down ? b + 1 : b;
  int64_t shift =
      int64_t(ranges[size_t(to)].first) - int64_t(ranges[size_t(from)].first);
  pl.stageOf[o] = to;
  for (DeviceId &d : s.configs[o].devices) {
    int64_t nd = int64_t(d) + shift;
    if (nd < int64_t(ranges[size_t(to)].first) ||
        nd > int64_t(ranges[size_t(to)].second))
      return std::nullopt;
    d = DeviceId(nd);
  }
  return s;
}

} // namespace soap
