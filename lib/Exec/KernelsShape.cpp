// Data movement: Transpose, Slice, Concat, Split, Pad and a constant-index
// Gather move elements along their affine maps; Reshape, Flatten, Squeeze
// and Unsqueeze keep the row-major order, so an output element's global flat
// index is its input element's.
#include "Kernels.h"

#include "soap/Support/Error.h"

namespace soap {
namespace exec {

namespace {

size_t numMoved(const Op &op) {
  return op.kind == "Concat" ? op.inputs.size() : 1;
}

llvm::Error checkMove(const Graph &g, const Op &op) {
  if (op.kind == "Pad" && op.input(2) != kNoValue) {
    const Value &v = g.value(op.input(2));
    if (v.data.size() != 1)
      return inputError("Pad's constant_value must be a known scalar");
  }
  return llvm::Error::success();
}

float padValue(const Graph &g, const Op &op) {
  if (op.kind == "Pad" && op.input(2) != kNoValue)
    return static_cast<float>(g.value(op.input(2)).data[0]);
  return 0;
}

std::vector<Operand> moveOperands(const Op &op, const Task &t) {
  std::vector<Operand> ops;
  for (size_t j = 0; j < op.outputs.size(); ++j)
    ops.push_back({&op.sem.outputs[j], t.out[j].box});
  for (size_t i = 0; i < numMoved(op); ++i)
    ops.push_back({&op.sem.inputs[i], t.in[i].box});
  return ops;
}

void moveForward(KernelCtx &ctx) {
  size_t nout = ctx.op.outputs.size(), nin = numMoved(ctx.op);
  float pad = padValue(ctx.graph, ctx.op);
  for (Task &t : ctx.tasks) {
    if (pad != 0)
      std::fill(t.out[0].data.begin(), t.out[0].data.end(), pad);
    PointIter it(ctx.op.sem, moveOperands(ctx.op, t));
    it.run(t.loops, [&](const int64_t *o) {
      for (size_t i = 0; i < nin; ++i)
        if (o[nout + i] >= 0) {
          float v = t.in[i].data[o[nout + i]];
          for (size_t j = 0; j < nout; ++j)
            if (o[j] >= 0)
              t.out[j].data[o[j]] = v;
          return;
        }
    });
  }
}

void moveBackward(KernelCtx &ctx) {
  size_t nout = ctx.op.outputs.size(), nin = numMoved(ctx.op);
  for (Task &t : ctx.tasks) {
    PointIter it(ctx.op.sem, moveOperands(ctx.op, t));
    it.run(t.loops, [&](const int64_t *o) {
      for (size_t i = 0; i < nin; ++i)
        if (o[nout + i] >= 0) {
          for (size_t j = 0; j < nout; ++j)
            if (o[j] >= 0)
              t.gin[i].data[o[nout + i]] += t.gout[j].data[o[j]];
          return;
        }
    });
  }
}

// --- Reshape and friends
// -------------------------------------------------------

llvm::Error checkReshape(const Graph &g, const Op &op) {
  return llvm::Error::success();
}

/// Calls f(outputOffset, inputOffset) for every element of the task's
/// output box.
template <class F> void reshapeWalk(KernelCtx &ctx, Task &t, F f) {
  const std::vector<int64_t> &xs = ctx.graph.value(ctx.op.inputs[0]).shape.dims;
  const std::vector<int64_t> &ys =
      ctx.graph.value(ctx.op.outputs[0]).shape.dims;
  const Box &xb = t.in[0].box;
  std::vector<int64_t> xstr = boxStrides(xb);
  std::vector<int64_t> idx(xs.size());
  forEachIndex(t.out[0].box, ys, [&](int64_t flat, int64_t yo) {
    int64_t rest = flat, xo = 0;
    for (size_t d = xs.size(); d-- > 0;) {
      idx[d] = rest % xs[d];
      rest /= xs[d];
    }
    for (size_t d = 0; d < xs.size(); ++d) {
      assert(idx[d] >= xb.lo[d] && idx[d] < xb.hi[d]);
      xo += (idx[d] - xb.lo[d]) * xstr[d];
    }
    f(yo, xo);
  });
}

void reshapeForward(KernelCtx &ctx) {
  for (Task &t : ctx.tasks)
    reshapeWalk(ctx, t, [&](int64_t yo, int64_t xo) {
      t.out[0].data[yo] = t.in[0].data[xo];
    });
}

void reshapeBackward(KernelCtx &ctx) {
  for (Task &t : ctx.tasks)
    reshapeWalk(ctx, t, [&](int64_t yo, int64_t xo) {
      t.gin[0].data[xo] += t.gout[0].data[yo];
    });
}

const Kernel kMove = {checkMove, moveForward, moveBackward};
const Kernel kReshape = {checkReshape, reshapeForward, reshapeBackward};

} // namespace

const Kernel *findShapeKernel(llvm::StringRef kind) {
  if (kind == "Transpose" || kind == "Slice" || kind == "Concat" ||
      kind == "Split" || kind == "Pad")
    return &kMove;
  if (kind == "Reshape" || kind == "Flatten" || kind == "Squeeze" ||
      kind == "Unsqueeze")
    return &kReshape;
  return nullptr;
}

} // namespace exec
} // namespace soap
