// Ring attention in the task graph (TaskGraph::buildRing): a FlashAttention
// split on its query loop keeps its own block of K and V and passes the
// blocks round the tiles of the split (Liu et al. 2023, "Ring Attention with
// Blockwise Transformers"; Megatron-Core's context parallelism), instead of
// gathering K and V whole before the kernel.
#include "soap/Sim/TaskGraph.h"

#include "TaskGraphDetail.h"
#include <algorithm>

namespace soap {

using namespace detail;

int ringSplitLoop(const OpSemantics &sem, const OpConfig &c) {
  for (size_t l = 0; l < sem.loops.size(); ++l)
    if (sem.loops[l].ring >= 0 && c.degree[l] > 1)
      return int(l);
  return -1;
}

bool ringCarries(const OpSemantics &sem, int l, int i) {
  int r = sem.loops[size_t(l)].ring;
  if (r < 0)
    return false;
  std::vector<int> miss = sem.loopsMissingFrom(sem.inputs[size_t(i)]);
  return std::find(miss.begin(), miss.end(), l) != miss.end() &&
         std::find(miss.begin(), miss.end(), r) == miss.end();
}

// The model, per micro-batch and group of C tiles that differ only in the
// ring loop: each tile's kernel is C blocks of equal work (its queries
// against one key block each: a causal op's blocks are priced at the
// average causal work, as Megatron's load-balanced layout makes them, the
// sequence cut in 2C chunks and rank i holding chunks i and 2C-1-i). The
// forward task runs the local block (time f/C); then a ring task, on the
// group's devices (computing) and its ring links (sending), runs the C-1
// steps, each max(block compute, one hop of the K and V blocks), so the
// op takes f/C + (C-1) max(f/C, hop). Backward likewise: the local block,
// then C-1 steps that send K, V and the dK, dV partial sums each, and a
// last hop that takes each dK, dV block home (no compute beside it). A hop
// of B bytes is one step of a ring all-gather of C x B bytes over the
// group (its time / (C-1)), so the collective model prices the links.
void TaskGraph::buildRing(OpId o, int ringLoop, std::vector<TaskId> &fwdReady,
                          std::vector<TaskId> &bwdReady) {
  const Op &op = ctx_->graph.op(o);
  const OpSemantics &sem = op.sem;
  const OpConfig &c = strategy_.configs[o];
  OpTasks &ot = opTasks_[o];
  int64_t tiles = c.numTiles();
  int32_t reps = c.replicas;
  int32_t m = strategy_.pipeline.microBatches;
  int64_t per = tiles * reps;
  int64_t parts = c.degree[size_t(ringLoop)];
  std::vector<bool> free(sem.loops.size(), false);
  free[size_t(ringLoop)] = true;
  int64_t groups;
  std::vector<int64_t> g = groupTiles(c, free, groups);
  std::vector<std::vector<int64_t>> mem(static_cast<size_t>(groups));
  for (int64_t k = 0; k < tiles; ++k)
    mem[size_t(g[size_t(k)])].push_back(k);
  // The inputs the ring carries: not indexed by the ring loop, indexed by
  // the loop it pairs with (K and V).
  std::vector<int> carried;
  for (size_t i = 0; i < op.inputs.size() && i < sem.inputs.size(); ++i)
    if (op.inputs[i] != kNoValue && sem.inputs[i].present &&
        ringCarries(sem, ringLoop, int(i)))
      carried.push_back(int(i));
  uint32_t uo = static_cast<uint32_t>(o);
  for (int32_t mb = 0; mb < m; ++mb)
    for (int pass = 0; pass < 2; ++pass)
      for (int64_t gi = 0; gi < groups; ++gi) {
        std::vector<DeviceId> devs = devicesOf(c, mem[size_t(gi)]);
        if (devs.size() < 2 || !foldKeeps(devs))
          continue;
        Box tile = microBatchTile(c, sem, mem[size_t(gi)][0], mb, m);
        Bytes block = 0; // one K block and one V block
        for (int i : carried)
          block += sem.inputRegion(i, sem.ringBlock(i, tile)).volume() *
                   dtypeBytes(ctx_->graph.value(op.inputs[size_t(i)]).dtype);
        auto kt = kernelTimes(o, microBatchTile(c, sem, mem[size_t(gi)][0], 0, m));
        Seconds compute = kt ? (pass == 0 ? kt->forward : kt->backward()) /
                                   double(parts)
                             : Seconds(0);
        if (!kt)
          llvm::consumeError(kt.takeError()); // buildOp reported it already
        auto hop = [&](Bytes b) {
          return ctx_->collectives.time(Collective::AllGather, devs,
                                        b * parts) /
                 double(parts - 1);
        };
        // Forward: K and V per step; backward: K, V, dK and dV per step
        // and dK, dV home at the end.
        Bytes stepBytes = pass == 0 ? block : 2 * block;
        TaskId t = collective(
            CollectiveRole::Exchange,
            key(TaskKind::Collective, uo,
                0x50000000u | (uint32_t(ringLoop) << 1) | uint32_t(pass),
                uint64_t(gi) | (uint64_t(mb) << 40)),
            o, devs, stepBytes * parts, Collective::AllGather, 1);
        Task &task = tasks_[t];
        task.exe = double(parts - 1) * std::max(compute, hop(stepBytes)) +
                   (pass == 0 ? Seconds(0) : hop(block));
        task.bytes = (parts - 1) * stepBytes + (pass == 0 ? 0 : block);
        task.microBatch = mb;
        // The devices compute the blocks meanwhile.
        for (DeviceId d : devs)
          task.resources.push_back(d);
        std::sort(task.resources.begin(), task.resources.end());
        task.resources.erase(
            std::unique(task.resources.begin(), task.resources.end()),
            task.resources.end());
        if (task.spans)
          foldBroken_ = true;
        ot.own.push_back(t);
        chainReady(t, pass == 0 ? fwdReady : bwdReady, mem[size_t(gi)],
                   mb * per, reps);
      }
}

} // namespace soap
