// A zoo model on an example topology with the analytic cost model, and
// strategies the simulator tests build on it (PipelineTest, ZeroTest).
#ifndef SOAP_TEST_SIM_SIMFIXTURE_H
#define SOAP_TEST_SIM_SIMFIXTURE_H

#include "../TestInputs.h"

#include "soap/Sim/Simulator.h"
#include <catch2/catch.hpp>

namespace soap::test {

struct Fixture {
  std::unique_ptr<Graph> g;
  Topology topo;
  CostModel cost;
  CollectiveModel coll;
  SimContext ctx;
  Fixture(const std::string &model, int64_t batch, const std::string &t)
      : g(zooModel(model, batch)), topo(exampleTopology(t)),
        cost(topo.deviceSpec(), nullptr, CostMode::Analytic),
        coll(topo), ctx{*g, topo, cost, coll, Optimizer::Adam} {}

  /// Stage s of `stages` gets a contiguous share of the ops and of the
  /// devices; every op is split by sample over its stage's devices.
  Strategy pipelined(int32_t stages, int32_t m, PipelineSchedule sched,
                     size_t devicesPerStage) {
    Strategy s;
    s.pipeline.microBatches = m;
    s.pipeline.schedule = sched;
    size_t n = g->numOps();
    for (const Op &o : g->ops()) {
      int32_t st = int32_t(size_t(o.id) * size_t(stages) / n);
      s.pipeline.stageOf.push_back(st);
      OpConfig c = OpConfig::single(o.sem, 0);
      c.degree[0] = int32_t(devicesPerStage);
      c.devices.clear();
      for (size_t d = 0; d < devicesPerStage; ++d)
        c.devices.push_back(DeviceId(size_t(st) * devicesPerStage + d));
      s.configs.push_back(c);
    }
    return s;
  }

  SimMetrics run(const Strategy &s) {
    auto tg = TaskGraph::build(ctx, s);
    if (!tg)
      FAIL(errorMessage(tg.takeError()));
    Simulator sim(*tg);
    sim.simulateFull();
    return sim.metrics();
  }
};

inline size_t countKind(const TaskGraph &tg, TaskKind k) {
  size_t n = 0;
  for (const Task &t : tg.tasks())
    n += t.alive && t.kind == k;
  return n;
}

inline size_t countRole(const TaskGraph &tg, CollectiveRole r) {
  size_t n = 0;
  for (const Task &t : tg.tasks())
    n += t.alive && t.kind == TaskKind::Collective && t.role == r;
  return n;
}

} // namespace soap::test

#endif // SOAP_TEST_SIM_SIMFIXTURE_H
