// The brute-force frontier oracle (FrontierOracle.h).
#include "FrontierOracle.h"

#include <algorithm>
#include <iterator>

namespace soap {

std::vector<FtCosts> bruteForceFrontier(const FtModel &m, uint64_t limit) {
  size_t n = m.numOps();
  double total = 1;
  for (size_t o = 0; o < n; ++o)
    total *= double(m.configs(OpId(o)).size());
  if (n == 0 || total > double(limit))
    return {};
  // The frontier so far: memory strictly rising, time strictly falling. An
  // assignment joins it unless one already there has no more memory and no
  // more time (so of equal costs the first enumerated stays), and pushes out
  // those it dominates: the set a sort of every assignment by (memory, time)
  // and a scan for falling times gives, without storing every assignment.
  std::vector<FtCosts> front;
  auto offer = [&](const FtCosts &c) {
    auto lo = std::lower_bound(
        front.begin(), front.end(), c.memory,
        [](const FtCosts &x, double mem) { return x.memory < mem; });
    auto above = std::upper_bound(
        lo, front.end(), c.memory,
        [](double mem, const FtCosts &x) { return mem < x.memory; });
    if (above != front.begin() && std::prev(above)->time <= c.time)
      return;
    auto hi = lo;
    while (hi != front.end() && hi->time >= c.time)
      ++hi;
    front.insert(front.erase(lo, hi), c);
  };
  FtAssignment a;
  a.config.assign(n, 0);
  a.reuse.assign(m.edges().size(), 0);
  std::vector<size_t> counts(m.edges().size());
  uint64_t seen = 0;
  for (;;) {
    // Every combination of edge options under these configurations.
    for (size_t e = 0; e < m.edges().size(); ++e) {
      const FtEdge &ed = m.edges()[e];
      counts[e] = m.edgeOptions(e, size_t(a.config[ed.producer]),
                                size_t(a.config[ed.consumer]))
                      .size();
    }
    std::fill(a.reuse.begin(), a.reuse.end(), 0);
    for (;;) {
      if (++seen > limit)
        return {};
      offer(assignmentCosts(m, a));
      size_t e = 0;
      while (e < counts.size() && ++a.reuse[e] == counts[e])
        a.reuse[e++] = 0;
      if (e == counts.size())
        break;
    }
    size_t o = 0;
    while (o < n && ++a.config[o] == int32_t(m.configs(OpId(o)).size()))
      a.config[o++] = 0;
    if (o == n)
      break;
  }
  return front;
}

} // namespace soap
