#include "ConfigCost.h"
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

namespace soap {

Seconds ConfigCost::busiest() const {
  Seconds m = 0;
  for (const auto &[d, pl] : load)
    m = std::max(m, pl[Fwd] + pl[Bwd] + pl[Upd]);
  return m;
}

llvm::Expected<ConfigCost> configCost(const SearchProblem &p, const Op &op,
                                      const OpConfig &c) {
  const Graph &g = p.graph;
  ConfigCost cc;
  std::map<DeviceId, PhaseLoad> load;
  cc.fwd = cc.bwd = std::numeric_limits<double>::infinity();
  // Tiles of an even split have the same extents; an interior tile reads
  // what every interior tile does (the maps are affine), and an edge tile
  // what the tiles on the same edges do: one estimate for each such class
  // (a 1,024-way split costs what an 8-way one does).
  std::map<std::vector<int64_t>, KernelTimes> byClass;
  // Of an op with weights, the chains pass through its backward-data
  // kernel: the weight gradients are tasks of their own that no input
  // gradient waits for.
  bool dataOnly = !op.sem.weightInputs.empty() && splitsWeightGrad(p.context());
  for (int64_t k = 0; k < c.numTiles(); ++k) {
    Box box = c.tile(op.sem, k);
    std::vector<int64_t> cls;
    for (size_t l = 0; l < box.lo.size(); ++l) {
      cls.push_back(box.hi[l] - box.lo[l]);
      cls.push_back(int64_t(box.lo[l] == 0) |
                    (int64_t(box.hi[l] == op.sem.loops[l].size) << 1));
    }
    auto it = byClass.find(cls);
    if (it == byClass.end()) {
      auto kt = p.cost.kernel(g, op, box);
      if (!kt)
        return kt.takeError();
      it = byClass.emplace(std::move(cls), *kt).first;
    }
    const KernelTimes *t = &it->second;
    cc.fwd = std::min(cc.fwd, t->forward);
    cc.bwd = std::min(cc.bwd, dataOnly ? t->backwardData : t->backward());
    for (int32_t r = 0; r < c.replicas; ++r) {
      load[c.device(k, r)][Fwd] += t->forward;
      load[c.device(k, r)][Bwd] += t->backward();
    }
  }
  // Weights only this op reads: one optimizer step per distinct shard per
  // device, after the all-reduce of the shard's gradient over the devices
  // holding it (a weight other ops also read is synchronised with theirs,
  // so it is left out: this stays a lower bound).
  double bw = p.cost.memoryBandwidth();
  Seconds minSync = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < op.inputs.size(); ++i) {
    ValueId w = op.inputs[i];
    if (w == kNoValue || g.value(w).kind != ValueKind::Weight ||
        g.value(w).users.size() != 1 || !op.sem.inputs[i].present)
      continue;
    Bytes eb = dtypeBytes(g.value(w).dtype);
    WeightBytes wbytes = weightBytes(g.value(w), p.optimizer);
    std::map<std::vector<int64_t>, std::vector<DeviceId>> groups;
    for (int64_t k = 0; k < c.numTiles(); ++k) {
      Box b = op.sem.inputRegion(static_cast<int>(i), c.tile(op.sem, k));
      std::vector<int64_t> key = b.lo;
      key.insert(key.end(), b.hi.begin(), b.hi.end());
      key.push_back(b.volume());
      for (int32_t r = 0; r < c.replicas; ++r)
        groups[key].push_back(c.device(k, r));
    }
    for (auto &[key, devs] : groups) {
      Bytes bytes = key.back() * eb;
      std::sort(devs.begin(), devs.end());
      devs.erase(std::unique(devs.begin(), devs.end()), devs.end());
      Seconds upd = static_cast<double>(key.back() * wbytes.update()) / bw +
                    p.cost.device().launchOverhead;
      Seconds sync = devs.size() > 1 ? p.collectives.time(Collective::AllReduce,
                                                          devs, bytes)
                                     : 0;
      cc.tail = std::max(cc.tail, sync + upd);
      minSync = std::min(minSync, sync);
      for (DeviceId d : devs)
        load[d][Upd] += upd;
    }
  }
  cc.sync = std::isfinite(minSync) ? minSync : 0;
  cc.load.assign(load.begin(), load.end());
  for (const auto &[d, pl] : cc.load)
    for (int f = 0; f < NumPhases; ++f)
      cc.work[f] += pl[f];
  return cc;
}

} // namespace soap
