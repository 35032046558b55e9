// Machine: the example topologies load with the expected structure, routes
// are deterministic shortest paths over the right links, levels and groups
// follow the hierarchy, and malformed files fail naming the JSON pointer.
#include "soap/Machine/Topology.h"
#include "../TestInputs.h"
#include "soap/Machine/TopologyLoader.h"
#include "soap/Machine/TopologyPrinter.h"
#include "soap/Support/Error.h"
#include <catch2/catch.hpp>
#include <set>

using namespace soap;
using namespace soap::test;

static std::string classes(const Topology &t, DeviceId a, DeviceId b) {
  std::string out;
  for (LinkId l : t.route(a, b))
    out += (out.empty() ? "" : " ") + linkClassName(t.link(l).cls).str();
  return out;
}

static Topology mustParse(const Json &doc) {
  auto t = parseTopology(doc, "t.json");
  if (!t)
    FAIL(errorMessage(t.takeError()));
  return std::move(*t);
}

/// The loader's error message for `doc`, or "" when it loads.
static std::string loadError(const Json &doc) {
  auto t = parseTopology(doc, "t.json");
  if (t)
    return "";
  return errorMessage(t.takeError());
}

static Json nvswitchDoc(int nodes) {
  Json doc = {
      {"name", "t"},
      {"device", "H100-SXM"},
      {"nodes", nodes},
      {"node",
       {{"gpus", 4},
        {"intra",
         {{"kind", "nvswitch"}, {"bandwidth_gbps", 3600}, {"latency_us", 0.5}}},
        {"pcie", {{"bandwidth_gbps", 504}, {"latency_us", 0.5}}}}}};
  if (nodes > 1)
    doc["inter"] = {
        {"nics_per_node", 4}, {"bandwidth_gbps", 400}, {"latency_us", 1}};
  return doc;
}

static Json pcieDoc() {
  return Json::parse(R"({
    "name": "t", "device": "K80", "nodes": 1,
    "node": {"gpus": 4, "intra": {"kind": "pcie", "bandwidth_gbps": 126,
      "latency_us": 0.5, "switches": [
        {"id": "cpu", "kind": "cpu"},
        {"id": "b0", "parent": "cpu", "gpus": [0, 1]},
        {"id": "b1", "parent": "cpu", "gpus": [2, 3]}]}}})");
}

TEST_CASE("every example topology loads and routes every pair", "[Machine]") {
  for (const char *name : {"dgx-h100-1", "dgx-h100-2", "dgx-h100-8", "p100-4x4",
                           "k80-16x4", "k80-8", "v100-2x8"}) {
    INFO(name);
    Topology t = exampleTopology(name);
    CHECK(t.name() == name);
    for (DeviceId a = 0; a < t.numDevices(); ++a)
      for (DeviceId b = 0; b < t.numDevices(); ++b) {
        const auto &r = t.route(a, b);
        if (a == b) {
          CHECK(r.empty());
          continue;
        }
        REQUIRE(!r.empty());
        // The route is a connected directed path from a to b.
        CHECK(t.link(r.front()).from == t.device(a).vertex);
        CHECK(t.link(r.back()).to == t.device(b).vertex);
        for (size_t i = 1; i < r.size(); ++i)
          CHECK(t.link(r[i - 1]).to == t.link(r[i]).from);
        // No third GPU forwards traffic.
        for (size_t i = 0; i + 1 < r.size(); ++i)
          CHECK(t.vertices()[t.link(r[i]).to].kind != VertexKind::Device);
      }
  }
}

TEST_CASE("DGX H100 x2: counts, routes, bandwidth and latency", "[Machine]") {
  Topology t = exampleTopology("dgx-h100-2");
  CHECK(t.numDevices() == 16);
  CHECK(t.numNodes() == 2);
  CHECK(t.numSwitchGroups() == 2);
  CHECK(t.numRacks() == 1);
  CHECK(t.deviceName(9) == "n1.gpu1");
  CHECK(t.device(9).node == 1);
  CHECK(t.device(9).localRank == 1);
  // Inside a node: through the NVSwitch, 450 GB/s per direction.
  CHECK(classes(t, 0, 1) == "nvswitch nvswitch");
  CHECK(t.pathBandwidth(0, 1) == Approx(450e9));
  CHECK(t.pathLatency(0, 1) == Approx(1e-6));
  // Across nodes: gpu -> PCIe switch -> its rail's NIC -> leaf -> ... 400 Gb/s.
  CHECK(classes(t, 0, 8) == "pcie pcie network network pcie pcie");
  CHECK(t.pathBandwidth(0, 8) == Approx(50e9));
  CHECK(t.pathLatency(0, 8) == Approx(4e-6));
  // Rails: gpu 3 leaves through NIC 3, so rails do not share NICs.
  const Link &nicHop = t.link(t.route(3, 11)[2]);
  CHECK(t.vertices()[nicHop.from].name == "n0.nic3");
  // Directed links: the two directions of a physical link are distinct ids.
  CHECK(t.route(0, 1)[0] != t.route(1, 0)[1]);
  CHECK(t.route(0, 1)[0] / 2 == t.route(1, 0)[1] / 2);
}

TEST_CASE("levels and groups follow the hierarchy", "[Machine]") {
  Topology k80 = exampleTopology("k80-16x4");
  CHECK(k80.levelOf(0, 0) == Level::Device);
  CHECK(k80.levelOf(0, 1) == Level::Switch); // one K80 board
  CHECK(k80.levelOf(0, 2) == Level::Node);
  CHECK(k80.levelOf(0, 4) == Level::Rack);
  CHECK(k80.groupsAt(Level::Switch).size() == 32);
  CHECK(k80.groupsAt(Level::Switch)[1] == std::vector<DeviceId>{2, 3});
  CHECK(k80.groupsAt(Level::Node)[15] == std::vector<DeviceId>{60, 61, 62, 63});
  CHECK(k80.groupsAt(Level::Cluster).front().size() == 64);
  CHECK(classes(k80, 0, 2) == "pcie pcie pcie pcie");

  Topology big = exampleTopology("dgx-h100-128");
  CHECK(big.numDevices() == 1024);
  CHECK(big.numRacks() == 4);
  CHECK(big.levelOf(0, 8) == Level::Rack);
  CHECK(big.levelOf(0, 32 * 8) == Level::Cluster);
  CHECK(big.device(32 * 8).rack == 1);
  CHECK(classes(big, 0, 256) ==
        "pcie pcie network uplink uplink network pcie pcie");
  CHECK(big.pathLatency(0, 256) == Approx(5e-6));
}

TEST_CASE("routes prefer fast paths and fall back to PCIe", "[Machine]") {
  Topology v = exampleTopology("v100-2x8");
  // DGX-1V: 0-3 has two NVLinks, 0-1 one, 0-5 none (PCIe).
  CHECK(v.pathBandwidth(0, 3) == Approx(50e9));
  CHECK(v.pathBandwidth(0, 1) == Approx(25e9));
  CHECK(classes(v, 0, 5) == "pcie pcie");
  CHECK(v.pathBandwidth(0, 5) == Approx(126e9 / 8));
  Topology k = exampleTopology("k80-8");
  // Across sockets: board, CPU, socket link, CPU, board.
  CHECK(classes(k, 0, 7) == "pcie pcie socket pcie pcie");
  CHECK(k.pathLatency(0, 7) == Approx(4e-6));
}

TEST_CASE("loading is deterministic", "[Machine]") {
  Topology a = exampleTopology("p100-4x4"), b = exampleTopology("p100-4x4");
  for (DeviceId x = 0; x < a.numDevices(); ++x)
    for (DeviceId y = 0; y < a.numDevices(); ++y)
      CHECK(a.route(x, y) == b.route(x, y));
  CHECK(dumpJson(topologyToJson(a)) == dumpJson(topologyToJson(b)));
}

TEST_CASE("device memory can be overridden", "[Machine]") {
  Json doc = nvswitchDoc(1);
  doc["device_memory_gib"] = 79.5;
  Topology t = mustParse(doc);
  CHECK(t.deviceSpec().memoryBytes == Bytes(79.5 * 1024 * 1024 * 1024));
  CHECK(t.deviceSpec().name == "H100-SXM");
}

TEST_CASE("malformed topologies name the JSON pointer", "[Machine]") {
  Json doc = nvswitchDoc(2);
  doc.erase("device");
  CHECK(loadError(doc) == "t.json: /device: missing required field");

  doc = nvswitchDoc(2);
  doc["node"]["intra"]["bandwidth_gbps"] = -3;
  CHECK(loadError(doc) == "t.json: /node/intra/bandwidth_gbps: -3 is outside "
                          "0.001..1e+06 Gbit/s (a link's bandwidth)");

  doc = nvswitchDoc(2);
  doc["inter"]["bandwidth_gbps"] = 0;
  CHECK(loadError(doc) == "t.json: /inter/bandwidth_gbps: 0 is outside "
                          "0.001..1e+06 Gbit/s (a link's bandwidth)");

  // Finite but not physical.
  doc = nvswitchDoc(2);
  doc["inter"]["bandwidth_gbps"] = 1e308;
  CHECK(loadError(doc) == "t.json: /inter/bandwidth_gbps: 1e+308 is outside "
                          "0.001..1e+06 Gbit/s (a link's bandwidth)");
  doc = nvswitchDoc(2);
  doc["inter"]["latency_us"] = 2e6;
  CHECK(loadError(doc) == "t.json: /inter/latency_us: 2e+06 is outside "
                          "0..1e+06 microseconds (a link's latency)");

  doc = nvswitchDoc(2);
  doc["nodes"] = "two";
  CHECK(loadError(doc) == "t.json: /nodes: expected an integer, got a string");

  doc = nvswitchDoc(2);
  doc["device"] = "H300";
  CHECK_THAT(loadError(doc),
             Catch::StartsWith("t.json: /device: unknown device type 'H300'; "
                               "known: K80, P100-SXM2,"));

  doc = nvswitchDoc(2);
  doc.erase("inter");
  CHECK_THAT(loadError(doc),
             Catch::StartsWith("t.json: /inter: missing: 2 nodes need an "
                               "inter-node network"));

  doc = nvswitchDoc(2);
  doc["inter"]["nics_per_node"] = 3;
  CHECK_THAT(loadError(doc),
             Catch::StartsWith("t.json: /inter/nics_per_node: must divide"));

  doc = nvswitchDoc(1);
  doc["node"].erase("pcie");
  CHECK(loadError(doc) == "t.json: /node/pcie: missing required field");

  doc = nvswitchDoc(1);
  doc["node"]["intra"]["kind"] = "infinity-fabric";
  CHECK_THAT(loadError(doc),
             Catch::StartsWith("t.json: /node/intra/kind: expected"));
}

TEST_CASE("PCIe trees: attachment, duplicate ids, roots", "[Machine]") {
  CHECK(loadError(pcieDoc()) == "");

  Json doc = pcieDoc();
  doc["node"]["intra"]["switches"][2]["gpus"] = {2};
  CHECK(loadError(doc) ==
        "t.json: /node/intra/switches: gpu 3 is attached to no switch: it "
        "would have no route to the other devices");

  doc = pcieDoc();
  doc["node"]["intra"]["switches"][2]["id"] = "b0";
  CHECK(loadError(doc) == "t.json: /node/intra/switches/2/id: duplicate "
                          "switch id 'b0' (first at /node/intra/switches/1)");

  doc = pcieDoc();
  doc["node"]["intra"]["switches"][2]["gpus"] = {1, 2, 3};
  CHECK(loadError(doc) == "t.json: /node/intra/switches/2/gpus/0: gpu 1 is "
                          "already attached to switch 'b0'");

  doc = pcieDoc();
  doc["node"]["intra"]["switches"][2].erase("parent");
  CHECK_THAT(loadError(doc),
             Catch::StartsWith("t.json: /node/intra/switches/2: switch 'b1' "
                               "has no parent, but 'cpu' is already the root"));

  doc = pcieDoc();
  doc["node"]["intra"]["switches"][1]["parent"] = "nowhere";
  CHECK(loadError(doc) ==
        "t.json: /node/intra/switches/1/parent: unknown switch 'nowhere'");

  doc = pcieDoc();
  doc["node"]["intra"]["switches"][0]["parent"] = "b0";
  CHECK_THAT(loadError(doc), Catch::Contains("the parents form a cycle"));

  doc = pcieDoc();
  doc["node"]["intra"]["switches"][2]["gpus"] = {2, 4};
  CHECK(loadError(doc) == "t.json: /node/intra/switches/2/gpus/1: expected "
                          "a gpu index in [0, 4)");
}

TEST_CASE("NVLink connections are checked", "[Machine]") {
  Json doc = Json::parse(R"({
    "name": "t", "device": "V100-SXM2-16GB", "nodes": 1,
    "node": {"gpus": 3, "intra": {"kind": "nvlink", "bandwidth_gbps": 200,
      "latency_us": 0.5, "connections": [
        {"gpus": [0, 1], "links": 2}, {"gpus": [1, 2]}]},
      "pcie": {"bandwidth_gbps": 126, "latency_us": 0.5}}})");
  Topology t = mustParse(doc);
  CHECK(t.pathBandwidth(0, 1) == Approx(50e9));
  CHECK(t.pathBandwidth(1, 2) == Approx(25e9));
  CHECK(classes(t, 0, 2) == "pcie pcie"); // gpu 1 does not forward

  doc["node"]["intra"]["connections"][1]["gpus"] = {1, 0};
  CHECK(loadError(doc) ==
        "t.json: /node/intra/connections/1: duplicate connection between "
        "gpus 0 and 1 (first at /node/intra/connections/0)");
  doc["node"]["intra"]["connections"][1]["gpus"] = {2, 2};
  CHECK(loadError(doc) == "t.json: /node/intra/connections/1/gpus: a "
                          "connection needs two different gpus");
}

TEST_CASE("hand-built topologies: routes, and devices without one",
          "[Machine]") {
  Topology t;
  VertexId a = t.addVertex(VertexKind::Device, "a", 0, 0);
  VertexId b = t.addVertex(VertexKind::Device, "b", 0, 0);
  VertexId c = t.addVertex(VertexKind::Device, "c", 0, 0);
  VertexId sw = t.addVertex(VertexKind::PcieSwitch, "sw", 0, 0);
  t.addDevice(a, 0, 0, 0, 0);
  t.addDevice(b, 0, 1, 0, 0);
  t.addDevice(c, 0, 2, 1, 0);
  LinkId ab = t.addLink(a, b, LinkClass::NVLink, 100e9, 1e-6);
  LinkId asw = t.addLink(a, sw, LinkClass::PCIe, 10e9, 1e-6);
  LinkId bsw = t.addLink(b, sw, LinkClass::PCIe, 10e9, 1e-6);
  // c is attached to nothing.
  CHECK(errorMessage(t.finalize()) == "device a has no route to device c");
  LinkId csw = t.addLink(c, sw, LinkClass::PCIe, 10e9, 1e-6);
  REQUIRE(!t.finalize());
  CHECK(t.route(0, 1) == std::vector<LinkId>{ab});
  CHECK(t.route(1, 0) == std::vector<LinkId>{ab + 1});
  // a -> sw, then the reverse direction of c's link: sw -> c.
  CHECK(t.route(0, 2) == std::vector<LinkId>{asw, csw + 1});
  CHECK(t.link(csw + 1).to == c);
  CHECK(t.pathBandwidth(0, 2) == 10e9);
  CHECK(t.pathLatency(0, 2) == Approx(2e-6));
  (void)bsw;
  CHECK(t.levelOf(0, 1) == Level::Switch);
  CHECK(t.levelOf(0, 2) == Level::Node);
  CHECK(t.groupsAt(Level::Switch) ==
        std::vector<std::vector<DeviceId>>{{0, 1}, {2}});
  CHECK(t.groupOf(2, Level::Switch) == 1);
}

TEST_CASE("non-blocking links: a rack uplink that carries all its NICs",
          "[Machine]") {
  auto uplinks = [](const Topology &t, bool nonBlocking) {
    size_t n = 0;
    for (const Link &l : t.links())
      n += l.cls == LinkClass::Uplink && t.nonBlocking(l.id) == nonBlocking;
    return n;
  };
  // dgx-h100-128: 32 nodes x 8 NICs x 400 Gb/s = 102.4 Tb/s per rack, the
  // uplink's bandwidth: never the bottleneck, in either direction.
  Topology big = exampleTopology("dgx-h100-128");
  CHECK(uplinks(big, true) == 8);
  CHECK(uplinks(big, false) == 0);
  // A NIC's own network link and every link of a GPU stay contended.
  for (const Link &l : big.links()) {
    bool gpu = big.vertices()[l.from].kind == VertexKind::Device ||
               big.vertices()[l.to].kind == VertexKind::Device;
    bool nicOut = big.vertices()[l.from].kind == VertexKind::Nic &&
                  big.vertices()[l.to].kind == VertexKind::NetworkSwitch;
    if (gpu || nicOut)
      CHECK(!big.nonBlocking(l.id));
  }
  // Oversubscribed 2:1 (4 nodes x 4 NICs x 400 Gb/s into 3.2 Tb/s): the
  // uplinks out of the racks contend.
  Json doc = nvswitchDoc(8);
  doc["racks"] = {{"nodes_per_rack", 4},
                  {"uplink_bandwidth_gbps", 3200},
                  {"uplink_latency_us", 0.5}};
  Topology over = mustParse(doc);
  CHECK(uplinks(over, false) > 0);
  doc["racks"]["uplink_bandwidth_gbps"] = 6400;
  Topology full = mustParse(doc);
  CHECK(uplinks(full, false) == 0);
}

TEST_CASE("the nccl calibration: fields, defaults and errors", "[Machine]") {
  // Absent: not calibrated, every class at line rate.
  Topology plain = mustParse(nvswitchDoc(2));
  CHECK(!plain.nccl().enabled);
  CHECK(plain.nccl().efficiency[size_t(LinkClass::Network)] == 1);

  Json doc = nvswitchDoc(2);
  doc["nccl"] = Json::parse(R"({"launch_us": 20, "nvls_efficiency": 0.74,
    "nvls_step_latency_us": 3.3,
    "links": {"nvswitch": {"efficiency": 0.81, "step_latency_us": 0.25},
              "network": {"efficiency": 0.97}}})");
  Topology t = mustParse(doc);
  const NcclCalibration &c = t.nccl();
  CHECK(c.enabled);
  CHECK(c.launch == Approx(20e-6));
  CHECK(c.nvlsEfficiency == 0.74);
  CHECK(*c.nvlsStepLatency == Approx(3.3e-6));
  CHECK(c.efficiency[size_t(LinkClass::NVSwitch)] == 0.81);
  CHECK(*c.stepLatency[size_t(LinkClass::NVSwitch)] == Approx(0.25e-6));
  CHECK(c.efficiency[size_t(LinkClass::Network)] == 0.97);
  CHECK(!c.stepLatency[size_t(LinkClass::Network)]); // the link's latency
  CHECK(c.efficiency[size_t(LinkClass::PCIe)] == 1);
  Json printed = topologyToJson(t);
  CHECK(printed["nccl"]["links"]["nvswitch"]["efficiency"] == 0.81);
  CHECK(printed["nccl"]["nvls_step_latency_seconds"] == Approx(3.3e-6));

  doc = nvswitchDoc(2);
  doc["nccl"] = {{"links", {{"nvswitch", {{"efficiency", 1.5}}}}}};
  CHECK(loadError(doc) == "t.json: /nccl/links/nvswitch/efficiency: 1.5 is "
                          "outside 0.01..1 (a fraction of the link's "
                          "bandwidth)");
  doc = nvswitchDoc(2);
  doc["nccl"] = {{"links", {{"infiniband", {{"efficiency", 0.9}}}}}};
  CHECK_THAT(loadError(doc),
             Catch::StartsWith("t.json: /nccl/links/infiniband: unknown link "
                               "class; known: nvlink,"));
  doc = nvswitchDoc(2);
  doc["nccl"] = {{"links", {{"network", 0.9}}}};
  CHECK(loadError(doc) == "t.json: /nccl/links/network: expected an object");
  doc = nvswitchDoc(2);
  doc["nccl"] = {{"launch_us", -1}};
  CHECK(loadError(doc) == "t.json: /nccl/launch_us: -1 is outside 0..1e+06 "
                          "microseconds (a collective's fixed cost)");
  doc = nvswitchDoc(2);
  doc["nccl"] = {{"nvls_step_latency_us", 3}};
  CHECK(loadError(doc) == "t.json: /nccl/nvls_step_latency_us: needs "
                          "nvls_efficiency (NVLink SHARP) beside it");
  doc = nvswitchDoc(2);
  doc["nccl"] = 3;
  CHECK(loadError(doc) == "t.json: /nccl: expected an object, got a number");
  Json pcie = pcieDoc();
  pcie["nccl"] = {{"nvls_efficiency", 0.7}};
  CHECK(loadError(pcie) == "t.json: /nccl/nvls_efficiency: NVLink SHARP "
                           "needs an NVSwitch node (node.intra.kind "
                           "\"nvswitch\")");
}

TEST_CASE("DGX A100 and H100 clusters: SuperPOD units as racks", "[Machine]") {
  Topology a = exampleTopology("dgx-a100-64");
  CHECK(a.numDevices() == 512);
  CHECK(a.numRacks() == 4); // 20 + 20 + 20 + 4 nodes
  CHECK(a.deviceSpec().name == "A100-SXM4-80GB");
  CHECK(a.pathBandwidth(0, 1) == 300e9);
  CHECK(a.pathBandwidth(0, 8) == 25e9);
  CHECK(a.nccl().enabled);
  Topology small = exampleTopology("dgx-a100-16");
  CHECK(small.numRacks() == 1);
  Topology h = exampleTopology("dgx-h100-256");
  CHECK(h.numDevices() == 2048);
  CHECK(h.numRacks() == 8);
  CHECK(h.nccl().nvlsEfficiency > 0);
  // A rack uplink carries every NIC of a full rack: non-blocking.
  for (const Link &l : h.links())
    if (l.cls == LinkClass::Uplink)
      CHECK(h.nonBlocking(l.id));
}
