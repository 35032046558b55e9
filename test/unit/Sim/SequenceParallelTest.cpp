// Sequence parallelism (Korthikanti et al. 2022) as the simulator prices any
// strategy that has it: a partial sum whose takers each need only their own
// device's slice is reduce-scattered, a region every device of a group reads
// whole while each holds one slice of it is all-gathered, and the ops split
// along the sequence hold 1/t of their activations. Delta simulation stays
// exact when a neighbour's change turns an all-reduce into a reduce-scatter.
#include "SimFixture.h"

#include "soap/Parallel/Megatron.h"
#include "soap/Support/Rng.h"
#include <set>

using namespace soap;
using namespace soap::test;

namespace {

Strategy megatron(Fixture &f, int32_t t, int32_t p, bool sequence) {
  auto s = megatronStrategy(*f.g, f.topo, MegatronShape{t, p, 0, sequence});
  if (!s)
    FAIL(errorMessage(s.takeError()));
  return std::move(*s);
}

/// The alive collectives of `role` whose op is `name`.
std::vector<const Task *> collectives(const TaskGraph &tg, const Graph &g,
                                      CollectiveRole role, const char *name) {
  OpId o = g.findOp(name);
  REQUIRE(o >= 0);
  std::vector<const Task *> out;
  for (const Task &t : tg.tasks())
    if (t.alive && t.kind == TaskKind::Collective && t.role == role &&
        t.op == o)
      out.push_back(&t);
  return out;
}

} // namespace

TEST_CASE("sequence parallelism reduce-scatters, all-gathers and holds 1/t",
          "[Sim][sp]") {
  // The small BERT at batch 64 on one DGX H100: t = 2, d = 4, gradient
  // accumulation over m = 4, so a micro-batch's tile holds 64 / (4 x 4) = 4
  // sequences of 8 tokens of 16 floats: 2,048 bytes.
  Fixture f("transformer_small", 64, "dgx-h100-1");
  const Graph &g = *f.g;
  Strategy s0 = megatron(f, 2, 1, false), s1 = megatron(f, 2, 1, true);
  REQUIRE(s1.pipeline.microBatches == 4);
  // Megatron's plan overlaps the SP collectives with the GEMMs (the next
  // test); here each is priced whole.
  REQUIRE(s1.gradSync.tpCommOverlap);
  REQUIRE_FALSE(s0.gradSync.tpCommOverlap);
  s1.gradSync.tpCommOverlap = false;
  const Bytes region = 4 * 8 * 16 * 4;
  OpId ln = g.findOp("/layers.0/ln1/LayerNormalization");
  REQUIRE(s0.configs[size_t(ln)].str(g.op(ln).sem) == "d0=4 x2 @0-7");
  REQUIRE(s1.configs[size_t(ln)].str(g.op(ln).sem) == "d0=4 d1=2 @0-7");
  // The GEMMs keep Megatron's column and row splits.
  for (const char *name :
       {"/layers.0/ffn_in/MatMul", "/layers.0/attn/proj/MatMul"}) {
    OpId o = g.findOp(name);
    CHECK(s1.configs[size_t(o)] == s0.configs[size_t(o)]);
  }

  // Memory: LayerNorm keeps its input (its statistics are recomputed);
  // split along the sequence, half of it per device.
  const OpSemantics &sem = g.op(ln).sem;
  Bytes kept0 = keptBytes(g, s0, ln,
                          microBatchTile(s0.configs[size_t(ln)], sem, 0, 0, 4));
  Bytes kept1 = keptBytes(g, s1, ln,
                          microBatchTile(s1.configs[size_t(ln)], sem, 0, 0, 4));
  CHECK(kept0 == region);
  CHECK(kept1 == kept0 / 2);
  // The ops SP splits (the embedding, the bias and residual adds, the
  // dropouts and the LayerNorms) keep half as much; those that keep
  // anything are the 4 LayerNorms (their input) and the 3 dropouts (a
  // byte mask per element), so every device holds 4 x 1,024 + 3 x 256 bytes
  // less.
  Bytes halved = 0;
  for (const Op &op : g.ops()) {
    const OpConfig &c0 = s0.configs[size_t(op.id)],
                   &c1 = s1.configs[size_t(op.id)];
    if (c0 == c1)
      continue;
    Bytes a = keptBytes(g, s0, op.id, microBatchTile(c0, op.sem, 0, 0, 4));
    Bytes b = keptBytes(g, s1, op.id, microBatchTile(c1, op.sem, 0, 0, 4));
    CHECK(b * 2 == a);
    halved += a - b;
  }
  CHECK(halved == 4 * region / 2 + 3 * (region / 4) / 2);
  // The GEMMs reading what SP splits gather it whole, and keep (as
  // Megatron-LM does) only the device's half of it for their backward:
  // once per value, however many GEMMs read it (query, key and value share
  // one tensor).
  std::set<ValueId> gathered;
  for (const Op &op : g.ops()) {
    if (op.kind != "MatMul" || s0.configs[size_t(op.id)] != s1.configs[size_t(op.id)])
      continue;
    OpId p = g.value(op.input(0)).producer;
    if (p >= 0 && s0.configs[size_t(p)] != s1.configs[size_t(p)])
      gathered.insert(op.input(0));
  }
  // The embedding's dropout (read by query, key and value), ln1 (ffn_in)
  // and ln2 (the head's dense layer).
  CHECK(gathered.size() == 3);
  auto g0 = TaskGraph::build(f.ctx, s0), g1 = TaskGraph::build(f.ctx, s1);
  if (!g0 || !g1)
    FAIL("build");
  for (DeviceId d = 0; d < 8; ++d)
    CHECK(g0->memory()[d].saved - g1->memory()[d].saved ==
          halved + Bytes(gathered.size()) * region / 2);

  // The row-parallel GEMM's partial sums: all-reduced without SP, each
  // device's half of the sequence reduce-scattered with it; the same 2,048
  // bytes (a micro-batch's region) over the tensor-parallel pair.
  for (const TaskGraph *tg : {&*g0, &*g1}) {
    bool sp = tg == &*g1;
    auto sums = collectives(*tg, g, CollectiveRole::PartialSum,
                            "/layers.0/attn/proj/MatMul");
    REQUIRE(sums.size() == 4 * 4); // d groups x m micro-batches
    for (const Task *t : sums) {
      CHECK(t->comm ==
            (sp ? Collective::ReduceScatter : Collective::AllReduce));
      CHECK(t->bytes == region);
      CHECK(t->groupSize == 2);
      CHECK(t->exe == f.coll.time(t->comm, {0, 1}, region));
    }
    // The column-parallel GEMM's input gradients likewise.
    auto back = collectives(*tg, g, CollectiveRole::PartialSum,
                            "/layers.0/ffn_in/MatMul");
    REQUIRE(back.size() == 4 * 4);
    for (const Task *t : back) {
      CHECK(t->comm ==
            (sp ? Collective::ReduceScatter : Collective::AllReduce));
      CHECK(t->bytes == region);
    }
    // Before the column-parallel GEMM its input is all-gathered; before
    // the row-parallel GEMM's backward, its output's gradient (on the edge
    // to its bias add).
    auto fwd = collectives(*tg, g, CollectiveRole::ActivationGather,
                           "/layers.0/ffn_in/MatMul");
    auto bwd = collectives(*tg, g, CollectiveRole::GradientGather,
                           "/layers.0/attn/proj/Add");
    CHECK(fwd.size() == (sp ? 16u : 0u));
    CHECK(bwd.size() == (sp ? 16u : 0u));
    for (const std::vector<const Task *> &v : {fwd, bwd})
      for (const Task *t : v) {
        CHECK(t->comm == Collective::AllGather);
        CHECK(t->bytes == region);
        CHECK(t->groupSize == 2);
      }
  }
}

TEST_CASE("tensor-parallel collectives overlap the GEMMs in chunks",
          "[Sim][sp]") {
  // Transformer Engine's userbuffers (GradSync::tpCommOverlap): with t
  // chunks, the GEMM's first chunk (all-gather) or last (reduce-scatter)
  // runs alone and each of the other t - 1 steps takes the longer of a
  // GEMM chunk (G / t) and a ring step (C / (t - 1)). The collective keeps
  // what exceeds G, plus NCCL's share of the time it hid.
  Fixture f("transformer_small", 64, "dgx-h100-1");
  const Graph &g = *f.g;
  Strategy on = megatron(f, 2, 1, true), off = on;
  off.gradSync.tpCommOverlap = false;
  auto gOn = TaskGraph::build(f.ctx, on), gOff = TaskGraph::build(f.ctx, off);
  if (!gOn || !gOff)
    FAIL("build");
  double share = f.topo.deviceSpec().ncclComputeShareIntra;
  auto expected = [&](Seconds comm, Seconds gemm) {
    Seconds chunk = gemm / 2, step = comm;
    return std::max<Seconds>(0, chunk + std::max(chunk, step) - gemm) +
           share * std::min(chunk, step);
  };
  // The GEMM beside each: the first of the collective's successors (an
  // all-gather's) or predecessors (a reduce-scatter's) that is a compute
  // task of `gemm`.
  auto gemmOf = [&](const TaskGraph &tg, const Task &t, OpId gemm,
                    bool after) {
    for (TaskId x : after ? t.succs : t.preds) {
      const Task &c = tg.tasks()[x];
      if (c.op == gemm &&
          (c.kind == TaskKind::Forward || c.kind == TaskKind::Backward))
        return c.exe;
    }
    FAIL("no GEMM beside the collective");
    return Seconds(0);
  };
  struct Case {
    CollectiveRole role;
    const char *collectiveOf, *gemm;
    bool after; ///< the GEMM runs after the collective
  };
  size_t checked = 0;
  for (const Case &k :
       {Case{CollectiveRole::PartialSum, "/layers.0/attn/proj/MatMul",
             "/layers.0/attn/proj/MatMul", false},
        Case{CollectiveRole::ActivationGather, "/layers.0/ffn_in/MatMul",
             "/layers.0/ffn_in/MatMul", true},
        Case{CollectiveRole::GradientGather, "/layers.0/attn/proj/Add",
             "/layers.0/attn/proj/MatMul", true}}) {
    auto a = collectives(*gOn, g, k.role, k.collectiveOf);
    auto b = collectives(*gOff, g, k.role, k.collectiveOf);
    REQUIRE(a.size() == 16);
    REQUIRE(a.size() == b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      Seconds comm = b[i]->exe;
      Seconds gemm = gemmOf(*gOn, *a[i], g.findOp(k.gemm), k.after);
      INFO(k.collectiveOf << ": " << comm * 1e6 << " us beside a "
                          << gemm * 1e6 << " us GEMM");
      CHECK(comm > 0);
      CHECK(a[i]->exe == Approx(expected(comm, gemm)).epsilon(1e-12));
      CHECK(a[i]->exe < comm);
      ++checked;
    }
  }
  CHECK(checked == 48);
  // The column-parallel GEMM's input-gradient reduce-scatter is left
  // whole: its weight-gradient GEMM runs beside it anyway.
  auto ra = collectives(*gOn, g, CollectiveRole::PartialSum,
                        "/layers.0/ffn_in/MatMul");
  auto rb = collectives(*gOff, g, CollectiveRole::PartialSum,
                        "/layers.0/ffn_in/MatMul");
  REQUIRE(ra.size() == rb.size());
  for (size_t i = 0; i < ra.size(); ++i)
    CHECK(ra[i]->exe == rb[i]->exe);
  // And the iteration is shorter.
  Simulator simOn(*gOn), simOff(*gOff);
  CHECK(simOn.simulateFull() < simOff.simulateFull());
}

TEST_CASE("delta simulation equals full simulation as sums change kind",
          "[Sim][sp]") {
  // A walk that moves ops between Megatron's plans with and without SP
  // (each move turns a neighbour's all-reduce into a reduce-scatter or
  // back, or an all-gather into transfers), taken back one time in three.
  Fixture f("transformer_small", 64, "dgx-h100-1");
  Strategy s0 = megatron(f, 2, 1, false), s = megatron(f, 2, 1, true);
  std::vector<OpId> moved;
  for (const Op &op : f.g->ops())
    if (!(s0.configs[size_t(op.id)] == s.configs[size_t(op.id)]))
      moved.push_back(op.id);
  REQUIRE(moved.size() > 10);
  Strategy s1 = s;
  auto tg = TaskGraph::build(f.ctx, s);
  if (!tg)
    FAIL(errorMessage(tg.takeError()));
  Simulator sim(*tg);
  sim.simulateFull();
  Rng rng(7, "sp-delta");
  for (int step = 0; step < 40; ++step) {
    OpId o = moved[rng.uniform(moved.size())];
    const OpConfig &now = s.configs[size_t(o)];
    const OpConfig &c = now == s1.configs[size_t(o)] ? s0.configs[size_t(o)]
                                                     : s1.configs[size_t(o)];
    f.checkDelta(sim, *tg, s, o, c, rng.uniform(3) == 0);
  }
}

TEST_CASE("a tensor several ops save is held once; a delta that changes "
          "its readers stays exact",
          "[Sim][sp]") {
  // The small BERT's query, key and value GEMMs all save the embedding
  // dropout's output, which autograd holds once; so are the inputs its
  // GELU's element-wise ops share.
  Fixture f("transformer_small", 64, "dgx-h100-1");
  const Graph &g = *f.g;
  Strategy s = megatron(f, 2, 1, false);
  OpId q = g.findOp("/layers.0/attn/query/MatMul"),
       k = g.findOp("/layers.0/attn/key/MatMul"),
       v = g.findOp("/layers.0/attn/value/MatMul");
  REQUIRE(s.configs[size_t(k)] == s.configs[size_t(q)]);
  REQUIRE(s.configs[size_t(v)] == s.configs[size_t(q)]);
  auto tg = TaskGraph::build(f.ctx, s);
  if (!tg)
    FAIL("build");
  // What device 0's tiles save, each (tensor, region) once.
  auto heldOnce = [&](const Strategy &st) {
    int32_t m = st.pipeline.microBatches;
    std::set<std::pair<ValueId, Box>> seen;
    double bytes = 0;
    int dropped = 0;
    for (const Op &op : g.ops()) {
      const OpConfig &c = st.configs[size_t(op.id)];
      for (int64_t t = 0; t < c.numTiles(); ++t) {
        if (c.device(t, 0) != 0)
          continue;
        Box tile = microBatchTile(c, op.sem, t, 0, m);
        bytes += double(op.sem.savedBytes(tile, {}, {}));
        for (const SavedOperand &so : op.sem.saved) {
          if (so.isOutput)
            continue;
          Box r = op.sem.inputRegion(so.index, tile);
          if (!seen.insert({op.input(size_t(so.index)), r}).second) {
            ++dropped;
            bytes -= double(r.volume()) * so.bytesPerElement;
          }
        }
      }
    }
    return std::pair<Bytes, int>(Bytes(bytes), dropped);
  };
  auto [once, dropped] = heldOnce(s);
  CHECK(dropped >= 2); // the key's and the value's copies at least
  CHECK(tg->memory()[0].saved == once);

  // Split the query apart from the others: it no longer shares their
  // tensor, and a delta to it gives what a fresh build gives.
  Strategy moved = s;
  OpConfig c = s.configs[size_t(q)];
  std::reverse(c.devices.begin(), c.devices.end());
  moved.configs[size_t(q)] = c;
  auto fresh = TaskGraph::build(f.ctx, moved);
  if (!fresh)
    FAIL("build");
  std::vector<TaskId> changed;
  std::vector<Seconds> removedReady;
  if (auto err = tg->changeConfig(q, c, changed, removedReady))
    FAIL(errorMessage(std::move(err)));
  for (DeviceId d = 0; d < 8; ++d)
    CHECK(tg->memory()[d].saved == fresh->memory()[d].saved);
  CHECK(fresh->memory()[0].saved > once);
}
