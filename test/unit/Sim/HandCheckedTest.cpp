// Hand-checked task graphs: FlexFlow Figure 4's 3-layer RNN under model
// parallelism, and SOYBEAN section 2.2's MLP under data and model
// parallelism.
#include "../IR/TestGraphs.h"
#include "../TestInputs.h"

#include "soap/Machine/TopologyLoader.h"
#include "soap/Sim/Simulator.h"
#include <catch2/catch.hpp>
#include <set>

using namespace soap;
using namespace soap::test;

namespace {

/// Every op of `g` with loop `loop(op)` split `degree` ways over devices
/// 0 .. degree - 1.
template <typename LoopOf>
Strategy splitEvery(const Graph &g, LoopOf loop, int32_t degree) {
  Strategy s;
  for (const Op &o : g.ops()) {
    OpConfig c = OpConfig::single(o.sem, 0);
    c.degree[loop(o)] = degree;
    c.devices.clear();
    for (int32_t d = 0; d < degree; ++d)
      c.devices.push_back(static_cast<DeviceId>(d));
    s.configs.push_back(c);
  }
  return s;
}

/// Every op of `g` split `degree` ways along its first loop of `size`.
Strategy splitOnSize(const Graph &g, int64_t size, int32_t degree) {
  return splitEvery(
      g,
      [&](const Op &o) {
        size_t l = 0;
        while (o.sem.loops[l].size != size)
          ++l;
        return l;
      },
      degree);
}

/// Device 0's tasks of op `o` of kind `k`, by key.
std::vector<const Task *> on0(const TaskGraph &tg, OpId o, TaskKind k) {
  std::vector<const Task *> out;
  for (const Task &t : tg.tasks())
    if (t.alive && t.op == o && t.kind == k && t.resources[0] == 0)
      out.push_back(&t);
  std::sort(out.begin(), out.end(),
            [](const Task *a, const Task *b) { return a->key < b->key; });
  return out;
}

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
  // FIFO devices exactly as in the figure: no time lost to NCCL's kernels
  // (ContentionTest checks that).
  DeviceSpec spec = topo.deviceSpec();
  spec.ncclComputeShareIntra = spec.ncclComputeShareInter = 0;
  topo.setDeviceSpec(spec);
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
    Strategy s = splitEvery(
        b.g, [&](const Op &) { return size_t(loop); }, degree);
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
  // 300). Each of layers 2-5 needs its whole input on every device, of
  // which each device holds its own columns: an all-gather over the 15 (a
  // ring: 14 x 480,000 bytes), no transfer. In the backward pass each
  // device holds a partial gradient of that whole input, of which the
  // previous layer's tile on it needs only its own columns: a
  // reduce-scatter over the 15 sums them (14 x 480,000 bytes again), each
  // device left with its columns in place.
  SimMetrics mp = run(1, 15);
  CHECK(mp.transferBytes == 0);
  CHECK(mp.collectiveBytes == 4 * (14 + 14) * (400 * 300 * 4));
}

TEST_CASE("An LSTM layer split on its hidden units exchanges its state every "
          "step",
          "[Sim]") {
  // T steps of a layer with H hidden units on batch N. Split by sample,
  // tiles run apart; split on h, step t needs every tile's slice of h_{t-1}:
  // T all-gathers of [N, H] forward and T all-reduces of its gradient
  // backward among the tiles.
  const int64_t T = 8, N = 16, I = 32, H = 64;
  GraphBuilder b;
  ValueId x = b.input({T, N, I});
  b.op("LSTM", {x, b.weight({1, 4 * H, I}), b.weight({1, 4 * H, H})},
       {{T, 1, N, H}}, {{"hidden_size", H}});
  requireOk(b.g.computeSemantics());
  const OpSemantics &sem = b.g.op(0).sem;
  int h = -1, n = -1;
  for (size_t l = 0; l < sem.loops.size(); ++l) {
    if (sem.loops[l].name == "h")
      h = int(l);
    if (sem.loops[l].name == "n")
      n = int(l);
  }
  REQUIRE((h >= 0 && n >= 0));
  CHECK(sem.loops[size_t(h)].exchangeSteps == T);
  CHECK(sem.loops[size_t(n)].exchangeSteps == 0);
  Topology topo = exampleTopology("dgx-h100-1");
  CostModel cost(topo.deviceSpec(), nullptr, CostMode::Analytic);
  CollectiveModel coll(topo);
  SimContext ctx{b.g, topo, cost, coll, Optimizer::Sgd};
  auto build = [&](int loop) {
    OpConfig c = OpConfig::single(sem, 0);
    c.degree[size_t(loop)] = 4;
    c.devices = {0, 1, 2, 3};
    Strategy s;
    s.configs.push_back(c);
    auto tg = TaskGraph::build(ctx, s);
    if (!tg)
      FAIL(errorMessage(tg.takeError()));
    return std::move(*tg);
  };
  TaskGraph bySample = build(n), byHidden = build(h);
  auto exchanges = [](const TaskGraph &tg) {
    std::vector<const Task *> out;
    for (const Task &t : tg.tasks())
      if (t.alive && t.kind == TaskKind::Collective &&
          t.role == CollectiveRole::Exchange)
        out.push_back(&t);
    return out;
  };
  CHECK(exchanges(bySample).empty());
  auto ex = exchanges(byHidden);
  REQUIRE(ex.size() == 2);
  std::vector<DeviceId> all{0, 1, 2, 3};
  Bytes state = N * H * 4;
  CHECK(ex[0]->bytes == T * state);
  CHECK(ex[1]->bytes == T * state);
  Seconds gather = double(T) * coll.time(Collective::AllGather, all, state);
  Seconds reduce = double(T) * coll.time(Collective::AllReduce, all, state);
  CHECK(((ex[0]->exe == Approx(gather) && ex[1]->exe == Approx(reduce)) ||
         (ex[0]->exe == Approx(reduce) && ex[1]->exe == Approx(gather))));
  // The forward exchange runs after the tiles' forward and before anything
  // that reads the layer's output.
  Simulator sim(byHidden);
  sim.simulateFull();
  for (const Task *t : ex)
    CHECK(t->end > t->start);
}

TEST_CASE("weight gradients are tasks of their own, one weighted op late",
          "[Sim]") {
  // An embedding, an LSTM layer (input and recurrent weights, bias) and a
  // projection, data parallel over p100-4x4's 16 GPUs. Each weight's
  // gradient is a task after the op's backward-data task, and waits for
  // the previous weighted op's backward-data (Megatron-LM's deferred
  // embedding gradient): the embedding's gradient is all-reduced while the
  // LSTM computes its own, and the LSTM's input weights' while it computes
  // its recurrent weights'.
  const int64_t T = 40, N = 2048, V = 10000, H = 1024;
  GraphBuilder b;
  ValueId ids = b.input({T, N}, DType::I64);
  ValueId emb = b.weight({V, H});
  ValueId e = b.op("Gather", {emb, ids}, {{T, N, H}})[0];
  ValueId w = b.weight({1, 4 * H, H}), r = b.weight({1, 4 * H, H}),
          bias = b.weight({1, 8 * H});
  ValueId y =
      b.op("LSTM", {e, w, r, bias}, {{T, 1, N, H}}, {{"hidden_size", H}})[0];
  b.op("MatMul", {y, b.weight({H, V})}, {{T, 1, N, V}});
  requireOk(b.g.computeSemantics());
  Topology topo = exampleTopology("p100-4x4");
  CostModel cost(topo.deviceSpec(), nullptr, CostMode::Analytic);
  CollectiveModel coll(topo);
  SimContext ctx{b.g, topo, cost, coll, Optimizer::Sgd};
  // Split on the sample loop: the only one of N's size. Every weight its
  // own all-reduce (buckets of one).
  Strategy s = splitOnSize(b.g, N, 16);
  s.gradSync.bucketParams = 1;
  auto tg = TaskGraph::build(ctx, s);
  if (!tg)
    FAIL(errorMessage(tg.takeError()));
  Simulator sim(*tg);
  sim.simulateFull();
  const OpId gather = 0, lstm = 1;
  const Op &lop = b.g.op(lstm);
  auto kt = cost.kernel(b.g, lop, s.configs[lstm].tile(lop.sem, 0));
  if (!kt)
    FAIL(errorMessage(kt.takeError()));
  auto bwd = on0(*tg, lstm, TaskKind::Backward);
  auto wg = on0(*tg, lstm, TaskKind::WeightGrad);
  REQUIRE(bwd.size() == 1);
  REQUIRE(wg.size() == 3); // W, R, B in input order
  CHECK(bwd[0]->exe == kt->backwardData);
  CHECK(wg[0]->exe + wg[1]->exe + wg[2]->exe ==
        Approx(kt->backwardWeight).epsilon(1e-12));
  // Shares by elements: 4H x H, 4H x H, 8H.
  CHECK(wg[0]->exe == Approx(kt->backwardWeight * double(4 * H * H) /
                             double(8 * H * H + 8 * H)));
  CHECK(wg[2]->exe / wg[0]->exe == Approx(double(8 * H) / double(4 * H * H)));
  auto gbwd = on0(*tg, gather, TaskKind::Backward);
  auto gwg = on0(*tg, gather, TaskKind::WeightGrad);
  REQUIRE(gbwd.size() == 1);
  REQUIRE(gwg.size() == 1);
  for (const Task *t : wg) {
    // After the LSTM's backward-data and the embedding's.
    CHECK(t->start >= bwd[0]->end);
    CHECK(t->start >= gbwd[0]->end);
  }
  // The embedding's gradient runs first, and its all-reduce (and the
  // LSTM's input weights') overlaps the LSTM's weight gradients.
  CHECK(gwg[0]->start < wg[0]->start);
  auto allReduce = [&](ValueId v) -> const Task * {
    for (const Task &t : tg->tasks())
      if (t.alive && t.kind == TaskKind::Collective && t.weight == v)
        return &t;
    return nullptr;
  };
  const Task *embSync = allReduce(emb), *wSync = allReduce(w),
             *rSync = allReduce(r);
  REQUIRE((embSync && wSync && rSync));
  INFO("embedding all-reduce " << embSync->start << " s, W's " << wSync->start
                               << ", R's " << rSync->start
                               << "; R's gradient ends " << wg[1]->end);
  CHECK(embSync->ready <= wg[0]->start);
  CHECK(wSync->ready == wg[0]->end);
  CHECK(rSync->ready == wg[1]->end);
  CHECK(embSync->start < wg[1]->end);
  CHECK(wSync->start < wg[1]->end);
}

TEST_CASE("an op's weight gradients wait for the op its order names", "[Sim]") {
  // An embedding, two LSTM layers and a projection, data parallel over
  // p100-4x4's 16 GPUs. Under Next (the default) the upper LSTM's weight
  // gradients wait for the lower LSTM's backward-data; under Last for the
  // embedding's backward, the end of the input-gradient chain; under Now
  // for nothing but their own backward-data.
  const int64_t T = 8, N = 256, V = 4000, H = 512;
  GraphBuilder b;
  ValueId ids = b.input({T, N}, DType::I64);
  ValueId e = b.op("Gather", {b.weight({V, H}), ids}, {{T, N, H}})[0];
  auto lstm = [&](ValueId x) {
    ValueId y = b.op("LSTM",
                     {x, b.weight({1, 4 * H, H}), b.weight({1, 4 * H, H}),
                      b.weight({1, 8 * H})},
                     {{T, 1, N, H}}, {{"hidden_size", H}})[0];
    return b.op("Squeeze", {y}, {{T, N, H}},
                {{"axes", std::vector<int64_t>{1}}})[0];
  };
  ValueId y = lstm(lstm(e));
  b.op("MatMul", {y, b.weight({H, V})}, {{T, N, V}});
  requireOk(b.g.computeSemantics());
  const OpId gather = 0, lower = 1, upper = 3, proj = 5;
  REQUIRE(b.g.op(lower).kind == "LSTM");
  REQUIRE(b.g.op(upper).kind == "LSTM");
  REQUIRE(b.g.op(proj).kind == "MatMul");
  Topology topo = exampleTopology("p100-4x4");
  CostModel cost(topo.deviceSpec(), nullptr, CostMode::Analytic);
  CollectiveModel coll(topo);
  SimContext ctx{b.g, topo, cost, coll, Optimizer::Sgd};
  Strategy s = splitOnSize(b.g, N, 16);
  // The ops whose backward-data tasks a weight-gradient task of `o` on
  // device 0 waits for.
  auto waitsFor = [&](const TaskGraph &tg, OpId o) {
    std::set<OpId> ops;
    for (const Task *w : on0(tg, o, TaskKind::WeightGrad))
      for (TaskId p : w->preds)
        ops.insert(tg.tasks()[p].op);
    return ops;
  };
  auto build = [&](WeightGradOrder order) {
    Strategy t = s;
    t.weightGrad.assign(b.g.numOps(), 0);
    t.weightGrad[size_t(upper)] = uint8_t(order);
    auto tg = TaskGraph::build(ctx, t);
    if (!tg)
      FAIL(errorMessage(tg.takeError()));
    return std::move(*tg);
  };
  TaskGraph next = build(WeightGradOrder::Next),
            last = build(WeightGradOrder::Last),
            now = build(WeightGradOrder::Now);
  CHECK(next.weightGradOrders(upper).size() == 3);
  // The lower LSTM's next and last anchors are both the embedding.
  CHECK(next.weightGradOrders(lower).size() == 2);
  CHECK(waitsFor(next, upper) == std::set<OpId>{upper, lower});
  CHECK(waitsFor(last, upper) == std::set<OpId>{upper, gather});
  CHECK(waitsFor(now, upper) == std::set<OpId>{upper});
  // The others keep their order.
  for (const TaskGraph *tg : {&next, &last, &now}) {
    CHECK(waitsFor(*tg, lower) == std::set<OpId>{lower, gather});
    CHECK(waitsFor(*tg, proj) == std::set<OpId>{proj, upper});
  }
  // Simulated: the gradients run where their order puts them.
  for (TaskGraph *tg : {&next, &last, &now}) {
    Simulator sim(*tg);
    sim.simulateFull();
  }
  Seconds gatherBwd = on0(last, gather, TaskKind::Backward)[0]->end;
  for (const Task *w : on0(last, upper, TaskKind::WeightGrad))
    CHECK(w->start >= gatherBwd);
  Seconds lowerBwd = on0(now, lower, TaskKind::Backward)[0]->start;
  for (const Task *w : on0(now, upper, TaskKind::WeightGrad))
    CHECK(w->end <= lowerBwd);
}
