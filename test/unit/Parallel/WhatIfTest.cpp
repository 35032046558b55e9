// What-if strategies: Megatron-LM's and FSDP's settings parsed, built and
// checked, with one input error per impossible key.
#include "../TestInputs.h"

#include "soap/IR/Fusion.h"
#include "soap/Parallel/Megatron.h"
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

std::string errorOf(llvm::StringRef spec, const Graph &g,
                    const Topology &topo) {
  auto s = whatIfStrategy(spec, g, topo);
  if (s)
    return "";
  return errorMessage(s.takeError());
}
} // namespace

TEST_CASE("megatron what-if keys parse", "[Parallel][whatif]") {
  auto c = parseMegatronConfig(
      "tp=4,pp=8,mbs=2,recompute=selective,distopt=1,sp=0,cp=1,vp=1");
  if (!c)
    FAIL(errorMessage(c.takeError()));
  CHECK(c->tp == 4);
  CHECK(c->pp == 8);
  CHECK(c->mbs == 2);
  CHECK(c->recompute == RecomputeMode::Selective);
  CHECK(c->distopt);
  CHECK(c->str() ==
        "tp=4,pp=8,vp=1,cp=1,mbs=2,sp=0,recompute=selective,distopt=1");
  auto bad = [](llvm::StringRef keys) {
    auto r = parseMegatronConfig(keys);
    return r ? std::string() : errorMessage(r.takeError());
  };
  CHECK(bad("tp=0").find("tp=0 is not a positive integer") !=
        std::string::npos);
  CHECK(bad("tq=2").find("unknown key 'tq'") != std::string::npos);
  CHECK(bad("tp=2,tp=4").find("given twice") != std::string::npos);
  CHECK(bad("recompute=some").find("none, selective or full") !=
        std::string::npos);
  CHECK(bad("sp=yes").find("must be 0 or 1") != std::string::npos);
  CHECK(bad("tp").find("not key=value") != std::string::npos);
}

TEST_CASE("what-if gradient synchronisation keys", "[Parallel][whatif]") {
  // Megatron: both overlaps by default with the distributed optimizer (NeMo's
  // GPT-3 175B recipe); param gather only with it and with overlapped
  // reduction, as Megatron-LM checks.
  auto c = parseMegatronConfig("tp=4,distopt=1");
  if (!c)
    FAIL(errorMessage(c.takeError()));
  CHECK(c->gradSync() == GradSync());
  CHECK(c->str() == "tp=4,pp=1,vp=1,cp=1,mbs=1,recompute=none,distopt=1");
  c = parseMegatronConfig("tp=4,distopt=0");
  REQUIRE(bool(c));
  CHECK(c->gradSync().overlapGradReduce);
  CHECK_FALSE(c->gradSync().overlapParamGather);
  c = parseMegatronConfig(
      "distopt=1,overlap_grad_reduce=0,overlap_param_gather=0,"
      "bucket_size=1000");
  REQUIRE(bool(c));
  CHECK_FALSE(c->gradSync().overlapGradReduce);
  CHECK_FALSE(c->gradSync().overlapParamGather);
  CHECK(c->gradSync().bucketParams == 1000);
  CHECK(c->str() == "tp=1,pp=1,vp=1,cp=1,mbs=1,recompute=none,distopt=1,"
                    "overlap_grad_reduce=0,overlap_param_gather=0,"
                    "bucket_size=1000");
  auto g = fusedGpt2(16);
  Topology topo = exampleTopology("dgx-h100-2");
  auto s = whatIfStrategy("megatron:tp=4,pp=2,distopt=1,bucket_size=7", *g,
                          topo);
  if (!s)
    FAIL(errorMessage(s.takeError()));
  CHECK(s->gradSync.bucketParams == 7);
  CHECK(s->gradSync.overlapParamGather);
  CHECK(errorOf("megatron:tp=4,overlap_param_gather=1", *g, topo) ==
        "--strategy megatron: overlap_param_gather=1 needs the distributed "
        "optimizer (distopt=1)");
  CHECK(errorOf("megatron:tp=4,distopt=1,overlap_grad_reduce=0,"
                "overlap_param_gather=1",
                *g, topo) == "--strategy megatron: overlap_param_gather=1 "
                             "needs overlap_grad_reduce=1");
  // tp_comm_overlap: on by default with sequence parallelism (NeMo's
  // recipes), which it needs (Transformer Engine's userbuffers).
  c = parseMegatronConfig("tp=4,sp=1");
  REQUIRE(bool(c));
  CHECK(c->gradSync().tpCommOverlap);
  c = parseMegatronConfig("tp=4,sp=1,tp_comm_overlap=0");
  REQUIRE(bool(c));
  CHECK_FALSE(c->gradSync().tpCommOverlap);
  CHECK(c->str() == "tp=4,pp=1,vp=1,cp=1,mbs=1,sp=1,recompute=none,distopt=0,"
                    "tp_comm_overlap=0");
  CHECK_FALSE(parseMegatronConfig("tp=4,sp=0")->gradSync().tpCommOverlap);
  s = whatIfStrategy("megatron:tp=4,sp=1", *g, topo);
  REQUIRE(bool(s));
  CHECK(s->gradSync.tpCommOverlap);
  CHECK(errorOf("megatron:tp=4,sp=0,tp_comm_overlap=1", *g, topo) ==
        "--strategy megatron: tp_comm_overlap=1 needs sequence parallelism "
        "(sp=1)");
  CHECK(errorOf("megatron:tp=4,sp=1,tp_comm_overlap=2", *g, topo) ==
        "--strategy megatron: tp_comm_overlap=2 must be 0 or 1");
  // FSDP: the same keys; param gather means nothing under ZeRO-3.
  auto f = whatIfStrategy("fsdp:zero=1,overlap_param_gather=0", *g, topo);
  if (!f)
    FAIL(errorMessage(f.takeError()));
  CHECK(f->gradSync.overlapGradReduce);
  CHECK_FALSE(f->gradSync.overlapParamGather);
  CHECK(errorOf("fsdp:zero=3,overlap_param_gather=1", *g, topo)
            .find("overlap_param_gather is for zero=1|2") != std::string::npos);
}

TEST_CASE("megatron what-if builds Megatron's plan", "[Parallel][whatif]") {
  auto g = fusedGpt2(16);
  Topology topo = exampleTopology("dgx-h100-2"); // 16 GPUs
  auto s = whatIfStrategy(
      "megatron:tp=4,pp=2,mbs=1,recompute=selective,distopt=1", *g, topo);
  if (!s)
    FAIL(errorMessage(s.takeError()));
  // dp = 16 / 8 = 2; m = 16 / (2 x 1).
  CHECK(s->pipeline.microBatches == 8);
  CHECK(s->pipeline.numStages() == 2);
  // Six layers per stage: the embedding with the first, the LM head and
  // loss with the last.
  CHECK(s->pipeline.stage(g->findOp("/h.5/Add_3/Fused")) == 0);
  CHECK(s->pipeline.stage(g->findOp("/h.6/ln_1/LayerNormalization")) == 1);
  CHECK(s->pipeline.stage(0) == 0);
  CHECK(s->pipeline.stage(OpId(g->numOps() - 1)) == 1);
  // The attention split by heads; the LM head by the vocabulary... which
  // GPT-2's 50,257 does not allow: replicated (Megatron pads it).
  OpId fa = g->findOp("/h.0/attn/FlashAttention");
  CHECK(s->configs[size_t(fa)].str(g->op(fa).sem) == "n=2 h=4 @0-7");
  // Selective recomputation is the core attention alone.
  for (const Op &op : g->ops())
    CHECK(s->recomputes(op.id) == (op.kind == "FlashAttention"));
  CHECK(s->zeroStage(g->findOp("/h.0/c_fc/MatMul")) == 1);
}

TEST_CASE("megatron what-if interleaves pp x vp stages over pp groups",
          "[Parallel][whatif]") {
  auto g = fusedGpt2(16);
  Topology topo = exampleTopology("dgx-h100-2");
  auto s = whatIfStrategy("megatron:pp=2,vp=2,mbs=1", *g, topo);
  REQUIRE(bool(s));
  const Pipeline &p = s->pipeline;
  CHECK(p.chunks == 2);
  CHECK(p.numStages() == 4);
  CHECK(p.numGroups() == 2);
  CHECK(p.microBatches == 2);
  // Three layers per stage: layer 3 opens stage 1 (group 1), layer 6
  // stage 2, back on group 0's devices; the LM head is on stage 3.
  OpId l0 = g->findOp("/h.0/attn/qkv/MatMul");
  OpId l3 = g->findOp("/h.3/attn/qkv/MatMul");
  OpId l6 = g->findOp("/h.6/attn/qkv/MatMul");
  OpId l11 = g->findOp("/h.11/attn/qkv/MatMul");
  REQUIRE(l0 >= 0);
  REQUIRE(l11 >= 0);
  CHECK(p.stage(l0) == 0);
  CHECK(p.stage(l3) == 1);
  CHECK(p.stage(l6) == 2);
  CHECK(p.stage(l11) == 3);
  CHECK(s->configs[l6].deviceSet() == s->configs[l0].deviceSet());
  CHECK(s->configs[l3].deviceSet() != s->configs[l0].deviceSet());
  auto zb = whatIfStrategy("megatron:pp=2,schedule=zb-h1", *g, topo);
  REQUIRE(bool(zb));
  CHECK(zb->pipeline.schedule == PipelineSchedule::ZbH1);
}

TEST_CASE("megatron what-if with context parallelism",
          "[Parallel][whatif]") {
  auto g = fusedGpt2(16);
  Topology topo = exampleTopology("dgx-h100-2");
  auto s = whatIfStrategy("megatron:tp=2,cp=2,mbs=1,sp=0", *g, topo);
  if (!s)
    FAIL(errorMessage(s.takeError()));
  // 16 devices: tp 2 x cp 2 x dp 4, in Megatron's rank order (tp fastest,
  // then cp, then dp). The attention splits its query loop over cp, its
  // heads over tp and its samples over dp.
  int checked = 0;
  for (const Op &op : g->ops()) {
    const OpConfig &c = s->configs[size_t(op.id)];
    const OpSemantics &sem = op.sem;
    if (op.kind == "FlashAttention") {
      for (size_t l = 0; l < sem.loops.size(); ++l) {
        int32_t want = sem.loops[l].name == "q"   ? 2
                       : sem.loops[l].name == "h" ? 2
                       : sem.loops[l].name == "n" ? 4
                                                  : 1;
        CHECK(c.degree[l] == want);
      }
      CHECK(c.replicas == 1);
      for (int64_t k = 0; k < c.numTiles(); ++k) {
        Box b = c.tile(sem, k);
        int64_t ti = 0, ci = 0, si = 0;
        for (size_t l = 0; l < sem.loops.size(); ++l) {
          int64_t part = sem.loops[l].size / c.degree[l];
          if (sem.loops[l].name == "h")
            ti = b.lo[l] / part;
          if (sem.loops[l].name == "q")
            ci = b.lo[l] / part;
          if (sem.loops[l].name == "n")
            si = b.lo[l] / part;
        }
        CHECK(c.device(k) == DeviceId(ti + 2 * (ci + 2 * si)));
      }
      ++checked;
    }
    // Every op with the 1,024 tokens splits them 2 ways (the LM head and
    // the loss too); weights are whole over the cp group.
    for (size_t l = 0; l < sem.loops.size(); ++l)
      if (sem.loops[l].size == 1024 && sem.loops[l].cls != DimClass::Reduction &&
          op.kind != "Gather" && sem.loops[l].splittable)
        CHECK(c.degree[l] == 2);
  }
  CHECK(checked == 12);
}

TEST_CASE("megatron what-if refuses what it cannot build",
          "[Parallel][whatif]") {
  auto g = fusedGpt2(16);
  Topology topo = exampleTopology("dgx-h100-2");
  CHECK(errorOf("megatron:tp=2,vp=2", *g, topo).find("it needs pp > 1") !=
        std::string::npos);
  CHECK(errorOf("megatron:pp=2,vp=4", *g, topo)
            .find("pp=2 x vp=4 does not divide the model's 12 transformer "
                  "layers") != std::string::npos);
  // 16 devices, pp 2: dp 8, 16 / 8 = 2 micro-batches of 1, a multiple of
  // pp; mbs 2 leaves 1.
  CHECK(errorOf("megatron:pp=2,vp=2,mbs=2", *g, topo)
            .find("1 micro-batches (batch 16 / (dp=8 x mbs=2)) to be a "
                  "multiple of pp=2") != std::string::npos);
  CHECK(errorOf("megatron:pp=2,vp=2,schedule=zb-h1", *g, topo)
            .find("runs the interleaved 1F1B schedule") != std::string::npos);
  CHECK(errorOf("megatron:schedule=2f2b", *g, topo)
            .find("schedule=2f2b must be 1f1b, zb-h1 or gpipe") !=
        std::string::npos);
  // gpt2's 1,024 tokens in 2 x 3 chunks (the causal load-balanced layout).
  CHECK(errorOf("megatron:cp=3", *g, topo)
            .find("cp=3 needs the sequence (1024) to divide into 6 chunks") !=
        std::string::npos);
  CHECK(errorOf("megatron:tp=4,cp=8", *g, topo)
            .find("tp=4 x pp=1 x cp=8 = 32 does not divide the 16 devices") !=
        std::string::npos);
  CHECK(errorOf("megatron:sp=1", *g, topo).find("needs tp > 1") !=
        std::string::npos);
  CHECK(errorOf("megatron:tp=8,pp=1,mbs=1", *g, topo)
            .find("does not divide the 12 heads") != std::string::npos);
  CHECK(errorOf("megatron:pp=16", *g, topo).find("more than the model's 12") !=
        std::string::npos);
  CHECK(errorOf("megatron:pp=8", *g, topo).find("does not divide the model's") !=
        std::string::npos);
  CHECK(errorOf("megatron:tp=3", *g, topo).find("does not divide the 16") !=
        std::string::npos);
  CHECK(errorOf("megatron:tp=2,mbs=3", *g, topo).find("does not split") !=
        std::string::npos);
  CHECK(errorOf("zero:3", *g, topo).find("unknown what-if") !=
        std::string::npos);
}

TEST_CASE("megatron what-if with sequence parallelism", "[Parallel][whatif]") {
  auto g = fusedGpt2(16);
  Topology topo = exampleTopology("dgx-h100-2");
  auto s0 = whatIfStrategy("megatron:tp=4,pp=2,mbs=1,sp=0", *g, topo);
  auto s1 = whatIfStrategy("megatron:tp=4,pp=2,mbs=1,sp=1", *g, topo);
  if (!s0 || !s1)
    FAIL("megatron what-if");
  auto config = [&](const Strategy &s, const char *name) {
    OpId o = g->findOp(name);
    REQUIRE(o >= 0);
    return s.configs[size_t(o)].str(g->op(o).sem);
  };
  // Between the GEMMs: replicated over the tensor-parallel four, or split
  // four ways along the sequence (d1 of [batch, sequence, hidden]).
  for (const char *name :
       {"/h.0/ln_1/LayerNormalization", "/h.0/Add/Fused", "/h.0/Add_3/Fused",
        "/h.11/ln_2/LayerNormalization"}) {
    CHECK(config(*s0, name).find("x4") != std::string::npos);
    CHECK(config(*s1, name).find("d1=4") != std::string::npos);
  }
  // The token embedding is vocabulary-parallel either way: its table split
  // by rows, its partial sums reduced (reduce-scattered along the sequence
  // with sp=1).
  CHECK(config(*s0, "/wte/Gather").find("v=4") != std::string::npos);
  CHECK(config(*s1, "/wte/Gather").find("v=4") != std::string::npos);
  // The GEMMs, the attention and the stages are Megatron's either way.
  for (const char *name : {"/h.0/attn/qkv/MatMul", "/h.0/attn/proj/MatMul",
                           "/h.0/attn/FlashAttention", "/h.0/c_proj/MatMul"})
    CHECK(config(*s1, name) == config(*s0, name));
  CHECK(s1->pipeline.stageOf == s0->pipeline.stageOf);
  CHECK(s1->pipeline.microBatches == s0->pipeline.microBatches);
  // A graph without attention has no sequence to split.
  auto mlp = zooModel("mlp", 16);
  CHECK(errorOf("megatron:tp=2,sp=1", *mlp, topo).find("needs a sequence") !=
        std::string::npos);

  // sp left out: on with tensor parallelism where there is a sequence
  // (NeMo's recipes), off at tp 1 and where there is none.
  auto dflt = whatIfStrategy("megatron:tp=4,pp=2,mbs=1", *g, topo);
  REQUIRE(bool(dflt));
  CHECK(dflt->configs == s1->configs);
  CHECK(dflt->gradSync.tpCommOverlap);
  auto k = parseMegatronConfig("tp=4,pp=2,mbs=1");
  REQUIRE(bool(k));
  CHECK_FALSE(k->sp.has_value());
  CHECK(k->sequenceParallel(*g));
  CHECK_FALSE(k->sequenceParallel(*mlp));
  CHECK(k->resolved(*g).str() ==
        "tp=4,pp=2,vp=1,cp=1,mbs=1,sp=1,recompute=none,distopt=0");
  CHECK_FALSE(parseMegatronConfig("tp=1")->sequenceParallel(*g));
  auto mlpTp = whatIfStrategy("megatron:tp=2", *mlp, topo);
  REQUIRE(bool(mlpTp));
  CHECK_FALSE(mlpTp->gradSync.tpCommOverlap);
}

TEST_CASE("megatron what-if with sequence parallelism inside context "
          "parallelism",
          "[Parallel][whatif]") {
  // tp 2 x cp 2 x dp 4 on 16 GPUs: an op sequence parallelism splits is cut
  // 2 x 2 ways along the sequence, cp rank ci's half cut over its two
  // tensor-parallel ranks; the GEMMs are split on the sequence by cp only.
  auto g = fusedGpt2(16);
  Topology topo = exampleTopology("dgx-h100-2");
  auto cp = whatIfStrategy("megatron:tp=2,cp=2,mbs=1,sp=0", *g, topo);
  auto spcp = whatIfStrategy("megatron:tp=2,cp=2,mbs=1,sp=1", *g, topo);
  if (!cp)
    FAIL(errorMessage(cp.takeError()));
  if (!spcp)
    FAIL(errorMessage(spcp.takeError()));
  auto config = [&](const Strategy &s, const char *name) {
    OpId o = g->findOp(name);
    REQUIRE(o >= 0);
    return s.configs[size_t(o)];
  };
  for (const char *name :
       {"/h.0/ln_1/LayerNormalization", "/h.11/ln_2/LayerNormalization"}) {
    OpId o = g->findOp(name);
    INFO(name << ": " << config(*spcp, name).str(g->op(o).sem));
    CHECK(config(*spcp, name).degree[1] == 4);
    CHECK(config(*cp, name).degree[1] == 2);
    // Its tiles along the sequence, in order, on tp rank 0 then 1 of cp
    // rank 0, then of cp rank 1 (device ti + 2 (ci + 2 si)): devices 0, 1,
    // 2, 3 for the first data-parallel rank.
    const OpConfig &c = config(*spcp, name);
    std::vector<DeviceId> first;
    for (int64_t k = 0; k < c.numTiles(); ++k)
      if (c.tile(g->op(o).sem, k).lo[0] == 0)
        first.push_back(c.device(k, 0));
    CHECK(first == std::vector<DeviceId>{0, 1, 2, 3});
  }
  for (const char *name : {"/h.0/attn/qkv/MatMul", "/h.0/c_proj/MatMul",
                           "/h.0/attn/FlashAttention"}) {
    OpId o = g->findOp(name);
    CHECK(config(*spcp, name).str(g->op(o).sem) ==
          config(*cp, name).str(g->op(o).sem));
  }
}

TEST_CASE("fsdp what-if", "[Parallel][whatif]") {
  auto g = fusedGpt2(32);
  Topology topo = exampleTopology("dgx-h100-2");
  auto s = whatIfStrategy("fsdp:zero=3,mbs=1,recompute=full", *g, topo);
  if (!s)
    FAIL(errorMessage(s.takeError()));
  CHECK(s->pipeline.microBatches == 2);
  CHECK(s->zeroStage(g->findOp("/h.0/c_fc/MatMul")) == 3);
  CHECK(!s->recompute.empty());
  CHECK(errorOf("fsdp:zero=4", *g, topo).find("1, 2 or 3") !=
        std::string::npos);
}
