// soapc compare: several searchers on one model and topology under the same
// simulator, each row printed as its searcher ends (a table on a terminal,
// CSV or JSON lines otherwise), each searcher within --timeout.
#include "soap/Driver/Commands.h"
#include "soap/Driver/Output.h"
#include "soap/Driver/Session.h"

#include "soap/Search/Driver.h"
#include "soap/Support/Error.h"
#include "soap/Support/Format.h"

namespace soap {

/// A row's note: how a searcher that passed its timeout ended.
static std::string timeoutNote(const SearchOutcome &o) {
  if (!o.fallback.empty())
    return "timed out: fastest baseline (" + o.fallback + ")";
  return o.timedOut ? "timed out: best plan so far" : "";
}

static Json rowJson(const SearchOutcome &o) {
  if (!o.infeasible.empty())
    return {{"searcher", o.searcher}, {"infeasible", o.infeasible}};
  Json j = {{"searcher", o.searcher},
            {"iteration_s", o.metrics.iterationTime},
            {"speedup_over_data", o.speedup()},
            {"peak_memory_bytes", o.metrics.peakMemory},
            {"transfer_bytes", o.metrics.transferBytes},
            {"collective_bytes", o.metrics.collectiveBytes},
            {"proposals", o.result.proposals},
            {"search_s", o.searchSeconds},
            {"timed_out", o.timedOut}};
  if (!o.fallback.empty())
    j["fallback"] = o.fallback;
  return j;
}

static std::vector<std::string> rowCells(const SearchOutcome &o) {
  if (!o.infeasible.empty())
    return {o.searcher, "does not fit"};
  double sp = o.speedup();
  return {o.searcher,
          fmt::format("{:.3f}", o.metrics.iterationTime * 1e3),
          sp > 0 ? fmt::format("{:.2f}x", sp) : "n/a",
          formatBytes(o.metrics.peakMemory),
          formatBytes(o.metrics.transferBytes),
          formatBytes(o.metrics.collectiveBytes),
          withCommas(int64_t(o.result.proposals)),
          fmt::format("{:.2f}", o.searchSeconds),
          timeoutNote(o)};
}

/// The searchers of --search, each known, before anything runs.
static llvm::Expected<std::vector<std::string>>
searcherNames(llvm::StringRef list) {
  registerAllSearchers();
  llvm::SmallVector<llvm::StringRef, 8> parts;
  list.split(parts, ',', -1, /*KeepEmpty=*/false);
  std::vector<std::string> names;
  for (llvm::StringRef n : parts) {
    n = n.trim();
    if (n.empty())
      continue;
    if (!SearcherRegistry::instance().lookup(n))
      return inputError("unknown searcher '{}'; the searchers are: {}",
                        n.str(), SearcherRegistry::instance().names());
    names.push_back(n.str());
  }
  if (names.empty())
    return inputError("--search '{}': no searcher named; give a "
                      "comma-separated list of: {}",
                      list.str(), SearcherRegistry::instance().names());
  return names;
}

llvm::Error runCompare(const DriverOptions &d) {
  auto names = searcherNames(d.search);
  if (!names)
    return names.takeError();
  auto o = searchOptions(d, /*progress=*/false);
  if (!o)
    return o.takeError();
  auto su = Session::open(d);
  if (!su)
    return su.takeError();
  Session &s = **su;
  SearchProblem problem = s.problem();
  OutputFormat format = resolveFormat(d.format, OutputFormat::Csv);
  ProgressLine progress(d.quiet);
  // Data parallelism once, for every row's speedup.
  progress.show("simulating data parallelism");
  auto dp = dataParallelTime(problem);
  if (!dp)
    return dp.takeError();
  StreamingTable table(llvm::outs(),
                       {{"searcher", 10, false},
                        {"time ms", 10, true},
                        {"speedup", 7, true},
                        {"peak memory", 11, true},
                        {"transfers", 10, true},
                        {"all-reduces", 10, true},
                        {"proposals", 9, true},
                        {"search s", 8, true},
                        {"note", 0, false}},
                       format == OutputFormat::Csv);
  if (format != OutputFormat::Json)
    table.header();
  for (const std::string &name : *names) {
    progress.show(fmt::format("{}: searching{}", name,
                              o->timeoutSeconds > 0
                                  ? fmt::format(" (timeout {})", d.timeout)
                                  : ""));
    SearchOptions so = *o;
    if (progress.enabled())
      so.progress = [&](const SearchProgress &p) {
        progress.show(fmt::format(
            "{}: best {:.3f} ms  {} proposals  {:.0f}/s  {:.1f} s", name,
            p.best * 1e3, p.proposals,
            p.elapsedSeconds > 0 ? p.proposals / p.elapsedSeconds : 0.0,
            p.elapsedSeconds));
      };
    auto out = runSearchForCompare(problem, name, so, *dp);
    progress.clear();
    if (!out)
      return out.takeError();
    if (format == OutputFormat::Json) {
      llvm::outs() << rowJson(*out).dump() << "\n";
      llvm::outs().flush();
    } else {
      table.row(rowCells(*out));
    }
  }
  return llvm::Error::success();
}

} // namespace soap
