// The task graph's memory accounting: what each op's tiles hold on their
// devices, the per-device peak over the backward pass (TaskGraph::PeakTree),
// and whether the strategy fits.
#include "soap/Sim/TaskGraph.h"

#include "TaskGraphDetail.h"
#include <algorithm>
#include <limits>
#include <set>

namespace soap {

using namespace detail;

void TaskGraph::mirrorMemory() {
  if (!fold_.active())
    return;
  for (DeviceId d = 0; d < mem_.size(); ++d)
    if (!mine(d))
      mem_[d] = mem_[fold_.home(d)];
}

bool TaskGraph::fits() const {
  Bytes cap = ctx_->topo.deviceSpec().memoryBytes;
  for (const DeviceMemory &m : mem_)
    if (m.total() > cap)
      return false;
  return true;
}

void TaskGraph::PeakTree::init(size_t leaves) {
  size = 1;
  while (size < leaves)
    size <<= 1;
  add.assign(2 * size, 0);
  max.assign(2 * size, 0);
  // Padding leaves hold nothing and stay below every real leaf.
  const int64_t none = std::numeric_limits<int64_t>::min() / 4;
  for (size_t i = leaves; i < size; ++i)
    add[size + i] = max[size + i] = none;
  for (size_t n = size; n-- > 1;)
    max[n] = std::max(max[2 * n], max[2 * n + 1]);
}

void TaskGraph::PeakTree::rangeAdd(size_t node, size_t nlo, size_t nhi,
                                   size_t lo, size_t hi, int64_t v) {
  if (hi <= nlo || nhi <= lo)
    return;
  if (lo <= nlo && nhi <= hi) {
    add[node] += v;
    max[node] += v;
    return;
  }
  size_t mid = (nlo + nhi) / 2;
  rangeAdd(2 * node, nlo, mid, lo, hi, v);
  rangeAdd(2 * node + 1, mid, nhi, lo, hi, v);
  max[node] = add[node] + std::max(max[2 * node], max[2 * node + 1]);
}

std::vector<Bytes> TaskGraph::unheldSavedBytes(OpId o) const {
  const Graph &g = ctx_->graph;
  const Op &op = g.op(o);
  const OpConfig &c = strategy_.configs[size_t(o)];
  const Pipeline &pipe = strategy_.pipeline;
  int32_t m = pipe.microBatches;
  int64_t tiles = c.numTiles();
  std::vector<double> unheld(static_cast<size_t>(tiles), 0);
  std::vector<Box> mbTiles(static_cast<size_t>(tiles));
  for (int64_t k = 0; k < tiles; ++k)
    mbTiles[size_t(k)] = microBatchTile(c, op.sem, k, 0, m);
  for (const SavedOperand &so : op.sem.saved) {
    ValueId v = so.isOutput ? kNoValue : op.input(size_t(so.index));
    if (v == kNoValue)
      continue;
    auto regionOf = [&](const Op &x, int input, const Box &tile) {
      return x.sem.inputRegion(input, x.sem.ringBlock(input, tile));
    };
    // Tiles reading one region (std::map: in region order, deterministic).
    std::map<Box, std::vector<int64_t>> readers;
    for (int64_t k = 0; k < tiles; ++k) {
      Box region = regionOf(op, so.index, mbTiles[size_t(k)]);
      double bytes = double(region.volume()) * so.bytesPerElement;
      // Saved by a lower op configured alike (on the same stage, so tile
      // k on the same devices with the same region).
      bool shared = false;
      for (OpId u : g.value(v).users) {
        if (u >= o || strategy_.recomputes(u) ||
            strategy_.configs[size_t(u)] != c ||
            pipe.stage(u) != pipe.stage(o))
          continue;
        const Op &uo = g.op(u);
        for (const SavedOperand &us : uo.sem.saved)
          shared = shared ||
                   (!us.isOutput && uo.input(size_t(us.index)) == v &&
                    regionOf(uo, us.index,
                             microBatchTile(c, uo.sem, k, 0, m)) == region);
      }
      if (shared)
        unheld[size_t(k)] += bytes;
      else
        readers[region].push_back(k);
    }
    // Gathered from a producer's slices, one on each device reading it.
    OpId p = g.value(v).producer;
    if (p < 0 || c.replicas != 1 || pipe.stage(p) != pipe.stage(o))
      continue;
    const OpConfig &pc = strategy_.configs[size_t(p)];
    if (pc.replicas != 1)
      continue;
    const Op &po = g.op(p);
    int out = g.value(v).producerOutput;
    std::vector<Box> slices(static_cast<size_t>(pc.numTiles()));
    for (int64_t t = 0; t < pc.numTiles(); ++t)
      slices[size_t(t)] =
          po.sem.outputRegion(out, microBatchTile(pc, po.sem, t, 0, m));
    for (const auto &[region, ks] : readers) {
      std::set<DeviceId> devices;
      for (int64_t k : ks)
        devices.insert(c.device(k));
      if (devices.size() < 2)
        continue;
      size_t count = 0;
      int64_t covered = 0;
      bool fits = true;
      for (int64_t t = 0; t < pc.numTiles() && fits; ++t) {
        const Box &b = slices[size_t(t)];
        if (!overlaps(b, region))
          continue;
        fits = b.intersect(region) == b && devices.count(pc.device(t));
        ++count;
        covered += b.volume();
      }
      if (!fits || count != devices.size() || covered != region.volume())
        continue;
      double bytes = double(region.volume()) * so.bytesPerElement;
      for (int64_t k : ks)
        unheld[size_t(k)] += bytes * (1 - 1.0 / double(count));
    }
  }
  std::vector<Bytes> out(unheld.size());
  for (size_t k = 0; k < unheld.size(); ++k)
    out[k] = Bytes(unheld[k]);
  return out;
}

/// Adds (sign +1) or removes (-1) what op `o`'s tiles hold on their
/// devices: saved activations, and what exists while its backward runs
/// (the weight shards, gradients and optimizer state are the weights'
/// segments', buildWeight). Everything here depends on `o`'s configuration
/// and the graph only, so removing it and adding it back is exact.
void TaskGraph::addOpMemory(OpId o, int sign) {
  const Graph &g = ctx_->graph;
  const Op &op = g.op(o);
  const OpConfig &c = strategy_.configs[o];
  std::vector<DType> inT, outT;
  for (ValueId v : op.inputs)
    inT.push_back(v == kNoValue ? DType::F32 : g.value(v).dtype);
  for (ValueId v : op.outputs)
    outT.push_back(v == kNoValue ? DType::F32 : g.value(v).dtype);
  const Pipeline &pipe = strategy_.pipeline;
  int32_t m = pipe.microBatches;
  if (sign < 0)
    kernelMem_[size_t(o)].clear();
  // A micro-batch's activations, for each micro-batch the stage holds: when
  // the oldest one's backward runs, the others' are all still saved.
  int64_t inFlight = pipe.inFlight(pipe.stage(o));
  size_t n = g.numOps(), uo = size_t(o);
  bool rc = strategy_.recomputes(o);
  // ZeRO-3 gathers o's weights ahead of use (buildWeight's prefetch): in
  // backward, while the next weighted op of the stage runs.
  OpId prefetchedAt = -1;
  int32_t pos = weightedPos_[uo];
  if (pos >= 0 && pos + 1 < int32_t(weighted_.size()) &&
      pipe.stage(weighted_[size_t(pos + 1)]) == pipe.stage(o))
    prefetchedAt = weighted_[size_t(pos + 1)];
  // o's weight gradients wait for its anchor's backward-data (buildOp):
  // until then o's saved activations and output gradients are held, through
  // the backward of the ops in between.
  size_t deferredTo = defersWeightGrad(o) ? size_t(gradAnchor_[uo]) : uo;
  // Whether ZeRO shards weight input i over several devices: some other
  // tile or replica reading the same region runs elsewhere (as buildWeight
  // groups shards; other ops sharing the weight are not looked at).
  std::vector<std::map<Box, std::set<DeviceId>>> holders(
      op.inputs.size());
  std::vector<int> zeroStage(op.inputs.size(), 0);
  for (int i : op.sem.weightInputs) {
    zeroStage[size_t(i)] = weightZeroStage(g, strategy_, op.inputs[size_t(i)]);
    if (zeroStage[size_t(i)] < 2)
      continue;
    for (int64_t k = 0; k < c.numTiles(); ++k) {
      Box b = op.sem.inputRegion(i, c.tile(op.sem, k));
      for (int32_t r = 0; r < c.replicas; ++r)
        holders[size_t(i)][b].insert(c.device(k, r));
    }
  }
  std::vector<Bytes> unheld =
      rc ? std::vector<Bytes>() : unheldSavedBytes(o);
  for (int64_t k = 0; k < c.numTiles(); ++k) {
    bool any = false;
    for (int32_t r = 0; r < c.replicas; ++r)
      any = any || mine(c.device(k, r));
    if (!any)
      continue;
    Box tile = c.tile(op.sem, k);
    Box mbTile = microBatchTile(c, op.sem, k, 0, m);
    Bytes kept = keptBytes(g, strategy_, o, mbTile);
    if (!rc)
      kept -= unheld[size_t(k)];
    // While the backward runs: the kernel's workspace, the output gradients
    // it reads and the input gradients it writes (activations only: graph
    // inputs and weights get none here; weight gradients are accumulated in
    // place, `gradients`).
    Bytes during = ctx_->cost.memory(g, op, mbTile, ctx_->optimizer).workspace;
    Bytes outGrads = 0;
    for (size_t j = 0; j < op.outputs.size(); ++j)
      if (op.outputs[j] != kNoValue && isFloating(outT[j]))
        outGrads +=
            op.sem.outputRegion(int(j), mbTile).volume() * dtypeBytes(outT[j]);
    during += outGrads;
    // An input gradient lives from this backward until its producer's
    // backward sums it (through every op in between: a residual's gradient
    // across a block).
    std::vector<std::pair<size_t, Bytes>> waiting;
    for (int i : op.sem.gradInputs) {
      ValueId v = op.inputs[size_t(i)];
      if (v == kNoValue || !isFloating(inT[size_t(i)]) ||
          g.value(v).kind != ValueKind::Activation)
        continue;
      Bytes b = op.sem.inputRegion(i, op.sem.ringBlock(i, mbTile)).volume() *
                dtypeBytes(inT[size_t(i)]);
      during += b;
      waiting.emplace_back(size_t(g.value(v).producer) + 1, b);
    }
    // Recomputed: what its forward saves exists again (beyond the inputs
    // kept for it) from the backward of the highest op that recomputes it
    // (a recomputed chain runs again at once) until its own backward.
    Bytes again = 0;
    if (rc) {
      again = op.sem.savedBytes(mbTile, inT, outT);
      for (const SavedOperand &so : op.sem.saved) {
        ValueId v = so.isOutput ? kNoValue : op.input(size_t(so.index));
        if (v == kNoValue || (g.value(v).producer >= 0 &&
                              strategy_.recomputes(g.value(v).producer)))
          continue;
        again -= Bytes(double(op.sem.inputRegion(so.index, mbTile).volume()) *
                       so.bytesPerElement);
      }
      again = std::max<Bytes>(again, 0);
    }
    // ZeRO-3: the whole weight gathered while the op runs, and again
    // while the next weighted op's backward runs (prefetched). ZeRO-2/3: a
    // kernel writes the op's whole weight gradient before it is
    // reduce-scattered to the device's 1/D.
    Bytes gathered = 0;
    for (int i : op.sem.weightInputs) {
      int zs = zeroStage[size_t(i)];
      if (zs < 2)
        continue;
      Box b = op.sem.inputRegion(i, tile);
      if (holders[size_t(i)][b].size() < 2)
        continue;
      WeightBytes wb =
          weightBytes(g.value(op.inputs[size_t(i)]), ctx_->optimizer);
      during += b.volume() * wb.gradient;
      if (zs == 3)
        gathered += b.volume() * wb.weight;
    }
    during += gathered;
    for (int32_t r = 0; r < c.replicas; ++r) {
      DeviceId d = c.device(k, r);
      if (!mine(d))
        continue;
      DeviceMemory &dm = mem_[d];
      PeakTree &t = peaks_[d];
      if (t.size == 0)
        t.init(n);
      dm.saved += sign * kept * inFlight;
      t.rangeAdd(0, n, sign * kept * (inFlight - 1));
      t.rangeAdd(uo, n, sign * kept);
      t.rangeAdd(deferredTo, uo, sign * (kept + outGrads));
      if (sign > 0)
        kernelMem_[uo][d] += during;
      for (const auto &[from, b] : waiting)
        t.rangeAdd(from, uo, sign * b);
      t.rangeAdd(uo, size_t(recomputedUntil_[uo]) + 1, sign * again);
      if (prefetchedAt >= 0)
        t.rangeAdd(size_t(prefetchedAt), size_t(prefetchedAt) + 1,
                   sign * gathered);
      dm.workspace = std::max<Bytes>(t.peak() - dm.saved, 0);
    }
  }
}

} // namespace soap
