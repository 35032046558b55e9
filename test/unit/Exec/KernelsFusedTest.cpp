// lib/Exec's fused kernels (KernelsFused.cpp, KernelsAttention.cpp): a
// FusedElementwise op computes what its eager members compute run one after
// the other; FlashAttention computes softmax(scale Q Kᵀ + mask) V as a
// direct computation in double does, for permuted layouts, a causal mask
// and an added mask; backward of both matches the finite differences of
// forward along a random direction.
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
