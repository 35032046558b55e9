// soapc compare: several searchers on one model and topology under the same
// simulator, run concurrently (--jobs), each row printed as its searcher
// ends (a table on a terminal, CSV or JSON lines otherwise), each searcher
// within --timeout. Ctrl-C ends the running searchers as --timeout would
// and skips the rest: the table is finished with what there is.
#include "soap/Driver/Commands.h"
#include "soap/Driver/Layout.h"
#include "soap/Driver/Output.h"
#include "soap/Driver/Session.h"

#include "soap/Search/Driver.h"
#include "soap/Support/Error.h"
#include "soap/Support/Format.h"
#include "soap/Support/Interrupt.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

namespace soap {

/// A row's note: how a searcher that passed its timeout, or was
/// interrupted, ended.
static std::string timeoutNote(const SearchOutcome &o) {
  std::string ended = o.interrupted   ? "interrupted"
                      : o.budgetEnded ? "budget ended"
                                      : "timed out";
  if (!o.fallback.empty())
    return ended + ": fastest baseline (" + o.fallback + ")";
  return o.timedOut || o.budgetEnded || o.interrupted
             ? ended + ": best plan so far"
             : "";
}

static Json rowJson(const SearchOutcome &o, const std::string &layout) {
  if (!o.infeasible.empty())
    return {{"searcher", o.searcher}, {"infeasible", o.infeasible}};
  double sp = o.speedup();
  Json j = {{"searcher", o.searcher},
            {"layout", layout},
            {"iteration_s", o.metrics.iterationTime},
            {"speedup_over_data", sp > 0 ? Json(sp) : Json(nullptr)},
            {"peak_memory_bytes", o.metrics.peakMemory},
            {"transfer_bytes", o.metrics.transferBytes},
            {"collective_bytes", o.metrics.collectiveBytes},
            {"proposals", o.result.proposals},
            {"search_s", o.searchSeconds},
            {"timed_out", o.timedOut},
            {"budget_ended", o.budgetEnded},
            {"interrupted", o.interrupted}};
  if (!o.fallback.empty())
    j["fallback"] = o.fallback;
  return j;
}

static std::vector<std::string> rowCells(const SearchOutcome &o, bool csv,
                                         const std::string &layout) {
  if (!o.infeasible.empty())
    return {o.searcher, "does not fit"};
  double sp = o.speedup();
  return {o.searcher,
          fmt::format("{:.3f}", o.metrics.iterationTime * 1e3),
          sp > 0 ? fmt::format("{:.2f}x", sp) : "n/a",
          formatBytes(o.metrics.peakMemory),
          formatBytes(o.metrics.transferBytes),
          formatBytes(o.metrics.collectiveBytes),
          csv ? std::to_string(o.result.proposals)
              : withCommas(int64_t(o.result.proposals)),
          fmt::format("{:.2f}", o.searchSeconds),
          timeoutNote(o),
          layout};
}

/// Makes -o's directory when it does not exist yet.
static llvm::Error planDir(const std::string &dir) {
  if (std::error_code ec = llvm::sys::fs::create_directories(dir))
    return inputError("-o {}: cannot make the directory: {}", dir,
                      ec.message());
  return llvm::Error::success();
}

/// The row of a searcher that Ctrl-C kept from starting.
static Json notRunJson(const std::string &searcher) {
  return {{"searcher", searcher}, {"interrupted", true}, {"not_run", true}};
}
static std::vector<std::string> notRunCells(const std::string &searcher,
                                            bool csv) {
  std::vector<std::string> cells(10, csv ? "" : "-");
  cells.front() = searcher;
  cells[8] = "not run: interrupted";
  cells[9] = "";
  return cells;
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
      return inputError("unknown searcher '{}'; the searchers are: {}", n.str(),
                        SearcherRegistry::instance().names());
    names.push_back(n.str());
  }
  if (names.empty())
    return inputError("--search '{}': no searcher named; give a "
                      "comma-separated list of: {}",
                      list.str(), SearcherRegistry::instance().names());
  return names;
}

/// What the searchers running concurrently share with the printing thread.
struct CompareState {
  std::mutex mu;
  std::condition_variable done;
  /// Finished outcomes (or errors), in the order they finished; nullopt
  /// for a searcher not started because of Ctrl-C.
  std::deque<std::pair<size_t, std::optional<llvm::Expected<SearchOutcome>>>>
      finished;
  /// Per searcher: its latest progress line, empty while it waits.
  std::vector<std::string> status;
};

/// -o DIR: an existing writable folder, or one whose parent is (made when
/// the first plan is written); refused before any search runs.
static llvm::Error checkPlanDir(const std::string &dir) {
  if (dir.empty())
    return llvm::Error::success();
  if (dir == "-")
    return inputError("-o -: compare writes one plan per searcher; give a "
                      "directory");
  if (llvm::sys::fs::exists(dir)) {
    if (!llvm::sys::fs::is_directory(dir))
      return inputError("-o {}: not a directory (compare writes one plan per "
                        "searcher there, as DIR/<searcher>.json)",
                        dir);
    if (llvm::sys::fs::access(dir, llvm::sys::fs::AccessMode::Write))
      return inputError("-o {}: the directory is not writable", dir);
    return llvm::Error::success();
  }
  llvm::SmallString<256> parent(dir);
  llvm::sys::path::remove_filename(parent);
  if (parent.empty())
    parent = ".";
  if (!llvm::sys::fs::is_directory(parent))
    return inputError("-o {}: no such directory '{}'", dir, parent.str().str());
  if (llvm::sys::fs::access(parent, llvm::sys::fs::AccessMode::Write))
    return inputError("-o {}: the directory '{}' is not writable", dir,
                      parent.str().str());
  return llvm::Error::success();
}

llvm::Error runCompare(const DriverOptions &d) {
  auto names = searcherNames(d.search);
  if (!names)
    return names.takeError();
  if (auto err = checkPlanDir(d.outputPath))
    return err;
  auto o = searchOptions(d, /*progress=*/false);
  if (!o)
    return o.takeError();
  if (d.jobs < 0)
    return inputError("--jobs must be 0 (every searcher at once) or "
                      "positive, got {}",
                      d.jobs);
  auto su = Session::open(d);
  if (!su)
    return su.takeError();
  Session &s = **su;
  const SearchProblem problem = s.problem();
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
                        {"note", 0, false},
                        {"layout", 0, false}},
                       format == OutputFormat::Csv);
  progress.clear();
  if (format != OutputFormat::Json)
    table.header();

  // The searchers run on `jobs` threads (all at once by default, so every
  // row lands within --timeout); each row is printed as its searcher ends.
  // Ctrl-C or SIGTERM stops those running as --timeout would and keeps the
  // rest from starting; a second one exits at once (130).
  InterruptScope interrupts;
  size_t n = names->size();
  size_t jobs = d.jobs == 0 ? n : std::min(n, size_t(d.jobs));
  CompareState st;
  st.status.assign(n, "");
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < n;) {
      const std::string &name = (*names)[i];
      if (interruptRequested()) {
        std::lock_guard<std::mutex> lock(st.mu);
        st.finished.emplace_back(i, std::nullopt);
        st.done.notify_one();
        continue;
      }
      SearchOptions so = *o;
      {
        std::lock_guard<std::mutex> lock(st.mu);
        st.status[i] = name + ": starting";
      }
      if (progress.enabled())
        so.progress = [&st, i, name](const SearchProgress &p) {
          std::lock_guard<std::mutex> lock(st.mu);
          st.status[i] = fmt::format(
              "{}: {:.3f} ms, {} proposals, {:.0f}/s", name, p.best * 1e3,
              p.proposals,
              p.elapsedSeconds > 0 ? p.proposals / p.elapsedSeconds : 0.0);
        };
      auto out = runSearchForCompare(problem, name, so, *dp);
      std::lock_guard<std::mutex> lock(st.mu);
      st.status[i].clear();
      st.finished.emplace_back(i, std::move(out));
      st.done.notify_one();
    }
  };
  std::vector<std::thread> threads;
  for (size_t t = 0; t < jobs; ++t)
    threads.emplace_back(work);

  auto start = std::chrono::steady_clock::now();
  llvm::Error firstError = llvm::Error::success();
  for (size_t printed = 0; printed < n;) {
    std::unique_lock<std::mutex> lock(st.mu);
    st.done.wait_for(lock, std::chrono::milliseconds(250),
                     [&] { return !st.finished.empty(); });
    if (st.finished.empty()) {
      std::string line =
          fmt::format("{:.0f} s", std::chrono::duration<double>(
                                      std::chrono::steady_clock::now() - start)
                                      .count());
      for (const std::string &x : st.status)
        if (!x.empty())
          line += " | " + x;
      lock.unlock();
      progress.show(line);
      continue;
    }
    auto [i, row] = std::move(st.finished.front());
    st.finished.pop_front();
    lock.unlock();
    progress.clear();
    ++printed;
    if (!row) {
      if (format == OutputFormat::Json) {
        llvm::outs() << notRunJson((*names)[i]).dump() << "\n";
        llvm::outs().flush();
      } else {
        table.row(notRunCells((*names)[i], format == OutputFormat::Csv));
      }
      continue;
    }
    llvm::Expected<SearchOutcome> &out = *row;
    if (!out) {
      if (firstError)
        llvm::consumeError(out.takeError());
      else
        firstError = out.takeError();
      continue;
    }
    std::string layout = out->infeasible.empty()
                             ? describeLayout(*s.graph, out->result.strategy,
                                              s.topo->numDevices(), s.batch)
                                   .text
                             : std::string();
    if (format == OutputFormat::Json) {
      llvm::outs() << rowJson(*out, layout).dump() << "\n";
      llvm::outs().flush();
    } else {
      table.row(rowCells(*out, format == OutputFormat::Csv, layout));
    }
    // -o DIR: each searcher's plan as DIR/<searcher>.json, its path on
    // stderr (stdout is the table).
    if (!d.outputPath.empty() && out->infeasible.empty()) {
      if (auto err = planDir(d.outputPath)) {
        if (!firstError)
          firstError = std::move(err);
        else
          llvm::consumeError(std::move(err));
        continue;
      }
      llvm::SmallString<256> path(d.outputPath);
      llvm::sys::path::append(path, out->searcher + ".json");
      if (auto err =
              writeSearchPlan(s, out->result.strategy, out->metrics,
                              out->dataParallelTime, out->searcher, o->seed,
                              std::string(path), &*out, &llvm::errs())) {
        if (!firstError)
          firstError = std::move(err);
        else
          llvm::consumeError(std::move(err));
      }
    }
  }
  for (std::thread &t : threads)
    t.join();
  return firstError;
}

} // namespace soap
