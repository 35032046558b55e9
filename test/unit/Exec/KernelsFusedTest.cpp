// lib/Exec's fused kernels (KernelsFused.cpp, KernelsAttention.cpp): a
// FusedElementwise op computes what its eager members compute run one after
// the other; FlashAttention computes softmax(scale Q Kᵀ + mask) V as a
// direct computation in double does, for permuted layouts, a causal mask
// and an added mask; backward of both matches the finite differences of
// forward along a random direction. A FusedSoftmax (scale, mask, softmax)
// computes what its eager members compute, forward and backward, also
// with its softmax axis split over two tiles.
#include "../IR/TestGraphs.h"
#include "../TestInputs.h"
#include "Exec/Kernels.h"
#include "soap/IR/Fusion.h"
#include "soap/Support/Rng.h"
#include <cmath>

using namespace soap;
using namespace soap::exec;

namespace {

class NoStats : public StatsExchange {
public:
  void allReduce(const std::vector<bool> &, std::vector<Buf *> &,
                 Combine) override {}
  void allGather(const std::vector<bool> &, int, std::vector<Buf *> &,
                 bool) override {}
};

/// Runs forward (and, with `gout`, backward) of `op` on one whole tile
/// whose inputs are `in`.
Task run(const Graph &g, const Op &op, std::vector<Buf> in,
         const std::vector<float> *gout = nullptr) {
  Task t;
  t.loops = op.sem.fullTile();
  t.in = std::move(in);
  t.out.resize(op.outputs.size());
  for (size_t j = 0; j < op.outputs.size(); ++j)
    if (op.outputs[j] != kNoValue)
      t.out[j].reset(op.sem.outputRegion(int(j), t.loops));
  std::vector<Task> ts{t};
  NoStats ns;
  KernelCtx ctx{g, op, ts, ns, 3, 1};
  findKernel(op.kind)->forward(ctx);
  if (gout) {
    ts[0].gout.assign(op.outputs.size(), Buf());
    ts[0].gout[0].reset(ts[0].out[0].box);
    ts[0].gout[0].data.assign(gout->begin(), gout->end());
    ts[0].gin.assign(op.inputs.size(), Buf());
    // Attention's mask gets no gradient (as the eager graph's constant).
    size_t n = op.kind == "FlashAttention" ? 3 : op.inputs.size();
    for (size_t i = 0; i < n; ++i)
      if (isFloating(g.value(op.inputs[i]).dtype) &&
          g.value(op.inputs[i]).kind != ValueKind::Constant)
        ts[0].gin[i].reset(ts[0].in[i].box);
    findKernel(op.kind)->backward(ctx);
  }
  return std::move(ts[0]);
}

/// Input `i` of `op` over its whole region: a constant's values, else
/// uniform in [-1, 1) (0 or 1 for a bool).
Buf inputOf(const Graph &g, const Op &op, size_t i, Rng &rng) {
  const Value &v = g.value(op.inputs[i]);
  Buf b;
  b.reset(op.sem.inputRegion(int(i), op.sem.fullTile()));
  for (size_t k = 0; k < b.size(); ++k)
    b.data[k] = v.kind == ValueKind::Constant
                    ? float(v.data.size() == 1 ? v.data[0] : v.data[k])
                : !isFloating(v.dtype) ? float(rng.uniform(2))
                                       : float(2 * rng.uniformReal() - 1);
  return b;
}

/// <gin, dir> against the central difference of <out, gout> along dir.
void checkGradient(const Graph &g, const Op &op, Rng &rng) {
  INFO(op.name << " (" << op.kind << ")");
  std::vector<Buf> in;
  for (size_t i = 0; i < op.inputs.size(); ++i)
    in.push_back(inputOf(g, op, i, rng));
  Task t0 = run(g, op, in);
  std::vector<float> r(t0.out[0].size());
  for (float &x : r)
    x = float(2 * rng.uniformReal() - 1);
  Task t = run(g, op, in, &r);
  double analytic = 0;
  std::vector<std::vector<float>> dir(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    if (t.gin[i].data.empty())
      continue;
    dir[i].resize(in[i].size());
    for (size_t k = 0; k < dir[i].size(); ++k) {
      dir[i][k] = float(2 * rng.uniformReal() - 1);
      analytic += double(t.gin[i].data[k]) * dir[i][k];
    }
  }
  // Small: a Relu's kink inside the chain is straddled by fewer points.
  const float eps = 1e-3f;
  auto at = [&](float sign) {
    std::vector<Buf> s = in;
    for (size_t i = 0; i < s.size(); ++i)
      for (size_t k = 0; k < dir[i].size(); ++k)
        s[i].data[k] += sign * eps * dir[i][k];
    Task u = run(g, op, s);
    double o = 0;
    for (size_t k = 0; k < r.size(); ++k)
      o += double(u.out[0].data[k]) * r[k];
    return o;
  };
  double numeric = (at(1) - at(-1)) / (2 * eps);
  CHECK(std::fabs(numeric - analytic) <=
        2e-2 * std::max(1.0, std::fabs(analytic)));
}

} // namespace

TEST_CASE("Exec fused kernels: a FusedElementwise op computes what its eager "
          "members compute, dropout masks included",
          "[exec][kernels][fused]") {
  for (const char *m : {"transformer_small", "resnet_small"}) {
    auto g = test::zooModel(m, 2);
    auto f = fuseKernels(*g);
    REQUIRE(errorMessage(f.takeError()) == "");
    Rng rng(11, m);
    int seen = 0;
    for (const Op &op : (*f)->ops()) {
      if (op.kind != "FusedElementwise")
        continue;
      INFO(m << ": " << op.name << " [" << op.getString("kinds", "") << "]");
      ++seen;
      // The eager values by name: the fused op's inputs, then each
      // member's output in turn.
      std::map<std::string, Buf> vals;
      std::vector<Buf> in;
      for (size_t i = 0; i < op.inputs.size(); ++i) {
        in.push_back(inputOf(**f, op, i, rng));
        vals[(*f)->value(op.inputs[i]).name] = in.back();
      }
      Buf last;
      for (int64_t j = 0; j < op.getInt("members", 0); ++j) {
        std::string name = op.getString("m" + std::to_string(j) + ".name", "");
        OpId id = g->findOp(name);
        REQUIRE(id >= 0);
        const Op &e = g->op(id);
        std::vector<Buf> ein;
        for (ValueId v : e.inputs) {
          const Value &val = g->value(v);
          auto it = vals.find(val.name);
          if (it != vals.end()) {
            ein.push_back(it->second);
            continue;
          }
          REQUIRE(val.kind == ValueKind::Constant);
          Buf b;
          b.reset(Box::full(val.shape.dims));
          for (size_t k = 0; k < b.size(); ++k)
            b.data[k] = float(val.data.size() == 1 ? val.data[0] : val.data[k]);
          ein.push_back(b);
        }
        // Eager ops see their operands over whole tensors: a broadcast
        // input's region is all of it, as in the fused op.
        Task et = run(*g, e, ein);
        last = et.out[0];
        vals[g->value(e.outputs[0]).name] = last;
      }
      Task ft = run(**f, op, in);
      REQUIRE(ft.out[0].size() == last.size());
      size_t bad = 0;
      for (size_t k = 0; k < last.size(); ++k)
        bad += std::fabs(ft.out[0].data[k] - last.data[k]) >
               1e-6f * std::max(1.0f, std::fabs(last.data[k]));
      CHECK(bad == 0);
      checkGradient(**f, op, rng);
    }
    CHECK(seen > 0);
  }
}

TEST_CASE("Exec fused kernels: FlashAttention against a direct computation, "
          "and its backward against finite differences",
          "[exec][kernels][fused]") {
  using test::Ints;
  // Logical [n=2, h=3, s=5, e=4]; Q and O held as [n, s, h, e], K as
  // [n, h, e, s] (a transposed Kᵀ), V as [n, h, s, e].
  for (std::string mask : {"causal", "add", "where"}) {
    INFO(mask);
    test::GraphBuilder b;
    ValueId q = b.input({2, 5, 3, 4}), k = b.input({2, 3, 4, 5}),
            v = b.input({2, 3, 5, 4});
    std::vector<ValueId> ins{q, k, v};
    if (mask == "add")
      ins.push_back(b.input({5, 5}));
    if (mask == "where")
      ins.push_back(b.input({2, 1, 5, 5}, DType::Bool));
    b.op("FlashAttention", ins, {{2, 5, 3, 4}},
         {{"q_dims", Ints{0, 2, 1, 3}},
          {"k_dims", Ints{0, 1, 3, 2}},
          {"v_dims", Ints{0, 1, 2, 3}},
          {"o_dims", Ints{0, 2, 1, 3}},
          {"batch_dims", int64_t(2)},
          {"scale", 0.5},
          {"causal", int64_t(mask == "causal")},
          {"mask", mask == "causal" ? std::string("where") : mask},
          {"mask_fill", -3.4028234663852886e38},
          {"dropout_ratio", 0.0},
          {"dropout_name", std::string()}});
    test::requireOk(b.g.computeSemantics());
    const Op &op = b.g.op(0);
    CHECK(errorMessage(findKernel("FlashAttention")->check(b.g, op)) == "");
    Rng rng(13, mask);
    std::vector<Buf> in;
    for (size_t i = 0; i < op.inputs.size(); ++i)
      in.push_back(inputOf(b.g, op, i, rng));
    Task t = run(b.g, op, in);
    auto Q = [&](int n, int h, int s, int e) {
      return double(in[0].data[size_t(((n * 5 + s) * 3 + h) * 4 + e)]);
    };
    auto K = [&](int n, int h, int s, int e) {
      return double(in[1].data[size_t(((n * 3 + h) * 4 + e) * 5 + s)]);
    };
    auto V = [&](int n, int h, int s, int e) {
      return double(in[2].data[size_t(((n * 3 + h) * 5 + s) * 4 + e)]);
    };
    double worst = 0;
    for (int n = 0; n < 2; ++n)
      for (int h = 0; h < 3; ++h)
        for (int i = 0; i < 5; ++i) {
          double s[5], mx = -1e300, sum = 0;
          for (int j = 0; j < 5; ++j) {
            s[j] = 0;
            for (int e = 0; e < 4; ++e)
              s[j] += Q(n, h, i, e) * K(n, h, j, e);
            s[j] *= 0.5;
            if (mask == "add")
              s[j] += in[3].data[size_t(i * 5 + j)];
            bool open = mask == "causal" ? j <= i
                        : mask == "where"
                            ? in[3].data[size_t((n * 5 + i) * 5 + j)] != 0
                            : true;
            if (!open)
              s[j] = -3.4028234663852886e38;
            mx = std::max(mx, s[j]);
          }
          for (double &x : s)
            sum += (x = std::exp(x - mx));
          for (int e = 0; e < 4; ++e) {
            double o = 0;
            for (int j = 0; j < 5; ++j)
              o += s[j] / sum * V(n, h, j, e);
            float got = t.out[0].data[size_t(((n * 5 + i) * 3 + h) * 4 + e)];
            worst = std::max(worst, std::fabs(got - o));
          }
        }
    CHECK(worst < 1e-5);
    checkGradient(b.g, op, rng);
  }
}

namespace {

/// A whole constant as a buffer.
Buf constantBuf(const Value &val) {
  Buf b;
  b.reset(Box::full(val.shape.dims));
  for (size_t k = 0; k < b.size(); ++k)
    b.data[k] = float(val.data.size() == 1 ? val.data[0] : val.data[k]);
  return b;
}

/// Rows of the tasks of one op split in two along its last loop: the
/// exchange sums (or takes the maximum of) the two tasks' row buffers, as
/// the Runner does among the tiles that share a row.
class TwoTiles : public StatsExchange {
public:
  void allReduce(const std::vector<bool> &, std::vector<Buf *> &rows,
                 Combine c) override {
    REQUIRE(rows.size() == 2);
    for (size_t k = 0; k < rows[0]->size(); ++k) {
      float &a = rows[0]->data[k], &b = rows[1]->data[k];
      a = c == Combine::Max ? std::max(a, b) : a + b;
      b = a;
    }
  }
  void allGather(const std::vector<bool> &, int, std::vector<Buf *> &,
                 bool) override {}
};

/// Forward and backward of `op` as two tasks split in half along its last
/// loop; the outputs and input gradients assembled over the whole tensors.
void runSplit(const Graph &g, const Op &op, const std::vector<Buf> &in,
              const std::vector<float> &gout, Buf &out, std::vector<Buf> &gin) {
  std::vector<Task> ts(2);
  Box full = op.sem.fullTile();
  size_t last = full.rank() - 1;
  int64_t half = full.hi[last] / 2;
  Box outFull = op.sem.outputRegion(0, full);
  for (size_t k = 0; k < 2; ++k) {
    Task &t = ts[k];
    t.loops = full;
    (k ? t.loops.lo : t.loops.hi)[last] = half;
    for (size_t i = 0; i < in.size(); ++i) {
      Buf b;
      b.reset(op.sem.inputRegion(int(i), t.loops));
      if (b.box.lo == in[i].box.lo && b.box.hi == in[i].box.hi) {
        t.in.push_back(in[i]); // a scalar, or not indexed by the split
        continue;
      }
      forEachIndex(b.box, in[i].box.hi, [&](int64_t flat, int64_t off) {
        b.data[size_t(off)] = in[i].data[size_t(flat)];
      });
      t.in.push_back(std::move(b));
    }
    t.out.resize(1);
    t.out[0].reset(op.sem.outputRegion(0, t.loops));
  }
  TwoTiles two;
  KernelCtx ctx{g, op, ts, two, 3, 1};
  findKernel(op.kind)->forward(ctx);
  for (Task &t : ts) {
    t.gout.assign(1, Buf());
    t.gout[0].reset(t.out[0].box);
    forEachIndex(t.gout[0].box, outFull.hi, [&](int64_t flat, int64_t off) {
      t.gout[0].data[size_t(off)] = gout[size_t(flat)];
    });
    t.gin.assign(op.inputs.size(), Buf());
    for (size_t i = 0; i < op.inputs.size(); ++i)
      if (isFloating(g.value(op.inputs[i]).dtype) &&
          g.value(op.inputs[i]).kind != ValueKind::Constant)
        t.gin[i].reset(t.in[i].box);
  }
  findKernel(op.kind)->backward(ctx);
  out.reset(outFull);
  gin.assign(in.size(), Buf());
  for (size_t i = 0; i < in.size(); ++i)
    if (!ts[0].gin[i].data.empty())
      gin[i].reset(in[i].box);
  for (Task &t : ts) {
    forEachIndex(t.out[0].box, outFull.hi, [&](int64_t flat, int64_t off) {
      out.data[size_t(flat)] = t.out[0].data[size_t(off)];
    });
    for (size_t i = 0; i < in.size(); ++i)
      if (!t.gin[i].data.empty())
        forEachIndex(t.gin[i].box, in[i].box.hi,
                     [&](int64_t flat, int64_t off) {
                       gin[i].data[size_t(flat)] += t.gin[i].data[size_t(off)];
                     });
  }
}

float maxDiff(const Buf &a, const Buf &b) {
  REQUIRE(a.size() == b.size());
  float worst = 0;
  for (size_t k = 0; k < a.size(); ++k)
    worst = std::max(worst, std::fabs(a.data[k] - b.data[k]));
  return worst;
}

} // namespace

TEST_CASE("Exec fused kernels: a FusedSoftmax op computes what its eager "
          "members (scale, mask, softmax) compute, forward and backward, "
          "whole and with its axis split",
          "[exec][kernels][fused]") {
  for (std::string mask : {"where", "add"}) {
    INFO(mask);
    // Attention scores [n=2, h=3, q=5, k=6]: Mul by a scalar scale, then
    // Where(causal, x, fill) or Add(x, mask [2, 1, 1, 6]), then Softmax.
    test::GraphBuilder b;
    std::vector<int64_t> shape{2, 3, 5, 6};
    ValueId x = b.input(shape);
    ValueId scale = b.constant({}, ValueKind::Constant, {0.35});
    ValueId s = b.op("Mul", {x, scale}, {shape})[0];
    ValueId m;
    if (mask == "where") {
      std::vector<double> causal;
      for (int i = 0; i < 5; ++i)
        for (int j = 0; j < 6; ++j)
          causal.push_back(j <= i + 1);
      ValueId c = b.constant({5, 6}, ValueKind::Constant, causal, DType::Bool);
      ValueId fill =
          b.constant({}, ValueKind::Constant, {-3.4028234663852886e38});
      m = b.op("Where", {c, s, fill}, {shape})[0];
    } else {
      m = b.op("Add", {s, b.input({2, 1, 1, 6})}, {shape})[0];
    }
    b.op("Softmax", {m}, {shape}, {{"axis", int64_t(3)}});
    test::requireOk(b.g.computeSemantics());
    auto f = fuseKernels(b.g, nullptr, KernelMode::NoFlash);
    REQUIRE(errorMessage(f.takeError()) == "");
    REQUIRE((*f)->numOps() == 1);
    const Op &op = (*f)->op(0);
    REQUIRE(op.kind == "FusedSoftmax");
    CHECK(op.getString("kinds", "") ==
          (mask == "where" ? "Mul,Where,Softmax" : "Mul,Add,Softmax"));
    CHECK(errorMessage(findKernel(op.kind)->check(**f, op)) == "");
    CHECK(op.sem.loops[3].statReduced);

    Rng rng(17, mask);
    std::vector<Buf> in;
    std::map<std::string, Buf> vals;
    for (size_t i = 0; i < op.inputs.size(); ++i) {
      in.push_back(inputOf(**f, op, i, rng));
      vals[(*f)->value(op.inputs[i]).name] = in.back();
    }
    std::vector<float> r(size_t(2 * 3 * 5 * 6));
    for (float &v : r)
      v = float(2 * rng.uniformReal() - 1);

    // Eager: each member forward in turn, then backward in reverse, the
    // gradients of the values by name.
    std::vector<std::vector<Buf>> eagerIn;
    for (const Op &e : b.g.ops()) {
      std::vector<Buf> ein;
      for (ValueId v : e.inputs) {
        const Value &val = b.g.value(v);
        auto it = vals.find(val.name);
        ein.push_back(it != vals.end() ? it->second : constantBuf(val));
      }
      vals[b.g.value(e.outputs[0]).name] = run(b.g, e, ein).out[0];
      eagerIn.push_back(std::move(ein));
    }
    std::map<std::string, std::vector<float>> grads;
    grads[b.g.value(b.g.op(2).outputs[0]).name] = r;
    for (size_t o = b.g.numOps(); o-- > 0;) {
      const Op &e = b.g.op(OpId(o));
      Task et = run(b.g, e, eagerIn[o], &grads[b.g.value(e.outputs[0]).name]);
      for (size_t i = 0; i < e.inputs.size(); ++i) {
        if (et.gin[i].data.empty())
          continue;
        std::vector<float> &gi = grads[b.g.value(e.inputs[i]).name];
        gi.resize(et.gin[i].size(), 0.0f);
        for (size_t k = 0; k < gi.size(); ++k)
          gi[k] += et.gin[i].data[k];
      }
    }
    const Buf &eagerOut = vals[b.g.value(b.g.op(2).outputs[0]).name];

    Task t = run(**f, op, in, &r);
    CHECK(maxDiff(t.out[0], eagerOut) <= 1e-6f);
    size_t grads0 = 0;
    for (size_t i = 0; i < op.inputs.size(); ++i) {
      const std::string &name = (*f)->value(op.inputs[i]).name;
      if (t.gin[i].data.empty()) {
        CHECK(grads.count(name) == 0);
        continue;
      }
      ++grads0;
      Buf eg;
      eg.reset(t.gin[i].box);
      eg.data.assign(grads[name].begin(), grads[name].end());
      INFO("input " << name);
      CHECK(maxDiff(t.gin[i], eg) <= 1e-6f);
    }
    CHECK(grads0 == (mask == "add" ? 2u : 1u));
    checkGradient(**f, op, rng);

    // The softmax axis split over two tiles: the row statistics combined.
    Buf out;
    std::vector<Buf> gin;
    runSplit(**f, op, in, r, out, gin);
    CHECK(maxDiff(out, t.out[0]) <= 1e-6f);
    for (size_t i = 0; i < op.inputs.size(); ++i)
      if (!t.gin[i].data.empty())
        CHECK(maxDiff(gin[i], t.gin[i]) <= 1e-6f);
  }
}
