// Compute replay: every device's compute tasks of a plan, in the order the
// simulator runs them, with the simulator's predicted time of each (profiled
// and analytic cost models), to be run one device after another on one GPU
// and compared with what they measure there; and the report of that
// comparison (per-task relative error, per-device compute, plan order).
#ifndef SOAP_PROFILE_REPLAY_H
#define SOAP_PROFILE_REPLAY_H

#include "soap/Cost/CostDatabase.h"
#include "soap/IR/Graph.h"
#include "soap/Machine/Topology.h"
#include "soap/Support/Json.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/raw_ostream.h"
#include <memory>
#include <string>
#include <vector>

namespace soap {

struct ReplayTask {
  uint32_t device = 0;
  bool backward = false; ///< backward-data + backward-weight, else forward
  /// The kernels it runs: forward; or backward-data and backward-weight,
  /// without backward-data where the op's gradient inputs need no gradient
  /// and the cost model prices none (Op's sem.backwardDataNeeded).
  std::vector<Pass> passes;
  OpId op = 0;
  int64_t tile = 0;
  int32_t replica = 0;
  Box box;
  std::string signature;
  /// The simulator's time with the profiled cost model (analytic where it
  /// lacks the tile): the longer of the kernels' and the host's time.
  Seconds predicted = 0;
  /// The profile's kernel (GPU) time alone, what `measured` measures; the
  /// analytic time where the profile lacks the tile.
  Seconds predictedKernels = 0;
  Seconds analytic = 0;  ///< the roofline alone
  Seconds measured = -1; ///< GPU time, held (GpuSession); -1 until measured
};

struct ReplayPlan {
  std::string path, model, topology;
  int64_t batch = 0;
  size_t devices = 0;
  std::unique_ptr<Graph> graph;
  std::unique_ptr<Topology> topo;
  /// Grouped by device (ascending), each device's in simulated start order.
  std::vector<ReplayTask> tasks;
  /// Per device, its whole task sequence run back to back, not held (the
  /// host's launch gaps included); -1 where not measured.
  std::vector<Seconds> sequence;
};

/// Loads a plan with its model (imported as the plan says) and topology
/// (`topologyOverride` when not empty), simulates it with a cost model over
/// `db` (may be null) and collects its compute tasks. Errors (exit code 2)
/// name the plan.
llvm::Expected<ReplayPlan> loadReplayPlan(const std::string &planPath,
                                          const std::string &topologyOverride,
                                          const CostDatabase *db);

/// The comparison: per plan and device the predicted compute against the
/// device's tasks run back to back (`sequence`), and the profile's kernel
/// times against the kernels measured one by one; over all measured tasks
/// the median and worst relative error of both cost models' kernel times;
/// and whether the plans' compute (the busiest device's) is ordered alike
/// by prediction and measurement (Kendall's tau, agreeing pairs).
Json replayReport(const std::vector<ReplayPlan> &plans,
                  const ProfileEnvironment &env, bool withTasks);
void printReplayReport(const Json &report, llvm::raw_ostream &os);

} // namespace soap

#endif // SOAP_PROFILE_REPLAY_H
