// What a plan is, in the words its users know: "data x16, 4 micro-batches,
// ZeRO-1", "tensor 4 x pipeline 8 (1F1B, 64 micro-batches of 1) x data 4",
// or, for a SOAP plan no such name fits, its most common per-op splits; and
// the devices it leaves idle.
#ifndef SOAP_DRIVER_LAYOUT_H
#define SOAP_DRIVER_LAYOUT_H

#include "soap/IR/Graph.h"
#include "soap/Parallel/Strategy.h"
#include <cstdint>
#include <string>
#include <vector>

namespace soap {

struct Layout {
  /// One line, e.g. "data ×16, 4 micro-batches, ZeRO-1".
  std::string text;
  /// Devices on which no op runs, ascending.
  std::vector<DeviceId> idle;
  /// Why they are idle, when the layout tells (empty otherwise).
  std::string idleWhy;
};

/// The layout of `s` on `numDevices` devices at `batch` samples.
Layout describeLayout(const Graph &g, const Strategy &s, size_t numDevices,
                      int64_t batch);

/// "devices 10-15" or "devices 3, 7" (ranges of consecutive ids).
std::string deviceRanges(const std::vector<DeviceId> &ids);

/// The warning for idle devices ("6 of 16 devices are idle (devices 10-15):
/// ..."), empty when every device works.
std::string idleWarning(const Layout &l, size_t numDevices);

} // namespace soap

#endif // SOAP_DRIVER_LAYOUT_H
