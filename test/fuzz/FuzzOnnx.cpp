// Fuzz target: the ONNX importer on the bytes of a model file, then the IR
// verifier on every graph it accepts (an accepted graph must verify).
#include "FuzzCheck.h"
#include "soap/Import/OnnxImporter.h"
#include "spdlog/spdlog.h"
#include <cstddef>
#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static bool quiet = (spdlog::set_level(spdlog::level::off), true);
  (void)quiet;
  soap::ImportOptions opts;
  opts.batch = 2;
  llvm::StringRef bytes(reinterpret_cast<const char *>(data), size);
  auto g = soap::importOnnxBuffer(bytes, soap::fuzz::inputName(), opts);
  if (!soap::fuzz::accepted(g))
    return 0;
  if (llvm::Error err = (*g)->verify())
    soap::fuzz::fail("the importer returned a graph that does not verify",
                     llvm::toString(std::move(err)));
  return 0;
}
