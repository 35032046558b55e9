// lib/Exec library kernels: strided products, and contraction tiles (Gemm,
// MatMul with broadcasting, Conv with groups, strides, dilations, padding,
// split windows and channels) through oneDNN's convolution and the packed
// GEMM path, against the loop nest of the op's index maps, on random
// sub-tiles whose buffers hold exactly the regions the tile reads.
#include "Exec/Gemm.h"
#include "../IR/TestGraphs.h"
#include "Exec/Kernels.h"
#include "soap/Support/Rng.h"
#include <catch2/catch.hpp>
#include <cmath>

using namespace soap;
using namespace soap::exec;

namespace {

void fillRandom(Buf &b, Rng &rng) {
  for (float &x : b.data)
    x = static_cast<float>(2 * rng.uniformReal() - 1);
}

/// A random non-empty sub-box of the op's loop space (loops that no split
/// may cut stay whole).
Box randomTile(const OpSemantics &sem, Rng &rng) {
  Box t = sem.fullTile();
  for (size_t l = 0; l < t.rank(); ++l) {
    if (!sem.loops[l].splittable)
      continue;
    int64_t n = t.hi[l];
    int64_t a = static_cast<int64_t>(rng.uniform(static_cast<uint64_t>(n)));
    int64_t b = static_cast<int64_t>(rng.uniform(static_cast<uint64_t>(n)));
    t.lo[l] = std::min(a, b);
    t.hi[l] = std::max(a, b) + 1;
  }
  return t;
}

/// A task over `tile` with random inputs, output gradient and zeroed
/// outputs and input gradients.
Task makeTask(const OpSemantics &sem, const Box &tile, Rng &rng) {
  Task t;
  t.loops = tile;
  t.in.resize(2);
  t.gin.resize(2);
  for (int i : {0, 1}) {
    t.in[i].reset(sem.inputRegion(i, tile));
    fillRandom(t.in[i], rng);
    t.gin[i].reset(t.in[i].box);
  }
  t.out.resize(1);
  t.gout.resize(1);
  t.out[0].reset(sem.outputRegion(0, tile));
  t.gout[0].reset(t.out[0].box);
  fillRandom(t.gout[0], rng);
  return t;
}

/// The loop nest: Y += alpha A B, dA += alpha dY B, dB += alpha dY A.
void reference(const OpSemantics &sem, Task &t, float alpha) {
  PointIter it(sem, {{&sem.outputs[0], t.out[0].box},
                     {&sem.inputs[0], t.in[0].box},
                     {&sem.inputs[1], t.in[1].box}});
  it.run(t.loops, [&](const int64_t *o) {
    if (o[1] < 0 || o[2] < 0)
      return;
    t.out[0].data[o[0]] += alpha * t.in[0].data[o[1]] * t.in[1].data[o[2]];
    float g = alpha * t.gout[0].data[o[0]];
    t.gin[0].data[o[1]] += g * t.in[1].data[o[2]];
    t.gin[1].data[o[2]] += g * t.in[0].data[o[1]];
  });
}

void requireClose(const Buf &got, const Buf &want, const char *what) {
  INFO(what);
  REQUIRE(got.box == want.box);
  double scale = 1e-3;
  for (float v : want.data)
    scale = std::max(scale, static_cast<double>(std::fabs(v)));
  for (size_t k = 0; k < want.size(); ++k) {
    INFO("element " << k);
    REQUIRE(std::fabs(got.data[k] - want.data[k]) <= 1e-5 * scale);
  }
}

/// Every contraction op of `g` on `tiles` random tiles: the library path
/// (oneDNN's convolution for Conv where it is built, the GEMM path for
/// every kind) equals the loop nest.
void checkOps(Graph &g, int tiles, uint64_t seed) {
  test::requireOk(g.computeSemantics());
  Rng rng(seed);
  for (const Op &op : g.ops()) {
    const OpSemantics &sem = op.sem;
    for (int k = 0; k < tiles; ++k) {
      Box tile = k == 0 ? sem.fullTile() : randomTile(sem, rng);
      INFO(op.name << " (" << op.kind << ") tile " << tile.str());
      Task want = makeTask(sem, tile, rng);
      reference(sem, want, 0.5f);
      for (bool viaConv : {true, false}) {
        if (viaConv && (op.kind != "Conv" || !haveLibraryGemm()))
          continue;
        INFO((viaConv ? "oneDNN convolution" : "GEMM path"));
        Task got = want;
        for (Buf *b : {&got.out[0], &got.gin[0], &got.gin[1]})
          std::fill(b->data.begin(), b->data.end(), 0.0f);
        if (viaConv) {
          // The convolution has no alpha; check it at 1 against 0.5 * 2.
          REQUIRE(convForward(sem, got));
          REQUIRE(convBackward(sem, got));
          for (Buf *b : {&got.out[0], &got.gin[0], &got.gin[1]})
            for (float &x : b->data)
              x *= 0.5f;
        } else {
          REQUIRE(gemmForward(sem, got, 0.5f));
          REQUIRE(gemmBackward(sem, got, 0.5f));
        }
        requireClose(got.out[0], want.out[0], "forward");
        requireClose(got.gin[0], want.gin[0], "input 0 gradient");
        requireClose(got.gin[1], want.gin[1], "input 1 gradient");
      }
    }
  }
}

} // namespace

TEST_CASE("Exec GEMM: strided views in every orientation", "[exec][gemm]") {
  Rng rng(11);
  // A 3x4 times 4x5 product with each operand stored row- or column-major
  // or with no unit stride (every other element).
  std::vector<float> a(2 * 12), b(2 * 20);
  for (float &x : a)
    x = static_cast<float>(rng.uniformReal());
  for (float &x : b)
    x = static_cast<float>(rng.uniformReal());
  auto views = [](const float *p, int64_t r, int64_t c) {
    return std::vector<MatView>{
        {p, r, c, c, 1}, {p, r, c, 1, r}, {p, r, c, 2 * c, 2}};
  };
  for (const MatView &va : views(a.data(), 3, 4))
    for (const MatView &vb : views(b.data(), 4, 5))
      for (int layout = 0; layout < 3; ++layout) {
        std::vector<float> c(2 * 15, 1.0f);
        MatView vc = views(c.data(), 3, 5)[static_cast<size_t>(layout)];
        matmulAcc(vc, va, vb, 2.0f);
        for (int64_t i = 0; i < 3; ++i)
          for (int64_t j = 0; j < 5; ++j) {
            double s = 1;
            for (int64_t k = 0; k < 4; ++k)
              s += 2.0 * va.p[i * va.rs + k * va.cs] *
                   vb.p[k * vb.rs + j * vb.cs];
            CHECK(vc.p[i * vc.rs + j * vc.cs] == Approx(s).epsilon(1e-6));
          }
      }
}

TEST_CASE("Exec GEMM: Gemm and MatMul tiles equal the loop nest",
          "[exec][gemm]") {
  using test::Ints;
  test::GraphBuilder b;
  ValueId x = b.input({6, 5}), w = b.weight({7, 5}), wt = b.weight({5, 7});
  b.op("Gemm", {x, w}, {{6, 7}}, {{"transB", int64_t(1)}});
  b.op("Gemm", {wt, x}, {{7, 6}},
       {{"transA", int64_t(1)}, {"transB", int64_t(1)}});
  ValueId q = b.input({2, 3, 4, 5}), k = b.input({2, 3, 5, 6});
  b.op("MatMul", {q, k}, {{2, 3, 4, 6}});
  b.op("MatMul", {q, wt}, {{2, 3, 4, 7}}); // weight broadcast over batch
  ValueId v = b.input({3, 5, 6});
  b.op("MatMul", {q, v}, {{2, 3, 4, 6}}); // broadcast over the first dim
  checkOps(b.g, 12, 21);
}

TEST_CASE("Exec GEMM: Conv tiles equal the loop nest (oneDNN and GEMM)",
          "[exec][gemm]") {
  using test::Ints;
  test::GraphBuilder b;
  ValueId x = b.input({2, 4, 9, 8});
  b.op("Conv", {x, b.weight({6, 4, 3, 3})}, {{2, 6, 9, 8}},
       {{"pads", Ints{1, 1, 1, 1}}});
  b.op("Conv", {x, b.weight({6, 4, 3, 2})}, {{2, 6, 4, 4}},
       {{"pads", Ints{1, 0, 1, 1}}, {"strides", Ints{2, 2}}});
  b.op("Conv", {x, b.weight({4, 2, 3, 3})}, {{2, 4, 5, 4}},
       {{"pads", Ints{1, 1, 1, 1}},
        {"dilations", Ints{2, 2}},
        {"strides", Ints{2, 2}},
        {"group", int64_t(2)}});
  b.op("Conv", {x, b.weight({4, 1, 3, 3})}, {{2, 4, 9, 8}},
       {{"pads", Ints{1, 1, 1, 1}}, {"group", int64_t(4)}}); // depthwise
  ValueId x1 = b.input({2, 3, 10});
  b.op("Conv", {x1, b.weight({5, 3, 4})}, {{2, 5, 9}},
       {{"pads", Ints{2, 1}}, {"strides", Ints{1}}});
  checkOps(b.g, 12, 22);
}
