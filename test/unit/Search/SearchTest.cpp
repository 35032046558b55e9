// Searchers: mcmc is never slower than the baselines it starts from, its
// result does not depend on the thread count, budgets parse, the registry
// names unknown searchers.
#include "../TestInputs.h"
#include "soap/Parallel/ConfigSpace.h"
#include "soap/Search/Driver.h"
#include "soap/Support/Error.h"
#include <catch2/catch.hpp>
#include <csignal>
#include <functional>
#include <utility>

using namespace soap;
using namespace soap::test;

namespace {
struct Fixture {
  std::unique_ptr<Graph> graph;
  Topology topo;
  std::unique_ptr<CostModel> cost;
  std::unique_ptr<CollectiveModel> coll;
  SearchProblem problem() const { return {*graph, topo, *cost, *coll}; }
};

Fixture fixture(const std::string &model, const std::string &topoName,
                int64_t batch) {
  Fixture f{zooModel(model, batch), exampleTopology(topoName), nullptr,
            nullptr};
  f.cost = std::make_unique<CostModel>(f.topo.deviceSpec(), nullptr,
                                       CostMode::Analytic);
  f.coll = std::make_unique<CollectiveModel>(f.topo);
  return f;
}
} // namespace

TEST_CASE("budgets parse as proposals or durations", "[Search]") {
  auto a = Budget::parse("20000");
  REQUIRE(static_cast<bool>(a));
  CHECK(a->proposals == 20000);
  auto b = Budget::parse("30s");
  REQUIRE(static_cast<bool>(b));
  CHECK(b->seconds == 30);
  auto c = Budget::parse("500ms");
  REQUIRE(static_cast<bool>(c));
  CHECK(c->seconds == Approx(0.5));
  auto d = Budget::parse("soon");
  REQUIRE_FALSE(static_cast<bool>(d));
  CHECK(errorMessage(d.takeError()).find("--budget 'soon'") == 0);
}

TEST_CASE("an interrupt ends a search as its deadline would, marked "
          "interrupted",
          "[Search][Interrupt]") {
  Fixture f = fixture("lenet", "p100-4x4", 256);
  SearchOptions o;
  o.budget.proposals = 100000000; // hours, but for the interrupt
  o.threads = 1;
  // SIGTERM at its default whatever ran this test, so that the scope
  // handles it (one ignored on entry would stay ignored).
  struct Default {
    struct sigaction before;
    Default() {
      struct sigaction dfl = {};
      dfl.sa_handler = SIG_DFL;
      sigemptyset(&dfl.sa_mask);
      sigaction(SIGTERM, &dfl, &before);
    }
    ~Default() { sigaction(SIGTERM, &before, nullptr); }
  } atDefault;
  {
    InterruptScope scope;
    bool sent = false;
    // The first progress report comes from a running chain.
    o.progress = [&sent](const SearchProgress &) {
      if (!std::exchange(sent, true))
        std::raise(SIGTERM);
    };
    auto r = runSearch(f.problem(), "mcmc", o);
    if (!r)
      FAIL(errorMessage(r.takeError()));
    CHECK(sent);
    CHECK(r->interrupted);
    CHECK_FALSE(r->timedOut);
    CHECK_FALSE(r->budgetEnded);
    CHECK(r->fallback.empty());
    CHECK(r->result.proposals > 0);
    CHECK(r->result.proposals < 100000);
    CHECK(r->metrics.fits);
  }
  CHECK_FALSE(interruptRequested()); // the scope ended
}

TEST_CASE("mcmc is never slower than data, model or expert", "[Search]") {
  for (const char *model : {"lenet", "alexnet", "rnntc"}) {
    Fixture f = fixture(model, "p100-4x4", 256);
    SearchOptions o;
    o.budget.proposals = 800;
    auto mc = runSearch(f.problem(), "mcmc", o);
    if (!mc)
      FAIL(errorMessage(mc.takeError()));
    for (const char *base : {"data", "model", "expert"}) {
      auto b = runSearch(f.problem(), base, o);
      if (!b) { // a baseline that does not fit is no bar
        llvm::consumeError(b.takeError());
        continue;
      }
      INFO(model << " vs " << base);
      CHECK(mc->metrics.iterationTime <= b->metrics.iterationTime);
    }
    CHECK(mc->metrics.fits);
  }
}

TEST_CASE("a built-in strategy whose task graph passes the task limit is "
          "refused in one line, not built",
          "[Search]") {
  Fixture f = fixture("lenet", "p100-4x4", 256);
  SearchProblem p = f.problem();
  SearchOptions o;
  auto fine = runSearch(p, "balanced", o);
  if (!fine)
    FAIL(errorMessage(fine.takeError()));
  p.maxTasks = 50;
  auto r = runSearch(p, "balanced", o);
  REQUIRE_FALSE(static_cast<bool>(r));
  std::string message;
  ExitCode code = ExitCode::Ok;
  llvm::handleAllErrors(r.takeError(), [&](const SoapError &e) {
    code = e.code();
    message = e.text();
  });
  CHECK(code == ExitCode::Infeasible);
  CHECK(message.find("the balanced strategy's task graph has more than 50 "
                     "tasks on 16 devices, too many to simulate") !=
        std::string::npos);
}

TEST_CASE("the thread count does not change mcmc's result", "[Search]") {
  Fixture f = fixture("lenet", "dgx-h100-1", 128);
  SearchOptions o;
  o.budget.proposals = 1200;
  o.chains = 2;
  o.seed = 42;
  o.threads = 1;
  auto one = runSearch(f.problem(), "mcmc", o);
  o.threads = 2;
  auto two = runSearch(f.problem(), "mcmc", o);
  REQUIRE(static_cast<bool>(one));
  REQUIRE(static_cast<bool>(two));
  CHECK(one->result.strategy == two->result.strategy);
  CHECK(one->metrics.iterationTime == two->metrics.iterationTime);
  o.seed = 43;
  auto other = runSearch(f.problem(), "mcmc", o);
  REQUIRE(static_cast<bool>(other));
}

TEST_CASE("early rejection does not change mcmc's chain", "[Search]") {
  // Rejections decided before the simulation ends (on memory, or on a
  // makespan bound past the threshold) must be the rejections the finished
  // simulation would have made: same proposals, same plan.
  for (const char *model : {"alexnet", "rnntc"}) {
    Fixture f = fixture(model, "p100-4x4", 256);
    SearchOptions o;
    o.budget.proposals = 1500;
    o.seed = 7;
    auto early = runSearch(f.problem(), "mcmc", o);
    o.earlyRejection = false;
    auto full = runSearch(f.problem(), "mcmc", o);
    REQUIRE(static_cast<bool>(early));
    REQUIRE(static_cast<bool>(full));
    INFO(model);
    CHECK(early->result.strategy == full->result.strategy);
    CHECK(early->result.proposals == full->result.proposals);
    CHECK(early->result.accepted == full->result.accepted);
    CHECK(early->metrics.iterationTime == full->metrics.iterationTime);
    CHECK(full->result.rejectedEarly == 0);
    CHECK(early->result.rejectedEarly > 0);
  }
}

TEST_CASE("unknown searchers are named with the registered ones", "[Search]") {
  Fixture f = fixture("lenet", "dgx-h100-1", 64);
  auto r = runSearch(f.problem(), "annealing", SearchOptions());
  REQUIRE_FALSE(static_cast<bool>(r));
  CHECK(errorMessage(r.takeError()) ==
        "unknown searcher 'annealing'; the searchers are: balanced, data, "
        "exhaustive, "
        "expert, ft, kcuts, mcmc, megatron, model, pipeline");
}

TEST_CASE("exhaustive search finds the brute-force optimum", "[Search]") {
  // x[8,6] -> MatMul(w1[6,4]) -> Relu -> MatMul(w2[4,4]) on 2 GPUs: small
  // enough to simulate every strategy of the space, big enough that the
  // bounds (chains with weight all-reduces and updates, release times)
  // prune.
  Json doc = Json::parse(R"({"name": "two", "device": "P100-SXM2",
    "nodes": 1, "node": {"gpus": 2, "intra": {"kind": "nvlink",
    "bandwidth_gbps": 160, "latency_us": 0.5, "connections": "all-to-all"},
    "pcie": {"bandwidth_gbps": 126, "latency_us": 0.5}}})");
  auto topo = parseTopology(doc, "two.json");
  if (!topo)
    FAIL(errorMessage(topo.takeError()));
  Graph g;
  g.sourcePath = "tiny.onnx";
  auto value = [&](std::vector<int64_t> shape, ValueKind kind) {
    Value v;
    v.name = "v" + std::to_string(g.numValues());
    v.shape = TensorShape(shape);
    v.kind = kind;
    if (kind == ValueKind::Input)
      v.dimClasses = {DimClass::Sample, DimClass::Attribute};
    return g.addValue(v);
  };
  auto op = [&](const char *kind, std::vector<ValueId> in, ValueId out) {
    Op o;
    o.kind = kind;
    o.name = std::string(kind) + std::to_string(g.numOps());
    o.inputs = std::move(in);
    o.outputs = {out};
    g.addOp(o);
  };
  ValueId x = value({8, 6}, ValueKind::Input);
  ValueId w1 = value({6, 4}, ValueKind::Weight);
  ValueId w2 = value({4, 4}, ValueKind::Weight);
  ValueId y = value({8, 4}, ValueKind::Activation);
  ValueId z = value({8, 4}, ValueKind::Activation);
  ValueId u = value({8, 4}, ValueKind::Activation);
  op("MatMul", {x, w1}, y);
  op("Relu", {y}, z);
  op("MatMul", {z, w2}, u);
  g.outputs = {u};
  if (auto err = g.computeSemantics())
    FAIL(errorMessage(std::move(err)));
  CostModel cost(topo->deviceSpec(), nullptr, CostMode::Analytic);
  CollectiveModel coll(*topo);
  SearchProblem p{g, *topo, cost, coll};
  SearchOptions o;
  o.budget.proposals = 1000000;
  o.space.kind = SpaceKind::Full;
  // Brute force over the same space.
  ConfigSpace space(g, *topo, o.space);
  Seconds best = std::numeric_limits<double>::infinity();
  Strategy s;
  s.configs.resize(g.numOps());
  size_t count = 0;
  std::function<void(OpId)> all = [&](OpId i) {
    if (i == static_cast<OpId>(g.numOps())) {
      auto e = evaluate(p, s);
      REQUIRE(static_cast<bool>(e));
      ++count;
      if (e->second)
        best = std::min(best, e->first);
      return;
    }
    for (const OpConfig &c : space.enumerate(i)) {
      s.configs[i] = c;
      all(i + 1);
    }
  };
  all(0);
  auto ex = runSearch(p, "exhaustive", o);
  if (!ex)
    FAIL(errorMessage(ex.takeError()));
  CHECK(ex->metrics.iterationTime == best);
  CHECK(ex->result.provenOptimal);
  // The bounds pruned: fewer strategies simulated than exist.
  CHECK(ex->result.proposals < count);
}
