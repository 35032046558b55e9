// --precision fp8: which GEMMs run in FP8, their time at the FP8 rate with
// Transformer Engine's scaling work, and the memory of the FP8 weight copy
// and of FP8-saved activations, checked by hand on a small graph.
#include "../IR/TestGraphs.h"
#include "../TestInputs.h"

#include "soap/Cost/CostModel.h"
#include "soap/Cost/OpSignature.h"
#include <catch2/catch.hpp>

using namespace soap;
using namespace soap::test;

namespace {

constexpr int64_t kRows = 8192, kHidden = 4096, kOut = 512;

/// x[8192,4096] -> MatMul W1 -> Relu -> MatMul W2 -> Add x -> MatMul W3,
/// the last one's output the graph's (the logits).
Graph threeGemms(Precision p) {
  GraphBuilder b;
  auto x = b.input({kRows, kHidden});
  auto y1 =
      b.op("MatMul", {x, b.weight({kHidden, kHidden})}, {{kRows, kHidden}});
  auto r = b.op("Relu", {y1[0]}, {{kRows, kHidden}});
  auto y2 =
      b.op("MatMul", {r[0], b.weight({kHidden, kHidden})}, {{kRows, kHidden}});
  auto s = b.op("Add", {y2[0], x}, {{kRows, kHidden}});
  auto logits =
      b.op("MatMul", {s[0], b.weight({kHidden, kOut})}, {{kRows, kOut}});
  b.g.outputs.push_back(logits[0]);
  requireOk(b.g.computeSemantics());
  requireOk(b.g.setPrecision(p));
  return std::move(b.g);
}

} // namespace

TEST_CASE("fp8 marks the linear GEMMs but the logits' one", "[Cost][fp8]") {
  Graph g = threeGemms(Precision::FP8);
  CHECK(g.precision() == Precision::FP8);
  CHECK(precisionName(g.precision()) == "fp8");
  CHECK(parsePrecision("fp8") == Precision::FP8);
  CHECK(g.op(0).fp8);
  CHECK_FALSE(g.op(1).fp8); // Relu
  CHECK(g.op(2).fp8);
  CHECK_FALSE(g.op(3).fp8); // Add
  CHECK_FALSE(g.op(4).fp8); // the logits: Megatron-Core's LM head, bf16
  CHECK(g.value(g.op(0).inputs[1]).fp8Copy);
  CHECK_FALSE(g.value(g.op(4).inputs[1]).fp8Copy);
  // Activations stay bf16 between ops.
  CHECK(g.value(g.op(0).outputs[0]).dtype == DType::BF16);
  Graph b = threeGemms(Precision::BF16);
  CHECK(b.precision() == Precision::BF16);
  CHECK_FALSE(b.op(0).fp8);
}

TEST_CASE("an fp8 GEMM takes its bf16 time over the peak ratio, plus TE's "
          "casts",
          "[Cost][fp8]") {
  const DeviceSpec &h100 = catalogDevice("H100-SXM");
  CostModel cm(h100, nullptr, CostMode::Analytic);
  Graph bf = threeGemms(Precision::BF16), f8 = threeGemms(Precision::FP8);
  // The datasheet's dense peaks: 1,979 FP8 over 989.5 bf16 TFLOP/s.
  CHECK(cm.fp8Speedup() == Approx(2.0));
  Seconds launch = h100.launchOverhead;
  double bw = h100.memoryBandwidthBytesPerSec * 0.7; // built-in fraction
  double n = double(kRows) * double(kHidden);        // x, y1, r, y2
  double history = 1024 * 4 * 2; // one tensor's fp32 amax history, r + w

  // GEMM 1: its input is the graph's (no kernel writes it in FP8): a cast
  // and transpose forward (read 2, write 2 bytes an element); its output
  // feeds the Relu, whose backward writes the E5M2 gradient: no cast. x
  // needs no gradient, so the output gradient's history update goes with
  // backward-weight.
  Box full = f8.op(0).sem.fullTile();
  KernelTimes b1 = cm.analytic(bf, bf.op(0), full);
  KernelTimes f1 = cm.analytic(f8, f8.op(0), full);
  double flops = 2.0 * double(kRows) * double(kHidden) * double(kHidden);
  // Compute-bound in both: the GEMM's time halves.
  CHECK(b1.forward == Approx(flops / (989.5e12 * 0.7) + launch));
  CHECK(f1.forward == Approx((b1.forward - launch) / 2 + launch +
                             (4 * n + 2 * history) / bw + launch));
  CHECK(b1.backwardData == 0);
  CHECK(f1.backwardData == 0);
  CHECK(f1.backwardWeight ==
        Approx((b1.backwardWeight - launch) / 2 + launch + history / bw));

  // GEMM 2: the Relu writes its input in FP8 (only the transpose for the
  // weight gradient remains, read 1 and write 1, in backward-weight); its
  // output feeds the residual Add: the gradient is cast with its transpose
  // (read 2, write 2) in backward-data.
  KernelTimes b2 = cm.analytic(bf, bf.op(2), full);
  KernelTimes f2 = cm.analytic(f8, f8.op(2), full);
  CHECK(f2.forward ==
        Approx((b2.forward - launch) / 2 + launch + 2 * history / bw));
  CHECK(f2.backwardData == Approx((b2.backwardData - launch) / 2 + launch +
                                  (4 * n + history) / bw + launch));
  CHECK(f2.backwardWeight == Approx((b2.backwardWeight - launch) / 2 + launch +
                                    2 * n / bw + launch));

  // Everything else is priced as bf16: the Relu, the Add, the logits' GEMM.
  for (OpId o : {1, 3, 4}) {
    Box t = f8.op(o).sem.fullTile();
    KernelTimes b = cm.analytic(bf, bf.op(o), t),
                f = cm.analytic(f8, f8.op(o), t);
    CHECK(f.forward == b.forward);
    CHECK(f.backwardData == b.backwardData);
    CHECK(f.backwardWeight == b.backwardWeight);
  }
  CHECK(cm.fp8Scaling(f8, f8.op(4), f8.op(4).sem.fullTile()).forward == 0);
}

TEST_CASE("fp8 holds an FP8 weight copy and saves GEMM inputs in FP8",
          "[Cost][fp8]") {
  CostModel cm(catalogDevice("H100-SXM"), nullptr, CostMode::Analytic);
  Graph bf = threeGemms(Precision::BF16), f8 = threeGemms(Precision::FP8);
  double w = double(kHidden) * double(kHidden);
  double act = double(kRows) * double(kHidden);
  Box full = f8.op(0).sem.fullTile();
  TileMemory b = cm.memory(bf, bf.op(0), full, Optimizer::Adam);
  TileMemory f = cm.memory(f8, f8.op(0), full, Optimizer::Adam);
  // bf16: 2 weight + 2 gradient + 4 x (1 + 2) master and Adam state.
  CHECK(b.weights == Bytes(2 * w));
  CHECK(f.weights == Bytes(3 * w)); // + the 1-byte FP8 copy
  CHECK(f.gradients == b.gradients);
  CHECK(f.optimizer == Bytes(12 * w));
  CHECK(f.optimizer == b.optimizer);
  // The GEMM saves x for its weight gradient: 2 bytes, 1 in FP8.
  CHECK(b.saved == Bytes(2 * act));
  CHECK(f.saved == Bytes(act));
  // The Relu saves its 1-byte mask either way; the logits' GEMM is bf16.
  for (OpId o : {1, 4}) {
    Box t = f8.op(o).sem.fullTile();
    CHECK(cm.memory(f8, f8.op(o), t, Optimizer::Adam).total() ==
          cm.memory(bf, bf.op(o), t, Optimizer::Adam).total());
  }
  CHECK(totalWeightBytes(f8.value(f8.op(0).inputs[1]), Optimizer::Adam) == 17);
  CHECK(totalWeightBytes(f8.value(f8.op(4).inputs[1]), Optimizer::Adam) == 16);
  // The optimizer step recasts the copy: it reads and writes one byte more.
  CHECK(weightBytes(DType::BF16, Optimizer::Adam, true).update() ==
        weightBytes(DType::BF16, Optimizer::Adam).update() + 2);
}

TEST_CASE("a profiled bf16 GEMM prices its fp8 twin at the ratio of peaks",
          "[Cost][fp8]") {
  const DeviceSpec &h100 = catalogDevice("H100-SXM");
  Graph bf = threeGemms(Precision::BF16), f8 = threeGemms(Precision::FP8);
  const Op &gemm = f8.op(2);
  Box full = gemm.sem.fullTile();
  // The fp8 graph's GEMM has the bf16 one's signature: no FP8 measurement
  // exists, so the bf16 one is looked up.
  std::string sig = opSignature(f8, gemm, full);
  CHECK(sig == opSignature(bf, bf.op(2), full));
  CostDatabase db;
  db.env.device = "H100-SXM";
  KernelEntry e;
  e.forward = 1e-3;
  e.backwardData = 2e-3;
  e.backwardWeight = 2e-3;
  db.add(sig, e);
  CostModel cm(h100, &db, CostMode::Profile);
  auto b = cm.kernel(bf, bf.op(2), full);
  auto f = cm.kernel(f8, gemm, full);
  REQUIRE(static_cast<bool>(b));
  REQUIRE(static_cast<bool>(f));
  KernelTimes cast = cm.fp8Scaling(f8, gemm, full);
  CHECK(cast.forward > 0);
  CHECK(cast.backwardData > 0);
  // The burst measurement at the sustained clock, then at twice the rate.
  CHECK(b->forward == Approx(1e-3 / h100.sustainedTensorRatio));
  CHECK(f->forward == Approx(b->forward / 2 + cast.forward));
  CHECK(f->backwardData == Approx(b->backwardData / 2 + cast.backwardData));
  CHECK(f->backwardWeight ==
        Approx(b->backwardWeight / 2 + cast.backwardWeight));
  CHECK(f->source == CostSource::Profile);
}
