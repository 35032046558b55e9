// FT's re-scheduling model (TensorOpt 4.2), private to lib/Search: the
// collective times FT's costs use, and the shortest paths between splits of
// a tensor that give an edge's re-scheduling time. FtModelBuilder
// (Model.cpp) derives from it; FtModel::reschedule() uses it after
// the build.
#ifndef SOAP_LIB_SEARCH_FRONTIERPATHS_H
#define SOAP_LIB_SEARCH_FRONTIERPATHS_H

#include "soap/Search/FrontierTracking.h"

#include <map>
#include <mutex>
#include <tuple>
#include <vector>

namespace soap {

/// A tensor split: log2 degree per tensor dim, then partial-sum degree, then
/// replicas; the log2s add up to log2(devices). Packed 4 bits a slot.
using Split = std::vector<uint8_t>;

uint64_t pack(const Split &s);

struct FtPaths {
  FtPaths(const SearchProblem &p, FtModel &m, int bits)
      : p(p), m(m), bits(bits) {}
  const SearchProblem &p;
  FtModel &m;
  int bits = 0;

  /// Guards the model's shortest-path cache, shared by the build's threads.
  static std::mutex &cacheMutex();

  /// Collective time on `group`, memoised: the shortest paths and the
  /// configurations of similar ops ask for the same few groups and sizes
  /// again and again, and the collective model orders a ring each time.
  Seconds collectiveOn(Collective kind, const std::vector<DeviceId> &group,
                       Bytes b) const;
  /// Collective time on the group of 2^q devices with stride 2^s.
  Seconds collective(Collective kind, int q, int s, double bytes) const;

  /// Target split (packed) -> re-scheduling time, sorted by target.
  using Paths = std::vector<std::pair<uint64_t, Seconds>>;
  /// Dijkstra from `from` over every split of a tensor of `total` bytes.
  Paths paths(const Split &from, double total) const;
  /// paths(), memoised in the model (rank, bytes, source).
  const Paths &pathsFrom(double total, const Split &from) const;
  static Seconds lookup(const Paths &d, const Split &from, const Split &to);
  /// The cheapest re-scheduling of a `total`-byte tensor from one split to
  /// another.
  Seconds reschedule(double total, const Split &from, const Split &to) const;

private:
  mutable std::mutex collectiveMutex;
  mutable std::map<std::tuple<int, std::vector<DeviceId>, Bytes>, Seconds>
      collectiveCache;
  mutable std::map<std::pair<uint64_t, Bytes>, Seconds> stridedCache;
};

} // namespace soap

#endif
