// The cost model: signatures, database round trips and merging, the
// roofline's closed form, fitting to measurements, strict mode, memory.
#include "../IR/TestGraphs.h"
#include "../TestInputs.h"

#include "soap/Cost/CostModel.h"
#include "soap/Cost/OpSignature.h"
#include <catch2/catch.hpp>

using namespace soap;
using namespace soap::test;

namespace {

/// x[8,3,16,16] -> Conv 3x3 pad 1 -> Relu.
Graph convRelu() {
  GraphBuilder b;
  auto x = b.input({8, 3, 16, 16});
  auto y = b.op("Conv", {x, b.weight({4, 3, 3, 3})}, {{8, 4, 16, 16}},
                {{"pads", Ints{1, 1, 1, 1}}});
  b.op("Relu", {y[0]}, {{8, 4, 16, 16}});
  requireOk(b.g.computeSemantics());
  return std::move(b.g);
}

Box rows(const OpSemantics &s, int loop, int64_t lo, int64_t hi) {
  Box t = s.fullTile();
  t.lo[loop] = lo;
  t.hi[loop] = hi;
  return t;
}

} // namespace

TEST_CASE("signatures name region shapes and the padding a tile sees",
          "[Cost]") {
  Graph g = convRelu();
  const Op &conv = g.op(0);
  std::string full = opSignature(g, conv, conv.sem.fullTile());
  CHECK(full == "Conv|f32|in=8x3x16x16,4x3x3x3|out=8x4x16x16|"
                "pad=0:0,0:0,1:1,1:1");
  // oh is loop 3: the top half is padded above only, the bottom below only,
  // and the two halves share one shape, so the signatures differ by pad.
  std::string top = opSignature(g, conv, rows(conv.sem, 3, 0, 8));
  std::string bottom = opSignature(g, conv, rows(conv.sem, 3, 8, 16));
  CHECK(top == "Conv|f32|in=8x3x9x16,4x3x3x3|out=8x4x8x16|"
               "pad=0:0,0:0,1:0,1:1");
  CHECK(bottom == "Conv|f32|in=8x3x9x16,4x3x3x3|out=8x4x8x16|"
                  "pad=0:0,0:0,0:1,1:1");
  // An interior tile reads its halo from neighbours: no padding.
  std::string mid = opSignature(g, conv, rows(conv.sem, 3, 4, 12));
  CHECK(mid.find("pad=0:0,0:0,0:0,1:1") != std::string::npos);
  CHECK(opSignature(g, g.op(1), g.op(1).sem.fullTile()) ==
        "Relu|f32|in=8x4x16x16|out=8x4x16x16");
}

TEST_CASE("the roofline has its closed form", "[Cost]") {
  Graph g = convRelu();
  CostModel cm(catalogDevice("H100-SXM"), nullptr, CostMode::Analytic);
  const Op &conv = g.op(0);
  Box full = conv.sem.fullTile();
  KernelTimes k = cm.analytic(g, conv, full);
  double flops = 2.0 * 8 * 4 * 3 * 16 * 16 * 3 * 3;
  std::vector<DType> in(2, DType::F32), out(1, DType::F32);
  double bytes = conv.sem.tileBytes(Pass::Forward, full, in, out);
  double expect =
      std::max(flops / (catalogDevice("H100-SXM").fp32FlopsPerSec * 0.6),
               bytes / (catalogDevice("H100-SXM").memoryBandwidthBytesPerSec *
                        0.7)) +
      catalogDevice("H100-SXM").launchOverhead;
  CHECK(k.forward == Approx(expect));
  CHECK(k.source == CostSource::Analytic);
  // Relu has no weights: no backward-weight kernel.
  CHECK(cm.analytic(g, g.op(1), g.op(1).sem.fullTile()).backwardWeight == 0);
  CHECK(cm.computeEfficiencySource("Conv") == "built-in default");
}

TEST_CASE("the database answers, counts and round-trips", "[Cost]") {
  Graph g = convRelu();
  const Op &conv = g.op(0);
  CostDatabase db;
  db.env.device = "H100-SXM";
  db.env.cuda = "12.4";
  KernelEntry e;
  e.forward = 1e-4;
  e.backwardData = 2e-4;
  e.backwardWeight = 3e-4;
  e.workspace = 4096;
  e.repeats = 20;
  db.add(opSignature(g, conv, conv.sem.fullTile()), e);
  CostModel cm(catalogDevice("H100-SXM"), &db, CostMode::Profile);
  auto k = cm.kernel(g, conv, conv.sem.fullTile());
  REQUIRE(static_cast<bool>(k));
  CHECK(k->source == CostSource::Profile);
  CHECK(k->backwardWeight == 3e-4);
  auto miss = cm.kernel(g, g.op(1), g.op(1).sem.fullTile());
  REQUIRE(static_cast<bool>(miss));
  CHECK(miss->source == CostSource::Analytic);
  CHECK(cm.hits() == 1);
  CHECK(cm.misses() == 1);
  CHECK(cm.memory(g, conv, conv.sem.fullTile(), Optimizer::Sgd).workspace ==
        4096);

  auto back = CostDatabase::fromJson(db.toJson(), JsonReader("p.json"));
  REQUIRE(static_cast<bool>(back));
  CHECK(back->env.cuda == "12.4");
  CHECK(back->size() == 1);
  CHECK(dumpJson(back->toJson()) == dumpJson(db.toJson()));

  CostDatabase other;
  other.env.device = "H100-SXM";
  KernelEntry e2 = e;
  e2.forward = 5e-4;
  other.add(opSignature(g, conv, conv.sem.fullTile()), e2);
  other.add("Relu|f32|in=1|out=1", e);
  requireOk(db.merge(other));
  CHECK(db.size() == 2);
  CHECK(db.find(opSignature(g, conv, conv.sem.fullTile()))->forward == 5e-4);
  CostDatabase v100;
  v100.env.device = "V100-SXM2-16GB";
  llvm::Error err = db.merge(v100);
  REQUIRE(static_cast<bool>(err));
  CHECK(errorMessage(std::move(err)).find("cannot merge") != std::string::npos);
}

TEST_CASE("a pass is priced at the longer of its kernels' and its "
          "enqueueing's time",
          "[Cost]") {
  Graph g = convRelu();
  // As where the convolution's input needs a gradient (below: it does not).
  g.op(0).sem.backwardDataNeeded = true;
  const Op &conv = g.op(0);
  CostDatabase db;
  db.env.device = "H100-SXM";
  KernelEntry e;
  e.forward = 40e-6;       // the GPU is the slower: its time
  e.backwardData = 3e-6;   // the host is: its time
  e.backwardWeight = 5e-6; // no enqueue time recorded: the GPU's
  e.launch[0] = 12e-6;
  e.launch[1] = 9e-6;
  std::string sig = opSignature(g, conv, conv.sem.fullTile());
  db.add(sig, e);
  CostModel cm(catalogDevice("H100-SXM"), &db, CostMode::Profile);
  auto k = cm.kernel(g, conv, conv.sem.fullTile());
  REQUIRE(static_cast<bool>(k));
  CHECK(k->forward == 40e-6);
  CHECK(k->backwardData == 9e-6);
  CHECK(k->backwardWeight == 5e-6);
  // The enqueue times round-trip; the fitted roofline uses kernel times.
  auto back = CostDatabase::fromJson(db.toJson(), JsonReader("p.json"));
  REQUIRE(static_cast<bool>(back));
  CHECK(back->find(sig)->launch[1] == 9e-6);
  CHECK(back->find(sig)->backwardData == 3e-6);
  Json j = db.toJson();
  j["kernels"][0]["launch_s"] = Json::array({1e-6, 2e-6});
  auto bad = CostDatabase::fromJson(j, JsonReader("p.json"));
  REQUIRE(!bad);
  CHECK(errorMessage(bad.takeError()) ==
        "p.json: /kernels/0/launch_s: expected 3 numbers (forward, "
        "backward-data, backward-weight)");
}

TEST_CASE("strict mode refuses to guess and names the signature", "[Cost]") {
  Graph g = convRelu();
  CostDatabase db;
  db.env.device = "H100-SXM";
  CostModel cm(catalogDevice("H100-SXM"), &db, CostMode::Strict);
  auto k = cm.kernel(g, g.op(1), g.op(1).sem.fullTile());
  REQUIRE_FALSE(static_cast<bool>(k));
  CHECK(errorMessage(k.takeError()) ==
        "test.onnx: node 'Relu_1' (Relu): --cost-model strict: the cost "
        "database of 'H100-SXM' has no entry for signature "
        "'Relu|f32|in=8x4x16x16|out=8x4x16x16'");
}

TEST_CASE("the roofline is fitted to measurements of the same kind",
          "[Cost]") {
  // Synthetic measurements of a device reaching 40% of FP32 peak on GEMMs.
  const DeviceSpec &d = catalogDevice("H100-SXM");
  CostDatabase db;
  db.env.device = d.name.str();
  for (int i = 1; i <= 5; ++i) {
    KernelEntry e;
    double flops = 1e11 * i;
    e.flops[0] = flops;
    e.bytes[0] = 1e6;
    e.forward = flops / (0.4 * d.fp32FlopsPerSec) + d.launchOverhead;
    db.add("MatMul|f32|in=" + std::to_string(i) + "|out=1", e);
  }
  CostModel cm(d, &db, CostMode::Profile);
  CHECK(cm.computeEfficiency("MatMul") == Approx(0.4));
  CHECK(cm.computeEfficiencySource("MatMul") == "fitted to 5 measurements");
  CHECK(cm.computeEfficiency("Conv") == Approx(0.6));
}

TEST_CASE("the roofline prices a tile at the efficiency of measured tiles "
          "of about its size", "[Cost]") {
  // GEMMs that reach 10% of peak at 1e8 FLOPs (launch- and tail-bound) and
  // 80% at 1e12: a 1e12-FLOP tile the profile lacks is priced at 80%, not
  // at the kind's median over every size (10% here: 6 small, 5 large).
  const DeviceSpec &d = catalogDevice("H100-SXM");
  CostDatabase db;
  db.env.device = d.name.str();
  auto add = [&](int i, double flops, double frac) {
    KernelEntry e;
    e.flops[0] = flops;
    e.bytes[0] = 1;
    e.forward = flops / (frac * d.fp32FlopsPerSec) + d.launchOverhead;
    db.add("MatMul|f32|in=" + std::to_string(i) + "|out=1", e);
  };
  for (int i = 0; i < 6; ++i)
    add(i, 1e8 * (1 + 0.1 * i), 0.1);
  for (int i = 0; i < 5; ++i)
    add(10 + i, 1e12 * (1 + 0.1 * i), 0.8);
  CostModel cm(d, &db, CostMode::Profile);
  CHECK(cm.computeEfficiency("MatMul") == Approx(0.1));
  CHECK(cm.computeEfficiency("MatMul", DType::F32, 1.2e12) == Approx(0.8));
  CHECK(cm.computeEfficiency("MatMul", DType::F32, 5e13) == Approx(0.8));
  CHECK(cm.computeEfficiency("MatMul", DType::F32, 1.1e8) == Approx(0.1));
  CHECK(cm.computeEfficiency("MatMul", DType::F32, 1e4) == Approx(0.1));
  // A kind without measurements keeps the kind-level fraction.
  CHECK(cm.computeEfficiency("Conv", DType::F32, 1e12) ==
        Approx(cm.computeEfficiency("Conv")));
}

TEST_CASE("an op whose inputs need no gradient runs no backward-data "
          "kernel",
          "[Cost]") {
  // conv(input, W) -> relu: the model's input needs no gradient, so the
  // convolution's backward is its weight gradient alone (PyTorch computes
  // no grad_input for a tensor that does not require grad); the relu's
  // input is the convolution's output, which W's gradient flows through.
  Graph g = convRelu();
  const Op &conv = g.op(0), &relu = g.op(1);
  CHECK(!g.value(conv.inputs[0]).needsGrad);
  CHECK(g.value(conv.inputs[1]).needsGrad);
  CHECK(g.value(conv.outputs[0]).needsGrad);
  CHECK(!conv.sem.backwardDataNeeded);
  CHECK(relu.sem.backwardDataNeeded);
  CostDatabase db;
  db.env.device = "H100-SXM";
  KernelEntry e;
  e.forward = 40e-6;
  e.backwardData = 30e-6;
  e.backwardWeight = 50e-6;
  db.add(opSignature(g, conv, conv.sem.fullTile()), e);
  CostModel cm(catalogDevice("H100-SXM"), &db, CostMode::Profile);
  auto k = cm.kernel(g, conv, conv.sem.fullTile());
  REQUIRE(static_cast<bool>(k));
  CHECK(k->forward == 40e-6);
  CHECK(k->backwardData == 0);
  CHECK(k->backwardWeight == 50e-6);
  KernelTimes a = cm.analytic(g, conv, conv.sem.fullTile());
  CHECK(a.backwardData == 0);
  CHECK(a.backwardWeight > 0);
  CHECK(cm.analytic(g, relu, relu.sem.fullTile()).backwardData > 0);
}

TEST_CASE("the roofline's compute efficiency is fitted per element type",
          "[Cost]") {
  // f32 convolutions at 60% of the f32 rate, bf16 ones of about the same
  // FLOPs at 5% of the bf16 rate (a profile's bf16 tiles run without tensor
  // cores): an f32 tile the profile lacks is priced at 60%, a bf16 one at
  // 5%; before the fit was per type, the f32 tile took the 5% neighbours.
  const DeviceSpec &d = catalogDevice("H100-SXM");
  CostDatabase db;
  db.env.device = d.name.str();
  for (int i = 0; i < 5; ++i) {
    double flops = 1e11 * (1 + 0.1 * i);
    KernelEntry f, b;
    f.flops[0] = b.flops[0] = flops;
    f.bytes[0] = b.bytes[0] = 1;
    f.forward = flops / (0.6 * d.fp32FlopsPerSec) + d.launchOverhead;
    b.forward = flops / (0.05 * d.fp16FlopsPerSec) + d.launchOverhead;
    db.add("Conv|f32|in=" + std::to_string(i) + "|out=1", f);
    db.add("Conv|bf16|in=" + std::to_string(i) + "|out=1", b);
  }
  CostModel cm(d, &db, CostMode::Profile);
  CHECK(cm.computeEfficiency("Conv", DType::F32) == Approx(0.6));
  CHECK(cm.computeEfficiency("Conv", DType::BF16) == Approx(0.05));
  CHECK(cm.computeEfficiency("Conv", DType::F32, 1.05e11) == Approx(0.6));
  CHECK(cm.computeEfficiency("Conv", DType::BF16, 1.05e11) == Approx(0.05));
  CHECK(cm.computeEfficiencySource("Conv", DType::BF16) ==
        "fitted to 5 measurements");
  // A type without entries of its own keeps the built-in fraction.
  CHECK(cm.computeEfficiencySource("Conv", DType::F16) !=
        "fitted to 5 measurements");

  // Bandwidth-bound entries likewise: bf16 convolutions streaming at 3% of
  // the bandwidth (launch-bound first layers) do not set the f32 fraction.
  CostDatabase mem;
  mem.env.device = d.name.str();
  for (int i = 0; i < 5; ++i) {
    double bytes = 1e8 * (1 + 0.1 * i);
    KernelEntry f, b;
    f.flops[0] = b.flops[0] = 1;
    f.bytes[0] = b.bytes[0] = bytes;
    f.forward = bytes / (0.3 * d.memoryBandwidthBytesPerSec) + d.launchOverhead;
    b.forward =
        bytes / (0.03 * d.memoryBandwidthBytesPerSec) + d.launchOverhead;
    mem.add("Conv|f32|in=" + std::to_string(i) + "|out=1", f);
    mem.add("Conv|bf16|in=" + std::to_string(i) + "|out=1", b);
  }
  CostModel mm(d, &mem, CostMode::Profile);
  CHECK(mm.memoryEfficiency("Conv", DType::F32, 1.2e8) == Approx(0.3));
  CHECK(mm.memoryEfficiency("Conv", DType::BF16, 1.2e8) == Approx(0.03));
}

TEST_CASE("bandwidth-bound kinds are fitted each to their own measurements",
          "[Cost]") {
  // A device whose Relu streams at 80% of its bandwidth and whose MaxPool
  // loop at 10% (a CPU's hand-written pooling): a MaxPool tile the profile
  // lacks is priced at 10%, a kind without measurements at the median of
  // all (10, 80, 80: 80%).
  const DeviceSpec &d = catalogDevice("H100-SXM");
  double bw = d.memoryBandwidthBytesPerSec;
  CostDatabase db;
  db.env.device = d.name.str();
  auto add = [&](const std::string &kind, int i, double frac) {
    KernelEntry e;
    e.bytes[0] = 1e8 * i;
    e.forward = e.bytes[0] / (frac * bw) + d.launchOverhead;
    db.add(kind + "|f32|in=" + std::to_string(i) + "|out=1", e);
  };
  add("Relu", 1, 0.8);
  add("Relu", 2, 0.8);
  add("MaxPool", 1, 0.1);
  CostModel cm(d, &db, CostMode::Profile);
  CHECK(cm.memoryEfficiency("Relu") == Approx(0.8));
  CHECK(cm.memoryEfficiency("MaxPool") == Approx(0.1));
  CHECK(cm.memoryEfficiency("Sigmoid") == Approx(0.8));
  CHECK(cm.memoryEfficiency() == Approx(0.8));
  // The roofline of a Relu tile uses Relu's fraction (a tile the profile
  // lacks).
  Graph g = convRelu();
  const Op &relu = g.op(1);
  KernelTimes k = cm.analytic(g, relu, relu.sem.fullTile());
  std::vector<DType> in(1, DType::F32), out(1, DType::F32);
  double bytes = relu.sem.tileBytes(Pass::Forward, relu.sem.fullTile(), in,
                                    out);
  CHECK(k.forward == Approx(bytes / (bw * 0.8) + d.launchOverhead));
}

TEST_CASE("tile memory counts weights, gradients and optimizer state",
          "[Cost]") {
  Graph g = convRelu();
  CostModel cm(catalogDevice("H100-SXM"), nullptr, CostMode::Analytic);
  const Op &conv = g.op(0);
  // Split output channels (loop 1) in two: half of the weights.
  Box half = rows(conv.sem, 1, 0, 2);
  Bytes w = 2 * 3 * 3 * 3 * 4;
  TileMemory sgd = cm.memory(g, conv, half, Optimizer::Sgd);
  CHECK(sgd.weights == w);
  CHECK(sgd.gradients == w);
  CHECK(sgd.optimizer == 0);
  CHECK(cm.memory(g, conv, half, Optimizer::Adam).optimizer == 2 * w);
  // Conv keeps its whole input for backward-weight.
  CHECK(sgd.saved == 8 * 3 * 16 * 16 * 4);
  // Relu keeps a 1-byte mask of its output.
  CHECK(cm.memory(g, g.op(1), g.op(1).sem.fullTile(), Optimizer::Sgd).saved ==
        8 * 4 * 16 * 16);
}

namespace {

/// A causal bf16 FlashAttention (op 3) of [2, s, 16 heads, 128] operands,
/// each from a weight matmul so that its backward runs: the shape
/// FlashAttention-3's published curves are taken at.
Graph flashAttention(int64_t s) {
  GraphBuilder b;
  ValueId x = b.input({2, s, 16, 128}, DType::BF16);
  std::vector<ValueId> qkv;
  for (int i = 0; i < 3; ++i)
    qkv.push_back(b.op("MatMul",
                       {x, b.constant({128, 128}, ValueKind::Weight, {},
                                      DType::BF16)},
                       {{2, s, 16, 128}}, {}, DType::BF16)[0]);
  b.op("FlashAttention", qkv, {{2, s, 16, 128}},
       flashAttentionAttrs(0.088, true), DType::BF16);
  requireOk(b.g.computeSemantics());
  return std::move(b.g);
}

} // namespace

TEST_CASE("fused attention is priced along FlashAttention-3's published "
          "curves over its kernel's sequence",
          "[Cost]") {
  DeviceSpec h100 = catalogDevice("H100-SXM");
  CostModel cm(h100, nullptr, CostMode::Analytic);
  // Forward and backward TFLOP/s at sequence 2k (the anchors) times the
  // curve's ratio to its 2k point, and the sustained tensor-core ratio.
  auto expect = [&](const Graph &g, const Box &tile, Pass pass, double rate) {
    return g.op(3).sem.tileFlops(pass, tile) /
               (rate * 1e12 * h100.sustainedTensorRatio) +
           h100.launchOverhead;
  };
  struct Point {
    int64_t seq;
    double forward, backward; // TFLOP/s
  };
  double x = std::log2(1536.0 / 1024); // between the 1k and 2k points
  for (Point p : {Point{2048, 525, 425},
                  Point{8192, 525 * 602.0 / 521, 425 * 559.0 / 501},
                  Point{16384, 525 * 616.0 / 521, 425 * 561.0 / 501},
                  Point{65536, 525 * 616.0 / 521, 425 * 561.0 / 501},
                  Point{1536, 525 * (423 + 98 * x) / 521,
                        425 * (424 + 77 * x) / 501}}) {
    Graph g = flashAttention(p.seq);
    Box full = g.op(3).sem.fullTile();
    KernelTimes k = cm.analytic(g, g.op(3), full);
    INFO("sequence " << p.seq);
    CHECK(k.forward == Approx(expect(g, full, Pass::Forward, p.forward)));
    CHECK(k.backwardData ==
          Approx(expect(g, full, Pass::BackwardData, p.backward)));
  }
  // A ring-attention step (the query loop split 2 ways) runs a kernel of
  // its block's length: 4k queries against the 8k keys price at 4k.
  Graph g = flashAttention(8192);
  const OpSemantics &sem = g.op(3).sem;
  Box half = sem.fullTile();
  for (size_t l = 0; l < sem.loops.size(); ++l)
    if (sem.loops[l].name == "q")
      half.hi[l] = 4096;
  KernelTimes k = cm.analytic(g, g.op(3), half);
  CHECK(k.forward == Approx(expect(g, half, Pass::Forward, 525 * 579.0 / 521)));
  // The A100's FlashAttention-2 rate is one figure at every length.
  DeviceSpec a100 = catalogDevice("A100-SXM4-80GB");
  CostModel ca(a100, nullptr, CostMode::Analytic);
  for (const Box &tile : {sem.fullTile(), half})
    CHECK(ca.analytic(g, g.op(3), tile).forward ==
          Approx(g.op(3).sem.tileFlops(Pass::Forward, tile) /
                     (0.55 * 312e12 * a100.sustainedTensorRatio) +
                 a100.launchOverhead));
}
