// Fuzz target: the plan reader on a JSON document; a plan it accepts must
// survive a round trip through its JSON form, and is then turned into a
// strategy for the model and topology of the committed example plans
// (chosen by the model file name the plan records; lenet otherwise), where
// every mismatch must be a bad-input error.
#include "FuzzCheck.h"
#include "FuzzJson.h"
#include "soap/Import/OnnxImporter.h"
#include "soap/Machine/TopologyLoader.h"
#include "soap/Plan/Plan.h"
#include "llvm/Support/Path.h"
#include <map>
#include <memory>

namespace {

struct Target {
  std::unique_ptr<soap::Graph> graph;
  soap::Topology topo;
};

/// The (model, topology, batch) of each plan in examples/plans/.
const std::map<std::string, Target> &targets() {
  static const std::map<std::string, Target> all = [] {
    std::map<std::string, Target> m;
    struct {
      const char *model, *topology;
      int64_t batch;
    } examples[] = {{"lenet", "p100-4x4", 1024},
                    {"alexnet", "dgx-h100-1", 512},
                    {"rnntc", "v100-2x8", 1024}};
    for (const auto &e : examples) {
      std::string dir = SOAP_SOURCE_DIR "/examples/";
      soap::ImportOptions opts;
      opts.batch = e.batch;
      auto g = soap::importOnnx(dir + "models/" + e.model + ".onnx", opts);
      auto t = soap::loadTopology(dir + "topologies/" + e.topology + ".json");
      if (!g || !t)
        soap::fuzz::fail("cannot load the example model or topology",
                         llvm::toString(llvm::joinErrors(
                             g ? llvm::Error::success() : g.takeError(),
                             t ? llvm::Error::success() : t.takeError())));
      m.emplace(std::string(e.model) + ".onnx",
                Target{std::move(*g), std::move(*t)});
    }
    return m;
  }();
  return all;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const auto &all = targets();
  auto doc = soap::fuzz::document(data, size);
  if (!doc)
    return 0;
  auto plan = soap::planFromJson(*doc, soap::fuzz::inputName());
  if (!soap::fuzz::accepted(plan))
    return 0;
  auto again = soap::planFromJson(soap::planToJson(*plan), "round trip");
  if (!again)
    soap::fuzz::fail("a written plan does not read again",
                     llvm::toString(again.takeError()));
  if (!(*again == *plan))
    soap::fuzz::fail("a written plan reads as another one",
                     soap::dumpJson(soap::planToJson(*plan)));
  auto it = all.find(
      llvm::sys::path::filename(plan->inputs.modelPath).str());
  const Target &t = it != all.end() ? it->second : all.at("lenet.onnx");
  auto s = soap::planStrategy(*plan, *t.graph, t.topo,
                              soap::fuzz::inputName());
  (void)soap::fuzz::accepted(s);
  return 0;
}
