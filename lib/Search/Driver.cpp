// Search orchestration and the compare report.
#include "soap/Search/Driver.h"

#include "soap/Parallel/BuiltinStrategies.h"
#include "soap/Support/Error.h"
#include "soap/Support/Format.h"
#include <chrono>

namespace soap {

llvm::Expected<SimMetrics> strategyMetrics(const SearchProblem &p,
                                           const Strategy &s) {
  SimContext ctx = p.context();
  auto tg = TaskGraph::build(ctx, s);
  if (!tg)
    return tg.takeError();
  Simulator sim(*tg);
  sim.simulateFull();
  return sim.metrics();
}

llvm::Expected<SearchOutcome> runSearch(const SearchProblem &p,
                                        llvm::StringRef searcher,
                                        const SearchOptions &o) {
  registerAllSearchers();
  const SearcherInfo *info = SearcherRegistry::instance().lookup(searcher);
  if (!info)
    return inputError("unknown searcher '{}'; the searchers are: {}",
                      searcher.str(), SearcherRegistry::instance().names());
  if (auto err = o.validate())
    return llvm::Error(std::move(err));
  SearchOutcome out;
  out.searcher = searcher.str();
  auto t0 = std::chrono::steady_clock::now();
  auto r = info->create()->search(p, o);
  out.searchSeconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  if (!r)
    return r.takeError();
  out.result = std::move(*r);
  // Verify before anything is written.
  if (auto err = verifyStrategy(out.result.strategy, p.graph, p.topo))
    return makeError(ExitCode::Internal, "searcher '{}' returned an invalid "
                                         "strategy: {}",
                     searcher.str(), errorMessage(std::move(err)));
  auto m = strategyMetrics(p, out.result.strategy);
  if (!m)
    return m.takeError();
  out.metrics = *m;
  if (!out.metrics.fits)
    return makeError(ExitCode::Internal,
                     "searcher '{}' returned a strategy that does not fit in "
                     "memory",
                     searcher.str());
  auto dp = evaluate(p, dataParallel(p.graph, p.topo));
  if (!dp)
    return dp.takeError();
  out.dataParallelTime = dp->second ? dp->first : 0;
  return out;
}

llvm::Expected<SearchOutcome> runSearchForCompare(const SearchProblem &p,
                                                  llvm::StringRef searcher,
                                                  const SearchOptions &o) {
  auto out = runSearch(p, searcher, o);
  if (out)
    return out;
  SearchOutcome row;
  row.searcher = searcher.str();
  llvm::Error rest = llvm::handleErrors(
      out.takeError(), [&](const SoapError &e) -> llvm::Error {
        if (e.code() != ExitCode::Infeasible)
          return llvm::make_error<SoapError>(e.code(), e.text());
        row.infeasible = e.text();
        return llvm::Error::success();
      });
  if (rest)
    return llvm::Error(std::move(rest));
  return row;
}

Json compareReport(const std::vector<SearchOutcome> &rows) {
  Json arr = Json::array();
  for (const SearchOutcome &o : rows)
    if (!o.infeasible.empty())
      arr.push_back({{"searcher", o.searcher}, {"infeasible", o.infeasible}});
    else
      arr.push_back({{"searcher", o.searcher},
                   {"iteration_s", o.metrics.iterationTime},
                   {"speedup_over_data", o.speedup()},
                   {"peak_memory_bytes", o.metrics.peakMemory},
                   {"transfer_bytes", o.metrics.transferBytes},
                   {"collective_bytes", o.metrics.collectiveBytes},
                   {"proposals", o.result.proposals},
                   {"search_s", o.searchSeconds}});
  return {{"rows", arr}};
}

void printCompareTable(const Json &report, llvm::raw_ostream &os, bool csv) {
  Table t({"searcher", "time ms", "speedup", "peak memory", "transfers",
           "all-reduces", "proposals", "search s"},
          {false, true, true, true, true, true, true, true});
  for (const Json &r : report["rows"]) {
    if (r.contains("infeasible")) {
      t.addRow({r["searcher"].get<std::string>(), "does not fit", "", "", "",
                "", "", ""});
      continue;
    }
    double sp = r["speedup_over_data"].get<double>();
    t.addRow({r["searcher"].get<std::string>(),
              fmt::format("{:.3f}", r["iteration_s"].get<double>() * 1e3),
              sp > 0 ? fmt::format("{:.2f}x", sp) : "n/a",
              formatBytes(r["peak_memory_bytes"].get<double>()),
              formatBytes(r["transfer_bytes"].get<double>()),
              formatBytes(r["collective_bytes"].get<double>()),
              withCommas(r["proposals"].get<int64_t>()),
              fmt::format("{:.2f}", r["search_s"].get<double>())});
  }
  if (csv)
    t.printCsv(os);
  else
    t.print(os);
}

} // namespace soap
