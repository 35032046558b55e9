// bench-exec-check: whether soap-run's op support check accepts each model,
// without a plan and without training it (bench/import-coverage.py's last
// column). Imports as soap-run does (loss appended) and runs the same
// checkExecutable; prints one line per model, "ok" or the refusal.
//   build/bin/bench-exec-check model.onnx...
#include "soap/Exec/Executor.h"
#include "soap/Import/OnnxImporter.h"
#include "soap/Support/Error.h"
#include <fmt/format.h>

using namespace soap;

int main(int argc, char **argv) {
  for (int i = 1; i < argc; ++i) {
    ImportOptions opts;
    opts.batch = 2;
    opts.keepConstantData = true; // as soap-run imports
    auto g = importOnnx(argv[i], opts);
    if (!g) {
      fmt::print("{}\timport: {}\n", argv[i], errorMessage(g.takeError()));
      continue;
    }
    if (llvm::Error err = checkExecutable(**g))
      fmt::print("{}\t{}\n", argv[i], errorMessage(std::move(err)));
    else
      fmt::print("{}\tok\n", argv[i]);
  }
  return 0;
}
