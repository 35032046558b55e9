// The kcuts searcher (SOYBEAN sections 4-5): conversion costs of Figure 7,
// the one-cut DP against brute force, the strategy it builds, and the
// section 2.2 MLP where the hybrid beats data and model parallelism.
#include "../../../lib/Search/KCuts.h"
#include "../IR/TestGraphs.h"
#include "../TestInputs.h"
#include "soap/Import/OnnxImporter.h"
#include "soap/Machine/TopologyLoader.h"
#include "soap/Parallel/BuiltinStrategies.h"
#include "soap/Search/Driver.h"
#include <catch2/catch.hpp>

using namespace soap;
using namespace soap::test;
using namespace soap::kcuts;

namespace {

/// x[400,300] -> Relu -> Relu: the matrix of Figure 7 between two ops whose
/// loops are (rows, columns).
Graph reluPair() {
  GraphBuilder b;
  auto x = b.input({400, 300});
  auto a = b.op("Relu", {x}, {{400, 300}});
  b.op("Relu", {a[0]}, {{400, 300}});
  requireOk(b.g.computeSemantics());
  return std::move(b.g);
}

/// x[400,200] x W[200,300] -> Relu: the MatMul's k loop (2) is SOYBEAN's
/// "red" aligned tiling.
Graph matmulRelu() {
  GraphBuilder b;
  auto x = b.input({400, 200});
  auto y = b.op("MatMul", {x, b.weight({200, 300})}, {{400, 300}});
  b.op("Relu", {y[0]}, {{400, 300}});
  requireOk(b.g.computeSemantics());
  return std::move(b.g);
}

/// A chain of `layers` MatMuls [batch, width] x [width, width], with a Relu
/// after each when `relu`.
Graph mlp(int layers, int64_t batch, int64_t width, bool relu) {
  GraphBuilder b;
  ValueId v = b.input({batch, width});
  for (int l = 0; l < layers; ++l) {
    v = b.op("MatMul", {v, b.weight({width, width})}, {{batch, width}})[0];
    if (relu)
      v = b.op("Relu", {v}, {{batch, width}})[0];
  }
  requireOk(b.g.computeSemantics());
  return std::move(b.g);
}

/// Conv -> Relu -> Conv -> Relu -> Flatten -> MatMul.
Graph smallCnn() {
  GraphBuilder b;
  auto x = b.input({4, 2, 8, 8});
  auto c1 = b.op("Conv", {x, b.weight({4, 2, 3, 3})}, {{4, 4, 8, 8}},
                 {{"pads", Ints{1, 1, 1, 1}}});
  auto r1 = b.op("Relu", {c1[0]}, {{4, 4, 8, 8}});
  auto c2 = b.op("Conv", {r1[0], b.weight({4, 4, 3, 3})}, {{4, 4, 8, 8}},
                 {{"pads", Ints{1, 1, 1, 1}}});
  auto r2 = b.op("Relu", {c2[0]}, {{4, 4, 8, 8}});
  auto f = b.op("Flatten", {r2[0]}, {{4, 256}}, {{"axis", int64_t(1)}});
  b.op("MatMul", {f[0], b.weight({256, 10})}, {{4, 10}});
  requireOk(b.g.computeSemantics());
  return std::move(b.g);
}

/// Cuts `k` times, checking at every cut that the DP finds the brute-force
/// minimum; applies the DP's choice.
void checkDpAgainstBruteForce(const Graph &g, int k) {
  CutState s = initialState(g);
  for (int i = 0; i < k; ++i) {
    CutTables t = buildTables(g, s, ChoiceSet::All);
    OneCut dp = oneCutDp(t);
    OneCut bf = oneCutBruteForce(t);
    INFO("cut " << i);
    CHECK(dp.exact);
    CHECK(dp.bytes == Approx(bf.bytes));
    // The DP's choice costs what it claims.
    std::vector<int> ci;
    for (size_t o = 0; o < g.numOps(); ++o)
      ci.push_back(int(
          std::find(t.choices[o].begin(), t.choices[o].end(), dp.choice[o]) -
          t.choices[o].begin()));
    CHECK(cutCost(t, ci) == Approx(dp.bytes));
    s = applyCut(g, s, dp.choice);
  }
}

struct Machine {
  Topology topo;
  std::unique_ptr<CostModel> cost;
  std::unique_ptr<CollectiveModel> coll;
};

Machine machine(const std::string &name) {
  Machine m{exampleTopology(name), nullptr, nullptr};
  m.cost = std::make_unique<CostModel>(m.topo.deviceSpec(), nullptr,
                                       CostMode::Analytic);
  m.coll = std::make_unique<CollectiveModel>(m.topo);
  return m;
}

} // namespace

TEST_CASE("Figure 7 conversion costs of a [400,300] matrix", "[kcuts]") {
  // Bytes = fp32 elements a half lacks, summed over both halves; SOYBEAN's
  // figure counts areas, here a quarter of the matrix is 200*150*4 bytes.
  const double quarter = 200 * 150 * 4;
  Graph g = reluPair();
  CutState s = initialState(g);
  Edge e = graphEdges(g).at(0);
  const int rows = 0, cols = 1;
  CHECK(edgeForwardBytes(g, s, e, rows, rows) == 0);           // R -> R
  CHECK(edgeForwardBytes(g, s, e, cols, cols) == 0);           // C -> C
  CHECK(edgeForwardBytes(g, s, e, rows, cols) == 2 * quarter); // R -> C
  CHECK(edgeForwardBytes(g, s, e, cols, rows) == 2 * quarter); // C -> R
  CHECK(edgeForwardBytes(g, s, e, rows, kReplicate) ==
        4 * quarter); // R -> r: each half fetches the other's half
  CHECK(edgeForwardBytes(g, s, e, kReplicate, cols) == 0); // r -> C

  Graph mm = matmulRelu();
  CutState ms = initialState(mm);
  Edge me = graphEdges(mm).at(0);
  const int k = 2;
  CHECK(edgeForwardBytes(mm, ms, me, 0, rows) == 0); // aligned R x r = R
  CHECK(edgeForwardBytes(mm, ms, me, k, rows) ==
        4 * quarter); // red -> R: each half needs the other's partial rows
  CHECK(edgeForwardBytes(mm, ms, me, k, kReplicate) ==
        8 * quarter); // red -> r: both need every partial sum
  // After one row cut the second cut works on the 200-row tiles.
  CutState half = applyCut(mm, ms, {0, 0});
  CHECK(edgeForwardBytes(mm, half, me, 0, cols) == quarter);
}

TEST_CASE("one-cut DP equals brute force", "[kcuts]") {
  SECTION("3-layer MLP, 2 and 4 devices") {
    Graph g = mlp(3, 16, 8, true);
    checkDpAgainstBruteForce(g, 1);
    checkDpAgainstBruteForce(g, 2);
  }
  SECTION("small CNN, 2 and 4 devices") {
    Graph g = smallCnn();
    checkDpAgainstBruteForce(g, 2);
  }
  SECTION("data and model restrictions are DP-consistent too") {
    Graph g = mlp(3, 16, 8, true);
    for (ChoiceSet set : {ChoiceSet::SampleOnly, ChoiceSet::NoSample}) {
      CutTables t = buildTables(g, initialState(g), set);
      CHECK(oneCutDp(t).bytes == Approx(oneCutBruteForce(t).bytes));
    }
  }
}

TEST_CASE("kcuts strategies verify and simulate", "[kcuts]") {
  Machine m = machine("p100-4x4");
  Graph g = mlp(5, 400, 300, false);
  KCutsPlan plan = kCuts(g, 4);
  Strategy s = toStrategy(g, plan);
  requireOk(verifyStrategy(s, g, m.topo));
  // The first cut decides the top device bit: for an op halved first on
  // loop l, tile coordinate 0 of l (lower half) lies on devices 0..7.
  for (size_t o = 0; o < g.numOps(); ++o) {
    int a = plan.cuts[0][o];
    if (a == kReplicate)
      continue;
    const OpConfig &c = s.configs[o];
    for (int64_t t = 0; t < c.numTiles(); ++t) {
      Box b = c.tile(g.op(OpId(o)).sem, t);
      bool low = b.lo[size_t(a)] < g.op(OpId(o)).sem.loops[size_t(a)].size / 2;
      CHECK((c.device(t) < 8) == low);
    }
  }
  registerAllSearchers();
  SearchProblem p{g, m.topo, *m.cost, *m.coll};
  SearchOptions o;
  auto r = runSearch(p, "kcuts", o);
  if (!r)
    FAIL(errorMessage(r.takeError()));
  CHECK(r->metrics.fits);
  CHECK(r->result.iterationTime > 0);
}

TEST_CASE("SOYBEAN 2.2: the hybrid moves fewer bytes than data or model",
          "[kcuts]") {
  // 5 MatMuls of 300 units, batch 400, 16 devices (4 cuts). 300 halves
  // twice (150, 75), so model parallelism uses n and k two cuts each.
  Graph g = mlp(5, 400, 300, false);
  KCutsPlan hybrid = kCuts(g, 4, ChoiceSet::All);
  KCutsPlan data = kCuts(g, 4, ChoiceSet::SampleOnly);
  KCutsPlan model = kCuts(g, 4, ChoiceSet::NoSample);
  INFO("data " << data.totalBytes << " model " << model.totalBytes << " kcuts "
               << hybrid.totalBytes);
  CHECK(hybrid.exact);
  CHECK(hybrid.totalBytes < data.totalBytes);
  CHECK(hybrid.totalBytes < model.totalBytes);
  // Data parallelism: only weight-gradient all-reduce, 2|W| per group per
  // cut: 2 * (1+2+4+8) * 5 * 300*300*4 bytes.
  CHECK(data.totalBytes == Approx(2.0 * 15 * 5 * 300 * 300 * 4));
}

TEST_CASE("kcuts on LeNet runs and is deterministic", "[kcuts]") {
  Machine m = machine("k80-8");
  ImportOptions io;
  io.batch = 64;
  auto g = importOnnx(
      std::string(SOAP_SOURCE_DIR) + "/examples/models/lenet.onnx", io);
  if (!g)
    FAIL(errorMessage(g.takeError()));
  KCutsPlan a = kCuts(**g, 3), b = kCuts(**g, 3);
  CHECK(a.cuts == b.cuts);
  Strategy s = toStrategy(**g, a);
  requireOk(verifyStrategy(s, **g, m.topo));
  registerAllSearchers();
  SearchProblem p{**g, m.topo, *m.cost, *m.coll};
  auto r = runSearch(p, "kcuts", SearchOptions());
  if (!r)
    FAIL(errorMessage(r.takeError()));
  CHECK(r->metrics.fits);
}
