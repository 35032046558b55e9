// The link graph, its routes (deterministic least-time paths) and the
// locality hierarchy.
#include "soap/Machine/Topology.h"

#include "soap/Support/Error.h"
#include <cassert>
#include <cmath>
#include <limits>
#include <queue>
#include <tuple>

namespace soap {

llvm::StringRef levelName(Level l) {
  switch (l) {
  case Level::Device:
    return "device";
  case Level::Switch:
    return "switch";
  case Level::Node:
    return "node";
  case Level::Rack:
    return "rack";
  case Level::Cluster:
    return "cluster";
  }
  return "?";
}

static const char *const kLinkClassNames[kNumLinkClasses] = {
    "nvlink", "nvswitch", "pcie", "socket", "network", "uplink"};

llvm::StringRef linkClassName(LinkClass c) {
  return kLinkClassNames[static_cast<int>(c)];
}

std::optional<LinkClass> parseLinkClass(llvm::StringRef name) {
  for (int i = 0; i < kNumLinkClasses; ++i)
    if (name == kLinkClassNames[i])
      return static_cast<LinkClass>(i);
  return std::nullopt;
}

llvm::StringRef vertexKindName(VertexKind k) {
  switch (k) {
  case VertexKind::Device:
    return "gpu";
  case VertexKind::NVSwitch:
    return "nvswitch";
  case VertexKind::PcieSwitch:
    return "pcie switch";
  case VertexKind::Cpu:
    return "cpu";
  case VertexKind::Nic:
    return "nic";
  case VertexKind::NetworkSwitch:
    return "network switch";
  case VertexKind::Spine:
    return "spine switch";
  }
  return "?";
}

VertexId Topology::addVertex(VertexKind kind, std::string name, int32_t node,
                             int32_t rack) {
  vertices_.push_back({kind, std::move(name), node, rack});
  outLinks_.emplace_back();
  return VertexId(vertices_.size() - 1);
}

DeviceId Topology::addDevice(VertexId v, uint32_t node, uint32_t localRank,
                             uint32_t switchGroup, uint32_t rack) {
  assert(vertices_[v].kind == VertexKind::Device);
  DeviceId id = DeviceId(devices_.size());
  devices_.push_back({id, v, node, localRank, switchGroup, rack});
  numNodes_ = std::max<size_t>(numNodes_, node + 1);
  numRacks_ = std::max<size_t>(numRacks_, rack + 1);
  if (switchGroupNames_.size() <= switchGroup)
    switchGroupNames_.resize(switchGroup + 1);
  return id;
}

void Topology::setSwitchGroupName(uint32_t g, std::string name) {
  if (switchGroupNames_.size() <= g)
    switchGroupNames_.resize(g + 1);
  switchGroupNames_[g] = std::move(name);
}

LinkId Topology::addLink(VertexId a, VertexId b, LinkClass cls,
                         double bandwidthBytesPerSec, Seconds latency) {
  assert(a != b && bandwidthBytesPerSec > 0 && latency >= 0);
  LinkId fwd = LinkId(links_.size());
  links_.push_back({fwd, a, b, cls, bandwidthBytesPerSec, latency});
  links_.push_back({fwd + 1, b, a, cls, bandwidthBytesPerSec, latency});
  outLinks_[a].push_back(fwd);
  outLinks_[b].push_back(fwd + 1);
  return fwd;
}

namespace {
/// The message size routes are chosen for: large enough that bandwidth
/// matters (a fast two-hop path beats a slow direct one), small enough that
/// latency still breaks ties between equally fast paths.
constexpr double kRouteReferenceBytes = 1 << 20;

/// A path's cost: integer picoseconds (exact sums, so equal paths tie
/// exactly), then hop count.
struct Cost {
  uint64_t ps = std::numeric_limits<uint64_t>::max();
  uint32_t hops = 0;
  bool operator<(const Cost &o) const {
    return std::tie(ps, hops) < std::tie(o.ps, o.hops);
  }
  bool operator==(const Cost &o) const { return ps == o.ps && hops == o.hops; }
};

uint64_t linkCostPs(const Link &l) {
  return uint64_t(std::llround(l.latency * 1e12)) +
         uint64_t(
             std::ceil(kRouteReferenceBytes / l.bandwidthBytesPerSec * 1e12));
}

struct Pred {
  VertexId vertex = ~0u;
  LinkId link = ~0u;
};
} // namespace

/// Single-source least-cost paths from device vertex `src`. `intraOnly`
/// keeps the search inside the source's node and off its NICs (routes
/// between devices of one node never leave it). Third GPUs are never
/// expanded, and a path that has entered a foreign node may not go back out
/// to the network, so routes cross the network at most once.
static std::vector<Pred> shortestPaths(
    const std::vector<Vertex> &vertices, const std::vector<Link> &links,
    const std::vector<std::vector<LinkId>> &out, VertexId src, bool intraOnly) {
  size_t n = vertices.size();
  int32_t srcNode = vertices[src].node;
  std::vector<Cost> dist(n);
  std::vector<Pred> pred(n);
  std::vector<bool> done(n, false);
  using Item = std::tuple<uint64_t, uint32_t, VertexId>;
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> queue;
  dist[src] = {0, 0};
  queue.push({0, 0, src});
  while (!queue.empty()) {
    auto [ps, hops, u] = queue.top();
    queue.pop();
    if (done[u])
      continue;
    done[u] = true;
    const Vertex &vu = vertices[u];
    if (vu.kind == VertexKind::Device && u != src)
      continue; // GPUs do not forward traffic
    for (LinkId lid : out[u]) {
      const Link &l = links[lid];
      const Vertex &vv = vertices[l.to];
      if (intraOnly && (vv.node != srcNode || vv.kind == VertexKind::Nic))
        continue;
      if (vu.node >= 0 && vu.node != srcNode && vv.node < 0)
        continue; // no way back out of a foreign node
      Cost c{ps + linkCostPs(l), hops + 1};
      Cost &d = dist[l.to];
      bool better = c < d;
      if (!better && c == d)
        better =
            std::tie(u, lid) < std::tie(pred[l.to].vertex, pred[l.to].link);
      if (!better)
        continue;
      d = c;
      pred[l.to] = {u, lid};
      if (!done[l.to])
        queue.push({c.ps, c.hops, l.to});
    }
  }
  return pred;
}

llvm::Error Topology::finalize() {
  size_t n = devices_.size();
  if (n == 0)
    return inputError("topology has no devices");
  // Non-blocking links. Levels: GPUs, then node switches and CPUs, NICs,
  // rack switches, the spine. A link going up carries at most what the
  // lower-level links into its tail bring; one going down at most what
  // the lower-level links out of its head take away. Bounding by lower
  // levels only keeps two fat links from each excusing the other.
  auto level = [&](VertexId v) {
    switch (vertices_[v].kind) {
    case VertexKind::Device:
      return 0;
    case VertexKind::NVSwitch:
    case VertexKind::PcieSwitch:
    case VertexKind::Cpu:
      return 1;
    case VertexKind::Nic:
      return 2;
    case VertexKind::NetworkSwitch:
      return 3;
    case VertexKind::Spine:
      return 4;
    }
    return 0;
  };
  std::vector<double> fromBelow(vertices_.size(), 0),
      toBelow(vertices_.size(), 0);
  for (const Link &l : links_) {
    if (level(l.from) < level(l.to))
      fromBelow[l.to] += l.bandwidthBytesPerSec;
    else if (level(l.to) < level(l.from))
      toBelow[l.from] += l.bandwidthBytesPerSec;
  }
  nonBlocking_.assign(links_.size(), 0);
  for (const Link &l : links_) {
    int a = level(l.from), b = level(l.to);
    double bound = a < b   ? (a > 0 ? fromBelow[l.from] : 0)
                   : b < a ? (b > 0 ? toBelow[l.to] : 0)
                           : 0;
    nonBlocking_[l.id] = bound > 0 && l.bandwidthBytesPerSec >= bound;
  }
  resetFoldCache();
  routes_.assign(n * n, {});
  pathBandwidth_.assign(n * n, std::numeric_limits<double>::infinity());
  pathLatency_.assign(n * n, 0.0);
  for (DeviceId a = 0; a < n; ++a) {
    VertexId va = devices_[a].vertex;
    std::vector<Pred> intra =
        shortestPaths(vertices_, links_, outLinks_, va, /*intraOnly=*/true);
    std::vector<Pred> full;
    if (numNodes_ > 1)
      full = shortestPaths(vertices_, links_, outLinks_, va, false);
    for (DeviceId b = 0; b < n; ++b) {
      if (a == b)
        continue;
      const std::vector<Pred> &pred =
          devices_[a].node == devices_[b].node ? intra : full;
      VertexId vb = devices_[b].vertex;
      if (pred.empty() || pred[vb].link == ~0u)
        return inputError("device {} has no route to device {}",
                          vertices_[va].name, vertices_[vb].name);
      std::vector<LinkId> &r = routes_[size_t(a) * n + b];
      double bw = std::numeric_limits<double>::infinity();
      Seconds lat = 0;
      for (VertexId v = vb; v != va; v = pred[v].vertex) {
        const Link &l = links_[pred[v].link];
        r.push_back(l.id);
        bw = std::min(bw, l.bandwidthBytesPerSec);
      }
      std::reverse(r.begin(), r.end());
      for (LinkId l : r) // summed in path order: the same bits every time
        lat += links_[l].latency;
      pathBandwidth_[size_t(a) * n + b] = bw;
      pathLatency_[size_t(a) * n + b] = lat;
    }
  }
  return llvm::Error::success();
}

Level Topology::levelOf(DeviceId a, DeviceId b) const {
  const DeviceInfo &x = devices_[a], &y = devices_[b];
  if (a == b)
    return Level::Device;
  if (x.switchGroup == y.switchGroup)
    return Level::Switch;
  if (x.node == y.node)
    return Level::Node;
  if (x.rack == y.rack)
    return Level::Rack;
  return Level::Cluster;
}

uint32_t Topology::groupOf(DeviceId d, Level level) const {
  const DeviceInfo &x = devices_[d];
  switch (level) {
  case Level::Device:
    return d;
  case Level::Switch:
    return x.switchGroup;
  case Level::Node:
    return x.node;
  case Level::Rack:
    return x.rack;
  case Level::Cluster:
    return 0;
  }
  return 0;
}

std::vector<std::vector<DeviceId>> Topology::groupsAt(Level level) const {
  size_t count = level == Level::Device   ? devices_.size()
                 : level == Level::Switch ? numSwitchGroups()
                 : level == Level::Node   ? numNodes_
                 : level == Level::Rack   ? numRacks_
                                          : 1;
  std::vector<std::vector<DeviceId>> groups(count);
  for (const DeviceInfo &d : devices_)
    groups[groupOf(d.id, level)].push_back(d.id);
  // Hand-built topologies may leave an index unused; drop empty groups.
  std::vector<std::vector<DeviceId>> out;
  for (auto &g : groups)
    if (!g.empty())
      out.push_back(std::move(g));
  return out;
}

} // namespace soap
