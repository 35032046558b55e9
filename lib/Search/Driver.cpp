// Running a named searcher end to end: check, search (within a deadline),
// verify, simulate for the metrics, compare with data parallelism.
#include "soap/Search/Driver.h"

#include "soap/Parallel/BuiltinStrategies.h"
#include "soap/Support/Error.h"
#include <chrono>
#include <spdlog/spdlog.h>

namespace soap {

llvm::Expected<SimMetrics> strategyMetrics(const SearchProblem &p,
                                           const Strategy &s, size_t maxTasks) {
  SimContext ctx = p.context();
  ctx.maxTasks = maxTasks;
  auto tg = TaskGraph::build(ctx, s);
  if (!tg)
    return tg.takeError();
  Simulator sim(*tg);
  sim.simulateFull();
  return sim.metrics();
}

llvm::Expected<Seconds> dataParallelTime(const SearchProblem &p) {
  auto dp = evaluateIfFits(p, dataParallel(p.graph, p.topo));
  if (!dp)
    return dp.takeError();
  return dp->value_or(0);
}

/// A searcher that passed its deadline with nothing to show: the fastest of
/// the baselines that fits (what a budget too small for any search gives).
static llvm::Expected<std::pair<std::string, Strategy>>
fastestBaseline(const SearchProblem &p, llvm::StringRef searcher,
                bool interrupted) {
  std::optional<std::pair<std::string, Strategy>> best;
  Seconds bestTime = 0;
  for (const char *name : {"data", "expert", "model"}) {
    auto s = builtinStrategy(name, p.graph, p.topo);
    if (!s)
      return s.takeError();
    auto e = evaluateIfFits(p, *s);
    if (!e)
      return e.takeError();
    if (*e && (!best || **e < bestTime)) {
      best.emplace(name, std::move(*s));
      bestTime = **e;
    }
  }
  if (!best)
    return makeError(ExitCode::Infeasible,
                     "{}: {} {} before finding a strategy and no baseline "
                     "(data, expert, model) fits in device memory",
                     p.graph.sourcePath, searcher.str(),
                     interrupted ? "was interrupted" : "passed its timeout");
  return std::move(*best);
}

llvm::Expected<SearchOutcome>
runSearch(const SearchProblem &p, llvm::StringRef searcher,
          const SearchOptions &options,
          std::optional<Seconds> dataParallelSeconds) {
  registerAllSearchers();
  const SearcherInfo *info = SearcherRegistry::instance().lookup(searcher);
  if (!info)
    return inputError("unknown searcher '{}'; the searchers are: {}",
                      searcher.str(), SearcherRegistry::instance().names());
  if (auto err = options.validate())
    return llvm::Error(std::move(err));
  SearchOutcome out;
  out.searcher = searcher.str();
  auto t0 = std::chrono::steady_clock::now();
  SearchOptions o = options;
  if (o.timeoutSeconds > 0)
    o.deadline = secondsAfter(t0, o.timeoutSeconds);
  // A time budget for a searcher without one of its own ends it as a
  // deadline does.
  bool budgetFirst = false;
  if (o.budget.seconds > 0 && !info->readsTimeBudget &&
      (o.timeoutSeconds <= 0 || o.budget.seconds < o.timeoutSeconds)) {
    o.deadline = secondsAfter(t0, o.budget.seconds);
    budgetFirst = true;
  }
  auto r = info->create()->search(p, o);
  // Whether Ctrl-C or SIGTERM (Support/Interrupt.h) rather than a deadline
  // stopped it (the searchers poll one predicate, pastDeadline): read now,
  // so that one during the fallback or the checks below changes nothing.
  bool interrupted = interruptRequested();
  if (!r) {
    llvm::Error rest = llvm::handleErrors(
        r.takeError(), [&](const DeadlineExceeded &) -> llvm::Error {
          auto b = fastestBaseline(p, searcher, interrupted);
          if (!b)
            return b.takeError();
          if (interrupted)
            spdlog::warn("{}: interrupted with no strategy yet; returning "
                         "the fastest baseline that fits ({})",
                         searcher.str(), b->first);
          else
            spdlog::warn("{}: {} after {:g} s with no strategy; "
                         "returning the fastest baseline that fits ({})",
                         searcher.str(),
                         budgetFirst ? "its time budget ended" : "timed out",
                         budgetFirst ? o.budget.seconds : o.timeoutSeconds,
                         b->first);
          out.fallback = b->first;
          out.result.strategy = std::move(b->second);
          out.result.timedOut = true;
          return llvm::Error::success();
        });
    if (rest)
      return llvm::Error(std::move(rest));
  } else {
    out.result = std::move(*r);
  }
  out.interrupted = out.result.timedOut && interrupted;
  bool deadline = out.result.timedOut && !out.interrupted;
  out.timedOut = deadline && !budgetFirst;
  out.budgetEnded = deadline && budgetFirst;
  out.searchSeconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  // Verify before anything is written.
  if (auto err = verifyStrategy(out.result.strategy, p.graph, p.topo))
    return makeError(ExitCode::Internal,
                     "searcher '{}' returned an invalid "
                     "strategy: {}",
                     searcher.str(), errorMessage(std::move(err)));
  // A ZeRO stage on an op whose weights no other device holds means
  // nothing; the plan leaves it out.
  dropIdleZero(p.graph, out.result.strategy);
  auto m = strategyMetrics(p, out.result.strategy);
  if (!m)
    return m.takeError();
  out.metrics = *m;
  if (!out.fallback.empty())
    out.result.iterationTime = m->iterationTime;
  if (!out.metrics.fits)
    return makeError(ExitCode::Internal,
                     "searcher '{}' returned a strategy that does not fit in "
                     "memory",
                     searcher.str());
  if (dataParallelSeconds) {
    out.dataParallelTime = *dataParallelSeconds;
  } else {
    auto dp = dataParallelTime(p);
    if (!dp)
      return dp.takeError();
    out.dataParallelTime = *dp;
  }
  return out;
}

llvm::Expected<SearchOutcome>
runSearchForCompare(const SearchProblem &p, llvm::StringRef searcher,
                    const SearchOptions &o,
                    std::optional<Seconds> dataParallelSeconds) {
  auto out = runSearch(p, searcher, o, dataParallelSeconds);
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

} // namespace soap
