// The simulator: delta simulation gives exactly the timeline of a full
// simulation after random single-op changes; hand-checked task graphs.
#include "../IR/TestGraphs.h"
#include "../TestInputs.h"

#include "soap/Import/OnnxImporter.h"
#include "soap/Machine/TopologyLoader.h"
#include "soap/Parallel/BuiltinStrategies.h"
#include "soap/Sim/Simulator.h"
#include "soap/Support/Rng.h"
#include <catch2/catch.hpp>

using namespace soap;
using namespace soap::test;

namespace {

/// A random legal configuration: a few loops split by divisors, tiles on a
/// random contiguous run of devices (independent of lib/Parallel's space).
OpConfig randomConfig(const OpSemantics &sem, size_t devices, Rng &rng) {
  OpConfig c;
  c.degree.assign(sem.loops.size(), 1);
  int64_t tiles = 1;
  for (int tries = 0; tries < 3; ++tries) {
    size_t l = rng.uniform(sem.loops.size());
    const LoopDim &loop = sem.loops[l];
    if (!loop.splittable || c.degree[l] > 1)
      continue;
    std::vector<int32_t> ok;
    for (int32_t d = 2; d <= 8 && tiles * d <= int64_t(devices); ++d)
      if (loop.size % d == 0 && (loop.size / d) % loop.granule == 0)
        ok.push_back(d);
    if (ok.empty())
      continue;
    c.degree[l] = ok[rng.uniform(ok.size())];
    tiles *= c.degree[l];
  }
  if (rng.uniform(4) == 0 && tiles * 2 <= int64_t(devices))
    c.replicas = 2;
  int64_t tasks = tiles * c.replicas;
  uint64_t start = rng.uniform(devices - tasks + 1);
  for (int64_t i = 0; i < tasks; ++i)
    c.devices.push_back(static_cast<DeviceId>(start + i));
  return c;
}

/// Every alive task's (key -> start, end).
std::map<std::tuple<uint8_t, uint32_t, uint32_t, uint64_t>,
         std::pair<Seconds, Seconds>>
timeline(const TaskGraph &tg) {
  std::map<std::tuple<uint8_t, uint32_t, uint32_t, uint64_t>,
           std::pair<Seconds, Seconds>>
      m;
  for (const Task &t : tg.tasks())
    if (t.alive)
      m[{t.key.kind, t.key.a, t.key.b, t.key.c}] = {t.start, t.end};
  return m;
}

/// Strategy `s` with op `o` at `c` (and its weight-gradient order).
void commit(Strategy &s, OpId o, const OpConfig &c,
            std::optional<WeightGradOrder> order, size_t numOps) {
  s.configs[o] = c;
  if (order) {
    if (s.weightGrad.empty())
      s.weightGrad.assign(numOps, 0);
    s.weightGrad[size_t(o)] = uint8_t(*order);
  }
}

void deltaEqualsFull(const std::string &model, int64_t batch,
                     const std::string &topoName, int steps, uint64_t seed) {
  auto g = zooModel(model, batch);
  Topology topo = exampleTopology(topoName);
  CostModel cost(topo.deviceSpec(), nullptr, CostMode::Analytic);
  CollectiveModel coll(topo);
  SimContext ctx{*g, topo, cost, coll, Optimizer::Sgd};
  Strategy s;
  for (const Op &o : g->ops())
    s.configs.push_back(OpConfig::single(o.sem, 0));
  auto tg = TaskGraph::build(ctx, s);
  if (!tg)
    FAIL(errorMessage(tg.takeError()));
  Simulator sim(*tg);
  sim.simulateFull();
  Rng rng(seed, "delta");
  for (int step = 0; step < steps; ++step) {
    OpId o = static_cast<OpId>(rng.uniform(g->numOps()));
    OpConfig c = randomConfig(g->op(o).sem, topo.numDevices(), rng);
    // One change in four on an op whose weight gradients can wait for
    // different ops changes only when they run (mcmc's order moves).
    std::optional<WeightGradOrder> order;
    std::vector<WeightGradOrder> orders = tg->weightGradOrders(o);
    if (orders.size() > 1 && rng.uniform(4) == 0) {
      order = orders[rng.uniform(orders.size())];
      c = tg->strategy().configs[o];
    }
    // Modes 1, 3 and 4 take the change back (a rejected MCMC proposal):
    // the timeline must then be the old strategy's, exactly. Modes 2 and 3
    // simulate with a limit near the current time (mcmc's early
    // rejection): stopped, the change is taken back (3) or simulated on to
    // the end (2). Mode 4 takes it back unsimulated (mcmc's rejection on
    // memory). Mode 5 stops it below the current time and leaves it: the
    // next change's stage() must finish it first.
    int mode = int(rng.uniform(6));
    Seconds limit = sim.iterationTime() * (0.9 + 0.2 * rng.uniformReal());
    std::optional<Seconds> t;
    bool undo = mode == 1 || mode == 3 || mode == 4, stopped = false;
    std::string then;
    if (mode == 4) {
      requireOk(sim.stage(o, c, order));
    } else if (mode == 5) {
      requireOk(sim.stage(o, c, order));
      (void)sim.resume(limit * 0.9);
      commit(s, o, c, order, g->numOps());
      o = static_cast<OpId>(rng.uniform(g->numOps()));
      c = randomConfig(g->op(o).sem, topo.numDevices(), rng);
      order.reset();
      then = " then " + g->op(o).name;
      auto applied = sim.apply(o, c);
      if (!applied)
        FAIL(errorMessage(applied.takeError()));
      t = *applied;
    } else if (mode < 2) {
      auto applied = sim.apply(o, c, order);
      if (!applied)
        FAIL(errorMessage(applied.takeError()));
      t = *applied;
    } else {
      requireOk(sim.stage(o, c, order));
      t = sim.resume(limit);
      stopped = !t;
      if (t)
        undo = false;
      else if (!undo)
        t = sim.resume();
    }
    if (undo) {
      requireOk(sim.undo());
      t = sim.iterationTime();
    } else {
      commit(s, o, c, order, g->numOps());
    }
    auto fresh = TaskGraph::build(ctx, s);
    if (!fresh)
      FAIL(errorMessage(fresh.takeError()));
    Simulator full(*fresh);
    Seconds ft = full.simulateFull();
    INFO(model << " step " << step << " op " << g->op(o).name << " "
               << c.str(g->op(o).sem)
               << (order ? " weight gradients " +
                               weightGradOrderName(*order).str()
                         : "")
               << then << (undo ? " (undone)" : ""));
    REQUIRE(tg->strategy().weightGrad.empty() ==
            std::all_of(s.weightGrad.begin(), s.weightGrad.end(),
                        [](uint8_t v) { return v == 0; }));
    REQUIRE(*t == ft);
    // A stop is a proof that the makespan passes the limit.
    if (stopped && !undo)
      REQUIRE(ft > limit);
    REQUIRE(timeline(*tg) == timeline(*fresh));
    // Memory is kept incrementally; it must equal a fresh count.
    for (DeviceId d = 0; d < topo.numDevices(); ++d) {
      const auto &a = tg->memory()[d], &b = fresh->memory()[d];
      REQUIRE(a.weights == b.weights);
      REQUIRE(a.saved == b.saved);
      REQUIRE(a.buffers == b.buffers);
      REQUIRE(a.workspace == b.workspace);
      REQUIRE(a.total() == b.total());
    }
    REQUIRE(tg->fits() == fresh->fits());
  }
}

} // namespace

TEST_CASE("delta simulation equals full simulation on lenet", "[Sim]") {
  deltaEqualsFull("lenet", 64, "p100-4x4", 150, 1);
}

TEST_CASE("delta simulation equals full simulation on an unrolled RNN",
          "[Sim]") {
  deltaEqualsFull("rnntc", 32, "dgx-h100-1", 60, 2);
}

static const char *kZoo[] = {"lenet",     "alexnet",      "vgg16",
                             "resnet101", "inception_v3", "wide_resnet101_2",
                             "mlp",       "rnntc",        "rnnlm",
                             "nmt",       "transformer",  "gpt2"};

TEST_CASE("delta equals full on every zoo model, p100-4x4 and dgx-h100-2",
          "[Sim][zoo]") {
  // Small batches keep this quick; the soak test below runs thousands.
  uint64_t seed = 10;
  for (const char *m : kZoo)
    for (const char *t : {"p100-4x4", "dgx-h100-2"})
      deltaEqualsFull(m, 16, t, 12, seed++);
}

TEST_CASE("soak: delta equals full over thousands of changes", "[.soak]") {
  // Run by hand: build/bin/soap-unit-tests "[.soak]"
  uint64_t seed = 100;
  for (const char *m : kZoo)
    for (const char *t : {"p100-4x4", "dgx-h100-2"})
      deltaEqualsFull(m, 64, t, 400, seed++);
}

TEST_CASE("a full simulation with a limit stops only past it", "[Sim]") {
  // Searchers simulate a candidate with the time it must beat
  // (fitMicroBatches): stopped means slower than the limit, and a run that
  // is not stopped is the whole timeline.
  for (const char *model : {"lenet", "transformer_small"}) {
    INFO(model);
    auto g = zooModel(model, 64);
    Topology topo = exampleTopology("p100-4x4");
    CostModel cost(topo.deviceSpec(), nullptr, CostMode::Analytic);
    CollectiveModel coll(topo);
    SimContext ctx{*g, topo, cost, coll, Optimizer::Sgd};
    auto s = builtinStrategy("expert", *g, topo);
    if (!s)
      FAIL(errorMessage(s.takeError()));
    auto tg = TaskGraph::build(ctx, *s);
    if (!tg)
      FAIL(errorMessage(tg.takeError()));
    Simulator sim(*tg);
    Seconds whole = sim.simulateFull();
    auto before = timeline(*tg);
    for (double f : {0.25, 0.9, 0.999}) {
      INFO("limit " << f);
      CHECK_FALSE(sim.simulateFull(whole * f).has_value());
      // Far below: stopped before the end.
      if (f < 0.5)
        CHECK(sim.lastResimulated() < tg->numAlive());
    }
    for (double f : {1.0, 1.5}) {
      std::optional<Seconds> t = sim.simulateFull(whole * f);
      REQUIRE(t.has_value());
      CHECK(*t == whole);
      CHECK(timeline(*tg) == before);
    }
  }
}

TEST_CASE("a matmul split on two devices moves the exact bytes", "[Sim]") {
  // y[8,6] = x[8,4] @ w[4,6]; then relu. Split the matmul on m, n or k over
  // devices 0 and 1 with relu on device 0 whole.
  GraphBuilder b;
  auto x = b.input({8, 4});
  auto y = b.op("MatMul", {x, b.weight({4, 6})}, {{8, 6}});
  b.op("Relu", {y[0]}, {{8, 6}});
  requireOk(b.g.computeSemantics());
  Topology topo = exampleTopology("dgx-h100-1");
  CostModel cost(topo.deviceSpec(), nullptr, CostMode::Analytic);
  CollectiveModel coll(topo);
  SimContext ctx{b.g, topo, cost, coll, Optimizer::Sgd};
  const Op &mm = b.g.op(0), &relu = b.g.op(1);
  for (int loop = 0; loop < 3; ++loop) { // m, n, k
    Strategy s;
    OpConfig c = OpConfig::single(mm.sem, 0);
    c.degree[loop] = 2;
    c.devices = {0, 1};
    s.configs = {c, OpConfig::single(relu.sem, 0)};
    auto tg = TaskGraph::build(ctx, s);
    if (!tg)
      FAIL(errorMessage(tg.takeError()));
    Simulator sim(*tg);
    sim.simulateFull();
    SimMetrics m = sim.metrics();
    INFO("split loop " << mm.sem.loops[loop].name);
    // Device 1's half of y comes to device 0 (forward) and its gradient
    // goes back (backward): 8*6/2 floats each way.
    if (loop == 0) {
      // Split by sample: both devices hold all of w [4,6], whose gradient
      // is all-reduced: a ring of 2 sends 2*(2-1)/2 of it from each.
      CHECK(m.transferBytes == 2 * 24 * 4);
      CHECK(m.collectiveBytes == 2 * 1 * 24 * 4);
    } else if (loop == 1) {
      // Split by parameter: w's columns are disjoint shards; no sync.
      CHECK(m.transferBytes == 2 * 24 * 4);
      CHECK(m.collectiveBytes == 0);
    } else {
      // A split reduction: y is a partial sum on both devices, all-reduced
      // (8*6 floats); relu reads device 0's copy, and its gradient goes to
      // device 1's tile (8*6 floats).
      CHECK(m.transferBytes == 48 * 4);
      CHECK(m.collectiveBytes == 2 * 1 * 48 * 4);
    }
  }
}
