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

namespace exec {

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
  setUpForwardDump();
  Json forwardWeights;
  if (!opts_.dumpForwardDir.empty()) {
    auto w = startForwardDump();
    if (!w)
      return w.takeError();
    forwardWeights = std::move(*w);
  }
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
    if (step_ == 0 && !opts_.dumpForwardDir.empty())
      if (auto err = dumpForward(forwardWeights))
        return llvm::Error(std::move(err));
  }
  if (!opts_.dumpWeightsDir.empty())
    if (auto err = dumpWeights())
      return llvm::Error(std::move(err));
  return results;
}

} // namespace exec

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
