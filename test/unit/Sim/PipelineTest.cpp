// Pipelines and micro-batches (issue 16): the schedules' order, the
// simulated bubble and memory of GPipe and 1F1B, gradient accumulation,
// delta simulation equal to full simulation under a pipeline, and the
// strategies verifyStrategy refuses.
#include "SimFixture.h"

#include "soap/Support/Rng.h"
#include <catch2/catch.hpp>

using namespace soap;
using namespace soap::test;

TEST_CASE("1F1B and GPipe orders", "[Sim][pipeline]") {
  Pipeline p;
  p.microBatches = 4;
  p.stageOf = {0, 1, 2};
  using Item = std::pair<int32_t, bool>;
  // The last stage alternates from the start; the first warms up with two.
  CHECK(p.order(2) == std::vector<Item>{{0, false},
                                        {0, true},
                                        {1, false},
                                        {1, true},
                                        {2, false},
                                        {2, true},
                                        {3, false},
                                        {3, true}});
  CHECK(p.order(0) == std::vector<Item>{{0, false},
                                        {1, false},
                                        {2, false},
                                        {0, true},
                                        {3, false},
                                        {1, true},
                                        {2, true},
                                        {3, true}});
  CHECK(p.inFlight(0) == 3);
  CHECK(p.inFlight(2) == 1);
  p.schedule = PipelineSchedule::GPipe;
  CHECK(p.inFlight(0) == 4);
  CHECK(p.order(1).front() == Item{0, false});
  CHECK(p.order(1)[4] == Item{0, true});
  // Fewer micro-batches than stages: every forward is a warm-up one.
  p.schedule = PipelineSchedule::OneFOneB;
  p.microBatches = 2;
  CHECK(p.inFlight(0) == 2);
  CHECK(p.order(0) ==
        std::vector<Item>{{0, false}, {1, false}, {0, true}, {1, true}});
}

TEST_CASE("a pipeline's bubble and memory come out of the simulation",
          "[Sim][pipeline]") {
  // mlp: a chain of large matmuls, 2 stages of one device each.
  Fixture f("mlp", 2048, "dgx-h100-1");
  SimMetrics one = f.run(f.pipelined(2, 1, PipelineSchedule::OneFOneB, 1));
  SimMetrics g8 = f.run(f.pipelined(2, 8, PipelineSchedule::GPipe, 1));
  SimMetrics f8 = f.run(f.pipelined(2, 8, PipelineSchedule::OneFOneB, 1));
  // With micro-batches the two stages overlap: faster than one batch at
  // a time, whose stages take turns.
  CHECK(f8.iterationTime < one.iterationTime);
  CHECK(g8.iterationTime < one.iterationTime);
  // 1F1B's first stage holds 2 micro-batches, GPipe's all 8.
  auto saved = [](const SimMetrics &m, DeviceId d) {
    return m.memory[d].saved;
  };
  CHECK(saved(g8, 0) == 4 * saved(f8, 0));
  CHECK(saved(g8, 1) == 8 * saved(f8, 1));
  CHECK(saved(one, 0) == saved(g8, 0));
}

TEST_CASE("gradient accumulation: one stage, m micro-batches, one sync",
          "[Sim][pipeline]") {
  Fixture f("lenet", 64, "dgx-h100-1");
  Strategy s1 = f.pipelined(1, 1, PipelineSchedule::OneFOneB, 8);
  Strategy s4 = f.pipelined(1, 4, PipelineSchedule::OneFOneB, 8);
  auto t1 = TaskGraph::build(f.ctx, s1);
  auto t4 = TaskGraph::build(f.ctx, s4);
  REQUIRE(bool(t1));
  REQUIRE(bool(t4));
  CHECK(countKind(*t4, TaskKind::Forward) ==
        4 * countKind(*t1, TaskKind::Forward));
  // Weight gradients are summed over the micro-batches and synchronised
  // once; the loss's partial sum is combined per micro-batch.
  CHECK(countRole(*t4, CollectiveRole::WeightGrad) ==
        countRole(*t1, CollectiveRole::WeightGrad));
  CHECK(countRole(*t4, CollectiveRole::PartialSum) ==
        4 * countRole(*t1, CollectiveRole::PartialSum));
  CHECK(countKind(*t4, TaskKind::Update) == countKind(*t1, TaskKind::Update));
  // Activations of one micro-batch at a time: a quarter.
  CHECK(t4->memory()[0].saved * 4 == t1->memory()[0].saved);
  CHECK(t4->memory()[0].weights == t1->memory()[0].weights);
  // The schedule's gates: 2m - 1 between 2m items.
  CHECK(countKind(*t4, TaskKind::Gate) == 7);
  CHECK(countKind(*t1, TaskKind::Gate) == 0);
  // A backward item ends with its weight gradients: every one of a
  // micro-batch before the last gates the next item (LeNet's ops have a
  // weight and a bias, mlp_small's MatMuls one weight).
  Fixture m("mlp_small", 64, "dgx-h100-1");
  auto tm =
      TaskGraph::build(m.ctx, m.pipelined(1, 4, PipelineSchedule::OneFOneB, 8));
  REQUIRE(bool(tm));
  for (const TaskGraph *tg : {&*t4, &*tm}) {
    size_t gated = 0, early = 0;
    for (const Task &t : tg->tasks()) {
      if (!t.alive || t.kind != TaskKind::WeightGrad || t.microBatch == 3)
        continue;
      ++early;
      for (uint32_t x : t.succs)
        gated += tg->tasks()[x].kind == TaskKind::Gate;
    }
    CHECK(early > 0);
    CHECK(gated == early);
  }
}

TEST_CASE("delta simulation equals full simulation under a pipeline",
          "[Sim][pipeline]") {
  for (auto sched : {PipelineSchedule::OneFOneB, PipelineSchedule::GPipe}) {
    Fixture f("transformer_small", 32, "p100-4x4");
    Strategy s = f.pipelined(4, 4, sched, 4);
    auto tg = TaskGraph::build(f.ctx, s);
    if (!tg)
      FAIL(errorMessage(tg.takeError()));
    Simulator sim(*tg);
    sim.simulateFull();
    Rng rng(7, "pipeline-delta");
    for (int step = 0; step < 40; ++step) {
      OpId o = OpId(rng.uniform(f.g->numOps()));
      const OpSemantics &sem = f.g->op(o).sem;
      int32_t st = s.pipeline.stage(o);
      // A random split of the sample loop (dividing batch / m) and of one
      // other loop, on the stage's devices.
      OpConfig c = OpConfig::single(sem, DeviceId(st * 4));
      int32_t ds = int32_t(1) << rng.uniform(3);
      c.degree[0] = ds;
      int64_t tiles = ds;
      size_t l = 1 + rng.uniform(sem.loops.size() - 1);
      if (l < sem.loops.size() && sem.loops[l].splittable && tiles < 4 &&
          sem.loops[l].size % 2 == 0 &&
          (sem.loops[l].size / 2) % sem.loops[l].granule == 0) {
        c.degree[l] = 2;
        tiles *= 2;
      }
      c.devices.clear();
      for (int64_t k = 0; k < tiles; ++k)
        c.devices.push_back(DeviceId(st * 4 + k));
      INFO("step " << step);
      f.checkDelta(sim, *tg, s, o, c, rng.uniform(2) == 0);
    }
  }
}

TEST_CASE("verifyStrategy refuses malformed pipelines", "[Sim][pipeline]") {
  Fixture f("mlp_small", 64, "dgx-h100-1");
  auto error = [&](const Strategy &s) { return f.verifyError(s); };
  Strategy s = f.pipelined(2, 4, PipelineSchedule::OneFOneB, 2);
  CHECK(error(s).empty());
  Strategy back = s;
  std::swap(back.pipeline.stageOf[0], back.pipeline.stageOf[5]);
  CHECK_THAT(error(back), Catch::Contains("of the later stage 1; stages must "
                                          "be contiguous"));
  Strategy overlap = s;
  overlap.configs[5].devices = {0, 1};
  CHECK_THAT(error(overlap),
             Catch::Contains("device 0 is in pipeline stages 0 and 1"));
  Strategy divide = s;
  divide.pipeline.microBatches = 3;
  CHECK_THAT(error(divide),
             Catch::Contains("3 micro-batches x degree 2 do not divide its "
                             "sample loop 'm' of 64"));
  Strategy gap = s;
  for (int32_t &st : gap.pipeline.stageOf)
    st = st == 1 ? 2 : st;
  CHECK_THAT(error(gap), Catch::Contains("pipeline stage 1 has no ops"));
}

TEST_CASE("activation recomputation trades saved bytes for a forward again",
          "[Sim][recompute]") {
  Fixture f("transformer_small", 32, "dgx-h100-1");
  Strategy kept = f.pipelined(1, 1, PipelineSchedule::OneFOneB, 8);
  Strategy sel = kept, full = kept;
  sel.recompute = recomputePolicy(*f.g, false);
  full.recompute = recomputePolicy(*f.g, true);
  SimMetrics a = f.run(kept), b = f.run(sel), c = f.run(full);
  // Less kept, more time; weights untouched.
  CHECK(b.memory[0].saved < a.memory[0].saved);
  CHECK(c.memory[0].saved < b.memory[0].saved);
  CHECK(b.iterationTime > a.iterationTime);
  CHECK(c.iterationTime > b.iterationTime);
  CHECK(c.memory[0].weights == a.memory[0].weights);
  // An op that saves nothing cannot be recomputed.
  Strategy bad = kept;
  bad.recompute.assign(f.g->numOps(), 0);
  for (const Op &op : f.g->ops())
    if (!savesActivations(op.sem)) {
      bad.recompute[size_t(op.id)] = 1;
      llvm::Error e = verifyStrategy(bad, *f.g, f.topo);
      REQUIRE(bool(e));
      CHECK_THAT(errorMessage(std::move(e)),
                 Catch::Contains("recomputed, but it saves nothing for "
                                 "backward"));
      break;
    }
}

TEST_CASE("full recomputation keeps only the residual stream",
          "[Sim][recompute]") {
  // A GPT's blocks (the zoo's 1.3B export, shapes only): the checkpoints
  // are the residual Adds, two per block, and the rest of each block runs
  // again in backward from them, reshapes and Adds included.
  auto g = zooModel("gpt3_1_3b", 8);
  std::vector<OpId> cuts = checkpointOps(*g);
  size_t adds = 0;
  for (OpId o : cuts)
    adds += g->op(o).kind == "Add";
  INFO(cuts.size() << " checkpoints, " << adds << " Adds");
  REQUIRE(adds >= 2 * 24);          // 24 blocks
  REQUIRE(cuts.size() <= adds + 8); // and the embedding and head's ops
  std::vector<uint8_t> full = recomputePolicy(*g, true);
  Strategy s;
  s.recompute = full;
  size_t nonSaving = 0;
  for (const Op &op : g->ops()) {
    if (!full[size_t(op.id)])
      continue;
    REQUIRE(recomputeMatters(*g, s, op.id));
    nonSaving += !savesActivations(op.sem);
  }
  CHECK(nonSaving > 24); // reshapes, transposes, Adds inside the blocks
  // Block 3's checkpoint is kept; everything between it and the next one
  // is recomputed or saves nothing and feeds nothing recomputed.
  for (OpId o : cuts)
    CHECK(!full[size_t(o)]);
}

TEST_CASE("delta simulation equals full simulation with recomputation",
          "[Sim][recompute]") {
  Fixture f("transformer_small", 32, "p100-4x4");
  Strategy s = f.pipelined(2, 2, PipelineSchedule::OneFOneB, 8);
  s.recompute = recomputePolicy(*f.g, false);
  auto tg = TaskGraph::build(f.ctx, s);
  if (!tg)
    FAIL(errorMessage(tg.takeError()));
  Simulator sim(*tg);
  sim.simulateFull();
  Rng rng(11, "recompute-delta");
  for (int step = 0; step < 30; ++step) {
    OpId o = OpId(rng.uniform(f.g->numOps()));
    OpConfig c = f.sampleSplit(o, DeviceId(s.pipeline.stage(o) * 8),
                               int32_t(1) << rng.uniform(4));
    INFO("step " << step);
    f.checkDelta(sim, *tg, s, o, c, false);
  }
}
