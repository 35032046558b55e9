// TensorOpt frontier tracking: Algorithm 1, the re-scheduling
// shortest path, and the property that FT's frontier equals the brute-force
// frontier over every strategy of its configuration set (configurations and
// tensor-reuse options, recomputation) on a chain, a residual block, a
// two-branch block, an attention block and a weight shared by two ops;
// recomputation's configurations; heuristic elimination says it ran.
#include "FrontierOracle.h"
#include "soap/Search/FrontierTracking.h"
#include "../IR/TestGraphs.h"
#include "../TestInputs.h"
#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <catch2/catch.hpp>
#include <new>
#include <random>

using namespace soap;
using namespace soap::test;

namespace {

/// x -> Relu -> MatMul -> Relu -> MatMul.
Graph chain() {
  GraphBuilder b;
  auto x = b.op("Relu", {b.input({8, 16})}, {{8, 16}})[0];
  auto y = b.op("MatMul", {x, b.weight({16, 32})}, {{8, 32}})[0];
  auto r = b.op("Relu", {y}, {{8, 32}})[0];
  b.op("MatMul", {r, b.weight({32, 16})}, {{8, 16}});
  requireOk(b.g.computeSemantics());
  return std::move(b.g);
}

/// a = Relu(x); a -> MatMul -> Relu -> MatMul -> Add(a, .).
Graph residual() {
  GraphBuilder b;
  auto a = b.op("Relu", {b.input({8, 16})}, {{8, 16}})[0];
  auto y = b.op("MatMul", {a, b.weight({16, 32})}, {{8, 32}})[0];
  auto r = b.op("Relu", {y}, {{8, 32}})[0];
  auto z = b.op("MatMul", {r, b.weight({32, 16})}, {{8, 16}})[0];
  b.op("Add", {a, z}, {{8, 16}});
  requireOk(b.g.computeSemantics());
  return std::move(b.g);
}

/// a = Relu(x); two MatMuls of a joined by an Add.
Graph twoBranch() {
  GraphBuilder b;
  auto a = b.op("Relu", {b.input({8, 16})}, {{8, 16}})[0];
  auto l = b.op("MatMul", {a, b.weight({16, 16})}, {{8, 16}})[0];
  auto r = b.op("MatMul", {a, b.weight({16, 16})}, {{8, 16}})[0];
  b.op("Add", {l, r}, {{8, 16}});
  requireOk(b.g.computeSemantics());
  return std::move(b.g);
}

/// Single-head self-attention with a residual: q, k, v projections,
/// softmax(q k^T) v, added to the input.
Graph attention() {
  GraphBuilder b;
  auto x = b.op("Relu", {b.input({8, 16})}, {{8, 16}})[0];
  auto q = b.op("MatMul", {x, b.weight({16, 16})}, {{8, 16}})[0];
  auto k = b.op("MatMul", {x, b.weight({16, 16})}, {{8, 16}})[0];
  auto v = b.op("MatMul", {x, b.weight({16, 16})}, {{8, 16}})[0];
  auto kt = b.op("Transpose", {k}, {{16, 8}}, {{"perm", Ints{1, 0}}})[0];
  auto s = b.op("MatMul", {q, kt}, {{8, 8}})[0];
  auto p = b.op("Softmax", {s}, {{8, 8}}, {{"axis", int64_t(-1)}})[0];
  auto o = b.op("MatMul", {p, v}, {{8, 16}})[0];
  b.op("Add", {o, x}, {{8, 16}});
  requireOk(b.g.computeSemantics());
  return std::move(b.g);
}

/// x -> MatMul(., W) -> Relu -> MatMul(., W): one weight, two users (as
/// tied embeddings); `tied` false gives the second MatMul its own weight.
Graph sharedWeight(bool tied = true, int64_t n = 16) {
  GraphBuilder b;
  auto x = b.op("Relu", {b.input({8, n})}, {{8, n}})[0];
  auto w = b.weight({n, n});
  auto y = b.op("MatMul", {x, w}, {{8, n}})[0];
  auto r = b.op("Relu", {y}, {{8, n}})[0];
  b.op("MatMul", {r, tied ? w : b.weight({n, n})}, {{8, n}});
  requireOk(b.g.computeSemantics());
  return std::move(b.g);
}

struct Fixture {
  Topology topo = exampleTopology("v100-2x8");
  CostModel cost{topo.deviceSpec(), nullptr, CostMode::Analytic};
  CollectiveModel coll{topo};
};

bool near(double a, double b) {
  return std::abs(a - b) <= 1e-9 * std::max({1.0, std::abs(a), std::abs(b)});
}

void requireSameFrontier(const FtResult &ft, const std::vector<FtCosts> &bf) {
  REQUIRE(!bf.empty());
  REQUIRE(ft.points.size() == bf.size());
  for (size_t i = 0; i < bf.size(); ++i) {
    INFO("point " << i);
    CHECK(near(ft.points[i].costs.memory, bf[i].memory));
    CHECK(near(ft.points[i].costs.time, bf[i].time));
  }
}

/// The brute-force frontier of attention() on 2 devices (about 70 s under
/// ASan), enumerated once: two tests compare with it, and FtModel::build
/// reads no option they vary (maxMergedConfigs steers only the tracking).
const std::vector<FtCosts> &attentionBruteForce() {
  static const std::vector<FtCosts> bf = [] {
    Fixture f;
    Graph g = attention();
    SearchProblem p{g, f.topo, f.cost, f.coll};
    FtOptions o;
    o.devices = 2;
    auto m = FtModel::build(p, o);
    return m ? bruteForceFrontier(*m, 20000000) : std::vector<FtCosts>{};
  }();
  return bf;
}

} // namespace

TEST_CASE("Algorithm 1 keeps the tuples no other dominates", "[ft]") {
  std::vector<FrontierCandidate> c(5);
  double mt[5][2] = {{3, 1}, {1, 5}, {2, 5}, {2, 2}, {4, 1}};
  for (int i = 0; i < 5; ++i) {
    c[size_t(i)].memory = mt[i][0];
    c[size_t(i)].time = mt[i][1];
  }
  auto r = reduceCandidates(c);
  REQUIRE(r.size() == 3);
  CHECK(r[0].memory == 1);
  CHECK(r[1].memory == 2);
  CHECK(r[1].time == 2);
  CHECK(r[2].memory == 3);
  // (1,5) (2,2) (3,1): with a 55% resolution (3,1) gains only 50% over
  // (2,2) but stays, being the fastest; a middle tuple within the
  // resolution goes.
  CHECK(reduceCandidates(c, 0.45).size() == 3);
  CHECK(reduceCandidates(c, 0.55).size() == 3);
  c[3].time = 4; // (2,4): only 20% faster than (1,5)
  auto eps = reduceCandidates(c, 0.55);
  REQUIRE(eps.size() == 2);
  CHECK(eps[0].memory == 1);
  CHECK(eps[1].memory == 3);
  CHECK(eps[1].time == 1);
  CHECK(reduceCandidates(c, 0).size() == 3);
  Frontier a{{1, 1, kNoTrace}, {0.5, 2, kNoTrace}};
  Frontier b{{1, 0, kNoTrace}, {0.25, 3, kNoTrace}};
  std::vector<FrontierCandidate> prod;
  appendProduct(prod, a, b);
  CHECK(prod.size() == 4);
  // (2,1) (1.5,2) (1.25,4) (0.75,5): all on the frontier; a fifth tuple
  // (1.5,4) is dominated by (1.25,4).
  prod.push_back(prod[0]);
  prod.back().time = 1.5;
  prod.back().memory = 4;
  CHECK(reduceCandidates(prod).size() == 4);
}

TEST_CASE("Re-scheduling is the cheapest sequence of collectives", "[ft]") {
  Fixture f;
  Graph g = chain();
  SearchProblem p{g, f.topo, f.cost, f.coll};
  FtOptions o;
  o.devices = 4;
  auto m = FtModel::build(p, o);
  if (!m)
    FAIL(errorMessage(m.takeError()));
  std::vector<int64_t> shape{64, 1024};
  // Splits: [dim0, dim1, partial, replicas] in log2 over 4 devices.
  CHECK(m->reschedule(shape, 4, {2, 0, 0, 0}, {2, 0, 0, 0}) == 0);
  // Slicing a replicated tensor is free.
  CHECK(m->reschedule(shape, 4, {0, 0, 0, 2}, {0, 2, 0, 0}) == 0);
  Seconds gather = m->reschedule(shape, 4, {2, 0, 0, 0}, {0, 0, 0, 2});
  Seconds allReduce = m->reschedule(shape, 4, {0, 0, 2, 0}, {0, 0, 0, 2});
  Seconds reduceScatter = m->reschedule(shape, 4, {0, 0, 2, 0}, {2, 0, 0, 0});
  CHECK(gather > 0);
  CHECK(allReduce > 0);
  CHECK(reduceScatter > 0);
  // Re-splitting dim 0 as dim 1 goes through the cheaper of gather + slice.
  Seconds swap = m->reschedule(shape, 4, {2, 0, 0, 0}, {0, 2, 0, 0});
  CHECK(swap <= gather);
  CHECK(swap > 0);
  // A partial sum reduced into a split is no dearer than all-reduce + slice.
  CHECK(reduceScatter <= allReduce);
}

TEST_CASE("FT's frontier equals the brute-force frontier", "[ft]") {
  Fixture f;
  struct Case {
    const char *name;
    Graph g;
    size_t devices;
  };
  std::vector<Case> cases;
  cases.push_back({"chain", chain(), 4});
  cases.push_back({"residual block", residual(), 4});
  cases.push_back({"two-branch block", twoBranch(), 4});
  cases.push_back({"attention block", attention(), 2});
  cases.push_back({"shared weight", sharedWeight(), 4});
  for (Case &c : cases) {
    SECTION(c.name) {
      SearchProblem p{c.g, f.topo, f.cost, f.coll};
      FtOptions o;
      o.devices = c.devices;
      auto m = FtModel::build(p, o);
      REQUIRE(static_cast<bool>(m));
      std::vector<FtCosts> bf = std::string(c.name) == "attention block"
                                    ? attentionBruteForce()
                                    : bruteForceFrontier(*m, 20000000);
      FtResult ft = frontierTracking(*m, o);
      INFO(c.name << ": " << ft.points.size() << " points, "
                  << ft.stats.nodeEliminations << " node, "
                  << ft.stats.edgeEliminations << " edge, "
                  << ft.stats.branchEliminations << " branch eliminations");
      CHECK(ft.stats.exact());
      requireSameFrontier(ft, bf);
      // The frontier trades memory for time: more than one point.
      CHECK(ft.points.size() > 1);
      // FT-Elimination (no LDP) reaches the same frontier.
      FtOptions e = o;
      e.useLdp = false;
      requireSameFrontier(frontierTracking(*m, e), bf);
      // Any thread count gives the same strategies.
      FtOptions t = o;
      t.threads = 3;
      FtResult ft3 = frontierTracking(*m, t);
      REQUIRE(ft3.points.size() == ft.points.size());
      for (size_t i = 0; i < ft.points.size(); ++i) {
        CHECK(ft3.points[i].assignment.config ==
              ft.points[i].assignment.config);
        CHECK(ft3.points[i].assignment.reuse == ft.points[i].assignment.reuse);
      }
      // Every point unrolls to a valid strategy.
      for (const FtPoint &pt : ft.points)
        requireOk(
            verifyStrategy(assignmentStrategy(*m, pt.assignment), c.g, f.topo));
    }
  }
}

TEST_CASE("Tensor reuse trades memory for re-scheduling time", "[ft]") {
  Fixture f;
  Graph g = attention();
  SearchProblem p{g, f.topo, f.cost, f.coll};
  FtOptions o;
  o.devices = 2;
  auto m = FtModel::build(p, o);
  REQUIRE(static_cast<bool>(m));
  // Softmax saves its output and the MatMul after it saves its input: some
  // configuration pair that re-schedules the tensor offers all three.
  bool three = false;
  for (size_t e = 0; e < m->edges().size(); ++e) {
    const FtEdge &ed = m->edges()[e];
    for (size_t a = 0; a < m->configs(ed.producer).size(); ++a)
      for (size_t b = 0; b < m->configs(ed.consumer).size(); ++b) {
        const auto &opts = m->edgeOptions(e, a, b);
        if (opts.size() != 3)
          continue;
        three = true;
        CHECK(opts[1].time > opts[0].time);
        CHECK(opts[1].memory < 0);
        // Getting the copy back may be a free slice.
        CHECK(opts[2].time >= opts[0].time);
        CHECK(opts[2].memory < 0);
      }
  }
  CHECK(three);
  FtOptions none = o;
  none.tensorReuse = false;
  auto m0 = FtModel::build(p, none);
  REQUIRE(static_cast<bool>(m0));
  FtResult with = frontierTracking(*m, o), without = frontierTracking(*m0, o);
  // Reuse only adds options: its least memory is no more than without.
  CHECK(with.points.front().costs.memory <=
        without.points.front().costs.memory);
}

TEST_CASE("Recomputation is a configuration of the ops that save", "[ft]") {
  Fixture f;
  Graph g = attention();
  SearchProblem p{g, f.topo, f.cost, f.coll};
  FtOptions o;
  o.devices = 2;
  auto m = FtModel::build(p, o);
  REQUIRE(static_cast<bool>(m));
  FtOptions off = o;
  off.recompute = false;
  auto m0 = FtModel::build(p, off);
  REQUIRE(static_cast<bool>(m0));
  for (const Op &op : g.ops()) {
    size_t kept = m0->configs(op.id).size();
    INFO(op.name << " (" << op.kind << ")");
    if (!savesActivations(op.sem)) {
      // Transpose and Add save nothing: no recomputed variant.
      CHECK(m->configs(op.id).size() == kept);
      continue;
    }
    REQUIRE(m->configs(op.id).size() == 2 * kept);
    for (size_t k = 0; k < kept; ++k) {
      const FtConfig &a = m->configs(op.id)[k],
                     &b = m->configs(op.id)[kept + k];
      CHECK(!a.recompute);
      CHECK(b.recompute);
      CHECK(a.degree == b.degree);
      CHECK(a.replicas == b.replicas);
      // The forward runs twice; what it saves is not held.
      Box tile = m->opConfig(op.id, k).tile(op.sem, 0);
      auto kt = f.cost.kernel(g, op, tile);
      REQUIRE(static_cast<bool>(kt));
      CHECK(near(m->computeTime(op.id, kept + k),
                 m->computeTime(op.id, k) + kt->forward));
      TileMemory tm = f.cost.memory(g, op, tile, p.optimizer);
      double graphIn = 0;
      for (size_t i = 0; i < op.inputs.size(); ++i)
        if (g.value(op.inputs[i]).kind == ValueKind::Input)
          graphIn += double(op.sem.inputRegion(int(i), tile).volume()) * 4;
      CHECK(near(m->memory(op.id, kept + k),
                 m->memory(op.id, k) - double(tm.saved) + graphIn));
    }
  }
  // A recomputed consumer of a kept producer holds its input; of a
  // recomputed producer, nothing.
  bool held = false, none = false;
  for (size_t e = 0; e < m->edges().size(); ++e) {
    const FtEdge &ed = m->edges()[e];
    if (ed.weight)
      continue;
    const auto &ca = m->configs(ed.producer), &cb = m->configs(ed.consumer);
    for (size_t a = 0; a < ca.size(); ++a)
      for (size_t b = 0; b < cb.size(); ++b) {
        const auto &opts = m->edgeOptions(e, a, b);
        if (!cb[b].recompute) {
          CHECK(opts[0].memory == 0);
          continue;
        }
        // Recomputed on either side: no tensor reuse.
        CHECK(opts.size() == 1);
        if (ca[a].recompute) {
          CHECK(opts[0].memory == 0);
          none = true;
        } else {
          CHECK(opts[0].memory > 0);
          held = true;
        }
      }
  }
  CHECK(held);
  CHECK(none);
  // The frontier reaches less memory, and its least-memory point recomputes
  // something and unrolls to a valid strategy that says so.
  FtResult with = frontierTracking(*m, o), without = frontierTracking(*m0, o);
  REQUIRE(!with.points.empty());
  REQUIRE(!without.points.empty());
  CHECK(with.points.front().costs.memory < without.points.front().costs.memory);
  Strategy s = assignmentStrategy(*m, with.points.front().assignment);
  requireOk(verifyStrategy(s, g, f.topo));
  size_t recomputed = 0;
  for (size_t o2 = 0; o2 < g.numOps(); ++o2)
    recomputed += s.recomputes(OpId(o2));
  CHECK(recomputed > 0);
  // Its fastest point is the same as without: recomputation only adds time.
  CHECK(near(with.points.back().costs.time, without.points.back().costs.time));
}

TEST_CASE("Micro-batches: kernels m times, one micro-batch held", "[ft]") {
  Fixture f;
  Graph g = chain(); // batch 8
  SearchProblem p{g, f.topo, f.cost, f.coll};
  FtOptions o;
  o.devices = 4;
  o.recompute = false;
  auto m1 = FtModel::build(p, o);
  REQUIRE(static_cast<bool>(m1));
  FtOptions o2 = o;
  o2.microBatches = 2;
  auto m2 = FtModel::build(p, o2);
  REQUIRE(static_cast<bool>(m2));
  CHECK(m2->microBatches() == 2);
  for (const Op &op : g.ops()) {
    INFO(op.name);
    // Every configuration leaves each micro-batch whole samples: 8 / (2 x
    // the sample degree), so a sample degree of 8 would not.
    for (size_t k = 0; k < m2->configs(op.id).size(); ++k) {
      const FtConfig &c = m2->configs(op.id)[k];
      OpConfig oc = m2->opConfig(op.id, k);
      Box mb = microBatchTile(oc, op.sem, 0, 0, 2);
      Box whole = oc.tile(op.sem, 0);
      CHECK(c.degree[0] * 2 <= 8);
      // The same config at m = 1: the kernels run twice on half the rows,
      // the activations held are one micro-batch's.
      size_t k1 = 0;
      while (k1 < m1->configs(op.id).size() &&
             (m1->configs(op.id)[k1].degree != c.degree ||
              m1->configs(op.id)[k1].replicas != c.replicas))
        ++k1;
      REQUIRE(k1 < m1->configs(op.id).size());
      auto kt = f.cost.kernel(g, op, mb);
      REQUIRE(static_cast<bool>(kt));
      CHECK(
          near(m2->computeTime(op.id, k), 2 * (kt->forward + kt->backward())));
      TileMemory half = f.cost.memory(g, op, mb, p.optimizer);
      TileMemory full = f.cost.memory(g, op, whole, p.optimizer);
      CHECK(near(m2->memory(op.id, k), m1->memory(op.id, k1) -
                                           double(full.saved) +
                                           double(half.saved)));
    }
  }
  // The frontier holds less at its least-memory end, every point unrolls
  // to a valid strategy of 2 micro-batches, and FT's frontier is still the
  // brute-force one.
  FtResult r1 = frontierTracking(*m1, o), r2 = frontierTracking(*m2, o2);
  REQUIRE(!r2.points.empty());
  CHECK(r2.points.front().costs.memory < r1.points.front().costs.memory);
  for (const FtPoint &pt : r2.points) {
    Strategy s = assignmentStrategy(*m2, pt.assignment);
    CHECK(s.pipeline.microBatches == 2);
    requireOk(verifyStrategy(s, g, f.topo));
  }
  requireSameFrontier(r2, bruteForceFrontier(*m2, 20000000));
  // A count no configuration can take: 8 samples in 16 micro-batches.
  FtOptions o16 = o;
  o16.microBatches = 16;
  auto bad = FtModel::build(p, o16);
  REQUIRE(!bad);
  CHECK(llvm::toString(bad.takeError()).find("16 micro-batches") !=
        std::string::npos);
}

TEST_CASE("ZeRO stages are configurations of replicated weights", "[ft]") {
  Fixture f;
  Graph g = chain();
  SearchProblem p{g, f.topo, f.cost, f.coll, Optimizer::Adam};
  FtOptions o;
  o.devices = 4;
  o.recompute = false;
  o.zero = true;
  auto m = FtModel::build(p, o);
  REQUIRE(static_cast<bool>(m));
  FtOptions off = o;
  off.zero = false;
  auto m0 = FtModel::build(p, off);
  REQUIRE(static_cast<bool>(m0));
  bool sharded = false;
  for (const Op &op : g.ops()) {
    INFO(op.name);
    const auto &cs = m->configs(op.id);
    size_t kept = m0->configs(op.id).size();
    if (op.sem.weightInputs.empty()) {
      CHECK(cs.size() == kept); // a Relu has nothing to shard
      continue;
    }
    // The plain configurations first, unchanged; then stages 1, 2, 3 of
    // each one whose weight is replicated.
    for (size_t k = 0; k < kept; ++k) {
      CHECK(cs[k].zero == 0);
      CHECK(near(m->memory(op.id, k), m0->memory(op.id, k)));
      CHECK(near(m->syncTime(op.id, k), m0->syncTime(op.id, k)));
    }
    const Value &w = g.value(op.inputs[1]);
    WeightBytes wb = weightBytes(w.dtype, Optimizer::Adam);
    size_t replicatedConfigs = 0;
    for (size_t k = 0; k < kept; ++k) {
      Box t = m0->opConfig(op.id, k).tile(op.sem, 0);
      // Devices holding device 0's shard: the tiles that differ only in
      // loops the weight does not index, and the replicas.
      int64_t shards =
          *w.shape.numElements() / op.sem.inputRegion(1, t).volume();
      int64_t R = int64_t(m->devices()) / shards;
      if (R < 2)
        continue;
      ++replicatedConfigs;
      double off1 =
          double(op.sem.inputRegion(1, t).volume()) * (1 - 1.0 / double(R));
      size_t found = 0;
      for (size_t z = kept; z < cs.size(); ++z) {
        if (cs[z].degree != cs[k].degree || cs[z].replicas != cs[k].replicas)
          continue;
        ++found;
        double drop = off1 * double(wb.optimizer);
        if (cs[z].zero >= 2)
          drop += off1 * double(wb.gradient);
        if (cs[z].zero == 3)
          drop += off1 * double(wb.weight);
        CHECK(near(m->memory(op.id, z), m->memory(op.id, k) - drop));
        // Stages 1 and 2 cost the all-reduce they replace; stage 3 adds
        // the gathers its kernels do not hide.
        if (cs[z].zero < 3)
          CHECK(near(m->syncTime(op.id, z), m->syncTime(op.id, k)));
        else
          CHECK(m->syncTime(op.id, z) >= m->syncTime(op.id, k));
        sharded = true;
      }
      CHECK(found == 3);
    }
    CHECK(cs.size() == kept + 3 * replicatedConfigs);
  }
  CHECK(sharded);
  // Every point a valid strategy whose ZeRO ops have a data-parallel
  // group; FT's frontier is still the brute-force one.
  FtResult with = frontierTracking(*m, o), without = frontierTracking(*m0, off);
  REQUIRE(!with.points.empty());
  // It only adds choices: every point without ZeRO is matched or beaten,
  // and some strictly (as fast, less memory).
  bool better = false;
  for (const FtPoint &a : without.points) {
    bool matched = false;
    for (const FtPoint &b : with.points) {
      matched = matched || (b.costs.time <= a.costs.time * (1 + 1e-12) &&
                            b.costs.memory <= a.costs.memory * (1 + 1e-12));
      better = better || (b.costs.time <= a.costs.time * (1 + 1e-12) &&
                          b.costs.memory < a.costs.memory * (1 - 1e-9));
    }
    CHECK(matched);
  }
  CHECK(better);
  size_t zeroOps = 0;
  for (const FtPoint &pt : with.points) {
    Strategy s = assignmentStrategy(*m, pt.assignment);
    requireOk(verifyStrategy(s, g, f.topo));
    for (const Op &op : g.ops())
      if (s.zeroStage(op.id)) {
        ++zeroOps;
        CHECK(hasDataParallelGroup(g, s, op.id));
      }
  }
  CHECK(zeroOps > 0);
  requireSameFrontier(with, bruteForceFrontier(*m, 20000000));
}

TEST_CASE("Heuristic elimination says it ran", "[ft]") {
  Fixture f;
  Graph g = attention();
  SearchProblem p{g, f.topo, f.cost, f.coll};
  FtOptions o;
  o.devices = 2;
  o.maxMergedConfigs = 1; // no branch merge allowed
  auto m = FtModel::build(p, o);
  REQUIRE(static_cast<bool>(m));
  FtResult ft = frontierTracking(*m, o);
  const std::vector<FtCosts> &bf = attentionBruteForce();
  if (ft.stats.heuristicEliminations == 0) {
    // The graph reduced without it: then the frontier is exact.
    CHECK(ft.stats.exact());
    requireSameFrontier(ft, bf);
    return;
  }
  CHECK_FALSE(ft.stats.exact());
  // Every point is a real strategy, dominated by or on the true frontier.
  for (const FtPoint &pt : ft.points) {
    bool covered = false;
    for (const FtCosts &c : bf)
      covered = covered || (c.memory <= pt.costs.memory * (1 + 1e-12) + 1e-9 &&
                            c.time <= pt.costs.time * (1 + 1e-12));
    CHECK(covered);
  }
}

TEST_CASE("FT configurations use every device once per op", "[ft]") {
  Fixture f;
  Graph g = residual();
  SearchProblem p{g, f.topo, f.cost, f.coll};
  FtOptions o;
  auto m = FtModel::build(p, o);
  REQUIRE(static_cast<bool>(m));
  CHECK(m->devices() == 16);
  for (size_t op = 0; op < m->numOps(); ++op)
    for (const FtConfig &c : m->configs(OpId(op))) {
      int64_t prod = c.replicas;
      int split = 0;
      for (int32_t d : c.degree) {
        prod *= d;
        split += d > 1;
      }
      CHECK(prod == 16);
      CHECK(split <= o.maxSplitLoops);
    }
  FtOptions bad;
  bad.devices = 3;
  auto r = FtModel::build(p, bad);
  CHECK_FALSE(static_cast<bool>(r));
  llvm::consumeError(r.takeError());
}

TEST_CASE("A shared weight is held and all-reduced once", "[ft]") {
  Fixture f;
  // Large enough that an all-reduce outlasts the backward that hides it.
  Graph tied = sharedWeight(true, 1024), untied = sharedWeight(false, 1024);
  SearchProblem pt{tied, f.topo, f.cost, f.coll},
      pu{untied, f.topo, f.cost, f.coll};
  FtOptions o;
  o.devices = 4;
  auto mt = FtModel::build(pt, o);
  auto mu = FtModel::build(pu, o);
  REQUIRE(static_cast<bool>(mt));
  REQUIRE(static_cast<bool>(mu));
  // The tied model has one weight edge between the two MatMuls.
  size_t weightEdges = 0;
  for (const FtEdge &e : mt->edges())
    weightEdges += e.weight;
  CHECK(weightEdges == 1);
  // Data parallelism: every op's config splits its first loop 4 ways.
  auto dataParallel = [](const FtModel &m) {
    FtAssignment a;
    for (size_t op = 0; op < m.numOps(); ++op) {
      int32_t pick = -1;
      for (size_t k = 0; k < m.configs(OpId(op)).size(); ++k)
        if (m.configs(OpId(op))[k].degree[0] == 4)
          pick = int32_t(k);
      REQUIRE(pick >= 0);
      a.config.push_back(pick);
    }
    a.reuse.assign(m.edges().size(), 0);
    return assignmentCosts(m, a);
  };
  FtCosts ct = dataParallel(*mt), cu = dataParallel(*mu);
  // One replica of the fp32 weight and its gradient (SGD: no state).
  CHECK(near(cu.memory - ct.memory, 1024 * 1024 * 4 * 2));
  CHECK(ct.network < cu.network);
  CHECK(near(ct.compute, cu.compute));
}

TEST_CASE("Merged products reduce like listed ones", "[ft]") {
  // Random frontiers (with ties: coarse values) multiplied three at a time;
  // reduceProducts must give what listing every product gives, point for
  // point and trace for trace, at any resolution.
  std::mt19937 rng(7);
  auto frontier = [&](size_t n, TraceId base) {
    std::vector<FrontierCandidate> c(n);
    for (size_t i = 0; i < n; ++i) {
      c[i].memory = double(rng() % 16);
      c[i].time = double(rng() % 16) / 4;
      c[i].parts[0] = base + TraceId(i);
    }
    Frontier f;
    for (const FrontierCandidate &k : reduceCandidates(c))
      f.push_back({k.time, k.memory, k.parts[0]});
    return f;
  };
  for (int round = 0; round < 200; ++round) {
    std::vector<Frontier> fs;
    for (int i = 0; i < 9; ++i)
      fs.push_back(frontier(1 + rng() % 12, TraceId(100 * i)));
    std::vector<ProductSpec> specs;
    std::vector<FrontierCandidate> listed;
    for (int s = 0; s < 3; ++s) {
      const Frontier *c = rng() % 3 ? &fs[size_t(3 * s + 2)] : nullptr;
      specs.push_back({&fs[size_t(3 * s)], &fs[size_t(3 * s + 1)], c});
      appendProduct(listed, fs[size_t(3 * s)], fs[size_t(3 * s + 1)], c);
    }
    for (double res : {0.0, 0.05, 0.3}) {
      auto want = reduceCandidates(listed, res);
      auto got = reduceProducts(specs, res);
      REQUIRE(got.size() == want.size());
      for (size_t i = 0; i < want.size(); ++i) {
        CHECK(got[i].time == want[i].time);
        CHECK(got[i].memory == want[i].memory);
        for (int j = 0; j < 3; ++j)
          CHECK(got[i].parts[j] == want[i].parts[j]);
      }
    }
  }
}

TEST_CASE("The node mesh: samples across, one loop within a node", "[ft]") {
  Fixture f;                                  // v100-2x8: 2 nodes of 8
  CHECK(FtOptions::nodeMeshFor(f.topo) == 0); // 16 devices: 1-D meshes
  CHECK(FtOptions::nodeMeshFor(exampleTopology("dgx-h100-128")) == 8);
  CHECK(FtOptions::nodeMeshFor(exampleTopology("k80-16x4")) == 0);
  // 32 samples on 16 devices with tensor parallelism up to 4.
  GraphBuilder b;
  auto x = b.op("Relu", {b.input({32, 16})}, {{32, 16}})[0];
  auto y = b.op("MatMul", {x, b.weight({16, 32})}, {{32, 32}})[0];
  b.op("Relu", {y}, {{32, 32}});
  requireOk(b.g.computeSemantics());
  SearchProblem p{b.g, f.topo, f.cost, f.coll};
  FtOptions o;
  o.nodeMesh = 4;
  o.recompute = false;
  auto m = FtModel::build(p, o);
  REQUIRE(static_cast<bool>(m));
  for (size_t op = 0; op < m->numOps(); ++op) {
    const OpSemantics &sem = b.g.op(OpId(op)).sem;
    int sl = sampleLoop(sem);
    REQUIRE(sl >= 0);
    std::set<std::pair<int, int32_t>> others; // (loop, degree)
    for (const FtConfig &c : m->configs(OpId(op))) {
      int64_t prod = c.replicas;
      int split = 0;
      for (size_t l = 0; l < c.degree.size(); ++l) {
        prod *= c.degree[l];
        if (int(l) != sl && c.degree[l] > 1) {
          ++split;
          CHECK(c.degree[l] <= 4);
          others.insert({int(l), c.degree[l]});
        }
      }
      CHECK(prod == 16);
      CHECK(split <= 1);
      // The sample loop takes every device the other split leaves.
      CHECK(c.replicas == 1);
    }
    // Data parallel, and each other splittable loop 2 and 4 ways.
    size_t splittable = 0;
    for (size_t l = 0; l < sem.loops.size(); ++l)
      splittable += int(l) != sl && sem.loops[l].splittable;
    CHECK(others.size() == 2 * splittable);
    CHECK(m->configs(OpId(op)).size() == 1 + 2 * splittable);
  }
  // Its frontier is FT's over these configurations (brute force).
  FtResult ft = frontierTracking(*m, o);
  requireSameFrontier(ft, bruteForceFrontier(*m, 20000000));
  for (const FtPoint &pt : ft.points)
    requireOk(
        verifyStrategy(assignmentStrategy(*m, pt.assignment), b.g, f.topo));
  // 4 micro-batches of 32 samples leave 8 a micro-batch: no config is
  // lost, the sample loop takes 8 ways at most and replicas the rest.
  FtOptions o4 = o;
  o4.microBatches = 4;
  auto m4 = FtModel::build(p, o4);
  REQUIRE(static_cast<bool>(m4));
  for (size_t op = 0; op < m4->numOps(); ++op) {
    int sl = sampleLoop(b.g.op(OpId(op)).sem);
    REQUIRE(m4->configs(OpId(op)).size() == m->configs(OpId(op)).size());
    for (const FtConfig &c : m4->configs(OpId(op))) {
      CHECK(c.degree[size_t(sl)] <= 8);
      int64_t prod = c.replicas;
      for (int32_t d : c.degree)
        prod *= d;
      CHECK(prod == 16);
    }
    CHECK(m4->configs(OpId(op))[0].degree[size_t(sl)] == 8);
    CHECK(m4->configs(OpId(op))[0].replicas == 2);
  }
  FtOptions bad;
  bad.nodeMesh = 3;
  auto r = FtModel::build(p, bad);
  CHECK_FALSE(static_cast<bool>(r));
  llvm::consumeError(r.takeError());
}

TEST_CASE("ThreadPool: an index's exception reaches parallelFor's caller; "
          "no index starts after it and the pool runs on",
          "[ft][threads]") {
  for (int threads : {1, 2, 4}) {
    INFO(threads << " threads");
    ThreadPool pool(threads);
    std::atomic<size_t> started{0};
    // (A worker's exception must not escape its thread: std::terminate.)
    // Indices past the throwing one take 100 us each, so that a throwing
    // thread the scheduler sets aside for a while (a loaded 2-core CI
    // machine) still records its error long before the others could reach
    // the end.
    REQUIRE_THROWS_AS(
        pool.parallelFor(100000,
                         [&](size_t i) {
                           ++started;
                           if (i == 10)
                             throw std::bad_alloc();
                           if (i > 10)
                             std::this_thread::sleep_for(
                                 std::chrono::microseconds(100));
                         }),
        std::bad_alloc);
    CHECK(started < 100000);
    std::vector<int> seen(1000, 0);
    pool.parallelFor(seen.size(), [&](size_t i) { seen[i] = 1; });
    CHECK(std::count(seen.begin(), seen.end(), 1) == 1000);
  }
}

TEST_CASE("FT's peak memory is within 2x of the simulator's on zoo frontiers",
          "[ft][property]") {
  // FT's Eq. 3 memory sums what each op holds through the iteration; the
  // simulator's peak also holds the backward pass's working set: output and
  // input gradients (a whole input's partial sum where an op splits a loop
  // the input does not index) and a recomputed chain's activations, run
  // again at once. AlexNet's least-memory point was 67.62 MiB by Eq. 3 and
  // 1.02 GiB simulated. FtCosts::peakMemory adds the largest working set;
  // on every simulated point of these frontiers (those of `soapc frontier`
  // on 16 P100s, 64 samples a device) it is within a factor of 2 of the
  // simulator's peak. The zoo's transformers and NMT are left out: their
  // frontiers take minutes.
  Topology topo = exampleTopology("p100-4x4");
  CostModel cost{topo.deviceSpec(), nullptr, CostMode::Analytic};
  CollectiveModel coll{topo};
  for (const char *name : {"lenet", "alexnet", "mlp", "rnntc", "rnnlm",
                           "mobilenet_small", "vgg16", "inception_v3",
                           "resnet101"}) {
    INFO(name);
    auto g = zooModel(name, 1024);
    SearchProblem p{*g, topo, cost, coll};
    FtOptions o;
    o.maxSplitLoops = 1;
    o.resolution = 0.01;
    auto r = frontierReport(p, o, 8);
    if (!r)
      FAIL(errorMessage(r.takeError()));
    size_t simulated = 0;
    for (const FtScored &pt : r->points) {
      if (!pt.simulated)
        continue;
      ++simulated;
      double ratio = double(pt.simPeakMemory) / pt.point.costs.peakMemory();
      INFO("FT " << pt.point.costs.peakMemory() << " B, simulated "
                 << pt.simPeakMemory << " B");
      CHECK(ratio <= 2.0);
      CHECK(ratio >= 0.5);
    }
    CHECK(simulated > 0);
  }
}
