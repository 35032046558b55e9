// Machine: the collective model against its closed forms, the choice of
// algorithm, link contention, and TensorOpt's 2^i interpolation of measured
// curves.
#include "soap/Machine/Collectives.h"
#include "../TestInputs.h"
#include "soap/Machine/TopologyLoader.h"
#include "soap/Support/Error.h"
#include <catch2/catch.hpp>
#include <cmath>

using namespace soap;
using namespace soap::test;

static std::vector<DeviceId> range(DeviceId lo, DeviceId hi) {
  std::vector<DeviceId> out;
  for (DeviceId d = lo; d < hi; ++d)
    out.push_back(d);
  return out;
}

/// The error message of a failed parse, "" on success.
static std::string profileError(llvm::Expected<CollectiveProfile> &p) {
  return p ? "" : errorMessage(p.takeError());
}

static constexpr Bytes kOneGiB = Bytes(1) << 30;

TEST_CASE("ring collectives on one NVSwitch node match the closed forms",
          "[Machine]") {
  Topology t = exampleTopology("dgx-h100-1");
  CollectiveModel m(t);
  auto g = range(0, 8);
  double S = double(kOneGiB), B = t.pathBandwidth(0, 1),
         a = t.pathLatency(0, 1);
  REQUIRE(B == 450e9);
  REQUIRE(a == Approx(1e-6));
  CollectiveEstimate ar = m.estimate(Collective::AllReduce, g, kOneGiB);
  CHECK(ar.algorithm == CollectiveAlgorithm::Ring);
  CHECK(ar.time == Approx(2.0 * 7 / 8 * S / B + 14 * a).epsilon(1e-12));
  CHECK(m.time(Collective::AllGather, g, kOneGiB) ==
        Approx(7.0 / 8 * S / B + 7 * a).epsilon(1e-12));
  CHECK(m.time(Collective::ReduceScatter, g, kOneGiB) ==
        Approx(7.0 / 8 * S / B + 7 * a).epsilon(1e-12));
  // Broadcast: the pipelined chain beats the binomial tree's 3 full rounds.
  CollectiveEstimate bc = m.estimate(Collective::Broadcast, g, kOneGiB);
  CHECK(bc.algorithm == CollectiveAlgorithm::Ring);
  CHECK(bc.time == Approx(S / B + 7 * a).epsilon(1e-12));
  CHECK(*m.algorithmTime(CollectiveAlgorithm::Tree, Collective::Broadcast, g,
                         kOneGiB) == Approx(3 * (a + S / B)).epsilon(1e-12));
  // No tree all-gather; no hierarchy inside one node.
  CHECK(!m.algorithmTime(CollectiveAlgorithm::Tree, Collective::AllGather, g,
                         kOneGiB));
  CHECK(!m.algorithmTime(CollectiveAlgorithm::Hierarchical,
                         Collective::AllReduce, g, kOneGiB));
}

TEST_CASE("the tree wins small all-reduces, the ring large ones", "[Machine]") {
  Topology t = exampleTopology("dgx-h100-1");
  CollectiveModel m(t);
  auto g = range(0, 8);
  double B = t.pathBandwidth(0, 1), a = t.pathLatency(0, 1);
  // Binary tree: a parent's NVSwitch port is shared by its two children.
  CHECK(*m.algorithmTime(CollectiveAlgorithm::Tree, Collective::AllReduce, g,
                         1024) ==
        Approx(2 * 3 * a + 2 * 1024.0 / (B / 2)).epsilon(1e-12));
  CHECK(m.estimate(Collective::AllReduce, g, 1024).algorithm ==
        CollectiveAlgorithm::Tree);
  CHECK(m.estimate(Collective::AllReduce, g, kOneGiB).algorithm ==
        CollectiveAlgorithm::Ring);
}

TEST_CASE("hierarchical all-reduce wins across two DGX nodes", "[Machine]") {
  Topology t = exampleTopology("dgx-h100-2");
  CollectiveModel m(t);
  auto g = range(0, 16);
  double S = double(kOneGiB);
  double Bn = 450e9, an = 1e-6; // inside a node
  double Bx = 50e9, ax = 4e-6;  // across nodes, one rail per local rank
  CollectiveEstimate e = m.estimate(Collective::AllReduce, g, kOneGiB);
  CHECK(e.algorithm == CollectiveAlgorithm::Hierarchical);
  double intra = 7 * an + 7.0 / 8 * S / Bn;
  double across = 2 * ax + 2 * 0.5 * (S / 8) / Bx; // ring of 2 on S/8
  CHECK(e.time == Approx(intra + across + intra).epsilon(1e-12));
  // The flat ring is bound by the NIC: 2 (n-1)/n S / 50 GB/s.
  double ring = *m.algorithmTime(CollectiveAlgorithm::Ring,
                                 Collective::AllReduce, g, kOneGiB);
  CHECK(ring == Approx(30 * ax + 2 * 15.0 / 16 * S / Bx).epsilon(1e-12));
  CHECK(e.time < ring / 5);
  // All-gather and reduce-scatter have their two-phase forms too.
  CHECK(m.estimate(Collective::AllGather, g, kOneGiB).algorithm ==
        CollectiveAlgorithm::Hierarchical);
  CHECK(m.time(Collective::ReduceScatter, g, kOneGiB) ==
        Approx(intra + ax + 0.5 * (S / 8) / Bx).epsilon(1e-12));
  // One device per node: nothing to gain from a hierarchy.
  CHECK(!m.algorithmTime(CollectiveAlgorithm::Hierarchical,
                         Collective::AllReduce, {0, 8}, kOneGiB));
}

TEST_CASE("concurrent rings share a NIC", "[Machine]") {
  // p100-4x4 has one NIC per node: the 4 cross-node rings of a hierarchical
  // all-reduce all cross it, each getting a quarter of 100 Gb/s.
  Topology t = exampleTopology("p100-4x4");
  CollectiveModel m(t);
  std::vector<std::vector<DeviceId>> rings;
  for (DeviceId j = 0; j < 4; ++j)
    rings.push_back({j, j + 4, j + 8, j + 12});
  AlphaBeta p = m.ringParameters(rings);
  CHECK(p.bandwidthBytesPerSec == Approx(12.5e9 / 4));
  CHECK(m.ringParameters({rings[0]}).bandwidthBytesPerSec == Approx(12.5e9));
}

TEST_CASE("rings follow the fast NVLinks of a DGX-1V", "[Machine]") {
  Topology t = exampleTopology("v100-2x8");
  CollectiveModel m(t);
  // The best cycle uses only double links: 0-3-2-1-5-6-7-4-0.
  auto order = m.ringOrder(range(0, 8));
  CHECK(order == std::vector<DeviceId>{0, 3, 2, 1, 5, 6, 7, 4});
  CHECK(m.ringParameters({order}).bandwidthBytesPerSec == Approx(50e9));
  // Node-major for groups across machines, same order inside each.
  auto both = m.ringOrder(range(0, 16));
  CHECK(both[8] == 8);
  CHECK(both[9] == 11);
}

TEST_CASE("send/recv crosses the route", "[Machine]") {
  Topology t = exampleTopology("dgx-h100-2");
  CollectiveModel m(t);
  CollectiveEstimate e = m.estimate(Collective::SendRecv, {2, 13}, kOneGiB);
  CHECK(e.algorithm == CollectiveAlgorithm::PointToPoint);
  CHECK(e.time ==
        Approx(t.pathLatency(2, 13) + double(kOneGiB) / t.pathBandwidth(2, 13))
            .epsilon(1e-12));
  CHECK(e.time == Approx(4e-6 + double(kOneGiB) / 50e9).epsilon(1e-12));
  CHECK(m.estimate(Collective::SendRecv, {3, 3}, kOneGiB).time == 0);
  CHECK(m.estimate(Collective::AllReduce, {5}, kOneGiB).algorithm ==
        CollectiveAlgorithm::Local);
  CHECK(m.estimate(Collective::AllReduce, {0, 1}, 0).time == 0);
}

TEST_CASE("measured curves interpolate bandwidth between 2^i and 2^(i+1)",
          "[Machine]") {
  CollectiveCurve c{Collective::AllReduce, {2, 8}, {}};
  for (int i = 10; i <= 20; ++i) // bandwidth grows 1 GB/s per doubling
    c.points.push_back({Bytes(1) << i, 1e9 * (i - 9)});
  // Exact at the measured sizes.
  CHECK(c.predict(Bytes(1) << 12) == Approx(4096 / 3e9).epsilon(1e-12));
  // Midway between 2^12 and 2^13 the bandwidth is midway: 3.5 GB/s.
  CHECK(c.predict(6144) == Approx(6144 / 3.5e9).epsilon(1e-12));
  // A quarter of the way: 3.25 GB/s.
  CHECK(c.predict(5120) == Approx(5120 / 3.25e9).epsilon(1e-12));
  // Clamped: below the smallest size its time; above the largest its
  // bandwidth.
  CHECK(c.predict(10) == Approx(1024 / 1e9).epsilon(1e-12));
  CHECK(c.predict(Bytes(1) << 22) ==
        Approx(double(Bytes(1) << 22) / 11e9).epsilon(1e-12));
}

TEST_CASE("profiles load from JSON, round-trip, and win when they apply",
          "[Machine]") {
  Json doc = Json::parse(R"([
    {"collective": "all-reduce", "nodes": 2, "gpus_per_node": 8,
     "points": [{"bytes": 1024, "bytes_per_sec": 1e9},
                {"bytes": 2048, "bytes_per_sec": 3e9}]}])");
  JsonReader r("p.json");
  auto parsed = CollectiveProfile::fromJson(doc, r, "/collectives");
  if (!parsed)
    FAIL(errorMessage(parsed.takeError()));
  CollectiveProfile *p = &*parsed;
  CHECK(p->size() == 1);
  CHECK(p->toJson() == doc);
  CHECK(*p->predict(Collective::AllReduce, {2, 8}, 1536) ==
        Approx(1536 / 2e9).epsilon(1e-12));
  CHECK(!p->predict(Collective::AllReduce, {1, 8}, 1536));

  Topology t = exampleTopology("dgx-h100-2");
  CollectiveModel m(t, p);
  CollectiveEstimate e = m.estimate(Collective::AllReduce, range(0, 16), 1536);
  CHECK(e.algorithm == CollectiveAlgorithm::Measured);
  CHECK(e.time == Approx(1536 / 2e9).epsilon(1e-12));
  // Another shape (one node) falls back to the model.
  CHECK(m.estimate(Collective::AllReduce, range(0, 8), 1536).algorithm !=
        CollectiveAlgorithm::Measured);

  Json bad = doc;
  bad[0]["points"][1]["bytes"] = 1024;
  auto e1 = CollectiveProfile::fromJson(bad, r, "/collectives");
  CHECK(profileError(e1) ==
        "p.json: /collectives/0/points/1/bytes: sizes must increase: 1024 "
        "after 1024");
  bad = doc;
  bad[0]["collective"] = "all-to-all";
  auto e2 = CollectiveProfile::fromJson(bad, r, "/collectives");
  CHECK_THAT(profileError(e2),
             Catch::StartsWith("p.json: /collectives/0/collective: unknown "
                               "collective 'all-to-all'"));
  bad = doc;
  bad[0]["points"][0]["bytes_per_sec"] = -1;
  auto e3 = CollectiveProfile::fromJson(bad, r, "/collectives");
  CHECK(profileError(e3) ==
        "p.json: /collectives/0/points/0/bytes_per_sec: must be positive, "
        "got -1");
  bad = doc;
  bad.push_back(doc[0]);
  auto e4 = CollectiveProfile::fromJson(bad, r, "/collectives");
  CHECK_THAT(profileError(e4),
             Catch::StartsWith("p.json: /collectives/1: duplicate curve"));
}

/// `nodes` nodes of 4 H100 on NVSwitch, 4 NDR NICs each, calibrated.
static Topology calibrated(int nodes) {
  Json doc = Json::parse(R"({"name": "t", "device": "H100-SXM",
    "node": {"gpus": 4,
      "intra": {"kind": "nvswitch", "bandwidth_gbps": 3600, "latency_us": 0.5},
      "pcie": {"bandwidth_gbps": 504, "latency_us": 0.5}},
    "inter": {"nics_per_node": 4, "bandwidth_gbps": 400, "latency_us": 1},
    "nccl": {"launch_us": 20, "nvls_efficiency": 0.74,
      "nvls_step_latency_us": 3.3,
      "links": {"nvswitch": {"efficiency": 0.81, "step_latency_us": 0.25},
                "pcie": {"step_latency_us": 0},
                "network": {"efficiency": 0.97, "step_latency_us": 1.5}}}})");
  doc["nodes"] = nodes;
  auto t = parseTopology(doc, "t.json");
  if (!t)
    FAIL(errorMessage(t.takeError()));
  return std::move(*t);
}

/// NCCL's pipelined form: launch + (sqrt(D/B) + sqrt(L))^2.
static double pipelined(double launch, double data, double bw, double lat) {
  double x = std::sqrt(data / bw) + std::sqrt(lat);
  return launch + x * x;
}

TEST_CASE("calibrated collectives inside a node: pipelined rings, NVLS",
          "[Machine]") {
  Topology t = calibrated(1);
  CollectiveModel m(t);
  auto g = range(0, 4);
  double S = double(kOneGiB), B = 450e9 * 0.81, hop = 0.5e-6;
  double ring = pipelined(20e-6, 2.0 * 3 / 4 * S, B, 6 * hop);
  CHECK(*m.algorithmTime(CollectiveAlgorithm::Ring, Collective::AllReduce, g,
                         kOneGiB) == Approx(ring).epsilon(1e-12));
  CHECK(*m.algorithmTime(CollectiveAlgorithm::Ring, Collective::AllGather, g,
                         kOneGiB) ==
        Approx(pipelined(20e-6, 3.0 / 4 * S, B, 3 * hop)).epsilon(1e-12));
  // NVLS: (1 + 1/n) S per direction at 0.74 of the link, two 3.3 us steps;
  // faster than the ring for large all-reduces, so chosen.
  double nvls = pipelined(20e-6, 1.25 * S, 450e9 * 0.74, 2 * 3.3e-6);
  CollectiveEstimate e = m.estimate(Collective::AllReduce, g, kOneGiB);
  CHECK(e.algorithm == CollectiveAlgorithm::Switch);
  CHECK(e.time == Approx(nvls).epsilon(1e-12));
  CHECK(algorithmName(e.algorithm) == "nvls");
  CHECK(!m.algorithmTime(CollectiveAlgorithm::Switch, Collective::AllGather,
                         g, kOneGiB));
  // Bus bandwidth rises over decades of sizes (the S-curve) and saturates
  // below the calibrated rate.
  double prev = 0;
  for (Bytes size = 1 << 20; size <= (Bytes(8) << 30); size *= 8) {
    double busbw = double(size) /
                   *m.algorithmTime(CollectiveAlgorithm::Ring,
                                    Collective::AllReduce, g, size) *
                   2 * 3 / 4;
    CHECK(busbw > prev);
    CHECK(busbw < B);
    prev = busbw;
  }
  CHECK(prev > 0.9 * B);
  // A send: one step over the route, at the calibrated bandwidth.
  CHECK(m.time(Collective::SendRecv, {0, 1}, kOneGiB) ==
        Approx(pipelined(20e-6, S, B, hop)).epsilon(1e-12));
}

TEST_CASE("calibrated collectives across nodes: one ring per NIC rail",
          "[Machine]") {
  Topology t = calibrated(2);
  CollectiveModel m(t);
  auto g = range(0, 8);
  double S = double(kOneGiB);
  // Four rings, each leaving a node from a different GPU and so through its
  // own NIC: a NIC link carries one ring (0.97 x 50 GB/s), a GPU's NVSwitch
  // link three (0.81 x 450 / 3), so the NICs bound each ring's quarter.
  double B = 50e9 * 0.97;
  // Per ring: 6 NVSwitch hops of 0.5 us, 2 network hops of 2 x 1.5 us.
  double meanHop = (6 * 0.5e-6 + 2 * 3e-6) / 8;
  double ring = pipelined(20e-6, 2.0 * 7 / 8 * S / 4, B, 14 * meanHop);
  CHECK(*m.algorithmTime(CollectiveAlgorithm::Ring, Collective::AllReduce, g,
                         kOneGiB) == Approx(ring).epsilon(1e-12));
  // No NVLS across nodes.
  CHECK(!m.algorithmTime(CollectiveAlgorithm::Switch, Collective::AllReduce,
                         g, kOneGiB));
  // Uncalibrated, the same cluster's ring crosses one NIC per node.
  Json doc = Json::parse(R"({"name": "t", "device": "H100-SXM", "nodes": 2,
    "node": {"gpus": 4,
      "intra": {"kind": "nvswitch", "bandwidth_gbps": 3600, "latency_us": 0.5},
      "pcie": {"bandwidth_gbps": 504, "latency_us": 0.5}},
    "inter": {"nics_per_node": 4, "bandwidth_gbps": 400, "latency_us": 1}})");
  auto plain = parseTopology(doc, "t.json");
  REQUIRE(static_cast<bool>(plain));
  CollectiveModel pm(*plain);
  CHECK(*pm.algorithmTime(CollectiveAlgorithm::Ring, Collective::AllReduce, g,
                          kOneGiB) ==
        Approx(2.0 * 7 / 8 * S / 50e9 + 14 * 4e-6).epsilon(1e-12));
}
