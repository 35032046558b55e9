// Exact search by depth-first branch and bound (FlexFlow section 8.3 used
// DFS with A* pruning) over the configurations of every op, for small
// graphs: it measures how far other searchers are from the optimum.
//
// The bound is admissible: devices run their tasks one at a time, so the
// iteration time is at least the busiest device's compute (forward,
// backward) and at least the total compute divided by the device count;
// ops not yet assigned contribute their cheapest total compute. Leaves are
// simulated in full. The search stops at the budget (leaves simulated or
// seconds) and then reports that optimality is not proven.
#include "soap/Parallel/BuiltinStrategies.h"
#include "soap/Search/Searcher.h"
#include "soap/Support/Error.h"
#include <chrono>
#include <spdlog/spdlog.h>
#include <cmath>

namespace soap {

namespace {

struct Choice {
  OpConfig config;
  std::vector<std::pair<DeviceId, Seconds>> load; ///< per device it uses
  Seconds work = 0;                               ///< summed over tiles
  /// The quickest tile's forward plus the quickest tile's backward: every
  /// dependency chain through the op pays at least this.
  Seconds chain = 0;
};

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
        Choice ch;
        std::map<DeviceId, Seconds> load;
        Seconds minFwd = std::numeric_limits<double>::infinity();
        Seconds minBwd = minFwd;
        for (int64_t k = 0; k < c.numTiles(); ++k) {
          auto t = p.cost.kernel(g, op, c.tile(op.sem, k));
          if (!t)
            return t.takeError();
          minFwd = std::min(minFwd, t->forward);
          minBwd = std::min(minBwd, t->backward());
          for (int32_t r = 0; r < c.replicas; ++r) {
            load[c.device(k, r)] += t->forward + t->backward();
            ch.work += t->forward + t->backward();
          }
        }
        ch.load.assign(load.begin(), load.end());
        ch.chain = minFwd + minBwd;
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
    preds_.assign(g.numOps(), {});
    minChain_.assign(g.numOps(), 0);
    for (const Op &op : g.ops()) {
      for (ValueId v : op.inputs)
        if (v != kNoValue && g.value(v).producer >= 0)
          preds_[op.id].push_back(g.value(v).producer);
      Seconds m = std::numeric_limits<double>::infinity();
      for (const Choice &c : choices_[op.id])
        m = std::min(m, c.chain);
      minChain_[op.id] = m;
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
    for (const Strategy &s : {dataParallel(g, p.topo), expertStrategy(g, p.topo),
                              modelParallel(g, p.topo)}) {
      auto e = evaluate(p, s);
      if (!e)
        return e.takeError();
      if (e->second && e->first < best_.iterationTime) {
        best_.iterationTime = e->first;
        best_.strategy = s;
      }
    }
    p_ = &p;
    o_ = &o;
    n_ = n;
    start_ = std::chrono::steady_clock::now();
    stopped_ = false;
    leaves_ = 0;
    current_.configs.assign(g.numOps(), OpConfig());
    load_.assign(n, 0);
    if (auto err = dfs(0, 0))
      return llvm::Error(std::move(err));
    best_.proposals = leaves_;
    if (!std::isfinite(best_.iterationTime))
      return makeError(ExitCode::Infeasible,
                       "{}: exhaustive search found no strategy that fits in "
                       "device memory",
                       g.sourcePath);
    if (stopped_)
      spdlog::warn("exhaustive: budget exhausted after {} simulated "
                   "strategies; the result is not proven optimal",
                   leaves_);
    else
      spdlog::info("exhaustive: optimal after {} simulated strategies",
                   leaves_);
    best_.provenOptimal = !stopped_;
    return best_;
  }

private:
  bool outOfBudget() {
    if (o_->budget.proposals && leaves_ >= o_->budget.proposals)
      return true;
    if (o_->budget.seconds > 0 &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                      start_)
                .count() > o_->budget.seconds)
      return true;
    return false;
  }

  llvm::Error dfs(size_t op, Seconds work) {
    if (stopped_)
      return llvm::Error::success();
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
      Seconds busiest = 0;
      for (DeviceId d = 0; d < n_; ++d)
        busiest = std::max(busiest, load_[d]);
      for (auto &[d, s] : c.load)
        busiest = std::max(busiest, load_[d] + s);
      chosen_[op] = &c;
      Seconds bound = std::max({busiest,
                                (work + c.work + minWorkAfter_[op + 1]) /
                                    static_cast<double>(n_),
                                chainBound(op)});
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

  /// The longest dependency chain: a path o1 -> ... -> ok of ops runs
  /// fwd(o1) .. fwd(ok) then bwd(ok) .. bwd(o1), one after another, so the
  /// iteration takes at least the largest sum over a path of each op's
  /// quickest tile (ops up to `upTo` as chosen, later ones at their best).
  Seconds chainBound(size_t upTo) {
    Seconds longest = 0;
    chainTo_.assign(choices_.size(), 0);
    for (size_t o = 0; o < choices_.size(); ++o) {
      Seconds in = 0;
      for (OpId p : preds_[o])
        in = std::max(in, chainTo_[p]);
      chainTo_[o] = in + (o <= upTo ? chosen_[o]->chain : minChain_[o]);
      longest = std::max(longest, chainTo_[o]);
    }
    return longest;
  }

  std::vector<std::vector<Choice>> choices_;
  std::vector<std::vector<OpId>> preds_;
  std::vector<Seconds> minChain_, chainTo_;
  std::vector<const Choice *> chosen_;
  std::vector<Seconds> minWorkAfter_;
  SearchResult best_;
  Strategy current_;
  std::vector<Seconds> load_;
  const SearchProblem *p_ = nullptr;
  const SearchOptions *o_ = nullptr;
  size_t n_ = 0;
  uint64_t leaves_ = 0;
  bool stopped_ = false;
  std::chrono::steady_clock::time_point start_;
};

} // namespace

void registerExhaustiveSearcher(SearcherRegistry &r) {
  r.add({"exhaustive",
         "exact branch and bound over every op's configurations (small "
         "graphs); says when the budget ends before optimality is proven",
         [] { return std::make_unique<Exhaustive>(); }});
}

} // namespace soap
