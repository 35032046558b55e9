// Searcher registry, budgets, options, and evaluation of a strategy.
#include "soap/Search/Searcher.h"

#include "soap/Parallel/WhatIf.h"

#include "ConfigCost.h"

#include "soap/Support/Error.h"
#include <cmath>
#include <set>
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
  applyRecompute(g, s);
}

void MemorySaving::applyRecompute(const Graph &g, Strategy &s) const {
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

llvm::Expected<ComputeBound> ComputeBound::of(const SearchProblem &p,
                                               const Strategy &s) {
  ComputeBound b;
  const Graph &g = p.graph;
  size_t groups = size_t(s.pipeline.numGroups());
  std::vector<std::set<DeviceId>> devices(groups);
  b.groupOf_.resize(g.numOps());
  b.fwd_.resize(g.numOps());
  b.bwd_.resize(g.numOps());
  for (const Op &op : g.ops()) {
    const OpConfig &c = s.configs[size_t(op.id)];
    auto cc = configCost(p, op, c);
    if (!cc)
      return cc.takeError();
    int32_t grp = s.pipeline.group(s.pipeline.stage(op.id));
    b.groupOf_[size_t(op.id)] = grp;
    b.fwd_[size_t(op.id)] = cc->work[Fwd];
    b.bwd_[size_t(op.id)] = cc->work[Bwd];
    devices[size_t(grp)].insert(c.devices.begin(), c.devices.end());
  }
  // Work per device of the group.
  for (const Op &op : g.ops()) {
    double n = double(
        std::max<size_t>(1, devices[size_t(b.groupOf_[size_t(op.id)])].size()));
    b.fwd_[size_t(op.id)] /= n;
    b.bwd_[size_t(op.id)] /= n;
  }
  return b;
}

Seconds ComputeBound::operator()(const Strategy &s) const {
  std::vector<Seconds> work;
  for (size_t o = 0; o < groupOf_.size(); ++o) {
    size_t grp = size_t(groupOf_[o]);
    if (grp >= work.size())
      work.resize(grp + 1, 0);
    work[grp] += fwd_[o] + bwd_[o] + (s.recomputes(OpId(o)) ? fwd_[o] : 0);
  }
  Seconds bound = 0;
  for (Seconds w : work)
    bound = std::max(bound, w);
  const Pipeline &pl = s.pipeline;
  if (pl.schedule == PipelineSchedule::OneFOneB && pl.chunks == 1 &&
      work.size() > 1) {
    Seconds others = 0;
    for (size_t grp = 0; grp + 1 < work.size(); ++grp)
      others += work[grp];
    bound = std::max(bound,
                     work.back() + others / double(std::max(1, pl.microBatches)));
  }
  return bound;
}

llvm::Expected<LadderFit> fitWithLadder(const SearchProblem &p, Strategy &s,
                                        const std::vector<MemorySaving> &ladder,
                                        uint64_t &evaluated,
                                        const SearchOptions *o,
                                        Seconds limit,
                                        const ComputeBound *bound,
                                        Seconds cut) {
  // The first rung from which no rung's compute bound is under `cut`.
  size_t hopeless = ladder.size();
  if (bound && std::isfinite(cut)) {
    Strategy probe = s;
    while (hopeless > 0) {
      ladder[hopeless - 1].applyRecompute(p.graph, probe);
      if ((*bound)(probe) < cut)
        break;
      --hopeless;
    }
  }
  LadderFit fit;
  for (size_t i = 0; i < ladder.size(); ++i) {
    const MemorySaving &rung = ladder[i];
    if (o && evaluated > 0 && o->pastDeadline())
      break;
    if (i >= hopeless) {
      fit = LadderFit();
      fit.cut = true;
      break;
    }
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
      if (i == 0 && ladder.size() > 2 && hopeless == ladder.size()) {
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
                const SearchOptions &o, bool whileLighter, Seconds cut) {
  std::optional<std::pair<Seconds, MemorySaving>> best;
  std::optional<Strategy> bestStrategy;
  Strategy cur = s;
  size_t lastRung = ladder.size();
  int misses = 0; ///< counts in a row that did not pay
  bool wasCut = false; ///< a count that could not beat `cut`
  std::optional<ComputeBound> bound;
  if (std::isfinite(cut)) {
    auto b = ComputeBound::of(p, s);
    if (!b)
      return b.takeError();
    bound = std::move(*b);
  }
  while (!o.pastDeadline()) {
    // A count that cannot beat the best (or `cut`) is one that does not
    // pay: its simulation stops once that is certain.
    Seconds fastest =
        best ? best->first : std::numeric_limits<Seconds>::infinity();
    auto fit = fitWithLadder(p, cur, ladder, evaluated, &o,
                             std::min(fastest, cut),
                             bound ? &*bound : nullptr, cut);
    if (!fit)
      return fit.takeError();
    // A graph past taskLimit: more micro-batches only make it larger.
    if (fit->tooLarge)
      break;
    // Whether this count lost to `cut` rather than to the fastest count:
    // then it says nothing of whether more micro-batches pay.
    bool lostToCut = (fit->cut || (fit->fits && !std::isfinite(fit->time))) &&
                     cut < fastest;
    wasCut |= lostToCut;
    if (fit->fits && !lostToCut) {
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
    } else if (fit->cut && !lostToCut) {
      // Cannot beat the fastest count (which fits with fewer
      // micro-batches, so this count fits too): it does not pay.
      if (!whileLighter || ++misses >= 2)
        break;
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
  if (!best && wasCut)
    return std::optional<std::pair<Seconds, MemorySaving>>(std::make_pair(
        std::numeric_limits<Seconds>::infinity(), MemorySaving()));
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
    auto bound = ComputeBound::of(p, s);
    if (!bound)
      return bound.takeError();
    auto fit = fitWithLadder(p, s, ladder, evaluated, &o, best.iterationTime,
                             &*bound, best.iterationTime);
    if (!fit)
      return fit.takeError();
    spdlog::info("{} v={} {}{}: {}", label, s.pipeline.chunks,
                 scheduleName(s.pipeline.schedule).str(), fit->rung.str(),
                 fit->cut     ? std::string("cannot beat it")
                 : !fit->fits ? std::string("does not fit")
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
