// soapc simulate: one training iteration of a model under a strategy (a
// built-in one or a plan): time, memory per device, bytes moved.
#include "soap/Driver/Commands.h"
#include "soap/Driver/Layout.h"
#include "soap/Driver/Output.h"
#include "soap/Driver/Session.h"

#include "soap/Parallel/BuiltinStrategies.h"
#include "soap/Parallel/WhatIf.h"
#include "soap/Sim/SimReport.h"

namespace soap {

llvm::Error runSimulate(const DriverOptions &o) {
  if (auto err = checkOutputPath("--trace", o.tracePath))
    return err;
  if (auto err = checkOutputPath("-o", o.outputPath))
    return err;
  std::unique_ptr<Session> s;
  Strategy strategy;
  if (llvm::StringRef(o.strategy).endswith(".json")) {
    // A plan says how its model was imported; flags given again win.
    auto ps = openPlan(o, o.strategy);
    if (!ps)
      return ps.takeError();
    s = std::move(ps->session);
    strategy = std::move(ps->strategy);
  } else {
    auto su = Session::open(o);
    if (!su)
      return su.takeError();
    s = std::move(*su);
    auto b = isWhatIf(o.strategy)
                 ? whatIfStrategy(o.strategy, *s->graph, *s->topo)
                 : builtinStrategy(o.strategy, *s->graph, *s->topo);
    if (!b)
      return b.takeError();
    strategy = std::move(*b);
  }
  SimContext ctx = s->problem().context();
  ctx.fold = !o.noFold;
  auto tg = TaskGraph::build(ctx, strategy);
  if (!tg)
    return tg.takeError();
  Simulator sim(*tg);
  sim.simulateFull();
  SimMetrics m = sim.metrics();
  if (!o.tracePath.empty())
    if (auto err =
            writeFileAtomic(o.tracePath, sim.chromeTrace().dump() + "\n"))
      return err;
  Layout layout =
      describeLayout(*s->graph, strategy, s->topo->numDevices(), s->batch);
  Json report = simReport(sim, m, o.strategy, s->batch);
  report["layout"] = layout.text;
  if (o.format == OutputFormat::Json) {
    llvm::outs() << dumpJson(report);
  } else {
    // The layout under the strategy's name.
    std::string text;
    llvm::raw_string_ostream ts(text);
    printSimReport(report, ts);
    ts.flush();
    size_t at = text.find("\nstrategy: ");
    at = at == std::string::npos ? 0 : text.find('\n', at + 1) + 1;
    text.insert(at, "layout: " + layout.text + "\n");
    llvm::outs() << text;
  }
  llvm::outs().flush();
  warnIdle(*s, layout);
  // A plan like a searcher's, so that explain, diff and check compare it
  // with searched ones (no data-parallel run: its speedup reads 1).
  if (!o.outputPath.empty())
    return writeSearchPlan(*s, strategy, m, m.iterationTime,
                           "simulate " + o.strategy, 0, o.outputPath);
  return llvm::Error::success();
}

} // namespace soap
