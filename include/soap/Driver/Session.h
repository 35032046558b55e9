// What the subcommands share: options checked, the cluster, its cost
// database, the model at the cluster's batch and the cost and collective
// models over them; plans read and written with the inputs they record.
#ifndef SOAP_DRIVER_SESSION_H
#define SOAP_DRIVER_SESSION_H

#include "soap/Cost/CostDatabase.h"
#include "soap/Driver/Options.h"
#include "soap/Plan/Plan.h"
#include "soap/Search/Searcher.h"
#include <memory>
#include <optional>

namespace soap {

/// FlexFlow's default: 64 samples per device.
constexpr int64_t kSamplesPerDevice = 64;

/// The batch: --batch, else 64 per device.
int64_t effectiveBatch(const DriverOptions &o, int64_t devices);

/// The model imported as the options say (batch, loss, unrolled LSTMs).
llvm::Expected<std::unique_ptr<Graph>> loadModel(const DriverOptions &o,
                                                 int64_t devices);

struct Session {
  DriverOptions options;
  CostMode mode = CostMode::Profile;
  Optimizer optimizer = Optimizer::Sgd;
  std::unique_ptr<Topology> topo;
  std::optional<CostDatabase> db;
  std::unique_ptr<Graph> graph;
  int64_t batch = 0;
  std::unique_ptr<CostModel> cost;
  std::unique_ptr<CollectiveModel> collectives;

  /// Checks the options and loads the topology, profile and model.
  static llvm::Expected<std::unique_ptr<Session>> open(const DriverOptions &o);
  SearchProblem problem() const {
    return SearchProblem{*graph, *topo, *cost, *collectives, optimizer};
  }
};

/// Fills what the user did not give from what `plan` records: how the
/// model was imported and costed, and (when `paths`) the model and topology.
void adoptPlanInputs(DriverOptions &o, const Plan &plan, bool paths);

/// The options of a search: budget, seed, space, chains, threads, beta,
/// --timeout; `progress` adds a progress line on stderr when it is a
/// terminal and -q was not given.
llvm::Expected<SearchOptions> searchOptions(const DriverOptions &o,
                                            bool progress);

/// Refuses, before any work, an output path that cannot be written: its
/// folder missing or not writable, or the path a folder. `flag` names it.
llvm::Error checkOutputPath(llvm::StringRef flag, llvm::StringRef path);

/// The SHA-256s of the model and topology files a plan records.
struct InputDigests {
  std::string model, topology;
};
llvm::Expected<InputDigests> inputDigests(const DriverOptions &o);

/// Writes `strategy` as a plan recording how it was found (`interrupted`:
/// the best so far of a search Ctrl-C stopped); prints "plan: PATH" unless
/// PATH is "-".
llvm::Error writeSearchPlan(const Session &s, const Strategy &strategy,
                            const SimMetrics &m, Seconds dpTime,
                            const std::string &searcher, uint64_t seed,
                            const std::string &path, bool interrupted = false);

/// A plan and the session of its recorded inputs (flags given win), with
/// its strategy on that model: a plan whose model file differs from the
/// one it was made for (SHA-256) is refused (exit 2, see `soapc check`).
struct PlanSession {
  Plan plan;
  std::unique_ptr<Session> session;
  Strategy strategy;
};
llvm::Expected<PlanSession> openPlan(const DriverOptions &o,
                                     llvm::StringRef planPath);

} // namespace soap

#endif // SOAP_DRIVER_SESSION_H
