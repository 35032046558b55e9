// bench-collectives: predicted all-reduce bus bandwidth of the collective
// model (lib/Machine/Collectives.cpp) on 8 x H100 on NVSwitch (dgx-h100-1)
// and 2 x 8 V100 (v100-2x8), 1 KiB to 4 GiB, beside published nccl-tests
// figures where there are any. Asserts nothing: a benchmark, not a test.
//   build/bin/bench-collectives [--out bench/results/collectives.json]
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
#include "BenchArgs.h"
#include <fmt/format.h>
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

} // namespace

int main(int argc, char **argv) {
  std::string out = "bench/results/collectives.json";
  for (int i = 1; i < argc; ++i)
    if (!std::strcmp(argv[i], "--out") && i + 1 < argc)
      out = argv[++i];
    else
      benchUsage("bench-collectives [--out FILE]", argv[i]);
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
  llvm::outs() << "wrote " << out << "\n";
  return 0;
}
