// Helpers shared by the task graph's construction (TaskGraph.cpp) and its
// communication (TaskGraphComm.cpp); private to lib/Sim.
#ifndef SOAP_LIB_SIM_TASKGRAPHDETAIL_H
#define SOAP_LIB_SIM_TASKGRAPHDETAIL_H

#include "soap/Sim/TaskGraph.h"

#include <vector>

namespace soap::detail {

/// Converts a box in a view of a tensor (an exact re-factoring of its dims)
/// to the tensor's coordinates.
Box viewToTensor(const Box &b, const std::vector<int64_t> &view,
                 const std::vector<int64_t> &tensor);

/// The region of input `input` that `tile` reads, in the tensor's own
/// coordinates.
Box regionIn(const OpSemantics &sem, int input, const Box &tile,
             const std::vector<int64_t> &tensorShape);

TaskKey key(TaskKind kind, uint32_t a, uint32_t b, uint64_t c);

/// Groups the tiles of `c` that agree on every loop except those in `free`
/// (tiles whose results must be combined): group index per tile.
std::vector<int64_t> groupTiles(const OpConfig &c,
                                const std::vector<bool> &free,
                                int64_t &numGroups);

/// The distinct devices, ascending, that run any replica of `tiles`.
std::vector<DeviceId> devicesOf(const OpConfig &c,
                                const std::vector<int64_t> &tiles);

} // namespace soap::detail

#endif
