// mcmc's structural proposals: moves that change more than one
// op's configuration at once, so the chain simulates them in full rather
// than by delta. Pipeline moves (a stage boundary, the micro-batch count,
// the device count of a stage). Free functions of the current strategy and an Rng, so
// tests can call them and the chain stays deterministic.
#ifndef SOAP_SEARCH_MCMCMOVES_H
#define SOAP_SEARCH_MCMCMOVES_H

#include "soap/IR/Graph.h"
#include "soap/Parallel/ConfigSpace.h"
#include "soap/Parallel/Strategy.h"
#include "soap/Support/Rng.h"
#include <optional>
#include <utility>
#include <vector>

namespace soap {

/// A contiguous range of devices [first, second].
using DeviceRange = std::pair<DeviceId, DeviceId>;

/// Each stage's device range among `numDevices` (its device group's, shared
/// by the group's model chunks when interleaved): from the lowest to the
/// highest device its ops use, extended up to the next stage's first device
/// (the first stage's down to device 0, the last stage's up to the last
/// device), so that no device is left to no stage. A stage whose ops use
/// fewer devices than its range (a device move gave it 7 where its ops split
/// into 4) keeps the rest for later moves instead of losing them.
std::vector<DeviceRange> stageDeviceRanges(const Strategy &s,
                                           size_t numDevices);

/// Moves `c` (placed by the space on devices from 0) into `range`, keeping
/// its offset within a range-sized window; false when it has more devices
/// than the range.
bool placeInRange(DeviceRange range, OpConfig &c);

/// A stage boundary moved by one op (the op's configuration moved to the
/// other stage's devices), or m doubled or halved; with more than one
/// stage, one time in four each the device count of two neighbouring
/// stages instead (moveStageDevices; not with several model chunks per
/// device group) or the schedule switched between 1F1B and zb-h1 (one
/// chunk per group). nullopt when the draw gives nothing valid.
std::optional<Strategy> pipelineMove(const Strategy &cur, const Graph &g,
                                     const ConfigSpace &space,
                                     const std::vector<DeviceRange> &ranges,
                                     Rng &rng);

/// Devices moved from one stage to its neighbour: stages b and b + 1 keep
/// their combined range, cut at another device (one device moved, half of
/// the giver's, or as many as the receiver has, drawn). The ops of both
/// stages are re-mapped to their stage's new range by resizeConfig.
/// nullopt when an op has no valid configuration in its new range.
std::optional<Strategy> moveStageDevices(const Strategy &cur, const Graph &g,
                                         const ConfigSpace &space,
                                         const std::vector<DeviceRange> &ranges,
                                         Rng &rng);

/// Op `o`'s configuration `c`, which lives in a stage of range `from`,
/// re-mapped to the range `to`: an op that used more than half the range
/// (all of it, or as much as its shape allowed) scales the
/// degree of one loop (its sample loop first, then its most split one) so
/// that it uses the whole new range, or as much of it as a valid degree
/// allows; an op that used part keeps its shape and offset where it fits
/// (fewer tasks where it does not). Every loop stays dividing its size
/// into `microBatches` x degree parts. nullopt when no shape fits.
std::optional<OpConfig> resizeConfig(const Graph &g, const ConfigSpace &space,
                                     OpId o, const OpConfig &c, DeviceRange from,
                                     DeviceRange to, int32_t microBatches);

} // namespace soap

#endif // SOAP_SEARCH_MCMCMOVES_H
