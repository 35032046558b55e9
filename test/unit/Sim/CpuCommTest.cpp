// CPU ranks move data with their cores (DeviceSpec::commOccupiesCompute,
// the catalog's XEON-AVX512-CORE): a transfer occupies the devices at its
// ends and a collective those of its group, as well as the links, so no
// kernel of theirs overlaps it; on a GPU the same graph overlaps them.
// Delta simulation stays exact with such multi-device tasks.
#include "SimFixture.h"

#include "soap/Support/Rng.h"
#include <catch2/catch.hpp>

using namespace soap;
using namespace soap::test;

namespace {

/// The first half of the ops on device 0, the rest on device 1.
Strategy twoStages(Fixture &f) {
  Strategy s = f.pipelined(1, 1, PipelineSchedule::OneFOneB, 1);
  size_t n = f.g->numOps();
  for (size_t o = 0; o < n; ++o)
    s.configs[o].devices = {DeviceId(2 * o >= n ? 1 : 0)};
  return s;
}

} // namespace

TEST_CASE("on CPU ranks communication occupies the cores", "[Sim][cpu]") {
  Fixture f("mlp_small", 64, "cpu-2");
  REQUIRE(f.topo.deviceSpec().commOccupiesCompute);
  Strategy split = twoStages(f);
  Strategy data = f.pipelined(1, 1, PipelineSchedule::OneFOneB, 2);
  auto tg = TaskGraph::build(f.ctx, split);
  if (!tg)
    FAIL(errorMessage(tg.takeError()));
  size_t transfers = 0;
  for (const Task &t : tg->tasks()) {
    if (!t.alive || t.kind != TaskKind::Transfer)
      continue;
    ++transfers;
    REQUIRE(t.resources.size() >= 3); // both devices and a link
    CHECK(t.resources[0] == 0);
    CHECK(t.resources[1] == 1);
    CHECK(t.resources[2] >= 2);
  }
  CHECK(transfers > 0);
  auto dtg = TaskGraph::build(f.ctx, data);
  if (!dtg)
    FAIL(errorMessage(dtg.takeError()));
  size_t collectives = 0;
  for (const Task &t : dtg->tasks())
    if (t.alive && t.kind == TaskKind::Collective) {
      ++collectives;
      CHECK(t.resources[0] == 0);
      CHECK(t.resources[1] == 1);
    }
  CHECK(collectives > 0);

  // The same cluster with copy engines: communication overlaps compute, so
  // the iteration is shorter; on the CPU a device's busy time includes its
  // communication: the iteration is at least device 0's compute plus every
  // collective it takes part in.
  DeviceSpec gpuLike = f.topo.deviceSpec();
  gpuLike.commOccupiesCompute = false;
  Topology t2 = f.topo;
  t2.setDeviceSpec(gpuLike);
  CollectiveModel coll2(t2);
  SimContext ctx2{*f.g, t2, f.cost, coll2, f.ctx.optimizer};
  auto run2 = [&](const Strategy &s) {
    auto g2 = TaskGraph::build(ctx2, s);
    if (!g2)
      FAIL(errorMessage(g2.takeError()));
    Simulator sim(*g2);
    return sim.simulateFull();
  };
  SimMetrics cpu = f.run(data);
  CHECK(cpu.iterationTime > run2(data));
  CHECK(f.run(split).iterationTime > run2(split));
  Seconds busy0 = 0;
  for (const Task &t : dtg->tasks())
    if (t.alive && (t.kind == TaskKind::Collective ||
                    ((t.kind == TaskKind::Forward ||
                      t.kind == TaskKind::Backward ||
                      t.kind == TaskKind::Update) &&
                     t.resources == TaskList{0})))
      busy0 += t.exe;
  CHECK(cpu.iterationTime >= busy0 * (1 - 1e-12));
}

TEST_CASE("delta simulation equals full simulation on CPU ranks",
          "[Sim][cpu]") {
  Fixture f("transformer_small", 8, "cpu-2");
  Strategy s = f.pipelined(1, 1, PipelineSchedule::OneFOneB, 2);
  auto tg = TaskGraph::build(f.ctx, s);
  if (!tg)
    FAIL(errorMessage(tg.takeError()));
  Simulator sim(*tg);
  sim.simulateFull();
  Rng rng(13, "cpu-delta");
  for (int step = 0; step < 40; ++step) {
    OpId o = OpId(rng.uniform(f.g->numOps()));
    // Whole on either rank, or split by sample over both.
    size_t pick = rng.uniform(3);
    OpConfig c = pick == 2 ? f.sampleSplit(o, 0, 2)
                           : OpConfig::single(f.g->op(o).sem, DeviceId(pick));
    INFO("step " << step);
    f.checkDelta(sim, *tg, s, o, c, rng.uniform(2) == 0);
  }
}
