// What one op's configuration costs, op by op, without simulating: the
// busy time it puts on each device by phase, and the shortest time any of
// its dependency chains needs. Exhaustive search bounds with it; the
// balanced strategy picks with it.
#ifndef SOAP_LIB_SEARCH_CONFIGCOST_H
#define SOAP_LIB_SEARCH_CONFIGCOST_H

#include "soap/Search/Searcher.h"
#include <array>
#include <utility>
#include <vector>

namespace soap {

/// The phases of an op's work on a device, in dependency order.
enum Phase { Fwd, Bwd, Upd, NumPhases };
using PhaseLoad = std::array<Seconds, NumPhases>;

struct ConfigCost {
  /// Busy time per device it uses, by phase: forward tiles, backward
  /// tiles, optimizer steps of the weights only this op reads (one per
  /// distinct shard per device).
  std::vector<std::pair<DeviceId, PhaseLoad>> load;
  PhaseLoad work{};  ///< load summed over devices, by phase
  Seconds fwd = 0;   ///< the quickest tile's forward
  /// The quickest tile's backward: its backward-data kernel where the op
  /// has weights (TaskKind::WeightGrad: what the chains pass through).
  Seconds bwd = 0;
  Seconds sync = 0;  ///< the quickest weight-gradient all-reduce (or 0)
  /// After the backward: the slowest shard group's all-reduce plus its
  /// optimizer step (0 without weights of its own).
  Seconds tail = 0;

  Seconds total() const { return work[Fwd] + work[Bwd] + work[Upd]; }
  Seconds busiest() const;
};

llvm::Expected<ConfigCost> configCost(const SearchProblem &p, const Op &op,
                                      const OpConfig &c);

} // namespace soap

#endif // SOAP_LIB_SEARCH_CONFIGCOST_H
