// Timing one op tile with the CPU kernels soap-run runs: what
// soap-profile --backend cpu writes into a cost database, so that the
// simulator's kernel times are the executor's own.
#ifndef SOAP_EXEC_TILETIMING_H
#define SOAP_EXEC_TILETIMING_H

#include "soap/IR/Graph.h"
#include "soap/Machine/Units.h"
#include "llvm/Support/Error.h"
#include <functional>
#include <string>

namespace soap {

struct TileTimingOptions {
  int warmup = 2;
  int repeats = 5;
  uint64_t seed = 0;
  /// Called before every run, warm-up included (soap-profile passes an MPI
  /// barrier, so that every rank times the same tile at the same moment and
  /// they share memory bandwidth as soap-run's ranks do).
  std::function<void()> beforeRun;
};

/// Medians over the repeats of one tile's forward and backward as soap-run
/// runs them on this rank (its CPU kernel threads, see prepareBackend):
/// the forward allocates and zeroes its outputs and runs the kernel; the
/// backward allocates its input gradients (a weight's accumulator is lent,
/// as soap-run lends it, except to Conv), re-runs the forward of the
/// element-wise ops soap-run re-runs, and runs the backward kernel. A
/// reshape whose tile soap-run passes through as the same buffer costs 0.
struct TileTimes {
  Seconds forward = 0, backward = 0;
  int repeats = 0;
};

/// Errors (exit code 2) when soap-run has no CPU kernel for the op.
llvm::Expected<TileTimes> timeTileOnCpu(const Graph &g, const Op &op,
                                        const Box &tile,
                                        const TileTimingOptions &opts);

/// The CPU kernels' and MPI's library versions, e.g. "oneDNN 3.0.0 (OpenMP),
/// Open MPI v4.1.4".
std::string cpuLibraryVersions();

} // namespace soap

#endif // SOAP_EXEC_TILETIMING_H
