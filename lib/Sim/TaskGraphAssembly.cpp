// What a backward pass holds while it assembles its output gradients
// (TaskGraph::assemblyBytes), and the cache that shares it between the task
// graphs of one strategy's configurations (AssemblyCache).
#include "soap/Sim/TaskGraph.h"

#include "TaskGraphDetail.h"
#include <algorithm>
#include <tuple>

namespace soap {

using namespace detail;

std::shared_ptr<const AssemblyCache::PerOp>
AssemblyCache::find(const Graph &g, const Strategy &s, const Fold &f) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!value_ || graph_ != &g || microBatches_ != s.pipeline.microBatches ||
      factor_ != f.factor || block_ != f.block || period_ != f.period ||
      configs_ != s.configs)
    return nullptr;
  ++hits_;
  return value_;
}

void AssemblyCache::put(const Graph &g, const Strategy &s, const Fold &f,
                        std::shared_ptr<const PerOp> value) {
  std::lock_guard<std::mutex> lock(mu_);
  graph_ = &g;
  configs_ = s.configs;
  microBatches_ = s.pipeline.microBatches;
  factor_ = f.factor;
  block_ = f.block;
  period_ = f.period;
  value_ = std::move(value);
}

size_t AssemblyCache::hits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hits_;
}

/// What op `p`'s backward holds on each device (block 0's) while it
/// assembles its output gradients, as soap-run does (Exec/Assemble.cpp), one
/// output after another: the gradient tiles of this output and the ones
/// before it, the readers' input-gradient tiles summed into it, and the
/// pieces received from the devices that hold them (a tile that is one
/// received piece whole is received in place). Nothing for an output whose
/// one reader tiles it alike on the same devices: its gradient is taken,
/// not assembled. Depends on `p`'s configuration and its readers'.
std::map<DeviceId, Bytes> TaskGraph::assemblyBytes(OpId p) const {
  const Graph &g = ctx_->graph;
  const Op &op = g.op(p);
  const OpConfig &pc = strategy_.configs[p];
  int32_t m = strategy_.pipeline.microBatches;
  std::map<DeviceId, Bytes> held, most;
  if (op.kind == "SoftmaxCrossEntropyLoss")
    return most;
  // Whether any replica of tile k of `c` runs on d.
  auto on = [](const OpConfig &c, int64_t k, DeviceId d) {
    for (int32_t r = 0; r < c.replicas; ++r)
      if (c.device(k, r) == d)
        return true;
    return false;
  };
  for (size_t j = 0; j < op.outputs.size(); ++j) {
    ValueId v = op.outputs[j];
    if (v == kNoValue || !isFloating(g.value(v).dtype))
      continue;
    const Value &val = g.value(v);
    Bytes eb = dtypeBytes(val.dtype);
    std::vector<Box> outs;
    for (int64_t k = 0; k < pc.numTiles(); ++k)
      outs.push_back(
          op.sem.outputRegion(int(j), microBatchTile(pc, op.sem, k, 0, m)));
    for (int64_t k = 0; k < pc.numTiles(); ++k)
      for (int32_t r = 0; r < pc.replicas; ++r)
        if (mine(pc.device(k, r)))
          held[pc.device(k, r)] += outs[size_t(k)].volume() * eb;
    // The readers' input-gradient tiles: (config, tile) and box.
    std::vector<std::pair<const OpConfig *, int64_t>> srcOf;
    std::vector<Box> srcs;
    std::set<OpId> users(val.users.begin(), val.users.end());
    size_t readers = 0;
    bool alike = true;
    for (OpId u : users) {
      const Op &uo = g.op(u);
      const OpConfig &uc = strategy_.configs[u];
      for (size_t i = 0; i < uo.inputs.size(); ++i) {
        if (uo.inputs[i] != v ||
            std::find(uo.sem.gradInputs.begin(), uo.sem.gradInputs.end(),
                      int(i)) == uo.sem.gradInputs.end())
          continue;
        ++readers;
        alike = alike && uc.numTiles() == pc.numTiles() &&
                uc.replicas == pc.replicas;
        for (int64_t k = 0; k < uc.numTiles(); ++k) {
          srcs.push_back(uo.sem.inputRegionInTensor(
              int(i), microBatchTile(uc, uo.sem, k, 0, m), val.shape.dims));
          srcOf.emplace_back(&uc, k);
          if (alike) {
            alike = srcs.back() == outs[size_t(k)];
            for (int32_t r = 0; alike && r < uc.replicas; ++r)
              alike = uc.device(k, r) == pc.device(k, r);
          }
        }
      }
    }
    // Tiles writing one region are partial sums, added.
    if (alike && readers == 1) {
      std::vector<const Box *> sorted;
      sorted.reserve(outs.size());
      for (const Box &b : outs)
        sorted.push_back(&b);
      auto before = [](const Box *a, const Box *b) {
        return std::tie(a->lo, a->hi) < std::tie(b->lo, b->hi);
      };
      std::sort(sorted.begin(), sorted.end(), before);
      for (size_t i = 1; alike && i < sorted.size(); ++i)
        alike = before(sorted[i - 1], sorted[i]);
    }
    if (readers == 0 || (readers == 1 && alike))
      continue;
    std::map<DeviceId, Bytes> now = held;
    for (size_t s = 0; s < srcs.size(); ++s) {
      const auto &[uc, k] = srcOf[s];
      for (int32_t r = 0; r < uc->replicas; ++r)
        if (mine(uc->device(k, r)))
          now[uc->device(k, r)] += srcs[s].volume() * eb;
    }
    TileIndex index(srcs);
    for (int64_t k = 0; k < pc.numTiles(); ++k) {
      const Box &o = outs[size_t(k)];
      std::vector<int64_t> cand;
      bool queried = false;
      for (int32_t r = 0; r < pc.replicas; ++r) {
        DeviceId d = pc.device(k, r);
        if (!mine(d))
          continue;
        if (!queried) {
          cand = index.candidates(o);
          queried = true;
        }
        Bytes remote = 0;
        size_t pieces = 0;
        bool whole = false;
        int64_t vol = o.volume();
        for (int64_t s : cand) {
          int64_t inter = overlapVolume(srcs[size_t(s)], o);
          if (inter == 0)
            continue;
          ++pieces;
          if (on(*srcOf[size_t(s)].first, srcOf[size_t(s)].second, d))
            continue;
          remote += inter * eb;
          whole = inter == vol;
        }
        if (!(pieces == 1 && whole))
          now[d] += remote;
      }
    }
    for (const auto &[d, b] : now)
      most[d] = std::max(most[d], b);
  }
  return most;
}

/// Op `p`'s leaf of the backward pass's memory on each device: the larger
/// of its kernel's phase (addOpMemory) and its gradients' assembly. What was
/// added before is taken off first, so the same configurations give the
/// same integers in any order.
void TaskGraph::setLeafMemory(OpId p,
                              const std::map<DeviceId, Bytes> &assembly) {
  size_t up = size_t(p);
  std::map<DeviceId, Bytes> leaf = kernelMem_[up];
  for (const auto &[d, b] : assembly)
    leaf[d] = std::max(leaf[d], b);
  std::set<DeviceId> touched;
  for (const auto &[d, b] : leafMem_[up]) {
    peaks_[d].rangeAdd(up, up + 1, -b);
    touched.insert(d);
  }
  leafMem_[up].clear();
  for (const auto &[d, b] : leaf) {
    if (b == 0)
      continue;
    PeakTree &t = peaks_[d];
    if (t.size == 0)
      t.init(ctx_->graph.numOps());
    t.rangeAdd(up, up + 1, b);
    leafMem_[up].emplace_back(d, b);
    touched.insert(d);
  }
  for (DeviceId d : touched)
    mem_[d].workspace = std::max<Bytes>(peaks_[d].peak() - mem_[d].saved, 0);
}

} // namespace soap
