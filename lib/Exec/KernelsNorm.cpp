// Ops that reduce for statistics: BatchNormalization (training mode,
// synchronised), LayerNormalization, RMSNormalization, Softmax/LogSoftmax
// and the softmax cross-entropy loss. Statistics are kept per "row" (the loops that are not
// statReduced); a tile split along a statReduced loop holds partial
// statistics, and the StatsExchange combines them among the tiles that share
// the rows (the simulator's "Statistics" all-reduce) before they are used.
#include "Kernels.h"

#include "soap/Support/Error.h"
#include <cmath>
#include <limits>

namespace soap {
namespace exec {

namespace {

std::vector<bool> rowsKeep(const OpSemantics &sem) {
  std::vector<bool> keep = statMask(sem);
  keep.flip();
  return keep;
}

double statCount(const OpSemantics &sem) {
  double n = 1;
  for (const LoopDim &l : sem.loops)
    if (l.statReduced)
      n *= static_cast<double>(l.size);
  return n;
}

/// Per-task row buffers, reset to `init`.
std::vector<Buf> rowBufs(KernelCtx &ctx, const std::vector<bool> &keep,
                         float init) {
  std::vector<Buf> b(ctx.tasks.size());
  for (size_t k = 0; k < ctx.tasks.size(); ++k)
    b[k].reset(loopSubsetBox(ctx.tasks[k].loops, keep), init);
  return b;
}

void allReduce(KernelCtx &ctx, const std::vector<bool> &keep,
               std::vector<Buf> &bufs, Combine c) {
  std::vector<Buf *> p;
  for (Buf &b : bufs)
    p.push_back(&b);
  ctx.stats.allReduce(keep, p, c);
}

// --- BatchNormalization, LayerNormalization, RMSNormalization -----------

bool isBatchNorm(const Op &op) { return op.kind == "BatchNormalization"; }
/// RMSNorm: no mean is subtracted (it stays 0), no bias, the scale is
/// optional (1 without it).
bool isRmsNorm(const Op &op) { return op.kind == "RMSNormalization"; }

llvm::Error checkNorm(const Graph &g, const Op &op) {
  if (isBatchNorm(op)) {
    // training_mode = 0 (an eval export at opset >= 14; opset <= 13 eval
    // exports do not say) is trained as the simulator models every
    // BatchNormalization: batch statistics, synchronised over the tiles
    // that share a channel, as PyTorch's model.train() computes. The
    // running mean and variance are inputs nothing updates.
    for (size_t j = 1; j < op.outputs.size(); ++j)
      if (op.outputs[j] != kNoValue && !g.value(op.outputs[j]).users.empty())
        return inputError("the running statistics outputs are not supported");
  } else {
    for (size_t j = 1; j < op.outputs.size(); ++j)
      if (op.outputs[j] != kNoValue)
        return inputError("LayerNormalization's Mean and InvStdDev outputs "
                          "are not supported");
  }
  return llvm::Error::success();
}

float normEps(const Op &op) {
  return static_cast<float>(op.getFloat("epsilon", 1e-5));
}

// Operands of the normalisation walks: 0 x, 1 the row statistics, 2 y,
// then the scale (when there is one) and the bias (when there is one) at
// NormOperands' indices. Rows of the innermost loop run as strided loops
// (statistics and parameters usually step by 0 there).
struct NormOperands {
  bool rms;
  int scale = -1, bias = -1; ///< operand indices, -1 when absent

  explicit NormOperands(const Op &op) : rms(isRmsNorm(op)) {
    int next = 3;
    if (op.input(1) != kNoValue)
      scale = next++;
    if (op.input(2) != kNoValue)
      bias = next++;
  }
  PointIter iter(const OpSemantics &sem, const TensorMap &rows, Task &t,
                 const Box &rowBox) const {
    std::vector<Operand> ops{{&sem.inputs[0], t.in[0].box},
                             {&rows, rowBox},
                             {&sem.outputs[0], t.out[0].box}};
    if (scale >= 0)
      ops.push_back({&sem.inputs[1], t.in[1].box});
    if (bias >= 0)
      ops.push_back({&sem.inputs[2], t.in[2].box});
    return PointIter(sem, ops);
  }
};

/// saved[0] = mean (0 for RMSNorm), saved[1] = 1/sqrt(var + eps) (for
/// RMSNorm of the mean square), per row.
void normForward(KernelCtx &ctx) {
  const OpSemantics &sem = ctx.op.sem;
  std::vector<bool> keep = rowsKeep(sem);
  TensorMap rows = loopSubsetMap(sem, keep);
  float inv = static_cast<float>(1 / statCount(sem));
  NormOperands on(ctx.op);
  auto iter = [&](Task &t, const Buf &r) {
    return on.iter(sem, rows, t, r.box);
  };
  // Each tile's row sums run in double and are stored once as float: a
  // BatchNorm channel sums tens of thousands of elements, where a float
  // running sum loses digits that onnxruntime's and PyTorch's blocked
  // sums keep.
  auto rowSums = [&](std::vector<Buf> &sums, auto term) {
    // term(task, offset in x, offset in the rows): one element's term.
    for (size_t k = 0; k < ctx.tasks.size(); ++k) {
      Task &t = ctx.tasks[k];
      std::vector<double> acc(sums[k].data.size(), 0.0);
      iter(t, sums[k]).runRows(
          t.loops, [&](const int64_t *o, const int64_t *st, int64_t n) {
            if (st[1] == 0) {
              double a = 0;
              for (int64_t i = 0; i < n; ++i)
                a += term(t, o[0] + st[0] * i, o[1]);
              acc[size_t(o[1])] += a;
              return;
            }
            for (int64_t i = 0; i < n; ++i)
              acc[size_t(o[1] + st[1] * i)] +=
                  term(t, o[0] + st[0] * i, o[1] + st[1] * i);
          });
      for (size_t j = 0; j < acc.size(); ++j)
        sums[k].data[j] = static_cast<float>(acc[j]);
    }
  };
  std::vector<Buf> mean = rowBufs(ctx, keep, 0);
  if (!on.rms) {
    rowSums(mean, [](const Task &t, int64_t xo, int64_t) {
      return double(t.in[0].data[size_t(xo)]);
    });
    allReduce(ctx, keep, mean, Combine::Sum);
    for (Buf &m : mean)
      for (float &v : m.data)
        v *= inv;
  }
  std::vector<Buf> var = rowBufs(ctx, keep, 0);
  rowSums(var, [&](const Task &t, int64_t xo, int64_t ro) {
    const Buf &m = mean[size_t(&t - ctx.tasks.data())];
    float d = t.in[0].data[size_t(xo)] - m.data[size_t(ro)];
    return double(d) * double(d);
  });
  allReduce(ctx, keep, var, Combine::Sum);
  float eps = normEps(ctx.op);
  for (size_t k = 0; k < ctx.tasks.size(); ++k) {
    Task &t = ctx.tasks[k];
    for (float &v : var[k].data)
      v = 1 / std::sqrt(v * inv + eps);
    const float *x = t.in[0].data.data(), *m = mean[k].data.data(),
                *r = var[k].data.data();
    const float *sc = on.scale >= 0 ? t.in[1].data.data() : nullptr;
    const float *b = on.bias >= 0 ? t.in[2].data.data() : nullptr;
    int si = on.scale, bi = on.bias;
    float *y = t.out[0].data.data();
    iter(t, var[k]).runRows(
        t.loops, [&](const int64_t *o, const int64_t *st, int64_t n) {
          for (int64_t i = 0; i < n; ++i) {
            int64_t ro = o[1] + st[1] * i;
            float xhat = (x[o[0] + st[0] * i] - m[ro]) * r[ro];
            float v = sc ? xhat * sc[o[si] + st[si] * i] : xhat;
            y[o[2] + st[2] * i] = b ? v + b[o[bi] + st[bi] * i] : v;
          }
        });
    t.saved = {std::move(mean[k]), std::move(var[k])};
  }
}

/// LayerNorm and BatchNorm: dx = rstd (g - mean(g) - xhat mean(g xhat));
/// RMSNorm (no mean subtracted): dx = rstd (g - xhat mean(g xhat)), with
/// g = dy scale.
void normBackward(KernelCtx &ctx) {
  const OpSemantics &sem = ctx.op.sem;
  std::vector<bool> keep = rowsKeep(sem);
  TensorMap rows = loopSubsetMap(sem, keep);
  float inv = static_cast<float>(1 / statCount(sem));
  NormOperands on(ctx.op);
  int si = on.scale, bi = on.bias;
  auto iter = [&](Task &t) { return on.iter(sem, rows, t, t.saved[0].box); };
  // s1 = sum of dxhat, s2 = sum of dxhat * xhat, per row; they and the
  // scale's and bias's gradients are summed in double (as the forward's
  // statistics) and added once.
  std::vector<Buf> s1 = rowBufs(ctx, keep, 0), s2 = rowBufs(ctx, keep, 0);
  for (size_t k = 0; k < ctx.tasks.size(); ++k) {
    Task &t = ctx.tasks[k];
    const float *mean = t.saved[0].data.data(), *rstd = t.saved[1].data.data();
    const float *x = t.in[0].data.data(), *dy = t.gout[0].data.data();
    const float *sc = si >= 0 ? t.in[1].data.data() : nullptr;
    std::vector<double> a1(s1[k].size(), 0.0), a2(s2[k].size(), 0.0);
    std::vector<double> dsc(si >= 0 ? t.gin[1].size() : 0, 0.0);
    std::vector<double> db(bi >= 0 ? t.gin[2].size() : 0, 0.0);
    iter(t).runRows(
        t.loops, [&](const int64_t *o, const int64_t *st, int64_t n) {
          for (int64_t i = 0; i < n; ++i) {
            size_t ro = size_t(o[1] + st[1] * i);
            float d = dy[o[2] + st[2] * i];
            float xhat = (x[o[0] + st[0] * i] - mean[ro]) * rstd[ro];
            float g = sc ? d * sc[o[si] + st[si] * i] : d;
            a1[ro] += g;
            a2[ro] += double(g) * double(xhat);
            if (sc)
              dsc[size_t(o[si] + st[si] * i)] += double(d) * double(xhat);
            if (bi >= 0)
              db[size_t(o[bi] + st[bi] * i)] += d;
          }
        });
    for (size_t j = 0; j < a1.size(); ++j) {
      s1[k].data[j] = static_cast<float>(a1[j]);
      s2[k].data[j] = static_cast<float>(a2[j]);
    }
    for (size_t j = 0; j < dsc.size(); ++j)
      t.gin[1].data[j] += static_cast<float>(dsc[j]);
    for (size_t j = 0; j < db.size(); ++j)
      t.gin[2].data[j] += static_cast<float>(db[j]);
  }
  if (!on.rms)
    allReduce(ctx, keep, s1, Combine::Sum);
  allReduce(ctx, keep, s2, Combine::Sum);
  for (size_t k = 0; k < ctx.tasks.size(); ++k) {
    Task &t = ctx.tasks[k];
    const float *mean = t.saved[0].data.data(), *rstd = t.saved[1].data.data();
    const float *x = t.in[0].data.data(), *dy = t.gout[0].data.data();
    const float *sc = si >= 0 ? t.in[1].data.data() : nullptr;
    const float *a1 = s1[k].data.data(), *a2 = s2[k].data.data();
    float *dx = t.gin[0].data.data();
    float centre = on.rms ? 0.0f : inv;
    iter(t).runRows(
        t.loops, [&](const int64_t *o, const int64_t *st, int64_t n) {
          for (int64_t i = 0; i < n; ++i) {
            int64_t ro = o[1] + st[1] * i;
            float xhat = (x[o[0] + st[0] * i] - mean[ro]) * rstd[ro];
            float d = dy[o[2] + st[2] * i];
            float g = sc ? d * sc[o[si] + st[si] * i] : d;
            dx[o[0] + st[0] * i] +=
                rstd[ro] * (g - a1[ro] * centre - xhat * a2[ro] * inv);
          }
        });
  }
}

// --- Softmax, LogSoftmax --------------------------------------------------

llvm::Error checkSoftmax(const Graph &g, const Op &op) {
  return llvm::Error::success();
}

/// Row maxima and sums of exp(x - max), combined over the row's tiles; x
/// of task k is x[k], read through xMap.
void softmaxStats(KernelCtx &ctx, const std::vector<bool> &keep,
                  const TensorMap &rows, const TensorMap &xMap,
                  const std::vector<const Buf *> &x, std::vector<Buf> &mx,
                  std::vector<Buf> &sum) {
  const OpSemantics &sem = ctx.op.sem;
  mx = rowBufs(ctx, keep, -std::numeric_limits<float>::infinity());
  sum = rowBufs(ctx, keep, 0);
  for (size_t k = 0; k < ctx.tasks.size(); ++k) {
    Task &t = ctx.tasks[k];
    PointIter it(sem, {{&xMap, x[k]->box}, {&rows, mx[k].box}});
    it.run(t.loops, [&](const int64_t *o) {
      mx[k].data[o[1]] = std::max(mx[k].data[o[1]], x[k]->data[o[0]]);
    });
  }
  allReduce(ctx, keep, mx, Combine::Max);
  for (size_t k = 0; k < ctx.tasks.size(); ++k) {
    Task &t = ctx.tasks[k];
    PointIter it(sem, {{&xMap, x[k]->box}, {&rows, mx[k].box}});
    it.run(t.loops, [&](const int64_t *o) {
      sum[k].data[o[1]] += std::exp(x[k]->data[o[0]] - mx[k].data[o[1]]);
    });
  }
  allReduce(ctx, keep, sum, Combine::Sum);
}

void softmaxForward(KernelCtx &ctx) {
  std::vector<const Buf *> x;
  for (Task &t : ctx.tasks)
    x.push_back(&t.in[0]);
  softmaxRows(ctx, ctx.op.sem.inputs[0], x, ctx.op.kind == "LogSoftmax");
}

void softmaxBackward(KernelCtx &ctx) {
  std::vector<Buf *> dx;
  for (Task &t : ctx.tasks)
    dx.push_back(&t.gin[0]);
  softmaxRowsBackward(ctx, ctx.op.sem.inputs[0], dx,
                      ctx.op.kind == "LogSoftmax");
}

// --- SoftmaxCrossEntropyLoss ------------------------------------------------

llvm::Error checkLoss(const Graph &g, const Op &op) {
  std::string r = op.getString("reduction", "mean");
  if (r != "mean" && r != "sum")
    return inputError("reduction '{}' is not supported (mean, sum)", r);
  if (op.hasAttr("ignore_index"))
    return inputError("ignore_index is not supported");
  if (op.input(2) != kNoValue)
    return inputError("class weights are not supported");
  if (op.output(1) != kNoValue)
    return inputError("the log_prob output is not supported");
  return llvm::Error::success();
}

int classLoop(const OpSemantics &sem) {
  for (size_t l = 0; l < sem.loops.size(); ++l)
    if (sem.loops[l].statReduced)
      return static_cast<int>(l);
  return 1;
}

float lossScale(const Op &op) {
  if (op.getString("reduction", "mean") != "mean")
    return 1;
  double n = 1;
  for (size_t l = 0; l < op.sem.loops.size(); ++l)
    if (!op.sem.loops[l].statReduced)
      n *= static_cast<double>(op.sem.loops[l].size);
  return static_cast<float>(1 / n);
}

/// Calls f(scoreOffset, rowOffset, isLabel) for every point of the task.
template <class F>
void lossWalk(KernelCtx &ctx, Task &t, const TensorMap &rows, F f) {
  const OpSemantics &sem = ctx.op.sem;
  int c = classLoop(sem);
  TensorMap cls = loopIndexMap(sem, c);
  PointIter it(sem, {{&sem.inputs[0], t.in[0].box},
                     {&rows, t.saved[0].box},
                     {&sem.inputs[1], t.in[1].box},
                     {&cls, loopIndexBox(sem, c)}});
  it.run(t.loops, [&](const int64_t *o) {
    f(o[0], o[1], static_cast<int64_t>(t.in[1].data[o[2]]) == o[3]);
  });
}

/// saved[0] = log-sum-exp per row. out[0] = this tile's share of the loss.
void lossForward(KernelCtx &ctx) {
  const OpSemantics &sem = ctx.op.sem;
  std::vector<bool> keep = rowsKeep(sem);
  TensorMap rows = loopSubsetMap(sem, keep);
  std::vector<Buf> mx, sum;
  std::vector<const Buf *> x;
  for (Task &t : ctx.tasks)
    x.push_back(&t.in[0]);
  softmaxStats(ctx, keep, rows, ctx.op.sem.inputs[0], x, mx, sum);
  float scale = lossScale(ctx.op);
  for (size_t k = 0; k < ctx.tasks.size(); ++k) {
    Task &t = ctx.tasks[k];
    for (size_t r = 0; r < mx[k].size(); ++r)
      mx[k].data[r] += std::log(sum[k].data[r]);
    t.saved = {std::move(mx[k])};
    float total = 0;
    lossWalk(ctx, t, rows, [&](int64_t so, int64_t ro, bool label) {
      if (label)
        total -= t.in[0].data[so] - t.saved[0].data[ro];
    });
    t.out[0].data[0] = total * scale;
  }
}

void lossBackward(KernelCtx &ctx) {
  std::vector<bool> keep = rowsKeep(ctx.op.sem);
  TensorMap rows = loopSubsetMap(ctx.op.sem, keep);
  float scale = lossScale(ctx.op);
  for (Task &t : ctx.tasks) {
    float g = t.gout[0].data[0] * scale;
    lossWalk(ctx, t, rows, [&](int64_t so, int64_t ro, bool label) {
      float p = std::exp(t.in[0].data[so] - t.saved[0].data[ro]);
      t.gin[0].data[so] += (p - (label ? 1.0f : 0.0f)) * g;
    });
  }
}

const Kernel kNorm = {checkNorm, normForward, normBackward};
const Kernel kSoftmax = {checkSoftmax, softmaxForward, softmaxBackward};
const Kernel kLoss = {checkLoss, lossForward, lossBackward};

} // namespace

void softmaxRows(KernelCtx &ctx, const TensorMap &xMap,
                 const std::vector<const Buf *> &x, bool log) {
  const OpSemantics &sem = ctx.op.sem;
  std::vector<bool> keep = rowsKeep(sem);
  TensorMap rows = loopSubsetMap(sem, keep);
  std::vector<Buf> mx, sum;
  softmaxStats(ctx, keep, rows, xMap, x, mx, sum);
  for (size_t k = 0; k < ctx.tasks.size(); ++k) {
    Task &t = ctx.tasks[k];
    PointIter it(sem, {{&xMap, x[k]->box},
                       {&rows, mx[k].box},
                       {&sem.outputs[0], t.out[0].box}});
    it.run(t.loops, [&](const int64_t *o) {
      float d = x[k]->data[o[0]] - mx[k].data[o[1]];
      t.out[0].data[o[2]] = log ? d - std::log(sum[k].data[o[1]])
                                : std::exp(d) / sum[k].data[o[1]];
    });
  }
}

void softmaxRowsBackward(KernelCtx &ctx, const TensorMap &dxMap,
                         const std::vector<Buf *> &dx, bool log) {
  const OpSemantics &sem = ctx.op.sem;
  std::vector<bool> keep = rowsKeep(sem);
  TensorMap rows = loopSubsetMap(sem, keep);
  // s = sum of dy * y (softmax) or of dy (log-softmax), per row.
  std::vector<Buf> s = rowBufs(ctx, keep, 0);
  auto iter = [&](Task &t, size_t k) {
    return PointIter(sem, {{&dxMap, dx[k]->box},
                           {&rows, s[k].box},
                           {&sem.outputs[0], t.out[0].box}});
  };
  for (size_t k = 0; k < ctx.tasks.size(); ++k) {
    Task &t = ctx.tasks[k];
    iter(t, k).run(t.loops, [&](const int64_t *o) {
      float dy = t.gout[0].data[o[2]];
      s[k].data[o[1]] += log ? dy : dy * t.out[0].data[o[2]];
    });
  }
  allReduce(ctx, keep, s, Combine::Sum);
  for (size_t k = 0; k < ctx.tasks.size(); ++k) {
    Task &t = ctx.tasks[k];
    iter(t, k).run(t.loops, [&](const int64_t *o) {
      float dy = t.gout[0].data[o[2]], y = t.out[0].data[o[2]];
      dx[k]->data[o[0]] +=
          log ? dy - std::exp(y) * s[k].data[o[1]] : y * (dy - s[k].data[o[1]]);
    });
  }
}

const Kernel *findNormKernel(llvm::StringRef kind) {
  if (kind == "BatchNormalization" || kind == "LayerNormalization" ||
      kind == "RMSNormalization")
    return &kNorm;
  if (kind == "Softmax" || kind == "LogSoftmax")
    return &kSoftmax;
  if (kind == "SoftmaxCrossEntropyLoss")
    return &kLoss;
  return nullptr;
}

} // namespace exec
} // namespace soap
