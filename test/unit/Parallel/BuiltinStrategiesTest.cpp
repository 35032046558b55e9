// Built-in strategies: data parallelism splits every op by sample, model
// parallelism places whole ops on non-decreasing devices, the expert
// strategies follow "one weird trick" for CNNs and GNMT for RNNs, and every
// strategy verifies.
#include "soap/Parallel/BuiltinStrategies.h"
#include "../TestInputs.h"

#include "soap/IR/UnrollRnn.h"
#include "soap/Import/OnnxImporter.h"
#include "soap/Machine/TopologyLoader.h"
#include "soap/Support/Error.h"
#include <catch2/catch.hpp>
#include <set>

using namespace soap;
using namespace soap::test;

namespace {



void requireValid(const Strategy &s, const Graph &g, const Topology &topo) {
  if (llvm::Error err = verifyStrategy(s, g, topo))
    FAIL(errorMessage(std::move(err)));
}

int loopNamed(const OpSemantics &sem, const std::string &name) {
  for (size_t l = 0; l < sem.loops.size(); ++l)
    if (sem.loops[l].name == name)
      return static_cast<int>(l);
  return -1;
}

std::vector<DeviceId> range(DeviceId n) {
  std::vector<DeviceId> v;
  for (DeviceId d = 0; d < n; ++d)
    v.push_back(d);
  return v;
}

/// The only split loop of `c`, or -1.
int onlySplit(const OpConfig &c) {
  int found = -1;
  for (size_t l = 0; l < c.degree.size(); ++l)
    if (c.degree[l] > 1) {
      if (found >= 0)
        return -2;
      found = static_cast<int>(l);
    }
  return found;
}

} // namespace

TEST_CASE("data parallel splits every conv by sample over all devices",
          "[Parallel]") {
  Topology topo = exampleTopology("p100-4x4");
  auto g = zooModel("resnet101", 64 * 16);
  Strategy s = dataParallel(*g, topo);
  requireValid(s, *g, topo);
  int convs = 0;
  for (const Op &op : g->ops()) {
    const OpConfig &c = s.configs[op.id];
    // Every op of ResNet has a sample loop of 1024, so all split 16 ways.
    CHECK(c.numTiles() == 16);
    CHECK(op.sem.loops[onlySplit(c)].cls == DimClass::Sample);
    if (op.kind != "Conv")
      continue;
    ++convs;
    CHECK(c.degree[loopNamed(op.sem, "n")] == 16);
    CHECK(c.devices == range(16));
  }
  CHECK(convs > 100);
}

TEST_CASE("data parallel uses the largest degree dividing the batch",
          "[Parallel]") {
  Topology topo = exampleTopology("p100-4x4");
  auto g = zooModel("lenet", 24);
  Strategy s = dataParallel(*g, topo);
  requireValid(s, *g, topo);
  for (const Op &op : g->ops()) {
    CHECK(s.configs[op.id].numTiles() == 12);
    CHECK(s.configs[op.id].devices == range(12));
  }
}

TEST_CASE("model parallel places whole ops on non-decreasing devices",
          "[Parallel]") {
  Topology topo = exampleTopology("p100-4x4");
  for (const char *name : {"lenet", "alexnet", "resnet101", "rnnlm"}) {
    auto g = zooModel(name, 64);
    Strategy s = modelParallel(*g, topo);
    requireValid(s, *g, topo);
    std::set<DeviceId> used;
    DeviceId prev = 0;
    for (const Op &op : g->ops()) {
      const OpConfig &c = s.configs[op.id];
      CHECK(c.numTasks() == 1);
      CHECK(c.devices[0] >= prev);
      CHECK(c.devices[0] <= prev + 1);
      prev = c.devices[0];
      used.insert(prev);
    }
    CHECK(s.configs[0].devices[0] == 0);
    if (g->numOps() >= topo.numDevices())
      CHECK(used.size() == topo.numDevices());
  }
}

TEST_CASE("model parallel balances forward FLOPs", "[Parallel]") {
  Topology topo = exampleTopology("p100-4x4");
  auto g = zooModel("resnet101", 64);
  Strategy s = modelParallel(*g, topo);
  std::vector<double> perDevice(16, 0);
  for (const Op &op : g->ops())
    perDevice[s.configs[op.id].devices[0]] +=
        op.sem.tileFlops(Pass::Forward, op.sem.fullTile());
  double total = g->forwardFlops();
  for (double f : perDevice)
    CHECK(f < 2.0 * total / 16);
}

TEST_CASE("the CNN expert: data parallel convs, parameter parallel dense",
          "[Parallel]") {
  for (const char *topoName : {"p100-4x4", "k80-16x4"}) {
    Topology topo = exampleTopology(topoName);
    int32_t n = static_cast<int32_t>(topo.numDevices());
    auto g = zooModel("alexnet", 256 * n);
    Strategy s = expertStrategy(*g, topo);
    requireValid(s, *g, topo);
    bool dense = false;
    int gemmsByN = 0;
    for (const Op &op : g->ops()) {
      const OpConfig &c = s.configs[op.id];
      CHECK(c.devices == range(n));
      int split = onlySplit(c);
      REQUIRE(split >= 0);
      dense |= op.kind == "Gemm";
      if (!dense) {
        CHECK(op.sem.loops[split].cls == DimClass::Sample);
        continue;
      }
      int nLoop = loopNamed(op.sem, "n");
      if (op.kind == "Gemm" && op.sem.loops[nLoop].size % n == 0) {
        CHECK(split == nLoop);
        ++gemmsByN;
      }
      // After the first dense layer everything whose Parameter dim divides
      // is parameter parallel; the rest (1000 classes) falls back to data.
      bool divisible = false;
      for (const LoopDim &l : op.sem.loops)
        divisible |= l.cls == DimClass::Parameter && l.size % n == 0;
      CHECK(op.sem.loops[split].cls ==
            (divisible ? DimClass::Parameter : DimClass::Sample));
    }
    CHECK(gemmsByN == 2);
  }
}

TEST_CASE("the RNN expert: replicas across nodes, layers on local ranks",
          "[Parallel]") {
  Topology topo = exampleTopology("p100-4x4");
  auto g = zooModel("rnnlm", 64 * 16);
  Strategy s = expertStrategy(*g, topo);
  requireValid(s, *g, topo);
  auto ranks = [&](const OpConfig &c) {
    std::vector<uint32_t> nodes, localRanks;
    for (DeviceId d : c.devices) {
      nodes.push_back(topo.device(d).node);
      localRanks.push_back(topo.device(d).localRank);
    }
    CHECK(nodes == std::vector<uint32_t>{0, 1, 2, 3});
    std::set<uint32_t> r(localRanks.begin(), localRanks.end());
    REQUIRE(r.size() == 1);
    return *r.begin();
  };
  int lstm = 0;
  for (const Op &op : g->ops()) {
    const OpConfig &c = s.configs[op.id];
    REQUIRE(onlySplit(c) >= 0);
    CHECK(op.sem.loops[onlySplit(c)].cls == DimClass::Sample);
    CHECK(c.numTiles() == 4);
    uint32_t r = ranks(c);
    if (op.kind == "LSTM")
      CHECK(r == uint32_t(lstm++));
    if (op.kind == "Gather")
      CHECK(r == 0);
    if (op.kind == "MatMul" || op.kind == "SoftmaxCrossEntropyLoss")
      CHECK(r == 3);
  }
  CHECK(lstm == 2);
  CHECK(ranks(s.configs[g->findOp("/lstm/Squeeze")]) == 0);

  // Unrolled cells keep their layer's rank.
  auto unrolled = unrollLstms(*g);
  if (!unrolled)
    FAIL(errorMessage(unrolled.takeError()));
  Strategy u = expertStrategy(**unrolled, topo);
  requireValid(u, **unrolled, topo);
  int cells = 0;
  for (const Op &op : (*unrolled)->ops())
    if (op.kind == "LSTMCell") {
      ++cells;
      uint32_t want =
          llvm::StringRef(op.name).startswith("/lstm/LSTM_1") ? 1 : 0;
      CHECK(ranks(u.configs[op.id]) == want);
    }
  CHECK(cells == 80);
}

TEST_CASE("other models get data parallelism as their expert strategy",
          "[Parallel]") {
  Topology topo = exampleTopology("p100-4x4");
  auto g = zooModel("mlp", 64);
  CHECK(expertStrategy(*g, topo) == dataParallel(*g, topo));
}

TEST_CASE("builtin strategies by name", "[Parallel]") {
  Topology topo = exampleTopology("p100-4x4");
  auto g = zooModel("lenet", 64);
  for (const char *name : {"data", "model", "expert"}) {
    auto s = builtinStrategy(name, *g, topo);
    if (!s)
      FAIL(errorMessage(s.takeError()));
    requireValid(*s, *g, topo);
  }
  auto bad = builtinStrategy("nope", *g, topo);
  REQUIRE(!static_cast<bool>(bad));
  std::string msg = errorMessage(bad.takeError());
  CHECK(msg.find("nope") != std::string::npos);
  CHECK(msg.find("data, model, expert") != std::string::npos);
}
