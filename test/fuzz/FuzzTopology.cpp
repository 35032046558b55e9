// Fuzz target: the topology loader (schemas/topology.schema.json) on a JSON
// document, then the routes of the topology it accepts.
#include "FuzzCheck.h"
#include "FuzzJson.h"
#include "soap/Machine/TopologyLoader.h"
#include <cmath>

namespace {

/// Loading builds a route for every ordered pair of devices: 4,096 devices
/// (the limit, tested by test/cli/limits) take seconds, which would slow the
/// fuzzer to a crawl. Documents that declare more than 256 devices are
/// skipped; the loader's checks before the device count are the same for
/// them.
bool tooLarge(const soap::Json &doc) {
  if (!doc.is_object() || !doc.contains("nodes") || !doc.contains("node"))
    return false;
  const soap::Json &n = doc["nodes"], &node = doc["node"];
  if (!n.is_number_integer() || !node.is_object() || !node.contains("gpus") ||
      !node["gpus"].is_number_integer())
    return false;
  int64_t nodes = n.get<int64_t>(), gpus = node["gpus"].get<int64_t>();
  return nodes > 0 && gpus > 0 && (nodes > 256 || gpus > 256 / nodes);
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  auto doc = soap::fuzz::document(data, size);
  if (!doc || tooLarge(*doc))
    return 0;
  auto topo = soap::parseTopology(*doc, soap::fuzz::inputName());
  if (!soap::fuzz::accepted(topo))
    return 0;
  // Every pair of devices has a route with a positive, finite bandwidth.
  auto n = static_cast<soap::DeviceId>(topo->numDevices());
  for (soap::DeviceId a = 0; a < n; ++a)
    for (soap::DeviceId b = 0; b < n; ++b)
      if (a != b && (topo->route(a, b).empty() ||
                     !(topo->pathBandwidth(a, b) > 0) ||
                     !std::isfinite(topo->pathBandwidth(a, b))))
        soap::fuzz::fail("an accepted topology has no bandwidth between two "
                         "devices",
                         std::to_string(a) + " -> " + std::to_string(b));
  return 0;
}
