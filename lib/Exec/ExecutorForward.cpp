// The executor's forward pass: each task's inputs assembled from their
// producers' tiles, the kernel run, and what its backward will read kept.
#include "soap/Exec/Executor.h"

#include "ElementwiseFn.h"
#include "ExecRules.h"
#include "Gemm.h"
#include "Runner.h"
#include "ExecutorKeep.h"
#include "soap/Support/Cores.h"
#include "soap/Support/Error.h"
#include "soap/Support/Json.h"
#include "soap/Support/Rng.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include <chrono>
#include <cmath>
#include <cstring>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <limits>
#include <malloc.h>
#include <map>
#include <optional>
#include <set>
#include <thread>

namespace soap {
namespace exec {

void Runner::fillLocal(const Value &v, const Box &box, Buf &out) {
  out.reset(box);
  const std::vector<int64_t> &shape = v.shape.dims;
  switch (v.kind) {
  case ValueKind::Constant:
    exec::forEachIndex(box, shape, [&](int64_t flat, int64_t off) {
      out.data[off] =
          static_cast<float>(v.data.size() == 1 ? v.data[0] : v.data[flat]);
    });
    break;
  case ValueKind::Input: {
    uint64_t stream = fnv1a(v.name) ^ 0x5EEDull;
    auto range = intRange_.find(v.id);
    exec::forEachIndex(box, shape, [&](int64_t flat, int64_t off) {
      double u = hashUniform(opts_.seed, stream, flat);
      if (range != intRange_.end())
        out.data[off] = static_cast<float>(std::min<int64_t>(
            static_cast<int64_t>(u * range->second), range->second - 1));
      else if (!isFloating(v.dtype))
        out.data[off] = u < 0.5 ? 0.0f : 1.0f;
      else
        out.data[off] = static_cast<float>(2 * u - 1);
    });
    // bf16: the data enters as bf16 (autocast casts it before a GEMM).
    if (range == intRange_.end() && isFloating(v.dtype))
      roundStored(out);
    break;
  }
  default: // weights are lent (lendWeights); running statistics are
           // unused by training-mode kernels
    break;
  }
}

void Runner::gatherInput(OpId o, size_t i) {
  const Value &v = g_.value(g_.op(o).inputs[i]);
  const OpPlan &p = plan(o);
  OpId prod = v.producer;
  int j = v.producerOutput;
  std::vector<Src> srcs;
  for (size_t k = 0; k < plan(prod).tiles.size(); ++k) {
    const Task *pt = localTask(prod, k);
    srcs.push_back({plan(prod).outReg[j][k], ranksOf(prod, k),
                    pt ? &pt->out[j] : nullptr});
  }
  std::vector<Dst> dsts;
  for (size_t k = 0; k < p.tiles.size(); ++k)
    for (int r : ranksOf(o, k)) {
      Task *t = localTask(o, k);
      dsts.push_back({p.inReg[i][k], r, r == me_ ? &t->in[i] : nullptr});
    }
  assemble(srcs, dsts, Combine::Sum);
  // bf16: partial sums of a split reduction add up to a bf16 tensor again
  // (what a bf16 all-reduce of them gives, to rounding).
  if (bf16_ && isFloating(v.dtype))
    for (Task &t : tasks(o))
      roundStored(t.in[i]);
}

void Runner::roundOutputs(OpId o) {
  if (!bf16_)
    return;
  const Op &op = g_.op(o);
  bool loss = op.kind == "SoftmaxCrossEntropyLoss";
  for (Task &t : tasks(o))
    for (size_t j = 0; j < op.outputs.size() && j < t.out.size(); ++j)
      if (op.outputs[j] != kNoValue && !(loss && j == 0) &&
          isFloating(g_.value(op.outputs[j]).dtype))
        roundStored(t.out[j]);
}

std::optional<int64_t> runStart(const Box &b,
                                const std::vector<int64_t> &shape) {
  if (b.rank() != shape.size())
    return std::nullopt;
  size_t d = shape.size();
  while (d > 0 && b.lo[d - 1] == 0 && b.hi[d - 1] == shape[d - 1])
    --d;
  for (size_t k = 0; k + 1 < d; ++k)
    if (b.hi[k] - b.lo[k] != 1)
      return std::nullopt;
  int64_t flat = 0;
  for (size_t k = 0; k < shape.size(); ++k)
    flat = flat * shape[k] + b.lo[k];
  return flat;
}

bool reshapePassesBuffer(const Graph &g, const Op &op, const Box &x,
                         const Box &y) {
  if (op.kind != "Reshape" && op.kind != "Flatten" && op.kind != "Squeeze" &&
      op.kind != "Unsqueeze")
    return false;
  // Only an activation's buffer is the op's to pass on: a weight reaching
  // the reshape (an Einsum's lowering reshapes its weight operand) is lent
  // by lendWeights and must stay where it is.
  const std::vector<int> &wi = op.sem.weightInputs;
  if (std::find(wi.begin(), wi.end(), 0) != wi.end() ||
      g.value(op.inputs[0]).producer < 0)
    return false;
  auto a = runStart(x, g.value(op.inputs[0]).shape.dims);
  auto b = runStart(y, g.value(op.outputs[0]).shape.dims);
  return a && b && *a == *b && x.volume() == y.volume();
}

bool Runner::aliasesReshape(OpId o) const {
  if (opts_.backend != "cpu")
    return false;
  const OpPlan &p = plan(o);
  for (size_t k = 0; k < p.tiles.size(); ++k)
    if (!reshapePassesBuffer(g_, g_.op(o), p.inReg[0][k], p.outReg[0][k]))
      return false;
  return !p.tiles.empty();
}

void Runner::forward(OpId o, bool again) {
  cur_ = o;
  const Op &op = g_.op(o);
  const OpPlan &p = plan(o);
  std::vector<Task> &ts = tasks(o);
  std::vector<uint8_t> &sent = sent_[size_t(mb_)][size_t(o)];
  for (Task &t : ts) {
    t.in.resize(op.inputs.size());
    if (!again)
      for (size_t i = 0; i < t.in.size(); ++i)
        if (!sent[i])
          t.in[i] = Buf();
    t.out.assign(op.outputs.size(), Buf());
    t.saved.clear();
    release(t.arg);
  }
  for (size_t i = 0; i < op.inputs.size(); ++i) {
    ValueId vid = op.inputs[i];
    if (vid == kNoValue)
      continue;
    const Value &v = g_.value(vid);
    if (v.kind == ValueKind::Weight)
      continue; // lent below
    if (again && keptForRecompute(g_, s_, op, i))
      continue;
    if (v.kind != ValueKind::Activation) {
      for (Task &t : ts)
        fillLocal(v, p.inReg[i][t.tile], t.in[i]);
      continue;
    }
    if (!again && sent[i])
      continue; // sent when its producer's stage ran the micro-batch
    OpId prod = v.producer;
    size_t j = size_t(v.producerOutput);
    int &pend = pending_[size_t(mb_)][size_t(prod)][j];
    if (!again && pend == 1 && freedAfterReaders(prod, j) &&
        sameTiling(o, i, prod, j)) {
      // The last reader takes the buffer its producer would free: no copy.
      for (Task &t : ts) {
        Buf &src = localTask(prod, t.tile)->out[j];
        t.in[i].box = src.box; // the producer's backward reads its box
        t.in[i].data = std::move(src.data);
        src.drop();
      }
    } else {
      gatherInput(o, i);
    }
    if (!again && --pend == 0)
      outputRead(prod, j);
    if (again && --rereads_[size_t(mb_)][size_t(prod)][j] == 0)
      reread(prod, j);
  }
  lendWeights(o);
  bool alias = aliasesReshape(o);
  for (Task &t : ts)
    for (size_t j = 0; j < op.outputs.size(); ++j)
      if (op.outputs[j] != kNoValue && !alias)
        t.out[j].reset(p.outReg[j][t.tile]);
  exec::KernelCtx ctx{g_, op, ts, *this, opts_.seed, step_};
  if (alias) {
    // The same elements in the same order: the input's buffer is the
    // output (what the kernel's copy would write).
    for (Task &t : ts) {
      t.out[0].box = p.outReg[0][t.tile];
      t.out[0].data = std::move(t.in[0].data);
      t.in[0].drop();
    }
  } else {
    exec::findKernel(op.kind, opts_.backend)->forward(ctx);
    roundOutputs(o);
  }
  if (!again && step_ == 0 && !forwardOutputs_.empty())
    captureOutputs(o);
  returnWeights(o);
  if (!again) {
    dropAfterForward(o);
    return;
  }
  // Run again: keep what the backward reads, as a kept op does.
  if (keepsAllOperands(op, opts_) || rerunsForward(op, opts_))
    return;
  for (Task &t : ts)
    for (size_t i = 0; i < op.inputs.size(); ++i) {
      ValueId v = op.inputs[i];
      if (v != kNoValue && isFloating(g_.value(v).dtype) &&
          !saves(op, int(i), false) && !isMaxPool(op))
        t.in[i].drop();
      else if (isMaxPool(op))
        t.in[i].drop();
    }
  for (size_t j = 0; j < op.outputs.size(); ++j)
    if (op.outputs[j] != kNoValue && rereads_[size_t(mb_)][size_t(o)][j] == 0)
      reread(o, j);
}

void Runner::reread(OpId prod, size_t j) {
  const Op &po = g_.op(prod);
  // A recomputed Relu keeps what a kept one keeps: its 1-byte mask.
  if (po.kind == "Relu" && j == 0 && saves(po, 0, true) &&
      opts_.backend == "cpu") {
    keepReluMask(prod);
    return;
  }
  if (dropoutMask(po, j)) {
    for (Task &t : tasks(prod))
      t.out[0].drop();
    return;
  }
  if (saves(po, int(j), true) || keepsOutput(s_, po, j) ||
      keepsAllOperands(po, opts_) || rerunsForward(po, opts_))
    return;
  for (Task &t : tasks(prod))
    if (j < t.out.size())
      t.out[j].drop();
}

} // namespace exec
} // namespace soap
