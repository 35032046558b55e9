// The reference executor's driver: every rank walks the graph in the same
// order, builds its tasks' operand boxes with `assemble`, runs the kernels,
// and after the backward pass sums every weight's gradient over the tiles
// that read it and takes an SGD step on the elements it holds.
#include "soap/Exec/Executor.h"

#include "Assemble.h"
#include "Gemm.h"
#include "Kernels.h"
#include "soap/Support/Error.h"
#include "soap/Support/Json.h"
#include "soap/Support/Rng.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include <chrono>
#include <cmath>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <limits>
#include <malloc.h>
#include <map>
#include <sched.h>
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
  if (!(learningRate > 0) || !std::isfinite(learningRate))
    return inputError("--lr must be a positive number, got {}", learningRate);
  return llvm::Error::success();
}

/// The shape a weight is addressed in: its users' view where they share
/// one (checkExecutable refuses others), else its own.
static const std::vector<int64_t> &weightShape(const Graph &g, const Value &w) {
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
           weightShape(g, v) != op.sem.inputs[i].shape))
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

namespace {

using exec::Buf;
using exec::Combine;
using exec::Dst;
using exec::Src;
using exec::Task;

bool contains(const std::vector<int> &v, int x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

class Runner : public exec::StatsExchange {
public:
  Runner(const Graph &g, const Strategy &s, Comm &comm, const ExecOptions &opts)
      : g_(g), s_(s), comm_(comm), opts_(opts), me_(comm.rank()) {}

  llvm::Expected<std::vector<StepResult>> run();

  void allReduce(const std::vector<bool> &keep, std::vector<Buf *> &rows,
                 Combine c) override;
  void allGather(const std::vector<bool> &keep, int wide,
                 std::vector<Buf *> &rows, bool partial) override;

private:
  struct OpPlan {
    std::vector<Box> tiles;
    std::vector<std::vector<Box>> inReg, outReg; // [operand][tile]
    std::vector<int> localTask;                  // per tile, -1 if none
  };

  std::vector<int> ranksOf(OpId o, int64_t k) const {
    const OpConfig &c = s_.configs[o];
    std::vector<int> r;
    for (int32_t x = 0; x < c.replicas; ++x)
      r.push_back(static_cast<int>(c.device(k, x)));
    return r;
  }
  /// The current micro-batch's plan and tasks of op `o`.
  const OpPlan &plan(OpId o) const { return plans_[size_t(mb_)][size_t(o)]; }
  std::vector<Task> &tasks(OpId o) { return tasks_[size_t(mb_)][size_t(o)]; }
  const Task *localTask(OpId o, int64_t k) const {
    int t = plan(o).localTask[k];
    return t < 0 ? nullptr : &tasks_[size_t(mb_)][size_t(o)][size_t(t)];
  }
  Task *localTask(OpId o, int64_t k) {
    int t = plan(o).localTask[k];
    return t < 0 ? nullptr : &tasks_[size_t(mb_)][size_t(o)][size_t(t)];
  }

  void assemble(const std::vector<Src> &srcs, const std::vector<Dst> &dsts,
                Combine c) {
    exec::assemble(comm_, srcs, dsts, c);
  }
  void setUp();
  void initWeights();
  void fillLocal(const Value &v, const Box &box, Buf &out);
  void forward(OpId o);
  void backward(OpId o);
  void syncWeights();
  double gatherLoss();
  llvm::Error dumpWeights();
  llvm::Error backendError(OpId o) const {
    std::string e = exec::takeBackendError();
    if (e.empty())
      return llvm::Error::success();
    return internalError("{}: {} backend: {}", g_.where(o), opts_.backend, e);
  }

  const Graph &g_;
  const Strategy &s_;
  Comm &comm_;
  const ExecOptions &opts_;
  int me_;
  int64_t step_ = 0;
  OpId cur_ = -1;
  int32_t mb_ = 0; ///< the micro-batch being run
  /// Per micro-batch and op (one micro-batch without a pipeline).
  std::vector<std::vector<OpPlan>> plans_;
  std::vector<std::vector<std::vector<Task>>> tasks_;
  std::map<ValueId, std::vector<float>> weights_; // full copies, by value
  std::map<ValueId, int64_t> intRange_;           // integer inputs' range
};

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
}

void Runner::initWeights() {
  for (const Op &op : g_.ops()) {
    if (tasks_[0][size_t(op.id)].empty())
      continue;
    for (ValueId v : op.inputs) {
      if (v == kNoValue || g_.value(v).kind != ValueKind::Weight ||
          weights_.count(v))
        continue;
      const Value &w = g_.value(v);
      int64_t n = *w.shape.numElements();
      // Uniform in +-1/sqrt(fan-in) for matrices and kernels; a norm's
      // scale near 1; other vectors (biases) small.
      bool scale = false;
      for (OpId u : w.users) {
        const Op &uo = g_.op(u);
        if ((uo.kind == "BatchNormalization" ||
             uo.kind == "LayerNormalization") &&
            uo.input(1) == v)
          scale = true;
      }
      double a = w.shape.rank() >= 2
                     ? 1 / std::sqrt(static_cast<double>(n / w.shape[0]))
                     : 0.1;
      uint64_t stream = fnv1a(w.name);
      std::vector<float> data(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        double u = 2 * hashUniform(opts_.seed, stream, i) - 1;
        data[i] = static_cast<float>(scale ? 1 + 0.1 * u : a * u);
      }
      weights_[v] = std::move(data);
    }
  }
}

void Runner::fillLocal(const Value &v, const Box &box, Buf &out) {
  out.reset(box);
  // Row-major flat indices of a view equal the tensor's (an exact
  // re-factoring), so a view's box indexes the same data.
  const std::vector<int64_t> &shape =
      v.kind == ValueKind::Weight ? weightShape(g_, v) : v.shape.dims;
  switch (v.kind) {
  case ValueKind::Weight: {
    const std::vector<float> &w = weights_.at(v.id);
    exec::forEachIndexRun(box, shape,
                          [&](int64_t flat, int64_t off, int64_t n) {
                            std::copy(w.begin() + flat, w.begin() + flat + n,
                                      out.data.begin() + off);
                          });
    break;
  }
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
    break;
  }
  default: // running statistics: unused by training-mode kernels
    break;
  }
}

void Runner::forward(OpId o) {
  cur_ = o;
  const Op &op = g_.op(o);
  const OpPlan &p = plan(o);
  std::vector<Task> &ts = tasks(o);
  for (Task &t : ts) {
    t.in.assign(op.inputs.size(), Buf());
    t.out.assign(op.outputs.size(), Buf());
  }
  for (size_t i = 0; i < op.inputs.size(); ++i) {
    ValueId vid = op.inputs[i];
    if (vid == kNoValue)
      continue;
    const Value &v = g_.value(vid);
    if (v.kind != ValueKind::Activation) {
      for (Task &t : ts)
        fillLocal(v, p.inReg[i][t.tile], t.in[i]);
      continue;
    }
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
  }
  for (Task &t : ts)
    for (size_t j = 0; j < op.outputs.size(); ++j)
      if (op.outputs[j] != kNoValue)
        t.out[j].reset(p.outReg[j][t.tile]);
  exec::KernelCtx ctx{g_, op, ts, *this, opts_.seed, step_};
  exec::findKernel(op.kind, opts_.backend)->forward(ctx);
}

void Runner::backward(OpId o) {
  cur_ = o;
  const Op &op = g_.op(o);
  const OpPlan &p = plan(o);
  std::vector<Task> &ts = tasks(o);
  for (Task &t : ts) {
    t.gout.assign(op.outputs.size(), Buf());
    t.gin.assign(op.inputs.size(), Buf());
    for (size_t i = 0; i < op.inputs.size(); ++i)
      if (op.inputs[i] != kNoValue && isFloating(g_.value(op.inputs[i]).dtype))
        t.gin[i].reset(p.inReg[i][t.tile]);
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
    std::vector<Src> srcs;
    std::set<OpId> users(v.users.begin(), v.users.end());
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
  exec::KernelCtx ctx{g_, op, ts, *this, opts_.seed, step_};
  exec::findKernel(op.kind, opts_.backend)->backward(ctx);
  // Nothing after this op's backward reads its operands (its consumers
  // have run both passes), only the gradients it gave its inputs and a
  // loss's value: free the rest, so a step's memory peaks once.
  for (Task &t : ts) {
    t.in.clear();
    t.gout.clear();
    t.saved.clear();
    t.arg.clear();
    if (!loss)
      t.out.clear();
  }
}

/// Every tile that read weight `w`, in op, operand and tile order.
template <class F> void forEachWeightTile(const Graph &g, ValueId w, F f) {
  std::set<OpId> users(g.value(w).users.begin(), g.value(w).users.end());
  for (OpId u : users) {
    const Op &op = g.op(u);
    for (size_t i = 0; i < op.inputs.size(); ++i)
      if (op.inputs[i] == w)
        f(u, static_cast<int>(i));
  }
}

void Runner::syncWeights() {
  for (const Value &w : g_.values()) {
    if (w.kind != ValueKind::Weight || w.users.empty())
      continue;
    std::vector<Src> srcs;
    std::vector<Dst> dsts;
    std::set<std::pair<int, std::vector<int64_t>>> seen;
    std::vector<Buf> grads;
    std::vector<std::tuple<int, Box>> want;
    // Every micro-batch's gradient of every shard: summed by the
    // assembly (gradient accumulation and synchronisation at once).
    forEachWeightTile(g_, w.id, [&](OpId u, int i) {
      for (mb_ = 0; mb_ < s_.pipeline.microBatches; ++mb_)
        for (size_t k = 0; k < plan(u).tiles.size(); ++k) {
          const Task *t = localTask(u, k);
          srcs.push_back(
              {plan(u).inReg[i][k], ranksOf(u, k), t ? &t->gin[i] : nullptr});
        }
      mb_ = 0;
      for (size_t k = 0; k < plan(u).tiles.size(); ++k) {
        const Box &b = plan(u).inReg[i][k];
        for (int r : ranksOf(u, k)) {
          std::vector<int64_t> key = b.lo;
          key.insert(key.end(), b.hi.begin(), b.hi.end());
          if (seen.insert({r, key}).second)
            want.emplace_back(r, b);
        }
      }
    });
    grads.resize(want.size());
    for (size_t d = 0; d < want.size(); ++d) {
      int r = std::get<0>(want[d]);
      dsts.push_back({std::get<1>(want[d]), r, r == me_ ? &grads[d] : nullptr});
    }
    assemble(srcs, dsts, Combine::Sum);
    auto it = weights_.find(w.id);
    if (it == weights_.end())
      continue;
    std::vector<float> &data = it->second;
    float lr = static_cast<float>(opts_.learningRate);
    size_t mine = 0;
    for (const auto &wd : want)
      mine += std::get<0>(wd) == me_;
    if (mine == 1) {
      // One box: every element of it once, no bookkeeping.
      for (size_t d = 0; d < want.size(); ++d)
        if (std::get<0>(want[d]) == me_)
          exec::forEachIndexRun(grads[d].box, weightShape(g_, w),
                                [&](int64_t flat, int64_t off, int64_t n) {
                                  const float *gp = grads[d].data.data() + off;
                                  float *wp = data.data() + flat;
                                  for (int64_t k = 0; k < n; ++k)
                                    wp[k] -= lr * gp[k];
                                });
      continue;
    }
    std::vector<bool> done(data.size(), false);
    for (size_t d = 0; d < want.size(); ++d) {
      if (std::get<0>(want[d]) != me_)
        continue;
      exec::forEachIndexRun(grads[d].box, weightShape(g_, w),
                            [&](int64_t flat, int64_t off, int64_t n) {
                              const float *g = grads[d].data.data() + off;
                              for (int64_t k = 0; k < n; ++k)
                                if (!done[flat + k]) {
                                  data[flat + k] -= lr * g[k];
                                  done[flat + k] = true;
                                }
                            });
    }
  }
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

std::string fileNameOf(llvm::StringRef name) {
  std::string s;
  for (char c : name)
    s += std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-'
             ? c
             : '_';
  return s;
}

llvm::Error Runner::dumpWeights() {
  if (me_ == 0)
    if (std::error_code ec =
            llvm::sys::fs::create_directories(opts_.dumpWeightsDir))
      return inputError("{}: cannot create: {}", opts_.dumpWeightsDir,
                        ec.message());
  Json manifest = Json::array();
  for (const Value &w : g_.values()) {
    if (w.kind != ValueKind::Weight || w.users.empty())
      continue;
    std::vector<Src> srcs;
    std::vector<Buf> held;
    // Reserve so the pointers in srcs stay valid.
    size_t n = 0;
    forEachWeightTile(g_, w.id,
                      [&](OpId u, int) { n += plan(u).tiles.size(); });
    held.reserve(n);
    forEachWeightTile(g_, w.id, [&](OpId u, int i) {
      for (size_t k = 0; k < plan(u).tiles.size(); ++k) {
        const Box &b = plan(u).inReg[i][k];
        const Buf *local = nullptr;
        if (localTask(u, k)) {
          held.emplace_back();
          fillLocal(w, b, held.back());
          local = &held.back();
        }
        srcs.push_back({b, ranksOf(u, k), local});
      }
    });
    Buf whole;
    assemble(srcs, {{Box::full(w.shape.dims), 0, me_ == 0 ? &whole : nullptr}},
             Combine::Copy);
    if (me_ != 0)
      continue;
    std::string file = fmt::format("{}-{}.f32", w.id, fileNameOf(w.name));
    std::string bytes(reinterpret_cast<const char *>(whole.data.data()),
                      whole.data.size() * sizeof(float));
    llvm::SmallString<256> path(opts_.dumpWeightsDir);
    llvm::sys::path::append(path, file);
    if (auto err = writeFileAtomic(path, bytes))
      return err;
    manifest.push_back(
        Json{{"name", w.name}, {"file", file}, {"shape", w.shape.dims}});
  }
  if (me_ != 0)
    return llvm::Error::success();
  llvm::SmallString<256> path(opts_.dumpWeightsDir);
  llvm::sys::path::append(path, "weights.json");
  return writeFileAtomic(path, dumpJson(Json{{"weights", manifest}}));
}

llvm::Expected<std::vector<StepResult>> Runner::run() {
  setUp();
  initWeights();
  std::vector<StepResult> results;
  for (step_ = 0; step_ < opts_.steps; ++step_) {
    comm_.barrier();
    auto t0 = std::chrono::steady_clock::now();
    // Micro-batch by micro-batch, every rank stepping through the same
    // sequence of ops (each op's exchanges are matched on every rank): the
    // numbers of any schedule, gradients summed over the micro-batches.
    for (mb_ = 0; mb_ < s_.pipeline.microBatches; ++mb_) {
      for (const Op &op : g_.ops()) {
        forward(op.id);
        if (auto err = backendError(op.id))
          return llvm::Error(std::move(err));
      }
      for (size_t o = g_.numOps(); o-- > 0;) {
        backward(static_cast<OpId>(o));
        if (auto err = backendError(static_cast<OpId>(o)))
          return llvm::Error(std::move(err));
      }
    }
    mb_ = 0;
    double loss = gatherLoss();
    syncWeights();
    comm_.barrier();
    auto t1 = std::chrono::steady_clock::now();
    results.push_back({loss, std::chrono::duration<double>(t1 - t0).count()});
  }
  if (!opts_.dumpWeightsDir.empty())
    if (auto err = dumpWeights())
      return llvm::Error(std::move(err));
  return results;
}

} // namespace

int kernelThreads(const ExecOptions &opts, const Comm &comm) {
  if (opts.threads > 0)
    return opts.threads;
  cpu_set_t set;
  int cores = sched_getaffinity(0, sizeof(set), &set) == 0
                  ? CPU_COUNT(&set)
                  : static_cast<int>(std::thread::hardware_concurrency());
  return std::max(1, cores / std::max(1, comm.localSize()));
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
  Runner r(g, s, comm, opts);
  return r.run();
}

} // namespace soap
