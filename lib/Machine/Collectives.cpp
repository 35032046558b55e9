// Collective cost model. Closed forms (n devices, S bytes, alpha the per-step
// latency, B the bandwidth of the slowest contended hop):
//   ring all-reduce            2(n-1) alpha + 2 (n-1)/n S/B
//   ring all-gather / reduce-scatter   (n-1) alpha + (n-1)/n S/B
//   tree all-reduce            2 ceil(log2 n) alpha + 2 S/B
//   broadcast, pipelined chain (n-1) alpha + S/B
//   broadcast, binomial tree   sum over ceil(log2 n) rounds of (alpha + S/B)
//   send/recv                  path latency + S / path bandwidth
// Ring and binomial-tree forms follow Thakur, Rabenseifner and Gropp,
// "Optimization of Collective Communication Operations in MPICH" (IJHPCA
// 2005); the ring is also NCCL's default algorithm. The tree all-reduce is
// NCCL's pipelined (double binary) tree: a reduce up and a broadcast down,
// each moving about S per device ("Massively Scale Your Deep Learning
// Training with NCCL 2.4", NVIDIA blog, 2019). Hierarchical all-reduce
// (reduce-scatter in each node, all-reduce among same-position peers across
// nodes on S/m, all-gather in each node) is Horovod's hierarchical
// all-reduce; all-gather and reduce-scatter have the matching two-phase forms.
//
// With an NCCL calibration (Topology::nccl, the topology file's `nccl`):
//  - a link of class c carries efficiency(c) x its bandwidth (NCCL's protocol
//    overhead) and a step costs the calibration's step latencies;
//  - k steps moving D bytes at B take launch + (sqrt(D/B) + sqrt(k alpha))^2,
//    alpha the mean step latency: the time of a pipeline of k stages whose
//    segment size is chosen for the message (Thakur et al. 2005, section
//    4.3, pipelined broadcast; NCCL pipelines every collective in chunks
//    and picks protocol and channel count by size, which is what makes its
//    bus bandwidth rise over decades of sizes -- the S-curve -- rather than
//    saturate at a few times alpha x B as plain alpha-beta does);
//  - a ring across nodes is NCCL's set of rings, one per device of a node,
//    each leaving every node from a different device and so through its own
//    NIC rail, each carrying 1/m of the buffer;
//  - on an NVSwitch with NVLink SHARP an all-reduce inside a node may be
//    reduced in the switch (NCCL's NVLS): each GPU sends S and receives S/n
//    for the reduce-scatter, sends S/n and receives S for the all-gather
//    (S. Jeaugey, NVIDIA/nccl#1083), so (1 + 1/n) S per direction in 2 steps.
#include "soap/Machine/Collectives.h"

#include "llvm/ADT/DenseMap.h"
#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <unordered_map>

namespace soap {

llvm::StringRef algorithmName(CollectiveAlgorithm a) {
  switch (a) {
  case CollectiveAlgorithm::Local:
    return "local";
  case CollectiveAlgorithm::PointToPoint:
    return "p2p";
  case CollectiveAlgorithm::Ring:
    return "ring";
  case CollectiveAlgorithm::Tree:
    return "tree";
  case CollectiveAlgorithm::Hierarchical:
    return "hierarchical";
  case CollectiveAlgorithm::Measured:
    return "measured";
  case CollectiveAlgorithm::Switch:
    return "nvls";
  }
  return "?";
}

GroupShape groupShape(const Topology &topo,
                      const std::vector<DeviceId> &group) {
  std::map<uint32_t, uint32_t> perNode;
  for (DeviceId d : group)
    ++perNode[topo.device(d).node];
  GroupShape shape{uint32_t(perNode.size()), 0};
  for (const auto &[node, count] : perNode) {
    if (shape.devicesPerNode == 0)
      shape.devicesPerNode = count;
    else if (shape.devicesPerNode != count)
      return {shape.nodes, 0};
  }
  return shape;
}

static int ceilLog2(size_t n) {
  int k = 0;
  while ((size_t(1) << k) < n)
    ++k;
  return k;
}

struct CollectiveModel::Memo {
  struct Key {
    Collective kind;
    Bytes size;
    std::vector<DeviceId> group;
    bool operator==(const Key &o) const {
      return kind == o.kind && size == o.size && group == o.group;
    }
  };
  struct Hash {
    size_t operator()(const Key &k) const {
      uint64_t h = uint64_t(k.kind) * 0x9e3779b97f4a7c15ULL ^ uint64_t(k.size);
      for (DeviceId d : k.group)
        h = (h ^ d) * 0x100000001b3ULL;
      return size_t(h);
    }
  };
  /// At most this many answers (a group of 1,024 devices holds 4 KiB).
  static constexpr size_t kEntries = 4096;
  std::mutex mutex;
  std::unordered_map<Key, CollectiveEstimate, Hash> answers;
};

CollectiveModel::CollectiveModel(const Topology &topo,
                                 const CollectiveProfile *profile)
    : topo_(topo), profile_(profile), memo_(std::make_unique<Memo>()) {
  computeNodeRings();
}

CollectiveModel::CollectiveModel(CollectiveModel &&) = default;
CollectiveModel::~CollectiveModel() = default;

Seconds CollectiveModel::hopLatency(DeviceId a, DeviceId b) const {
  const NcclCalibration &c = topo_.nccl();
  if (!c.enabled)
    return topo_.pathLatency(a, b);
  Seconds total = 0;
  for (LinkId l : topo_.route(a, b)) {
    const Link &link = topo_.link(l);
    total += c.stepLatency[size_t(link.cls)].value_or(link.latency);
  }
  return total;
}

Seconds CollectiveModel::stepsTime(double steps, Seconds alpha, double data,
                                   double bw) const {
  const NcclCalibration &c = topo_.nccl();
  if (!c.enabled)
    return steps * alpha + data / bw;
  double a = std::sqrt(data / bw), b = std::sqrt(steps * alpha);
  return c.launch + (a + b) * (a + b);
}

AlphaBeta CollectiveModel::edgeParameters(
    const std::vector<std::pair<DeviceId, DeviceId>> &edges) const {
  // Lookups only: the map's order never reaches an output.
  llvm::SmallDenseMap<LinkId, uint32_t, 64> load;
  for (const auto &[a, b] : edges)
    for (LinkId l : topo_.route(a, b))
      ++load[l];
  const NcclCalibration &c = topo_.nccl();
  AlphaBeta p{0, std::numeric_limits<double>::infinity()};
  for (const auto &[a, b] : edges) {
    p.alpha = std::max(p.alpha, hopLatency(a, b));
    for (LinkId l : topo_.route(a, b)) {
      const Link &link = topo_.link(l);
      p.bandwidthBytesPerSec = std::min(
          p.bandwidthBytesPerSec, link.bandwidthBytesPerSec *
                                      c.efficiency[size_t(link.cls)] /
                                      double(load[l]));
    }
  }
  return p;
}

AlphaBeta CollectiveModel::ringParameters(
    const std::vector<std::vector<DeviceId>> &orderedRings) const {
  std::vector<std::pair<DeviceId, DeviceId>> edges;
  Seconds meanAlpha = 0;
  for (const auto &ring : orderedRings)
    if (ring.size() > 1) {
      Seconds sum = 0;
      for (size_t i = 0; i < ring.size(); ++i) {
        edges.push_back({ring[i], ring[(i + 1) % ring.size()]});
        sum += hopLatency(edges.back().first, edges.back().second);
      }
      meanAlpha = std::max(meanAlpha, sum / double(ring.size()));
    }
  AlphaBeta p = edgeParameters(edges);
  p.meanAlpha = meanAlpha;
  return p;
}

/// Each node's ring: in (switch, local rank) order when every pair in the
/// node is alike; otherwise (direct NVLink meshes such as DGX-1) the best of
/// all cycles for up to 8 devices, found once per distinct node layout.
void CollectiveModel::computeNodeRings() {
  ringPos_.assign(topo_.numDevices(), 0);
  std::map<std::vector<double>, std::vector<uint32_t>> cache;
  for (const auto &node : topo_.groupsAt(Level::Node)) {
    std::vector<DeviceId> order = node;
    std::stable_sort(order.begin(), order.end(), [&](DeviceId a, DeviceId b) {
      return std::make_pair(topo_.device(a).switchGroup,
                            topo_.device(a).localRank) <
             std::make_pair(topo_.device(b).switchGroup,
                            topo_.device(b).localRank);
    });
    size_t m = node.size();
    std::vector<double> key;
    for (DeviceId a : node)
      for (DeviceId b : node)
        if (a != b) {
          key.push_back(topo_.pathBandwidth(a, b));
          key.push_back(topo_.pathLatency(a, b));
        }
    bool uniform = true;
    for (size_t i = 2; i < key.size(); ++i)
      uniform &= key[i] == key[i % 2];
    if (!uniform && m >= 3 && m <= 8) {
      auto it = cache.find(key);
      if (it == cache.end()) {
        std::vector<uint32_t> perm(m), best;
        for (uint32_t i = 0; i < m; ++i)
          perm[i] = i;
        AlphaBeta bestP{0, -1};
        do { // the first device stays put: rotations are the same ring
          std::vector<DeviceId> ring;
          for (uint32_t i : perm)
            ring.push_back(node[i]);
          AlphaBeta p = ringParameters({ring});
          if (p.bandwidthBytesPerSec > bestP.bandwidthBytesPerSec ||
              (p.bandwidthBytesPerSec == bestP.bandwidthBytesPerSec &&
               p.alpha < bestP.alpha)) {
            bestP = p;
            best = perm;
          }
        } while (std::next_permutation(perm.begin() + 1, perm.end()));
        it = cache.emplace(key, best).first;
      }
      for (size_t i = 0; i < m; ++i)
        order[i] = node[it->second[i]];
    }
    for (size_t i = 0; i < m; ++i)
      ringPos_[order[i]] = uint32_t(i);
  }
}

std::vector<DeviceId>
CollectiveModel::ringOrder(const std::vector<DeviceId> &group) const {
  std::vector<DeviceId> order = group;
  std::sort(order.begin(), order.end(), [&](DeviceId a, DeviceId b) {
    return std::make_tuple(topo_.device(a).node, ringPos_[a], a) <
           std::make_tuple(topo_.device(b).node, ringPos_[b], b);
  });
  return order;
}

/// One flat algorithm on `groups`, concurrent groups of equal size, each in
/// ring order (broadcast: root first). Links they share are shared fairly.
std::optional<Seconds>
CollectiveModel::flat(CollectiveAlgorithm algo, Collective kind,
                      const std::vector<std::vector<DeviceId>> &groups,
                      double size) const {
  size_t n = groups.front().size();
  if (n <= 1 || size <= 0)
    return 0.0;
  double steps = double(n - 1);
  double frac = steps / double(n);
  if (algo == CollectiveAlgorithm::Ring) {
    if (kind == Collective::Broadcast) { // pipelined chain from the root
      std::vector<std::pair<DeviceId, DeviceId>> edges;
      for (const auto &g : groups)
        for (size_t i = 0; i + 1 < n; ++i)
          edges.push_back({g[i], g[i + 1]});
      AlphaBeta p = edgeParameters(edges);
      return stepsTime(steps, p.alpha, size, p.bandwidthBytesPerSec);
    }
    AlphaBeta p = ringParameters(groups);
    // Calibrated: a pipeline pays the mean step, not the slowest, per step.
    Seconds alpha = topo_.nccl().enabled ? p.meanAlpha : p.alpha;
    switch (kind) {
    case Collective::AllReduce:
      return stepsTime(2 * steps, alpha, 2 * frac * size,
                       p.bandwidthBytesPerSec);
    case Collective::AllGather:
    case Collective::ReduceScatter:
      return stepsTime(steps, alpha, frac * size, p.bandwidthBytesPerSec);
    default:
      return std::nullopt;
    }
  }
  if (algo != CollectiveAlgorithm::Tree)
    return std::nullopt;
  if (kind == Collective::AllReduce) {
    // Binary tree over the ring order: every child sends up to its parent
    // at once (pipelined), so a parent's ingress is shared by two children.
    std::vector<std::pair<DeviceId, DeviceId>> edges;
    for (const auto &g : groups)
      for (size_t i = 1; i < n; ++i)
        edges.push_back({g[i], g[(i - 1) / 2]});
    AlphaBeta p = edgeParameters(edges);
    return stepsTime(2 * ceilLog2(n), p.alpha, 2 * size,
                     p.bandwidthBytesPerSec);
  }
  if (kind == Collective::Broadcast) {
    // Binomial tree: in round k, the first 2^k holders send to the devices
    // 2^k further on; rounds run one after another.
    Seconds total = topo_.nccl().launch; // 0 when not calibrated
    for (size_t stride = 1; stride < n; stride *= 2) {
      std::vector<std::pair<DeviceId, DeviceId>> edges;
      for (const auto &g : groups)
        for (size_t i = 0; i < stride && i + stride < n; ++i)
          edges.push_back({g[i], g[i + stride]});
      AlphaBeta p = edgeParameters(edges);
      total += p.alpha + size / p.bandwidthBytesPerSec;
    }
    return total;
  }
  return std::nullopt;
}

std::vector<std::vector<DeviceId>>
CollectiveModel::railRings(const std::vector<DeviceId> &group) const {
  GroupShape shape = groupShape(topo_, group);
  size_t m = shape.devicesPerNode;
  // Node-major ring order: node k's devices are order[k*m .. k*m+m).
  std::vector<DeviceId> order = ringOrder(group);
  std::vector<std::vector<DeviceId>> rings(m);
  for (size_t c = 0; c < m; ++c)
    for (size_t k = 0; k < shape.nodes; ++k)
      for (size_t i = 0; i < m; ++i)
        rings[c].push_back(order[k * m + (i + c) % m]);
  return rings;
}

std::optional<Seconds>
CollectiveModel::nvls(Collective kind, const std::vector<DeviceId> &group,
                      double size) const {
  const NcclCalibration &c = topo_.nccl();
  if (kind != Collective::AllReduce || c.nvlsEfficiency <= 0 ||
      groupShape(topo_, group).nodes != 1)
    return std::nullopt;
  // Every member's link into the switch: the first link of its route to
  // another member (NVSwitch nodes route GPU pairs through the switch).
  double bw = std::numeric_limits<double>::infinity();
  Seconds alpha = 0;
  for (size_t i = 0; i < group.size(); ++i) {
    DeviceId a = group[i], b = group[(i + 1) % group.size()];
    const Link &up = topo_.link(topo_.route(a, b).front());
    if (up.cls != LinkClass::NVSwitch)
      return std::nullopt;
    bw = std::min(bw, up.bandwidthBytesPerSec * c.nvlsEfficiency);
    alpha = std::max(alpha, hopLatency(a, b));
  }
  alpha = c.nvlsStepLatency.value_or(alpha);
  double n = double(group.size());
  return stepsTime(2, alpha, (1 + 1 / n) * size, bw);
}

std::optional<Seconds> CollectiveModel::hierarchical(
    Collective kind, const std::vector<DeviceId> &group, double size) const {
  if (kind != Collective::AllReduce && kind != Collective::AllGather &&
      kind != Collective::ReduceScatter)
    return std::nullopt;
  GroupShape shape = groupShape(topo_, group);
  if (shape.nodes < 2 || shape.devicesPerNode < 2)
    return std::nullopt;
  size_t m = shape.devicesPerNode;
  // Node-major ring order: node k's devices are order[k*m .. k*m+m).
  std::vector<DeviceId> order = ringOrder(group);
  std::vector<std::vector<DeviceId>> intra(shape.nodes), inter(m);
  for (size_t i = 0; i < order.size(); ++i) {
    intra[i / m].push_back(order[i]);
    inter[i % m].push_back(order[i]);
  }
  auto ring = [&](Collective k, const std::vector<std::vector<DeviceId>> &g,
                  double s) {
    return *flat(CollectiveAlgorithm::Ring, k, g, s);
  };
  double shard = size / double(m);
  switch (kind) {
  case Collective::AllReduce: {
    Seconds across = ring(Collective::AllReduce, inter, shard);
    across = std::min(across, *flat(CollectiveAlgorithm::Tree,
                                    Collective::AllReduce, inter, shard));
    return ring(Collective::ReduceScatter, intra, size) + across +
           ring(Collective::AllGather, intra, size);
  }
  case Collective::AllGather:
    return ring(Collective::AllGather, inter, shard) +
           ring(Collective::AllGather, intra, size);
  case Collective::ReduceScatter:
    return ring(Collective::ReduceScatter, intra, size) +
           ring(Collective::ReduceScatter, inter, shard);
  default:
    return std::nullopt;
  }
}

std::optional<Seconds>
CollectiveModel::algorithmTime(CollectiveAlgorithm algo, Collective kind,
                               const std::vector<DeviceId> &group,
                               Bytes size) const {
#ifndef NDEBUG
  std::vector<DeviceId> sorted = group;
  std::sort(sorted.begin(), sorted.end());
  assert((kind == Collective::SendRecv ||
          std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end()) &&
         "a collective group lists a device twice");
  assert((sorted.empty() || sorted.back() < topo_.numDevices()) &&
         "a collective group names a device the topology lacks");
#endif
  // A send to oneself moves nothing, like a one-device collective.
  bool trivial = group.size() <= 1 || size <= 0 ||
                 (kind == Collective::SendRecv && group[0] == group[1]);
  if (algo == CollectiveAlgorithm::Local)
    return trivial ? std::optional<Seconds>(0.0) : std::nullopt;
  if (trivial)
    return std::nullopt;
  if (algo == CollectiveAlgorithm::Measured) {
    if (!profile_)
      return std::nullopt;
    return profile_->predict(kind, groupShape(topo_, group), size);
  }
  if (kind == Collective::SendRecv) {
    assert(group.size() == 2 && "send/recv takes a (source, destination) pair");
    if (algo != CollectiveAlgorithm::PointToPoint)
      return std::nullopt;
    if (topo_.nccl().enabled) {
      AlphaBeta p = edgeParameters({{group[0], group[1]}});
      return stepsTime(1, p.alpha, double(size), p.bandwidthBytesPerSec);
    }
    return topo_.pathLatency(group[0], group[1]) +
           double(size) / topo_.pathBandwidth(group[0], group[1]);
  }
  if (algo == CollectiveAlgorithm::Hierarchical)
    return hierarchical(kind, group, double(size));
  if (algo == CollectiveAlgorithm::Switch)
    return nvls(kind, group, double(size));
  if (algo != CollectiveAlgorithm::Ring && algo != CollectiveAlgorithm::Tree)
    return std::nullopt;
  if (algo == CollectiveAlgorithm::Ring && topo_.nccl().enabled &&
      kind != Collective::Broadcast) {
    GroupShape shape = groupShape(topo_, group);
    if (shape.nodes >= 2 && shape.devicesPerNode >= 2)
      return flat(algo, kind, railRings(group),
                  double(size) / double(shape.devicesPerNode));
  }
  std::vector<DeviceId> order = ringOrder(group);
  if (kind == Collective::Broadcast) // the root goes first
    std::rotate(order.begin(), std::find(order.begin(), order.end(), group[0]),
                order.end());
  return flat(algo, kind, {order}, double(size));
}

CollectiveEstimate CollectiveModel::estimate(Collective kind,
                                             const std::vector<DeviceId> &group,
                                             Bytes size) const {
  Memo::Key key{kind, size, group};
  {
    std::lock_guard<std::mutex> lock(memo_->mutex);
    auto it = memo_->answers.find(key);
    if (it != memo_->answers.end())
      return it->second;
  }
  CollectiveEstimate e = compute(kind, group, size);
  std::lock_guard<std::mutex> lock(memo_->mutex);
  if (memo_->answers.size() >= Memo::kEntries)
    memo_->answers.clear();
  memo_->answers.emplace(std::move(key), e);
  return e;
}

CollectiveEstimate CollectiveModel::compute(Collective kind,
                                            const std::vector<DeviceId> &group,
                                            Bytes size) const {
  if (algorithmTime(CollectiveAlgorithm::Local, kind, group, size))
    return {0, CollectiveAlgorithm::Local};
  if (auto t = algorithmTime(CollectiveAlgorithm::Measured, kind, group, size))
    return {*t, CollectiveAlgorithm::Measured};
  CollectiveEstimate best{std::numeric_limits<double>::infinity(),
                          CollectiveAlgorithm::Local};
  // Candidates in a fixed order; a later one must be strictly faster.
  for (CollectiveAlgorithm a :
       {CollectiveAlgorithm::PointToPoint, CollectiveAlgorithm::Ring,
        CollectiveAlgorithm::Tree, CollectiveAlgorithm::Hierarchical,
        CollectiveAlgorithm::Switch}) {
    auto t = algorithmTime(a, kind, group, size);
    if (t && *t < best.time)
      best = {*t, a};
  }
  return best;
}

} // namespace soap
