// Pipelines and micro-batches: the schedules' order, the
// simulated bubble and memory of GPipe and 1F1B, gradient accumulation,
// delta simulation equal to full simulation under a pipeline, and the
// strategies verifyStrategy refuses.
#include "SimFixture.h"

#include "soap/Parallel/Megatron.h"

#include "soap/Support/Rng.h"
#include <catch2/catch.hpp>
#include <set>

using namespace soap;
using namespace soap::test;

namespace {

/// A group's order as "F0 B0 W0 ..." (pass and micro-batch), each item
/// prefixed by its stage and ':' when `stages`.
std::string orderStr(const Pipeline &p, int32_t grp, bool stages = false) {
  std::string out;
  for (const PipeItem &it : p.order(grp)) {
    if (!out.empty())
      out += ' ';
    if (stages)
      out += std::to_string(it.stage) + ':';
    out += it.pass == PipePass::Forward    ? 'F'
           : it.pass == PipePass::Backward ? 'B'
                                           : 'W';
    out += std::to_string(it.microBatch);
  }
  return out;
}

} // namespace

TEST_CASE("1F1B and GPipe orders", "[Sim][pipeline]") {
  Pipeline p;
  p.microBatches = 4;
  p.stageOf = {0, 1, 2};
  // The last stage alternates from the start; the first warms up with two.
  CHECK(orderStr(p, 2) == "F0 B0 F1 B1 F2 B2 F3 B3");
  CHECK(orderStr(p, 0) == "F0 F1 F2 B0 F3 B1 B2 B3");
  CHECK(p.inFlight(0) == 3);
  CHECK(p.inFlight(2) == 1);
  p.schedule = PipelineSchedule::GPipe;
  CHECK(p.inFlight(0) == 4);
  CHECK(orderStr(p, 1) == "F0 F1 F2 F3 B0 B1 B2 B3");
  // Fewer micro-batches than stages: every forward is a warm-up one.
  p.schedule = PipelineSchedule::OneFOneB;
  p.microBatches = 2;
  CHECK(p.inFlight(0) == 2);
  CHECK(orderStr(p, 0) == "F0 F1 B0 B1");
}

TEST_CASE("interleaved 1F1B follows Megatron's order", "[Sim][pipeline]") {
  // 2 device groups x 2 chunks: stages 0 and 2 on group 0, 1 and 3 on 1.
  Pipeline p;
  p.microBatches = 4;
  p.chunks = 2;
  p.stageOf = {0, 1, 2, 3};
  REQUIRE(p.numGroups() == 2);
  CHECK(p.group(2) == 0);
  CHECK(p.group(3) == 1);
  // Megatron's interleaved schedule for pipeline rank 0 of 2, 2 chunks,
  // 4 micro-batches: (2 - 0 - 1) * 2 + (2 - 1) * 2 = 4 warm-up forwards,
  // micro-batches in rounds of p = 2 per chunk; backwards from the last
  // chunk.
  CHECK(orderStr(p, 0, true) ==
        "0:F0 0:F1 2:F0 2:F1 0:F2 2:B0 0:F3 2:B1 2:F2 0:B0 2:F3 0:B1 "
        "2:B2 2:B3 0:B2 0:B3");
  // Rank 1 warms up with (v - 1) p = 2.
  CHECK(orderStr(p, 1, true) ==
        "1:F0 1:F1 3:F0 3:B0 3:F1 3:B1 1:F2 1:B0 1:F3 1:B1 3:F2 3:B2 "
        "3:F3 3:B3 1:B2 1:B3");
  // Rank 0 peaks after 0:F2, chunk 0 holding 3 micro-batches and chunk 1
  // two; rank 1 holds at most 3.
  CHECK(p.inFlight(0) == 3);
  CHECK(p.inFlight(2) == 2);
  CHECK(p.inFlight(1) + p.inFlight(3) == 3);
  // m == p: all forwards first (Megatron's all-warm-up case).
  p.microBatches = 2;
  CHECK(orderStr(p, 1, true) == "1:F0 1:F1 3:F0 3:F1 3:B0 3:B1 1:B0 1:B1");
  CHECK(p.inFlight(1) + p.inFlight(3) == 4);
}

TEST_CASE("zb-h1 delays stage s's weight gradients by s micro-batches",
          "[Sim][pipeline]") {
  Pipeline p;
  p.microBatches = 4;
  p.schedule = PipelineSchedule::ZbH1;
  p.stageOf = {0, 1, 2};
  CHECK(orderStr(p, 0) == "F0 F1 F2 B0 W0 F3 B1 W1 B2 W2 B3 W3");
  CHECK(orderStr(p, 2) == "F0 B0 F1 B1 F2 B2 W0 F3 B3 W1 W2 W3");
  // Every stage holds as many micro-batches as the first (its activations
  // until the weight gradients).
  for (int32_t s = 0; s < 3; ++s)
    CHECK(p.inFlight(s) == 3);
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
  // The schedule's gates: 2m - 1 between 2m items (the others are the
  // gradient buckets' joins).
  CHECK(countStageGates(*t4) == 7);
  CHECK(countStageGates(*t1) == 0);
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
        gated += isStageGate(tg->tasks()[x]);
    }
    CHECK(early > 0);
    CHECK(gated == early);
  }
}

namespace {

/// `s` (stages of 4 devices each) with 2 model chunks per device group:
/// stage st moved onto group st % (stages / 2)'s devices.
Strategy interleave(Strategy s) {
  s.pipeline.chunks = 2;
  for (OpConfig &c : s.configs)
    for (DeviceId &d : c.devices) {
      int32_t st = int32_t(d / 4);
      d = DeviceId(s.pipeline.group(st) * 4 + d % 4);
    }
  return s;
}

} // namespace

TEST_CASE("interleaving and zb-h1 shorten the bubble", "[Sim][pipeline]") {
  // mlp: a chain of large matmuls; 2 devices.
  Fixture f("mlp", 2048, "dgx-h100-1");
  Strategy plain = f.pipelined(2, 4, PipelineSchedule::OneFOneB, 1);
  Strategy four = f.pipelined(4, 4, PipelineSchedule::OneFOneB, 1);
  four.pipeline.chunks = 2;
  for (size_t o = 0; o < four.configs.size(); ++o)
    four.configs[o].devices = {
        DeviceId(four.pipeline.group(four.pipeline.stage(OpId(o))))};
  Strategy zb = plain;
  zb.pipeline.schedule = PipelineSchedule::ZbH1;
  SimMetrics p = f.run(plain), v = f.run(four), z = f.run(zb);
  INFO("1f1b " << p.iterationTime << " interleaved " << v.iterationTime
               << " zb-h1 " << z.iterationTime);
  CHECK(v.iterationTime < p.iterationTime);
  CHECK(z.iterationTime < p.iterationTime);
  // zb-h1's second stage holds its activations until the delayed weight
  // gradients: 2 micro-batches, 1F1B's first stage's count.
  CHECK(z.memory[1].saved == 2 * p.memory[1].saved);
}

TEST_CASE("a later stage receives an activation once", "[Sim][pipeline]") {
  // One device per stage: every edge between the stages is a transfer.
  // GPT-2's pre-norm layers read the residual stream twice.
  Fixture f("gpt2", 2, "dgx-h100-1");
  Strategy s = f.pipelined(2, 2, PipelineSchedule::OneFOneB, 1);
  // Cut between two layers, where the residual stream crosses.
  s.pipeline.stageOf = layerStages(*f.g, 2);
  for (size_t o = 0; o < s.configs.size(); ++o)
    s.configs[o].devices = {DeviceId(s.pipeline.stage(OpId(o)))};
  auto tg = TaskGraph::build(f.ctx, s);
  REQUIRE(bool(tg));
  // The values of stage 0 that stage 1 reads, and how many edges carry
  // each forward.
  std::set<ValueId> crossing;
  size_t edges = 0;
  for (const Op &op : f.g->ops())
    for (size_t i = 0; i < op.inputs.size(); ++i) {
      ValueId v = op.inputs[i];
      if (v == kNoValue || f.g->value(v).producer < 0 ||
          !op.sem.inputs[i].present ||
          s.pipeline.stage(f.g->value(v).producer) == s.pipeline.stage(op.id))
        continue;
      crossing.insert(v);
      ++edges;
    }
  REQUIRE(edges > crossing.size()); // the residual stream: norm and add
  // Forward transfers (direction bit 16 of the key's b clear), one per
  // value and micro-batch.
  size_t forward = 0;
  for (const Task &t : tg->tasks())
    forward += t.alive && t.kind == TaskKind::Transfer &&
               ((t.key.b >> 16) & 1) == 0;
  CHECK(forward == crossing.size() * 2);
}

TEST_CASE("delta simulation equals full simulation under a pipeline",
          "[Sim][pipeline]") {
  for (int variant = 0; variant < 4; ++variant) {
    auto sched = variant == 1   ? PipelineSchedule::GPipe
                 : variant == 2 ? PipelineSchedule::ZbH1
                                : PipelineSchedule::OneFOneB;
    Fixture f("transformer_small", 32, "p100-4x4");
    Strategy s = f.pipelined(4, 4, sched, 4);
    if (variant == 3)
      s = interleave(s);
    auto tg = TaskGraph::build(f.ctx, s);
    if (!tg)
      FAIL(errorMessage(tg.takeError()));
    Simulator sim(*tg);
    sim.simulateFull();
    Rng rng(7, "pipeline-delta");
    for (int step = 0; step < 40; ++step) {
      OpId o = OpId(rng.uniform(f.g->numOps()));
      const OpSemantics &sem = f.g->op(o).sem;
      int32_t st = s.pipeline.group(s.pipeline.stage(o));
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
  // Interleaved: 4 stages on 2 groups of devices {0, 1} and {2, 3}.
  Strategy four = f.pipelined(4, 4, PipelineSchedule::OneFOneB, 1);
  four.pipeline.chunks = 2;
  for (size_t o = 0; o < four.configs.size(); ++o)
    four.configs[o].devices = {
        DeviceId(four.pipeline.group(four.pipeline.stage(OpId(o))))};
  CHECK(error(four).empty());
  Strategy odd = four;
  odd.pipeline.chunks = 3;
  CHECK_THAT(error(odd), Catch::Contains("4 pipeline stages do not divide "
                                         "into 3 model chunks"));
  Strategy rounds = four;
  rounds.pipeline.microBatches = 1;
  CHECK_THAT(error(rounds), Catch::Contains("1 micro-batches are not a "
                                            "multiple of 2 groups"));
  Strategy gpipe = four;
  gpipe.pipeline.schedule = PipelineSchedule::GPipe;
  CHECK_THAT(error(gpipe), Catch::Contains("need the 1f1b (interleaved) "
                                           "schedule, not gpipe"));
  Strategy shared = four;
  shared.configs[0].devices = {1};
  CHECK_THAT(error(shared),
             Catch::Contains("device 1 is in pipeline device groups 0 and 1 "
                             "(stages 0 mod 2 and 1 mod 2)"));
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
