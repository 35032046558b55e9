// Shared edge plans (TaskGraph::edgePlan): an edge's transfers are
// derived once per kind of edge and replayed for every edge of that kind.
// The graph must be the one that deriving every edge on its own gives: the
// same tasks under the same ids, with the same keys, times, bytes, routes
// and dependencies, and so the same timeline.
#include "SimFixture.h"

#include "soap/Parallel/BuiltinStrategies.h"
#include "soap/Parallel/Megatron.h"
#include <tuple>

using namespace soap;
using namespace soap::test;

namespace {

struct Built {
  size_t shared, own; ///< plans derived with sharing and without
  size_t transfers;
};

/// Builds `s` with and without shared plans and requires the same graph
/// task by task.
Built requireSameGraph(Fixture &f, const Strategy &s, bool fold) {
  SimContext shared = f.ctx, own = f.ctx;
  shared.fold = own.fold = fold;
  own.shareEdgePlans = false;
  auto a = TaskGraph::build(shared, s);
  auto b = TaskGraph::build(own, s);
  if (!a)
    FAIL(errorMessage(a.takeError()));
  if (!b)
    FAIL(errorMessage(b.takeError()));
  REQUIRE(a->fold().factor == b->fold().factor);
  REQUIRE(a->tasks().size() == b->tasks().size());
  size_t transfers = 0;
  for (size_t i = 0; i < a->tasks().size(); ++i) {
    const Task &x = a->tasks()[i], &y = b->tasks()[i];
    INFO("task " << i);
    REQUIRE(x.alive == y.alive);
    REQUIRE(x.kind == y.kind);
    REQUIRE(x.key == y.key);
    REQUIRE(x.exe == y.exe);
    REQUIRE(x.bytes == y.bytes);
    REQUIRE(x.resources == y.resources);
    REQUIRE(x.preds == y.preds);
    REQUIRE(x.succs == y.succs);
    REQUIRE(x.op == y.op);
    REQUIRE(x.microBatch == y.microBatch);
    REQUIRE(x.bufferDevice == y.bufferDevice);
    transfers += x.alive && x.kind == TaskKind::Transfer;
  }
  Simulator sa(*a), sb(*b);
  REQUIRE(sa.simulateFull() == sb.simulateFull());
  return {a->edgePlansDerived(), b->edgePlansDerived(), transfers};
}

} // namespace

TEST_CASE("shared edge plans give the graph every edge's own plan gives",
          "[Sim][edgeplan]") {
  SECTION("Megatron's shapes with pipelines, folded and in full") {
    Fixture f("transformer_small", 64, "dgx-h100-8");
    for (auto [t, p, sp] : {std::tuple{8, 2, false},
                            {4, 4, false},
                            {2, 4, false},
                            {1, 2, false},
                            {4, 2, true}}) {
      auto s = megatronStrategy(*f.g, f.topo, MegatronShape{t, p, 0, sp});
      if (!s)
        FAIL(errorMessage(s.takeError()));
      for (bool fold : {true, false}) {
        INFO("t=" << t << " p=" << p << " sp=" << sp
                  << (fold ? " folded" : " full"));
        Built b = requireSameGraph(f, *s, fold);
        REQUIRE(b.transfers > 0);
        // The blocks repeat: fewer kinds of edge than edges.
        REQUIRE(b.shared < b.own);
      }
    }
  }
  SECTION("model and expert strategies, whose ops sit on different devices") {
    for (const char *model : {"lenet", "rnnlm", "inception_v3"}) {
      Fixture f(model, 64, "p100-4x4");
      for (const char *name : {"data", "model", "expert"}) {
        auto s = builtinStrategy(name, *f.g, f.topo);
        if (!s)
          FAIL(errorMessage(s.takeError()));
        INFO(model << " " << name);
        Built b = requireSameGraph(f, *s, true);
        // Data parallelism moves nothing between ops; model parallelism
        // moves activations between devices.
        if (std::string(name) == "data")
          REQUIRE(b.transfers == 0);
        if (std::string(name) == "model")
          REQUIRE(b.transfers > 0);
      }
    }
  }
}

TEST_CASE("delta simulation with shared edge plans equals a full one",
          "[Sim][edgeplan]") {
  // A walk of single-op changes, each checked against a full simulation
  // of a fresh graph (every device's memory too); the small Transformer's
  // blocks repeat, so later changes find their edges' plans derived.
  Fixture f("transformer_small", 64, "p100-4x4");
  Strategy s = dataParallel(*f.g, f.topo);
  auto tg = TaskGraph::build(f.ctx, s);
  if (!tg)
    FAIL(errorMessage(tg.takeError()));
  Simulator sim(*tg);
  sim.simulateFull();
  // Every edge of a changed op is rebuilt: the plans it needs.
  auto edgesOf = [&](OpId o) {
    size_t n = 0;
    const Op &op = f.g->op(o);
    for (size_t i = 0; i < op.inputs.size(); ++i)
      n += op.inputs[i] != kNoValue && op.sem.inputs[i].present &&
           f.g->value(op.inputs[i]).producer >= 0;
    for (ValueId v : op.outputs)
      if (v != kNoValue)
        for (OpId u : f.g->value(v).users) {
          const Op &uo = f.g->op(u);
          for (size_t i = 0; i < uo.inputs.size(); ++i)
            n += uo.inputs[i] == v && uo.sem.inputs[i].present;
        }
    return n;
  };
  size_t before = tg->edgePlansDerived(), needed = 0;
  for (int round = 0; round < 2; ++round)
    for (OpId o = 0; o < OpId(f.g->numOps()); o += 3) {
      OpConfig c = f.sampleSplit(o, DeviceId(round * 4), 4);
      if (llvm::Error e =
              verifyConfig(c, f.g->op(o).sem, f.topo.numDevices(), "op")) {
        llvm::consumeError(std::move(e));
        continue;
      }
      needed += edgesOf(o);
      INFO("round " << round);
      f.checkDelta(sim, *tg, s, o, c, false);
    }
  // The layers repeat: changes in one find plans another's derived.
  INFO(tg->edgePlansDerived() - before << " plans derived for " << needed
                                       << " edges rebuilt");
  REQUIRE(tg->edgePlansDerived() - before < needed);
}
