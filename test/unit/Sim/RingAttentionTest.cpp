// Ring attention (TaskGraph::buildRing): a FlashAttention split on its
// query loop passes its K and V blocks round the split, overlapped with the
// blocks' compute, instead of gathering them whole.
#include "../IR/TestGraphs.h"
#include "../TestInputs.h"

#include "soap/Sim/Simulator.h"
#include <catch2/catch.hpp>

using namespace soap;
using namespace soap::test;

namespace {

/// x [n, s, h, e] -> Q, K, V (one matmul each) -> causal FlashAttention.
struct Attention {
  static constexpr int64_t N = 2, S = 16, H = 2, E = 4;
  GraphBuilder b;
  OpId flash = -1;
  Attention() {
    ValueId x = b.input({N, S, H, E});
    std::vector<ValueId> qkv;
    for (int i = 0; i < 3; ++i)
      qkv.push_back(b.op("MatMul", {x, b.weight({E, E})}, {{N, S, H, E}})[0]);
    b.op("FlashAttention", qkv, {{N, S, H, E}}, flashAttentionAttrs(0.5, true));
    flash = 3;
    requireOk(b.g.computeSemantics());
  }
  /// Op o with its loop of size S (the sequence) split `c` ways on
  /// devices 0 .. c-1.
  OpConfig seqSplit(OpId o, int32_t c) const {
    const OpSemantics &sem = b.g.op(o).sem;
    OpConfig cfg = OpConfig::single(sem, 0);
    for (size_t l = 0; l < sem.loops.size(); ++l)
      if (sem.loops[l].size == S && sem.loops[l].splittable)
        cfg.degree[l] = c;
    cfg.devices.clear();
    for (int32_t k = 0; k < c; ++k)
      cfg.devices.push_back(DeviceId(k));
    return cfg;
  }
  Strategy contextParallel(int32_t c) const {
    Strategy s;
    for (const Op &op : b.g.ops())
      s.configs.push_back(seqSplit(op.id, c));
    return s;
  }
};

} // namespace

TEST_CASE("ring attention moves the K and V blocks round the query split",
          "[Sim]") {
  Attention a;
  const Graph &g = a.b.g;
  const OpSemantics &sem = g.op(a.flash).sem;
  int q = -1, k = -1;
  for (size_t l = 0; l < sem.loops.size(); ++l) {
    if (sem.loops[l].name == "q")
      q = int(l);
    if (sem.loops[l].name == "k")
      k = int(l);
  }
  REQUIRE((q >= 0 && k >= 0));
  CHECK(sem.loops[size_t(q)].ring == k);
  Topology topo = exampleTopology("dgx-h100-1");
  CostModel cost(topo.deviceSpec(), nullptr, CostMode::Analytic);
  CollectiveModel coll(topo);
  SimContext ctx{g, topo, cost, coll, Optimizer::Sgd};
  const int32_t C = 4;
  Strategy s = a.contextParallel(C);
  auto tg = TaskGraph::build(ctx, s);
  if (!tg)
    FAIL(errorMessage(tg.takeError()));
  Simulator sim(*tg);
  sim.simulateFull();

  // One K block and one V block: [n, s / C, h, e] floats each.
  const Bytes block = 2 * Attention::N * (Attention::S / C) * Attention::H *
                      Attention::E * 4;
  std::vector<DeviceId> all{0, 1, 2, 3};
  auto hop = [&](Bytes b) {
    return coll.time(Collective::AllGather, all, b * C) / double(C - 1);
  };
  const Op &fop = g.op(a.flash);
  auto kt = cost.kernel(g, fop, s.configs[size_t(a.flash)].tile(sem, 0));
  if (!kt)
    FAIL(errorMessage(kt.takeError()));
  std::vector<const Task *> ring, fwd;
  for (const Task &t : tg->tasks()) {
    if (!t.alive || t.op != a.flash)
      continue;
    if (t.kind == TaskKind::Collective) {
      // Only the ring: K's and V's gradients come home with it, not by an
      // all-reduce of partial sums.
      CHECK(t.role == CollectiveRole::Exchange);
      ring.push_back(&t);
    }
    if (t.kind == TaskKind::Forward)
      fwd.push_back(&t);
    // Each tile already holds its own K and V block: nothing is gathered.
    if (t.kind == TaskKind::Transfer)
      FAIL("a transfer into the ring-split attention");
  }
  REQUIRE(ring.size() == 2);
  const Task *f = ring[0], *bw = ring[1];
  if (f->bytes > bw->bytes)
    std::swap(f, bw);
  // Forward: C - 1 steps of K and V. Backward: C - 1 steps of K, V, dK and
  // dV, and dK, dV home.
  CHECK(f->bytes == (C - 1) * block);
  CHECK(bw->bytes == (C - 1) * 2 * block + block);
  CHECK(f->exe ==
        Approx(double(C - 1) * std::max(kt->forward / C, hop(block))));
  CHECK(bw->exe == Approx(double(C - 1) *
                              std::max(kt->backward() / C, hop(2 * block)) +
                          hop(block)));
  // The ring occupies the group's devices (they compute the other blocks).
  for (DeviceId d : all)
    CHECK(std::find(f->resources.begin(), f->resources.end(), d) !=
          f->resources.end());
  // Causal work is balanced (Megatron's load-balanced layout): every
  // tile's local block takes the same time, a C-th of the average tile.
  REQUIRE(fwd.size() == size_t(C));
  for (const Task *t : fwd)
    CHECK(t->exe == Approx(fwd[0]->exe));
  CHECK(fwd[0]->exe == Approx(kt->forward / C));
  // The ring runs after the local block, before the output is read.
  CHECK(f->start >= fwd[0]->end);
  // Saved for backward: the tile's own K and V blocks, not the whole.
  std::vector<DType> f32(4, DType::F32);
  Box tile = s.configs[size_t(a.flash)].tile(sem, 0);
  int64_t qo = Attention::N * (Attention::S / C) * Attention::H *
               Attention::E * 4; // Q or O block
  CHECK(sem.savedBytes(tile, f32, f32) ==
        2 * qo + block + Attention::N * Attention::H * (Attention::S / C) * 4);
}

TEST_CASE("delta simulation equals full simulation with ring attention",
          "[Sim]") {
  Attention a;
  const Graph &g = a.b.g;
  Topology topo = exampleTopology("dgx-h100-1");
  CostModel cost(topo.deviceSpec(), nullptr, CostMode::Analytic);
  CollectiveModel coll(topo);
  SimContext ctx{g, topo, cost, coll, Optimizer::Sgd};
  Strategy s;
  for (const Op &op : g.ops())
    s.configs.push_back(OpConfig::single(op.sem, 0));
  auto tg = TaskGraph::build(ctx, s);
  if (!tg)
    FAIL(errorMessage(tg.takeError()));
  Simulator sim(*tg);
  sim.simulateFull();
  // The attention and its producers in and out of sequence splits of 2
  // and 4, K gathered from other splits or held, the ring on and off.
  std::vector<std::pair<OpId, int32_t>> changes{
      {3, 4}, {1, 4}, {2, 2}, {0, 4}, {3, 2}, {2, 4}, {3, 1}, {1, 1}, {3, 4}};
  for (auto [o, c] : changes) {
    OpConfig cfg = a.seqSplit(o, c);
    auto t = sim.apply(o, cfg);
    if (!t)
      FAIL(errorMessage(t.takeError()));
    s.configs[size_t(o)] = cfg;
    auto fresh = TaskGraph::build(ctx, s);
    if (!fresh)
      FAIL(errorMessage(fresh.takeError()));
    Simulator full(*fresh);
    INFO("op " << o << " split " << c);
    REQUIRE(*t == full.simulateFull());
    for (DeviceId d = 0; d < topo.numDevices(); ++d)
      REQUIRE(tg->memory()[d].total() == fresh->memory()[d].total());
  }
}
