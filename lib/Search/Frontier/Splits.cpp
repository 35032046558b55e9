// FT's re-scheduling costs (TensorOpt 4.2): the cheapest sequence of
// collectives between two splits of a tensor, a shortest path over the
// collective model, memoised per (rank, bytes, source split).
#include "Splits.h"

#include <algorithm>
#include <cmath>
#include <queue>

namespace soap {

uint64_t pack(const Split &s) {
  uint64_t k = 0;
  for (size_t i = 0; i < s.size(); ++i)
    k |= uint64_t(s[i]) << (4 * i);
  return k;
}

std::mutex &FtPaths::cacheMutex() {
  static std::mutex mu;
  return mu;
}

/// Collective time on `group`, memoised: the shortest paths and the
/// configurations of similar ops ask for the same few groups and sizes
/// again and again, and the collective model orders a ring each time.
Seconds FtPaths::collectiveOn(Collective kind,
                              const std::vector<DeviceId> &group,
                              Bytes b) const {
  auto key = std::make_tuple(int(kind), group, b);
  {
    std::lock_guard<std::mutex> lock(collectiveMutex);
    auto it = collectiveCache.find(key);
    if (it != collectiveCache.end())
      return it->second;
  }
  Seconds t = p.collectives.time(kind, group, b);
  std::lock_guard<std::mutex> lock(collectiveMutex);
  collectiveCache.emplace(std::move(key), t);
  return t;
}

/// Collective time on the group of 2^q devices with stride 2^s.
Seconds FtPaths::collective(Collective kind, int q, int s, double bytes) const {
  Bytes b = Bytes(std::ceil(bytes));
  // Packed key: no group is built unless the time is new.
  uint64_t key =
      (uint64_t(kind) << 56) | (uint64_t(q) << 48) | (uint64_t(s) << 40);
  {
    std::lock_guard<std::mutex> lock(collectiveMutex);
    auto it = stridedCache.find({key, b});
    if (it != stridedCache.end())
      return it->second;
  }
  std::vector<DeviceId> group;
  for (int64_t i = 0; i < (int64_t(1) << q); ++i)
    group.push_back(DeviceId(i << s));
  Seconds t = collectiveOn(kind, group, b);
  std::lock_guard<std::mutex> lock(collectiveMutex);
  stridedCache.emplace(std::make_pair(key, b), t);
  return t;
}

/// Dijkstra from `from` over every split of a rank-R tensor of `total`
/// bytes; edges are single collectives (all-reduce or reduce-scatter of a
/// partial sum, all-gather of part of a dim) or free local slices. The
/// mesh orders slots as listed, the last fastest: a collective on a
/// slot's fastest part strides over the faster slots. States are packed
/// splits (4 bits a slot), so the search allocates only its queue.
/// Sorted by target split.
FtPaths::Paths FtPaths::paths(const Split &from, double total) const {
  size_t n = from.size(), r = n - 2;
  auto get = [](uint64_t k, size_t i) { return int((k >> (4 * i)) & 15); };
  // Slot i += d (the slot stays within 0..15): unsigned arithmetic, no
  // shift of a negative value.
  auto add = [](uint64_t k, size_t i, int d) {
    uint64_t step = uint64_t(d < 0 ? -d : d) << (4 * i);
    return d < 0 ? k - step : k + step;
  };
  // Distances in an open-addressing table sized for every split: the
  // number of ways to spread the start's bits over n slots.
  int bitsUsed = 0;
  for (uint8_t b : from)
    bitsUsed += b;
  double states = 1;
  for (int i = 1; i < int(n); ++i)
    states = states * double(bitsUsed + i) / double(i);
  size_t cap = 16;
  while (double(cap) < 2 * states)
    cap *= 2;
  constexpr uint64_t kEmpty = ~uint64_t(0);
  std::vector<uint64_t> keys(cap, kEmpty);
  std::vector<Seconds> vals(cap, 0);
  auto slot = [&](uint64_t k) {
    size_t h = size_t((k * 0x9E3779B97F4A7C15ull) >> 32) & (cap - 1);
    while (keys[h] != kEmpty && keys[h] != k)
      h = (h + 1) & (cap - 1);
    return h;
  };
  using Item = std::pair<Seconds, uint64_t>;
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> pq;
  uint64_t start = pack(from);
  size_t h0 = slot(start);
  keys[h0] = start;
  vals[h0] = 0;
  pq.push({0, start});
  auto relax = [&](uint64_t k, Seconds t) {
    size_t h = slot(k);
    if (keys[h] == kEmpty || t < vals[h]) {
      keys[h] = k;
      vals[h] = t;
      pq.push({t, k});
    }
  };
  // The collectives of one search: bytes depend only on how split the
  // tensor is (dimsQ) and q, so a few dozen distinct calls repeat; a
  // local table spares the shared cache's lock (measured: 2.9 -> 2.4 ms
  // of the RNN's initialisation).
  std::unordered_map<uint32_t, Seconds> local;
  local.reserve(64);
  auto coll = [&](Collective kind, int q, int stride, int dimsQ) {
    uint32_t key = (uint32_t(kind) << 24) | (uint32_t(q) << 16) |
                   (uint32_t(stride) << 8) | uint32_t(dimsQ);
    auto it = local.find(key);
    if (it != local.end())
      return it->second;
    double bytes = std::ldexp(total, -dimsQ);
    if (kind == Collective::AllGather)
      bytes = std::ldexp(bytes, q);
    Seconds t = collective(kind, q, stride, bytes);
    local.emplace(key, t);
    return t;
  };
  while (!pq.empty()) {
    // Copies, not bindings: the lambdas below capture them (C++17).
    Seconds t = pq.top().first;
    uint64_t k = pq.top().second;
    pq.pop();
    if (t > vals[slot(k)])
      continue;
    int dimsQ = 0;
    for (size_t d = 0; d < r; ++d)
      dimsQ += get(k, d);
    auto faster = [&](size_t slot) {
      int f = 0;
      for (size_t i = slot + 1; i < n; ++i)
        f += get(k, i);
      return f;
    };
    int part = get(k, r);
    if (part > 0) {
      int stride = faster(r);
      uint64_t a = add(add(k, r, -part), r + 1, part);
      relax(a, t + coll(Collective::AllReduce, part, stride, dimsQ));
      Seconds rs = coll(Collective::ReduceScatter, part, stride, dimsQ);
      for (size_t d = 0; d < r; ++d)
        relax(add(add(k, r, -part), d, part), t + rs);
      continue;
    }
    int reps = get(k, r + 1);
    for (size_t d = 0; d < r; ++d) {
      int sd = get(k, d), fd = faster(d);
      for (int q = 1; q <= sd; ++q)
        relax(add(add(k, d, -q), r + 1, q),
              t + coll(Collective::AllGather, q, fd, dimsQ));
      for (int q = 1; q <= reps; ++q)
        relax(add(add(k, r + 1, -q), d, q), t); // a local slice
    }
  }
  Paths out;
  for (size_t h = 0; h < cap; ++h)
    if (keys[h] != kEmpty)
      out.push_back({keys[h], vals[h]});
  std::sort(out.begin(), out.end());
  return out;
}

/// Every split's re-scheduling time from `from`. Shared by threads and by
/// later reschedule() calls: keyed by what the result depends on (rank,
/// bytes, source), so tensors of equal shape in different layers share
/// one search. The result stays valid (std::map nodes do not move).
const FtPaths::Paths &FtPaths::pathsFrom(double total,
                                         const Split &from) const {
  static const Paths nothingToMove;
  if (total <= 0)
    return nothingToMove;
  auto key = std::make_tuple(from.size(), total, pack(from));
  {
    std::lock_guard<std::mutex> lock(cacheMutex());
    auto it = m.pathCache_.find(key);
    if (it != m.pathCache_.end())
      return it->second;
  }
  auto d = paths(from, total);
  std::lock_guard<std::mutex> lock(cacheMutex());
  return m.pathCache_.try_emplace(key, std::move(d)).first->second;
}

Seconds FtPaths::lookup(const Paths &d, const Split &from, const Split &to) {
  if (from == to)
    return 0;
  uint64_t k = pack(to);
  auto it = std::lower_bound(d.begin(), d.end(), k,
                             [](const std::pair<uint64_t, Seconds> &e,
                                uint64_t x) { return e.first < x; });
  return it == d.end() || it->first != k ? 0 : it->second;
}

Seconds FtPaths::reschedule(double total, const Split &from,
                            const Split &to) const {
  if (from == to || total <= 0)
    return 0;
  return lookup(pathsFrom(total, from), from, to);
}

} // namespace soap
