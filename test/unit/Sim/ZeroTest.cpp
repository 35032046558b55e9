// ZeRO / FSDP sharding: the memory each stage leaves per device,
// the reduce-scatters and all-gathers in place of the all-reduce, delta
// simulation equal to full simulation under ZeRO-2 and ZeRO-3, and the
// strategies verifyStrategy refuses.
#include "SimFixture.h"

#include "soap/Support/Rng.h"
#include <catch2/catch.hpp>

using namespace soap;
using namespace soap::test;

namespace {

size_t countWeights(const Graph &g) {
  size_t n = 0;
  for (const Value &v : g.values())
    n += v.kind == ValueKind::Weight && !v.users.empty();
  return n;
}

Strategy withZero(Strategy s, const Graph &g, int stage) {
  s.zero = zeroPolicy(g, s, stage);
  return s;
}

} // namespace

TEST_CASE("ZeRO stages shard optimizer state, gradients, then weights",
          "[Sim][zero]") {
  Fixture f("mlp_small", 64, "dgx-h100-1");
  Strategy dp = f.pipelined(1, 1, PipelineSchedule::OneFOneB, 8);
  SimMetrics m0 = f.run(dp);
  SimMetrics m1 = f.run(withZero(dp, *f.g, 1));
  SimMetrics m2 = f.run(withZero(dp, *f.g, 2));
  SimMetrics m3 = f.run(withZero(dp, *f.g, 3));
  const auto &a = m0.memory[0], &b = m1.memory[0], &c = m2.memory[0],
             &d = m3.memory[0];
  // Each weight's share is rounded up: at most one element's bytes more per
  // weight than an eighth.
  Bytes slack = Bytes(countWeights(*f.g)) * 8;
  CHECK(a.optimizer > 0);
  CHECK(b.optimizer * 8 >= a.optimizer);
  CHECK(b.optimizer * 8 <= a.optimizer + 8 * slack);
  CHECK(b.gradients == a.gradients);
  CHECK(b.weights == a.weights);
  CHECK(c.optimizer == b.optimizer);
  CHECK(c.gradients * 8 >= a.gradients);
  CHECK(c.gradients * 8 <= a.gradients + 8 * slack);
  CHECK(c.weights == a.weights);
  CHECK(d.weights * 8 >= a.weights);
  CHECK(d.weights * 8 <= a.weights + 8 * slack);
  CHECK(d.gradients == c.gradients);
  // ZeRO-3 holds the gathered weights of the running op and of the one
  // being prefetched.
  CHECK(d.workspace > a.workspace);
  CHECK(d.saved == a.saved);
}

TEST_CASE("ZeRO replaces the all-reduce with reduce-scatter and all-gather",
          "[Sim][zero]") {
  Fixture f("mlp_small", 64, "dgx-h100-1");
  size_t w = countWeights(*f.g);
  for (int32_t m : {1, 4}) {
    INFO(m << " micro-batches");
    Strategy dp = f.pipelined(1, m, PipelineSchedule::OneFOneB, 8);
    // Every weight its own bucket: one collective per weight.
    dp.gradSync.bucketParams = 1;
    auto build = [&](int stage) {
      auto tg = TaskGraph::build(f.ctx, withZero(dp, *f.g, stage));
      if (!tg)
        FAIL(errorMessage(tg.takeError()));
      return std::move(*tg);
    };
    TaskGraph t0 = build(0), t1 = build(1), t2 = build(2), t3 = build(3);
    CHECK(countRole(t0, CollectiveRole::WeightGrad) == w);
    CHECK(countRole(t0, CollectiveRole::WeightGather) == 0);
    // ZeRO-1: one reduce-scatter per iteration; the updated eighths are
    // gathered once.
    CHECK(countRole(t1, CollectiveRole::WeightGrad) == w);
    CHECK(countRole(t1, CollectiveRole::WeightGather) == w);
    // ZeRO-2: a reduce-scatter per micro-batch (no full gradient is kept).
    CHECK(countRole(t2, CollectiveRole::WeightGrad) == size_t(m) * w);
    CHECK(countRole(t2, CollectiveRole::WeightGather) == w);
    // ZeRO-3: the weights gathered before every forward and backward.
    CHECK(countRole(t3, CollectiveRole::WeightGrad) == size_t(m) * w);
    CHECK(countRole(t3, CollectiveRole::WeightGather) == 2 * size_t(m) * w);
    for (const Task &t : t1.tasks())
      if (t.alive && t.kind == TaskKind::Collective &&
          t.role == CollectiveRole::WeightGrad)
        CHECK(t.comm == Collective::ReduceScatter);
    // A reduce-scatter and an all-gather move what one all-reduce moves.
    Simulator s0(t0), s1(t1), s3(t3);
    s0.simulateFull();
    s1.simulateFull();
    s3.simulateFull();
    if (m == 1) {
      Bytes partial = 0; // the loss's partial sums, the same in all three
      for (const Task &t : t0.tasks())
        if (t.alive && t.kind == TaskKind::Collective &&
            t.role != CollectiveRole::WeightGrad)
          partial += 2 * (Bytes(t.groupSize) - 1) * t.bytes;
      Bytes sync = s0.metrics().collectiveBytes - partial;
      CHECK(sync > 0);
      CHECK(s1.metrics().collectiveBytes == s0.metrics().collectiveBytes);
      CHECK(s3.metrics().collectiveBytes - partial == sync * 3 / 2);
    }
    // The update runs on an eighth of each weight.
    Seconds u0 = 0, u1 = 0;
    for (const Task &t : t0.tasks())
      if (t.alive && t.kind == TaskKind::Update)
        u0 += t.exe;
    for (const Task &t : t1.tasks())
      if (t.alive && t.kind == TaskKind::Update)
        u1 += t.exe;
    CHECK(u1 < u0);
  }
}

TEST_CASE("delta simulation equals full simulation under ZeRO", "[Sim][zero]") {
  for (int stage : {2, 3}) {
    Fixture f("transformer_small", 32, "p100-4x4");
    Strategy s = f.pipelined(2, 2, PipelineSchedule::OneFOneB, 8);
    s.zero = zeroPolicy(*f.g, s, stage);
    auto tg = TaskGraph::build(f.ctx, s);
    if (!tg)
      FAIL(errorMessage(tg.takeError()));
    Simulator sim(*tg);
    sim.simulateFull();
    size_t done = 0;
    for (const Task &t : tg->tasks())
      done += t.alive && t.simulated;
    REQUIRE(done == tg->numAlive());
    Rng rng(13, "zero-delta");
    for (int step = 0; step < 30; ++step) {
      OpId o = OpId(rng.uniform(f.g->numOps()));
      OpConfig c = f.sampleSplit(o, DeviceId(s.pipeline.stage(o) * 8),
                                 int32_t(1) << rng.uniform(4));
      INFO("ZeRO-" << stage << " step " << step);
      f.checkDelta(sim, *tg, s, o, c, rng.uniform(3) == 0);
    }
  }
}

TEST_CASE("ZeRO needs a data-parallel group and weights", "[Sim][zero]") {
  Fixture f("mlp_small", 64, "dgx-h100-1");
  // Everything on one device: no op has a group, the policy sets nothing
  // and dropIdleZero clears a stage set by hand.
  Strategy one = f.pipelined(1, 1, PipelineSchedule::OneFOneB, 1);
  for (uint8_t z : zeroPolicy(*f.g, one, 2))
    CHECK(z == 0);
  OpId weighted = -1, plain = -1;
  for (const Op &op : f.g->ops()) {
    if (op.sem.weightInputs.empty())
      plain = op.id;
    else
      weighted = op.id;
  }
  REQUIRE(weighted >= 0);
  REQUIRE(plain >= 0);
  Strategy idle = one;
  idle.zero.assign(f.g->numOps(), 0);
  idle.zero[size_t(weighted)] = 1;
  CHECK(!hasDataParallelGroup(*f.g, idle, weighted));
  dropIdleZero(*f.g, idle);
  CHECK(idle.zero.empty());
  Strategy dp = f.pipelined(1, 1, PipelineSchedule::OneFOneB, 8);
  CHECK(hasDataParallelGroup(*f.g, dp, weighted));
  auto error = [&](const Strategy &s) { return f.verifyError(s); };
  Strategy bad = dp;
  bad.zero.assign(f.g->numOps(), 0);
  bad.zero[size_t(plain)] = 1;
  CHECK_THAT(error(bad), Catch::Contains("ZeRO stage 1, but the op has no "
                                         "weights"));
  bad.zero[size_t(plain)] = 0;
  bad.zero[size_t(weighted)] = 4;
  CHECK_THAT(error(bad), Catch::Contains("ZeRO stage 4; the stages are 0 to "
                                         "3"));
}
