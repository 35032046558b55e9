// The executor's weights: each rank holds the distinct boxes of a weight
// that its tiles read (as the simulator counts them), lends them to the
// kernels, accumulates their gradients over the micro-batches and takes the
// optimizer step after summing them over each box's data-parallel group —
// an all-reduce, or ZeRO (DESIGN.md, "memory choices"): stage 1
// reduce-scatters the gradients once per step, updates this member's part
// of the weight and optimizer state and all-gathers the parts; stage 2
// keeps only the gradient's part (reduce-scattered after every
// micro-batch); stage 3 also only the weight's part, all-gathered before
// every forward and backward of its users and freed after.
#include "Runner.h"

#include "soap/Support/Error.h"
#include "soap/Support/Rng.h"
#include <cmath>
#include <fmt/format.h>

namespace soap {
namespace exec {

namespace {

/// Optimizer state floats per weight element.
int stateFactor(const std::string &optimizer) {
  return optimizer == "adam" ? 2 : optimizer == "momentum" ? 1 : 0;
}

/// The initial values of `box` of weight `w`: uniform in +-1/sqrt(fan-in)
/// for matrices and kernels, a norm's scale near 1, other vectors (biases)
/// small; drawn by the element's index in the whole tensor.
void initialValues(const Graph &g, const Value &w, uint64_t seed,
                   const Box &box, Buf &out) {
  out.reset(box);
  int64_t n = *w.shape.numElements();
  bool scale = false;
  for (OpId u : w.users) {
    const Op &uo = g.op(u);
    if ((uo.kind == "BatchNormalization" || uo.kind == "LayerNormalization") &&
        uo.input(1) == w.id)
      scale = true;
  }
  double a = w.shape.rank() >= 2
                 ? 1 / std::sqrt(static_cast<double>(n / w.shape[0]))
                 : 0.1;
  uint64_t stream = fnv1a(w.name);
  forEachIndexRun(box, weightShape(g, w),
                  [&](int64_t flat, int64_t off, int64_t cnt) {
                    for (int64_t k = 0; k < cnt; ++k) {
                      double u = 2 * hashUniform(seed, stream, flat + k) - 1;
                      out.data[size_t(off + k)] =
                          static_cast<float>(scale ? 1 + 0.1 * u : a * u);
                    }
                  });
}

} // namespace

llvm::Error Runner::setUpWeights() {
  prevWeighted_.assign(g_.numOps(), -1);
  OpId lastWeighted = -1;
  for (const Op &op : g_.ops()) {
    prevWeighted_[size_t(op.id)] = lastWeighted;
    if (!op.sem.weightInputs.empty())
      lastWeighted = op.id;
  }
  std::map<ValueId, std::vector<std::pair<std::vector<int64_t>, size_t>>> seen;
  boxOf_.assign(g_.numOps(), {});
  int32_t saveMb = mb_;
  mb_ = 0;
  for (const Op &op : g_.ops()) {
    boxOf_[size_t(op.id)].resize(op.inputs.size());
    for (size_t i = 0; i < op.inputs.size(); ++i) {
      ValueId w = op.inputs[i];
      if (w == kNoValue || g_.value(w).kind != ValueKind::Weight)
        continue;
      auto last = lastUser_.emplace(w, op.id).first;
      last->second = std::min(last->second, op.id);
      for (size_t k = 0; k < plan(op.id).tiles.size(); ++k) {
        const Box &b = plan(op.id).inReg[i][k];
        std::vector<int64_t> key = b.lo;
        key.insert(key.end(), b.hi.begin(), b.hi.end());
        size_t idx = boxes_.size();
        for (const auto &[bk, x] : seen[w])
          if (bk == key)
            idx = x;
        if (idx == boxes_.size()) {
          seen[w].emplace_back(key, idx);
          boxesOfWeight_[w].push_back(idx);
          boxes_.emplace_back();
          boxes_.back().w = w;
          boxes_.back().box = b;
        }
        boxOf_[size_t(op.id)][i].push_back(idx);
        for (int r : ranksOf(op.id, int64_t(k)))
          boxes_[idx].group.push_back(r);
      }
    }
  }
  mb_ = saveMb;
  int factor = stateFactor(opts_.optimizer);
  for (auto &[w, idxs] : boxesOfWeight_) {
    const Value &wv = g_.value(w);
    for (size_t a = 0; a < idxs.size(); ++a)
      for (size_t b = a + 1; b < idxs.size(); ++b)
        if (!boxes_[idxs[a]].box.intersect(boxes_[idxs[b]].box).empty())
          unclean_.insert(w);
    int zs = weightZeroStage(g_, s_, w);
    for (size_t idx : idxs) {
      WeightBox &wb = boxes_[idx];
      std::sort(wb.group.begin(), wb.group.end());
      wb.group.erase(std::unique(wb.group.begin(), wb.group.end()),
                     wb.group.end());
      size_t D = wb.group.size();
      wb.zero = D > 1 ? zs : 0;
      if (wb.zero > 0 && unclean_.count(w))
        return inputError("{}: ZeRO-{} on weight '{}', whose shards overlap "
                          "partially (ops split it differently): soap-run "
                          "shards only boxes that groups hold whole",
                          g_.sourcePath, wb.zero, wv.name);
      size_t n = size_t(wb.box.volume());
      size_t chunk = (n + D - 1) / D;
      wb.counts.resize(D);
      for (size_t k = 0; k < D; ++k)
        wb.counts[k] = std::min(chunk, n - std::min(n, k * chunk));
      auto it = std::find(wb.group.begin(), wb.group.end(), me_);
      if (it == wb.group.end())
        continue;
      wb.member = int(it - wb.group.begin());
      wb.offset = std::min(n, size_t(wb.member) * chunk);
      wb.part = wb.counts[size_t(wb.member)];
      Buf whole;
      initialValues(g_, wv, opts_.seed, wb.box, whole);
      if (bf16_) {
        // The fp32 master (this member's part under ZeRO, as the
        // optimizer state); the kernels read its bf16 rounding.
        size_t at = wb.zero >= 1 ? wb.offset : 0;
        size_t len = wb.zero >= 1 ? wb.part : n;
        wb.master.assign(whole.data.begin() + long(at),
                         whole.data.begin() + long(at + len));
        roundStored(whole);
      }
      if (wb.zero == 3)
        wb.shard.assign(whole.data.begin() + long(wb.offset),
                        whole.data.begin() + long(wb.offset + wb.part));
      else
        wb.weight = std::move(whole);
      wb.grad.assign(wb.zero >= 2 ? wb.part : n, 0.0f);
      size_t state = wb.zero >= 1 ? wb.part : n;
      if (factor >= 1)
        wb.m.assign(state, 0.0f);
      if (factor >= 2)
        wb.v.assign(state, 0.0f);
    }
  }
  return llvm::Error::success();
}

const Buf &Runner::wholeMaster(WeightBox &wb, Buf &tmp) {
  if (!bf16_)
    return wholeWeight(wb, tmp);
  tmp.box = wb.box;
  tmp.data.assign(size_t(wb.box.volume()), 0.0f);
  size_t at = wb.zero >= 1 ? wb.offset : 0;
  std::copy(wb.master.begin(), wb.master.end(), tmp.data.begin() + long(at));
  if (wb.zero >= 1)
    comm_.allGather(wb.group, tmp.data.data(), wb.counts);
  return tmp;
}

const Buf &Runner::wholeWeight(WeightBox &wb, Buf &tmp) {
  if (wb.zero < 3)
    return wb.weight;
  tmp.box = wb.box;
  tmp.data.assign(size_t(wb.box.volume()), 0.0f);
  std::copy(wb.shard.begin(), wb.shard.end(),
            tmp.data.begin() + long(wb.offset));
  comm_.allGather(wb.group, tmp.data.data(), wb.counts);
  return tmp;
}

void Runner::prefetchWeights(OpId o) {
  OpId w = prevWeighted_[size_t(o)];
  if (g_.op(o).sem.weightInputs.empty() || w < 0 ||
      s_.pipeline.stage(w) != s_.pipeline.stage(o))
    return;
  // The boxes in the order lendWeights(w) would gather them, so every
  // member of a group gathers its boxes in one order.
  for (const std::vector<size_t> &idxOf : boxOf_[size_t(w)])
    for (size_t idx : idxOf) {
      WeightBox &wb = boxes_[idx];
      if (wb.zero != 3 || wb.member < 0 || prefetched_.count(idx))
        continue;
      wholeWeight(wb, prefetched_[idx]);
    }
}

void Runner::lendWeights(OpId o, bool backwardPass) {
  const Op &op = g_.op(o);
  std::vector<Task> &ts = tasks(o);
  for (size_t i = 0; i < op.inputs.size(); ++i) {
    const std::vector<size_t> &idxOf = boxOf_[size_t(o)][i];
    if (idxOf.empty())
      continue;
    // ZeRO-3: every group that holds one of the op's boxes gathers it, in
    // tile order (its members reach here in the same order), unless the
    // backward pass prefetched it.
    std::vector<size_t> done;
    for (size_t idx : idxOf) {
      WeightBox &wb = boxes_[idx];
      if (wb.zero != 3 || wb.member < 0 ||
          std::find(done.begin(), done.end(), idx) != done.end())
        continue;
      done.push_back(idx);
      Buf tmp;
      auto ahead = prefetched_.find(idx);
      if (backwardPass && ahead != prefetched_.end()) {
        tmp = std::move(ahead->second);
        prefetched_.erase(ahead);
      } else {
        wholeWeight(wb, tmp);
      }
      for (Task &t : ts)
        if (idxOf[size_t(t.tile)] == idx)
          t.in[i] = std::move(tmp);
    }
    for (Task &t : ts) {
      WeightBox &wb = boxes_[idxOf[size_t(t.tile)]];
      if (wb.zero == 3)
        continue;
      if (!wb.weight.data.empty()) {
        t.in[i] = std::move(wb.weight);
        wb.weight.data = FloatVec();
      } else {
        // Lent to another operand of this op (the weight read twice).
        for (size_t i2 = 0; i2 < i; ++i2)
          if (!boxOf_[size_t(o)][i2].empty() &&
              boxOf_[size_t(o)][i2][size_t(t.tile)] == idxOf[size_t(t.tile)])
            t.in[i] = t.in[i2];
      }
    }
  }
}

void Runner::returnWeights(OpId o) {
  const Op &op = g_.op(o);
  for (Task &t : tasks(o))
    for (size_t i = 0; i < op.inputs.size() && i < t.in.size(); ++i) {
      const std::vector<size_t> &idxOf = boxOf_[size_t(o)][i];
      if (idxOf.empty())
        continue;
      WeightBox &wb = boxes_[idxOf[size_t(t.tile)]];
      if (wb.zero < 3 && wb.weight.data.empty() && !t.in[i].data.empty())
        wb.weight = std::move(t.in[i]);
      t.in[i] = Buf();
      t.in[i].box = wb.box;
    }
}

void Runner::lendGradients(OpId o) {
  const Op &op = g_.op(o);
  if (op.kind == "Conv" || opts_.backend != "cpu")
    return;
  for (Task &t : tasks(o))
    for (size_t i = 0; i < op.inputs.size(); ++i) {
      const std::vector<size_t> &idxOf = boxOf_[size_t(o)][i];
      if (idxOf.empty() || t.replica != 0)
        continue;
      WeightBox &wb = boxes_[idxOf[size_t(t.tile)]];
      // Once touched, lent only with micro-batches (whose sums are not
      // one rank's order anyway): each would hold a whole gradient more.
      if (wb.zero >= 2 || wb.grad.empty() ||
          (wb.touched && s_.pipeline.microBatches == 1))
        continue;
      t.gin[i].box = wb.box;
      t.gin[i].data = std::move(wb.grad);
      wb.grad = FloatVec();
    }
}

void Runner::accumulateGradients(OpId o) {
  const Op &op = g_.op(o);
  for (Task &t : tasks(o))
    for (size_t i = 0; i < op.inputs.size() && i < t.gin.size(); ++i) {
      const std::vector<size_t> &idxOf = boxOf_[size_t(o)][i];
      if (idxOf.empty() || t.gin[i].data.empty())
        continue;
      WeightBox &wb = boxes_[idxOf[size_t(t.tile)]];
      FloatVec &acc = wb.zero >= 2 ? wb.mbGrad : wb.grad;
      // Replicas of a tile compute the same gradient: the first one's
      // counts, the group's sum adds each tile once.
      if (t.replica != 0) {
        t.gin[i] = Buf();
        continue;
      }
      if (acc.empty())
        acc = std::move(t.gin[i].data);
      else
        for (size_t k = 0; k < acc.size(); ++k)
          acc[k] += t.gin[i].data[k];
      // bf16: the weight gradient is held as bf16 (the sums accumulate
      // in fp32 inside a kernel, rounded as they are stored).
      roundStored(acc.data(), acc.size());
      wb.touched = true;
      t.gin[i] = Buf();
    }
  // ZeRO-2/3: after the weight's last backward of the micro-batch, its
  // gradient reduce-scattered into each member's part.
  std::vector<ValueId> ws;
  for (ValueId w : op.inputs)
    if (w != kNoValue && g_.value(w).kind == ValueKind::Weight &&
        lastUser_.at(w) == o && std::find(ws.begin(), ws.end(), w) == ws.end())
      ws.push_back(w);
  for (ValueId w : ws)
    for (size_t idx : boxesOfWeight_.at(w)) {
      WeightBox &wb = boxes_[idx];
      if (wb.zero < 2 || wb.member < 0)
        continue;
      if (wb.mbGrad.empty())
        wb.mbGrad.assign(size_t(wb.box.volume()), 0.0f);
      comm_.reduceScatter(wb.group, wb.mbGrad.data(), wb.counts);
      roundStored(wb.mbGrad.data() + wb.offset, wb.part);
      for (size_t k = 0; k < wb.part; ++k)
        wb.grad[k] += wb.mbGrad[wb.offset + k];
      roundStored(wb.grad.data(), wb.part);
      release(wb.mbGrad);
    }
}

void Runner::updatePart(float *w, const float *g, float *m, float *v,
                        size_t n) {
  float lr = static_cast<float>(opts_.learningRate);
  if (opts_.optimizer == "momentum") {
    for (size_t k = 0; k < n; ++k) {
      m[k] = 0.9f * m[k] + g[k];
      w[k] -= lr * m[k];
    }
  } else if (opts_.optimizer == "adam") {
    const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
    double t = double(step_ + 1);
    double c1 = 1 - std::pow(b1, t), c2 = 1 - std::pow(b2, t);
    for (size_t k = 0; k < n; ++k) {
      m[k] = float(b1 * m[k] + (1 - b1) * g[k]);
      v[k] = float(b2 * v[k] + (1 - b2) * double(g[k]) * g[k]);
      double mh = m[k] / c1, vh = v[k] / c2;
      w[k] -= float(lr * mh / (std::sqrt(vh) + eps));
    }
  } else {
    for (size_t k = 0; k < n; ++k)
      w[k] -= lr * g[k];
  }
}

void Runner::stepBox(WeightBox &wb, float *w, const float *g, size_t n) {
  if (!bf16_) {
    updatePart(w, g, wb.m.data(), wb.v.data(), n);
    return;
  }
  updatePart(wb.master.data(), g, wb.m.data(), wb.v.data(), n);
  for (size_t k = 0; k < n; ++k)
    w[k] = roundBf16(wb.master[k]);
}

void Runner::syncWeights() {
  for (auto &[w, idxs] : boxesOfWeight_) {
    if (unclean_.count(w)) {
      // Boxes that overlap partially: every holder's accumulator is a
      // source, every holder receives the sum over its box.
      std::vector<Src> srcs;
      std::vector<Dst> dsts;
      std::vector<Buf> mine(idxs.size()), sums(idxs.size());
      for (size_t a = 0; a < idxs.size(); ++a) {
        WeightBox &wb = boxes_[idxs[a]];
        if (wb.member >= 0) {
          mine[a].box = wb.box;
          mine[a].data = std::move(wb.grad);
        }
        for (int r : wb.group) {
          srcs.push_back({wb.box, {r}, r == me_ ? &mine[a] : nullptr});
          dsts.push_back({wb.box, r, r == me_ ? &sums[a] : nullptr});
        }
      }
      assemble(srcs, dsts, Combine::Sum);
      for (size_t a = 0; a < idxs.size(); ++a) {
        WeightBox &wb = boxes_[idxs[a]];
        if (wb.member < 0)
          continue;
        mine[a] = Buf();
        wb.grad = std::move(sums[a].data);
        roundStored(wb.grad.data(), wb.grad.size());
        stepBox(wb, wb.weight.data.data(), wb.grad.data(), wb.grad.size());
        std::fill(wb.grad.begin(), wb.grad.end(), 0.0f);
        wb.touched = false;
      }
      continue;
    }
    for (size_t idx : idxs) {
      WeightBox &wb = boxes_[idx];
      if (wb.member < 0)
        continue;
      size_t n = size_t(wb.box.volume());
      switch (wb.zero) {
      case 0:
        comm_.allReduce(wb.group, wb.grad.data(), n);
        roundStored(wb.grad.data(), n);
        stepBox(wb, wb.weight.data.data(), wb.grad.data(), n);
        break;
      case 1:
        comm_.reduceScatter(wb.group, wb.grad.data(), wb.counts);
        roundStored(wb.grad.data() + wb.offset, wb.part);
        stepBox(wb, wb.weight.data.data() + wb.offset,
                wb.grad.data() + wb.offset, wb.part);
        comm_.allGather(wb.group, wb.weight.data.data(), wb.counts);
        break;
      case 2:
        stepBox(wb, wb.weight.data.data() + wb.offset, wb.grad.data(),
                wb.part);
        comm_.allGather(wb.group, wb.weight.data.data(), wb.counts);
        break;
      default:
        stepBox(wb, wb.shard.data(), wb.grad.data(), wb.part);
        break;
      }
      std::fill(wb.grad.begin(), wb.grad.end(), 0.0f);
      wb.touched = false;
    }
  }
}

} // namespace exec
} // namespace soap
