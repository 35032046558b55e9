// Plans: a written plan reads back to the same strategy, writing is
// byte-stable, bad plans fail with messages that name the file and the JSON
// pointer, and `soapc check` finds what changed.
#include "soap/Plan/Plan.h"

#include "../TestInputs.h"
#include "soap/Import/OnnxImporter.h"
#include "soap/Machine/TopologyLoader.h"
#include "soap/Parallel/BuiltinStrategies.h"
#include "soap/Support/Error.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include <catch2/catch.hpp>

using namespace soap;
using namespace soap::test;

namespace {

const std::string kModelSha(64, 'a'), kTopologySha(64, 'b');

/// A strategy that mixes what a searcher might choose: some ops on one
/// device, some data parallel, some split on two loops with replicas.
Strategy mixedStrategy(const Graph &g, const Topology &topo) {
  Strategy s = dataParallel(g, topo);
  for (const Op &op : g.ops()) {
    OpConfig &c = s.configs[op.id];
    if (op.id % 3 == 0) {
      c = OpConfig::single(op.sem, DeviceId(op.id % topo.numDevices()));
      continue;
    }
    if (op.id % 3 == 1)
      continue;
    OpConfig m;
    m.degree.assign(op.sem.loops.size(), 1);
    int split = 0;
    for (size_t l = 0; l < op.sem.loops.size() && split < 2; ++l) {
      const LoopDim &loop = op.sem.loops[l];
      if (loop.splittable && loop.size % 2 == 0 &&
          (loop.size / 2) % loop.granule == 0) {
        m.degree[l] = 2;
        ++split;
      }
    }
    m.replicas = 2;
    for (int64_t t = m.numTasks(); t-- > 0;) // descending: order matters
      m.devices.push_back(DeviceId(t));
    c = m;
  }
  if (llvm::Error err = verifyStrategy(s, g, topo))
    FAIL(errorMessage(std::move(err)));
  return s;
}

PlanInputs exampleInputs() {
  PlanInputs in;
  in.modelPath = "examples/models/lenet.onnx";
  in.modelSha256 = kModelSha;
  in.batch = 64;
  in.topologyPath = "examples/topologies/p100-4x4.json";
  in.topologySha256 = kTopologySha;
  in.searcher = "mcmc";
  in.seed = 18446744073709551615ull; // the whole uint64_t range survives
  in.budget = "30s";
  in.space = "flexflow";
  in.costModel = "roofline";
  in.optimizer = "sgd";
  return in;
}

PlanFigures exampleFigures(const Topology &topo) {
  PlanFigures f;
  f.iterationSeconds = 0.0123456789012345;
  f.samplesPerSecond = 64 / f.iterationSeconds;
  for (size_t d = 0; d < topo.numDevices(); ++d)
    f.memoryPerDevice.push_back(Bytes(1000 + d));
  f.peakMemory = 1000 + Bytes(topo.numDevices()) - 1;
  f.fits = true;
  f.transferBytes = 123456789012;
  f.collectiveBytes = 42;
  f.speedupOverDataParallel = 1.5;
  return f;
}

std::string tempPath(const std::string &stem) {
  llvm::SmallString<128> path;
  if (auto ec = llvm::sys::fs::createTemporaryFile(stem, "json", path))
    FAIL(ec.message());
  return std::string(path);
}

std::string slurp(const std::string &path) {
  auto buf = llvm::MemoryBuffer::getFile(path);
  if (!buf)
    FAIL(path + ": " + buf.getError().message());
  return (*buf)->getBuffer().str();
}

/// The message of planFromJson's error for `j` (read as "p.json").
std::string parseError(const Json &j) {
  auto p = planFromJson(j, "p.json");
  if (p)
    FAIL("the plan was accepted");
  return errorMessage(p.takeError());
}

std::string strategyError(const Plan &p, const Graph &g, const Topology &t) {
  auto s = planStrategy(p, g, t, "p.json");
  if (s)
    FAIL("the plan was accepted");
  return errorMessage(s.takeError());
}

std::vector<std::string> whats(const std::vector<CheckFinding> &fs) {
  std::vector<std::string> out;
  for (const CheckFinding &f : fs)
    out.push_back(f.what);
  return out;
}

} // namespace

TEST_CASE("a plan reads back to its strategy", "[Plan]") {
  auto g = zooModel("lenet");
  Topology topo = exampleTopology("p100-4x4");
  for (const char *which : {"data", "mixed", "ordered", "grad sync"}) {
    SECTION(which) {
      Strategy s = std::string(which) == "mixed" ? mixedStrategy(*g, topo)
                                                 : dataParallel(*g, topo);
      if (std::string(which) == "grad sync") {
        // Written only when not the default, whole.
        CHECK_FALSE(planToJson(makePlan(*g, topo, s, exampleInputs(),
                                        exampleFigures(topo)))
                        .contains("grad_sync"));
        s.gradSync.overlapParamGather = false;
        s.gradSync.bucketParams = 1000;
        Json j = planToJson(
            makePlan(*g, topo, s, exampleInputs(), exampleFigures(topo)));
        CHECK(j["grad_sync"] == Json{{"bucket_size", 1000},
                                     {"overlap_grad_reduce", true},
                                     {"overlap_param_gather", false}});
        // tp_comm_overlap is written only when on, and read back.
        s.gradSync.tpCommOverlap = true;
        Json jt = planToJson(
            makePlan(*g, topo, s, exampleInputs(), exampleFigures(topo)));
        CHECK(jt["grad_sync"]["tp_comm_overlap"] == true);
        auto back = planFromJson(jt, "p.json");
        if (!back)
          FAIL(errorMessage(back.takeError()));
        CHECK(back->gradSync == s.gradSync);
        // A plan may give some keys: the others keep their defaults.
        j["grad_sync"] = Json{{"overlap_grad_reduce", false}};
        auto partial = planFromJson(j, "p.json");
        if (!partial)
          FAIL(errorMessage(partial.takeError()));
        CHECK(partial->gradSync.overlapParamGather);
        CHECK_FALSE(partial->gradSync.overlapGradReduce);
        CHECK(partial->gradSync.bucketParams == 0);
        j["grad_sync"] = Json{{"bucket_size", -1}};
        CHECK(parseError(j) == "p.json: /grad_sync/bucket_size: must be at "
                               "least 0, got -1");
        j["grad_sync"] = Json{{"overlap_grad_reduce", 1}};
        CHECK(parseError(j) ==
              "p.json: /grad_sync/overlap_grad_reduce: expected a boolean");
      }
      if (std::string(which) == "ordered") {
        // Weight gradients last on one weighted op, now on another.
        s.weightGrad.assign(g->numOps(), 0);
        std::vector<OpId> weighted;
        for (const Op &o : g->ops())
          if (!o.sem.weightInputs.empty())
            weighted.push_back(o.id);
        REQUIRE(weighted.size() >= 3);
        s.weightGrad[size_t(weighted[1])] = uint8_t(WeightGradOrder::Last);
        s.weightGrad[size_t(weighted[2])] = uint8_t(WeightGradOrder::Now);
        Json j = planToJson(
            makePlan(*g, topo, s, exampleInputs(), exampleFigures(topo)));
        CHECK(j["ops"][size_t(weighted[1])]["weight_grad"] == "last");
        CHECK(j["ops"][size_t(weighted[2])]["weight_grad"] == "now");
        CHECK_FALSE(j["ops"][size_t(weighted[0])].contains("weight_grad"));
      }
      Plan plan = makePlan(*g, topo, s, exampleInputs(), exampleFigures(topo));
      std::string path = tempPath("plan");
      REQUIRE_FALSE(errorMessage(writePlan(plan, path)).size());
      auto back = readPlan(path);
      llvm::sys::fs::remove(path);
      if (!back)
        FAIL(errorMessage(back.takeError()));
      CHECK(*back == plan);
      auto s2 = planStrategy(*back, *g, topo, path);
      if (!s2)
        FAIL(errorMessage(s2.takeError()));
      CHECK(*s2 == s);
    }
  }
}

TEST_CASE("plans record ops by name, split loops only", "[Plan]") {
  auto g = zooModel("lenet");
  Topology topo = exampleTopology("p100-4x4");
  Strategy s = mixedStrategy(*g, topo);
  Plan plan = makePlan(*g, topo, s, exampleInputs(), exampleFigures(topo));
  Json j = planToJson(plan);
  CHECK(j["format"] == "soapc-plan");
  CHECK(j["version"] == 3);
  CHECK(j["model"]["ops"] == g->numOps());
  CHECK(j["topology"]["name"] == "p100-4x4");
  CHECK(j["topology"]["devices"] == 16);
  CHECK(j["topology"]["device_type"] == "P100-SXM2");
  CHECK(j["search"]["seed"] == 18446744073709551615ull);
  REQUIRE(j["ops"].size() == g->numOps());
  for (const Op &op : g->ops()) {
    const Json &o = j["ops"][size_t(op.id)];
    CHECK(o["op"] == op.name);
    CHECK(o["kind"] == op.kind);
    CHECK(o["replicas"] == s.configs[op.id].replicas);
    CHECK(o["devices"].size() == s.configs[op.id].devices.size());
    size_t split = 0;
    for (size_t l = 0; l < op.sem.loops.size(); ++l)
      if (s.configs[op.id].degree[l] > 1) {
        ++split;
        CHECK(o["loops"][op.sem.loops[l].name] == s.configs[op.id].degree[l]);
      }
    CHECK(o["loops"].size() == split);
  }
}

TEST_CASE("writing a plan twice gives the same bytes", "[Plan]") {
  auto g = zooModel("lenet");
  Topology topo = exampleTopology("p100-4x4");
  Strategy s = mixedStrategy(*g, topo);
  std::string a = tempPath("plan-a"), b = tempPath("plan-b");
  REQUIRE_FALSE(errorMessage(writePlan(makePlan(*g, topo, s, exampleInputs(),
                                                exampleFigures(topo)),
                                       a))
                    .size());
  REQUIRE_FALSE(errorMessage(writePlan(makePlan(*g, topo, s, exampleInputs(),
                                                exampleFigures(topo)),
                                       b))
                    .size());
  std::string first = slurp(a), second = slurp(b);
  CHECK(first == second);
  CHECK(first.back() == '\n');
  // Read and written again: still the same bytes (doubles round-trip).
  auto back = readPlan(a);
  if (!back)
    FAIL(errorMessage(back.takeError()));
  CHECK(dumpJson(planToJson(*back)) == first);
  llvm::sys::fs::remove(a);
  llvm::sys::fs::remove(b);
}

TEST_CASE("an interrupted search says so in the plan, and only then",
          "[Plan][Interrupt]") {
  auto g = zooModel("lenet");
  Topology topo = exampleTopology("p100-4x4");
  PlanInputs in = exampleInputs();
  Plan plain =
      makePlan(*g, topo, dataParallel(*g, topo), in, exampleFigures(topo));
  CHECK_FALSE(planToJson(plain)["search"].contains("interrupted"));
  in.interrupted = true;
  Plan stopped =
      makePlan(*g, topo, dataParallel(*g, topo), in, exampleFigures(topo));
  Json j = planToJson(stopped);
  CHECK(j["search"]["interrupted"] == true);
  auto back = planFromJson(j, "p.json");
  if (!back)
    FAIL(errorMessage(back.takeError()));
  CHECK(back->inputs.interrupted);
  CHECK(*back == stopped);
  CHECK_FALSE(*back == plain);
  j["search"]["interrupted"] = "yes";
  auto bad = planFromJson(j, "p.json");
  REQUIRE_FALSE(bool(bad));
  CHECK(errorMessage(bad.takeError()) ==
        "p.json: /search/interrupted: expected a boolean");
}

TEST_CASE("a non-finite figure is not written", "[Plan]") {
  auto g = zooModel("lenet");
  Topology topo = exampleTopology("p100-4x4");
  PlanFigures f = exampleFigures(topo);
  f.speedupOverDataParallel = std::numeric_limits<double>::infinity();
  Plan plan = makePlan(*g, topo, dataParallel(*g, topo), exampleInputs(), f);
  std::string path = tempPath("plan-inf");
  llvm::sys::fs::remove(path);
  CHECK(errorMessage(writePlan(plan, path)) ==
        path + ": a predicted figure is not finite (inf)");
  CHECK_FALSE(llvm::sys::fs::exists(path));
}

TEST_CASE("bad plan files name the file and the JSON pointer", "[Plan]") {
  auto g = zooModel("lenet");
  Topology topo = exampleTopology("p100-4x4");
  Plan plan = makePlan(*g, topo, dataParallel(*g, topo), exampleInputs(),
                       exampleFigures(topo));
  const Json good = planToJson(plan);
  {
    auto ok = planFromJson(good, "p.json");
    if (!ok)
      FAIL(errorMessage(ok.takeError()));
  }

  SECTION("missing field") {
    Json j = good;
    j["search"].erase("seed");
    CHECK(parseError(j) == "p.json: /search/seed: missing required field");
    j = good;
    j["ops"][2].erase("devices");
    CHECK(parseError(j) == "p.json: /ops/2/devices: missing required field");
  }
  SECTION("wrong type") {
    Json j = good;
    j["ops"][2]["replicas"] = "two";
    CHECK(parseError(j) == "p.json: /ops/2/replicas: expected an integer");
    j = good;
    j["predicted"]["fits"] = 1;
    CHECK(parseError(j) == "p.json: /predicted/fits: expected a boolean");
    j = good;
    j["model"]["sha256"] = "AA";
    CHECK(parseError(j) ==
          "p.json: /model/sha256: expected 64 lower-case hex digits");
    j = good;
    j["model"]["path"] = 3;
    CHECK(parseError(j) ==
          "p.json: /model/path: expected a string, got a number");
    j = good;
    j["ops"][1]["loops"]["n"] = 0;
    CHECK(parseError(j) ==
          "p.json: /ops/1/loops/n: must be in [1, 2147483647], got 0");
  }
  SECTION("format, version, unknown fields, duplicates, counts") {
    Json j = good;
    j["format"] = "soapc-profile";
    CHECK(parseError(j) ==
          "p.json: /format: expected \"soapc-plan\", got \"soapc-profile\"");
    j = good;
    j["version"] = 4;
    CHECK(parseError(j) == "p.json: /version: unsupported plan version 4 "
                           "(this soapc reads versions 1 to 3)");
    // Version 1 (no pipeline) is read as one stage, one micro-batch.
    j = good;
    j["version"] = 1;
    j.erase("pipeline");
    for (Json &o : j["ops"])
      o.erase("stage");
    auto v1 = planFromJson(j, "p.json");
    REQUIRE(bool(v1));
    CHECK(v1->microBatches == 1);
    CHECK(v1->ops[0].stage == 0);
    j["pipeline"] = good["pipeline"];
    CHECK(parseError(j) == "p.json: /pipeline: a version 1 plan has no "
                           "pipeline");
    j = good;
    j["pipeline"]["schedule"] = "zb-h2";
    CHECK(parseError(j) == "p.json: /pipeline/schedule: unknown schedule "
                           "\"zb-h2\"; expected \"1f1b\", \"gpipe\" or "
                           "\"zb-h1\"");
    // Version 2 knew neither zb-h1 nor virtual stages.
    j["version"] = 2;
    j["pipeline"]["schedule"] = "zb-h1";
    CHECK(parseError(j) == "p.json: /pipeline/schedule: unknown schedule "
                           "\"zb-h1\"; expected \"1f1b\", \"gpipe\" "
                           "(zb-h1 from version 3)");
    j["pipeline"]["schedule"] = "1f1b";
    j["pipeline"]["virtual_stages"] = 2;
    CHECK(parseError(j) == "p.json: /pipeline/virtual_stages: a version 2 "
                           "plan has no virtual stages");
    j["version"] = 3;
    CHECK(parseError(j) == "p.json: /pipeline/virtual_stages: 1 stages do "
                           "not divide into 2 virtual stages per device "
                           "group");
    j["pipeline"]["virtual_stages"] = 1;
    CHECK(parseError(j) == "p.json: /pipeline/virtual_stages: must be at "
                           "least 2, got 1");
    j = good;
    j["pipeline"]["stages"] = 2;
    CHECK(parseError(j) == "p.json: /pipeline/stages: 2 stages declared, the "
                           "ops use 1");
    j = good;
    j["search"]["precision"] = "fp16";
    CHECK(parseError(j) == "p.json: /search/precision: expected \"fp32\", "
                           "\"bf16\" or \"fp8\", got \"fp16\"");
    j = good;
    j["search"].erase("precision");
    CHECK(parseError(j) == "p.json: /search/precision: missing required field");
    j = good;
    j["pipeline"]["micro_batches"] = 0;
    CHECK(parseError(j) ==
          "p.json: /pipeline/micro_batches: must be at least 1, got 0");
    j = good;
    j["ops"][0]["replica"] = 1;
    CHECK(parseError(j) == "p.json: /ops/0/replica: unknown field");
    j = good;
    j["ops"][0]["weight_grad"] = "first";
    CHECK(parseError(j) == "p.json: /ops/0/weight_grad: unknown "
                           "weight-gradient order 'first' (next, last, now)");
    j = good;
    j["ops"][3]["op"] = j["ops"][1]["op"];
    CHECK(parseError(j) == "p.json: /ops/3/op: op '" + g->op(1).name +
                               "' appears twice (first at /ops/1)");
    j = good;
    j["ops"].erase(j["ops"].size() - 1);
    CHECK(parseError(j) ==
          fmt::format("p.json: /ops: {} ops listed, /model/ops says {}",
                      g->numOps() - 1, g->numOps()));
    j = good;
    j["predicted"]["memory_per_device_bytes"].erase(0);
    CHECK(parseError(j) == "p.json: /predicted/memory_per_device_bytes: 15 "
                           "entries for 16 devices (/topology/devices)");
  }
  SECTION("readPlan names the file") {
    std::string path = tempPath("plan-bad");
    Json j = good;
    j["topology"].erase("sha256");
    REQUIRE_FALSE(errorMessage(writeFileAtomic(path, dumpJson(j))).size());
    auto p = readPlan(path);
    REQUIRE_FALSE(bool(p));
    CHECK(errorMessage(p.takeError()) ==
          path + ": /topology/sha256: missing required field");
    llvm::sys::fs::remove(path);
  }
}

TEST_CASE("a plan that does not match the graph is rejected", "[Plan]") {
  auto g = zooModel("lenet");
  Topology topo = exampleTopology("p100-4x4");
  Plan good = makePlan(*g, topo, dataParallel(*g, topo), exampleInputs(),
                       exampleFigures(topo));
  const std::string lenet = g->sourcePath;
  const std::string op1 = g->op(1).name;

  SECTION("op not in the graph") {
    Plan p = good;
    p.ops[1].name = "no_such_op";
    CHECK(strategyError(p, *g, topo) ==
          "p.json: /ops/1/op: op 'no_such_op' is not in the model " + lenet +
              "; a plan for another model?");
  }
  SECTION("op missing from the plan") {
    Plan p = good;
    p.ops.erase(p.ops.begin() + 1);
    CHECK(strategyError(p, *g, topo) ==
          "p.json: /ops: op '" + op1 + "' (" + g->op(1).kind +
              ") of the model " + lenet + " is missing from the plan");
  }
  SECTION("kind mismatch") {
    Plan p = good;
    p.ops[1].kind = "Elu";
    CHECK(strategyError(p, *g, topo) == "p.json: /ops/1/kind: op '" + op1 +
                                            "' is " + g->op(1).kind +
                                            " in the model, Elu in the plan");
  }
  SECTION("unknown loop") {
    Plan p = good;
    p.ops[1].loops["zz"] = 2;
    std::string loops;
    for (const LoopDim &l : g->op(1).sem.loops)
      loops += (loops.empty() ? "" : ", ") + l.name;
    CHECK(strategyError(p, *g, topo) == "p.json: /ops/1/loops/zz: op '" + op1 +
                                            "': no loop 'zz' (the op's "
                                            "loops: " +
                                            loops + ")");
  }
  SECTION("degree does not divide its loop") {
    Plan p = good;
    REQUIRE(g->op(0).kind == "Conv");
    p.ops[0].loops["n"] = 3; // batch 64
    CHECK(strategyError(p, *g, topo) ==
          "p.json: /ops/0: op '" + g->op(0).name +
              "': degree 3 does not divide loop 'n' of size 64");
  }
  SECTION("device outside the topology") {
    Plan p = good;
    p.ops[1].devices[2] = 16;
    CHECK(strategyError(p, *g, topo) ==
          "p.json: /ops/1/devices/2: op '" + op1 +
              "': device 16 is not in topology 'p100-4x4' (16 devices)");
  }
  SECTION("weight-gradient order on an op without weights") {
    Plan p = good;
    REQUIRE(g->op(1).sem.weightInputs.empty());
    p.ops[1].weightGrad = WeightGradOrder::Last;
    CHECK(strategyError(p, *g, topo) ==
          "p.json: /ops/1/weight_grad: op '" + op1 +
              "' orders its weight gradients 'last', but it has no weights");
  }
  SECTION("too few devices") {
    Plan p = good;
    p.ops[1].devices.pop_back();
    CHECK(strategyError(p, *g, topo) ==
          "p.json: /ops/1: op '" + op1 +
              "': 16 tiles x 1 replicas need 16 devices, the configuration "
              "lists 15");
  }
}

TEST_CASE("soapc check finds what changed", "[Plan]") {
  auto g = zooModel("lenet");
  Topology topo = exampleTopology("p100-4x4");
  Plan plan = makePlan(*g, topo, dataParallel(*g, topo), exampleInputs(),
                       exampleFigures(topo));

  SECTION("fresh") {
    CHECK(checkPlan(plan, kModelSha, kTopologySha, 64, *g, topo).empty());
    SimMetrics m;
    m.fits = true;
    CHECK(checkPlan(plan, kModelSha, kTopologySha, 64, *g, topo, &m).empty());
  }
  SECTION("hashes and batch") {
    CHECK(whats(checkPlan(plan, "cc", "dd", 32, *g, topo)) ==
          std::vector<std::string>{
              "model examples/models/lenet.onnx changed: SHA-256 " + kModelSha +
                  " in the plan, cc now",
              "topology examples/topologies/p100-4x4.json changed: SHA-256 " +
                  kTopologySha + " in the plan, dd now",
              "batch changed: 64 in the plan, 32 now"});
  }
  SECTION("the batch no longer divides") {
    auto g6 = zooModel("lenet", 6);
    auto found = whats(checkPlan(plan, kModelSha, kTopologySha, 6, *g6, topo));
    REQUIRE(found.size() > 1);
    CHECK(found[0] == "batch changed: 64 in the plan, 6 now");
    CHECK(found[1] == "op '" + g6->op(0).name +
                          "': degree 16 does not divide loop 'n' of size 6");
  }
  SECTION("a smaller topology") {
    Topology k80 = exampleTopology("k80-8");
    auto found = whats(checkPlan(plan, kModelSha, kTopologySha, 64, *g, k80));
    REQUIRE_FALSE(found.empty());
    CHECK(found[0] == "op '" + g->op(0).name +
                          "': device 8 is not in topology 'k80-8' (8 devices)");
  }
  SECTION("another model") {
    auto alexnet = zooModel("alexnet");
    auto found =
        whats(checkPlan(plan, kModelSha, kTopologySha, 64, *alexnet, topo));
    REQUIRE_FALSE(found.empty());
    // Ops are matched by name: lenet's names that alexnet lacks are
    // reported first, then alexnet's ops the plan lacks.
    bool planSide = false, modelSide = false;
    for (const std::string &f : found) {
      planSide |=
          f.find("of the plan is not in the model") != std::string::npos ||
          f.find("changed kind") != std::string::npos;
      modelSide |=
          f.find("of the model is not in the plan") != std::string::npos;
    }
    CHECK(planSide);
    CHECK(modelSide);
    const Op *lastMissing = nullptr;
    for (const Op &op : alexnet->ops())
      if (g->findOp(op.name) < 0)
        lastMissing = &op;
    REQUIRE(lastMissing);
    CHECK(found.back() == "op '" + lastMissing->name + "' (" +
                              lastMissing->kind +
                              ") of the model is not in the plan");
  }
  SECTION("memory") {
    SimMetrics m;
    m.fits = false;
    m.peakDevice = 3;
    m.peakMemory = 200;
    m.capacity = 100;
    CHECK(whats(checkPlan(plan, kModelSha, kTopologySha, 64, *g, topo, &m)) ==
          std::vector<std::string>{"memory no longer fits: device 3 (" +
                                   topo.deviceName(3) +
                                   ") needs 200 bytes, capacity 100"});
  }
}
