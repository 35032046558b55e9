// Hand-checked task graphs: FlexFlow Figure 4's 3-layer RNN under model
// parallelism, and SOYBEAN section 2.2's MLP under data and model
// parallelism.
#include "../IR/TestGraphs.h"
#include "../TestInputs.h"

#include "soap/Machine/TopologyLoader.h"
#include "soap/Sim/Simulator.h"
#include <catch2/catch.hpp>

using namespace soap;
using namespace soap::test;

namespace {

const Task *find(const TaskGraph &tg, TaskKind kind, OpId op) {
  for (const Task &t : tg.tasks())
    if (t.alive && t.kind == kind && t.op == op)
      return &t;
  return nullptr;
}
} // namespace

TEST_CASE("FlexFlow Figure 4: a 3-layer RNN, one layer per GPU", "[Sim]") {
  // Two time steps of embedding -> recurrent -> linear (FlexFlow Figure 4a),
  // each layer on its own GPU.
  const int64_t N = 16, V = 100, H = 32;
  GraphBuilder b;
  ValueId emb = b.weight({V, H}), w = b.weight({1, 4 * H, H}),
          r = b.weight({1, 4 * H, H}), lin = b.weight({H, V});
  ValueId hPrev = kNoValue, cPrev = kNoValue;
  for (int t = 0; t < 2; ++t) {
    ValueId ids = b.input({N}, DType::I64);
    auto e = b.op("Gather", {emb, ids}, {{N, H}});
    auto cell = b.op("LSTMCell", {e[0], w, r, kNoValue, hPrev, cPrev},
                     {{N, H}, {N, H}}, {{"hidden_size", H}});
    b.op("MatMul", {cell[0], lin}, {{N, V}});
    hPrev = cell[0];
    cPrev = cell[1];
  }
  requireOk(b.g.computeSemantics());
  Topology topo = exampleTopology("dgx-h100-1");
  CostModel cost(topo.deviceSpec(), nullptr, CostMode::Analytic);
  CollectiveModel coll(topo);
  SimContext ctx{b.g, topo, cost, coll, Optimizer::Sgd};
  Strategy s;
  for (const Op &o : b.g.ops()) // layer i of each step on GPU i
    s.configs.push_back(OpConfig::single(o.sem, o.id % 3));
  auto tg = TaskGraph::build(ctx, s);
  if (!tg)
    FAIL(errorMessage(tg.takeError()));
  Simulator sim(*tg);
  sim.simulateFull();
  SimMetrics m = sim.metrics();
  // Transfers: forward embed->rnn and rnn->linear per step (4), backward
  // the same gradients (4); rnn->rnn stays on GPU 1 (an edge, no transfer).
  int transfers = 0;
  for (const Task &t : tg->tasks())
    transfers += t.alive && t.kind == TaskKind::Transfer;
  CHECK(transfers == 8);
  CHECK(m.transferBytes == 8 * N * H * 4);
  // The embedding is used by two ops on one GPU: no all-reduce.
  CHECK(m.collectiveBytes == 0);
  // Pipelining (Figure 4c): step 1's embedding runs on GPU 0 right after
  // step 0's, while GPU 1 runs step 0's recurrent cell.
  const Task *e0 = find(*tg, TaskKind::Forward, 0);
  const Task *e1 = find(*tg, TaskKind::Forward, 3);
  const Task *r0 = find(*tg, TaskKind::Forward, 1);
  const Task *r1 = find(*tg, TaskKind::Forward, 4);
  REQUIRE((e0 && e1 && r0 && r1));
  CHECK(e0->start == 0);
  CHECK(e1->start == e0->end);
  CHECK(e1->start < r0->end);
  // Step 1's cell waits for step 0's (same GPU) and for its input transfer.
  CHECK(r1->start >= r0->end);
  CHECK(r1->start == std::max(r0->end, r1->ready));
  CHECK(m.iterationTime > r1->end);
}

TEST_CASE("SOYBEAN's MLP under data and model parallelism", "[Sim]") {
  // Section 2.2: 5 dense layers of 300 units, batch 400.
  GraphBuilder b;
  ValueId x = b.input({400, 300});
  for (int l = 0; l < 5; ++l)
    x = b.op("MatMul", {x, b.weight({300, 300})}, {{400, 300}})[0];
  requireOk(b.g.computeSemantics());
  Topology topo = exampleTopology("p100-4x4");
  CostModel cost(topo.deviceSpec(), nullptr, CostMode::Analytic);
  CollectiveModel coll(topo);
  SimContext ctx{b.g, topo, cost, coll, Optimizer::Sgd};
  auto run = [&](int loop, int32_t degree) {
    Strategy s;
    for (const Op &o : b.g.ops()) {
      OpConfig c = OpConfig::single(o.sem, 0);
      c.degree[loop] = degree;
      c.devices.clear();
      for (int32_t d = 0; d < degree; ++d)
        c.devices.push_back(static_cast<DeviceId>(d));
      s.configs.push_back(c);
    }
    auto tg = TaskGraph::build(ctx, s);
    if (!tg)
      FAIL(errorMessage(tg.takeError()));
    Simulator sim(*tg);
    sim.simulateFull();
    return sim.metrics();
  };
  // Data parallel on 16 devices (m split): activations stay put; each
  // 300x300 weight's gradient is all-reduced over 16 devices, a ring
  // sending 2 * 15 / 16 of 360,000 bytes from each device.
  SimMetrics dp = run(0, 16);
  CHECK(dp.transferBytes == 0);
  CHECK(dp.collectiveBytes == 5 * 2 * 15 * 360000);
  // Model parallel (n split): 300 units split 15 ways (16 does not divide
  // 300). Each of layers 2-5 needs its whole input on every device, 14/15
  // of [400, 300] floats from the others, and in the backward pass each
  // device receives 14 partial input-gradients of its columns.
  SimMetrics mp = run(1, 15);
  CHECK(mp.transferBytes == 2 * 4 * 15 * 14 * (400 * 20 * 4));
  CHECK(mp.collectiveBytes == 0);
}
