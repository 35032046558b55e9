// What the executor's steps keep of each op's operands between its forward
// and its backward, shared by the forward, lifetime and backward files of
// the Runner (private to lib/Exec).
#ifndef SOAP_EXEC_EXECUTORKEEP_H
#define SOAP_EXEC_EXECUTORKEEP_H

#include "ElementwiseFn.h"
#include "ExecRules.h"
#include "soap/Exec/Executor.h"
#include "soap/IR/Graph.h"
#include "soap/Parallel/Strategy.h"
#include "llvm/ADT/StringRef.h"
#include <algorithm>
#include <vector>

namespace soap {
namespace exec {

static inline bool contains(const std::vector<int> &v, int x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

/// Whether `o` saves its input `i` (or output `i`) for backward.
static inline bool saves(const Op &o, int i, bool output) {
  for (const SavedOperand &so : o.sem.saved)
    if (so.isOutput == output && so.index == i)
      return true;
  return false;
}

/// What a recomputed op keeps of input `i` through its backward: the
/// activations that kept ops (or the graph's inputs) gave it, which its
/// forward reads again.
static inline bool keptForRecompute(const Graph &g, const Strategy &s, const Op &op,
                             size_t i) {
  ValueId v = op.inputs[i];
  if (v == kNoValue || !g.value(v).isActivationLike())
    return false;
  OpId p = g.value(v).producer;
  return p < 0 || !s.recomputes(p);
}

/// Whether `o` keeps output `j` from its forward to its backward.
static inline bool keepsOutput(const Strategy &s, const Op &op, size_t j) {
  if (op.kind == "SoftmaxCrossEntropyLoss" && j == 0)
    return true; // the loss, read after the step
  return !s.recomputes(op.id) && saves(op, int(j), true);
}

/// A Dropout's output: its kernel keeps the byte mask it drew (Task::mask),
/// all its backward reads, so the output itself is kept for nobody.
static inline bool dropoutMask(const Op &op, size_t j) {
  return op.kind == "Dropout" && j == 0;
}

static inline bool isMaxPool(const Op &op) {
  return llvm::StringRef(op.kind).contains("MaxPool");
}

static inline bool rerunsForward(const Op &op, const ExecOptions &opts) {
  return rerunsForward(op, opts.backend);
}

/// Ops whose backward kernel reads operands beyond what the semantics
/// save (the generic element-wise loop reads every input and the output;
/// LSTM its whole state), and
/// every op of the CUDA backend: they keep all their operands.
static inline bool keepsAllOperands(const Op &op, const ExecOptions &opts) {
  if (opts.backend != "cpu")
    return true;
  if (auto fn = elemFnOf(op.kind))
    return *fn != ElemFn::Add && *fn != ElemFn::Sub && *fn != ElemFn::Relu &&
           !rerunsForward(op, opts);
  // An average pool's and a ReduceSum/Mean's backward read only their
  // operands' boxes (kept when the data is freed), as the semantics count
  // them: nothing saved.
  return op.kind == "LSTM";
}

} // namespace exec
} // namespace soap

#endif // SOAP_EXEC_EXECUTORKEEP_H
