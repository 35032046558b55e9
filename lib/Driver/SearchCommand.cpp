// soapc model.onnx --topology T --search S [-o plan.json]: one search, its
// summary, and the plan.
#include "soap/Driver/Commands.h"
#include "soap/Driver/Layout.h"
#include "soap/Driver/Session.h"

#include "soap/Search/Driver.h"
#include "soap/Support/Format.h"
#include "soap/Support/Interrupt.h"
#include <fmt/format.h>

namespace soap {

llvm::Error runSearchCommand(const DriverOptions &d) {
  if (auto err = checkOutputPath("-o", d.outputPath))
    return err;
  auto o = searchOptions(d, /*progress=*/true);
  if (!o)
    return o.takeError();
  auto su = Session::open(d);
  if (!su)
    return su.takeError();
  Session &s = **su;
  // From here to the plan written, Ctrl-C or SIGTERM ends the search as
  // --timeout would; a second one exits at once (130).
  InterruptScope interrupts;
  auto out = runSearch(s.problem(), d.search, *o);
  if (o->progress)
    llvm::errs() << "\n";
  if (!out)
    return out.takeError();
  const SimMetrics &m = out->metrics;
  std::string how = fmt::format("{} proposals, {:.2f} s", out->result.proposals,
                                out->searchSeconds);
  if (out->result.proposals > 0 && out->searchSeconds > 0) {
    double rate = double(out->result.proposals) / out->searchSeconds;
    how += rate < 10 ? fmt::format(", {:.2f} proposals/s", rate)
                     : fmt::format(", {:.0f} proposals/s", rate);
  }
  if (out->result.rejectedEarly > 0)
    how += fmt::format(", {:.0f}% rejected before their simulation ended",
                       100.0 * double(out->result.rejectedEarly) /
                           double(out->result.proposals));
  if (out->result.provenOptimal)
    how += ", proven optimal";
  const char *ended = out->budgetEnded ? "budget ended" : "timed out";
  const std::string &limit = out->budgetEnded ? d.budget : d.timeout;
  if (out->interrupted)
    how += out->fallback.empty()
               ? std::string(", interrupted: the best plan so far")
               : fmt::format(", interrupted: the fastest baseline ({})",
                             out->fallback);
  else if (!out->fallback.empty())
    how += fmt::format(", {} after {}: the fastest baseline ({})", ended, limit,
                       out->fallback);
  else if (out->timedOut || out->budgetEnded)
    how += fmt::format(", {} after {}: the best plan so far", ended, limit);
  // With the plan on stdout (-o -), everything else goes to stderr, so
  // that stdout is the plan's JSON alone.
  llvm::raw_ostream &os = d.outputPath == "-" ? llvm::errs() : llvm::outs();
  Layout layout = describeLayout(*s.graph, out->result.strategy,
                                 s.topo->numDevices(), s.batch);
  os << fmt::format(
      "searcher: {} ({})\n"
      "layout: {}\n"
      "assumed: {}\n"
      "predicted iteration time: {:.3f} ms ({:.1f} samples/s at batch {})\n"
      "speedup over data parallel: {}\n"
      "peak memory: {} of {} per device\n"
      "bytes moved: transfers {}, all-reduces {}\n",
      out->searcher, how, layout.text, assumptions(s), m.iterationTime * 1e3,
      s.batch / m.iterationTime, s.batch,
      out->speedup() > 0 ? fmt::format("{:.2f}x", out->speedup())
                         : std::string("n/a (data parallel does not fit)"),
      formatBytes(m.peakMemory), formatBytes(m.capacity),
      formatBytes(m.transferBytes), formatBytes(m.collectiveBytes));
  os.flush();
  warnIdle(s, layout);
  if (!d.outputPath.empty())
    return writeSearchPlan(s, out->result.strategy, m, out->dataParallelTime,
                           out->searcher, o->seed, d.outputPath, &*out);
  return llvm::Error::success();
}

} // namespace soap
