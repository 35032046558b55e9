// Which strategies fold over which groups of devices (Sim/Fold.h).
#include "soap/Sim/Fold.h"

#include <algorithm>

namespace soap {

bool configFolds(const OpConfig &c, const OpSemantics &sem, uint32_t block,
                 uint32_t period) {
  if (block == 0 || period % block != 0)
    return false;
  int64_t f = int64_t(period / block);
  if (f <= 1)
    return true;
  if (c.numTasks() % f != 0)
    return false;
  Fold fold{int32_t(f), block, period, nullptr};
  // (device, tile) of every task, sorted for lookups.
  std::vector<std::pair<DeviceId, int64_t>> held;
  held.reserve(c.devices.size());
  for (int64_t k = 0; k < c.numTiles(); ++k)
    for (int32_t r = 0; r < c.replicas; ++r)
      held.emplace_back(c.device(k, r), k);
  std::sort(held.begin(), held.end());
  // The sample loop's place in the tile index (mixed radix, the last loop
  // fastest).
  int sample = -1;
  int64_t stride = 1;
  for (size_t l = 0; l < sem.loops.size(); ++l)
    if (sem.loops[l].cls == DimClass::Sample) {
      sample = int(l);
      break;
    }
  if (sample >= 0)
    for (size_t l = size_t(sample) + 1; l < c.degree.size(); ++l)
      stride *= c.degree[l];
  auto invariant = [&](bool moveSamples) {
    for (const auto &[d, k] : held) {
      int64_t k2 = k;
      if (moveSamples) {
        int64_t deg = c.degree[size_t(sample)];
        int64_t coord = (k / stride) % deg;
        k2 = k + ((coord + deg / f) % deg - coord) * stride;
      }
      if (!std::binary_search(held.begin(), held.end(),
                              std::make_pair(fold.next(d), k2)))
        return false;
    }
    return true;
  };
  if (sample >= 0 && c.degree[size_t(sample)] % f == 0 && invariant(true))
    return true;
  return invariant(false);
}

Fold strategyFold(const Graph &g, const Topology &topo, const Strategy &s) {
  for (auto [block, period] : topo.foldCandidates()) {
    bool all = true;
    for (const Op &op : g.ops())
      if (!configFolds(s.configs[size_t(op.id)], op.sem, block, period)) {
        all = false;
        break;
      }
    if (!all)
      continue;
    if (const Topology::FoldBlock *fb = topo.foldBlock(block, period))
      return Fold{int32_t(period / block), block, period, fb};
  }
  return Fold();
}

} // namespace soap
