// The DTensor target's layout of a Megatron plan: the token embedding split
// by table rows runs vocabulary-parallel (its table Shard(0), its output a
// partial sum), and a vocabulary that splits unevenly falls back, saying so.
#include "../TestInputs.h"

#include "Emit/DTensorLayout.h"
#include "soap/Emit/DTensor.h"
#include "soap/Parallel/Megatron.h"
#include "soap/Plan/Plan.h"
#include <catch2/catch.hpp>

using namespace soap;
using namespace soap::test;

namespace {

struct Planned {
  std::unique_ptr<Graph> graph;
  Topology topo;
  Strategy strategy;
  Plan plan;
};

/// Megatron's tp 2 with sequence parallelism of zoo model `name` on the
/// two devices of test/cli/exec's cluster.
Planned megatronTp2(const std::string &name, int64_t batch) {
  auto topo = loadTopology(std::string(SOAP_SOURCE_DIR) +
                           "/test/cli/exec/Inputs/two.json");
  if (!topo)
    FAIL(errorMessage(topo.takeError()));
  Planned p{zooModel(name, batch), std::move(*topo), {}, {}};
  auto s = megatronStrategy(*p.graph, p.topo, {2, 1, 0, true});
  if (!s)
    FAIL(errorMessage(s.takeError()));
  p.strategy = std::move(*s);
  PlanInputs in;
  in.batch = batch;
  in.searcher = "megatron";
  in.optimizer = "sgd";
  in.precision = "fp32";
  PlanFigures f;
  f.memoryPerDevice.assign(p.topo.numDevices(), 0);
  p.plan = makePlan(*p.graph, p.topo, p.strategy, in, f);
  return p;
}

const OpPlacement &placementOf(const Graph &g, const DTensorLayout &l,
                               const char *name) {
  OpId o = g.findOp(name);
  REQUIRE(o >= 0);
  return l.ops[size_t(o)];
}

} // namespace

TEST_CASE("a table split by rows is a vocabulary-parallel embedding",
          "[Emit]") {
  Planned p = megatronTp2("transformer_small", 8);
  EmitContext c{p.plan,     *p.graph,   p.topo,
                p.strategy, "tp2.json", "transformer_small.onnx"};
  auto l = dtensorLayout(c);
  if (!l)
    FAIL(errorMessage(l.takeError()));
  REQUIRE(l->mesh == std::vector<int64_t>{2});
  const OpPlacement &e = placementOf(*p.graph, *l, "/tok/Gather");
  CHECK(e.fallback.empty());
  REQUIRE(e.loopOfDim.size() == 1);
  REQUIRE(e.loopOfDim[0] >= 0);
  const Op &gather = p.graph->op(p.graph->findOp("/tok/Gather"));
  CHECK(gather.sem.loops[size_t(e.loopOfDim[0])].name == "v");
  CHECK(e.inputs[0] == Placements{"S0"}); // the table's rows
  CHECK(e.inputs[1] == Placements{"R"});  // every id on every rank
  CHECK(e.outputs[0] == Placements{"P"}); // summed by its consumer
  // The LM head reads the table in the same placement: no transfer.
  const OpPlacement &head = placementOf(*p.graph, *l, "/Gemm");
  CHECK(head.fallback.empty());
  // No op falls back, so the program compares its collectives with the
  // plan's.
  auto e2 = emitDTensor(c);
  if (!e2)
    FAIL(errorMessage(e2.takeError()));
  CHECK(e2->notes.empty());
  CHECK(e2->text.find("\"collectives\": null") == std::string::npos);
  CHECK(e2->text.find("\"collectives\": {") != std::string::npos);
}

TEST_CASE("a vocabulary split unevenly falls back with its reason", "[Emit]") {
  // GPT-2's 50257 tokens split 2 ways (Megatron's padded vocabulary).
  Planned p = megatronTp2("gpt2", 8);
  REQUIRE(p.strategy.vocabPadding > 0);
  EmitContext c{p.plan, *p.graph, p.topo, p.strategy, "tp2.json", "gpt2.onnx"};
  auto l = dtensorLayout(c);
  if (!l)
    FAIL(errorMessage(l.takeError()));
  OpId gather = -1;
  for (const Op &op : p.graph->ops())
    if (op.kind == "Gather" && p.graph->value(op.inputs[0]).shape[0] == 50257)
      gather = op.id;
  REQUIRE(gather >= 0);
  const OpPlacement &e = l->ops[size_t(gather)];
  CHECK(e.fallback == "its table's 50257 rows split 2 ways leave a shorter "
                      "last shard (a padded vocabulary); the DTensor target "
                      "splits a vocabulary-parallel embedding only evenly; "
                      "runs as [-]");
  CHECK(e.inputs[0] == Placements{"R"});
  CHECK(e.outputs[0] != Placements{"P"});
}
