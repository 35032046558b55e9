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

  /// Op `o`'s sample loop split `degree` ways on devices first, first + 1,
  /// ...
  OpConfig sampleSplit(OpId o, DeviceId first, int32_t degree) const {
    OpConfig c = OpConfig::single(g->op(o).sem, first);
    c.degree[0] = degree;
    c.devices.clear();
    for (int32_t k = 0; k < degree; ++k)
      c.devices.push_back(first + DeviceId(k));
    return c;
  }

  /// verifyStrategy's message for `s`, or "" when it verifies.
  std::string verifyError(const Strategy &s) const {
    llvm::Error e = verifyStrategy(s, *g, topo);
    return e ? errorMessage(std::move(e)) : std::string();
  }

  /// Applies `c` to op `o` through `sim` (a delta simulation of `tg`),
  /// keeps it in `s` or undoes it, and checks the iteration time and every
  /// device's memory against a full simulation of a fresh graph of `s`.
  void checkDelta(Simulator &sim, const TaskGraph &tg, Strategy &s, OpId o,
                  const OpConfig &c, bool undo) {
    auto t = sim.apply(o, c);
    if (!t)
      FAIL(errorMessage(t.takeError()));
    if (undo) {
      REQUIRE(!sim.undo());
      *t = sim.iterationTime();
    } else {
      s.configs[size_t(o)] = c;
    }
    auto fresh = TaskGraph::build(ctx, s);
    if (!fresh)
      FAIL(errorMessage(fresh.takeError()));
    Simulator full(*fresh);
    INFO("op " << g->op(o).name << " " << c.str(g->op(o).sem)
               << (undo ? " (undone)" : ""));
    REQUIRE(*t == full.simulateFull());
    for (DeviceId d = 0; d < topo.numDevices(); ++d) {
      const TaskGraph::DeviceMemory &a = tg.memory()[d],
                                    &b = fresh->memory()[d];
      REQUIRE(a.weights == b.weights);
      REQUIRE(a.gradients == b.gradients);
      REQUIRE(a.optimizer == b.optimizer);
      REQUIRE(a.saved == b.saved);
      REQUIRE(a.buffers == b.buffers);
      REQUIRE(a.workspace == b.workspace);
    }
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

/// A pipeline schedule's gate (TaskGraph::buildStage), not a weight's join
/// (keyed by the weight, its high bit set).
inline bool isStageGate(const Task &t) {
  return t.alive && t.kind == TaskKind::Gate && t.key.a < 0x80000000u;
}

inline size_t countStageGates(const TaskGraph &tg) {
  size_t n = 0;
  for (const Task &t : tg.tasks())
    n += isStageGate(t);
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
