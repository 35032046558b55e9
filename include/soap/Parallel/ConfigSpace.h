// The space of parallel configurations of each op (FlexFlow section 4, "The
// SOAP search space"): the split shapes an op allows and the device lists a
// shape can run on. Searchers enumerate it (exhaustive search) or draw from
// it (FlexFlow's MCMC proposals, section 6.2).
#ifndef SOAP_PARALLEL_CONFIGSPACE_H
#define SOAP_PARALLEL_CONFIGSPACE_H

#include "soap/IR/Graph.h"
#include "soap/Machine/Topology.h"
#include "soap/Parallel/Strategy.h"
#include "soap/Support/Rng.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

namespace soap {

/// Which configurations are in the space (`--space flexflow|full`).
enum class SpaceKind : uint8_t {
  /// FlexFlow's: only dims of the output are split (no partial sums), one
  /// copy of every tile.
  FlexFlow,
  /// Also Reduction splits (partial sums) and replicated tiles (TensorOpt).
  Full,
};
llvm::StringRef spaceKindName(SpaceKind k);
std::optional<SpaceKind> parseSpaceKind(llvm::StringRef name);

struct SpaceOptions {
  SpaceKind kind = SpaceKind::FlexFlow;
  /// Let a configuration's devices start at any device, not only at a
  /// multiple of its task count (FlexFlow places tasks anywhere).
  bool arbitraryOffsets = true;
  /// Most copies of a tile in the Full space.
  int32_t maxReplicas = 4;
  /// Errors unless maxReplicas >= 1.
  llvm::Error validate() const;
};

/// Which loops of an op a space may split (one flag per loop). FlexFlow
/// space: splittable loops that are dims of every output, plus Sample loops
/// and statistics loops (statReduced) that an output reduces, which the
/// semantics complete with a small all-reduce rather than a partial sum
/// (the loss's sample and class axes, BatchNorm's spatial dims). Full
/// space: every splittable loop.
std::vector<bool> splittableLoops(const OpSemantics &sem, SpaceKind kind);

/// A split shape: one degree per loop of the op, and the replica count.
using SplitShape = std::pair<std::vector<int32_t>, int32_t>;

/// The configurations of every op of a graph on a topology. Immutable after
/// construction, so one instance may be shared by threads.
class ConfigSpace {
public:
  ConfigSpace(const Graph &g, const Topology &topo, SpaceOptions opts);

  const SpaceOptions &options() const { return opts_; }
  size_t numDevices() const { return numDevices_; }

  /// The split shapes of op `o`: splittable loops get degrees d > 1 with
  /// size % d == 0 and (size / d) % granule == 0, and numTiles * replicas <=
  /// numDevices. FlexFlow space: no loop whose split makes an output a
  /// partial sum (a Reduction loop, or a loop some output does not index,
  /// except Sample and statistics loops such as the loss's), replicas 1.
  /// Full space: every splittable loop, replicas 1..maxReplicas. Ordered
  /// lexicographically by degree vector, then replicas; never empty (the
  /// unsplit shape is always there).
  const std::vector<SplitShape> &shapes(OpId o) const { return shapes_[o]; }

  /// The device lists for `tasks` devices (1 <= tasks <= numDevices): first
  /// the aligned blocks [b*tasks, (b+1)*tasks), which follow the switch and
  /// node groups because device ids are node-major; then, with
  /// arbitraryOffsets, every other contiguous run [s, s+tasks), ascending.
  /// Aligned blocks come first so that ties in exhaustive search favour them.
  std::vector<std::vector<DeviceId>> placements(int64_t tasks) const;

  /// Every configuration of `o` (shapes x placements), in shape order, then
  /// placement order.
  std::vector<OpConfig> enumerate(OpId o) const;
  /// enumerate(o).size(), without building it.
  uint64_t size(OpId o) const { return sizes_[o]; }

  /// A random configuration: a shape uniformly among shapes(o), then a
  /// placement uniformly among placements(tasks). Draws only from `rng`.
  OpConfig sample(OpId o, Rng &rng) const;
  /// Whether `c` is one of enumerate(o).
  bool contains(OpId o, const OpConfig &c) const;

private:
  void buildShapes(OpId o, const OpSemantics &sem);
  /// The first devices of placements(tasks), cached for the task counts
  /// of shapes(); `scratch` holds them for any other count.
  const std::vector<DeviceId> &startsFor(int64_t tasks,
                                         std::vector<DeviceId> &scratch) const;
  static std::vector<DeviceId> computeStarts(size_t numDevices, int64_t tasks,
                                             bool arbitraryOffsets);

  SpaceOptions opts_;
  size_t numDevices_;
  int32_t maxReplicas_;                         ///< 1 in the FlexFlow space
  std::vector<std::vector<SplitShape>> shapes_; ///< per op
  std::vector<uint64_t> sizes_;                 ///< per op
  /// Placement starts per task count (index = tasks); filled in the
  /// constructor for every task count some shape needs.
  std::vector<std::vector<DeviceId>> starts_;
};

} // namespace soap

#endif // SOAP_PARALLEL_CONFIGSPACE_H
