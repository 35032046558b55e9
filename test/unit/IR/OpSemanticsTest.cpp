// Region algebra property tests: for random tiles of every op kind, regions
// stay in bounds; a full tiling's output regions cover each output exactly
// once per reduction split; conv/pool halos and reshape regions equal a
// brute-force enumeration of the indices the tile's points touch.
#include "TestGraphs.h"

#include "soap/Support/Error.h"
#include "soap/Support/Rng.h"
#include <catch2/catch.hpp>
#include <map>
#include <set>

using namespace soap;
using namespace soap::test;

namespace {

/// One graph per op kind, each small enough to enumerate.
std::vector<std::pair<std::string, Graph>> opZoo() {
  std::vector<std::pair<std::string, Graph>> zoo;
  auto add = [&](const std::string &name, GraphBuilder &b) {
    llvm::Error err = b.g.computeSemantics();
    INFO(name);
    if (err)
      FAIL(errorMessage(std::move(err)));
    zoo.emplace_back(name, std::move(b.g));
  };
  {
    GraphBuilder b; // strided, padded, dilated convolution
    auto x = b.input({2, 3, 9, 8});
    b.op("Conv", {x, b.weight({4, 3, 3, 2}), b.weight({4})}, {{2, 4, 4, 5}},
         {{"strides", Ints{2, 2}}, {"pads", Ints{1, 1, 0, 1}},
          {"dilations", Ints{1, 2}}});
    add("conv", b);
  }
  {
    GraphBuilder b; // grouped convolution
    auto x = b.input({2, 4, 6, 6});
    b.op("Conv", {x, b.weight({6, 2, 3, 3})}, {{2, 6, 6, 6}},
         {{"group", int64_t(2)}, {"pads", Ints{1, 1, 1, 1}}});
    add("conv-grouped", b);
  }
  {
    GraphBuilder b; // depthwise, SAME_UPPER
    auto x = b.input({1, 3, 7, 7});
    b.op("Conv", {x, b.weight({3, 1, 3, 3})}, {{1, 3, 4, 4}},
         {{"group", int64_t(3)}, {"strides", Ints{2, 2}},
          {"auto_pad", std::string("SAME_UPPER")}});
    add("conv-depthwise", b);
  }
  {
    GraphBuilder b;
    auto x = b.input({2, 3, 7, 7});
    b.op("MaxPool", {x}, {{2, 3, 4, 4}},
         {{"kernel_shape", Ints{3, 3}}, {"strides", Ints{2, 2}},
          {"pads", Ints{1, 1, 1, 1}}});
    add("maxpool", b);
  }
  {
    GraphBuilder b; // ceil_mode: the last window runs past the input
    auto x = b.input({1, 2, 6, 6});
    b.op("AveragePool", {x}, {{1, 2, 3, 3}},
         {{"kernel_shape", Ints{3, 3}}, {"strides", Ints{2, 2}},
          {"ceil_mode", int64_t(1)}});
    add("avgpool-ceil", b);
  }
  {
    GraphBuilder b;
    auto x = b.input({2, 4, 3, 3});
    b.op("GlobalAveragePool", {x}, {{2, 4, 1, 1}});
    add("globalavgpool", b);
  }
  {
    GraphBuilder b;
    auto x = b.input({6, 5});
    b.op("Gemm", {x, b.weight({4, 5}), b.weight({4})}, {{6, 4}},
         {{"transB", int64_t(1)}});
    add("gemm", b);
  }
  {
    GraphBuilder b; // batched matmul with a broadcast batch dim
    auto a = b.input({2, 3, 4, 5});
    auto c = b.input({1, 3, 5, 6});
    b.op("MatMul", {a, c}, {{2, 3, 4, 6}});
    add("matmul-batched", b);
  }
  {
    GraphBuilder b; // activation times weight matrix
    auto a = b.input({2, 7, 6});
    b.op("MatMul", {a, b.weight({6, 4})}, {{2, 7, 4}});
    add("matmul-weight", b);
  }
  {
    GraphBuilder b;
    auto a = b.input({2, 3, 4});
    auto r = b.op("Add", {a, b.weight({4})}, {{2, 3, 4}});
    auto m = b.op("Mul", {r[0], b.constant({}, ValueKind::Constant, {0.5})},
                  {{2, 3, 4}});
    b.op("Relu", {m[0]}, {{2, 3, 4}});
    add("elementwise", b);
  }
  {
    GraphBuilder b;
    auto a = b.input({3, 5});
    b.op("Softmax", {a}, {{3, 5}}, {{"axis", int64_t(1)}});
    add("softmax", b);
  }
  {
    GraphBuilder b;
    auto a = b.input({2, 3, 8});
    b.op("LayerNormalization", {a, b.weight({8}), b.weight({8})}, {{2, 3, 8}},
         {{"axis", int64_t(2)}});
    add("layernorm", b);
  }
  {
    GraphBuilder b;
    auto a = b.input({2, 3, 4, 4});
    b.op("BatchNormalization",
         {a, b.weight({3}), b.weight({3}), b.constant({3}, ValueKind::State),
          b.constant({3}, ValueKind::State)},
         {{2, 3, 4, 4}, {3}, {3}}, {{"training_mode", int64_t(1)}});
    add("batchnorm", b);
  }
  {
    GraphBuilder b;
    auto a = b.input({2, 5, 6});
    b.op("ReduceMean", {a}, {{2, 1, 6}},
         {{"axes", Ints{1}}, {"keepdims", int64_t(1)}});
    add("reducemean", b);
  }
  {
    GraphBuilder b;
    auto a = b.input({2, 3});
    auto c = b.input({2, 5});
    b.op("Concat", {a, c}, {{2, 8}}, {{"axis", int64_t(1)}});
    add("concat", b);
  }
  {
    GraphBuilder b;
    auto a = b.input({2, 9});
    b.op("Split", {a}, {{2, 4}, {2, 5}},
         {{"axis", int64_t(1)}, {"split", Ints{4, 5}}});
    add("split", b);
  }
  {
    GraphBuilder b; // negative step
    auto a = b.input({4, 10});
    b.op("Slice", {a}, {{4, 4}},
         {{"starts", Ints{0, 8}}, {"steps", Ints{1, -2}}});
    add("slice", b);
  }
  {
    GraphBuilder b; // constant padding, pads as an operand
    auto a = b.input({2, 3, 4, 4});
    auto p = b.constant({8}, ValueKind::Constant, {0, 0, 1, 2, 0, 0, 1, 0},
                        DType::I64);
    b.op("Pad", {a, p}, {{2, 3, 6, 6}}, {{"mode", std::string("constant")}});
    add("pad", b);
  }
  {
    GraphBuilder b; // merge (flatten) then split (heads)
    auto a = b.input({2, 4, 3, 2});
    auto f = b.op("Flatten", {a}, {{2, 24}}, {{"axis", int64_t(1)}});
    b.op("Reshape", {f[0]}, {{2, 6, 4}}, {{"shape", Ints{2, 6, 4}}});
    add("reshape", b);
  }
  {
    GraphBuilder b; // a merge whose leading dim needs a granule
    auto a = b.input({6, 4});
    b.op("Reshape", {a}, {{4, 6}}, {{"shape", Ints{4, 6}}});
    add("reshape-granule", b);
  }
  {
    GraphBuilder b;
    auto a = b.input({2, 3, 4});
    auto u = b.op("Unsqueeze", {a}, {{2, 1, 3, 4}}, {{"axes", Ints{1}}});
    b.op("Squeeze", {u[0]}, {{2, 3, 4}}, {{"axes", Ints{1}}});
    add("squeeze", b);
  }
  {
    GraphBuilder b;
    auto a = b.input({2, 3, 4});
    b.op("Transpose", {a}, {{4, 2, 3}}, {{"perm", Ints{2, 0, 1}}});
    add("transpose", b);
  }
  {
    GraphBuilder b; // embedding lookup
    auto ids = b.input({2, 5}, DType::I64);
    b.op("Gather", {b.weight({11, 4}), ids}, {{2, 5, 4}});
    add("gather", b);
  }
  {
    GraphBuilder b; // select one time step
    auto a = b.input({2, 5, 4});
    b.op("Gather", {a, b.constant({}, ValueKind::Constant, {3}, DType::I64)},
         {{2, 4}}, {{"axis", int64_t(1)}});
    add("gather-scalar", b);
  }
  {
    GraphBuilder b;
    auto x = b.input({5, 2, 3}); // [T, N, I]
    b.op("LSTM", {x, b.weight({1, 16, 3}), b.weight({1, 16, 4}),
                  b.weight({1, 32})},
         {{5, 1, 2, 4}, {1, 2, 4}, {1, 2, 4}}, {{"hidden_size", int64_t(4)}});
    add("lstm", b);
  }
  {
    GraphBuilder b;
    auto s = b.input({3, 4, 7});
    auto l = b.input({3, 4}, DType::I64);
    b.op("SoftmaxCrossEntropyLoss", {s, l}, {{}},
         {{"class_axis", int64_t(2)}});
    add("loss", b);
  }
  return zoo;
}

Box randomTile(const OpSemantics &sem, Rng &rng) {
  Box t;
  for (const LoopDim &l : sem.loops) {
    int64_t a = rng.uniformInt(0, l.size - 1);
    int64_t b = rng.uniformInt(a + 1, l.size);
    t.lo.push_back(a);
    t.hi.push_back(b);
  }
  return t;
}

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> d;
  for (int64_t k = 1; k <= n; ++k)
    if (n % k == 0)
      d.push_back(k);
  return d;
}

/// Tiles of an even split with `degree[l]` parts per loop.
std::vector<Box> tiling(const OpSemantics &sem,
                        const std::vector<int64_t> &degree) {
  std::vector<Box> tiles{Box{}};
  for (size_t l = 0; l < sem.loops.size(); ++l) {
    std::vector<Box> next;
    int64_t step = sem.loops[l].size / degree[l];
    for (const Box &t : tiles)
      for (int64_t k = 0; k < degree[l]; ++k) {
        Box n = t;
        n.lo.push_back(k * step);
        n.hi.push_back((k + 1) * step);
        next.push_back(n);
      }
    tiles = std::move(next);
  }
  return tiles;
}

/// A random legal split: splittable loops get a divisor respecting granules.
std::vector<int64_t> randomDegrees(const OpSemantics &sem, Rng &rng) {
  std::vector<int64_t> degree;
  for (const LoopDim &l : sem.loops) {
    std::vector<int64_t> ok{1};
    if (l.splittable)
      for (int64_t d : divisors(l.size))
        if (d > 1 && (l.size / d) % l.granule == 0)
          ok.push_back(d);
    degree.push_back(ok[rng.uniform(ok.size())]);
  }
  return degree;
}

void forEachPoint(const Box &b, const std::function<void(const Ints &)> &f) {
  if (b.empty())
    return;
  Ints p = b.lo;
  while (true) {
    f(p);
    size_t d = p.size();
    while (d > 0) {
      --d;
      if (++p[d] < b.hi[d])
        break;
      p[d] = b.lo[d];
      if (d == 0)
        return;
    }
    if (p.empty())
      return;
  }
}

int64_t flatIndex(const Ints &idx, const Ints &shape) {
  int64_t f = 0;
  for (size_t d = 0; d < shape.size(); ++d)
    f = f * shape[d] + idx[d];
  return f;
}

} // namespace

TEST_CASE("regions of random tiles stay in bounds", "[IR][property]") {
  Rng rng(42, "bounds");
  for (auto &[name, g] : opZoo()) {
    INFO("op zoo entry: " << name);
    for (const Op &o : g.ops()) {
      for (int trial = 0; trial < 200; ++trial) {
        Box tile = randomTile(o.sem, rng);
        for (size_t i = 0; i < o.inputs.size(); ++i) {
          if (!o.sem.inputs[i].present)
            continue;
          Box r = o.sem.inputRegion(static_cast<int>(i), tile);
          REQUIRE(r.rank() == o.sem.inputs[i].shape.size());
          REQUIRE(Box::full(o.sem.inputs[i].shape).contains(r));
        }
        for (size_t j = 0; j < o.outputs.size(); ++j) {
          Box r = o.sem.outputRegion(static_cast<int>(j), tile);
          REQUIRE(Box::full(o.sem.outputs[j].shape).contains(r));
        }
      }
    }
  }
}

TEST_CASE("a full tiling covers each output once per reduction split",
          "[IR][property]") {
  Rng rng(7, "cover");
  for (auto &[name, g] : opZoo()) {
    INFO("op zoo entry: " << name);
    for (const Op &o : g.ops()) {
      for (int trial = 0; trial < 30; ++trial) {
        std::vector<int64_t> degree = randomDegrees(o.sem, rng);
        std::vector<Box> tiles = tiling(o.sem, degree);
        for (size_t j = 0; j < o.outputs.size(); ++j) {
          const Ints &shape = o.sem.outputs[j].shape;
          int64_t copies = 1;
          for (int l : o.sem.reducedLoops(static_cast<int>(j)))
            copies *= degree[l];
          std::vector<int64_t> count(Box::full(shape).volume(), 0);
          for (const Box &t : tiles) {
            REQUIRE(o.sem.tileRespectsGranules(t));
            forEachPoint(o.sem.outputRegion(static_cast<int>(j), t),
                         [&](const Ints &p) { ++count[flatIndex(p, shape)]; });
          }
          for (int64_t c : count)
            REQUIRE(c == copies);
        }
      }
    }
  }
}

TEST_CASE("conv and pool halos equal brute force", "[IR][property]") {
  Rng rng(3, "halo");
  for (auto &[name, g] : opZoo()) {
    const Op &o = g.op(0);
    if (o.kind != "Conv" && o.kind.find("Pool") == std::string::npos)
      continue;
    INFO("op zoo entry: " << name);
    // Direct formula: input index = out*stride + k*dilation - padBegin.
    const Value &x = g.value(o.inputs[0]);
    size_t nsp = x.shape.rank() - 2;
    Ints strides = o.getInts("strides", Ints(nsp, 1));
    Ints dil = o.getInts("dilations", Ints(nsp, 1));
    Ints pads = o.getInts("pads", Ints(2 * nsp, 0));
    if (o.getString("auto_pad", "") == "SAME_UPPER") {
      const Value &y = g.value(o.outputs[0]);
      const Value &w = g.value(o.inputs[1]);
      for (size_t i = 0; i < nsp; ++i) {
        int64_t total = std::max<int64_t>(
            (y.shape[2 + i] - 1) * strides[i] + dil[i] * (w.shape[2 + i] - 1) +
                1 - x.shape[2 + i],
            0);
        pads[i] = total / 2;
      }
    }
    const auto &loops = o.sem.loops;
    auto loopIndex = [&](const std::string &n) {
      for (size_t l = 0; l < loops.size(); ++l)
        if (loops[l].name == n)
          return static_cast<int>(l);
      return -1;
    };
    for (int trial = 0; trial < 100; ++trial) {
      Box tile = randomTile(o.sem, rng);
      Box hull;
      hull.lo.assign(x.shape.rank(), INT64_MAX);
      hull.hi.assign(x.shape.rank(), INT64_MIN);
      forEachPoint(tile, [&](const Ints &p) {
        Ints idx(x.shape.rank());
        idx[0] = p[loopIndex("n")];
        if (o.kind == "Conv") {
          int g = loopIndex("g");
          int64_t cPerGroup = g >= 0 ? x.shape[1] / loops[g].size : 0;
          idx[1] = (g >= 0 ? p[g] * cPerGroup : 0) + p[loopIndex("ic")];
        } else {
          idx[1] = p[loopIndex("c")];
        }
        for (size_t i = 0; i < nsp; ++i) {
          static const char *on[] = {"oh", "ow"}, *kn[] = {"kh", "kw"};
          bool conv = o.kind == "Conv";
          int ol = loopIndex(conv ? on[i] : "o" + std::to_string(i));
          int kl = loopIndex(conv ? kn[i] : "k" + std::to_string(i));
          int64_t out = ol >= 0 ? p[ol] : 0;
          idx[2 + i] = out * strides[i] + p[kl] * dil[i] - pads[i];
        }
        for (size_t d = 0; d < idx.size(); ++d)
          if (idx[d] < 0 || idx[d] >= x.shape[d])
            return; // padding: nothing read
        for (size_t d = 0; d < idx.size(); ++d) {
          hull.lo[d] = std::min(hull.lo[d], idx[d]);
          hull.hi[d] = std::max(hull.hi[d], idx[d] + 1);
        }
      });
      Box r = o.sem.inputRegion(0, tile);
      if (hull.lo[0] == INT64_MAX) {
        REQUIRE(r.empty());
      } else {
        REQUIRE(r == hull);
      }
    }
  }
}

TEST_CASE("reshape regions are exact boxes for legal tiles",
          "[IR][property]") {
  Rng rng(11, "reshape");
  for (auto &[name, g] : opZoo()) {
    for (const Op &o : g.ops()) {
      if (o.kind != "Reshape" && o.kind != "Flatten" && o.kind != "Squeeze" &&
          o.kind != "Unsqueeze")
        continue;
      INFO("op zoo entry: " << name << " " << o.kind);
      const Ints &in = g.value(o.inputs[0]).shape.dims;
      const Ints &out = g.value(o.outputs[0]).shape.dims;
      for (int trial = 0; trial < 30; ++trial) {
        std::vector<Box> tiles = tiling(o.sem, randomDegrees(o.sem, rng));
        for (const Box &t : tiles) {
          std::set<int64_t> touched;
          forEachPoint(t, [&](const Ints &p) {
            touched.insert(flatIndex(p, out)); // same linear order as input
          });
          Box r = o.sem.inputRegion(0, t);
          REQUIRE(r.volume() == static_cast<int64_t>(touched.size()));
          forEachPoint(r, [&](const Ints &p) {
            REQUIRE(touched.count(flatIndex(p, in)));
          });
        }
      }
    }
  }
}

TEST_CASE("loop classes, FLOPs and weights of a convolution", "[IR]") {
  GraphBuilder b;
  auto x = b.input({8, 3, 32, 32});
  b.op("Conv", {x, b.weight({16, 3, 5, 5}), b.weight({16})}, {{8, 16, 28, 28}});
  requireOk(b.g.computeSemantics());
  const OpSemantics &s = b.g.op(0).sem;
  std::string classes;
  for (const LoopDim &l : s.loops)
    classes += dimClassLetter(l.cls);
  CHECK(classes == "SPRAARR"); // n oc ic oh ow kh kw
  double macs = 8.0 * 16 * 3 * 28 * 28 * 5 * 5;
  CHECK(s.tileFlops(Pass::Forward, s.fullTile()) ==
        Approx(2 * macs + 8.0 * 16 * 28 * 28));
  CHECK(s.weightInputs == std::vector<int>{1, 2});
  CHECK(s.gradInputs == std::vector<int>{0});
  CHECK(b.g.parameterCount() == 16 * 3 * 5 * 5 + 16);
  // The output carries the classes of the loops that index it.
  CHECK(b.g.value(b.g.op(0).outputs[0]).dimClasses ==
        std::vector<DimClass>{DimClass::Sample, DimClass::Parameter,
                              DimClass::Attribute, DimClass::Attribute});
  // Splitting the input channels (a Reduction) makes the output partial sums.
  CHECK(s.reducedLoops(0) == std::vector<int>{2, 5, 6});
}

TEST_CASE("a product of two activations computes both gradients", "[IR]") {
  // Attention's Q K^T: no weights, yet B's gradient (A^T dC) is computed
  // beside A's (dC B^T), so the backward-data pass has both products.
  GraphBuilder b;
  auto q = b.input({2, 3, 4, 5});
  auto k = b.input({2, 3, 5, 6});
  b.op("MatMul", {q, k}, {{2, 3, 4, 6}});
  requireOk(b.g.computeSemantics());
  const OpSemantics &s = b.g.op(0).sem;
  double product = 2.0 * 2 * 3 * 4 * 5 * 6;
  CHECK(s.gradInputs == std::vector<int>{0, 1});
  CHECK(s.tileFlops(Pass::Forward, s.fullTile()) == Approx(product));
  CHECK(s.tileFlops(Pass::BackwardData, s.fullTile()) == Approx(2 * product));
  CHECK(s.tileFlops(Pass::BackwardWeight, s.fullTile()) == 0);
  // With a weight as B, its gradient is the backward-weight pass.
  GraphBuilder w;
  auto a = w.input({2, 7, 6});
  w.op("MatMul", {a, w.weight({6, 4})}, {{2, 7, 4}});
  requireOk(w.g.computeSemantics());
  const OpSemantics &t = w.g.op(0).sem;
  CHECK(t.tileFlops(Pass::BackwardData, t.fullTile()) ==
        Approx(2.0 * 2 * 7 * 6 * 4));
  CHECK(t.tileFlops(Pass::BackwardWeight, t.fullTile()) ==
        Approx(2.0 * 2 * 7 * 6 * 4));
}

TEST_CASE("statistics dims are marked and splits are legal", "[IR]") {
  GraphBuilder b;
  auto a = b.input({4, 10});
  auto sm = b.op("Softmax", {a}, {{4, 10}}, {{"axis", int64_t(1)}});
  (void)sm;
  requireOk(b.g.computeSemantics());
  const OpSemantics &s = b.g.op(0).sem;
  CHECK_FALSE(s.loops[0].statReduced);
  CHECK(s.loops[1].statReduced);
}

TEST_CASE("mismatched operands are rejected with a clear message", "[IR]") {
  GraphBuilder b;
  auto x = b.input({2, 3, 8, 8});
  b.op("Conv", {x, b.weight({4, 3, 3})}, {{2, 4, 6, 6}});
  llvm::Error err = b.g.computeSemantics();
  REQUIRE(static_cast<bool>(err));
  std::string msg = errorMessage(std::move(err));
  CHECK(msg.find("test.onnx: node 'Conv_0' (Conv)") == 0);
  CHECK(msg.find("has rank 3") != std::string::npos);
}

TEST_CASE("an unregistered op kind is an error naming it", "[IR]") {
  GraphBuilder b;
  auto x = b.input({2, 3});
  b.op("NonMaxSuppression", {x}, {{2, 3}});
  llvm::Error err = b.g.computeSemantics();
  REQUIRE(static_cast<bool>(err));
  CHECK(errorMessage(std::move(err)).find("unsupported operator "
                                          "'NonMaxSuppression'") !=
        std::string::npos);
}
