// The built-in strategies as searchers: data, model and expert parallelism,
// and the balanced strategy. They search nothing; they are the baselines
// every searcher is compared to.
#include "ConfigCost.h"
#include "soap/Parallel/BuiltinStrategies.h"
#include "soap/Search/Searcher.h"
#include "soap/Support/Error.h"
#include <optional>

namespace soap {

llvm::Expected<Strategy> balancedStrategy(const SearchProblem &p,
                                          const ConfigSpace &space) {
  Strategy s;
  int64_t n = static_cast<int64_t>(p.topo.numDevices());
  for (const Op &op : p.graph.ops()) {
    int64_t most = 0;
    for (const auto &[degree, replicas] : space.shapes(op.id)) {
      OpConfig c{degree, replicas, {}};
      if (c.numTasks() <= n)
        most = std::max(most, c.numTasks());
    }
    std::optional<OpConfig> best;
    Seconds bestScore = 0;
    for (const auto &[degree, replicas] : space.shapes(op.id)) {
      OpConfig c{degree, replicas, {}};
      if (c.numTasks() != most)
        continue;
      c.devices = space.placements(most).front();
      auto cc = configCost(p, op, c);
      if (!cc)
        return cc.takeError();
      Seconds score = cc->busiest() + cc->tail;
      if (!best || score < bestScore) {
        best = std::move(c);
        bestScore = score;
      }
    }
    s.configs.push_back(std::move(*best));
  }
  return s;
}

namespace {
class BuiltinSearcher : public Searcher {
public:
  explicit BuiltinSearcher(std::string name) : name_(std::move(name)) {}
  llvm::Expected<SearchResult> search(const SearchProblem &p,
                                      const SearchOptions &o) override {
    llvm::Expected<Strategy> s =
        name_ == "balanced"
            ? balancedStrategy(p, ConfigSpace(p.graph, p.topo, o.space))
            : builtinStrategy(name_, p.graph, p.topo);
    if (!s)
      return s.takeError();
    auto e = evaluate(p, *s);
    if (!e)
      return e.takeError();
    if (!e->second)
      return makeError(ExitCode::Infeasible,
                       "{}: the {} strategy does not fit in device memory",
                       p.graph.sourcePath, name_);
    SearchResult r;
    r.strategy = std::move(*s);
    r.iterationTime = e->first;
    return r;
  }

private:
  std::string name_;
};
} // namespace

void registerBaselineSearchers(SearcherRegistry &r) {
  r.add({"data", "data parallelism: every op split by sample over all devices",
         [] { return std::make_unique<BuiltinSearcher>("data"); }});
  r.add({"model",
         "model parallelism: ops whole, consecutive ops on devices 0..N-1 "
         "with equal forward FLOPs",
         [] { return std::make_unique<BuiltinSearcher>("model"); }});
  r.add({"balanced",
         "every op split over all devices, each at the split whose busiest "
         "device works least (with its weight all-reduce)",
         [] { return std::make_unique<BuiltinSearcher>("balanced"); }});
  r.add({"expert",
         "expert-designed: Krizhevsky's one weird trick for CNNs, GNMT's "
         "layer-per-GPU for RNNs, else data parallel",
         [] { return std::make_unique<BuiltinSearcher>("expert"); }});
}

} // namespace soap
