// Running a named searcher end to end: check the options, search, verify the
// strategy (every op configured, degrees divide, devices exist, memory
// fits), simulate it for its metrics and compare it with data parallelism
// (STYLE.md rule 4: check -> run -> verify).
#ifndef SOAP_SEARCH_DRIVER_H
#define SOAP_SEARCH_DRIVER_H

#include "soap/Search/Searcher.h"

namespace soap {

struct SearchOutcome {
  std::string searcher;
  SearchResult result;
  SimMetrics metrics;
  /// Data parallelism's iteration time under the same simulator; 0 when it
  /// does not fit in memory.
  Seconds dataParallelTime = 0;
  double searchSeconds = 0; ///< wall time of the search (not in plans)
  /// Set when the searcher found nothing that fits in memory (compare
  /// shows the row instead of stopping); the rest is then empty.
  std::string infeasible;
  /// The search passed SearchOptions::timeoutSeconds: the strategy is its
  /// best so far, or (with `fallback` set) the fastest baseline that fits
  /// because the searcher had nothing yet.
  bool timedOut = false;
  /// Like timedOut, but what ended was a time budget (--budget 30s) of a
  /// searcher that has no budget of its own (ft, kcuts, pipeline, ...).
  bool budgetEnded = false;
  /// Like timedOut, but Ctrl-C or SIGTERM ended the search
  /// (Support/Interrupt.h); timedOut and budgetEnded are then false.
  bool interrupted = false;
  std::string fallback;
  double speedup() const {
    return dataParallelTime > 0 ? dataParallelTime / metrics.iterationTime : 0;
  }
};

/// `dataParallelTime`, when given, is data parallelism's iteration time
/// (0: does not fit) already simulated by the caller, so that compare
/// simulates it once for all its rows.
llvm::Expected<SearchOutcome>
runSearch(const SearchProblem &p, llvm::StringRef searcher,
          const SearchOptions &o,
          std::optional<Seconds> dataParallelTime = std::nullopt);
/// As runSearch, but a searcher that finds nothing feasible gives an
/// outcome with `infeasible` set instead of an error.
llvm::Expected<SearchOutcome>
runSearchForCompare(const SearchProblem &p, llvm::StringRef searcher,
                    const SearchOptions &o,
                    std::optional<Seconds> dataParallelTime = std::nullopt);

/// Metrics of a given strategy (simulate a plan). With `maxTasks`, a
/// strategy whose task graph passes it is TaskGraphTooLarge.
llvm::Expected<SimMetrics>
strategyMetrics(const SearchProblem &p, const Strategy &s, size_t maxTasks = 0);

/// Data parallelism's iteration time, 0 when it does not fit.
llvm::Expected<Seconds> dataParallelTime(const SearchProblem &p);

} // namespace soap

#endif // SOAP_SEARCH_DRIVER_H
