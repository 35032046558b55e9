// The reference executor's driver: every rank walks the graph in the same
// order, builds its tasks' operand boxes with `assemble`, runs the kernels,
// and after the backward pass sums every weight's gradient over the tiles
// that read it and takes an SGD step on the elements it holds.
#include "soap/Exec/Executor.h"

#include "ElementwiseFn.h"
#include "ExecRules.h"
#include "Gemm.h"
#include "Runner.h"
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

std::vector<std::string> builtKernelBackends() {
  std::vector<std::string> b{"cpu"};
#ifdef SOAP_HAVE_CUDA
  b.push_back("cuda");
#endif
  return b;
}

llvm::Error ExecOptions::validate() const {
  std::vector<std::string> built = builtKernelBackends();
  if (std::find(built.begin(), built.end(), backend) == built.end())
    return inputError("--backend '{}': not built in (built: {})", backend,
                      fmt::format("{}", fmt::join(built, ", ")));
  if (steps < 1)
    return inputError("--steps must be at least 1, got {}", steps);
  if (threads < 0)
    return inputError("--threads must be at least 1, got {}", threads);
  if (optimizer != "sgd" && optimizer != "momentum" && optimizer != "adam")
    return inputError("optimizer '{}': soap-run runs sgd, momentum or adam",
                      optimizer);
  if (precision != "fp32" && precision != "bf16")
    return inputError("precision '{}': soap-run runs fp32 or bf16 plans",
                      precision);
  if (precision == "bf16" && backend != "cpu")
    return inputError("--backend {}: soap-run runs bf16 plans on the cpu "
                      "backend only",
                      backend);
  if (!(learningRate > 0) || !std::isfinite(learningRate))
    return inputError("--lr must be a positive number, got {}", learningRate);
  return llvm::Error::success();
}

const std::vector<int64_t> &exec::weightShape(const Graph &g, const Value &w) {
  for (OpId u : w.users) {
    const Op &op = g.op(u);
    for (size_t i = 0; i < op.inputs.size(); ++i)
      if (op.inputs[i] == w.id && op.sem.inputs[i].isView)
        return op.sem.inputs[i].shape;
  }
  return w.shape.dims;
}

llvm::Error checkExecutable(const Graph &g) {
  for (const Op &op : g.ops()) {
    const exec::Kernel *k = exec::findKernel(op.kind);
    if (!k)
      return inputError("{}: soap-run has no kernel for {}", g.where(op.id),
                        op.kind);
    for (size_t i = 0; i < op.inputs.size(); ++i) {
      if (op.inputs[i] == kNoValue)
        continue;
      const Value &v = g.value(op.inputs[i]);
      // A weight is filled and updated locally, so any exact re-factoring
      // (LSTM's [D, 4H, I] as [D, 4, H, I]) works if all its users share
      // it; activations move between ops in their own shape.
      if (op.sem.inputs[i].isView &&
          (v.kind != ValueKind::Weight ||
           exec::weightShape(g, v) != op.sem.inputs[i].shape))
        return inputError("{}: operand {} is addressed through a view; "
                          "soap-run does not run it",
                          g.where(op.id), i);
      auto n = v.shape.numElements();
      if (v.kind == ValueKind::Constant && v.data.size() != 1 &&
          (!n || static_cast<int64_t>(v.data.size()) != *n))
        return inputError("{}: constant '{}' has no known data", g.where(op.id),
                          v.name);
    }
    if (auto err = k->check(g, op))
      return inputError("{}: {}", g.where(op.id), toString(std::move(err)));
  }
  bool loss = false;
  for (const Op &op : g.ops())
    loss |= op.kind == "SoftmaxCrossEntropyLoss";
  if (!loss)
    return inputError("{}: the model has no loss to train (was it imported "
                      "with --no-loss?)",
                      g.sourcePath);
  return llvm::Error::success();
}

namespace exec {

namespace {

bool contains(const std::vector<int> &v, int x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

/// Whether `o` saves its input `i` (or output `i`) for backward.
bool saves(const Op &o, int i, bool output) {
  for (const SavedOperand &so : o.sem.saved)
    if (so.isOutput == output && so.index == i)
      return true;
  return false;
}

} // namespace

void Runner::allReduce(const std::vector<bool> &keep, std::vector<Buf *> &rows,
                       Combine c) {
  const OpPlan &p = plan(cur_);
  std::vector<Src> srcs;
  std::vector<Dst> dsts;
  for (size_t k = 0; k < p.tiles.size(); ++k) {
    Box b = exec::loopSubsetBox(p.tiles[k], keep);
    int t = p.localTask[k];
    srcs.push_back({b, ranksOf(cur_, k), t < 0 ? nullptr : rows[t]});
    for (int r : ranksOf(cur_, k))
      dsts.push_back({b, r, r == me_ ? rows[t] : nullptr});
  }
  assemble(srcs, dsts, c);
}

void Runner::allGather(const std::vector<bool> &keep, int wide,
                       std::vector<Buf *> &rows, bool partial) {
  const OpPlan &p = plan(cur_);
  std::vector<Src> srcs;
  std::vector<Dst> dsts;
  // A source is laid out over its box: the tile's own range is copied
  // out of its (wide) buffer.
  std::vector<Buf> own(p.tiles.size());
  for (size_t k = 0; k < p.tiles.size(); ++k) {
    Box mine = exec::loopSubsetBox(p.tiles[k], keep);
    Box whole = mine;
    whole.lo[size_t(wide)] = 0;
    whole.hi[size_t(wide)] = g_.op(cur_).sem.loops[size_t(wide)].size;
    int t = p.localTask[k];
    if (partial) {
      srcs.push_back({whole, ranksOf(cur_, k), t < 0 ? nullptr : rows[t]});
    } else {
      if (t >= 0) {
        own[k].reset(mine);
        exec::combineRegion(mine, whole, rows[t]->data.data(), mine,
                            own[k].data.data(), Combine::Copy);
      }
      srcs.push_back({mine, ranksOf(cur_, k), t < 0 ? nullptr : &own[k]});
    }
    for (int r : ranksOf(cur_, k))
      dsts.push_back({whole, r, r == me_ ? rows[t] : nullptr});
  }
  assemble(srcs, dsts, Combine::Sum);
}

void Runner::setUp() {
  int32_t m = s_.pipeline.microBatches;
  plans_.assign(size_t(m), std::vector<OpPlan>(g_.numOps()));
  tasks_.assign(size_t(m), std::vector<std::vector<Task>>(g_.numOps()));
  for (int32_t mb = 0; mb < m; ++mb)
    for (const Op &op : g_.ops()) {
      const OpConfig &c = s_.configs[op.id];
      OpPlan &p = plans_[size_t(mb)][size_t(op.id)];
      int64_t n = c.numTiles();
      p.inReg.assign(op.inputs.size(), std::vector<Box>(n));
      p.outReg.assign(op.outputs.size(), std::vector<Box>(n));
      p.localTask.assign(n, -1);
      for (int64_t k = 0; k < n; ++k) {
        Box t = microBatchTile(c, op.sem, k, mb, m);
        p.tiles.push_back(t);
        for (size_t i = 0; i < op.inputs.size(); ++i)
          p.inReg[i][k] = op.inputs[i] == kNoValue
                              ? Box()
                              : op.sem.inputRegion(static_cast<int>(i), t);
        for (size_t j = 0; j < op.outputs.size(); ++j)
          p.outReg[j][k] = op.outputs[j] == kNoValue
                               ? Box()
                               : op.sem.outputRegion(static_cast<int>(j), t);
        for (int32_t r = 0; r < c.replicas; ++r)
          if (static_cast<int>(c.device(k, r)) == me_) {
            std::vector<Task> &ts = tasks_[size_t(mb)][size_t(op.id)];
            p.localTask[k] = static_cast<int>(ts.size());
            Task task;
            task.tile = k;
            task.replica = r;
            task.loops = t;
            ts.push_back(std::move(task));
          }
      }
    }
  // Integer inputs draw from [0, range): the classes of a loss's labels,
  // the rows of an embedding's table.
  for (const Op &op : g_.ops()) {
    auto note = [&](size_t i, int64_t range) {
      if (op.input(i) == kNoValue)
        return;
      auto [it, fresh] = intRange_.emplace(op.input(i), range);
      if (!fresh)
        it->second = std::min(it->second, range);
    };
    if (op.kind == "SoftmaxCrossEntropyLoss") {
      const TensorShape &scores = g_.value(op.inputs[0]).shape;
      int64_t axis = op.getInt("class_axis", 1);
      if (axis < 0)
        axis += static_cast<int64_t>(scores.rank());
      note(1, scores[static_cast<size_t>(axis)]);
    }
    if (op.kind == "Gather" && !op.sem.inputs[1].dims.empty())
      note(1, g_.value(op.inputs[0]).shape[0]);
  }
  recomputed_.assign(size_t(m), std::vector<uint8_t>(g_.numOps(), 0));
}

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

/// What a recomputed op keeps of input `i` through its backward: the
/// activations that kept ops (or the graph's inputs) gave it, which its
/// forward reads again.
static bool keptForRecompute(const Graph &g, const Strategy &s, const Op &op,
                             size_t i) {
  ValueId v = op.inputs[i];
  if (v == kNoValue || !g.value(v).isActivationLike())
    return false;
  OpId p = g.value(v).producer;
  return p < 0 || !s.recomputes(p);
}

/// Whether `o` keeps output `j` from its forward to its backward.
static bool keepsOutput(const Strategy &s, const Op &op, size_t j) {
  if (op.kind == "SoftmaxCrossEntropyLoss" && j == 0)
    return true; // the loss, read after the step
  return !s.recomputes(op.id) && saves(op, int(j), true);
}

/// A Dropout's output: its kernel keeps the byte mask it drew (Task::mask),
/// all its backward reads, so the output itself is kept for nobody.
static bool dropoutMask(const Op &op, size_t j) {
  return op.kind == "Dropout" && j == 0;
}

static bool isMaxPool(const Op &op) {
  return llvm::StringRef(op.kind).contains("MaxPool");
}

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

static bool rerunsForward(const Op &op, const ExecOptions &opts) {
  return rerunsForward(op, opts.backend);
}

/// Ops whose backward kernel reads operands beyond what the semantics
/// save (the generic element-wise loop reads every input and the output;
/// LSTM its whole state), and
/// every op of the CUDA backend: they keep all their operands.
static bool keepsAllOperands(const Op &op, const ExecOptions &opts) {
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
      // A max pool's backward reads only its argmax.
      bool keep = (v != kNoValue && !isFloating(g_.value(v).dtype)) ||
                  (!isMaxPool(op) && !rc && saves(op, int(i), false)) ||
                  (v != kNoValue && !rc && rerunsForward(op, opts_) &&
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

void Runner::sendForward(int32_t stage) {
  const Pipeline &pipe = s_.pipeline;
  if (pipe.numStages() < 2)
    return;
  for (const Op &c : g_.ops()) {
    if (pipe.stage(c.id) == stage)
      continue;
    for (size_t i = 0; i < c.inputs.size(); ++i) {
      ValueId v = c.inputs[i];
      if (v == kNoValue || g_.value(v).kind != ValueKind::Activation ||
          pipe.stage(g_.value(v).producer) != stage)
        continue;
      for (Task &t : tasks(c.id))
        t.in.resize(c.inputs.size());
      gatherInput(c.id, i);
      sent_[size_t(mb_)][size_t(c.id)][i] = 1;
      OpId prod = g_.value(v).producer;
      size_t j = size_t(g_.value(v).producerOutput);
      if (--pending_[size_t(mb_)][size_t(prod)][j] == 0)
        outputRead(prod, j);
    }
  }
}

llvm::Error Runner::runItem(int32_t stage, PipePass pass) {
  const Pipeline &pipe = s_.pipeline;
  auto one = [&](OpId o) -> llvm::Error {
    if (pipe.stage(o) != stage)
      return llvm::Error::success();
    if (pass == PipePass::Forward)
      forward(o);
    else if (pass == PipePass::Backward)
      backward(o);
    else
      accumulateGradients(o);
    return backendError(o);
  };
  if (pass == PipePass::Forward) {
    for (const Op &op : g_.ops())
      if (auto err = one(op.id))
        return err;
    sendForward(stage);
  } else {
    for (size_t o = g_.numOps(); o-- > 0;)
      if (auto err = one(static_cast<OpId>(o)))
        return err;
  }
  return llvm::Error::success();
}

llvm::Error Runner::runStep() {
  const Pipeline &pipe = s_.pipeline;
  int32_t S = pipe.numStages(), m = pipe.microBatches;
  pending_.assign(size_t(m), std::vector<std::vector<int>>(g_.numOps()));
  rereads_.assign(size_t(m), {});
  sent_.assign(size_t(m), std::vector<std::vector<uint8_t>>(g_.numOps()));
  for (int32_t mb = 0; mb < m; ++mb) {
    for (const Op &op : g_.ops()) {
      pending_[size_t(mb)][size_t(op.id)].assign(op.outputs.size(), 0);
      sent_[size_t(mb)][size_t(op.id)].assign(op.inputs.size(), 0);
    }
    for (const Op &op : g_.ops())
      for (ValueId v : op.inputs)
        if (v != kNoValue && g_.value(v).kind == ValueKind::Activation)
          ++pending_[size_t(mb)][size_t(g_.value(v).producer)]
                    [size_t(g_.value(v).producerOutput)];
    rereads_[size_t(mb)] = pending_[size_t(mb)];
    for (auto &per : rereads_[size_t(mb)])
      std::fill(per.begin(), per.end(), 0);
    for (const Op &op : g_.ops())
      if (s_.recomputes(op.id))
        for (ValueId v : op.inputs)
          if (v != kNoValue && g_.value(v).kind == ValueKind::Activation &&
              s_.recomputes(g_.value(v).producer))
            ++rereads_[size_t(mb)][size_t(g_.value(v).producer)]
                      [size_t(g_.value(v).producerOutput)];
    std::fill(recomputed_[size_t(mb)].begin(), recomputed_[size_t(mb)].end(),
              0);
  }
  // Each device group's items in its schedule's order (all forwards then
  // all backwards under GPipe; 1F1B's warm-up, steady state and drain,
  // interleaved over the group's stages; zb-h1's delayed weight
  // gradients), each run as soon as the previous stage's forward (the next
  // stage's backward, the stage's own backward) of the micro-batch has run:
  // every group holds the micro-batches its schedule holds, and every rank
  // walks the same sequence.
  int32_t G = pipe.numGroups();
  std::vector<std::vector<PipeItem>> order(static_cast<size_t>(G));
  for (int32_t grp = 0; grp < G; ++grp)
    order[size_t(grp)] = pipe.order(grp);
  std::vector<size_t> next(size_t(G), 0);
  std::vector<std::vector<uint8_t>> fwd(size_t(S),
                                        std::vector<uint8_t>(size_t(m), 0));
  std::vector<std::vector<uint8_t>> bwd = fwd;
  size_t left = 0;
  for (const auto &o : order)
    left += o.size();
  while (left > 0) {
    bool progress = false;
    for (int32_t grp = 0; grp < G; ++grp) {
      while (next[size_t(grp)] < order[size_t(grp)].size()) {
        const PipeItem &it = order[size_t(grp)][next[size_t(grp)]];
        size_t s = size_t(it.stage), mb = size_t(it.microBatch);
        bool ready = false;
        switch (it.pass) {
        case PipePass::Forward:
          ready = s == 0 || fwd[s - 1][mb];
          break;
        case PipePass::Backward:
          ready = fwd[s][mb] && (s + 1 == size_t(S) || bwd[s + 1][mb]);
          break;
        case PipePass::Weight:
          ready = bwd[s][mb];
          break;
        }
        if (!ready)
          break;
        mb_ = it.microBatch;
        if (auto err = runItem(it.stage, it.pass))
          return err;
        if (it.pass != PipePass::Weight)
          (it.pass == PipePass::Backward ? bwd : fwd)[s][mb] = 1;
        ++next[size_t(grp)];
        --left;
        progress = true;
      }
    }
    if (!progress)
      return internalError("the pipeline's schedule is stuck");
  }
  mb_ = 0;
  return llvm::Error::success();
}

double Runner::gatherLoss() {
  double total = 0;
  for (const Op &op : g_.ops()) {
    if (op.kind != "SoftmaxCrossEntropyLoss")
      continue;
    std::vector<Src> srcs;
    for (mb_ = 0; mb_ < s_.pipeline.microBatches; ++mb_)
      for (size_t k = 0; k < plan(op.id).tiles.size(); ++k) {
        const Task *t = localTask(op.id, k);
        srcs.push_back({plan(op.id).outReg[0][k], ranksOf(op.id, k),
                        t ? &t->out[0] : nullptr});
      }
    mb_ = 0;
    Buf loss;
    assemble(srcs, {{Box::full({}), 0, me_ == 0 ? &loss : nullptr}},
             Combine::Sum);
    if (me_ == 0)
      total += loss.data[0];
  }
  return total;
}

std::vector<int64_t> Runner::gatherPeaks(int64_t mine) {
  int n = comm_.size();
  // Each rank's count as the bits of two floats (exchange moves floats).
  std::vector<float> words(size_t(2 * n));
  std::memcpy(&words[size_t(2 * me_)], &mine, sizeof mine);
  std::vector<Comm::Message> sends, recvs;
  if (me_ != 0)
    sends.push_back({0, 32002, &words[size_t(2 * me_)], 2});
  else
    for (int r = 1; r < n; ++r)
      recvs.push_back({r, 32002, &words[size_t(2 * r)], 2});
  if (n > 1)
    comm_.exchange(sends, recvs);
  std::vector<int64_t> peaks(size_t(n), 0);
  if (me_ == 0)
    for (int r = 0; r < n; ++r)
      std::memcpy(&peaks[size_t(r)], &words[size_t(2 * r)], sizeof(int64_t));
  return peaks;
}

llvm::Expected<std::vector<StepResult>> Runner::run() {
  setUp();
  if (auto err = setUpWeights())
    return llvm::Error(std::move(err));
  std::vector<StepResult> results;
  for (step_ = 0; step_ < opts_.steps; ++step_) {
    comm_.barrier();
    resetPeak();
    auto t0 = std::chrono::steady_clock::now();
    if (auto err = runStep())
      return llvm::Error(std::move(err));
    double loss = gatherLoss();
    syncWeights();
    int64_t peak = peakBytes();
    comm_.barrier();
    auto t1 = std::chrono::steady_clock::now();
    results.push_back({loss, std::chrono::duration<double>(t1 - t0).count(),
                       gatherPeaks(peak)});
  }
  if (!opts_.dumpWeightsDir.empty())
    if (auto err = dumpWeights())
      return llvm::Error(std::move(err));
  return results;
}

} // namespace exec

int kernelThreads(const ExecOptions &opts, const Comm &comm) {
  if (opts.threads > 0)
    return opts.threads;
  return std::max(1, availableCores() / std::max(1, comm.localSize()));
}

llvm::Error prepareBackend(const ExecOptions &opts, const Comm &comm) {
  exec::setKernelThreads(kernelThreads(opts, comm));
  // Every op's buffers are allocated and freed at every step: keep freed
  // memory in the heap for the next op rather than handing it back to the
  // kernel, whose fresh pages would each cost a fault and a clear.
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
#ifdef SOAP_HAVE_CUDA
  if (opts.backend == "cuda")
    return exec::initCudaBackend(comm.rank());
#endif
  return llvm::Error::success();
}

llvm::Expected<std::vector<StepResult>> runTraining(const Graph &g,
                                                    const Strategy &s,
                                                    Comm &comm,
                                                    const ExecOptions &opts) {
  if (auto err = opts.validate())
    return llvm::Error(std::move(err));
  if (auto err = checkExecutable(g))
    return llvm::Error(std::move(err));
  if (auto err = prepareBackend(opts, comm))
    return llvm::Error(std::move(err));
  exec::Runner r(g, s, comm, opts);
  return r.run();
}

} // namespace soap
