// Cost databases as soap-profile writes them: measured device figures that
// calibrate the roofline (read from a hand-written profile), deterministic
// output whatever the order entries were added in, and merging of the
// recorded environment.
#include "../IR/TestGraphs.h"
#include "../TestInputs.h"

#include "soap/Cost/CostModel.h"
#include "soap/Cost/OpSignature.h"
#include <catch2/catch.hpp>

using namespace soap;
using namespace soap::test;

namespace {

/// x[64,512] -> MatMul with w[512,256] -> Relu.
Graph matmulRelu() {
  GraphBuilder b;
  auto x = b.input({64, 512});
  auto y = b.op("MatMul", {x, b.weight({512, 256})}, {{64, 256}});
  b.op("Relu", {y[0]}, {{64, 256}});
  requireOk(b.g.computeSemantics());
  return std::move(b.g);
}

/// A profile as a person would write it: only the calibration section.
const char *kCalibrated = R"({
  "format": "soapc-profile",
  "version": 1,
  "device": {"name": "H100-SXM", "gpu_name": "NVIDIA H100 80GB HBM3",
             "driver": "580.159.04", "cuda": "13.0", "cudnn": "9.19.0",
             "cublas": "13.0.0", "math": "fp32"},
  "calibration": {
    "memory_bandwidth_bytes_per_sec": 3.0e12,
    "gemm_flops_per_sec": {"f32": 5.0e13}
  }
})";

} // namespace

TEST_CASE("measured bandwidth and GEMM rate calibrate the roofline",
          "[Cost][profile]") {
  auto db = CostDatabase::fromJson(Json::parse(kCalibrated),
                                   JsonReader("h100.json"));
  REQUIRE(static_cast<bool>(db));
  CHECK(db->env.math == "fp32");
  CHECK(db->env.cudnn == "9.19.0");
  Graph g = matmulRelu();
  const DeviceSpec &d = catalogDevice("H100-SXM");
  CostModel cm(d, &*db, CostMode::Profile);
  CHECK(cm.peakFlops(DType::F32) == 5.0e13);
  CHECK(cm.memoryBandwidth() == 3.0e12);
  // Achieved rates are sustained: a GEMM runs at the measured rate, memory
  // at the measured bandwidth; other kinds keep their ratio to a GEMM.
  CHECK(cm.computeEfficiency("MatMul") == Approx(1.0));
  CHECK(cm.computeEfficiency("Conv") == Approx(0.6 / 0.7));
  CHECK(cm.memoryEfficiency() == Approx(1.0));
  CHECK(cm.computeEfficiencySource("MatMul") ==
        "built-in default, relative to the measured GEMM rate");
  // No f16 rate was measured: f16 keeps the catalog and the built-ins.
  CHECK(cm.computeEfficiency("MatMul", DType::F16) == Approx(0.7));
  CHECK(cm.computeEfficiencySource("MatMul", DType::F16) ==
        "built-in default");

  std::vector<DType> in(2, DType::F32), out(1, DType::F32);
  const Op &mm = g.op(0);
  Box full = mm.sem.fullTile();
  double flops = mm.sem.tileFlops(Pass::Forward, full);
  double bytes = double(mm.sem.tileBytes(Pass::Forward, full, in, out));
  KernelTimes k = cm.analytic(g, mm, full);
  CHECK(k.forward ==
        Approx(std::max(flops / 5.0e13, bytes / 3.0e12) + d.launchOverhead));
  const Op &relu = g.op(1);
  std::vector<DType> in1(1, DType::F32);
  double rbytes = double(
      relu.sem.tileBytes(Pass::Forward, relu.sem.fullTile(), in1, out));
  CHECK(cm.analytic(g, relu, relu.sem.fullTile()).forward ==
        Approx(rbytes / 3.0e12 + d.launchOverhead));

  // Without the profile the same op costs the datasheet roofline.
  CostModel plain(d, nullptr, CostMode::Analytic);
  CHECK(plain.analytic(g, relu, relu.sem.fullTile()).forward ==
        Approx(rbytes / (d.memoryBandwidthBytesPerSec * 0.7) +
               d.launchOverhead));
}

TEST_CASE("a written profile does not depend on the order of measurement",
          "[Cost][profile]") {
  Graph g = matmulRelu();
  std::vector<std::pair<std::string, KernelEntry>> entries;
  for (const Op &op : g.ops()) {
    Box t = op.sem.fullTile();
    for (int half = 0; half < 2; ++half) {
      Box tile = t;
      tile.hi[0] = half ? t.hi[0] : t.hi[0] / 2;
      KernelEntry e;
      e.forward = 1e-5 * (op.id + 1) * (half + 1);
      e.backwardData = 2e-5;
      e.repeats = 25;
      entries.push_back({opSignature(g, op, tile), e});
    }
  }
  CostDatabase a, b;
  a.env.device = b.env.device = "H100-SXM";
  a.gemmFlopsPerSec["f32"] = b.gemmFlopsPerSec["f32"] = 5e13;
  for (const auto &[sig, e] : entries)
    a.add(sig, e);
  for (auto it = entries.rbegin(); it != entries.rend(); ++it)
    b.add(it->first, it->second);
  std::string text = dumpJson(a.toJson());
  CHECK(text == dumpJson(b.toJson()));
  // Kernels come out ordered by signature.
  Json doc = Json::parse(text);
  std::vector<std::string> sigs;
  for (const Json &k : doc["kernels"])
    sigs.push_back(k["signature"].get<std::string>());
  CHECK(sigs.size() == entries.size());
  CHECK(std::is_sorted(sigs.begin(), sigs.end()));
}

TEST_CASE("merging keeps the newer environment and refuses mixed math",
          "[Cost][profile]") {
  CostDatabase old, fresh;
  old.env.device = fresh.env.device = "H100-SXM";
  old.env.cuda = "12.4";
  old.env.math = "fp32";
  old.memoryBandwidthBytesPerSec = 2.9e12;
  KernelEntry e;
  e.forward = 1e-3;
  old.add("Relu|f32|in=8|out=8", e);
  fresh.env.cuda = "13.0";
  fresh.env.cudnn = "9.19.0";
  fresh.env.math = "fp32";
  fresh.memoryBandwidthBytesPerSec = 3.0e12;
  requireOk(old.merge(fresh));
  CHECK(old.env.cuda == "13.0");
  CHECK(old.env.cudnn == "9.19.0");
  CHECK(old.memoryBandwidthBytesPerSec == 3.0e12);
  CHECK(old.size() == 1);

  CostDatabase tf32;
  tf32.env.device = "H100-SXM";
  tf32.env.math = "tf32";
  llvm::Error err = old.merge(tf32);
  REQUIRE(static_cast<bool>(err));
  CHECK(errorMessage(std::move(err)) ==
        "cannot merge a profile measured with tf32 arithmetic into one "
        "measured with fp32");
}
