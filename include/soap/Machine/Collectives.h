// The collective cost model: time of all-reduce, all-gather, reduce-scatter,
// broadcast and send/recv on a device group. Measured curves where a profile
// has one for the group's shape; otherwise ring and tree alpha-beta models
// over the group's slowest (contended) link, and a hierarchical scheme across
// nodes; the fastest applicable algorithm is chosen and named. A topology
// with an NCCL calibration (Topology::nccl) is priced as NCCL runs:
// pipelined steps, one ring per GPU across nodes, NVLink SHARP.
#ifndef SOAP_MACHINE_COLLECTIVES_H
#define SOAP_MACHINE_COLLECTIVES_H

#include "soap/Machine/CollectiveProfile.h"
#include "soap/Machine/Topology.h"
#include <memory>
#include <optional>
#include <vector>

namespace soap {

enum class CollectiveAlgorithm : uint8_t {
  Local,        ///< nothing to move: one device or zero bytes
  PointToPoint, ///< send/recv over the route
  Ring,         ///< ring (broadcast: pipelined chain)
  Tree,         ///< all-reduce: double-binary-tree style; broadcast: binomial
  Hierarchical, ///< inside nodes, then across nodes, then inside nodes
  Measured,     ///< interpolated from a CollectiveProfile
  Switch,       ///< all-reduce reduced inside the NVSwitch (NVLink SHARP)
};
constexpr int kNumCollectiveAlgorithms = 7;
llvm::StringRef algorithmName(CollectiveAlgorithm a);

struct CollectiveEstimate {
  Seconds time = 0;
  CollectiveAlgorithm algorithm = CollectiveAlgorithm::Local;
};

/// Latency term (per step) and bandwidth term of an alpha-beta model.
/// `alpha` is the largest hop latency; `meanAlpha` the mean over a ring's
/// hops (the largest such mean over concurrent rings), what a pipeline
/// pays per step on average.
struct AlphaBeta {
  Seconds alpha = 0;
  double bandwidthBytesPerSec = 0;
  Seconds meanAlpha = 0;
};

/// The shape of `group`: its node count and, when every node holds the same
/// number of its devices, that number (else devicesPerNode = 0).
GroupShape groupShape(const Topology &topo, const std::vector<DeviceId> &group);

/// Sizes: all-reduce and broadcast move a buffer of `size` bytes on every
/// device; all-gather's result and reduce-scatter's input are `size` bytes
/// (each device holds size / n of it); send/recv sends `size` bytes from
/// group[0] to group[1]. Broadcast's root is group[0]. Groups hold distinct
/// devices of the topology.
class CollectiveModel {
public:
  /// `topo` and `profile` (optional) must outlive the model.
  explicit CollectiveModel(const Topology &topo,
                           const CollectiveProfile *profile = nullptr);
  CollectiveModel(CollectiveModel &&);
  ~CollectiveModel();

  /// The fastest applicable algorithm and its time. A measured curve, when
  /// the profile has one for (kind, group shape), wins over the models.
  /// Answers are kept and given again for the same arguments (safe from
  /// several threads).
  CollectiveEstimate estimate(Collective kind,
                              const std::vector<DeviceId> &group,
                              Bytes size) const;
  Seconds time(Collective kind, const std::vector<DeviceId> &group,
               Bytes size) const {
    return estimate(kind, group, size).time;
  }
  /// One algorithm's time; nullopt where it does not apply (a tree for
  /// all-gather, hierarchical inside one node, measured without a curve).
  std::optional<Seconds> algorithmTime(CollectiveAlgorithm algo,
                                       Collective kind,
                                       const std::vector<DeviceId> &group,
                                       Bytes size) const;

  /// The ring a group uses: node by node, and inside a node in the order of
  /// that node's best ring (the cycle whose slowest hop is fastest).
  std::vector<DeviceId> ringOrder(const std::vector<DeviceId> &group) const;
  /// Alpha-beta of concurrent rings: alpha is the largest hop latency, the
  /// bandwidth the least over hops of link bandwidth divided by the number
  /// of hops (of all the rings) that cross the link.
  AlphaBeta
  ringParameters(const std::vector<std::vector<DeviceId>> &orderedRings) const;

private:
  CollectiveEstimate compute(Collective kind,
                             const std::vector<DeviceId> &group,
                             Bytes size) const;
  AlphaBeta
  edgeParameters(const std::vector<std::pair<DeviceId, DeviceId>> &edges) const;
  /// The latency of one step from `a` to `b`: the route's link latencies,
  /// or the calibration's step latencies where it has them.
  Seconds hopLatency(DeviceId a, DeviceId b) const;
  /// `steps` steps moving `data` bytes at `bw`: alpha-beta, or NCCL's
  /// pipelined form when the topology is calibrated.
  Seconds stepsTime(double steps, Seconds alpha, double data,
                    double bw) const;
  /// NCCL's rings across nodes: one per device of a node, each leaving a
  /// node from a different device (so through a different NIC rail).
  std::vector<std::vector<DeviceId>>
  railRings(const std::vector<DeviceId> &group) const;
  std::optional<Seconds> nvls(Collective kind,
                              const std::vector<DeviceId> &group,
                              double size) const;
  std::optional<Seconds> flat(CollectiveAlgorithm algo, Collective kind,
                              const std::vector<std::vector<DeviceId>> &groups,
                              double size) const;
  std::optional<Seconds> hierarchical(Collective kind,
                                      const std::vector<DeviceId> &group,
                                      double size) const;
  void computeNodeRings();

  const Topology &topo_;
  const CollectiveProfile *profile_;
  std::vector<uint32_t> ringPos_; ///< per device: position in its node's ring
  /// estimate()'s answers: a pure function of its arguments, asked again
  /// for the same group and size each time a searcher rebuilds a task graph
  /// (on 1,024 GPUs each answer walks every route of the group).
  struct Memo;
  std::unique_ptr<Memo> memo_;
};

} // namespace soap

#endif // SOAP_MACHINE_COLLECTIVES_H
