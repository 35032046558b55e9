// soap-profile --backend cpu: the cost database of this host as
// soap-run uses it. Every MPI rank (one per device of a CPU topology) times
// the same op tiles at once with soap-run's own CPU kernels and thread
// count, so they share the cores' memory bandwidth as soap-run's ranks do;
// then the ranks time MPI's collectives and point-to-point messages (the
// ones soap-run calls). Rank 0 writes the database.
#ifndef SOAP_PROFILE_CPURUNS_H
#define SOAP_PROFILE_CPURUNS_H

#include "SignatureSet.h"
#include "soap/Cost/CostDatabase.h"
#include "soap/Exec/Comm.h"
#include <map>
#include <string>

namespace soap {

struct CpuMeasureOptions {
  int warmup = 2;
  int repeats = 5;
  double timeLimitSeconds = 0; ///< 0: no limit
  bool remeasure = false;
  /// Largest message of the collective curves, in bytes (sizes 4 .. this,
  /// doubling); 0: no collectives.
  int64_t maxCollectiveBytes = int64_t(64) << 20;
  std::string output;
};

struct CpuMeasureSummary {
  size_t measured = 0, have = 0, skipped = 0, failed = 0;
  std::map<std::string, size_t> kinds; ///< measured per op kind
  /// Point-to-point between two ranks, fitted as latency + bytes/bandwidth
  /// from the send-recv curve (what a CPU topology's links should say).
  double p2pLatencySeconds = 0, p2pBytesPerSec = 0;
};

/// Measures the signatures of `set` that `db` lacks (most-used first, until
/// the time limit), the host's copy bandwidth and, on two ranks or more,
/// the collective curves. Every rank calls it with the same arguments;
/// rank 0 saves `db` to o.output (every 30 s and at the end).
llvm::Expected<CpuMeasureSummary> measureOnCpu(Comm &comm,
                                               const SignatureSet &set,
                                               CostDatabase &db,
                                               const CpuMeasureOptions &o);

/// The processor's name from /proc/cpuinfo ("model name"), or "unknown".
std::string cpuModelName();

} // namespace soap

#endif // SOAP_PROFILE_CPURUNS_H
