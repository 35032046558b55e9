// What the subcommands share: options checked, the cluster, its cost
// database, the model at the cluster's batch and the cost and collective
// models over them; plans read and written with the inputs they record.
#ifndef SOAP_DRIVER_SESSION_H
#define SOAP_DRIVER_SESSION_H

#include "soap/Cost/CostDatabase.h"
#include "soap/Driver/Options.h"
#include "soap/Plan/Plan.h"
#include "soap/Search/Driver.h"
#include "soap/Search/Searcher.h"
#include <memory>
#include <optional>

namespace soap {

/// FlexFlow's default: 64 samples per device.
constexpr int64_t kSamplesPerDevice = 64;

/// The batch: --batch, else 64 per device.
int64_t effectiveBatch(const DriverOptions &o, int64_t devices);

/// A bundled cluster or cost database by name, as the README calls them:
/// "p100-4x4" is this source tree's examples/topologies/p100-4x4.json and
/// "h100-sxm" its profiles/h100-sxm.json, when no file of that name exists.
/// Anything else is returned as given.
std::string resolveTopologyPath(const std::string &given);
std::string resolveProfilePath(const std::string &given);
/// The topology of --topology (a path or a bundled name).
llvm::Expected<Topology> loadTopologyArg(const std::string &given);

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

/// What a summary assumed besides the plan: "fp32, optimizer sgd, batch
/// 1024 (64 samples per device)".
std::string assumptions(const Session &s);

struct Layout;
/// Warns (stderr) when `l` leaves devices idle, naming them and why.
void warnIdle(const Session &s, const Layout &l);

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

/// Writes `strategy` as a plan recording how it was found (`outcome`, when
/// a search found it: whether Ctrl-C or --timeout stopped it, and then
/// what it ran); prints "plan: PATH" unless PATH is "-", on `pathTo` when
/// given.
llvm::Error writeSearchPlan(const Session &s, const Strategy &strategy,
                            const SimMetrics &m, Seconds dpTime,
                            const std::string &searcher, uint64_t seed,
                            const std::string &path,
                            const SearchOutcome *outcome = nullptr,
                            llvm::raw_ostream *pathTo = nullptr);

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
