// The built-in strategies as searchers: data, model and expert parallelism.
// They search nothing; they are the baselines every searcher is compared to.
#include "soap/Parallel/BuiltinStrategies.h"
#include "soap/Search/Searcher.h"
#include "soap/Support/Error.h"

namespace soap {

namespace {
class BuiltinSearcher : public Searcher {
public:
  explicit BuiltinSearcher(std::string name) : name_(std::move(name)) {}
  llvm::Expected<SearchResult> search(const SearchProblem &p,
                                      const SearchOptions &) override {
    auto s = builtinStrategy(name_, p.graph, p.topo);
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
  r.add({"expert",
         "expert-designed: Krizhevsky's one weird trick for CNNs, GNMT's "
         "layer-per-GPU for RNNs, else data parallel",
         [] { return std::make_unique<BuiltinSearcher>("expert"); }});
}

} // namespace soap
