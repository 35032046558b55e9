// bench-collectives: predicted all-reduce bus bandwidth of the collective
// model (lib/Machine/Collectives.cpp) on 8 x H100 on NVSwitch (dgx-h100-1)
// and 2 x 8 V100 (v100-2x8), 1 KiB to 4 GiB, beside published nccl-tests
// figures where there are any; then the calibrated DGX clusters
// (dgx-a100-N, dgx-h100-N: their `nccl` objects) against every published
// nccl-tests figure they were fitted to or checked by, with the error, and
// their predictions at 16 to 1,024 ranks. Asserts nothing: a benchmark, not
// a test.
//   build/bin/bench-collectives [--out bench/results/collectives.json]
//       [--published-out bench/results/collectives-published.json]
//
// Bus bandwidth is nccl-tests' definition (doc/PERFORMANCE.md in
// NVIDIA/nccl-tests): busbw = S / t * 2 (n - 1) / n for all-reduce, so that
// it is comparable to the link bandwidth whatever n is.
//
// Published figures (large messages only; nothing is cited for small ones):
//  - 8 x H100 SXM, one node: "With the protocol overhead (~20%) NCCL can get
//    an effective NVLink bandwidth of 370GB/s ... with NCCL_ALGO=RING", and
//    with NVLink SHARP (NCCL's default for all-reduce since 2.17) "a peak
//    busBw of ~480GB/s", reached above 256 MiB -- S. Jeaugey (NVIDIA, NCCL
//    maintainer) in NVIDIA/nccl-tests issue #212 (2024-05-06). A user's
//    measurement in NVIDIA/nccl issue #1455 reports ring busbw 365-370 GB/s
//    at 2-4 GiB on 8 x H100 SXM, and NVLS 480 GB/s.
//  - 2 x 8 V100 with one 100 Gb/s EDR adapter per machine: not published
//    (TensorOpt reports no nccl-tests figures for its cluster).
// The model uses NVLink line rate (450 GB/s per direction) and no protocol
// overhead, so at large sizes it sits near 450 GB/s, above NCCL's ring
// (~370) and below NVLS (~480, which reduces inside the switch). Measured
// curves (CollectiveProfile) are how a real cluster corrects the model.
#include "soap/Machine/Collectives.h"
#include "soap/Machine/TopologyLoader.h"
#include "soap/Support/Error.h"
#include "soap/Support/Format.h"
#include "soap/Support/Json.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include <cstring>
#include <map>
#include <memory>
#include "BenchArgs.h"
#include <cmath>
#include <fmt/format.h>
#include <limits>
#include <string>
#include <vector>

using namespace soap;

namespace {

struct Case {
  const char *topology;
  /// Published busbw (GB/s) at a size, or "" when nothing is published.
  std::string (*published)(Bytes size);
};

std::string h100Published(Bytes size) {
  if (size >= (Bytes(1) << 30))
    return "370 ring / 480 NVLS";
  return "n/p";
}

std::string notPublished(Bytes) { return "n/p"; }

std::string sizeName(Bytes b) {
  if (b >= (Bytes(1) << 30))
    return fmt::format("{} GiB", b >> 30);
  if (b >= (Bytes(1) << 20))
    return fmt::format("{} MiB", b >> 20);
  return fmt::format("{} KiB", b >> 10);
}

constexpr Bytes kKiB = 1024, kMiB = kKiB << 10, kGiB = kMiB << 10;
constexpr double kNone = std::numeric_limits<double>::quiet_NaN();

/// Published nccl-tests figures (bus bandwidth, GB/s) and where they are.
struct Source {
  const char *tag, *where;
};
const Source kSources[] = {
    {"azure-a100",
     "Azure/AI-benchmarking-guide, Azure_Results/ND_A100_v4_results.md, "
     "'NCCL Bandwidth': all_reduce_perf in-place busbw, 8 x A100-SXM4-80GB "
     "on NVSwitch, NCCL 2.18.5"},
    {"azure-h100",
     "Azure/AI-benchmarking-guide, 'Azure Results/ND_H100_v5_results.md', "
     "'NCCL Bandwidth': all_reduce_perf in-place busbw (NVLS), 8 x H100 SXM "
     "on NVSwitch, NCCL 2.18.5"},
    {"nccl#1047",
     "NVIDIA/nccl issue #1047: reduce_scatter_perf out-of-place busbw, ring, "
     "8 x H100 80GB HBM3 in one server"},
    {"nccl-tests#212",
     "NVIDIA/nccl-tests issue #212, S. Jeaugey (NVIDIA): effective NVLink "
     "bandwidth ~370 GB/s busbw for non-allreduce operations or "
     "NCCL_ALGO=RING on 8 x H100; NVLS all-reduce peak ~480 GB/s"},
    {"nccl#812",
     "NVIDIA/nccl issue #812, AddyLaddy (NVIDIA): 'On an Nvidia DGX-A100 "
     "system we have 8x200Gbit/s IB cards and we measure 192GB/s AllReduce "
     "BusBW' (ring, 2 nodes)"},
    {"nccl#1221",
     "NVIDIA/nccl issue #1221: 8 x H100 with 8 x 400 Gb/s RoCE (not IB), "
     "NCCL 2.19.3, all_reduce_perf 4-8 GiB on 4 nodes: busbw 320 GB/s"},
    {"nccl-tests#267",
     "NVIDIA/nccl-tests issue #267, AddyLaddy (NVIDIA): 'CX-7 NICs at NDR "
     "rate (400Gbps) should achieve up to 48-49GB/s per NIC'"},
    {"li-plus",
     "li-plus/playground, cuda/nccl.md: sendrecv_perf -g 8 on 8 A100 "
     "NVLink (NVSwitch) GPUs, busbw 195.10 GB/s at 1 GiB"},
};

struct Row {
  const char *system; ///< "a100" or "h100"
  const char *topology;
  uint32_t ranks; ///< the first `ranks` devices (whole nodes)
  Collective kind;
  /// Forced algorithm (the figure is for it); Local: the model's choice.
  CollectiveAlgorithm algorithm;
  Bytes size;
  double publishedGBps; ///< NaN: nothing published (a prediction only)
  const char *source;
};

std::vector<Row> publishedRows() {
  std::vector<Row> rows;
  const auto any = CollectiveAlgorithm::Local;
  // 8 x A100 all-reduce, Azure ND A100 v4 (1 MiB..8 GiB).
  const double a100[] = {36.22,  53.54,  71.43,  89.99,  109.22,
                         132.77, 166.63, 174.18, 213.87, 221.58,
                         228.10, 230.22, 230.48, 231.58};
  for (int i = 0; i < 14; ++i)
    rows.push_back({"a100", "dgx-a100-4", 8, Collective::AllReduce, any,
                    kMiB << i, a100[i], "azure-a100"});
  rows.push_back({"a100", "dgx-a100-4", 8, Collective::SendRecv, any, kGiB,
                  195.10, "li-plus"});
  rows.push_back({"a100", "dgx-a100-4", 16, Collective::AllReduce,
                  CollectiveAlgorithm::Ring, 8 * kGiB, 192, "nccl#812"});
  // 8 x H100 all-reduce (NVLS), Azure ND H100 v5.
  const double h100[] = {43.70,  81.93,  128.73, 172.13, 234.45,
                         295.53, 361.78, 400.61, 423.38, 438.46,
                         466.35, 472.36, 475.54, 478.87};
  for (int i = 0; i < 14; ++i)
    rows.push_back({"h100", "dgx-h100-16", 8, Collective::AllReduce, any,
                    kMiB << i, h100[i], "azure-h100"});
  rows.push_back({"h100", "dgx-h100-16", 8, Collective::AllReduce,
                  CollectiveAlgorithm::Ring, 8 * kGiB, 370, "nccl-tests#212"});
  rows.push_back({"h100", "dgx-h100-16", 8, Collective::AllGather, any,
                  8 * kGiB, 370, "nccl-tests#212"});
  const double h100rs[] = {311.34, 330.94, 340.94, 349.36,
                           354.81, 357.76, 362.16};
  for (int i = 0; i < 7; ++i)
    rows.push_back({"h100", "dgx-h100-16", 8, Collective::ReduceScatter, any,
                    (128 * kMiB) << i, h100rs[i], "nccl#1047"});
  rows.push_back({"h100", "dgx-h100-16", 2, Collective::SendRecv, any,
                  8 * kGiB, 48.5, "nccl-tests#267"});
  rows.back().ranks = 9; // n0.gpu0 -> n1.gpu0: one NIC each way
  rows.push_back({"h100", "dgx-h100-16", 32, Collective::AllReduce,
                  CollectiveAlgorithm::Ring, 8 * kGiB, 320, "nccl#1221"});
  // Predictions across nodes, nothing published to compare with.
  for (auto [system, topo] : {std::pair{"a100", "dgx-a100-128"},
                              std::pair{"h100", "dgx-h100-256"}})
    for (uint32_t ranks : {16u, 64u, 256u, 1024u})
      for (Collective kind : {Collective::AllReduce, Collective::AllGather,
                              Collective::ReduceScatter})
        for (Bytes size : {kMiB, 64 * kMiB, kGiB, 8 * kGiB})
          rows.push_back({system, topo, ranks, kind, any, size, kNone, "-"});
  return rows;
}

double busFactor(Collective kind, double n) {
  switch (kind) {
  case Collective::AllReduce:
    return 2 * (n - 1) / n;
  case Collective::AllGather:
  case Collective::ReduceScatter:
    return (n - 1) / n;
  default:
    return 1;
  }
}

int publishedTable(const std::string &out) {
  Table t({"system", "collective", "ranks", "size", "algorithm",
           "predicted busbw GB/s", "published GB/s", "error", "source"},
          {false, false, true, true, false, true, true, true, false});
  Json rows = Json::array();
  std::map<std::string, std::pair<Topology, std::unique_ptr<CollectiveModel>>>
      models;
  double worst = 0;
  for (const Row &r : publishedRows()) {
    auto it = models.find(r.topology);
    if (it == models.end()) {
      std::string path = std::string(SOAP_SOURCE_DIR) +
                         "/examples/topologies/" + r.topology + ".json";
      auto topo = loadTopology(path);
      if (!topo)
        return reportError(topo.takeError(), "bench-collectives");
      it = models.emplace(r.topology, std::pair{std::move(*topo), nullptr})
               .first;
      it->second.second =
          std::make_unique<CollectiveModel>(it->second.first);
    }
    const CollectiveModel &model = *it->second.second;
    std::vector<DeviceId> group;
    if (r.kind == Collective::SendRecv)
      group = {0, r.ranks - 1}; // a pair: 0 -> 1 in a node, 0 -> 8 across
    else
      for (DeviceId d = 0; d < r.ranks; ++d)
        group.push_back(d);
    CollectiveEstimate e;
    if (r.algorithm == CollectiveAlgorithm::Local) {
      e = model.estimate(r.kind, group, r.size);
    } else {
      e.algorithm = r.algorithm;
      e.time = *model.algorithmTime(r.algorithm, r.kind, group, r.size);
    }
    double n = r.kind == Collective::SendRecv ? 2 : double(group.size());
    double busbw = double(r.size) / e.time * busFactor(r.kind, n) / 1e9;
    bool published = !std::isnan(r.publishedGBps);
    double err = published ? busbw / r.publishedGBps - 1 : 0;
    if (published)
      worst = std::max(worst, std::abs(err));
    uint32_t ranks = r.kind == Collective::SendRecv ? 2 : r.ranks;
    t.addRow({r.system, collectiveName(r.kind).str(), std::to_string(ranks),
              sizeName(r.size), algorithmName(e.algorithm).str(),
              fmt::format("{:.1f}", busbw),
              published ? fmt::format("{:.1f}", r.publishedGBps) : "n/p",
              published ? fmt::format("{:+.1f}%", err * 100) : "",
              r.source});
    Json row = {{"system", r.system},
                {"topology", r.topology},
                {"collective", collectiveName(r.kind).str()},
                {"ranks", ranks},
                {"bytes", r.size},
                {"algorithm", algorithmName(e.algorithm).str()},
                {"seconds", e.time},
                {"predicted_busbw_GBps", busbw},
                {"source", r.source}};
    if (published) {
      row["published_busbw_GBps"] = r.publishedGBps;
      row["error"] = err;
    }
    rows.push_back(row);
  }
  t.print(llvm::outs());
  llvm::outs() << fmt::format("largest |error| over published figures: "
                              "{:.1f}%\nsources:\n",
                              worst * 100);
  Json sources = Json::object();
  for (const Source &s : kSources) {
    llvm::outs() << "  " << s.tag << ": " << s.where << "\n";
    sources[s.tag] = s.where;
  }
  Json doc = {{"bench", "collectives-published"},
              {"model", "NCCL-calibrated collective model (lib/Machine, "
                        "topology `nccl` objects)"},
              {"busbw", "nccl-tests doc/PERFORMANCE.md: all-reduce S/t * "
                        "2(n-1)/n; all-gather, reduce-scatter S/t * (n-1)/n; "
                        "send/recv S/t"},
              {"sources", sources},
              {"results", rows}};
  llvm::sys::fs::create_directories(llvm::sys::path::parent_path(out));
  if (auto err = writeFileAtomic(out, dumpJson(doc)))
    return reportError(std::move(err), "bench-collectives");
  llvm::outs() << "wrote " << out << "\n";
  return 0;
}

} // namespace

int main(int argc, char **argv) {
  std::string out = "bench/results/collectives.json";
  std::string publishedOut = "bench/results/collectives-published.json";
  for (int i = 1; i < argc; ++i)
    if (!std::strcmp(argv[i], "--out") && i + 1 < argc)
      out = argv[++i];
    else if (!std::strcmp(argv[i], "--published-out") && i + 1 < argc)
      publishedOut = argv[++i];
    else
      benchUsage("bench-collectives [--out FILE] [--published-out FILE]",
                 argv[i]);
  const Case cases[] = {{"dgx-h100-1", h100Published},
                        {"v100-2x8", notPublished}};
  Table t({"topology", "gpus", "size", "algorithm", "time us", "algbw GB/s",
           "busbw GB/s", "published busbw GB/s"},
          {false, true, true, false, true, true, true, false});
  Json rows = Json::array();
  for (const Case &c : cases) {
    std::string path = std::string(SOAP_SOURCE_DIR) + "/examples/topologies/" +
                       c.topology + ".json";
    auto topo = loadTopology(path);
    if (!topo)
      return reportError(topo.takeError(), "bench-collectives");
    CollectiveModel model(*topo);
    std::vector<DeviceId> group;
    for (DeviceId d = 0; d < topo->numDevices(); ++d)
      group.push_back(d);
    double n = double(group.size());
    for (Bytes size = 1024; size <= (Bytes(4) << 30); size *= 4) {
      CollectiveEstimate e = model.estimate(Collective::AllReduce, group, size);
      double algbw = double(size) / e.time;
      double busbw = algbw * 2 * (n - 1) / n;
      t.addRow({c.topology, std::to_string(group.size()), sizeName(size),
                algorithmName(e.algorithm).str(),
                fmt::format("{:.1f}", e.time * 1e6),
                fmt::format("{:.2f}", algbw / 1e9),
                fmt::format("{:.2f}", busbw / 1e9), c.published(size)});
      rows.push_back({{"topology", c.topology},
                      {"gpus", group.size()},
                      {"collective", "all-reduce"},
                      {"bytes", size},
                      {"algorithm", algorithmName(e.algorithm).str()},
                      {"seconds", e.time},
                      {"algbw_bytes_per_sec", algbw},
                      {"busbw_bytes_per_sec", busbw},
                      {"published_busbw_GBps", c.published(size)}});
    }
  }
  t.print(llvm::outs());
  Json doc = {{"bench", "collectives"},
              {"model", "ring/tree/hierarchical alpha-beta (lib/Machine)"},
              {"results", rows}};
  llvm::sys::fs::create_directories(llvm::sys::path::parent_path(out));
  if (auto err = writeFileAtomic(out, dumpJson(doc)))
    return reportError(std::move(err), "bench-collectives");
  llvm::outs() << "wrote " << out << "\n\n";
  return publishedTable(publishedOut);
}
