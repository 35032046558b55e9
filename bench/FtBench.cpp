// bench-ft: TensorOpt frontier tracking running time on 16 V100s
// (v100-2x8) at batch 256 for TensorOpt Table 1's WideResNet, RNN and
// Transformer, FT-LDP and FT-Elimination, beside TensorOpt Table 3 (48-core
// CPU). FT time = initialisation (Eq. 1-2) + eliminations + DP + unroll; no
// simulation; the median of --repeat runs (default 5; the first run of a
// process also pays for page faults). Asserts nothing.
//   build/bin/bench-ft [--threads N] [--models a,b] [--no-elimination]
//                      [--repeat N]
//                      [--max-split-loops N] [--no-reuse] [--no-recompute]
//                      [--zero]
//                      [--resolution R]
//                      [--out bench/results/ft.json]
#include "soap/Import/OnnxImporter.h"
#include "soap/Machine/TopologyLoader.h"
#include "soap/Search/FrontierTracking.h"
#include "soap/Support/Error.h"
#include "soap/Support/Format.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/ADT/SmallVector.h"
#include <algorithm>
#include <chrono>
#include <cstring>
#include "BenchArgs.h"
#include <fmt/format.h>

using namespace soap;

namespace {

struct Paper {
  const char *model;  ///< zoo file (examples/models/<model>.onnx)
  const char *label;  ///< TensorOpt's name
  double ldpSeconds;  ///< TensorOpt Table 3, FT-LDP
  double elimSeconds; ///< TensorOpt Table 3, FT-Elimination
};

const Paper kPapers[] = {
    {"wide_resnet_to", "WideResNet", 1292, 19666},
    {"rnn_to", "RNN", 0.28, 1.78},
    {"transformer_to", "Transformer", 201, 3030},
};

double now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

} // namespace

int main(int argc, char **argv) {
  std::string out = "bench/results/ft.json";
  int threads = 2;
  int repeat = 5;
  bool elimination = true;
  std::string only;
  // soapc's defaults (FtOptions::fast); the flags give the exact 2-D one.
  int split = FtOptions::fast().maxSplitLoops;
  bool reuse = true, recompute = true, zero = false;
  double resolution = FtOptions::fast().resolution;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--out") && i + 1 < argc)
      out = argv[++i];
    else if (!std::strcmp(argv[i], "--threads") && i + 1 < argc)
      threads = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--models") && i + 1 < argc)
      only = argv[++i];
    else if (!std::strcmp(argv[i], "--max-split-loops") && i + 1 < argc)
      split = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--resolution") && i + 1 < argc)
      resolution = std::atof(argv[++i]);
    else if (!std::strcmp(argv[i], "--repeat") && i + 1 < argc)
      repeat = std::max(1, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--no-reuse"))
      reuse = false;
    else if (!std::strcmp(argv[i], "--no-recompute"))
      recompute = false;
    else if (!std::strcmp(argv[i], "--zero"))
      zero = true;
    else if (!std::strcmp(argv[i], "--no-elimination"))
      elimination = false;
    else
      benchUsage("bench-ft [--threads 2] [--repeat 5] [--models a,b] [--no-elimination] [--no-reuse] [--no-recompute] [--zero] [--max-split-loops N] [--resolution R] [--out FILE]", argv[i]);
  }
  auto topo = loadTopology(std::string(SOAP_SOURCE_DIR) +
                           "/examples/topologies/v100-2x8.json");
  if (!topo)
    return reportError(topo.takeError(), "bench-ft");
  Table t({"model", "ops", "configs", "variant", "points", "backbone",
           "node/edge/branch/heur", "init s", "FT s", "paper s", "vs paper"},
          {false, true, true, false, true, true, false, true, true, true,
           true});
  Json rows = Json::array();
  for (const Paper &pp : kPapers) {
    if (!only.empty()) {
      llvm::SmallVector<llvm::StringRef, 4> names;
      llvm::StringRef(only).split(names, ',');
      if (std::find(names.begin(), names.end(), pp.model) == names.end())
        continue;
    }
    ImportOptions opts;
    opts.batch = 256;
    auto g = importOnnx(std::string(SOAP_SOURCE_DIR) + "/examples/models/" +
                            pp.model + ".onnx",
                        opts);
    if (!g)
      return reportError(g.takeError(), "bench-ft");
    CostModel cost(topo->deviceSpec(), nullptr, CostMode::Analytic);
    CollectiveModel coll(*topo);
    SearchProblem p{**g, *topo, cost, coll};
    for (bool ldp : {true, false}) {
      if (!ldp && !elimination)
        continue;
      FtOptions o;
      o.threads = threads;
      o.useLdp = ldp;
      o.maxSplitLoops = split;
      o.tensorReuse = reuse;
      o.recompute = recompute;
      o.zero = zero;
      o.resolution = resolution;
      std::vector<double> inits, totals;
      FtResult r;
      for (int rep = 0; rep < repeat; ++rep) {
        double t0 = now();
        auto m = FtModel::build(p, o);
        if (!m)
          return reportError(m.takeError(), "bench-ft");
        double t1 = now();
        r = frontierTracking(*m, o);
        double t2 = now();
        inits.push_back(t1 - t0);
        totals.push_back(t2 - t0);
      }
      auto median = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v[v.size() / 2];
      };
      double init = median(inits), total = median(totals);
      double paper = ldp ? pp.ldpSeconds : pp.elimSeconds;
      const FtStats &s = r.stats;
      t.addRow({pp.label, std::to_string((*g)->numOps()),
                std::to_string(s.totalConfigs),
                ldp ? "FT-LDP" : "FT-Elimination",
                std::to_string(r.points.size()), std::to_string(s.backbone),
                fmt::format("{}/{}/{}/{}", s.nodeEliminations,
                            s.edgeEliminations, s.branchEliminations,
                            s.heuristicEliminations),
                fmt::format("{:.4f}", init), fmt::format("{:.4f}", total),
                fmt::format("{:g}", paper),
                fmt::format("{:.0f}x", paper / total)});
      Json pts = Json::array();
      for (const FtPoint &pt : r.points)
        pts.push_back({{"memory_bytes", pt.costs.memory},
                       {"time_s", pt.costs.time}});
      rows.push_back({{"model", pp.model},
                      {"label", pp.label},
                      {"ops", (*g)->numOps()},
                      {"parameters", (*g)->parameterCount()},
                      {"variant", ldp ? "FT-LDP" : "FT-Elimination"},
                      {"configurations", s.totalConfigs},
                      {"points", r.points.size()},
                      {"backbone", s.backbone},
                      {"eliminations",
                       {{"node", s.nodeEliminations},
                        {"edge", s.edgeEliminations},
                        {"branch", s.branchEliminations},
                        {"heuristic", s.heuristicEliminations}}},
                      {"exact", s.exact()},
                      {"max_frontier", s.maxFrontier},
                      {"init_seconds", init},
                      {"repeats", repeat},
                      {"ft_seconds", total},
                      {"paper_seconds_48_cores", paper},
                      {"speedup_vs_paper", paper / total},
                      {"frontier", pts}});
      llvm::errs() << pp.label << (ldp ? " FT-LDP" : " FT-Elimination")
                   << fmt::format(" {:.2f} s\n", total);
    }
  }
  t.print(llvm::outs());
  Json doc = {{"benchmark", "ft"},
              {"topology", "v100-2x8"},
              {"batch", 256},
              {"threads", threads},
              {"max_split_loops", split},
              {"tensor_reuse", reuse},
              {"recompute", recompute},
              {"zero", zero},
              {"resolution", resolution},
              {"results", rows}};
  if (auto err = writeFileAtomic(out, dumpJson(doc)))
    return reportError(std::move(err), "bench-ft");
  return 0;
}
