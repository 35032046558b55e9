// NCCL's collective kernels take a share of a GPU's time while they run
// (DeviceSpec::ncclComputeShareIntra/Inter, Simulator::contend): a
// collective that nothing runs beside costs nothing more, an overlapped one
// costs its devices at most that share of its time, and the critical path
// accounts for the time taken.
#include "SimFixture.h"

#include <catch2/catch.hpp>

using namespace soap;
using namespace soap::test;

namespace {

/// GPT-2 data parallel over one DGX H100 with the distributed optimizer,
/// its gradient reduce-scatters and parameter all-gathers overlapped with
/// compute or not, on the catalog's H100 or on one whose NCCL takes no
/// share of its time.
struct Run {
  Seconds time = 0, comm = 0;
  SimMetrics metrics;
};

Run simulate(bool overlap, bool share) {
  Fixture f("gpt2", 64, "dgx-h100-1");
  if (!share) {
    DeviceSpec spec = f.topo.deviceSpec();
    spec.ncclComputeShareIntra = spec.ncclComputeShareInter = 0;
    f.topo.setDeviceSpec(spec);
  }
  Strategy s = f.pipelined(1, 1, PipelineSchedule::OneFOneB, 8);
  s.zero = zeroPolicy(*f.g, s, 1);
  s.gradSync.bucketParams = 10000000;
  s.gradSync.overlapGradReduce = overlap;
  s.gradSync.overlapParamGather = overlap;
  auto tg = TaskGraph::build(f.ctx, s);
  REQUIRE(bool(tg));
  Simulator sim(*tg);
  Run r;
  r.time = sim.simulateFull();
  for (const Task &t : tg->tasks())
    if (t.alive && t.kind == TaskKind::Collective)
      r.comm += t.exe;
  r.metrics = sim.metrics();
  return r;
}

} // namespace

TEST_CASE("a collective takes NCCL's share of its GPUs' time",
          "[Sim][contention]") {
  Fixture h100("gpt2", 64, "dgx-h100-1");
  double share = h100.topo.deviceSpec().ncclComputeShareIntra;
  REQUIRE(share > 0);
  REQUIRE(share < 1);

  // Not overlapped, the gradient reduce-scatter and the parameter
  // all-gather run while their devices wait for them: the time they take
  // from the devices ends before they do. (Only the loss's scalar
  // all-reduce runs beside kernels: a microsecond.)
  Run offShared = simulate(false, true), offFree = simulate(false, false);
  CHECK(offShared.time >= offFree.time);
  CHECK(offShared.time - offFree.time < 2e-6);

  // Overlapped, the collectives run beside the backward and forward
  // kernels, which lose at most the share of the collectives' time.
  Run onShared = simulate(true, true), onFree = simulate(true, false);
  INFO("overlapped: " << onShared.time * 1e3 << " ms with NCCL's share, "
                      << onFree.time * 1e3 << " ms without; communication "
                      << onShared.comm * 1e3 << " ms");
  CHECK(onShared.time > onFree.time);
  CHECK(onShared.time - onFree.time <= share * onShared.comm * (1 + 1e-9));
  // Still faster than not overlapping at all.
  CHECK(onShared.time < offShared.time);

  // The critical path's parts add up to at most the iteration, the time
  // taken by communication counted once.
  const SimMetrics &m = onShared.metrics;
  Seconds parts = m.criticalCompute + m.criticalTransfer +
                  m.criticalCollective + m.criticalUpdate +
                  m.criticalContention;
  CHECK(parts <= m.iterationTime * (1 + 1e-9));
  CHECK(m.criticalContention >= 0);
  CHECK(onFree.metrics.criticalContention == 0);
}

TEST_CASE("delta simulation equals full simulation with NCCL's share",
          "[Sim][contention]") {
  // Ops moved between devices one at a time on GPT-2 over one DGX H100,
  // each change applied by delta simulation and checked against a full
  // simulation of the same strategy (Fixture::checkDelta).
  Fixture f("gpt2", 32, "dgx-h100-1");
  REQUIRE(f.topo.deviceSpec().ncclComputeShareIntra > 0);
  Strategy s = f.pipelined(1, 2, PipelineSchedule::OneFOneB, 8);
  s.gradSync.bucketParams = 4000000;
  auto tg = TaskGraph::build(f.ctx, s);
  REQUIRE(bool(tg));
  Simulator sim(*tg);
  sim.simulateFull();
  int changed = 0;
  for (const Op &o : f.g->ops()) {
    if (o.id % 7 != 3)
      continue;
    f.checkDelta(sim, *tg, s, o.id, f.sampleSplit(o.id, 0, 4),
                 /*undo=*/o.id % 2 == 0);
    ++changed;
  }
  CHECK(changed > 3);
}
