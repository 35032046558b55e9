// soap-profile's runs on the GPU: measuring the signatures a profile lacks,
// and replaying plans' compute tasks device by device.
#ifndef SOAP_PROFILE_GPURUNS_H
#define SOAP_PROFILE_GPURUNS_H

#include "GpuSession.h"
#include "Replay.h"
#include "SignatureSet.h"
#include <map>
#include <string>

namespace soap {

struct MeasureRunOptions {
  double timeLimitSeconds = 0; ///< 0: no limit
  bool remeasure = false;      ///< measure signatures `db` already has
  std::string output;          ///< where `db` is saved (every 30 s, at the end)
};

struct MeasureRunSummary {
  size_t measured = 0, have = 0, skipped = 0, failed = 0;
  std::map<std::string, size_t> methods; ///< "Conv by cudnn" -> count
};

/// Calibrates (copy bandwidth, GEMM rates) and measures the signatures of
/// `set` that `db` lacks into it, most-used first, until the time limit; a
/// signature that fails is a warning on stderr. Saves `db` to the output.
llvm::Expected<MeasureRunSummary> measureSignatures(GpuSession &s,
                                                    const SignatureSet &set,
                                                    CostDatabase &db,
                                                    const MeasureRunOptions &o);

/// Runs each plan's compute tasks on this GPU, one device after another in
/// simulated order: the device's kernels are built, its sequence run
/// warm-up + repeats times, each task timed with events (median); where the
/// device's tiles do not fit at once, one task at a time. Fills `measured`.
llvm::Error replayOnGpu(GpuSession &s, std::vector<ReplayPlan> &plans);

} // namespace soap

#endif // SOAP_PROFILE_GPURUNS_H
