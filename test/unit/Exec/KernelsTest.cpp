// lib/Exec kernels: every op of the test models, run as one whole tile,
// has a backward pass that matches central finite differences of its
// forward pass along a random direction; a few forward results by hand.
#include "Exec/Kernels.h"
#include "../IR/TestGraphs.h"
#include "../TestInputs.h"
#include "soap/Exec/Executor.h"
#include "soap/Support/Rng.h"
#include <cmath>

using namespace soap;
using namespace soap::exec;

namespace {

/// One task holds whole rows: nothing to combine.
class NoStats : public StatsExchange {
public:
  void allReduce(const std::vector<bool> &, std::vector<Buf *> &,
                 Combine) override {}
  void allGather(const std::vector<bool> &, int, std::vector<Buf *> &,
                 bool) override {}
};

/// A whole-tile task of `op` with seeded inputs (integers within the range
/// their consumer indexes).
Task wholeTask(const Graph &g, const Op &op, Rng &rng) {
  Task t;
  t.loops = op.sem.fullTile();
  t.in.resize(op.inputs.size());
  t.out.resize(op.outputs.size());
  for (size_t i = 0; i < op.inputs.size(); ++i) {
    if (op.inputs[i] == kNoValue)
      continue;
    const Value &v = g.value(op.inputs[i]);
    Buf &b = t.in[i];
    b.reset(op.sem.inputRegion(static_cast<int>(i), t.loops));
    int64_t range = 0;
    if (op.kind == "SoftmaxCrossEntropyLoss" && i == 1)
      range = g.value(op.inputs[0])
                  .shape[static_cast<size_t>(op.getInt("class_axis", 1))];
    if (op.kind == "Gather" && i == 1)
      range = g.value(op.inputs[0]).shape[0];
    for (size_t k = 0; k < b.size(); ++k) {
      if (v.kind == ValueKind::Constant)
        b.data[k] =
            static_cast<float>(v.data.size() == 1 ? v.data[0] : v.data[k]);
      else if (range > 0)
        b.data[k] = static_cast<float>(rng.uniform(range));
      else
        b.data[k] = static_cast<float>(2 * rng.uniformReal() - 1);
    }
    // Where a function has a pole or a branch point at 0, stay in [0.5, 1.5].
    if (op.kind == "Log" || op.kind == "Sqrt" || op.kind == "Reciprocal" ||
        op.kind == "Pow" || (op.kind == "Div" && i == 1))
      for (float &x : b.data)
        x = 1 + 0.5f * x;
    // Keep clear of a kink that a finite difference would straddle.
    if (op.kind == "Relu" || op.kind == "LeakyRelu" || op.kind == "Abs")
      for (float &x : b.data)
        x = x < 0 ? x - 0.1f : x + 0.1f;
    // Distinct values 0.05 apart: no window's maximum changes hands.
    if (llvm::StringRef(op.kind).endswith("MaxPool") && i == 0) {
      std::vector<size_t> perm(b.size());
      for (size_t k = 0; k < perm.size(); ++k)
        perm[k] = k;
      for (size_t k = perm.size(); k > 1; --k)
        std::swap(perm[k - 1], perm[rng.uniform(k)]);
      for (size_t k = 0; k < perm.size(); ++k)
        b.data[k] = 0.05f * static_cast<float>(perm[k]);
    }
  }
  return t;
}

void runForward(const Graph &g, const Op &op, Task &t) {
  for (size_t j = 0; j < op.outputs.size(); ++j)
    if (op.outputs[j] != kNoValue)
      t.out[j].reset(op.sem.outputRegion(static_cast<int>(j), t.loops));
  std::vector<Task> ts{t};
  NoStats ns;
  KernelCtx ctx{g, op, ts, ns, 1, 0};
  findKernel(op.kind)->forward(ctx);
  t = std::move(ts[0]);
}

/// sum over outputs of out * r, in double.
double objective(const Task &t, const std::vector<std::vector<float>> &r) {
  double s = 0;
  for (size_t j = 0; j < r.size(); ++j)
    for (size_t k = 0; k < r[j].size(); ++k)
      s += static_cast<double>(t.out[j].data[k]) * r[j][k];
  return s;
}

void checkGradients(const std::string &model, const Graph *given = nullptr) {
  std::unique_ptr<Graph> loaded;
  if (!given)
    loaded = test::zooModel(model, 2);
  const Graph *g = given ? given : loaded.get();
  Rng rng(5, model);
  for (const Op &op : g->ops()) {
    INFO(model << ": " << op.name << " (" << op.kind << ")");
    REQUIRE(findKernel(op.kind));
    Task t = wholeTask(*g, op, rng);
    runForward(*g, op, t);
    // Random output weights r (only output 0 carries a gradient).
    std::vector<std::vector<float>> r(1);
    r[0].resize(t.out[0].size());
    for (float &x : r[0])
      x = static_cast<float>(2 * rng.uniformReal() - 1);
    t.gout.resize(op.outputs.size());
    for (size_t j = 0; j < op.outputs.size(); ++j)
      t.gout[j].reset(t.out[j].box);
    t.gout[0].data = r[0];
    t.gin.resize(op.inputs.size());
    std::vector<int> diff; // inputs that carry a gradient
    for (size_t i = 0; i < op.inputs.size(); ++i) {
      if (op.inputs[i] == kNoValue)
        continue;
      t.gin[i].reset(t.in[i].box);
      const Value &v = g->value(op.inputs[i]);
      if (isFloating(v.dtype) &&
          (v.kind == ValueKind::Weight || v.kind == ValueKind::Activation))
        diff.push_back(static_cast<int>(i));
    }
    {
      std::vector<Task> ts{t};
      NoStats ns;
      KernelCtx ctx{*g, op, ts, ns, 1, 0};
      findKernel(op.kind)->backward(ctx);
      t = std::move(ts[0]);
    }
    if (diff.empty())
      continue;
    // Direction v over every differentiable input; <grad, v> against
    // (L(x + eps v) - L(x - eps v)) / 2 eps.
    const float eps = 1e-2f;
    double analytic = 0;
    std::vector<std::vector<float>> dir(op.inputs.size());
    for (int i : diff) {
      dir[i].resize(t.in[i].size());
      for (size_t k = 0; k < dir[i].size(); ++k) {
        dir[i][k] = static_cast<float>(2 * rng.uniformReal() - 1);
        analytic += static_cast<double>(t.gin[i].data[k]) * dir[i][k];
      }
    }
    auto shifted = [&](float sign) {
      Task s = t;
      for (int i : diff)
        for (size_t k = 0; k < dir[i].size(); ++k)
          s.in[i].data[k] += sign * eps * dir[i][k];
      runForward(*g, op, s);
      return objective(s, r);
    };
    double numeric = (shifted(1) - shifted(-1)) / (2 * eps);
    CHECK(std::fabs(numeric - analytic) <=
          2e-2 * std::max(1.0, std::fabs(analytic)));
  }
}

const Op &firstOf(const Graph &g, llvm::StringRef kind) {
  for (const Op &op : g.ops())
    if (op.kind == kind)
      return op;
  FAIL("no " << kind.str());
  return g.op(0);
}

} // namespace

TEST_CASE("Exec kernels: backward matches finite differences",
          "[exec][kernels]") {
  for (const char *m :
       {"mlp_small", "lenet", "resnet_small", "transformer_small"})
    checkGradients(m);
}

TEST_CASE("Exec kernels: backward matches finite differences, other kinds",
          "[exec][kernels]") {
  using test::Ints;
  test::GraphBuilder b;
  ValueId x = b.input({2, 4, 6, 6}), y = b.input({2, 4, 6, 6});
  ValueId cond = b.input({2, 4, 6, 6}, DType::Bool);
  b.op("AveragePool", {x}, {{2, 4, 6, 6}},
       {{"kernel_shape", Ints{3, 3}}, {"pads", Ints{1, 1, 1, 1}}});
  b.op("AveragePool", {x}, {{2, 4, 3, 3}},
       {{"kernel_shape", Ints{3, 3}},
        {"strides", Ints{2, 2}},
        {"pads", Ints{1, 1, 1, 1}},
        {"count_include_pad", int64_t(1)}});
  b.op("MaxPool", {x}, {{2, 4, 3, 3}},
       {{"kernel_shape", Ints{3, 3}},
        {"strides", Ints{2, 2}},
        {"pads", Ints{1, 1, 1, 1}}});
  b.op("GlobalMaxPool", {x}, {{2, 4, 1, 1}});
  b.op("Concat", {x, y}, {{2, 8, 6, 6}}, {{"axis", int64_t(1)}});
  b.op("Split", {x}, {{2, 1, 6, 6}, {2, 3, 6, 6}}, {{"axis", int64_t(1)}});
  b.op("Slice", {x}, {{2, 2, 6, 3}},
       {{"starts", Ints{0, 1, 0, 5}}, {"steps", Ints{1, 2, 1, -2}}});
  b.op("Pad", {x}, {{2, 4, 8, 7}}, {{"pads", Ints{0, 0, 1, 0, 0, 0, 1, 1}}});
  b.op("Transpose", {x}, {{2, 6, 6, 4}}, {{"perm", Ints{0, 2, 3, 1}}});
  b.op("LogSoftmax", {x}, {{2, 4, 6, 6}}, {{"axis", int64_t(1)}});
  b.op("ReduceMean", {x}, {{2, 4, 1, 1}},
       {{"axes", Ints{2, 3}}, {"keepdims", int64_t(1)}});
  b.op("ReduceSum", {x}, {{2, 6, 6}},
       {{"axes", Ints{1}}, {"keepdims", int64_t(0)}});
  b.op("Where", {cond, x, y}, {{2, 4, 6, 6}});
  for (const char *k : {"Sub", "Div", "Max", "Min", "Pow"})
    b.op(k, {x, y}, {{2, 4, 6, 6}});
  for (const char *k : {"Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Reciprocal",
                        "Neg", "Gelu", "LeakyRelu", "Identity"})
    b.op(k, {x}, {{2, 4, 6, 6}});
  b.op("Flatten", {x}, {{2, 144}}, {{"axis", int64_t(1)}});
  test::requireOk(b.g.computeSemantics());
  checkGradients("kinds", &b.g);
}

TEST_CASE("Exec kernels: LSTM layers' backward matches finite differences",
          "[exec][kernels][lstm]") {
  using test::Ints;
  test::GraphBuilder b;
  // Weight-kind sequences and states, so their gradients are checked too.
  // A forward layer with biases and initial states, sequence first; a
  // bidirectional one, batch first, without them.
  ValueId x = b.weight({3, 2, 4});
  b.op("LSTM",
       {x, b.weight({1, 20, 4}), b.weight({1, 20, 5}), b.weight({1, 40}),
        kNoValue, b.weight({1, 2, 5}), b.weight({1, 2, 5})},
       {{3, 1, 2, 5}, {1, 2, 5}, {1, 2, 5}}, {{"hidden_size", int64_t(5)}});
  ValueId xb = b.weight({2, 3, 4});
  b.op("LSTM", {xb, b.weight({2, 12, 4}), b.weight({2, 12, 3})},
       {{2, 3, 2, 3}, {2, 2, 3}},
       {{"hidden_size", int64_t(3)},
        {"layout", int64_t(1)},
        {"direction", std::string("bidirectional")}});
  ValueId xr = b.weight({3, 2, 4});
  b.op("LSTM", {xr, b.weight({1, 8, 4}), b.weight({1, 8, 2})}, {{3, 1, 2, 2}},
       {{"hidden_size", int64_t(2)}, {"direction", std::string("reverse")}});
  test::requireOk(b.g.computeSemantics());
  checkGradients("lstm", &b.g);
}

TEST_CASE("Exec kernels: an LSTM step by hand", "[exec][kernels][lstm]") {
  // One hidden unit, one input, two steps: gates i, o, f, c from
  // W = (w_i, w_o, w_f, w_c), R likewise, biases Wb + Rb.
  test::GraphBuilder b;
  ValueId x = b.input({2, 1, 1});
  b.op("LSTM", {x, b.weight({1, 4, 1}), b.weight({1, 4, 1}), b.weight({1, 8})},
       {{2, 1, 1, 1}, {1, 1, 1}, {1, 1, 1}}, {{"hidden_size", int64_t(1)}});
  test::requireOk(b.g.computeSemantics());
  const Op &op = b.g.op(0);
  Rng rng(9);
  Task t = wholeTask(b.g, op, rng);
  runForward(b.g, op, t);
  auto sig = [](double v) { return 1 / (1 + std::exp(-v)); };
  const std::vector<float> &w = t.in[1].data, &r = t.in[2].data,
                           &bias = t.in[3].data;
  double h = 0, c = 0;
  for (int s = 0; s < 2; ++s) {
    double xs = t.in[0].data[size_t(s)];
    auto gate = [&](int k) {
      return w[size_t(k)] * xs + r[size_t(k)] * h + bias[size_t(k)] +
             bias[size_t(4 + k)];
    };
    double gi = sig(gate(0)), go = sig(gate(1)), gf = sig(gate(2)),
           gc = std::tanh(gate(3));
    c = gf * c + gi * gc;
    h = go * std::tanh(c);
    CHECK(t.out[0].data[size_t(s)] == Approx(h).epsilon(1e-5));
  }
  CHECK(t.out[1].data[0] == Approx(h).epsilon(1e-5));
  CHECK(t.out[2].data[0] == Approx(c).epsilon(1e-5));
}

TEST_CASE("Exec kernels: a convolution with padding by hand",
          "[exec][kernels]") {
  auto g = test::zooModel("resnet_small", 2);
  const Op &conv = firstOf(*g, "Conv"); // 3x3, pad 1, 3 -> 8 channels
  Rng rng(3);
  Task t = wholeTask(*g, conv, rng);
  runForward(*g, conv, t);
  const Buf &x = t.in[0], &w = t.in[1], &y = t.out[0];
  // y[n, m, i, j] = sum_c,a,b x[n, c, i + a - 1, j + b - 1] * w[m, c, a, b]
  auto at = [](const Buf &b, std::vector<int64_t> i) {
    std::vector<int64_t> s = boxStrides(b.box);
    int64_t o = 0;
    for (size_t d = 0; d < i.size(); ++d)
      o += i[d] * s[d];
    return b.data[o];
  };
  for (int64_t n : {0, 1})
    for (int64_t m : {0, 5})
      for (int64_t i : {0, 3, 7})
        for (int64_t j : {0, 7}) {
          // Float rounding follows the terms' magnitude, not the sum's
          // (the library sums in its own order): a margin of it.
          double s = 0, mag = 0;
          for (int64_t c = 0; c < 3; ++c)
            for (int64_t a = 0; a < 3; ++a)
              for (int64_t b = 0; b < 3; ++b) {
                int64_t yi = i + a - 1, xj = j + b - 1;
                if (yi >= 0 && yi < 8 && xj >= 0 && xj < 8) {
                  double term = at(x, {n, c, yi, xj}) * at(w, {m, c, a, b});
                  s += term;
                  mag += std::fabs(term);
                }
              }
          CHECK(at(y, {n, m, i, j}) ==
                Approx(s).epsilon(1e-5).margin(1e-6 * mag));
        }
}

TEST_CASE("Exec kernels: softmax rows sum to one, layer norm rows are "
          "standardised",
          "[exec][kernels]") {
  auto g = test::zooModel("transformer_small", 2);
  Rng rng(4);
  const Op &sm = firstOf(*g, "Softmax");
  Task t = wholeTask(*g, sm, rng);
  runForward(*g, sm, t);
  int64_t row = t.out[0].box.hi.back();
  for (size_t r = 0; r < t.out[0].size(); r += row) {
    double s = 0;
    for (int64_t k = 0; k < row; ++k)
      s += t.out[0].data[r + k];
    CHECK(s == Approx(1).epsilon(1e-5));
  }
  const Op &ln = firstOf(*g, "LayerNormalization");
  Task u = wholeTask(*g, ln, rng);
  // Scale 1, bias 0: the output is (x - mean) / std per row.
  std::fill(u.in[1].data.begin(), u.in[1].data.end(), 1.0f);
  std::fill(u.in[2].data.begin(), u.in[2].data.end(), 0.0f);
  runForward(*g, ln, u);
  int64_t h = u.out[0].box.hi.back();
  for (size_t r = 0; r < u.out[0].size(); r += h) {
    double s = 0, q = 0;
    for (int64_t k = 0; k < h; ++k) {
      s += u.out[0].data[r + k];
      q += u.out[0].data[r + k] * u.out[0].data[r + k];
    }
    CHECK(std::fabs(s / h) < 1e-5);
    CHECK(q / h == Approx(1).epsilon(1e-3));
  }
}

TEST_CASE("Exec: every op of the zoo's CNNs, MLP, BERT and LSTMs has a "
          "kernel; not GPT-2's mask the importer keeps no data of",
          "[exec][kernels]") {
  for (const char *m :
       {"lenet", "alexnet", "vgg16", "resnet101", "inception_v3",
        "wide_resnet101_2", "mlp", "transformer", "rnntc", "rnnlm", "nmt"}) {
    INFO(m);
    auto g = test::zooModel(m, 2);
    llvm::Error err = checkExecutable(*g);
    CHECK(errorMessage(std::move(err)) == "");
  }
  // The 1024x1024 causal mask is folded to a constant larger than the
  // importer keeps the values of.
  auto g = test::zooModel("gpt2", 2);
  CHECK(llvm::StringRef(errorMessage(checkExecutable(*g)))
            .contains("constant '/Trilu_output_0' has no known data"));
}

TEST_CASE("Exec kernels: an imported training-mode Dropout drops about its "
          "ratio and scales the rest; without training it is the identity",
          "[exec][kernels]") {
  // The importer turns ONNX's ratio and training_mode operands into
  // attributes; the kernel read only operands, and so never dropped.
  auto g = test::zooModel("transformer_small", 64);
  Op op = firstOf(*g, "Dropout");
  REQUIRE(op.getInt("training_mode", 0) == 1);
  double ratio = op.getFloat("ratio", 0.5);
  REQUIRE(ratio > 0);
  Rng rng(9);
  Task t = wholeTask(*g, op, rng);
  runForward(*g, op, t);
  size_t zeros = 0, n = t.out[0].size();
  for (size_t k = 0; k < n; ++k) {
    if (t.out[0].data[k] == 0) {
      ++zeros;
      continue;
    }
    CHECK(t.out[0].data[k] ==
          Approx(t.in[0].data[k] / (1 - ratio)).epsilon(1e-6));
  }
  INFO(zeros << " of " << n << " dropped at ratio " << ratio);
  // 8,192 elements: ratio +- 5 standard deviations.
  double sd = std::sqrt(ratio * (1 - ratio) / double(n));
  CHECK(std::fabs(double(zeros) / double(n) - ratio) < 5 * sd);
  op.attrs["training_mode"] = int64_t(0);
  Task u = wholeTask(*g, op, rng);
  runForward(*g, op, u);
  CHECK(u.out[0].data == u.in[0].data);
}
