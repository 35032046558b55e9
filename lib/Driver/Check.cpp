// soapc check: exit 0 while a plan fits its model and topology; exit 4
// naming every change; with --research, exit 4 too when a search with the
// plan's settings finds a plan faster by more than --tolerance.
#include "soap/Driver/Commands.h"
#include "soap/Driver/Session.h"

#include "soap/Search/Driver.h"
#include "soap/Support/Error.h"
#include "soap/Support/Format.h"
#include "soap/Support/Interrupt.h"
#include "soap/Support/Sha256.h"
#include "llvm/Support/FileSystem.h"
#include <cmath>

namespace soap {

/// --tolerance: "2%" or a fraction.
static llvm::Expected<double> parseTolerance(const std::string &text) {
  llvm::StringRef tol = llvm::StringRef(text).trim();
  bool percent = tol.consume_back("%");
  double t;
  if (tol.getAsDouble(t) || t < 0 || !std::isfinite(t))
    return inputError("--tolerance '{}': expected a non-negative number or "
                      "percentage such as 2%",
                      text);
  return percent ? t / 100 : t;
}

/// Whether two paths name one file (the same string, or the same inode).
static bool sameFile(const std::string &a, const std::string &b) {
  return a == b || llvm::sys::fs::equivalent(a, b);
}

llvm::Error runCheck(const DriverOptions &g) {
  auto plan = readPlan(g.planPath);
  if (!plan)
    return plan.takeError();
  // The plan's recorded inputs unless given again.
  DriverOptions o = g;
  adoptPlanInputs(o, *plan, /*paths=*/true);
  auto digests = inputDigests(o);
  if (!digests)
    return digests.takeError();
  auto su = Session::open(o);
  if (!su)
    return su.takeError();
  Session &s = **su;
  std::optional<SimMetrics> metrics;
  auto strategy = planStrategy(*plan, *s.graph, *s.topo, o.planPath);
  if (strategy) {
    auto m = strategyMetrics(s.problem(), *strategy);
    if (!m)
      return m.takeError();
    metrics = *m;
  } else {
    llvm::consumeError(strategy.takeError());
  }
  // A file given in place of the plan's own is named as given, not as a
  // change to the plan's file.
  CheckGiven given;
  if (!g.modelPath.empty() && !sameFile(g.modelPath, plan->inputs.modelPath))
    given.modelPath = g.modelPath;
  if (!g.topologyPath.empty() &&
      !sameFile(resolveTopologyPath(g.topologyPath),
                resolveTopologyPath(plan->inputs.topologyPath)))
    given.topologyPath = g.topologyPath;
  given.batch = g.batch.has_value();
  std::vector<CheckFinding> findings =
      checkPlan(*plan, digests->model, digests->topology, s.batch, *s.graph,
                *s.topo, metrics ? &*metrics : nullptr, given);
  std::string researched;
  if (findings.empty() && o.research) {
    auto t = parseTolerance(o.tolerance);
    if (!t)
      return t.takeError();
    DriverOptions r = o;
    r.budget = plan->inputs.budget;
    r.seed = plan->inputs.seed;
    r.space = plan->inputs.space;
    auto so = searchOptions(r, /*progress=*/false);
    if (!so)
      return withContext(so.takeError(), o.planPath + ": /search: ");
    // Ctrl-C or SIGTERM ends the search as --timeout would (a second one
    // exits at once, 130).
    InterruptScope interrupts;
    auto again = runSearch(s.problem(), plan->inputs.searcher, *so);
    if (!again)
      return again.takeError();
    double planned = metrics->iterationTime;
    double found = again->metrics.iterationTime;
    std::string ran = fmt::format("{}, {} proposals", plan->inputs.searcher,
                                  withCommas(int64_t(again->result.proposals)));
    if (found < planned)
      researched = fmt::format("; --research: a plan {:.1f}% faster exists "
                               "({}), within the tolerance of {}",
                               100 * (1 - found / planned), ran, o.tolerance);
    else
      researched = fmt::format("; --research: no faster plan found ({}; its "
                               "best is {:.1f}% slower)",
                               ran, 100 * (found / planned - 1));
    if (found < planned * (1 - *t))
      findings.push_back({fmt::format(
          "a plan {:.1f}% faster exists ({}): {:.3f} ms{}, the plan "
          "predicts {:.3f} ms (tolerance {})",
          100 * (1 - found / planned), ran, found * 1e3,
          again->interrupted ? " before it was interrupted" : "", planned * 1e3,
          o.tolerance)});
    else if (again->interrupted)
      // Not fresh, not stale: what a whole search would find is unknown.
      return makeError(ExitCode::Interrupted,
                       "{}: the plan fits {} and {}, but the search of "
                       "--research was interrupted before it found a plan "
                       "faster by more than {}",
                       o.planPath, o.modelPath, o.topologyPath, o.tolerance);
  }
  if (findings.empty()) {
    llvm::outs() << o.planPath << ": fresh: the plan fits " << o.modelPath
                 << " and " << o.topologyPath << researched << "\n";
    return llvm::Error::success();
  }
  std::string msg = fmt::format("{}: the plan is stale:", o.planPath);
  for (const CheckFinding &f : findings)
    msg += "\n  " + f.what;
  return makeError(ExitCode::Stale, "{}", msg);
}

} // namespace soap
