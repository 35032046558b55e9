// Helpers shared by the task graph's source files (TaskGraph*.cpp); private
// to lib/Sim.
#ifndef SOAP_LIB_SIM_TASKGRAPHDETAIL_H
#define SOAP_LIB_SIM_TASKGRAPHDETAIL_H

#include "soap/Sim/TaskGraph.h"

#include <algorithm>
#include <vector>

namespace soap::detail {

TaskKey key(TaskKind kind, uint32_t a, uint32_t b, uint64_t c);

/// The last part of the key of a weight's task (TaskGraph::buildWeight and
/// its buckets): what it is (`sub`), its micro-batch, pass and user op.
inline uint64_t weightSubKey(uint64_t sub, int32_t mb, uint64_t pass,
                             OpId u = 0) {
  return (sub << 60) | (uint64_t(uint32_t(u)) << 28) |
         (uint64_t(uint32_t(mb)) << 4) | pass;
}

/// Groups the tiles of `c` that agree on every loop except those in `free`
/// (tiles whose results must be combined): group index per tile.
std::vector<int64_t> groupTiles(const OpConfig &c,
                                const std::vector<bool> &free,
                                int64_t &numGroups);

/// The distinct devices, ascending, that run any replica of `tiles`.
std::vector<DeviceId> devicesOf(const OpConfig &c,
                                const std::vector<int64_t> &tiles);

/// Whether two boxes share a point (Box::intersect without allocating).
inline bool overlaps(const Box &a, const Box &b) {
  for (size_t d = 0; d < a.lo.size(); ++d)
    if (std::max(a.lo[d], b.lo[d]) >= std::min(a.hi[d], b.hi[d]))
      return false;
  return true;
}

/// The consumer tiles whose regions may meet a producer's, without testing
/// every pair: along the dim where the regions are most spread, when they
/// are ordered there (lo and hi rising together, as the tiles of a split
/// are), the candidates are one contiguous run found by binary search —
/// O(log n + hits) per query instead of O(n), which is what makes a
/// 1,024-way split cost about what an 8-way one does per tile.
class TileIndex {
public:
  explicit TileIndex(const std::vector<Box> &boxes) : boxes_(boxes) {
    size_t n = boxes.size();
    if (n < 16 || boxes[0].lo.empty())
      return;
    size_t rank = boxes[0].lo.size();
    size_t best = 0;
    for (size_t d = 0; d < rank; ++d) {
      std::vector<int64_t> los;
      for (const Box &b : boxes)
        los.push_back(b.lo[d]);
      std::sort(los.begin(), los.end());
      size_t distinct =
          size_t(std::unique(los.begin(), los.end()) - los.begin());
      if (distinct > best) {
        best = distinct;
        dim_ = d;
      }
    }
    if (best < 2)
      return;
    order_.resize(n);
    for (size_t i = 0; i < n; ++i)
      order_[i] = int64_t(i);
    std::stable_sort(order_.begin(), order_.end(), [&](int64_t a, int64_t b) {
      return boxes[size_t(a)].lo[dim_] < boxes[size_t(b)].lo[dim_];
    });
    for (size_t i = 1; i < n; ++i)
      if (boxes[size_t(order_[i])].hi[dim_] <
          boxes[size_t(order_[i - 1])].hi[dim_]) {
        order_.clear(); // not ordered along the dim: test every tile
        return;
      }
  }

  /// Candidate tiles for `q`, ascending.
  std::vector<int64_t> candidates(const Box &q) const {
    std::vector<int64_t> out;
    if (order_.empty()) {
      out.resize(boxes_.size());
      for (size_t i = 0; i < out.size(); ++i)
        out[i] = int64_t(i);
      return out;
    }
    size_t d = dim_;
    // First with hi > q.lo, first with lo >= q.hi.
    auto first =
        std::partition_point(order_.begin(), order_.end(), [&](int64_t i) {
          return boxes_[size_t(i)].hi[d] <= q.lo[d];
        });
    auto last = std::partition_point(first, order_.end(), [&](int64_t i) {
      return boxes_[size_t(i)].lo[d] < q.hi[d];
    });
    out.assign(first, last);
    std::sort(out.begin(), out.end());
    return out;
  }

private:
  const std::vector<Box> &boxes_;
  size_t dim_ = 0;
  std::vector<int64_t> order_;
};

/// The points two boxes share (Box::intersect(b).volume() without
/// allocating).
inline int64_t overlapVolume(const Box &a, const Box &b) {
  int64_t v = 1;
  for (size_t d = 0; d < a.lo.size(); ++d) {
    int64_t n = std::min(a.hi[d], b.hi[d]) - std::max(a.lo[d], b.lo[d]);
    if (n <= 0)
      return 0;
    v *= n;
  }
  return v;
}

/// Whether `parts` tile `whole`: each of |whole| / n points (n parts), none
/// outside it, no two overlapping.
bool partsTile(const Box &whole, const std::vector<Box> &parts);

} // namespace soap::detail

#endif
