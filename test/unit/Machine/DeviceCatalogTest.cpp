// Machine: the device catalog is complete, sourced, and holds the datasheet
// figures (dense peaks).
#include "soap/Machine/DeviceCatalog.h"
#include <catch2/catch.hpp>

using namespace soap;

TEST_CASE("every catalog entry is complete and sourced", "[Machine]") {
  REQUIRE(deviceCatalog().size() == 8);
  for (const DeviceSpec &d : deviceCatalog()) {
    INFO(d.name.str());
    CHECK(findDevice(d.name) == &d);
    CHECK(d.fp64FlopsPerSec > 0);
    CHECK(d.fp32FlopsPerSec > 0);
    CHECK(d.tf32FlopsPerSec >= d.fp32FlopsPerSec);
    CHECK(d.fp16FlopsPerSec >= d.fp32FlopsPerSec);
    CHECK(d.memoryBandwidthBytesPerSec > 0);
    CHECK(d.memoryBytes > 0);
    CHECK(d.launchOverhead > 0);
    // The GPUs from NVIDIA's datasheets; the CPU core soap-run's ranks use
    // from its ISA and soap-profile --backend cpu's measurement.
    CHECK((d.source.contains("NVIDIA") ||
           (d.name.startswith("XEON") && d.source.contains("soap-profile"))));
    CHECK(!d.launchSource.empty());
  }
  CHECK(findDevice("h100-sxm") == nullptr); // names are exact
  CHECK(knownDeviceNames() == "K80, P100-SXM2, V100-SXM2-16GB, "
                              "A100-SXM4-40GB, A100-SXM4-80GB, H100-SXM, "
                              "H200-SXM, XEON-AVX512-CORE");
}

TEST_CASE("catalog figures match the datasheets", "[Machine]") {
  const DeviceSpec *k80 = findDevice("K80"); // one GK210: half a board
  CHECK(k80->fp32FlopsPerSec == Approx(8.73e12 / 2));
  CHECK(k80->memoryBytes == Bytes(12) << 30);
  CHECK(k80->memoryBandwidthBytesPerSec == Approx(240e9));
  const DeviceSpec *v100 = findDevice("V100-SXM2-16GB");
  CHECK(v100->fp16FlopsPerSec == Approx(125e12));
  CHECK(v100->peakFlopsPerSec(PeakFormat::FP32) == Approx(15.7e12));
  const DeviceSpec *a100 = findDevice("A100-SXM4-80GB");
  CHECK(a100->tf32FlopsPerSec == Approx(156e12)); // dense, not 312 sparse
  CHECK(a100->memoryBandwidthBytesPerSec == Approx(2039e9));
  const DeviceSpec *h100 = findDevice("H100-SXM");
  CHECK(h100->fp16FlopsPerSec == Approx(1979e12 / 2)); // dense
  CHECK(h100->memoryBytes == Bytes(80) << 30);
  const DeviceSpec *h200 = findDevice("H200-SXM");
  CHECK(h200->fp16FlopsPerSec == h100->fp16FlopsPerSec);
  CHECK(h200->memoryBandwidthBytesPerSec == Approx(4.8e12));
  CHECK(h200->memoryBytes == Bytes(141) << 30);
}
