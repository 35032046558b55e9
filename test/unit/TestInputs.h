// The zoo models and example topologies, loaded for unit tests.
#ifndef SOAP_TEST_TESTINPUTS_H
#define SOAP_TEST_TESTINPUTS_H

#include "soap/Import/OnnxImporter.h"
#include "soap/Machine/DeviceCatalog.h"
#include "soap/Machine/TopologyLoader.h"
#include "soap/Support/Error.h"
#include <catch2/catch.hpp>
#include <memory>
#include <string>

namespace soap::test {

/// examples/models/<name>.onnx at `batch`, with the appended loss.
inline std::unique_ptr<Graph> zooModel(const std::string &name,
                                       int64_t batch = 64) {
  ImportOptions opts;
  opts.batch = batch;
  auto g = importOnnx(std::string(SOAP_SOURCE_DIR) + "/examples/models/" +
                          name + ".onnx",
                      opts);
  if (!g)
    FAIL(errorMessage(g.takeError()));
  return std::move(*g);
}

/// examples/topologies/<name>.json.
inline Topology exampleTopology(const std::string &name) {
  auto t = loadTopology(std::string(SOAP_SOURCE_DIR) +
                        "/examples/topologies/" + name + ".json");
  if (!t)
    FAIL(errorMessage(t.takeError()));
  return std::move(*t);
}

/// A device of the catalog (lib/Machine/DeviceCatalog.cpp) by name.
inline const DeviceSpec &catalogDevice(const std::string &name) {
  const DeviceSpec *d = findDevice(name);
  REQUIRE(d);
  return *d;
}

} // namespace soap::test

#endif // SOAP_TEST_TESTINPUTS_H
