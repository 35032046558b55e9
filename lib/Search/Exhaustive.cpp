// Exact search by depth-first branch and bound (FlexFlow section 8.3 used
// DFS with A* pruning) over the configurations of every op, for small
// graphs: it measures how far other searchers are from the optimum.
//
// The bounds are admissible (never above the simulated time of any
// completion of a partial strategy):
//  - load: devices run their tasks one at a time, so the iteration takes at
//    least the busiest device's work (forward, backward, optimizer steps)
//    and the total work over the device count, ops not yet chosen at their
//    least work;
//  - chains: along every dependency path the forwards, the backwards and
//    the first op's all-reduce and update run one after another;
//  - release times: a device cannot start an op's work before the chains
//    allow, so it finishes no sooner than any release time plus the work
//    released then or later (the single-machine head bound).
// The first upper bound is the best of the baselines and a short MCMC run.
// Leaves are simulated in full. The search stops at the budget (leaves
// simulated, and 20,000 partial strategies bounded per leaf of it; or
// seconds) and then reports that optimality is not proven.
#include "ConfigCost.h"
#include "soap/Parallel/BuiltinStrategies.h"
#include "soap/Search/Searcher.h"
#include "soap/Support/Error.h"
#include <chrono>
#include <cmath>
#include <spdlog/spdlog.h>

namespace soap {

namespace {

struct Choice {
  OpConfig config;
  ConfigCost cost;
  std::vector<std::pair<DeviceId, Seconds>> load; ///< per device it uses
  Seconds work = 0;                               ///< summed over devices
  /// The quickest tile's forward plus the quickest tile's backward: every
  /// dependency chain through the op pays at least this.
  Seconds chain = 0;
};

/// Proposals of the MCMC run that gives the first upper bound.
constexpr uint64_t kIncumbentProposals = 2000;
/// Partial strategies bounded per proposal of a budget of proposals.
constexpr uint64_t kBoundsPerProposal = 20000;

class Exhaustive : public Searcher {
public:
  llvm::Expected<SearchResult> search(const SearchProblem &p,
                                      const SearchOptions &o) override {
    if (auto err = o.validate())
      return llvm::Error(std::move(err));
    const Graph &g = p.graph;
    size_t n = p.topo.numDevices();
    ConfigSpace space(g, p.topo, o.space);
    // Candidate configurations with their compute per device.
    choices_.assign(g.numOps(), {});
    for (const Op &op : g.ops()) {
      for (OpConfig &c : space.enumerate(op.id)) {
        auto cc = configCost(p, op, c);
        if (!cc)
          return cc.takeError();
        Choice ch;
        ch.cost = std::move(*cc);
        for (const auto &[d, pl] : ch.cost.load)
          ch.load.push_back({d, pl[Fwd] + pl[Bwd] + pl[Upd]});
        ch.work = ch.cost.total();
        ch.chain = ch.cost.fwd + ch.cost.bwd;
        ch.config = std::move(c);
        choices_[op.id].push_back(std::move(ch));
      }
      // Cheapest first, so good strategies are met early.
      std::stable_sort(choices_[op.id].begin(), choices_[op.id].end(),
                       [](const Choice &a, const Choice &b) {
                         Seconds ma = 0, mb = 0;
                         for (auto &[d, s] : a.load)
                           ma = std::max(ma, s);
                         for (auto &[d, s] : b.load)
                           mb = std::max(mb, s);
                         return ma < mb;
                       });
    }
    double log10Size = 0;
    for (const auto &cs : choices_)
      log10Size += std::log10(static_cast<double>(cs.size()));
    spdlog::info("exhaustive: {} ops, 10^{:.1f} strategies in the space",
                 g.numOps(), log10Size);
    preds_.assign(g.numOps(), {});
    succs_.assign(g.numOps(), {});
    minChoice_.assign(g.numOps(), Choice());
    for (const Op &op : g.ops()) {
      for (ValueId v : op.inputs)
        if (v != kNoValue && g.value(v).producer >= 0) {
          preds_[op.id].push_back(g.value(v).producer);
          succs_[g.value(v).producer].push_back(op.id);
        }
      // Each figure at its least over every configuration: a lower bound
      // for an op not chosen yet.
      Choice &m = minChoice_[op.id];
      ConfigCost &mc = m.cost;
      m.chain = mc.fwd = mc.bwd = mc.sync = mc.tail =
          std::numeric_limits<double>::infinity();
      mc.work.fill(std::numeric_limits<double>::infinity());
      for (const Choice &c : choices_[op.id]) {
        m.chain = std::min(m.chain, c.chain);
        mc.fwd = std::min(mc.fwd, c.cost.fwd);
        mc.bwd = std::min(mc.bwd, c.cost.bwd);
        mc.sync = std::min(mc.sync, c.cost.sync);
        mc.tail = std::min(mc.tail, c.cost.tail);
        for (int f = 0; f < NumPhases; ++f)
          mc.work[f] = std::min(mc.work[f], c.cost.work[f]);
      }
    }
    chosen_.assign(g.numOps(), nullptr);
    minWorkAfter_.assign(g.numOps() + 1, 0);
    for (size_t i = g.numOps(); i-- > 0;) {
      Seconds m = std::numeric_limits<double>::infinity();
      for (const Choice &c : choices_[i])
        m = std::min(m, c.work);
      minWorkAfter_[i] = minWorkAfter_[i + 1] + m;
    }
    // Upper bound from the built-in strategies.
    best_ = SearchResult();
    best_.iterationTime = std::numeric_limits<double>::infinity();
    for (const Strategy &s :
         {dataParallel(g, p.topo), expertStrategy(g, p.topo),
          modelParallel(g, p.topo)}) {
      auto e = evaluate(p, s);
      if (!e)
        return e.takeError();
      if (e->second && e->first < best_.iterationTime) {
        best_.iterationTime = e->first;
        best_.strategy = s;
      }
    }
    // A short seeded MCMC run usually starts the search from a much better
    // bound than the baselines; it changes how much is pruned and, among
    // equally fast strategies, which one is returned, never the time.
    if (const SearcherInfo *mcmc =
            SearcherRegistry::instance().lookup("mcmc")) {
      SearchOptions mo = o;
      // At most kIncumbentProposals, and with a budget of simulated
      // strategies, not much more than the search itself may simulate.
      uint64_t proposals = kIncumbentProposals;
      if (o.budget.proposals)
        proposals = std::min(proposals, 50 * o.budget.proposals);
      mo.budget = Budget{proposals, 0};
      mo.progress = nullptr;
      auto r = mcmc->create()->search(p, mo);
      if (r && r->iterationTime < best_.iterationTime) {
        best_.iterationTime = r->iterationTime;
        best_.strategy = r->strategy;
      } else if (!r) {
        llvm::consumeError(r.takeError()); // no feasible plan: no bound
      }
    }
    p_ = &p;
    o_ = &o;
    n_ = n;
    start_ = std::chrono::steady_clock::now();
    stopped_ = false;
    leaves_ = 0;
    nodes_ = 0;
    bounded_ = 0;
    current_.configs.assign(g.numOps(), OpConfig());
    load_.assign(n, 0);
    chosen_.assign(g.numOps(), nullptr);
    Seconds root = chainBound(0);
    root = std::max({root, releaseBound(0), minWorkAfter_[0] / double(n)});
    spdlog::info("exhaustive: lower bound {:.4f} ms, best known {:.4f} ms",
                 root * 1e3, best_.iterationTime * 1e3);
    if (auto err = dfs(0, 0))
      return llvm::Error(std::move(err));
    best_.proposals = leaves_;
    if (!std::isfinite(best_.iterationTime) && best_.timedOut)
      return llvm::make_error<DeadlineExceeded>("exhaustive");
    if (!std::isfinite(best_.iterationTime))
      return makeError(ExitCode::Infeasible,
                       "{}: exhaustive search found no strategy that fits in "
                       "device memory",
                       g.sourcePath);
    if (stopped_)
      spdlog::warn("exhaustive: budget exhausted after {} simulated "
                   "strategies and {} bounded partial ones; the result is "
                   "not proven optimal",
                   leaves_, bounded_);
    else
      spdlog::info("exhaustive: optimal after {} simulated strategies",
                   leaves_);
    best_.provenOptimal = !stopped_;
    return best_;
  }

private:
  bool outOfBudget() {
    return (o_->budget.proposals && leaves_ >= o_->budget.proposals) ||
           outOfTime();
  }

  /// The seconds budget or the deadline passed.
  bool outOfTime() {
    if (o_->budget.seconds > 0 &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_)
                .count() > o_->budget.seconds)
      return true;
    if (o_->pastDeadline()) {
      best_.timedOut = true;
      return true;
    }
    return false;
  }

  llvm::Error dfs(size_t op, Seconds work) {
    if (stopped_)
      return llvm::Error::success();
    // The seconds budget and the deadline hold where the bounds prune
    // every branch short of a leaf too.
    if ((++nodes_ & 4095) == 0 && outOfTime()) {
      stopped_ = true;
      return llvm::Error::success();
    }
    if (op == choices_.size()) {
      if (outOfBudget()) {
        stopped_ = true;
        return llvm::Error::success();
      }
      ++leaves_;
      auto e = evaluate(*p_, current_);
      if (!e)
        return e.takeError();
      if (e->second && e->first < best_.iterationTime) {
        best_.iterationTime = e->first;
        best_.strategy = current_;
      }
      return llvm::Error::success();
    }
    for (const Choice &c : choices_[op]) {
      // A budget of proposals bounds the partial strategies too (where the
      // bounds prune every branch a few ops short of a leaf, a handful of
      // leaves can take minutes): deterministic, as proposals are.
      ++bounded_;
      if (o_->budget.proposals &&
          bounded_ > o_->budget.proposals * kBoundsPerProposal) {
        stopped_ = true;
        return llvm::Error::success();
      }
      Seconds busiest = 0;
      for (DeviceId d = 0; d < n_; ++d)
        busiest = std::max(busiest, load_[d]);
      for (auto &[d, s] : c.load)
        busiest = std::max(busiest, load_[d] + s);
      chosen_[op] = &c;
      Seconds bound = std::max(
          {busiest,
           (work + c.work + minWorkAfter_[op + 1]) / static_cast<double>(n_),
           chainBound(op + 1)});
      if (bound < best_.iterationTime)
        bound = std::max(bound, releaseBound(op + 1));
      if (bound >= best_.iterationTime)
        continue;
      for (auto &[d, s] : c.load)
        load_[d] += s;
      current_.configs[op] = c.config;
      llvm::Error err = dfs(op + 1, work + c.work);
      for (auto &[d, s] : c.load)
        load_[d] -= s;
      if (err || stopped_)
        return err;
    }
    return llvm::Error::success();
  }

  /// The longest dependency chain: on a path o1 -> ... -> ok of ops,
  /// fwd(o1) .. fwd(ok) then bwd(ok) .. bwd(oj) run one after another (of
  /// an op with weights its backward-data: ConfigCost::bwd), and then oj's
  /// weight gradients are all-reduced and its weights updated.
  /// So the iteration takes at least, for every op oj, the longest forward
  /// path into it, plus the longest fwd+bwd path out of it, plus its tail,
  /// each op at its quickest tile: ops below `assigned` as chosen, later
  /// ones at their best over every configuration.
  Seconds chainBound(size_t assigned) {
    size_t n = choices_.size();
    auto at = [&](size_t o) -> const Choice & {
      return o < assigned ? *chosen_[o] : minChoice_[o];
    };
    fwdTo_.assign(n, 0);
    for (size_t o = 0; o < n; ++o)
      for (OpId p : preds_[o])
        fwdTo_[o] = std::max(fwdTo_[o], fwdTo_[p] + at(p).cost.fwd);
    chainFrom_.assign(n, 0);
    Seconds longest = 0;
    for (size_t o = n; o-- > 0;) {
      Seconds out = 0;
      for (OpId s : succs_[o])
        out = std::max(out, chainFrom_[s]);
      chainFrom_[o] = at(o).chain + out;
      longest = std::max(longest, fwdTo_[o] + chainFrom_[o] + at(o).cost.tail);
    }
    return longest;
  }

  /// One machine runs jobs one at a time and none before its release
  /// time, so it finishes no sooner than max over r of (r + the work of
  /// the jobs released at r or later). The jobs are each op's forward,
  /// backward and update work, released at the earliest time the chains
  /// allow (forward: the longest forward path in; backward: that plus the
  /// op's forward and the longest fwd+bwd path out; updates: that plus the
  /// op's backward and its quickest all-reduce). Applied per device to the
  /// ops already chosen, and to all devices together (work over N) with
  /// later ops at their least work. Uses fwdTo_ and chainFrom_ as
  /// chainBound(assigned) left them.
  Seconds releaseBound(size_t assigned) {
    size_t n = choices_.size();
    jobs_.assign(n_ + 1, {});
    for (size_t o = 0; o < n; ++o) {
      const Choice &c = o < assigned ? *chosen_[o] : minChoice_[o];
      Seconds out = chainFrom_[o] - c.chain;
      Seconds rel[NumPhases];
      rel[Fwd] = fwdTo_[o];
      rel[Bwd] = rel[Fwd] + c.cost.fwd + out;
      rel[Upd] = rel[Bwd] + c.cost.bwd + c.cost.sync;
      for (int f = 0; f < NumPhases; ++f)
        jobs_[n_].push_back({rel[f], c.cost.work[f] / static_cast<double>(n_)});
      if (o < assigned)
        for (auto &[d, pl] : c.cost.load)
          for (int f = 0; f < NumPhases; ++f)
            if (pl[f] > 0)
              jobs_[d].push_back({rel[f], pl[f]});
    }
    Seconds bound = 0;
    for (auto &js : jobs_) {
      std::sort(js.begin(), js.end());
      Seconds after = 0;
      for (size_t i = js.size(); i-- > 0;) {
        after += js[i].second;
        bound = std::max(bound, js[i].first + after);
      }
    }
    return bound;
  }

  std::vector<std::vector<std::pair<Seconds, Seconds>>> jobs_;
  std::vector<std::vector<Choice>> choices_;
  std::vector<std::vector<OpId>> preds_, succs_;
  std::vector<Choice> minChoice_;
  std::vector<Seconds> fwdTo_, chainFrom_;
  std::vector<const Choice *> chosen_;
  std::vector<Seconds> minWorkAfter_;
  SearchResult best_;
  Strategy current_;
  std::vector<Seconds> load_;
  const SearchProblem *p_ = nullptr;
  const SearchOptions *o_ = nullptr;
  size_t n_ = 0;
  uint64_t leaves_ = 0;
  uint64_t nodes_ = 0;   ///< dfs() calls, for the budget checks
  uint64_t bounded_ = 0; ///< partial strategies bounded
  bool stopped_ = false;
  std::chrono::steady_clock::time_point start_;
};

} // namespace

void registerExhaustiveSearcher(SearcherRegistry &r) {
  r.add({"exhaustive",
         "exact branch and bound over every op's configurations (small "
         "graphs); says when the budget ends before optimality is proven",
         [] { return std::make_unique<Exhaustive>(); },
         /*readsTimeBudget=*/true});
}

} // namespace soap
