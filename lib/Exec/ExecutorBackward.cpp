// The executor's backward pass: a recomputed op's forward run again, then
// each task's output gradients assembled and its backward kernel run.
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

void Runner::recompute(OpId o) {
  if (recomputed_[size_t(mb_)][size_t(o)])
    return;
  recomputed_[size_t(mb_)][size_t(o)] = 1;
  const Op &op = g_.op(o);
  // The recomputed producers' outputs first (their forwards again, kept
  // until their own backward, which comes after this op's).
  for (size_t i = 0; i < op.inputs.size(); ++i) {
    ValueId v = op.inputs[i];
    if (v == kNoValue || g_.value(v).kind != ValueKind::Activation)
      continue;
    OpId p = g_.value(v).producer;
    if (s_.recomputes(p))
      recompute(p);
  }
  forward(o, true);
}

bool Runner::reluInPlace(OpId o, const Task &t) const {
  const OpPlan &p = plan(o);
  return g_.op(o).kind == "Relu" && !t.mask.empty() && t.gin.size() == 1 &&
         p.inReg[0][size_t(t.tile)].lo == p.outReg[0][size_t(t.tile)].lo &&
         p.inReg[0][size_t(t.tile)].hi == p.outReg[0][size_t(t.tile)].hi;
}

void Runner::backward(OpId o) {
  if (s_.recomputes(o))
    recompute(o);
  cur_ = o;
  const Op &op = g_.op(o);
  const OpPlan &p = plan(o);
  std::vector<Task> &ts = tasks(o);
  for (Task &t : ts) {
    t.gout.assign(op.outputs.size(), Buf());
    t.gin.assign(op.inputs.size(), Buf());
  }
  bool loss = op.kind == "SoftmaxCrossEntropyLoss";
  for (size_t j = 0; j < op.outputs.size(); ++j) {
    ValueId vid = op.outputs[j];
    if (vid == kNoValue)
      continue;
    if (loss && j == 0) {
      for (Task &t : ts)
        t.gout[j].reset(p.outReg[j][t.tile], 1.0f);
      continue;
    }
    const Value &v = g_.value(vid);
    std::set<OpId> users(v.users.begin(), v.users.end());
    // One contribution tiled as this output: taken, not copied.
    std::vector<std::pair<OpId, size_t>> readers;
    for (OpId u : users)
      for (size_t i = 0; i < g_.op(u).inputs.size(); ++i)
        if (g_.op(u).inputs[i] == vid &&
            contains(g_.op(u).sem.gradInputs, int(i)))
          readers.emplace_back(u, i);
    if (readers.size() == 1 &&
        sameTiling(readers[0].first, readers[0].second, o, j)) {
      for (Task &t : ts) {
        Buf &src = localTask(readers[0].first, t.tile)->gin[readers[0].second];
        t.gout[j].box = p.outReg[j][t.tile];
        t.gout[j].data = std::move(src.data);
        src = Buf();
      }
      continue;
    }
    std::vector<Src> srcs;
    for (OpId u : users) {
      const Op &uo = g_.op(u);
      for (size_t i = 0; i < uo.inputs.size(); ++i) {
        if (uo.inputs[i] != vid || !contains(uo.sem.gradInputs, int(i)))
          continue;
        for (size_t k = 0; k < plan(u).tiles.size(); ++k) {
          const Task *ut = localTask(u, k);
          srcs.push_back(
              {plan(u).inReg[i][k], ranksOf(u, k), ut ? &ut->gin[i] : nullptr});
        }
      }
    }
    std::vector<Dst> dsts;
    for (size_t k = 0; k < p.tiles.size(); ++k)
      for (int r : ranksOf(o, k)) {
        Task *t = localTask(o, k);
        dsts.push_back({p.outReg[j][k], r, r == me_ ? &t->gout[j] : nullptr});
      }
    assemble(srcs, dsts, Combine::Sum);
    for (Task &t : ts)
      roundStored(t.gout[j]);
    // The users' contributions to this gradient are summed: drop them.
    for (OpId u : users) {
      const Op &uo = g_.op(u);
      for (size_t i = 0; i < uo.inputs.size(); ++i)
        if (uo.inputs[i] == vid)
          for (Task &ut : tasks(u))
            if (i < ut.gin.size())
              ut.gin[i] = Buf();
    }
  }
  lendGradients(o);
  // The input gradients once the output gradients are assembled (the users'
  // pieces and the received ones are freed by then), as the simulator
  // counts them: the assembly and the kernel are two phases of the op's
  // backward. No gradient for a graph input or a constant where the kernel can
  // skip one (what needs none gets none).
  bool skip = opts_.backend == "cpu" &&
              exec::findKernel(op.kind, opts_.backend)->skipsEmptyGradients;
  for (Task &t : ts)
    for (size_t i = 0; i < op.inputs.size(); ++i) {
      ValueId v = op.inputs[i];
      if (v == kNoValue || !isFloating(g_.value(v).dtype) ||
          !t.gin[i].data.empty() ||
          (i == 0 && (reluInPlace(o, t) || aliasesReshape(o))))
        continue;
      ValueKind kind = g_.value(v).kind;
      if (skip && kind != ValueKind::Activation && kind != ValueKind::Weight)
        continue;
      t.gin[i].reset(p.inReg[i][t.tile]);
    }
  bool inPlace = false;
  if (aliasesReshape(o)) {
    for (Task &t : ts) {
      t.gin[0].box = p.inReg[0][t.tile];
      t.gin[0].data = std::move(t.gout[0].data);
    }
    inPlace = true;
  }
  for (Task &t : ts) {
    if (reluInPlace(o, t)) {
      // A kept Relu's backward from its mask, in its output gradient's
      // buffer: dx = dy where the output was positive (what the kernel
      // adds to zeros), no second buffer.
      t.gin[0].box = p.inReg[0][t.tile];
      t.gin[0].data = std::move(t.gout[0].data);
      for (size_t k = 0; k < t.mask.size(); ++k)
        if (!t.mask[k])
          t.gin[0].data[k] = 0.0f;
      release(t.mask);
      inPlace = true;
    } else if (op.kind == "Relu" && !t.mask.empty()) {
      // Else the kernel reads whether its output is positive.
      t.out[0].data.resize(t.mask.size());
      for (size_t k = 0; k < t.mask.size(); ++k)
        t.out[0].data[k] = t.mask[k];
      release(t.mask);
    }
  }
  if (inPlace) {
    for (Task &t : ts) {
      t.in.clear();
      t.gout.clear();
      t.out.clear();
    }
    return;
  }
  lendWeights(o, true);
  prefetchWeights(o);
  exec::KernelCtx ctx{g_, op, ts, *this, opts_.seed, step_};
  if (!s_.recomputes(o) && rerunsForward(op, opts_)) {
    for (Task &t : ts)
      for (size_t j = 0; j < op.outputs.size(); ++j)
        if (op.outputs[j] != kNoValue)
          t.out[j].reset(p.outReg[j][t.tile]);
    exec::findKernel(op.kind, opts_.backend)->forward(ctx);
    roundOutputs(o);
  }
  exec::findKernel(op.kind, opts_.backend)->backward(ctx);
  // bf16: an activation's gradient is stored as bf16 (the weights' are
  // rounded as they are accumulated).
  if (bf16_)
    for (Task &t : ts)
      for (size_t i = 0; i < op.inputs.size() && i < t.gin.size(); ++i)
        if (op.inputs[i] != kNoValue &&
            g_.value(op.inputs[i]).kind == ValueKind::Activation &&
            isFloating(g_.value(op.inputs[i]).dtype))
          roundStored(t.gin[i]);
  returnWeights(o);
  // zb-h1: the weight gradients are summed in the stage's weight item
  // (runItem), after the backwards its schedule runs first; the kernels
  // compute them here, with the input gradients (soap-run's kernels have
  // one backward entry), and the op's tasks hold them until then.
  bool apart = s_.pipeline.splitsWeightGrad();
  if (!apart)
    accumulateGradients(o);
  // Nothing after this op's backward reads its operands (its consumers
  // have run both passes), only the gradients it gave its activation
  // inputs and a loss's value: free the rest, so a step's memory peaks
  // once.
  for (Task &t : ts) {
    t.in.clear();
    t.gout.clear();
    t.saved.clear();
    release(t.arg);
    release(t.mask);
    if (!loss)
      t.out.clear();
    for (size_t i = 0; i < op.inputs.size(); ++i)
      if (op.inputs[i] != kNoValue &&
          g_.value(op.inputs[i]).kind != ValueKind::Activation &&
          !(apart && g_.value(op.inputs[i]).kind == ValueKind::Weight))
        t.gin[i] = Buf();
  }
}

} // namespace exec
} // namespace soap
