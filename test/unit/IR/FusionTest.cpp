// Kernel fusion: attention becomes one FlashAttention op with
// FlashAttention's costs, element-wise chains become FusedElementwise ops,
// and what the graph computes (parameters, outputs) is unchanged.
#include "../TestInputs.h"

#include "soap/IR/Fusion.h"
#include <catch2/catch.hpp>

using namespace soap;
using namespace soap::test;

namespace {
int countKind(const Graph &g, llvm::StringRef kind) {
  int n = 0;
  for (const Op &op : g.ops())
    n += op.kind == kind;
  return n;
}
} // namespace

TEST_CASE("fusion turns GPT-2's attention into FlashAttention",
          "[IR][fusion]") {
  auto g = zooModel("gpt2", 2);
  FusionStats stats;
  auto f = fuseKernels(*g, &stats);
  if (!f)
    FAIL(errorMessage(f.takeError()));
  const Graph &fg = **f;
  CHECK(stats.attention == 12);
  CHECK(countKind(fg, "FlashAttention") == 12);
  CHECK(countKind(fg, "Softmax") == 0);
  // Q, K, V and the output: four transposes folded per layer.
  CHECK(stats.transposes == 48);
  CHECK(fg.parameterCount() == g->parameterCount());
  CHECK(fg.numOps() == stats.opsAfter);
  CHECK(stats.opsAfter < stats.opsBefore);
  REQUIRE(fg.outputs.size() == g->outputs.size());
  CHECK(fg.value(fg.outputs[0]).name == g->value(g->outputs[0]).name);

  const Op &a = fg.op(fg.findOp("/h.0/attn/FlashAttention"));
  CHECK(a.getInt("causal", 0) == 1); // the tril mask was recognised
  CHECK(a.getFloat("scale", 0) == Approx(0.125)); // 1 / sqrt(64)
  CHECK(a.getFloat("dropout_ratio", 0) == Approx(0.1));
  CHECK(a.getInts("q_dims") == std::vector<int64_t>{0, 2, 1, 3});
  // Loops: sample, heads and query split freely; keys and head dim whole.
  std::vector<std::string> loops;
  for (const LoopDim &l : a.sem.loops)
    loops.push_back(l.name + (l.splittable ? "" : "*"));
  CHECK(loops == std::vector<std::string>{"n", "h", "q", "k*", "e*", "ev*"});

  // FlashAttention's costs against the eager ops it replaced: half the
  // FLOPs (causal blocks skipped), no b·a·s² scores read, written or saved.
  double eagerFlops = 0, eagerSaved = 0, eagerBytes = 0;
  std::vector<DType> f32s(4, DType::F32);
  for (const Op &op : g->ops())
    if (op.name.rfind("/h.0/attn/", 0) == 0 &&
        (op.kind == "MatMul" || op.kind == "Softmax" || op.kind == "Where" ||
         op.kind == "Dropout" ||
         (op.kind == "Mul" && op.sem.loops.size() == 4)) &&
        op.sem.weightInputs.empty()) {
      Box t = op.sem.fullTile();
      eagerFlops += op.sem.tileFlops(Pass::Forward, t);
      eagerSaved += double(op.sem.savedBytes(t, f32s, f32s));
      eagerBytes += double(op.sem.tileBytes(Pass::Forward, t, f32s, f32s));
    }
  Box t = a.sem.fullTile();
  double fusedFlops = a.sem.tileFlops(Pass::Forward, t);
  CHECK(fusedFlops == Approx(eagerFlops / 2).epsilon(0.02));
  // Saved: Q, K, V, O (4 x 2 x 1024 x 768 floats) and the log-sum-exp.
  double qkvo = 4.0 * 2 * 1024 * 768 * 4, lse = 2.0 * 12 * 1024 * 4;
  CHECK(double(a.sem.savedBytes(t, f32s, f32s)) == Approx(qkvo + lse));
  CHECK(double(a.sem.savedBytes(t, f32s, f32s)) < eagerSaved / 10);
  CHECK(double(a.sem.tileBytes(Pass::Forward, t, f32s, f32s)) ==
        Approx(qkvo));
  CHECK(eagerBytes > 10 * qkvo);
}

TEST_CASE("fusion groups element-wise chains", "[IR][fusion]") {
  auto g = zooModel("gpt2", 2);
  auto f = fuseKernels(*g);
  if (!f)
    FAIL(errorMessage(f.takeError()));
  const Graph &fg = **f;
  // Per layer: bias + GELU, and two bias + dropout + residual adds; the
  // embedding's position add + dropout.
  CHECK(countKind(fg, "FusedElementwise") == 12 * 3 + 1);
  const Op &gelu = fg.op(fg.findOp("/h.0/Mul_5/Fused"));
  CHECK(gelu.getString("kinds", "") == "Add,Mul,Mul,Mul,Add,Mul,Tanh,Add,"
                                       "Mul,Mul");
  // One pass over [2, 1024, 3072]: it reads the matmul's output, the bias
  // and four scalar constants and writes its output, nothing in between.
  // Element types per operand (every one f32 in this import).
  auto f32In = [](const Op &op) {
    return std::vector<DType>(op.inputs.size(), DType::F32);
  };
  std::vector<DType> f32Out(1, DType::F32);
  Box t = gelu.sem.fullTile();
  CHECK(gelu.sem.tileBytes(Pass::Forward, t, f32In(gelu), f32Out) ==
        int64_t(2) * 1024 * 3072 * 4 * 2 + 3072 * 4 + 4 * 4);
  CHECK(gelu.sem.weightInputs.size() == 1); // the bias
  // The residual add: its dropout mask is the only thing it saves.
  const Op &res = fg.op(fg.findOp("/h.0/Add_3/Fused"));
  CHECK(res.getString("kinds", "") == "Add,Dropout,Add");
  CHECK(res.sem.savedBytes(res.sem.fullTile(), f32In(res), f32Out) ==
        int64_t(2) * 1024 * 768);
}

TEST_CASE("fusion leaves graphs without patterns alone", "[IR][fusion]") {
  auto g = zooModel("lenet", 4);
  FusionStats stats;
  auto f = fuseKernels(*g, &stats);
  if (!f)
    FAIL(errorMessage(f.takeError()));
  CHECK(stats.attention == 0);
  CHECK(stats.elementwise == 0);
  REQUIRE((*f)->numOps() == g->numOps());
  for (size_t i = 0; i < g->numOps(); ++i) {
    CHECK((*f)->op(OpId(i)).name == g->op(OpId(i)).name);
    CHECK((*f)->op(OpId(i)).kind == g->op(OpId(i)).kind);
  }
}

TEST_CASE("kernel modes parse", "[IR][fusion]") {
  CHECK(parseKernelMode("fused") == KernelMode::Fused);
  CHECK(parseKernelMode("eager") == KernelMode::Eager);
  CHECK(!parseKernelMode("flash"));
  CHECK(kernelModeName(KernelMode::Fused) == "fused");
}
