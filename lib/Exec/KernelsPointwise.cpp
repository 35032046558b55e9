// Element-wise ops with numpy broadcasting, and Dropout with a mask drawn
// from the seed and the global element index. The loop space is the output;
// an input broadcast along a loop accumulates its gradient over it.
#include "ElementwiseMath.h"
#include "Kernels.h"

#include "soap/Support/Error.h"
#include "soap/Support/Rng.h"
#include <cmath>

namespace soap {
namespace exec {

namespace {

using Fn = ElemFn;

Fn fnOf(llvm::StringRef kind) {
  return elemFnOf(std::string_view(kind.data(), kind.size()))
      .value_or(Fn::Identity);
}

size_t numData(const Op &op) {
  return op.kind == "Expand" ? 1 : op.inputs.size();
}

using Params = ElemParams;

Params params(const Graph &g, const Op &op) {
  Params p;
  p.fn = fnOf(op.kind);
  ElemScalars sc = elemScalars(p.fn, [&](const char *name, double dflt) {
    return op.getFloat(name, dflt);
  });
  p.alpha = sc.a;
  p.beta = sc.b;
  if (p.fn == Fn::Cast) {
    DType t = g.value(op.outputs[0]).dtype;
    p.toBool = t == DType::Bool;
    p.toInt = !isFloating(t) && !p.toBool;
  }
  return p;
}

float apply(const Params &p, const float *x) { return elemApply(p, x); }

float partial(const Params &p, const float *x, float y, size_t i) {
  return elemPartial(p, x, y, i);
}

llvm::Error checkElementwise(const Graph &g, const Op &op) {
  if (op.kind == "Gelu" && op.getString("approximate", "none") != "none")
    return inputError("Gelu approximate='{}' is not supported",
                      op.getString("approximate", "none"));
  if (numData(op) > 3)
    return inputError("more than 3 operands");
  return llvm::Error::success();
}

std::vector<Operand> operands(const Op &op, const Task &t) {
  std::vector<Operand> ops{{&op.sem.outputs[0], t.out[0].box}};
  for (size_t i = 0; i < numData(op); ++i)
    ops.push_back({&op.sem.inputs[i], t.in[i].box});
  return ops;
}

/// y = op(x0[, x1]) along a row of unit steps (or 0 where broadcast).
template <class Op>
void unitRow(float *y, const float *x0, int64_t s0, const float *x1, int64_t s1,
             int64_t n, Op op) {
  if (s0 == 1 && s1 == 1)
    for (int64_t k = 0; k < n; ++k)
      y[k] = op(x0[k], x1[k]);
  else
    for (int64_t k = 0; k < n; ++k)
      y[k] = op(x0[k * s0], x1[k * s1]);
}

/// The common functions as tight loops over a row whose output steps by
/// one; false for the others (the caller's generic loop).
bool fastForward(Fn fn, float *y, const float *const *x, const int64_t *st,
                 int64_t n) {
  switch (fn) {
  case Fn::Add:
    unitRow(y, x[0], st[1], x[1], st[2], n,
            [](float a, float b) { return a + b; });
    return true;
  case Fn::Sub:
    unitRow(y, x[0], st[1], x[1], st[2], n,
            [](float a, float b) { return a - b; });
    return true;
  case Fn::Mul:
    unitRow(y, x[0], st[1], x[1], st[2], n,
            [](float a, float b) { return a * b; });
    return true;
  case Fn::Relu:
    unitRow(y, x[0], st[1], x[0], st[1], n,
            [](float a, float) { return a > 0 ? a : 0.0f; });
    return true;
  default:
    return false;
  }
}

void eltForward(KernelCtx &ctx) {
  Params p = params(ctx.graph, ctx.op);
  size_t n = numData(ctx.op);
  bool fastFn = n <= 2 && (p.fn == Fn::Add || p.fn == Fn::Sub ||
                           p.fn == Fn::Mul || p.fn == Fn::Relu);
  for (Task &t : ctx.tasks) {
    PointIter it(ctx.op.sem, operands(ctx.op, t));
    float *y = t.out[0].data.data();
    float x[3] = {0, 0, 0};
    it.runRows(t.loops, [&](const int64_t *o, const int64_t *st, int64_t cnt) {
      if (fastFn && st[0] == 1) {
        const float *xp[2] = {t.in[0].data.data() + o[1],
                              n > 1 ? t.in[1].data.data() + o[2] : nullptr};
        if (fastForward(p.fn, y + o[0], xp, st, cnt))
          return;
      }
      for (int64_t k = 0; k < cnt; ++k) {
        for (size_t i = 0; i < n; ++i)
          x[i] = t.in[i].data[o[1 + i] + st[1 + i] * k];
        y[o[0] + st[0] * k] = apply(p, x);
      }
    });
  }
}

void eltBackward(KernelCtx &ctx) {
  Params p = params(ctx.graph, ctx.op);
  size_t n = numData(ctx.op);
  for (Task &t : ctx.tasks) {
    PointIter it(ctx.op.sem, operands(ctx.op, t));
    const float *y = t.out[0].data.data(), *dy = t.gout[0].data.data();
    float x[3] = {0, 0, 0};
    bool want[3] = {false, false, false};
    for (size_t i = 0; i < n; ++i)
      want[i] = !t.gin[i].data.empty();
    it.runRows(t.loops, [&](const int64_t *o, const int64_t *st, int64_t cnt) {
      // The common cases as tight loops: gradients of sums pass dy
      // through (accumulating over a broadcast input's zero step), and a
      // Relu passes it where its output is positive.
      if (st[0] == 1 && (p.fn == Fn::Add || p.fn == Fn::Sub)) {
        for (size_t i = 0; i < n; ++i) {
          if (!want[i])
            continue;
          float sign = p.fn == Fn::Sub && i == 1 ? -1.0f : 1.0f;
          float *g = t.gin[i].data.data() + o[1 + i];
          int64_t s = st[1 + i];
          for (int64_t k = 0; k < cnt; ++k)
            g[k * s] += sign * dy[o[0] + k];
        }
        return;
      }
      if (st[0] == 1 && st[1] == 1 && p.fn == Fn::Relu && want[0]) {
        float *g = t.gin[0].data.data() + o[1];
        const float *yo = y + o[0], *d = dy + o[0];
        for (int64_t k = 0; k < cnt; ++k)
          g[k] += yo[k] > 0 ? d[k] : 0.0f;
        return;
      }
      for (int64_t k = 0; k < cnt; ++k) {
        int64_t yo = o[0] + st[0] * k;
        for (size_t i = 0; i < n; ++i)
          x[i] = t.in[i].data[o[1 + i] + st[1 + i] * k];
        for (size_t i = 0; i < n; ++i)
          if (want[i])
            t.gin[i].data[o[1 + i] + st[1 + i] * k] +=
                partial(p, x, y[yo], i) * dy[yo];
      }
    });
  }
}

// --- Dropout -------------------------------------------------------------

/// The ratio and whether the op drops at all (training_mode and ratio > 0).
/// The importer keeps only Dropout's data operand and turns ONNX's ratio
/// and training_mode (constants it requires) into attributes, with ONNX's
/// defaults: 0.5, and no training (the identity).
std::pair<float, bool> dropoutRatio(const Op &op) {
  float ratio = static_cast<float>(op.getFloat("ratio", 0.5));
  bool training = op.getInt("training_mode", 0) != 0;
  return {ratio, training && ratio > 0};
}

llvm::Error checkDropout(const Graph &, const Op &op) {
  auto [ratio, on] = dropoutRatio(op);
  if (ratio < 0 || ratio >= 1)
    return inputError("Dropout ratio {} is outside [0, 1)", ratio);
  return llvm::Error::success();
}

/// Calls f(outputOffset, inputOffset, keep) for every point of the task.
template <class F> void dropoutWalk(KernelCtx &ctx, Task &t, F f) {
  const OpSemantics &sem = ctx.op.sem;
  // No bindings: the lambda below captures them.
  const auto dropout = dropoutRatio(ctx.op);
  const auto ratio = dropout.first;
  const bool on = dropout.second;
  const Value &y = ctx.graph.value(ctx.op.outputs[0]);
  // The output map over the whole tensor: its offset is the global index.
  Box whole = Box::full(y.shape.dims);
  PointIter it(sem, {{&sem.outputs[0], t.out[0].box},
                     {&sem.inputs[0], t.in[0].box},
                     {&sem.outputs[0], whole}});
  uint64_t stream = fnv1a(ctx.op.name) ^
                    (static_cast<uint64_t>(ctx.step) * 0x9E3779B97F4A7C15ull);
  it.run(t.loops, [&](const int64_t *o) {
    bool keep = !on || hashUniform(ctx.seed, stream,
                                   static_cast<uint64_t>(o[2])) >= ratio;
    f(o[0], o[1], keep);
  });
}

float dropoutScale(const Op &op) {
  auto [ratio, on] = dropoutRatio(op);
  return on ? 1 / (1 - ratio) : 1.0f;
}

// Forward draws the mask and keeps it, a byte per output element (what the
// semantics count Dropout as saving, and what PyTorch's dropout keeps);
// backward reads it, not the output or the seed.
void dropoutForward(KernelCtx &ctx) {
  float s = dropoutScale(ctx.op);
  bool mask = ctx.op.outputs.size() > 1 && ctx.op.outputs[1] != kNoValue;
  for (Task &t : ctx.tasks) {
    t.mask.assign(t.out[0].data.size(), 0);
    dropoutWalk(ctx, t, [&](int64_t yo, int64_t xo, bool keep) {
      t.out[0].data[yo] = keep ? t.in[0].data[xo] * s : 0.0f;
      t.mask[size_t(yo)] = keep;
      if (mask)
        t.out[1].data[yo] = keep;
    });
  }
}

void dropoutBackward(KernelCtx &ctx) {
  float s = dropoutScale(ctx.op);
  for (Task &t : ctx.tasks) {
    // The output box's points in order, as forward wrote the mask.
    PointIter it(ctx.op.sem, {{&ctx.op.sem.outputs[0], t.gout[0].box},
                              {&ctx.op.sem.inputs[0], t.gin[0].box}});
    it.run(t.loops, [&](const int64_t *o) {
      if (t.mask[size_t(o[0])])
        t.gin[0].data[o[1]] += t.gout[0].data[o[0]] * s;
    });
  }
}

const Kernel kElementwise = {checkElementwise, eltForward, eltBackward, true};
const Kernel kDropout = {checkDropout, dropoutForward, dropoutBackward};

} // namespace

const Kernel *findPointwiseKernel(llvm::StringRef kind) {
  if (kind == "Dropout")
    return &kDropout;
  if (elemFnOf(std::string_view(kind.data(), kind.size())))
    return &kElementwise;
  return nullptr;
}

} // namespace exec
} // namespace soap
