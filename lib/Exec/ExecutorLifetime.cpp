// When the executor frees a buffer: after a forward, what no backward
// reads; after the last reader of an output, the output.
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

bool rerunsForward(const Op &op, const std::string &backend) {
  auto fn = elemFnOf(op.kind);
  if (backend != "cpu" || !fn || *fn == ElemFn::Add || *fn == ElemFn::Sub ||
      *fn == ElemFn::Relu || op.sem.saved.empty())
    return false;
  for (const SavedOperand &so : op.sem.saved)
    if (so.isOutput)
      return false;
  return true;
}

void Runner::dropAfterForward(OpId o) {
  const Op &op = g_.op(o);
  bool rc = s_.recomputes(o);
  if (!rc && keepsAllOperands(op, opts_)) {
    pendingDone(o);
    return;
  }
  // What the op saves (DESIGN.md: the bytes saved for backward); a
  // recomputed op keeps only the inputs its forward reads again.
  for (Task &t : tasks(o)) {
    for (size_t i = 0; i < op.inputs.size(); ++i) {
      // Integer operands (labels, indices) are read by backward too; the
      // semantics count them as nothing saved.
      ValueId v = op.inputs[i];
      // A max pool's backward reads only its argmax. A rotary
      // embedding's backward reads its cos and sin tables (constants).
      bool keep = (v != kNoValue && !isFloating(g_.value(v).dtype)) ||
                  (!isMaxPool(op) && !rc && saves(op, int(i), false)) ||
                  (v != kNoValue && !rc &&
                   (rerunsForward(op, opts_) ||
                    op.kind == "RotaryEmbedding") &&
                   g_.value(v).kind == ValueKind::Constant) ||
                  (rc && keptForRecompute(g_, s_, op, i));
      if (!keep)
        t.in[i].drop();
    }
    if (rc) {
      t.saved.clear();
      release(t.arg);
      release(t.mask);
    }
  }
  pendingDone(o);
}

bool Runner::freedAfterReaders(OpId prod, size_t j) const {
  const Op &po = g_.op(prod);
  return (!keepsOutput(s_, po, j) || dropoutMask(po, j)) &&
         (s_.recomputes(prod) || !keepsAllOperands(po, opts_));
}

bool Runner::sameTiling(OpId o, size_t i, OpId prod, size_t j) const {
  const OpPlan &c = plan(o), &p = plan(prod);
  if (c.tiles.size() != p.tiles.size())
    return false;
  auto same = [](const Box &a, const Box &b) {
    return a.lo == b.lo && a.hi == b.hi;
  };
  for (size_t k = 0; k < c.tiles.size(); ++k) {
    if (!same(c.inReg[i][k], p.outReg[j][k]) ||
        ranksOf(o, int64_t(k)) != ranksOf(prod, int64_t(k)))
      return false;
    // Tiles writing one region are partial sums: they must be added.
    for (size_t k2 = 0; k2 < k; ++k2)
      if (same(p.outReg[j][k2], p.outReg[j][k]))
        return false;
  }
  return true;
}

void Runner::outputRead(OpId prod, size_t j) {
  const Op &po = g_.op(prod);
  if (po.kind == "Relu" && j == 0 && keepsOutput(s_, po, j) &&
      opts_.backend == "cpu") {
    keepReluMask(prod);
    return;
  }
  if (!freedAfterReaders(prod, j))
    return;
  for (Task &t : tasks(prod))
    if (j < t.out.size())
      t.out[j].drop();
}

void Runner::keepReluMask(OpId relu) {
  // Kept as its 1-byte mask, as the semantics count it.
  for (Task &t : tasks(relu)) {
    t.mask.resize(t.out[0].data.size());
    for (size_t k = 0; k < t.mask.size(); ++k)
      t.mask[k] = t.out[0].data[k] > 0;
    t.out[0].drop();
  }
}

void Runner::pendingDone(OpId o) {
  // Outputs nobody reads in the forward pass.
  const Op &op = g_.op(o);
  for (size_t j = 0; j < op.outputs.size(); ++j)
    if (op.outputs[j] != kNoValue && pending_[size_t(mb_)][size_t(o)][j] == 0)
      outputRead(o, j);
}

} // namespace exec
} // namespace soap
