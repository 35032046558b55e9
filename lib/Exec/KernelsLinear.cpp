// Contractions (Gemm, MatMul, Conv), pooling, reductions and the embedding
// Gather: one generic loop-nest kernel per family, reading operands through
// the ops' index maps, so strides, dilations, padding, groups, transposes
// and broadcasting come from the semantics rather than from each kernel.
#include "Kernels.h"

#include "Gemm.h"
#include "soap/Support/Error.h"
#include <cmath>
#include <limits>

namespace soap {
namespace exec {

std::vector<bool> reducedMask(const OpSemantics &sem, int output) {
  std::vector<bool> m(sem.loops.size(), false);
  for (int l : sem.reducedLoops(output))
    m[l] = true;
  return m;
}

bool firstOfPartialGroup(const OpSemantics &sem, const Box &tile, int output) {
  for (int l : sem.reducedLoops(output))
    if (tile.lo[l] != 0)
      return false;
  return true;
}

Box collapse(const Box &tile, const std::vector<bool> &mask) {
  Box b = tile;
  for (size_t l = 0; l < mask.size(); ++l)
    if (mask[l])
      b.hi[l] = b.lo[l] + 1;
  return b;
}

TensorMap loopIndexMap(const OpSemantics &sem, int l) {
  TensorMap m;
  m.dims.push_back(DimMap::loop(l));
  m.shape.push_back(sem.loops[l].size);
  return m;
}

Box loopIndexBox(const OpSemantics &sem, int l) {
  return Box::full({sem.loops[l].size});
}

std::vector<bool> statMask(const OpSemantics &sem) {
  std::vector<bool> m;
  for (const LoopDim &l : sem.loops)
    m.push_back(l.statReduced);
  return m;
}

namespace {

// --- Gemm, MatMul, Conv: Y[y] += alpha * A[a] * B[b] (+ beta * C[c]) ------

float attrF(const Op &op, const char *k, double d) {
  return static_cast<float>(op.getFloat(k, d));
}

llvm::Error checkContraction(const Graph &g, const Op &op) {
  return llvm::Error::success();
}

void contractionForward(KernelCtx &ctx) {
  const OpSemantics &sem = ctx.op.sem;
  float alpha = ctx.op.kind == "Gemm" ? attrF(ctx.op, "alpha", 1) : 1.0f;
  float beta = ctx.op.kind == "Gemm" ? attrF(ctx.op, "beta", 1) : 1.0f;
  bool bias = ctx.op.inputs.size() > 2 && ctx.op.inputs[2] != kNoValue;
  for (Task &t : ctx.tasks) {
    float *y = t.out[0].data.data();
    bool conv = ctx.op.kind == "Conv";
    if (!(conv && convForward(sem, t)) && !gemmForward(sem, t, alpha)) {
      PointIter it(sem, {{&sem.outputs[0], t.out[0].box},
                         {&sem.inputs[0], t.in[0].box},
                         {&sem.inputs[1], t.in[1].box}});
      const float *a = t.in[0].data.data(), *b = t.in[1].data.data();
      it.run(t.loops, [&](const int64_t *o) {
        if (o[1] >= 0 && o[2] >= 0)
          y[o[0]] += alpha * a[o[1]] * b[o[2]];
      });
    }
    if (bias && firstOfPartialGroup(sem, t.loops, 0)) {
      PointIter ib(sem, {{&sem.outputs[0], t.out[0].box},
                         {&sem.inputs[2], t.in[2].box}});
      const float *c = t.in[2].data.data();
      ib.run(collapse(t.loops, reducedMask(sem, 0)),
             [&](const int64_t *o) { y[o[0]] += beta * c[o[1]]; });
    }
  }
}

void contractionBackward(KernelCtx &ctx) {
  const OpSemantics &sem = ctx.op.sem;
  float alpha = ctx.op.kind == "Gemm" ? attrF(ctx.op, "alpha", 1) : 1.0f;
  float beta = ctx.op.kind == "Gemm" ? attrF(ctx.op, "beta", 1) : 1.0f;
  bool bias = ctx.op.inputs.size() > 2 && ctx.op.inputs[2] != kNoValue;
  for (Task &t : ctx.tasks) {
    const float *dy = t.gout[0].data.data();
    bool conv = ctx.op.kind == "Conv";
    if (!(conv && convBackward(sem, t)) && !gemmBackward(sem, t, alpha)) {
      PointIter it(sem, {{&sem.outputs[0], t.out[0].box},
                         {&sem.inputs[0], t.in[0].box},
                         {&sem.inputs[1], t.in[1].box}});
      const float *a = t.in[0].data.data(), *b = t.in[1].data.data();
      float *da = t.gin[0].data.empty() ? nullptr : t.gin[0].data.data();
      float *db = t.gin[1].data.empty() ? nullptr : t.gin[1].data.data();
      it.run(t.loops, [&](const int64_t *o) {
        if (o[1] >= 0 && o[2] >= 0) {
          float g = alpha * dy[o[0]];
          if (da)
            da[o[1]] += g * b[o[2]];
          if (db)
            db[o[2]] += g * a[o[1]];
        }
      });
    }
    if (bias && !t.gin[2].data.empty() &&
        firstOfPartialGroup(sem, t.loops, 0)) {
      PointIter ib(sem, {{&sem.outputs[0], t.out[0].box},
                         {&sem.inputs[2], t.in[2].box}});
      float *dc = t.gin[2].data.data();
      ib.run(collapse(t.loops, reducedMask(sem, 0)),
             [&](const int64_t *o) { dc[o[1]] += beta * dy[o[0]]; });
    }
  }
}

// --- Pooling ---------------------------------------------------------------

bool isMaxPool(const Op &op) {
  return llvm::StringRef(op.kind).contains("Max");
}

llvm::Error checkPool(const Graph &g, const Op &op) {
  // ceil_mode's last windows reach past the input; the points there read
  // nothing (as padding does): a max ignores them, and an average that does
  // not count padding divides by the points it read. Counting them would
  // need ONNX's and PyTorch's rule for the part past the padding.
  if (op.getInt("ceil_mode", 0) != 0 && !isMaxPool(op) &&
      op.getInt("count_include_pad", 0) != 0)
    return inputError("ceil_mode=1 with count_include_pad=1 is not "
                      "supported");
  if (op.outputs.size() > 1 && op.outputs[1] != kNoValue &&
      !g.value(op.outputs[1]).users.empty())
    return inputError("MaxPool's Indices output is not supported");
  return llvm::Error::success();
}

/// Points per output element that the divisor counts.
std::vector<float> poolCounts(KernelCtx &ctx, Task &t) {
  const OpSemantics &sem = ctx.op.sem;
  // The output's box, not its data: backward runs after the data is freed.
  std::vector<float> cnt(size_t(std::max<int64_t>(t.out[0].box.volume(), 0)),
                         0);
  bool includePad = ctx.op.getInt("count_include_pad", 0) != 0 ||
                    llvm::StringRef(ctx.op.kind).startswith("Global");
  PointIter it(
      sem, {{&sem.outputs[0], t.out[0].box}, {&sem.inputs[0], t.in[0].box}});
  if (includePad) {
    // The whole window, also where a split cut it (GlobalAveragePool).
    double k = 1;
    for (int l : sem.reducedLoops(0))
      k *= static_cast<double>(sem.loops[l].size);
    std::fill(cnt.begin(), cnt.end(), static_cast<float>(k));
    return cnt;
  }
  it.run(t.loops, [&](const int64_t *o) {
    if (o[1] >= 0)
      cnt[o[0]] += 1;
  });
  return cnt;
}

void poolForward(KernelCtx &ctx) {
  const OpSemantics &sem = ctx.op.sem;
  bool isMax = isMaxPool(ctx.op);
  for (Task &t : ctx.tasks) {
    PointIter it(
        sem, {{&sem.outputs[0], t.out[0].box}, {&sem.inputs[0], t.in[0].box}});
    float *y = t.out[0].data.data();
    const float *x = t.in[0].data.data();
    if (isMax) {
      std::fill(t.out[0].data.begin(), t.out[0].data.end(),
                -std::numeric_limits<float>::infinity());
      t.arg.assign(t.out[0].size(), -1);
      it.run(t.loops, [&](const int64_t *o) {
        if (o[1] >= 0 && (t.arg[o[0]] < 0 || x[o[1]] > y[o[0]])) {
          y[o[0]] = x[o[1]];
          t.arg[o[0]] = o[1];
        }
      });
      continue;
    }
    it.run(t.loops, [&](const int64_t *o) {
      if (o[1] >= 0)
        y[o[0]] += x[o[1]];
    });
    std::vector<float> cnt = poolCounts(ctx, t);
    for (size_t k = 0; k < cnt.size(); ++k)
      y[k] /= cnt[k];
  }
}

void poolBackward(KernelCtx &ctx) {
  const OpSemantics &sem = ctx.op.sem;
  for (Task &t : ctx.tasks) {
    const float *dy = t.gout[0].data.data();
    float *dx = t.gin[0].data.data();
    if (isMaxPool(ctx.op)) {
      for (size_t k = 0; k < t.arg.size(); ++k)
        if (t.arg[k] >= 0)
          dx[t.arg[k]] += dy[k];
      continue;
    }
    std::vector<float> cnt = poolCounts(ctx, t);
    PointIter it(
        sem, {{&sem.outputs[0], t.out[0].box}, {&sem.inputs[0], t.in[0].box}});
    it.run(t.loops, [&](const int64_t *o) {
      if (o[1] >= 0)
        dx[o[1]] += dy[o[0]] / cnt[o[0]];
    });
  }
}

// --- ReduceSum / ReduceMean --------------------------------------------------

llvm::Error checkReduce(const Graph &g, const Op &op) {
  if (op.inputs.size() > 1 && op.inputs[1] != kNoValue)
    return inputError("axes as an input are not supported");
  return llvm::Error::success();
}

float reduceScale(const Op &op) {
  if (op.kind != "ReduceMean")
    return 1;
  double n = 1;
  for (int l : op.sem.reducedLoops(0))
    n *= static_cast<double>(op.sem.loops[l].size);
  return static_cast<float>(1 / n);
}

void reduceForward(KernelCtx &ctx) {
  const OpSemantics &sem = ctx.op.sem;
  float s = reduceScale(ctx.op);
  for (Task &t : ctx.tasks) {
    PointIter it(
        sem, {{&sem.outputs[0], t.out[0].box}, {&sem.inputs[0], t.in[0].box}});
    float *y = t.out[0].data.data();
    const float *x = t.in[0].data.data();
    it.run(t.loops, [&](const int64_t *o) { y[o[0]] += x[o[1]]; });
    if (s != 1)
      for (float &v : t.out[0].data)
        v *= s;
  }
}

void reduceBackward(KernelCtx &ctx) {
  const OpSemantics &sem = ctx.op.sem;
  float s = reduceScale(ctx.op);
  for (Task &t : ctx.tasks) {
    PointIter it(
        sem, {{&sem.outputs[0], t.out[0].box}, {&sem.inputs[0], t.in[0].box}});
    const float *dy = t.gout[0].data.data();
    float *dx = t.gin[0].data.data();
    it.run(t.loops, [&](const int64_t *o) { dx[o[1]] += dy[o[0]] * s; });
  }
}

// --- Gather (embedding lookup along axis 0)
// -----------------------------------

bool scalarGather(const Op &op) { return op.sem.inputs[1].dims.empty(); }

llvm::Error checkGather(const Graph &g, const Op &op) {
  if (!scalarGather(op) && op.getInt("axis", 0) != 0)
    return inputError("Gather with tensor indices is supported along axis 0 "
                      "only");
  return llvm::Error::success();
}

/// The data map with its gathered dim pinned to the first row of the
/// task's data box: the row of index v is at offset + (v - lo) * stride.
TensorMap pinnedData(const OpSemantics &sem, const Box &dataBox) {
  TensorMap m = sem.inputs[0];
  m.dims[0] = DimMap::constant(dataBox.lo[0]);
  return m;
}

template <class F> void gatherWalk(KernelCtx &ctx, Task &t, F f) {
  const OpSemantics &sem = ctx.op.sem;
  int v = static_cast<int>(sem.loops.size()) - 1;
  std::vector<bool> vm(sem.loops.size(), false);
  vm[v] = true;
  TensorMap pinned = pinnedData(sem, t.in[0].box);
  PointIter it(sem, {{&sem.outputs[0], t.out[0].box},
                     {&sem.inputs[1], t.in[1].box},
                     {&pinned, t.in[0].box}});
  int64_t vlo = t.loops.lo[v], vhi = t.loops.hi[v];
  int64_t rows = sem.loops[v].size;
  int64_t stride = boxStrides(t.in[0].box)[0];
  const float *idx = t.in[1].data.data();
  it.run(collapse(t.loops, vm), [&](const int64_t *o) {
    int64_t r = static_cast<int64_t>(idx[o[1]]);
    if (r < 0)
      r += rows;
    if (r >= vlo && r < vhi)
      f(o[0], o[2] + (r - t.in[0].box.lo[0]) * stride);
  });
}

void gatherForward(KernelCtx &ctx);
void gatherBackward(KernelCtx &ctx);

const Kernel kContraction = {checkContraction, contractionForward,
                             contractionBackward, true};
const Kernel kPool = {checkPool, poolForward, poolBackward};
const Kernel kReduce = {checkReduce, reduceForward, reduceBackward};
const Kernel kGather = {checkGather, gatherForward, gatherBackward};

void gatherForward(KernelCtx &ctx) {
  if (scalarGather(ctx.op))
    return findShapeKernel("Slice")->forward(ctx);
  for (Task &t : ctx.tasks) {
    float *y = t.out[0].data.data();
    const float *d = t.in[0].data.data();
    gatherWalk(ctx, t, [&](int64_t yo, int64_t dof) { y[yo] = d[dof]; });
  }
}

void gatherBackward(KernelCtx &ctx) {
  if (scalarGather(ctx.op))
    return findShapeKernel("Slice")->backward(ctx);
  for (Task &t : ctx.tasks) {
    const float *dy = t.gout[0].data.data();
    float *dd = t.gin[0].data.data();
    gatherWalk(ctx, t, [&](int64_t yo, int64_t dof) { dd[dof] += dy[yo]; });
  }
}

} // namespace

const Kernel *findLinearKernel(llvm::StringRef kind) {
  if (kind == "Gemm" || kind == "MatMul" || kind == "Conv")
    return &kContraction;
  if (kind == "MaxPool" || kind == "AveragePool" ||
      kind == "GlobalAveragePool" || kind == "GlobalMaxPool")
    return &kPool;
  if (kind == "ReduceSum" || kind == "ReduceMean")
    return &kReduce;
  if (kind == "Gather")
    return &kGather;
  return nullptr;
}

const Kernel *findKernel(llvm::StringRef kind, llvm::StringRef backend) {
#ifdef SOAP_HAVE_CUDA
  if (backend == "cuda")
    if (const Kernel *k = findCudaKernel(kind))
      return k;
#endif
  for (auto *f :
       {findLinearKernel, findPointwiseKernel, findNormKernel, findShapeKernel,
        findRnnKernel, findFusedKernel, findAttentionKernel})
    if (const Kernel *k = f(kind))
      return k;
  return nullptr;
}

std::string takeBackendError() {
#ifdef SOAP_HAVE_CUDA
  return takeCudaError();
#else
  return "";
#endif
}

} // namespace exec
} // namespace soap
