// Searcher registry, budgets, options, and evaluation of a strategy.
#include "soap/Search/Searcher.h"

#include "soap/Parallel/WhatIf.h"

#include "soap/Support/Error.h"
#include <cmath>
#include <spdlog/spdlog.h>

namespace soap {

Searcher::~Searcher() = default;

char DeadlineExceeded::ID = 0;

void DeadlineExceeded::log(llvm::raw_ostream &os) const {
  os << searcher_ << ": the search passed its deadline with no strategy yet";
}

std::error_code DeadlineExceeded::convertToErrorCode() const {
  return std::make_error_code(std::errc::timed_out);
}

/// Removes a duration unit (ms, s, m, h) from the end of `t` and returns
/// its seconds; 0 when there is none.
static double consumeUnit(llvm::StringRef &t) {
  if (t.consume_back("ms"))
    return 1e-3;
  if (t.consume_back("s"))
    return 1;
  if (t.consume_back("m"))
    return 60;
  if (t.consume_back("h"))
    return 3600;
  return 0;
}

llvm::Expected<double> parseDuration(llvm::StringRef text,
                                     llvm::StringRef flag) {
  llvm::StringRef t = text.trim();
  double scale = consumeUnit(t);
  if (scale == 0)
    scale = 1; // a plain number is seconds
  double v;
  if (t.empty() || t.getAsDouble(v) || !(v > 0) || !std::isfinite(v * scale))
    return inputError("{} '{}': expected a positive duration such as 30s, "
                      "500ms, 2m or 1h (a plain number is seconds)",
                      flag.str(), text.str());
  return v * scale;
}

llvm::Expected<Budget> Budget::parse(llvm::StringRef text) {
  Budget b;
  llvm::StringRef t = text.trim();
  double scale = consumeUnit(t);
  if (scale > 0) {
    double v;
    if (t.getAsDouble(v) || !(v > 0) || !std::isfinite(v))
      return inputError("--budget '{}': expected a positive duration such as "
                        "30s, 500ms or 2m, or a number of proposals",
                        text.str());
    b.seconds = v * scale;
    return b;
  }
  uint64_t n;
  if (t.getAsInteger(10, n) || n == 0)
    return inputError("--budget '{}': expected a number of proposals (e.g. "
                      "20000) or a duration (30s, 500ms, 2m)",
                      text.str());
  b.proposals = n;
  return b;
}

std::string Budget::str() const {
  if (proposals)
    return std::to_string(proposals);
  return fmt::format("{}s", seconds);
}

llvm::Error SearchOptions::validate() const {
  if (!budget.proposals && !(budget.seconds > 0))
    return inputError("the search budget must be positive");
  if (chains < 1 || chains > 64)
    return inputError("--chains must be between 1 and 64, got {}", chains);
  if (threads < 1 || threads > 256)
    return inputError(
        "--threads must be between 0 (every core) and 256, got {}", threads);
  if (beta < 0 || !std::isfinite(beta))
    return inputError("--beta must be non-negative, got {}", beta);
  if (timeoutSeconds < 0 || !std::isfinite(timeoutSeconds))
    return inputError("--timeout must be a positive duration, got {}",
                      timeoutSeconds);
  return space.validate();
}

SearcherRegistry &SearcherRegistry::instance() {
  static SearcherRegistry r;
  return r;
}

void SearcherRegistry::add(SearcherInfo info) {
  std::string name = info.name;
  infos_[name] = std::move(info);
}

const SearcherInfo *SearcherRegistry::lookup(llvm::StringRef name) const {
  auto it = infos_.find(name.str());
  return it == infos_.end() ? nullptr : &it->second;
}

std::string SearcherRegistry::names() const {
  std::string s;
  for (const auto &[name, info] : infos_)
    s += (s.empty() ? "" : ", ") + name;
  return s;
}

size_t taskLimit(const SearchProblem &p) {
  if (p.maxTasks)
    return p.maxTasks;
  return std::min(kMaxSearchTasks,
                  std::max<size_t>(size_t(1) << 20,
                                   16 * p.graph.numOps() *
                                       p.topo.numDevices()));
}

llvm::Expected<std::pair<Seconds, bool>>
evaluate(const SearchProblem &p, const Strategy &s, size_t maxTasks,
         Seconds limit) {
  SimContext ctx = p.context();
  ctx.maxTasks = maxTasks;
  auto tg = TaskGraph::build(ctx, s);
  if (!tg)
    return tg.takeError();
  Simulator sim(*tg);
  std::optional<Seconds> t = sim.simulateFull(limit);
  return std::make_pair(t ? *t : std::numeric_limits<Seconds>::infinity(),
                        tg->fits());
}

std::string MemorySaving::str() const {
  std::string out;
  if (zero)
    out += fmt::format(", ZeRO-{}", zero);
  if (recompute == Selective)
    out += ", selective recomputation";
  else if (recompute == Full)
    out += ", full recomputation";
  return out;
}

void MemorySaving::apply(const Graph &g, Strategy &s) const {
  s.zero.clear();
  if (zero)
    s.zero = zeroPolicy(g, s, zero);
  s.recompute.clear();
  if (recompute == Selective && coreAttention)
    s.recompute = megatronSelectiveRecompute(g);
  else if (recompute != None)
    s.recompute = recomputePolicy(g, recompute == Full);
}

std::vector<MemorySaving> memoryLadder(bool megatronOnly) {
  using R = MemorySaving::Recompute;
  if (megatronOnly)
    return {{0, R::None}, {1, R::None}, {1, R::Selective, true}, {1, R::Full}};
  return {{0, R::None},      {1, R::None},      {2, R::None},
          {1, R::Selective}, {2, R::Selective}, {3, R::None},
          {3, R::Selective}, {2, R::Full},      {3, R::Full}};
}

llvm::Expected<std::optional<Seconds>>
evaluateIfFits(const SearchProblem &p, const Strategy &s, size_t maxTasks,
               Seconds limit) {
  SimContext ctx = p.context();
  auto mem = TaskGraph::buildMemory(ctx, s);
  if (!mem)
    return mem.takeError();
  if (!mem->fits())
    return std::optional<Seconds>();
  auto e = evaluate(p, s, maxTasks, limit);
  if (!e)
    return e.takeError();
  return std::optional<Seconds>(e->first);
}

llvm::Expected<LadderFit> fitWithLadder(const SearchProblem &p, Strategy &s,
                                        const std::vector<MemorySaving> &ladder,
                                        uint64_t &evaluated,
                                        const SearchOptions *o,
                                        Seconds limit) {
  LadderFit fit;
  for (size_t i = 0; i < ladder.size(); ++i) {
    const MemorySaving &rung = ladder[i];
    if (o && evaluated > 0 && o->pastDeadline())
      break;
    rung.apply(p.graph, s);
    fit = LadderFit();
    fit.rung = rung;
    fit.rungIndex = i;
    auto r = evaluateIfFits(p, s, taskLimit(p), limit);
    if (!r) {
      if (llvm::Error rest = dropTooLarge(r.takeError(), fit.tooLarge))
        return llvm::Error(std::move(rest));
      break;
    }
    if (!*r) {
      // The first rung does not fit: when the last, the lightest (ZeRO's
      // highest stage with full recomputation), does not either, neither
      // does any between (on 1,024 GPUs a shape that fits nowhere built
      // every rung's memory at every micro-batch count).
      if (i == 0 && ladder.size() > 2) {
        ladder.back().apply(p.graph, s);
        SimContext ctx = p.context();
        auto mem = TaskGraph::buildMemory(ctx, s);
        if (!mem)
          return mem.takeError();
        if (!mem->fits()) {
          fit.rung = ladder.back();
          fit.rungIndex = ladder.size() - 1;
          break;
        }
      }
      continue;
    }
    ++evaluated;
    fit.time = **r;
    fit.fits = true;
    break;
  }
  return fit;
}

llvm::Expected<std::optional<std::pair<Seconds, MemorySaving>>>
fitMicroBatches(const SearchProblem &p, Strategy &s,
                const std::vector<MemorySaving> &ladder, uint64_t &evaluated,
                const SearchOptions &o, bool whileLighter) {
  std::optional<std::pair<Seconds, MemorySaving>> best;
  std::optional<Strategy> bestStrategy;
  Strategy cur = s;
  size_t lastRung = ladder.size();
  int misses = 0; ///< counts in a row that did not pay
  while (!o.pastDeadline()) {
    // A count that cannot beat the best is one that does not pay: its
    // simulation stops once that is certain.
    auto fit = fitWithLadder(
        p, cur, ladder, evaluated, &o,
        best ? best->first : std::numeric_limits<Seconds>::infinity());
    if (!fit)
      return fit.takeError();
    // A graph past taskLimit: more micro-batches only make it larger.
    if (fit->tooLarge)
      break;
    if (fit->fits) {
      bool lighter = fit->rungIndex < lastRung;
      lastRung = fit->rungIndex;
      if (best && fit->time >= best->first) {
        // More micro-batches no longer pay; with whileLighter, unless this
        // count needed a lighter rung or is the first that did not pay.
        if (!whileLighter || (!lighter && ++misses >= 2))
          break;
      } else {
        best.emplace(fit->time, fit->rung);
        bestStrategy = cur;
        misses = 0;
      }
    }
    // The next count, if every sample loop still divides.
    cur.pipeline.microBatches *= 2;
    if (llvm::Error err = verifyPipeline(cur, p.graph)) {
      llvm::consumeError(std::move(err));
      break;
    }
  }
  if (bestStrategy)
    s = std::move(*bestStrategy);
  return best;
}

void registerBaselineSearchers(SearcherRegistry &r);
void registerMcmcSearcher(SearcherRegistry &r);
void registerExhaustiveSearcher(SearcherRegistry &r);
void registerKCutsSearcher(SearcherRegistry &r);
void registerPipelineSearcher(SearcherRegistry &r);
void registerFtSearcher(SearcherRegistry &r);

void registerAllSearchers() {
  SearcherRegistry &r = SearcherRegistry::instance();
  if (!r.all().empty())
    return;
  registerBaselineSearchers(r);
  registerMcmcSearcher(r);
  registerExhaustiveSearcher(r);
  registerKCutsSearcher(r);
  registerPipelineSearcher(r);
  registerFtSearcher(r);
}

llvm::Error keepFastestFit(const SearchProblem &p, const SearchOptions &o,
                           std::vector<Strategy> &tries,
                           const std::vector<MemorySaving> &ladder,
                           const std::string &label, SearchResult &best,
                           uint64_t &evaluated) {
  for (Strategy &s : tries) {
    if (o.pastDeadline())
      return llvm::Error::success();
    if (llvm::Error err = verifyStrategy(s, p.graph, p.topo)) {
      llvm::consumeError(std::move(err));
      continue;
    }
    auto fit = fitWithLadder(p, s, ladder, evaluated, &o, best.iterationTime);
    if (!fit)
      return fit.takeError();
    spdlog::info("{} v={} {}{}: {}", label, s.pipeline.chunks,
                 scheduleName(s.pipeline.schedule).str(), fit->rung.str(),
                 !fit->fits ? std::string("does not fit")
                 : std::isfinite(fit->time)
                     ? fmt::format("{:.3f} ms", fit->time * 1e3)
                     : std::string("slower"));
    if (fit->fits && fit->time < best.iterationTime) {
      best.strategy = std::move(s);
      best.iterationTime = fit->time;
    }
  }
  return llvm::Error::success();
}

} // namespace soap
