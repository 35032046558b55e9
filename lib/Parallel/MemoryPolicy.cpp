// A strategy's memory dimensions: recomputation (kept bytes, checkpoints,
// selective and full policies), ZeRO stages, weight-gradient order.
#include "soap/Parallel/Strategy.h"

#include "soap/Support/Error.h"
#include <algorithm>
#include <fmt/format.h>
#include <map>
#include <set>

namespace soap {

llvm::StringRef weightGradOrderName(WeightGradOrder o) {
  switch (o) {
  case WeightGradOrder::Next:
    return "next";
  case WeightGradOrder::Last:
    return "last";
  case WeightGradOrder::Now:
    return "now";
  }
  return "next";
}

std::optional<WeightGradOrder> parseWeightGradOrder(llvm::StringRef name) {
  for (WeightGradOrder o :
       {WeightGradOrder::Next, WeightGradOrder::Last, WeightGradOrder::Now})
    if (name == weightGradOrderName(o))
      return o;
  return std::nullopt;
}

bool savesActivations(const OpSemantics &sem) {
  return !sem.saved.empty() || !sem.savedExtraBytes.empty();
}

Bytes keptBytes(const Graph &g, const Strategy &s, OpId o, const Box &tile) {
  const Op &op = g.op(o);
  std::vector<DType> none;
  if (!s.recomputes(o))
    return op.sem.savedBytes(tile, none, none);
  // Recomputed: its forward runs again in backward and reads every
  // activation input, saved or not (a recomputed Relu reads its MatMul's
  // whole output, not the 1-byte mask a kept Relu saves). Those that kept
  // ops or the graph's inputs gave it are held from the forward on; those
  // of recomputed producers are made again.
  double bytes = 0;
  for (size_t i = 0; i < op.inputs.size(); ++i) {
    ValueId v = op.inputs[i];
    if (v == kNoValue || !op.sem.inputs[i].present ||
        !g.value(v).isActivationLike())
      continue;
    OpId producer = g.value(v).producer;
    if (producer >= 0 && s.recomputes(producer))
      continue;
    bytes += double(op.sem.inputRegion(int(i), tile).volume()) *
             double(dtypeBytes(g.value(v).dtype));
  }
  return Bytes(bytes);
}

bool recomputeMatters(const Graph &g, const Strategy &s, OpId o) {
  const Op &op = g.op(o);
  if (savesActivations(op.sem))
    return true;
  for (ValueId v : op.outputs)
    if (v != kNoValue)
      for (OpId u : g.value(v).users)
        if (s.recomputes(u))
          return true;
  return false;
}

std::vector<OpId> checkpointOps(const Graph &g) {
  // Walk the ops in id (topological) order, counting the activations
  // produced so far that a later op still reads. Only the batch's count
  // (outputs of ops with a sample loop): a mask or position table that
  // every block reads is small, and kept or made again where it is read.
  std::vector<int64_t> readers(g.numValues(), 0);
  for (const Op &op : g.ops())
    if (sampleLoop(op.sem) >= 0)
      for (ValueId v : op.outputs)
        if (v != kNoValue)
          for (OpId u : std::set<OpId>(g.value(v).users.begin(),
                                       g.value(v).users.end()))
            readers[size_t(v)] += u > op.id;
  std::vector<OpId> cuts;
  int64_t live = 0;
  for (const Op &op : g.ops()) {
    for (size_t j = 0; j < op.inputs.size(); ++j) {
      ValueId v = op.inputs[j];
      // Each reading op (not each input slot) retires one reader.
      if (v == kNoValue || readers[size_t(v)] == 0 ||
          g.value(v).producer >= op.id ||
          std::find(op.inputs.begin(), op.inputs.begin() + long(j), v) !=
              op.inputs.begin() + long(j))
        continue;
      if (--readers[size_t(v)] == 0)
        --live;
    }
    int64_t mine = 0;
    for (ValueId v : op.outputs)
      if (v != kNoValue && readers[size_t(v)] > 0)
        ++mine;
    live += mine;
    if (mine == 1 && live == 1 && size_t(op.id) + 1 < g.numOps())
      cuts.push_back(op.id);
  }
  return cuts;
}

std::vector<uint8_t> recomputePolicy(const Graph &g, bool full) {
  std::vector<uint8_t> r(g.numOps(), 0);
  if (!full) {
    for (const Op &op : g.ops())
      r[size_t(op.id)] =
          savesActivations(op.sem) && op.sem.weightInputs.empty();
    return r;
  }
  for (const Op &op : g.ops())
    r[size_t(op.id)] = 1;
  for (OpId o : checkpointOps(g))
    r[size_t(o)] = 0;
  // Readers come after their producers: one pass from the end drops every
  // op whose recomputation would mean nothing.
  Strategy s;
  s.recompute = r;
  for (size_t u = g.numOps(); u-- > 0;)
    if (s.recompute[u] && !recomputeMatters(g, s, OpId(u)))
      s.recompute[u] = 0;
  return s.recompute;
}

int weightZeroStage(const Graph &g, const Strategy &s, ValueId w) {
  int stage = 0;
  if (!s.zero.empty())
    for (OpId u : g.value(w).users)
      stage = std::max(stage, s.zeroStage(u));
  return stage;
}

bool hasDataParallelGroup(const Graph &g, const Strategy &s, OpId o) {
  const Op &op = g.op(o);
  for (int i : op.sem.weightInputs) {
    ValueId w = op.inputs[size_t(i)];
    // Every shard of the weight, over all its users, as its distinct boxes
    // and the devices holding each (on 1,024 GPUs a weight has a thousand
    // shards of a few boxes: comparing shard with shard was a tenth of the
    // pipeline searcher's time). One of o's shards overlapping a shard on
    // another device makes a group.
    std::map<Box, std::set<DeviceId>> all, mine;
    for (OpId u : g.value(w).users) {
      const Op &uo = g.op(u);
      const OpConfig &c = s.configs[size_t(u)];
      for (size_t j = 0; j < uo.inputs.size(); ++j) {
        if (uo.inputs[j] != w)
          continue;
        for (int64_t k = 0; k < c.numTiles(); ++k) {
          Box b = uo.sem.inputRegion(int(j), c.tile(uo.sem, k));
          std::set<DeviceId> &held = all[b];
          std::set<DeviceId> *own = u == o ? &mine[b] : nullptr;
          for (int32_t r = 0; r < c.replicas; ++r) {
            held.insert(c.device(k, r));
            if (own)
              own->insert(c.device(k, r));
          }
        }
      }
    }
    for (const auto &[b, devices] : mine)
      for (const auto &[b2, devices2] : all) {
        if (b.intersect(b2).empty())
          continue;
        // Another device holds an overlapping box: two or more holders, or
        // one that is not the only device holding b.
        if (devices2.size() > 1 || devices.size() > 1 ||
            *devices2.begin() != *devices.begin())
          return true;
      }
  }
  return false;
}

void dropIdleZero(const Graph &g, Strategy &s) {
  if (s.zero.empty())
    return;
  bool any = false;
  for (const Op &op : g.ops()) {
    uint8_t &z = s.zero[size_t(op.id)];
    if (z && !hasDataParallelGroup(g, s, op.id))
      z = 0;
    any |= z != 0;
  }
  if (!any)
    s.zero.clear();
}

std::vector<uint8_t> zeroPolicy(const Graph &g, const Strategy &s, int stage) {
  std::vector<uint8_t> z(g.numOps(), 0);
  for (const Op &op : g.ops())
    if (hasDataParallelGroup(g, s, op.id))
      z[size_t(op.id)] = uint8_t(stage);
  return z;
}

} // namespace soap
