// bench-search: mcmc on FlexFlow's six DNNs on its K80 cluster at 4-64
// devices (k80-16x4 cut to D/4 nodes), beside FlexFlow Table 5's
// end-to-end search times with delta simulation (seconds). Prints the
// search time, proposals, and the simulated speedup of the plan found over
// data parallelism (FlexFlow reports 1.3-3.3x real speedups for five of the
// six; ResNet-101 ~1x). Targets: converge in <= 1/100 of Table 5's
// times. Each search runs twice, with and without early rejection (the
// acceptance threshold drawn before the delta simulation, which stops once
// the makespan is certain to pass it): the same chain, so the same plan,
// and the time it saves. Asserts nothing.
//   build/bin/bench-search [--max-devices 64] [--budget 20000|60s]
//                          [--models alexnet,nmt] [--out FILE]
#include "soap/Import/OnnxImporter.h"
#include "soap/Machine/TopologyLoader.h"
#include "soap/Search/Driver.h"
#include "soap/Support/Error.h"
#include "soap/Support/Format.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include <cstring>
#include "BenchArgs.h"
#include <fmt/format.h>

using namespace soap;

// FlexFlow Table 5, delta simulation column (seconds), by devices 4..64.
static const double kTable5[6][5] = {{0.04, 0.13, 0.48, 1.8, 5.9}, // AlexNet
                                     {0.4, 1.4, 7.3, 33, 158},     // ResNet-101
                                     {4.1, 17, 77, 298, 1278},  // Inception-v3
                                     {7.5, 39, 170, 516, 1489}, // RNNTC
                                     {9.2, 31, 121, 342, 969},  // RNNLM
                                     {16, 65, 328, 701, 2190}}; // NMT

int main(int argc, char **argv) {
  int maxDevices = 64;
  std::string budget = "20000", out = "bench/results/search.json";
  std::string only;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--max-devices") && i + 1 < argc)
      maxDevices = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--budget") && i + 1 < argc)
      budget = argv[++i];
    else if (!std::strcmp(argv[i], "--out") && i + 1 < argc)
      out = argv[++i];
    else if (!std::strcmp(argv[i], "--models") && i + 1 < argc)
      only = "," + std::string(argv[++i]) + ",";
    else
      benchUsage("bench-search [--max-devices 64] [--budget 20000|60s] [--models a,b] [--out FILE]", argv[i]);
  }
  auto b = Budget::parse(budget);
  if (!b)
    return reportError(b.takeError(), "bench-search");
  auto base = readJsonFile(std::string(SOAP_SOURCE_DIR) +
                           "/examples/topologies/k80-16x4.json");
  if (!base)
    return reportError(base.takeError(), "bench-search");
  const char *models[] = {"alexnet", "resnet101", "inception_v3",
                          "rnntc",   "rnnlm",     "nmt"};
  Table t({"model", "devices", "search s", "Table 5 s", "ours / Table 5",
           "proposals", "rejected early", "no early rej. s", "saved",
           "same plan", "mcmc ms", "data ms", "speedup"},
          {false, true, true, true, true, true, true, true, true, false, true,
           true, true});
  Json rows = Json::array();
  for (int m = 0; m < 6; ++m) {
    if (!only.empty() &&
        only.find("," + std::string(models[m]) + ",") == std::string::npos)
      continue;
    for (int di = 0, devices = 4; devices <= maxDevices; ++di, devices *= 2) {
      Json doc = *base;
      doc["nodes"] = devices / 4;
      doc["name"] = fmt::format("k80-{}x4", devices / 4);
      auto topo = parseTopology(doc, "k80 cluster");
      if (!topo)
        return reportError(topo.takeError(), "bench-search");
      ImportOptions opts;
      opts.batch = 64 * devices;
      auto g = importOnnx(std::string(SOAP_SOURCE_DIR) + "/examples/models/" +
                              models[m] + ".onnx",
                          opts);
      if (!g)
        return reportError(g.takeError(), "bench-search");
      CostModel cost(topo->deviceSpec(), nullptr, CostMode::Analytic);
      CollectiveModel coll(*topo);
      SearchProblem p{**g, *topo, cost, coll};
      SearchOptions o;
      o.budget = *b;
      auto r = runSearch(p, "mcmc", o);
      if (!r)
        return reportError(r.takeError(), "bench-search");
      o.earlyRejection = false;
      auto full = runSearch(p, "mcmc", o);
      if (!full)
        return reportError(full.takeError(), "bench-search");
      bool same = full->result.strategy == r->result.strategy &&
                  full->result.proposals == r->result.proposals;
      double rejected = r->result.proposals ? double(r->result.rejectedEarly) /
                                                  double(r->result.proposals)
                                            : 0;
      double ref = kTable5[m][di];
      t.addRow(
          {models[m], std::to_string(devices),
           fmt::format("{:.2f}", r->searchSeconds), fmt::format("{:g}", ref),
           fmt::format("{:.2f}", r->searchSeconds / ref),
           withCommas(int64_t(r->result.proposals)),
           fmt::format("{:.0f}%", 100 * rejected),
           fmt::format("{:.2f}", full->searchSeconds),
           fmt::format("{:.1f}x", full->searchSeconds / r->searchSeconds),
           same ? "yes" : "NO",
           fmt::format("{:.2f}", r->metrics.iterationTime * 1e3),
           fmt::format("{:.2f}", r->dataParallelTime * 1e3),
           r->speedup() > 0 ? fmt::format("{:.2f}x", r->speedup()) : "n/a"});
      rows.push_back(
          {{"model", models[m]},
           {"devices", devices},
           {"search_seconds", r->searchSeconds},
           {"flexflow_table5_seconds", ref},
           {"proposals", r->result.proposals},
           {"rejected_early", r->result.rejectedEarly},
           {"search_seconds_without_early_rejection", full->searchSeconds},
           {"same_plan", same},
           {"iteration_s", r->metrics.iterationTime},
           {"data_parallel_s", r->dataParallelTime},
           {"speedup", r->speedup()}});
      llvm::errs() << models[m] << " " << devices << " done\n";
    }
  }
  t.print(llvm::outs());
  Json doc = {{"bench", "search"}, {"budget", budget}, {"results", rows}};
  llvm::sys::fs::create_directories(llvm::sys::path::parent_path(out));
  if (auto err = writeFileAtomic(out, dumpJson(doc)))
    return reportError(std::move(err), "bench-search");
  llvm::outs() << "wrote " << out << "\n";
  return 0;
}
