// The task graph's compute tasks: each op's forward, backward and weight-
// gradient tasks per tile (TaskGraph::buildOp), the order its weight
// gradients wait in, and the gates of each pipeline group's schedule.
#include "soap/Sim/TaskGraph.h"

#include "TaskGraphDetail.h"
#include "soap/Parallel/Megatron.h"
#include <algorithm>

namespace soap {

using namespace detail;

llvm::Expected<KernelTimes> TaskGraph::kernelTimes(OpId o, const Box &given) {
  // A padded vocabulary (Strategy::vocabPadding): the tile's share of V'
  // columns, V' the multiple of padding x d at or above V.
  Box padded;
  const Box *use = &given;
  if (strategy_.vocabPadding > 0) {
    if (!vocabLoops_)
      vocabLoops_ = vocabularyLoops(ctx_->graph);
    int l = (*vocabLoops_)[size_t(o)];
    if (l >= 0) {
      int64_t size = ctx_->graph.op(o).sem.loops[size_t(l)].size;
      int64_t d = strategy_.configs[size_t(o)].degree[size_t(l)];
      int64_t multiple = int64_t(strategy_.vocabPadding) * d;
      int64_t to = (size + multiple - 1) / multiple * multiple;
      if (to != size) {
        padded = given;
        padded.hi[size_t(l)] = padded.lo[size_t(l)] + to / d;
        use = &padded;
      }
    }
  }
  const Box &tile = *use;
  auto key = std::make_pair(o, tile);
  auto it = kernelCache_.find(key);
  if (it != kernelCache_.end())
    return it->second;
  auto t = ctx_->cost.kernel(ctx_->graph, ctx_->graph.op(o), tile);
  if (!t)
    return t.takeError();
  kernelCache_.emplace(std::move(key), *t);
  return *t;
}

void TaskGraph::setWeightGradOrder(OpId o, WeightGradOrder order) {
  std::vector<uint8_t> &wg = strategy_.weightGrad;
  if (order != WeightGradOrder::Next && wg.empty())
    wg.assign(ctx_->graph.numOps(), 0);
  if (!wg.empty()) {
    wg[size_t(o)] = uint8_t(order);
    // All Next is the empty vector, as a strategy that never had another.
    if (std::all_of(wg.begin(), wg.end(), [](uint8_t v) { return v == 0; }))
      wg.clear();
  }
  setAnchor(o, order);
}

void TaskGraph::setAnchor(OpId o, WeightGradOrder order) {
  OpId &anchor = gradAnchor_[size_t(o)];
  if (anchor >= 0) {
    auto &by = anchoredBy_[size_t(anchor)];
    by.erase(std::remove(by.begin(), by.end(), o), by.end());
  }
  anchor = order == WeightGradOrder::Next   ? nextAnchor_[size_t(o)]
           : order == WeightGradOrder::Last ? rootAnchor_[size_t(o)]
                                            : -1;
  if (anchor >= 0) {
    // In id order, as build() adds them.
    auto &by = anchoredBy_[size_t(anchor)];
    by.insert(std::upper_bound(by.begin(), by.end(), o), o);
  }
}

std::vector<WeightGradOrder> TaskGraph::weightGradOrders(OpId o) const {
  if (!splitsWeightGrad() || nextAnchor_[size_t(o)] < 0)
    return {};
  std::vector<WeightGradOrder> out = {WeightGradOrder::Next,
                                      WeightGradOrder::Now};
  if (rootAnchor_[size_t(o)] != nextAnchor_[size_t(o)])
    out.push_back(WeightGradOrder::Last);
  return out;
}

bool TaskGraph::defersWeightGrad(OpId o) const {
  if (gradAnchor_[size_t(o)] < 0 || !splitsWeightGrad())
    return false;
  // Some weight shard of o's is on two devices: its gradient is all-reduced
  // (or reduce-scattered), which the deferral lets start sooner; with none,
  // deferring would only hold memory longer.
  const Op &op = ctx_->graph.op(o);
  const OpConfig &c = strategy_.configs[size_t(o)];
  for (int i : op.sem.weightInputs) {
    std::map<Box, DeviceId> first;
    for (int64_t k = 0; k < c.numTiles(); ++k) {
      Box b = op.sem.inputRegion(i, c.tile(op.sem, k));
      for (int32_t r = 0; r < c.replicas; ++r) {
        auto [it, fresh] = first.emplace(b, c.device(k, r));
        if (!fresh && it->second != c.device(k, r))
          return true;
      }
    }
  }
  return false;
}

void TaskGraph::deferWeightGrad(OpId later, OpId anchor) {
  const OpTasks &lt = opTasks_[size_t(later)], &at = opTasks_[size_t(anchor)];
  if (lt.wgrad.empty() || at.bwd.empty())
    return; // not built yet: its own buildOp links them
  const OpConfig &lc = strategy_.configs[size_t(later)];
  const OpConfig &ac = strategy_.configs[size_t(anchor)];
  int32_t m = strategy_.pipeline.microBatches;
  int64_t lper = lc.numTasks(), aper = ac.numTasks();
  std::map<DeviceId, std::vector<TaskId>> on;
  for (int32_t mb = 0; mb < m; ++mb) {
    on.clear();
    for (int64_t k = 0; k < ac.numTiles(); ++k)
      for (int32_t r = 0; r < ac.replicas; ++r) {
        TaskId b = at.bwd[size_t(mb * aper + k * ac.replicas + r)];
        if (b != kNoTask)
          on[ac.device(k, r)].push_back(b);
      }
    for (int64_t k = 0; k < lc.numTiles(); ++k)
      for (int32_t r = 0; r < lc.replicas; ++r) {
        auto it = on.find(lc.device(k, r));
        if (it == on.end())
          continue;
        size_t i = size_t(mb * lper + k * lc.replicas + r) * lt.weightsPer;
        for (size_t j = 0; j < lt.weightsPer; ++j)
          if (lt.wgrad[i + j] != kNoTask)
            for (TaskId b : it->second)
              link(b, lt.wgrad[i + j]);
      }
  }
}

llvm::Error TaskGraph::buildOp(OpId o) {
  const Op &op = ctx_->graph.op(o);
  const OpConfig &c = strategy_.configs[o];
  OpTasks &ot = opTasks_[o];
  ot = OpTasks();
  int64_t tiles = c.numTiles();
  int32_t reps = c.replicas;
  int32_t m = strategy_.pipeline.microBatches;
  int64_t per = tiles * reps; // tasks per micro-batch
  ot.fwd.assign(size_t(m * per), kNoTask);
  ot.bwd.assign(size_t(m * per), kNoTask);
  // An op with weights runs its backward-weight kernel as a task per
  // weight (an LSTM's input and recurrent weights and bias), so that what
  // waits only for the input gradients (the ops before it) or for one
  // weight's gradient (its all-reduce) need not wait for the rest.
  // (Not where communication occupies the compute units, CPU ranks:
  // soap-run's CPU backend runs an op's backward whole, and nothing would
  // run beside an all-reduce there anyway.)
  bool splitWeight = weightedPos_[size_t(o)] >= 0 && splitsWeightGrad();
  const std::vector<int> &wins = op.sem.weightInputs;
  ot.splitWeight = splitWeight;
  ot.weightsPer = splitWeight ? wins.size() : 1;
  ot.wgrad.assign(size_t(m * per) * ot.weightsPer, kNoTask);
  assert(tiles < (int64_t(1) << 28) && wins.size() <= 16 &&
         "a weight-gradient key holds the tile in 28 bits");
  uint32_t uo = static_cast<uint32_t>(o);
  // Ring attention: each task runs the local block, buildRing the rest.
  int ringLoop = ringSplitLoop(op.sem, c);
  double ringParts = ringLoop >= 0 ? double(c.degree[size_t(ringLoop)]) : 1;
  for (int64_t k = 0; k < tiles; ++k) {
    bool any = false;
    for (int32_t r = 0; r < reps; ++r)
      any = any || mine(c.device(k, r));
    if (!any)
      continue;
    // Every micro-batch's tile has the same extents: one kernel time.
    Box tileBox = microBatchTile(c, op.sem, k, 0, m);
    auto kt = kernelTimes(o, tileBox);
    if (!kt)
      return kt.takeError();
    // Each weight's share of the backward-weight time: its elements'.
    std::vector<double> share(ot.weightsPer, 1.0 / double(ot.weightsPer));
    if (splitWeight) {
      double total = 0;
      for (size_t j = 0; j < wins.size(); ++j)
        total += share[j] =
            double(op.sem.inputRegion(wins[j], tileBox).volume());
      for (double &x : share)
        x = total > 0 ? x / total : 1.0 / double(wins.size());
    }
    for (int32_t mb = 0; mb < m; ++mb)
      for (int32_t r = 0; r < reps; ++r) {
        DeviceId d = c.device(k, r);
        if (!mine(d))
          continue;
        uint64_t rk = (uint64_t(mb) << 32) | uint64_t(r);
        Task f;
        f.kind = TaskKind::Forward;
        f.key = key(TaskKind::Forward, uo, static_cast<uint32_t>(k), rk);
        f.exe = kt->forward / ringParts;
        f.resources = {d};
        f.op = o;
        f.tile = k;
        f.microBatch = mb;
        TaskId fid = newTask(std::move(f));
        Task b;
        b.kind = TaskKind::Backward;
        b.key = key(TaskKind::Backward, uo, static_cast<uint32_t>(k), rk);
        // A recomputed op runs its forward again first.
        b.exe = (splitWeight ? kt->backwardData : kt->backward()) /
                    ringParts +
                (strategy_.recomputes(o) ? kt->forward : Seconds(0));
        b.resources = {d};
        b.op = o;
        b.tile = k;
        b.microBatch = mb;
        TaskId bid = newTask(std::move(b));
        link(fid, bid);
        size_t i = size_t(mb * per + k * reps + r);
        ot.fwd[i] = fid;
        ot.bwd[i] = bid;
        ot.own.push_back(fid);
        ot.own.push_back(bid);
        for (size_t j = 0; j < ot.weightsPer; ++j) {
          TaskId wid = bid;
          if (splitWeight) {
            Task w;
            w.kind = TaskKind::WeightGrad;
            w.key = key(TaskKind::WeightGrad, uo,
                        static_cast<uint32_t>(k) | (uint32_t(j) << 28), rk);
            w.exe = kt->backwardWeight * share[j];
            w.resources = {d};
            w.op = o;
            w.tile = k;
            w.microBatch = mb;
            wid = newTask(std::move(w));
            link(bid, wid);
            ot.own.push_back(wid);
          }
          ot.wgrad[i * ot.weightsPer + j] = wid;
        }
      }
  }
  // Weight gradients wait one weighted op (Megatron-LM's deferred
  // embedding gradient, for every weight): this op's for its anchor's
  // backward-data on the same device, those anchored on it for its own. The
  // link is made by whichever of the two is built second.
  if (defersWeightGrad(o))
    deferWeightGrad(o, gradAnchor_[size_t(o)]);
  for (OpId later : anchoredBy_[size_t(o)])
    if (defersWeightGrad(later))
      deferWeightGrad(later, o);
  std::vector<TaskId> fwdReady = ot.fwd, bwdReady = ot.bwd;
  auto members = [&](const std::vector<bool> &free, int64_t &groups) {
    std::vector<int64_t> g = groupTiles(c, free, groups);
    std::vector<std::vector<int64_t>> ms(static_cast<size_t>(groups));
    for (int64_t k = 0; k < tiles; ++k)
      ms[size_t(g[size_t(k)])].push_back(k);
    return ms;
  };
  // Split statistics (Softmax's axis, a norm's reduced dims): an all-reduce
  // of a few floats per row among the tiles that share the rows, in the
  // forward and again in the backward pass.
  std::vector<bool> statFree(op.sem.loops.size(), false);
  bool statSplit = false;
  for (size_t l = 0; l < op.sem.loops.size(); ++l)
    if (op.sem.loops[l].statReduced && c.degree[l] > 1)
      statFree[l] = statSplit = true;
  if (statSplit) {
    int64_t groups;
    std::vector<std::vector<int64_t>> mem = members(statFree, groups);
    for (int32_t mb = 0; mb < m; ++mb)
      for (int pass = 0; pass < 2; ++pass)
        for (int64_t gi = 0; gi < groups; ++gi) {
          Box box = microBatchTile(c, op.sem, mem[size_t(gi)][0], mb, m);
          int64_t rows = 1;
          for (size_t l = 0; l < op.sem.loops.size(); ++l)
            if (!op.sem.loops[l].statReduced)
              rows *= box.hi[l] - box.lo[l];
          std::vector<DeviceId> devs = devicesOf(c, mem[size_t(gi)]);
          if (devs.size() < 2 || !foldKeeps(devs))
            continue;
          TaskId t = collective(CollectiveRole::Statistics,
                                key(TaskKind::Collective, uo, pass,
                                    uint64_t(gi) | (uint64_t(mb) << 40)),
                                o, devs, 8 * rows);
          tasks_[t].microBatch = mb;
          ot.own.push_back(t);
          std::vector<TaskId> &ready = pass == 0 ? fwdReady : bwdReady;
          const std::vector<TaskId> &src = pass == 0 ? ot.fwd : ot.bwd;
          for (int64_t k : mem[size_t(gi)])
            for (int32_t r = 0; r < reps; ++r) {
              size_t i = size_t(mb * per + k * reps + r);
              link(src[i], t);
              ready[i] = t;
            }
        }
  }
  // A recurrence over a split loop (an LSTM layer split on its hidden
  // units): at every step the tiles that share the rows all-gather their
  // slices of the state, and in backward all-reduce its gradient; the
  // compute cannot run ahead of it, so the exchange follows the tile.
  for (size_t l = 0; l < op.sem.loops.size(); ++l) {
    int64_t steps = op.sem.loops[l].exchangeSteps;
    if (steps <= 0 || c.degree[l] <= 1)
      continue;
    std::vector<bool> free(op.sem.loops.size(), false);
    free[l] = true;
    Bytes stateBytes = op.outputs.empty() || op.outputs[0] == kNoValue
                           ? 4
                           : dtypeBytes(ctx_->graph.value(op.outputs[0]).dtype);
    int64_t groups;
    std::vector<std::vector<int64_t>> mem = members(free, groups);
    for (int32_t mb = 0; mb < m; ++mb)
      for (int pass = 0; pass < 2; ++pass)
        for (int64_t gi = 0; gi < groups; ++gi) {
          std::vector<DeviceId> devs = devicesOf(c, mem[size_t(gi)]);
          if (devs.size() < 2 || !foldKeeps(devs))
            continue;
          // The state one step needs: the rows of the tile's other loops
          // (one step of the recurrence loop, no gates) times the whole of
          // l.
          int64_t rows = op.sem.exchangeElements(
              int(l), microBatchTile(c, op.sem, mem[size_t(gi)][0], mb, m));
          TaskId t = collective(
              CollectiveRole::Exchange,
              key(TaskKind::Collective, uo,
                  0x40000000u | (uint32_t(l) << 1) | uint32_t(pass),
                  uint64_t(gi) | (uint64_t(mb) << 40)),
              o, devs, rows * stateBytes,
              pass == 0 ? Collective::AllGather : Collective::AllReduce, steps);
          tasks_[t].microBatch = mb;
          ot.own.push_back(t);
          chainReady(t, pass == 0 ? fwdReady : bwdReady, mem[size_t(gi)],
                     mb * per, reps);
        }
  }
  if (ringLoop >= 0)
    buildRing(o, ringLoop, fwdReady, bwdReady);
  // Input-gradient partial sums: tiles that differ only in loops missing
  // from an activation input's map read the same region of it, so each
  // computes a partial sum of its gradient; an all-reduce among them
  // combines them (Megatron's column-parallel backward all-reduce), after
  // which every one holds the whole and the producer takes it from one —
  // or a reduce-scatter, where each of the producer's tasks takes its own
  // device's slice (sequence parallelism; TaskGraphSums.cpp).
  if (op.sem.backwardDataNeeded)
    for (int gi : op.sem.gradInputs) {
      ValueId in = op.inputs[size_t(gi)];
      if (in == kNoValue || !ctx_->graph.value(in).needsGrad ||
          !op.sem.inputs[size_t(gi)].present)
        continue;
      std::vector<std::vector<int64_t>> mem = sumGroups(o, true, gi);
      if (mem.empty())
        continue;
      int64_t groups = int64_t(mem.size());
      std::vector<std::vector<bool>> scatter = sumsScatter(o, true, gi, mem);
      Bytes eb = dtypeBytes(ctx_->graph.value(in).dtype);
      for (int32_t mb = 0; mb < m; ++mb)
        for (int64_t g = 0; g < groups; ++g) {
          std::vector<DeviceId> devs = devicesOf(c, mem[size_t(g)]);
          if (devs.size() < 2 || !foldKeeps(devs))
            continue;
          Box region = op.sem.inputRegion(
              gi, microBatchTile(c, op.sem, mem[size_t(g)][0], mb, m));
          TaskId t = collective(
              CollectiveRole::PartialSum,
              key(TaskKind::Collective, uo, 0x20000000u | uint32_t(gi),
                  uint64_t(g) | (uint64_t(mb) << 40)),
              o, devs, region.volume() * eb,
              scatter[size_t(mb)][size_t(g)] ? Collective::ReduceScatter
                                             : Collective::AllReduce);
          tasks_[t].microBatch = mb;
          ot.own.push_back(t);
          ot.sums.push_back({t, mb, gi, g, true, std::move(devs)});
          chainReady(t, bwdReady, mem[size_t(g)], mb * per, reps);
        }
    }
  ot.bwdOut = bwdReady;
  // Partial sums: tiles that differ only in loops missing from an output's
  // map write the same region; an all-reduce combines them, or a
  // reduce-scatter where each reader's task takes its own device's slice
  // (sequence parallelism; TaskGraphSums.cpp).
  size_t outs = op.outputs.size();
  ot.fwdOut.assign(size_t(m) * outs * size_t(tiles), kNoTask);
  for (size_t j = 0; j < outs; ++j) {
    if (op.outputs[j] == kNoValue)
      continue;
    for (int32_t mb = 0; mb < m; ++mb)
      for (int64_t k = 0; k < tiles; ++k)
        ot.fwdOut[size_t(mb) * outs * size_t(tiles) + j * size_t(tiles) +
                  size_t(k)] = fwdReady[size_t(mb * per + k * reps)];
    std::vector<std::vector<int64_t>> mem = sumGroups(o, false, int(j));
    if (mem.empty())
      continue;
    int64_t groups = int64_t(mem.size());
    std::vector<std::vector<bool>> scatter = sumsScatter(o, false, int(j), mem);
    const Value &v = ctx_->graph.value(op.outputs[j]);
    for (int32_t mb = 0; mb < m; ++mb)
      for (int64_t gi = 0; gi < groups; ++gi) {
        Box region = op.sem.outputRegion(
            static_cast<int>(j),
            microBatchTile(c, op.sem, mem[size_t(gi)][0], mb, m));
        std::vector<DeviceId> devs = devicesOf(c, mem[size_t(gi)]);
        if (devs.size() < 2 || !foldKeeps(devs))
          continue;
        TaskId t = collective(
            CollectiveRole::PartialSum,
            key(TaskKind::Collective, uo, 2 + static_cast<uint32_t>(j),
                uint64_t(gi) | (uint64_t(mb) << 40)),
            o, devs, region.volume() * dtypeBytes(v.dtype),
            scatter[size_t(mb)][size_t(gi)] ? Collective::ReduceScatter
                                            : Collective::AllReduce);
        tasks_[t].microBatch = mb;
        ot.own.push_back(t);
        for (int64_t k : mem[size_t(gi)]) {
          for (int32_t r = 0; r < reps; ++r)
            link(fwdReady[size_t(mb * per + k * reps + r)], t);
          ot.fwdOut[size_t(mb) * outs * size_t(tiles) + j * size_t(tiles) +
                    size_t(k)] = t;
        }
        overlapTensorParallel(t, devs, o, sumGemms(o, mb, mem[size_t(gi)]));
        ot.sums.push_back({t, mb, int32_t(j), gi, false, std::move(devs)});
      }
  }
  return llvm::Error::success();
}

/// The schedule of pipeline device group `grp` (Pipeline::order): a
/// zero-time gate between consecutive items (a micro-batch's forward,
/// backward or weight gradients of every op of one of the group's stages),
/// so the group runs them in the planned order.
void TaskGraph::buildStage(int32_t grp, std::vector<TaskId> &owned) {
  const Pipeline &p = strategy_.pipeline;
  if (!p.active())
    return;
  std::vector<std::vector<OpId>> ops(size_t(p.numStages()));
  for (const Op &op : ctx_->graph.ops())
    if (p.group(p.stage(op.id)) == grp)
      ops[size_t(p.stage(op.id))].push_back(op.id);
  bool apart = p.splitsWeightGrad();
  auto tasksOf = [&](const PipeItem &item) {
    std::vector<TaskId> ts;
    int32_t mb = item.microBatch;
    for (OpId o : ops[size_t(item.stage)]) {
      const OpTasks &ot = opTasks_[o];
      int64_t per = strategy_.configs[o].numTasks();
      if (item.pass != PipePass::Weight) {
        const std::vector<TaskId> &v =
            item.pass == PipePass::Backward ? ot.bwd : ot.fwd;
        ts.insert(ts.end(), v.begin() + mb * per, v.begin() + (mb + 1) * per);
      }
      // The weight gradients end a backward item, or are one of their own.
      bool weights = apart ? item.pass == PipePass::Weight
                           : item.pass == PipePass::Backward;
      if (weights && ot.splitWeight)
        ts.insert(ts.end(), ot.wgrad.begin() + mb * per * int64_t(ot.weightsPer),
                  ot.wgrad.begin() + (mb + 1) * per * int64_t(ot.weightsPer));
    }
    return ts;
  };
  std::vector<PipeItem> items = p.order(grp);
  std::vector<TaskId> prev;
  size_t i = 0;
  for (; i < items.size() && prev.empty(); ++i)
    prev = tasksOf(items[i]);
  for (; i < items.size(); ++i) {
    std::vector<TaskId> cur = tasksOf(items[i]);
    if (cur.empty())
      continue; // nothing to order (a stage's ops without weights)
    Task g;
    g.kind = TaskKind::Gate;
    g.key = key(TaskKind::Gate, uint32_t(grp), uint32_t(i), 0);
    g.microBatch = items[i].microBatch;
    TaskId id = newTask(std::move(g));
    owned.push_back(id);
    for (TaskId t : prev)
      link(t, id);
    for (TaskId t : cur)
      link(id, t);
    prev = std::move(cur);
  }
}

void TaskGraph::chainReady(TaskId t, std::vector<TaskId> &ready,
                           const std::vector<int64_t> &members, int64_t base,
                           int32_t reps) {
  for (int64_t k : members)
    for (int32_t r = 0; r < reps; ++r) {
      size_t i = size_t(base + k * reps + r);
      link(ready[i], t);
      ready[i] = t;
    }
}

} // namespace soap
