// Groups of nodes that are each other's exact image (Topology::foldBlock),
// so that a strategy treating them alike runs the same timeline on each and
// is simulated on one (Sim/Fold.h).
#include "soap/Machine/Topology.h"

#include <algorithm>
#include <map>
#include <mutex>

namespace soap {

struct Topology::FoldCache {
  std::mutex mutex;
  std::map<std::pair<uint32_t, uint32_t>, std::unique_ptr<FoldBlock>> pairs;
};

void Topology::resetFoldCache() { foldCache_ = std::make_shared<FoldCache>(); }

std::vector<std::pair<uint32_t, uint32_t>> Topology::foldCandidates() const {
  std::vector<std::pair<uint32_t, uint32_t>> out;
  size_t nodes = numNodes_, n = devices_.size();
  if (nodes < 2 || n % nodes != 0)
    return out;
  uint32_t per = uint32_t(n / nodes);
  for (uint32_t b = per; b < n; b += per)
    for (uint32_t p = 2 * b; p <= n; p += b)
      if (n % b == 0 && n % p == 0 && p % b == 0)
        out.emplace_back(b, p);
  // Most groups first (the smallest graph), then the smaller block.
  std::stable_sort(out.begin(), out.end(), [](auto x, auto y) {
    return x.second / x.first > y.second / y.first;
  });
  return out;
}

const Topology::FoldBlock *Topology::foldBlock(uint32_t block,
                                               uint32_t period) const {
  if (!foldCache_)
    return nullptr; // not finalized
  std::lock_guard<std::mutex> lock(foldCache_->mutex);
  auto key = std::make_pair(block, period);
  auto it = foldCache_->pairs.find(key);
  if (it == foldCache_->pairs.end())
    it = foldCache_->pairs.emplace(key, checkFold(block, period)).first;
  return it->second.get();
}

std::unique_ptr<Topology::FoldBlock>
Topology::checkFold(uint32_t block, uint32_t period) const {
  size_t nodes = numNodes_, n = devices_.size();
  if (nodes < 2 || n % nodes != 0 || block == 0 || period % block != 0 ||
      n % period != 0 || period == block)
    return nullptr;
  uint32_t per = uint32_t(n / nodes);
  if (block % per != 0)
    return nullptr;
  for (const DeviceInfo &d : devices_)
    if (d.node != d.id / per)
      return nullptr; // not node-major: blocks are not whole nodes
  auto fb = std::make_unique<FoldBlock>();
  fb->block = block;
  fb->period = period;
  fb->linkGroup.assign(links_.size(), -1);
  fb->linkInFirst.assign(links_.size(), ~LinkId(0));
  // Group 0: the first block of every period.
  std::vector<DeviceId> first;
  for (DeviceId d = 0; d < n; ++d)
    if (d % period < block)
      first.push_back(d);
  uint32_t groups = period / block;
  for (uint32_t j = 0; j < groups; ++j)
    for (DeviceId a : first)
      for (DeviceId c : first) {
        const std::vector<LinkId> &r0 = route(a, c);
        const std::vector<LinkId> &rj = route(a + j * block, c + j * block);
        if (r0.size() != rj.size())
          return nullptr;
        for (size_t i = 0; i < r0.size(); ++i) {
          const Link &x = links_[r0[i]], &y = links_[rj[i]];
          if (x.cls != y.cls ||
              x.bandwidthBytesPerSec != y.bandwidthBytesPerSec ||
              x.latency != y.latency || nonBlocking_[x.id] != nonBlocking_[y.id])
            return nullptr;
          if (nonBlocking_[y.id])
            continue; // shared freely: never waited for
          LinkId &src = fb->linkInFirst[y.id];
          int32_t &owner = fb->linkGroup[y.id];
          if ((src != ~LinkId(0) && src != x.id) ||
              (owner >= 0 && owner != int32_t(j)))
            return nullptr;
          src = x.id;
          owner = int32_t(j);
        }
      }
  return fb;
}

} // namespace soap
