// A plan's op configurations as DTensor placements on one DeviceMesh per
// pipeline device group: the mesh shape that expresses the most ops
// exactly, each op's loops mapped onto mesh dimensions (Shard, Replicate,
// Partial per operand), and, where DTensor has no sharding rule for a split
// or the configuration is no product of mesh dimensions, the nearest layout
// it has and why.
#ifndef SOAP_EMIT_DTENSORLAYOUT_H
#define SOAP_EMIT_DTENSORLAYOUT_H

#include "soap/Emit/Emit.h"
#include <string>
#include <vector>

namespace soap {

/// One placement per mesh dimension: "S<d>" (Shard(d)), "R" (Replicate) or
/// "P" (Partial: a sum).
using Placements = std::vector<std::string>;

struct OpPlacement {
  /// Per mesh dimension, the loop it splits, or -1 (the op replicated).
  std::vector<int> loopOfDim;
  std::vector<Placements> inputs;  ///< per input (empty for an absent one)
  std::vector<Placements> outputs; ///< per output
  /// Empty when the op runs as the plan has it; else why it does not (one
  /// line: what DTensor lacks and the layout used instead).
  std::string fallback;
};

struct DTensorLayout {
  std::vector<int64_t> mesh; ///< the mesh shape, the same for every group
  /// The devices (ranks) of each pipeline device group, in mesh order.
  std::vector<std::vector<DeviceId>> groups;
  std::vector<OpPlacement> ops; ///< per op of the graph
};

/// The layout of `c`'s plan; an input error where the pipeline's device
/// groups differ in size.
llvm::Expected<DTensorLayout> dtensorLayout(const EmitContext &c);

/// "Shard(1), Replicate()".
std::string placementsStr(const Placements &p);

} // namespace soap

#endif // SOAP_EMIT_DTENSORLAYOUT_H
