// Reading a plan back as an engine's settings: every Megatron what-if's
// keys come back from its op configurations alone, the model's shape from
// its graph, and a plan changed in one op is refused at that op.
#include "../TestInputs.h"

#include "soap/Emit/EngineLayout.h"
#include "soap/IR/Fusion.h"
#include "soap/Parallel/WhatIf.h"
#include <catch2/catch.hpp>

using namespace soap;
using namespace soap::test;

namespace {

std::unique_ptr<Graph> fusedGpt2(int64_t batch) {
  auto g = zooModel("gpt2", batch);
  auto f = fuseKernels(*g);
  if (!f)
    FAIL(errorMessage(f.takeError()));
  return std::move(*f);
}

/// A plan of `s` as a search or a what-if records it (searcher `searcher`).
Plan planOf(const Graph &g, const Topology &topo, const Strategy &s,
            int64_t batch, const std::string &searcher) {
  PlanInputs in;
  in.batch = batch;
  in.searcher = searcher;
  in.optimizer = "adam";
  in.precision = "bf16";
  PlanFigures f;
  f.memoryPerDevice.assign(topo.numDevices(), 0);
  return makePlan(g, topo, s, in, f);
}

} // namespace

TEST_CASE("the shape of a transformer from its graph", "[Emit]") {
  auto g = fusedGpt2(8);
  ModelShape m = modelShape(*g);
  CHECK(m.layers == 12);
  CHECK(m.hidden == 768);
  CHECK(m.ffnHidden == 3072);
  CHECK(m.heads == 12);
  CHECK(m.kvHeads == 12);
  CHECK(m.seqLength == 1024);
  auto mlp = zooModel("mlp_small", 64);
  ModelShape none = modelShape(*mlp);
  CHECK(none.layers == 0);
  CHECK(none.hidden == 0);
  CHECK(none.heads == 0);
}

TEST_CASE("a what-if's keys come back from its op configurations", "[Emit]") {
  auto g = fusedGpt2(16);
  Topology topo = exampleTopology("dgx-h100-2");
  // Different values for every key, so that one read as another fails.
  const char *specs[] = {
      "tp=4,pp=2,vp=3,mbs=1,sp=1,recompute=selective,distopt=1",
      "tp=2,pp=1,cp=2,mbs=2,recompute=full",
      "tp=1,pp=4,mbs=4,distopt=1",
      "tp=2,pp=2,sp=1,mbs=2,recompute=selective",
  };
  for (const char *spec : specs) {
    INFO(spec);
    auto k = parseMegatronConfig(spec);
    if (!k)
      FAIL(errorMessage(k.takeError()));
    auto s = megatronConfigStrategy(*g, topo, *k);
    if (!s)
      FAIL(errorMessage(s.takeError()));
    Plan plan = planOf(*g, topo, *s, 16, "by hand");
    EmitContext c{plan, *g, topo, *s, "plan.json", "gpt2.onnx"};
    auto l = readEngineLayout(c, "Megatron-LM");
    if (!l)
      FAIL(errorMessage(l.takeError()));
    CHECK(l->matches);
    CHECK(l->findings.empty());
    CHECK(l->tp == k->tp);
    CHECK(l->pp == k->pp);
    CHECK(l->vp == k->vp);
    CHECK(l->cp == k->cp);
    CHECK(l->sp == k->sequenceParallel(*g));
    CHECK(l->microBatchSize == k->mbs);
    CHECK(l->recompute == k->recompute);
    CHECK(l->zero == (k->distopt ? 1 : 0));
    CHECK(l->dp * l->tp * l->pp * l->cp == int64_t(topo.numDevices()));
    // Recorded as the what-if it was, the keys agree.
    Plan recorded =
        planOf(*g, topo, *s, 16, std::string("simulate megatron:") + spec);
    EmitContext rc{recorded, *g, topo, *s, "plan.json", "gpt2.onnx"};
    auto again = readEngineLayout(rc, "Megatron-LM");
    if (!again)
      FAIL(errorMessage(again.takeError()));
  }
}

TEST_CASE("a plan changed in one op is found at that op", "[Emit]") {
  auto g = fusedGpt2(16);
  Topology topo = exampleTopology("dgx-h100-2");
  auto k = parseMegatronConfig("tp=4,pp=2,mbs=1");
  if (!k)
    FAIL(errorMessage(k.takeError()));
  auto built = megatronConfigStrategy(*g, topo, *k);
  if (!built)
    FAIL(errorMessage(built.takeError()));
  // The QKV projection of layer 3 split on its reduction, not its columns.
  OpId qkv = g->findOp("/h.3/attn/qkv/MatMul");
  REQUIRE(qkv >= 0);
  Strategy s = *built;
  OpConfig &cfg = s.configs[size_t(qkv)];
  const OpSemantics &sem = g->op(qkv).sem;
  for (size_t l = 0; l < sem.loops.size(); ++l) {
    if (sem.loops[l].name == "n")
      cfg.degree[l] = 1;
    if (sem.loops[l].name == "k")
      cfg.degree[l] = 4;
  }
  if (llvm::Error err = verifyStrategy(s, *g, topo))
    FAIL(errorMessage(std::move(err)));
  Plan plan = planOf(*g, topo, s, 16, "by hand");
  EmitContext c{plan, *g, topo, s, "plan.json", "gpt2.onnx"};
  auto l = readEngineLayout(c, "Megatron-LM");
  if (!l)
    FAIL(errorMessage(l.takeError()));
  CHECK(!l->matches);
  REQUIRE(l->findings.size() == 1);
  CHECK(l->findings[0].op == qkv);
  CHECK(l->findings[0].field == "loops/k");
  std::string msg = errorMessage(firstOpError(c, l->findings));
  CHECK(msg.find("plan.json: /ops/") == 0);
  CHECK(msg.find("'/h.3/attn/qkv/MatMul'") != std::string::npos);

  // Recorded as another what-if than its ops say: refused.
  Plan wrong =
      planOf(*g, topo, *built, 16, "simulate megatron:tp=2,pp=2,mbs=1");
  EmitContext wc{wrong, *g, topo, *built, "plan.json", "gpt2.onnx"};
  auto w = readEngineLayout(wc, "Megatron-LM");
  bool read = bool(w);
  REQUIRE(!read);
  CHECK(errorMessage(w.takeError()).find("/search/searcher") !=
        std::string::npos);
}
