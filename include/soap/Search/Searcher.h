// The Searcher interface and registry (STYLE.md rule 3): every searcher
// returns a Strategy for a problem, scored by the one simulator, so
// searchers are compared on the same work.
#ifndef SOAP_SEARCH_SEARCHER_H
#define SOAP_SEARCH_SEARCHER_H

#include "soap/Parallel/ConfigSpace.h"
#include "soap/Sim/Simulator.h"
#include "soap/Support/Interrupt.h"
#include "llvm/Support/Error.h"
#include <chrono>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>

namespace soap {

/// What a search is about; all must outlive the search.
struct SearchProblem {
  const Graph &graph;
  const Topology &topo;
  const CostModel &cost;
  const CollectiveModel &collectives;
  Optimizer optimizer = Optimizer::Sgd;
  /// taskLimit's value where not 0 (tests give small ones).
  size_t maxTasks = 0;
  /// What one build keeps for the next (AssemblyCache), shared by every
  /// copy of the problem.
  std::shared_ptr<AssemblyCache> assembly = std::make_shared<AssemblyCache>();
  /// Symmetric strategies are simulated folded (Sim/Fold.h): the same
  /// timeline from one group of devices.
  SimContext context() const {
    SimContext c{graph, topo, cost, collectives, optimizer};
    c.fold = true;
    c.assembly = assembly;
    return c;
  }
};

/// A budget: proposals (deterministic: the same seed gives the same plan on
/// any machine) or seconds of search (FlexFlow's; depends on the machine).
struct Budget {
  uint64_t proposals = 0; ///< 0 = not a proposal budget
  double seconds = 0;     ///< 0 = not a time budget
  /// "20000" (proposals) or "30s" / "500ms" / "2m" (time).
  static llvm::Expected<Budget> parse(llvm::StringRef text);
  std::string str() const;
};

/// The steady-clock time `seconds` after `t0` (a deadline).
inline std::chrono::steady_clock::time_point
secondsAfter(std::chrono::steady_clock::time_point t0, double seconds) {
  return t0 + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                  std::chrono::duration<double>(seconds));
}

/// The one "stop now" every search polls: `deadline` passed (max: none),
/// or Ctrl-C or SIGTERM arrived (Support/Interrupt.h), which ends a search
/// as its deadline would (runSearch tells the two apart).
inline bool pastDeadline(std::chrono::steady_clock::time_point deadline) {
  return interruptRequested() ||
         (deadline != std::chrono::steady_clock::time_point::max() &&
          std::chrono::steady_clock::now() >= deadline);
}

struct SearchProgress {
  Seconds best = 0; ///< best feasible iteration time so far
  uint64_t proposals = 0;
  double acceptanceRate = 0;
  double elapsedSeconds = 0;
};

/// Options every searcher reads (XLA auto_sharding_option style: a plain
/// struct with one validate()).
struct SearchOptions {
  uint64_t seed = 0;
  Budget budget{20000, 0};
  SpaceOptions space;
  /// Independent MCMC chains (each from every initial candidate); the best
  /// is kept. Chains, not threads, decide the result: any --threads gives
  /// the same plan.
  int chains = 1;
  int threads = 1;
  /// FlexFlow Eq. 1's beta, per second of iteration time.
  double beta = 0;
  /// mcmc draws each proposal's acceptance threshold before simulating it
  /// and stops the delta simulation once the makespan is certain to pass
  /// it (Simulator::resume's limit); the chain is the same either way. Off
  /// only to measure what it saves (bench-search).
  bool earlyRejection = true;
  std::function<void(const SearchProgress &)> progress;
  /// Wall-clock limit of one search (`--timeout`; 0: none). runSearch turns
  /// it into `deadline`; past it a searcher returns its best strategy so far
  /// with SearchResult::timedOut set, or DeadlineExceeded when it has none.
  double timeoutSeconds = 0;
  std::chrono::steady_clock::time_point deadline =
      std::chrono::steady_clock::time_point::max();
  /// soap::pastDeadline(deadline): what every searcher polls.
  bool pastDeadline() const;
  llvm::Error validate() const;
};

inline bool SearchOptions::pastDeadline() const {
  return soap::pastDeadline(deadline);
}

/// "30s", "500ms", "2m" or a plain number of seconds; `flag` names the
/// option in the message (exit code 2).
llvm::Expected<double> parseDuration(llvm::StringRef text,
                                     llvm::StringRef flag);

/// A searcher stopped at SearchOptions::deadline with nothing to return
/// (runSearch then falls back to the best baseline).
class DeadlineExceeded : public llvm::ErrorInfo<DeadlineExceeded> {
public:
  static char ID;
  explicit DeadlineExceeded(std::string searcher)
      : searcher_(std::move(searcher)) {}
  void log(llvm::raw_ostream &os) const override;
  std::error_code convertToErrorCode() const override;

private:
  std::string searcher_;
};

struct SearchResult {
  Strategy strategy;
  Seconds iterationTime = 0;
  uint64_t proposals = 0;
  uint64_t accepted = 0;
  /// mcmc: proposals rejected before their simulation finished (memory,
  /// or a makespan bound past the acceptance threshold).
  uint64_t rejectedEarly = 0;
  /// Set by exact searchers that completed: no better strategy exists.
  bool provenOptimal = false;
  /// The search stopped at SearchOptions::pastDeadline (its deadline or an
  /// interrupt): the best so far.
  bool timedOut = false;
};

class Searcher {
public:
  virtual ~Searcher();
  /// The best feasible strategy found; an error with exit code 3 when no
  /// feasible strategy was found.
  virtual llvm::Expected<SearchResult> search(const SearchProblem &p,
                                              const SearchOptions &o) = 0;
};

struct SearcherInfo {
  std::string name;
  std::string description;
  std::function<std::unique_ptr<Searcher>()> create;
  /// The searcher stops at a time budget (--budget 30s) itself; for the
  /// others runSearch turns it into a deadline, as --timeout.
  bool readsTimeBudget = false;
};

class SearcherRegistry {
public:
  static SearcherRegistry &instance();
  void add(SearcherInfo info);
  const SearcherInfo *lookup(llvm::StringRef name) const;
  const std::map<std::string, SearcherInfo> &all() const { return infos_; }
  /// "data, expert, mcmc, model" for messages and --help.
  std::string names() const;

private:
  std::map<std::string, SearcherInfo> infos_;
};

/// Registers every searcher; idempotent.
void registerAllSearchers();

/// The balanced strategy: every op split over as many devices as its
/// shapes allow (devices 0, 1, ...), with the shape whose busiest device
/// works least (forward, backward, optimizer steps) plus its weight
/// all-reduce and update. Op by op, without simulating; an MCMC initial
/// candidate and the `balanced` baseline. With `o`, gives up (nullopt) once
/// its deadline passes: on a 13B GPT on 1,024 GPUs the kernel estimates of
/// every op's widest shapes take minutes.
llvm::Expected<std::optional<Strategy>>
balancedStrategy(const SearchProblem &p, const ConfigSpace &space,
                 const SearchOptions *o = nullptr);

/// The most tasks a searcher lets a candidate's task graph have before it
/// skips it (SimContext::maxTasks): about eight times data parallelism's
/// (two compute tasks per op and device), at least 2^20 — room for
/// Megatron-LM's micro-batch of one (GPT-3 175B on 128 GPUs at m = 64:
/// 3.0M tasks, 0.9 GB, after folding). A random or
/// re-partitioning strategy on 1,024 GPUs passes it (every tile of an op
/// talks to every tile of the next) and would not fit in RAM. Never more
/// than kMaxSearchTasks, so that a search stays within a few GB whatever
/// the cluster. SearchProblem::maxTasks where set.
size_t taskLimit(const SearchProblem &p);
/// 12M tasks: a Task is 176 bytes, about 300 with its edges and the
/// simulator's per-task state, so one candidate's graph stays under 4 GB
/// (a searcher holds one at a time; mcmc one per chain).
constexpr size_t kMaxSearchTasks = size_t(12) << 20;

/// Builds and simulates a strategy: (iteration time, fits in memory). With
/// `maxTasks`, a graph past it is TaskGraphTooLarge. With `limit`, the
/// simulation stops as soon as the iteration time is certain to exceed it
/// (Simulator::resume) and the time is +infinity: for a caller that only
/// keeps what beats `limit`.
llvm::Expected<std::pair<Seconds, bool>>
evaluate(const SearchProblem &p, const Strategy &s, size_t maxTasks = 0,
         Seconds limit = std::numeric_limits<Seconds>::infinity());

/// evaluate() for a caller that wants only strategies that fit: the
/// iteration time, or nullopt when `s` does not fit in every device's
/// memory — told from the memory alone (TaskGraph::buildMemory), without
/// building or simulating its task graph (on 1,024 GPUs a graph has tens
/// of millions of tasks).
llvm::Expected<std::optional<Seconds>>
evaluateIfFits(const SearchProblem &p, const Strategy &s, size_t maxTasks = 0,
               Seconds limit = std::numeric_limits<Seconds>::infinity());

/// A way to make a strategy hold less: a ZeRO stage on every op
/// with a data-parallel group, and a recomputation policy.
struct MemorySaving {
  int zero = 0;
  enum Recompute : uint8_t { None, Selective, Full } recompute = None;
  /// Selective as Megatron-LM means it: the core attention only
  /// (megatronSelectiveRecompute), not every op without weights that saves.
  bool coreAttention = false;
  /// ", ZeRO-1, selective recomputation" ("" for none).
  std::string str() const;
  void apply(const Graph &g, Strategy &s) const;
};

/// The savings a searcher tries, in the order they cost time: ZeRO-1 and -2
/// (the same bytes on the wire without micro-batches), then selective
/// recomputation with them, ZeRO-3, and full recomputation. `megatron`
/// limits itself to what Megatron-LM offers: its distributed optimizer
/// (ZeRO-1) and selective, then full, recomputation. The last rung is the
/// lightest in memory (fitWithLadder relies on it).
std::vector<MemorySaving> memoryLadder(bool megatronOnly = false);

/// What fitWithLadder found: the rung that fits and its time (0 when none
/// fits; +infinity when its simulation stopped past the limit), or the last
/// rung tried.
struct LadderFit {
  Seconds time = 0;
  bool fits = false;
  /// The last rung's task graph passed taskLimit: more micro-batches only
  /// make it larger.
  bool tooLarge = false;
  MemorySaving rung;
  size_t rungIndex = 0; ///< rung's place in the ladder
};

/// Evaluates `s` and, while it does not fit, again with each rung of
/// `ladder` applied; `s` keeps the first that fits (or the last tried).
/// A rung whose memory does not fit (evaluateIfFits) is not simulated.
/// `evaluated` counts the simulations. A task graph past taskLimit counts
/// as not fitting and ends the ladder, as does `o`'s deadline. The rung
/// that fits is simulated with `limit` (evaluate). When the first rung does
/// not fit, the last (the lightest) is tried next: if it does not fit,
/// none between is tried.
llvm::Expected<LadderFit>
fitWithLadder(const SearchProblem &p, Strategy &s,
              const std::vector<MemorySaving> &ladder, uint64_t &evaluated,
              const SearchOptions *o = nullptr,
              Seconds limit = std::numeric_limits<Seconds>::infinity());

/// Gradient accumulation and micro-batching as a user tunes them: `s` with
/// its micro-batches m, 2m, 4m, ... (while every sample loop still divides),
/// each through fitWithLadder, going on while nothing fits yet or the time
/// still improves — with `whileLighter`, until two counts in a row do not
/// pay, and never stopping at one that fits on a lighter rung of the ladder
/// than the count before: a smaller micro-batch may need less
/// recomputation or sharding and end faster (GPT-3 13B's gradient
/// accumulation on 64 GPUs: ZeRO-2 with full recomputation at m = 2 and 4,
/// ZeRO-1 with selective recomputation at m = 16). `s` becomes the fastest that
/// fits and the result is its time and rung; nullopt (and `s` unchanged)
/// when none fits, `o`'s deadline passes first or the task graph grows past
/// taskLimit. A count after the first that fits is simulated only until
/// it is certain not to beat the fastest so far (evaluate's `limit`): the
/// same counts, rungs and result as simulating each to its end, since a
/// count that does not beat it is one that does not pay.
llvm::Expected<std::optional<std::pair<Seconds, MemorySaving>>>
fitMicroBatches(const SearchProblem &p, Strategy &s,
                const std::vector<MemorySaving> &ladder, uint64_t &evaluated,
                const SearchOptions &o, bool whileLighter = false);

/// Each of `tries` that verifies, through fitWithLadder (`ladder`, limited
/// by `best`'s time), logged as "`label` <pipeline>: <time>"; the fastest
/// that fits and beats `best` replaces it. Stops at `o`'s deadline.
llvm::Error keepFastestFit(const SearchProblem &p, const SearchOptions &o,
                           std::vector<Strategy> &tries,
                           const std::vector<MemorySaving> &ladder,
                           const std::string &label, SearchResult &best,
                           uint64_t &evaluated);

} // namespace soap

#endif // SOAP_SEARCH_SEARCHER_H
