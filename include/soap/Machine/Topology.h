// The machine model: devices (GPUs) in nodes, the switches and NICs between
// them, the physical links with their bandwidth and latency, the route every
// ordered device pair takes over those links, and the locality hierarchy
// device < switch < node < rack < cluster that searchers place work by.
#ifndef SOAP_MACHINE_TOPOLOGY_H
#define SOAP_MACHINE_TOPOLOGY_H

#include "soap/Machine/DeviceCatalog.h"
#include "soap/Machine/Units.h"
#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace soap {

using DeviceId = uint32_t;
using LinkId = uint32_t;
using VertexId = uint32_t;

/// Locality levels, lowest first. Two devices' lowest common level is the
/// smallest group that holds both (Topology::levelOf).
enum class Level : uint8_t {
  Device,  ///< the same device
  Switch,  ///< under one PCIe switch, or in one NVLink/NVSwitch domain
  Node,    ///< in one node (server)
  Rack,    ///< under one network (leaf) switch
  Cluster, ///< anywhere
};
constexpr int kNumLevels = 5;
llvm::StringRef levelName(Level l);

/// What a physical link is. `Socket` is a CPU-to-CPU link (QPI/UPI);
/// `Network` joins a NIC to its leaf switch; `Uplink` a leaf to the spine.
enum class LinkClass : uint8_t {
  NVLink,
  NVSwitch,
  PCIe,
  Socket,
  Network,
  Uplink
};
constexpr int kNumLinkClasses = 6;
llvm::StringRef linkClassName(LinkClass c);
std::optional<LinkClass> parseLinkClass(llvm::StringRef name);

enum class VertexKind : uint8_t {
  Device,        ///< a GPU
  NVSwitch,      ///< a node's NVSwitch fabric, modelled as one switch
  PcieSwitch,    ///< a PCIe switch
  Cpu,           ///< a CPU socket's root complex
  Nic,           ///< a network adapter
  NetworkSwitch, ///< a rack's leaf switch
  Spine,         ///< the switch joining the racks
};
llvm::StringRef vertexKindName(VertexKind k);

/// A vertex of the link graph.
struct Vertex {
  VertexKind kind;
  std::string name; ///< "n0.gpu3", "n1.nic0", "rack0.leaf"
  int32_t node;     ///< -1 for network switches, which are in no node
  int32_t rack;     ///< -1 for the spine
};

/// A directed link. Every physical (full-duplex) link `p` appears as two
/// directed links, ids 2p (first endpoint to second) and 2p+1 (back); each
/// direction has the full bandwidth. Transfers that cross the same directed
/// link contend for it.
struct Link {
  LinkId id;
  VertexId from;
  VertexId to;
  LinkClass cls;
  double bandwidthBytesPerSec; ///< per direction
  Seconds latency;
  uint32_t physical() const { return id / 2; }
};

/// How NCCL's kernels use the links, fitted to nccl-tests measurements
/// (optional: the topology file's `nccl` object). Without it the collective
/// model prices collectives at line rate with the links' latencies.
struct NcclCalibration {
  bool enabled = false;
  /// A collective's fixed cost: kernel launch and the ranks' first
  /// handshake, paid once per call.
  Seconds launch = 0;
  /// Per link class: the fraction of the link's bandwidth NCCL's protocol
  /// achieves (1 where unset), and the latency one pipeline step spends on
  /// a link of the class (the link's own latency where unset).
  std::array<double, kNumLinkClasses> efficiency{1, 1, 1, 1, 1, 1};
  std::array<std::optional<Seconds>, kNumLinkClasses> stepLatency{};
  /// NVLink SHARP (NVLS): the fraction of a GPU's NVSwitch link bandwidth
  /// an all-reduce reduced inside the switch achieves; 0 where the switch
  /// does not reduce (NVSwitch before NVLink 4).
  double nvlsEfficiency = 0;
  /// The latency of one of NVLS's two pipeline steps (scatter-reduce in
  /// the switch, then multicast); the route's step latency where unset.
  std::optional<Seconds> nvlsStepLatency;
};

/// Where a device sits in the hierarchy.
struct DeviceInfo {
  DeviceId id;
  VertexId vertex;
  uint32_t node;
  uint32_t localRank;   ///< index inside its node
  uint32_t switchGroup; ///< global index of its PCIe switch / NVLink domain
  uint32_t rack;
};

/// A cluster: built by the loader (TopologyLoader.h) or by hand (tests):
/// add vertices, devices and links, then finalize() computes the routes.
class Topology {
public:
  Topology() = default;

  // --- building ------------------------------------------------------------
  void setName(std::string name) { name_ = std::move(name); }
  void setDescription(std::string d) { description_ = std::move(d); }
  void setDeviceSpec(const DeviceSpec &spec) { spec_ = spec; }
  /// A short description of the intra-node fabric ("nvswitch", "pcie tree").
  void setIntraKind(std::string kind) { intraKind_ = std::move(kind); }
  void setNccl(const NcclCalibration &c) { nccl_ = c; }
  VertexId addVertex(VertexKind kind, std::string name, int32_t node,
                     int32_t rack);
  /// Makes vertex `v` (of kind Device) the next device; ids are dense, in
  /// the order devices are added.
  DeviceId addDevice(VertexId v, uint32_t node, uint32_t localRank,
                     uint32_t switchGroup, uint32_t rack);
  /// Names switch group `g` (for printing): "n0.nvswitch", "n0.board1".
  void setSwitchGroupName(uint32_t g, std::string name);
  /// Adds a full-duplex link; returns the id of the a-to-b direction (the
  /// b-to-a direction is that id + 1).
  LinkId addLink(VertexId a, VertexId b, LinkClass cls,
                 double bandwidthBytesPerSec, Seconds latency);
  /// Computes every route. Fails (naming the pair) when some device cannot
  /// reach another.
  llvm::Error finalize();

  // --- queries ---------------------------------------------------------------
  const std::string &name() const { return name_; }
  const std::string &description() const { return description_; }
  const std::string &intraKind() const { return intraKind_; }
  const NcclCalibration &nccl() const { return nccl_; }
  const DeviceSpec &deviceSpec() const { return spec_; }

  size_t numDevices() const { return devices_.size(); }
  size_t numNodes() const { return numNodes_; }
  /// Devices per node (all of them when there is no node level).
  size_t devicesPerNode() const {
    return numDevices() / std::max<size_t>(1, numNodes_);
  }
  size_t numRacks() const { return numRacks_; }
  size_t numSwitchGroups() const { return switchGroupNames_.size(); }
  llvm::ArrayRef<DeviceInfo> devices() const { return devices_; }
  const DeviceInfo &device(DeviceId d) const { return devices_[d]; }
  const std::string &deviceName(DeviceId d) const {
    return vertices_[devices_[d].vertex].name;
  }
  const std::string &switchGroupName(uint32_t g) const {
    return switchGroupNames_[g];
  }
  llvm::ArrayRef<Vertex> vertices() const { return vertices_; }
  /// Directed links, indexed by LinkId.
  llvm::ArrayRef<Link> links() const { return links_; }
  const Link &link(LinkId l) const { return links_[l]; }

  /// The directed links a transfer from `a` to `b` crosses, in order: the
  /// least-time path for a 1 MiB message (latency + size / bandwidth, summed
  /// in integer picoseconds), ties broken by fewer hops, then by lower
  /// vertex and link ids. Routes never pass through a third GPU, stay
  /// inside the node for devices of one node, and cross the network at most
  /// once. Empty for a == b.
  const std::vector<LinkId> &route(DeviceId a, DeviceId b) const {
    return routes_[size_t(a) * devices_.size() + b];
  }
  /// Least bandwidth over route(a, b), bytes/s; +inf for a == b.
  double pathBandwidth(DeviceId a, DeviceId b) const {
    return pathBandwidth_[size_t(a) * devices_.size() + b];
  }
  /// Whether directed link `l` can never be a bottleneck: going up the
  /// hierarchy (GPU, node switch, NIC, rack switch, spine) it carries at
  /// least what the lower-level links into its tail can bring together;
  /// going down, what the lower-level links out of its head can take (a
  /// non-blocking rack uplink of a fat tree: every NIC of the rack at full
  /// rate). Every transfer through it also crosses the links that bound
  /// it, so the simulator does not make transfers wait for one another on
  /// it. Links of a GPU never qualify.
  bool nonBlocking(LinkId l) const { return nonBlocking_[l] != 0; }
  /// Sum of link latencies over route(a, b); 0 for a == b.
  Seconds pathLatency(DeviceId a, DeviceId b) const {
    return pathLatency_[size_t(a) * devices_.size() + b];
  }

  /// The lowest level whose group holds both devices.
  Level levelOf(DeviceId a, DeviceId b) const;
  /// The index of `d`'s group at `level` (Cluster: 0).
  uint32_t groupOf(DeviceId d, Level level) const;
  /// The device groups at `level`, ordered by group index, members
  /// ascending.
  std::vector<std::vector<DeviceId>> groupsAt(Level level) const;

  /// Groups of devices a strategy treating every group alike may be
  /// simulated on one of (Sim/Fold.h). The devices split into
  /// periods of `period` devices, each period into `period / block` blocks
  /// of whole nodes; group j is the j-th block of every period, and group
  /// j's devices are group 0's moved j blocks on within their period. Valid
  /// when the routes among group j's devices are group 0's moved (link for
  /// link, the same class, bandwidth, latency and contention), and no
  /// contended link is on the routes of two groups.
  struct FoldBlock {
    uint32_t block = 0, period = 0;
    /// Per directed link: the group whose routes use it, if contended (-1:
    /// none, or not contended), and the group-0 link it moves from.
    std::vector<int32_t> linkGroup;
    std::vector<LinkId> linkInFirst;
  };
  /// The (block, period) pairs to try, most groups first: blocks of whole
  /// nodes, block < period, both dividing the devices.
  std::vector<std::pair<uint32_t, uint32_t>> foldCandidates() const;
  /// The FoldBlock of (block, period) when it is valid, else null; checked
  /// once per pair (thread-safe) and kept while the topology lives.
  const FoldBlock *foldBlock(uint32_t block, uint32_t period) const;

private:
  std::string name_, description_, intraKind_;
  NcclCalibration nccl_;
  DeviceSpec spec_{};
  std::vector<Vertex> vertices_;
  std::vector<Link> links_;
  std::vector<std::vector<LinkId>> outLinks_; ///< per vertex
  std::vector<uint8_t> nonBlocking_;          ///< per directed link
  std::vector<DeviceInfo> devices_;
  std::vector<std::string> switchGroupNames_;
  size_t numNodes_ = 0, numRacks_ = 0;
  std::vector<std::vector<LinkId>> routes_; ///< n x n, row-major
  std::vector<double> pathBandwidth_;
  std::vector<Seconds> pathLatency_;
  struct FoldCache;
  /// Shared by copies (a finalized topology does not change).
  std::shared_ptr<FoldCache> foldCache_;
  std::unique_ptr<FoldBlock> checkFold(uint32_t block, uint32_t period) const;
  void resetFoldCache();
};

} // namespace soap

#endif // SOAP_MACHINE_TOPOLOGY_H
