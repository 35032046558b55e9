// bench-import: time to import each zoo model (ONNX load, shape inference,
// folding, IR build, semantics), the median of repeated runs. Target from
// resnet101 in < 0.5 s on a 2-core machine.
//   build/bin/bench-import [--repeat N] [--out bench/results/import.json]
#include "soap/Import/OnnxImporter.h"
#include "soap/Support/Error.h"
#include "soap/Support/Format.h"
#include "soap/Support/Json.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include <algorithm>
#include <chrono>
#include <cstring>
#include "BenchArgs.h"
#include <fmt/format.h>
#include <string>
#include <vector>

using namespace soap;

int main(int argc, char **argv) {
  int repeat = 5;
  std::string out = "bench/results/import.json";
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--repeat") && i + 1 < argc)
      repeat = std::max(1, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--out") && i + 1 < argc)
      out = argv[++i];
    else
      benchUsage("bench-import [--repeat N] [--out FILE]", argv[i]);
  }
  const char *models[] = {"lenet",       "alexnet",   "vgg16",
                          "resnet101",   "inception_v3", "wide_resnet101_2",
                          "mlp",         "rnntc",     "rnnlm",
                          "nmt",         "transformer", "gpt2"};
  Table t({"model", "ops", "parameters", "median s", "min s"},
          {false, true, true, true, true});
  Json rows = Json::array();
  for (const char *m : models) {
    std::string path = std::string(SOAP_SOURCE_DIR) + "/examples/models/" +
                       m + ".onnx";
    std::vector<double> secs;
    size_t ops = 0;
    int64_t params = 0;
    bool failed = false;
    for (int r = 0; r < repeat && !failed; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      ImportOptions opts;
      auto g = importOnnx(path, opts);
      auto t1 = std::chrono::steady_clock::now();
      if (!g) {
        fmt::print(stderr, "{}: {}\n", m, errorMessage(g.takeError()));
        failed = true;
        break;
      }
      secs.push_back(std::chrono::duration<double>(t1 - t0).count());
      ops = (*g)->numOps();
      params = (*g)->parameterCount();
    }
    if (failed)
      continue;
    std::sort(secs.begin(), secs.end());
    double median = secs[secs.size() / 2];
    t.addRow({m, std::to_string(ops), withCommas(params),
              fmt::format("{:.3f}", median), fmt::format("{:.3f}", secs[0])});
    rows.push_back({{"model", m},
                    {"ops", ops},
                    {"parameters", params},
                    {"median_seconds", median},
                    {"min_seconds", secs[0]},
                    {"repeats", repeat}});
  }
  t.print(llvm::outs());
  Json doc = {{"bench", "import"}, {"batch", ImportOptions().batch},
              {"results", rows}};
  llvm::sys::fs::create_directories(llvm::sys::path::parent_path(out));
  if (auto err = writeFileAtomic(out, dumpJson(doc)))
    return reportError(std::move(err), "bench-import");
  llvm::outs() << "wrote " << out << "\n";
  return 0;
}
