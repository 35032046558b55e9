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
  double speedup() const {
    return dataParallelTime > 0 ? dataParallelTime / metrics.iterationTime
                                : 0;
  }
};

llvm::Expected<SearchOutcome> runSearch(const SearchProblem &p,
                                        llvm::StringRef searcher,
                                        const SearchOptions &o);
/// As runSearch, but a searcher that finds nothing feasible gives an
/// outcome with `infeasible` set instead of an error.
llvm::Expected<SearchOutcome> runSearchForCompare(const SearchProblem &p,
                                                  llvm::StringRef searcher,
                                                  const SearchOptions &o);

/// Metrics of a given strategy (simulate a plan).
llvm::Expected<SimMetrics> strategyMetrics(const SearchProblem &p,
                                           const Strategy &s);

/// One row per outcome: searcher, predicted time, speedup over data
/// parallel, peak memory, bytes moved, search time; as a table, CSV or JSON.
Json compareReport(const std::vector<SearchOutcome> &rows);
void printCompareTable(const Json &report, llvm::raw_ostream &os, bool csv);

} // namespace soap

#endif // SOAP_SEARCH_DRIVER_H
