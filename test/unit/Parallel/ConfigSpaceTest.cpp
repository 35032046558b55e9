// The configuration space: every enumerated configuration is valid, sizes
// agree with enumeration, the FlexFlow space has no partial sums or
// replicas while the full space has both, placements are aligned blocks
// plus offsets without duplicates, and sampling is a deterministic draw
// from the enumerated set that reaches every shape.
#include "soap/Parallel/ConfigSpace.h"
#include "../TestInputs.h"

#include "../IR/TestGraphs.h"
#include "soap/Import/OnnxImporter.h"
#include "soap/Machine/TopologyLoader.h"
#include <catch2/catch.hpp>
#include <set>

using namespace soap;
using namespace soap::test;

namespace {



/// 2 nodes x 2 P100s: 4 devices in a two-level hierarchy.
Topology fourDevices() {
  Json doc = Json::parse(R"({
    "name": "p100-2x2", "device": "P100-SXM2", "nodes": 2,
    "node": {"gpus": 2,
             "intra": {"kind": "nvlink", "bandwidth_gbps": 160,
                       "latency_us": 0.5, "connections": "all-to-all"},
             "pcie": {"bandwidth_gbps": 126, "latency_us": 0.5}},
    "inter": {"nics_per_node": 1, "bandwidth_gbps": 100, "latency_us": 1.0}
  })");
  auto t = parseTopology(doc, "p100-2x2.json");
  if (!t)
    FAIL(errorMessage(t.takeError()));
  return std::move(*t);
}

/// x[8,16] -> Gemm with W[16,12] -> Relu -> Softmax over the 12 classes.
Graph gemmReluSoftmax() {
  GraphBuilder b;
  auto x = b.input({8, 16});
  auto y = b.op("Gemm", {x, b.weight({16, 12})}, {{8, 12}});
  auto r = b.op("Relu", {y[0]}, {{8, 12}});
  b.op("Softmax", {r[0]}, {{8, 12}}, {{"axis", int64_t(1)}});
  requireOk(b.g.computeSemantics());
  return std::move(b.g);
}

bool isPartialSum(const OpSemantics &sem, size_t l) {
  if (sem.loops[l].cls == DimClass::Reduction)
    return true;
  for (size_t j = 0; j < sem.outputs.size(); ++j) {
    if (!sem.outputs[j].present)
      continue;
    for (int r : sem.reducedLoops(static_cast<int>(j)))
      if (size_t(r) == l && sem.loops[l].cls != DimClass::Sample &&
          !sem.loops[l].statReduced)
        return true;
  }
  return false;
}

/// Checks every op's enumeration; returns whether some configuration has a
/// partial-sum split and whether some has replicas.
std::pair<bool, bool> checkSpace(const Graph &g, const Topology &topo,
                                 const ConfigSpace &space) {
  bool partial = false, replicated = false;
  for (const Op &op : g.ops()) {
    std::vector<OpConfig> all = space.enumerate(op.id);
    CHECK(space.size(op.id) == all.size());
    REQUIRE(!all.empty());
    std::set<OpConfig> unique(all.begin(), all.end());
    CHECK(unique.size() == all.size());
    for (const OpConfig &c : all) {
      llvm::Error err =
          verifyConfig(c, op.sem, topo.numDevices(), g.where(op.id));
      if (err)
        FAIL(errorMessage(std::move(err)));
      CHECK(space.contains(op.id, c));
      replicated |= c.replicas > 1;
      for (size_t l = 0; l < c.degree.size(); ++l)
        partial |= c.degree[l] > 1 && isPartialSum(op.sem, l);
    }
    // Shapes are strictly increasing: lexicographic and distinct.
    const auto &shapes = space.shapes(op.id);
    for (size_t i = 1; i < shapes.size(); ++i)
      CHECK(shapes[i - 1] < shapes[i]);
  }
  return {partial, replicated};
}

} // namespace

TEST_CASE("space kinds parse and options validate", "[Parallel]") {
  CHECK(parseSpaceKind("flexflow") == SpaceKind::FlexFlow);
  CHECK(parseSpaceKind("full") == SpaceKind::Full);
  CHECK(!parseSpaceKind("soap"));
  CHECK(spaceKindName(SpaceKind::Full) == "full");
  SpaceOptions o;
  CHECK(!o.validate());
  o.maxReplicas = 0;
  CHECK(errorMessage(o.validate()).find("replicas") != std::string::npos);
}

TEST_CASE("every enumerated configuration is valid", "[Parallel]") {
  Topology topo = fourDevices();
  REQUIRE(topo.numDevices() == 4);
  auto lenet = zooModel("lenet");
  Graph small = gemmReluSoftmax();
  for (const Graph *g : {lenet.get(), &small}) {
    SpaceOptions ff;
    ConfigSpace flexflow(*g, topo, ff);
    auto [ffPartial, ffReplicated] = checkSpace(*g, topo, flexflow);
    CHECK(!ffPartial);
    CHECK(!ffReplicated);
    for (const Op &op : g->ops())
      for (const SplitShape &s : flexflow.shapes(op.id)) {
        CHECK(s.second == 1);
        for (size_t l = 0; l < s.first.size(); ++l)
          if (op.sem.loops[l].cls == DimClass::Reduction)
            CHECK(s.first[l] == 1);
      }

    SpaceOptions fo;
    fo.kind = SpaceKind::Full;
    ConfigSpace full(*g, topo, fo);
    auto [fullPartial, fullReplicated] = checkSpace(*g, topo, full);
    CHECK(fullPartial);
    CHECK(fullReplicated);
    for (const Op &op : g->ops())
      CHECK(full.size(op.id) > flexflow.size(op.id));
  }
}

TEST_CASE("the FlexFlow space splits the loss by sample, not Gemm's k",
          "[Parallel]") {
  Topology topo = fourDevices();
  auto lenet = zooModel("lenet");
  ConfigSpace space(*lenet, topo, {});
  const Op &loss = lenet->op(lenet->findOp("soapc.loss"));
  bool sampleSplit = false;
  for (const SplitShape &s : space.shapes(loss.id))
    sampleSplit |= s.first[0] == 4;
  CHECK(sampleSplit);
  const Op &fc = lenet->op(lenet->findOp("/fc1/Gemm"));
  REQUIRE(fc.sem.loops[2].name == "k");
  for (const SplitShape &s : space.shapes(fc.id))
    CHECK(s.first[2] == 1);
  // m (64) x n (120) on 4 devices: degrees {1,2,4} x {1,2,3,4} with
  // product <= 4 is 7 shapes.
  CHECK(space.shapes(fc.id).size() == 7);
}

TEST_CASE("placements are aligned blocks, then every offset", "[Parallel]") {
  Topology topo = exampleTopology("p100-4x4");
  REQUIRE(topo.numDevices() == 16);
  auto lenet = zooModel("lenet");
  ConfigSpace space(*lenet, topo, {});
  auto two = space.placements(2);
  std::set<std::vector<DeviceId>> set(two.begin(), two.end());
  CHECK(set.size() == two.size());
  CHECK(two.size() == 15);
  for (DeviceId b = 0; b < 8; ++b)
    CHECK(two[b] == std::vector<DeviceId>{2 * b, 2 * b + 1});
  CHECK(set.count({1, 2}));
  CHECK(space.placements(16).size() == 1);
  // Not used by any lenet shape, so computed on demand.
  CHECK(space.placements(5).size() == 12);

  SpaceOptions aligned;
  aligned.arbitraryOffsets = false;
  ConfigSpace blocks(*lenet, topo, aligned);
  auto four = blocks.placements(4);
  REQUIRE(four.size() == 4);
  for (DeviceId b = 0; b < 4; ++b) {
    // Every aligned block of 4 is one node of p100-4x4.
    for (DeviceId d : four[b])
      CHECK(topo.device(d).node == b);
  }
  CHECK(blocks.placements(3).size() == 5);
  OpConfig c = OpConfig::single(lenet->op(0).sem, 1);
  CHECK(space.contains(0, c));
  CHECK(blocks.contains(0, c)); // a single device is always aligned
  c.degree[0] = 2;
  c.devices = {1, 2};
  CHECK(space.contains(0, c));
  CHECK(!blocks.contains(0, c));
  c.devices = {2, 1};
  CHECK(!space.contains(0, c));
  c.devices = {15, 16};
  CHECK(!space.contains(0, c));
}

TEST_CASE("sample() draws members, reaches every shape, is deterministic",
          "[Parallel]") {
  Topology topo = fourDevices();
  auto lenet = zooModel("lenet");
  for (SpaceKind kind : {SpaceKind::FlexFlow, SpaceKind::Full}) {
    SpaceOptions o;
    o.kind = kind;
    ConfigSpace space(*lenet, topo, o);
    Rng rng(42, "test"), again(42, "test");
    for (const Op &op : lenet->ops()) {
      const auto &shapes = space.shapes(op.id);
      std::set<SplitShape> seen;
      int draws = static_cast<int>(shapes.size()) * 40;
      for (int i = 0; i < draws; ++i) {
        OpConfig c = space.sample(op.id, rng);
        CHECK(space.contains(op.id, c));
        CHECK(c == space.sample(op.id, again));
        seen.insert({c.degree, c.replicas});
      }
      CHECK(seen.size() == shapes.size());
    }
  }
}

TEST_CASE("bigger graphs and topologies stay enumerable", "[Parallel]") {
  Topology topo = exampleTopology("p100-4x4");
  auto resnet = zooModel("resnet101", 64 * 16);
  SpaceOptions full;
  full.kind = SpaceKind::Full;
  ConfigSpace ff(*resnet, topo, {}), fs(*resnet, topo, full);
  for (const Op &op : resnet->ops()) {
    REQUIRE(!ff.shapes(op.id).empty());
    CHECK(ff.size(op.id) <= fs.size(op.id));
    Rng rng(7);
    for (int i = 0; i < 20; ++i) {
      OpConfig c = fs.sample(op.id, rng);
      llvm::Error err = verifyConfig(c, op.sem, 16, resnet->where(op.id));
      if (err)
        FAIL(errorMessage(std::move(err)));
    }
  }
}
