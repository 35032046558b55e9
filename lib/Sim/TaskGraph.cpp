// Task graph construction and in-place update (FlexFlow section 5.1 and
// Algorithm 2's UPDATETASKGRAPH), over tiles, regions and the routes of the
// machine model.
#include "soap/Sim/TaskGraph.h"

#include "soap/Support/Error.h"
#include <algorithm>

namespace soap {

llvm::StringRef taskKindName(TaskKind k) {
  static const char *names[] = {"forward", "backward", "transfer",
                                "collective", "update"};
  return names[static_cast<int>(k)];
}

namespace {

/// Converts a box in a view of a tensor (an exact re-factoring of its dims,
/// e.g. Stack's [1, S...] of an [S...] input) to the tensor's coordinates.
/// Within each group of view dims that multiply to a tensor dim, only the
/// group's leading dim may be partial (the semantics' granules ensure it).
Box viewToTensor(const Box &b, const std::vector<int64_t> &view,
                 const std::vector<int64_t> &tensor) {
  Box r;
  size_t v = 0;
  for (size_t t = 0; t < tensor.size(); ++t) {
    size_t first = v;
    int64_t prod = 1;
    while (v < view.size() && prod < tensor[t])
      prod *= view[v++];
    if (tensor[t] == 1 && v < view.size() && view[v] == 1)
      ++v;
    int64_t lo = 0, hi = 0, stride = 1;
    bool empty = false;
    for (size_t k = v; k-- > first;) {
      lo += b.lo[k] * stride;
      hi += (b.hi[k] - 1) * stride;
      stride *= view[k];
      empty |= b.lo[k] >= b.hi[k];
    }
    r.lo.push_back(empty ? 0 : lo);
    r.hi.push_back(empty ? 0 : hi + 1);
  }
  return r;
}

Box regionIn(const OpSemantics &sem, int input, const Box &tile,
             const std::vector<int64_t> &tensorShape) {
  Box r = sem.inputRegion(input, tile);
  if (sem.inputs[input].isView)
    return viewToTensor(r, sem.inputs[input].shape, tensorShape);
  return r;
}

TaskKey key(TaskKind kind, uint32_t a, uint32_t b, uint64_t c) {
  TaskKey k;
  k.kind = static_cast<uint8_t>(kind);
  k.a = a;
  k.b = b;
  k.c = c;
  return k;
}

} // namespace

TaskId TaskGraph::newTask(Task t) {
  t.alive = true;
  ++numAlive_;
  if (t.bufferDevice >= 0)
    mem_[t.bufferDevice].buffers += t.bytes;
  if (!free_.empty()) {
    TaskId id = free_.back();
    free_.pop_back();
    tasks_[id] = std::move(t);
    return id;
  }
  tasks_.push_back(std::move(t));
  return static_cast<TaskId>(tasks_.size() - 1);
}

void TaskGraph::link(TaskId from, TaskId to) {
  tasks_[from].succs.push_back(to);
  tasks_[to].preds.push_back(from);
  predsChanged_.push_back(to);
}

void TaskGraph::removeTask(TaskId id, std::vector<TaskId> &touched,
                           std::vector<Seconds> &removedReady) {
  Task &t = tasks_[id];
  if (!t.alive)
    return;
  removedReady.push_back(t.ready);
  if (t.bufferDevice >= 0)
    mem_[t.bufferDevice].buffers -= t.bytes;
  auto erase = [&](std::vector<TaskId> &v) {
    v.erase(std::remove(v.begin(), v.end(), id), v.end());
  };
  // A predecessor only loses a successor: its own schedule is unchanged.
  for (TaskId p : t.preds)
    erase(tasks_[p].succs);
  for (TaskId s : t.succs) {
    erase(tasks_[s].preds);
    touched.push_back(s);
  }
  t = Task();
  free_.push_back(id);
  --numAlive_;
}

Seconds TaskGraph::transferTime(DeviceId a, DeviceId b, Bytes bytes) const {
  return ctx_->topo.pathLatency(a, b) +
         static_cast<double>(bytes) / ctx_->topo.pathBandwidth(a, b);
}

std::vector<uint32_t> TaskGraph::routeResources(DeviceId a, DeviceId b) const {
  std::vector<uint32_t> r;
  uint32_t n = static_cast<uint32_t>(ctx_->topo.numDevices());
  for (LinkId l : ctx_->topo.route(a, b))
    r.push_back(n + l);
  return r;
}

const std::vector<uint32_t> &
TaskGraph::ringResources(const std::vector<DeviceId> &g) {
  auto it = ringCache_.find(g);
  if (it != ringCache_.end())
    return it->second;
  std::vector<DeviceId> ring = ctx_->collectives.ringOrder(g);
  std::vector<uint32_t> r;
  for (size_t i = 0; i < ring.size(); ++i) {
    std::vector<uint32_t> hop =
        routeResources(ring[i], ring[(i + 1) % ring.size()]);
    r.insert(r.end(), hop.begin(), hop.end());
  }
  std::sort(r.begin(), r.end());
  r.erase(std::unique(r.begin(), r.end()), r.end());
  return ringCache_.emplace(g, std::move(r)).first->second;
}

TaskId TaskGraph::collective(CollectiveRole role, TaskKey k, OpId op,
                             const std::vector<DeviceId> &devs, Bytes bytes,
                             Collective kind, int64_t count) {
  Task t;
  t.kind = TaskKind::Collective;
  t.key = k;
  t.role = role;
  t.op = op;
  t.bytes = bytes * count;
  t.allGather = kind == Collective::AllGather;
  t.exe = static_cast<double>(count) * ctx_->collectives.time(kind, devs, bytes);
  t.groupSize = static_cast<uint32_t>(devs.size());
  t.resources = ringResources(devs);
  return newTask(std::move(t));
}

llvm::Expected<KernelTimes> TaskGraph::kernelTimes(OpId o, const Box &tile) {
  std::vector<int64_t> k = tile.lo;
  k.insert(k.end(), tile.hi.begin(), tile.hi.end());
  auto key = std::make_pair(o, std::move(k));
  auto it = kernelCache_.find(key);
  if (it != kernelCache_.end())
    return it->second;
  auto t = ctx_->cost.kernel(ctx_->graph, ctx_->graph.op(o), tile);
  if (!t)
    return t.takeError();
  kernelCache_.emplace(std::move(key), *t);
  return *t;
}

/// Groups the tiles of `c` that agree on every loop except those in `free`
/// (tiles whose results must be combined): group index per tile.
static std::vector<int64_t> groupTiles(const OpConfig &c,
                                       const std::vector<bool> &free,
                                       int64_t &numGroups) {
  int64_t n = c.numTiles();
  std::vector<int64_t> group(n);
  std::map<std::vector<int64_t>, int64_t> ids;
  for (int64_t k = 0; k < n; ++k) {
    std::vector<int64_t> coord;
    int64_t rest = k;
    for (size_t l = c.degree.size(); l-- > 0;) {
      coord.push_back(free[l] ? 0 : rest % c.degree[l]);
      rest /= c.degree[l];
    }
    group[k] = ids.emplace(coord, static_cast<int64_t>(ids.size())).first->second;
  }
  numGroups = static_cast<int64_t>(ids.size());
  return group;
}

/// The distinct devices, ascending, that run any replica of `tiles`.
static std::vector<DeviceId> devicesOf(const OpConfig &c,
                                       const std::vector<int64_t> &tiles) {
  std::vector<DeviceId> devs;
  for (int64_t k : tiles)
    for (int32_t r = 0; r < c.replicas; ++r)
      devs.push_back(c.device(k, r));
  std::sort(devs.begin(), devs.end());
  devs.erase(std::unique(devs.begin(), devs.end()), devs.end());
  return devs;
}

llvm::Error TaskGraph::buildOp(OpId o) {
  const Op &op = ctx_->graph.op(o);
  const OpConfig &c = strategy_.configs[o];
  OpTasks &ot = opTasks_[o];
  ot = OpTasks();
  int64_t tiles = c.numTiles();
  int32_t reps = c.replicas;
  ot.fwd.resize(tiles * reps);
  ot.bwd.resize(tiles * reps);
  uint32_t uo = static_cast<uint32_t>(o);
  for (int64_t k = 0; k < tiles; ++k) {
    Box box = c.tile(op.sem, k);
    auto kt = kernelTimes(o, box);
    if (!kt)
      return kt.takeError();
    for (int32_t r = 0; r < reps; ++r) {
      DeviceId d = c.device(k, r);
      Task f;
      f.kind = TaskKind::Forward;
      f.key = key(TaskKind::Forward, uo, static_cast<uint32_t>(k), r);
      f.exe = kt->forward;
      f.resources = {d};
      f.op = o;
      f.tile = k;
      TaskId fid = newTask(std::move(f));
      Task b;
      b.kind = TaskKind::Backward;
      b.key = key(TaskKind::Backward, uo, static_cast<uint32_t>(k), r);
      b.exe = kt->backward();
      b.resources = {d};
      b.op = o;
      b.tile = k;
      TaskId bid = newTask(std::move(b));
      link(fid, bid);
      ot.fwd[k * reps + r] = fid;
      ot.bwd[k * reps + r] = bid;
      ot.own.push_back(fid);
      ot.own.push_back(bid);
    }
  }
  std::vector<TaskId> fwdReady = ot.fwd, bwdReady = ot.bwd;
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
    std::vector<int64_t> g = groupTiles(c, statFree, groups);
    for (int pass = 0; pass < 2; ++pass) {
      std::vector<std::vector<int64_t>> members(groups);
      for (int64_t k = 0; k < tiles; ++k)
        members[g[k]].push_back(k);
      for (int64_t gi = 0; gi < groups; ++gi) {
        Box box = c.tile(op.sem, members[gi][0]);
        int64_t rows = 1;
        for (size_t l = 0; l < op.sem.loops.size(); ++l)
          if (!op.sem.loops[l].statReduced)
            rows *= box.hi[l] - box.lo[l];
        std::vector<DeviceId> devs = devicesOf(c, members[gi]);
        if (devs.size() < 2)
          continue;
        TaskId t = collective(CollectiveRole::Statistics,
                              key(TaskKind::Collective, uo, pass,
                                  static_cast<uint64_t>(gi)),
                              o, devs, 8 * rows);
        ot.own.push_back(t);
        std::vector<TaskId> &ready = pass == 0 ? fwdReady : bwdReady;
        const std::vector<TaskId> &src = pass == 0 ? ot.fwd : ot.bwd;
        for (int64_t k : members[gi])
          for (int32_t r = 0; r < reps; ++r) {
            link(src[k * reps + r], t);
            ready[k * reps + r] = t;
          }
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
    std::vector<int64_t> g = groupTiles(c, free, groups);
    std::vector<std::vector<int64_t>> members(groups);
    for (int64_t k = 0; k < tiles; ++k)
      members[g[k]].push_back(k);
    for (int pass = 0; pass < 2; ++pass)
      for (int64_t gi = 0; gi < groups; ++gi) {
        std::vector<DeviceId> devs = devicesOf(c, members[gi]);
        if (devs.size() < 2)
          continue;
        // The state one step needs: the rows of the tile's other loops
        // (one step of the recurrence loop, no gates) times the whole of l.
        int64_t rows =
            op.sem.exchangeElements(int(l), c.tile(op.sem, members[gi][0]));
        TaskId t = collective(
            CollectiveRole::Exchange,
            key(TaskKind::Collective, uo,
                0x40000000u | (uint32_t(l) << 1) | uint32_t(pass),
                static_cast<uint64_t>(gi)),
            o, devs, rows * stateBytes,
            pass == 0 ? Collective::AllGather : Collective::AllReduce, steps);
        ot.own.push_back(t);
        std::vector<TaskId> &ready = pass == 0 ? fwdReady : bwdReady;
        for (int64_t k : members[gi])
          for (int32_t r = 0; r < reps; ++r) {
            link(ready[k * reps + r], t);
            ready[k * reps + r] = t;
          }
      }
  }
  ot.bwdOut = bwdReady;
  // Partial sums: tiles that differ only in loops missing from an output's
  // map write the same region; an all-reduce combines them.
  ot.fwdOut.assign(op.outputs.size() * tiles, kNoTask);
  for (size_t j = 0; j < op.outputs.size(); ++j) {
    if (op.outputs[j] == kNoValue)
      continue;
    std::vector<bool> reduced(op.sem.loops.size(), false);
    bool split = false;
    for (int l : op.sem.reducedLoops(static_cast<int>(j)))
      if (c.degree[l] > 1)
        reduced[l] = split = true;
    for (int64_t k = 0; k < tiles; ++k)
      ot.fwdOut[j * tiles + k] = fwdReady[k * reps];
    if (!split)
      continue;
    int64_t groups;
    std::vector<int64_t> g = groupTiles(c, reduced, groups);
    std::vector<std::vector<int64_t>> members(groups);
    for (int64_t k = 0; k < tiles; ++k)
      members[g[k]].push_back(k);
    const Value &v = ctx_->graph.value(op.outputs[j]);
    for (int64_t gi = 0; gi < groups; ++gi) {
      Box region = op.sem.outputRegion(static_cast<int>(j),
                                       c.tile(op.sem, members[gi][0]));
      std::vector<DeviceId> devs = devicesOf(c, members[gi]);
      if (devs.size() < 2)
        continue;
      TaskId t = collective(
          CollectiveRole::PartialSum,
          key(TaskKind::Collective, uo, 2 + static_cast<uint32_t>(j),
              static_cast<uint64_t>(gi)),
          o, devs, region.volume() * dtypeBytes(v.dtype));
      ot.own.push_back(t);
      for (int64_t k : members[gi]) {
        for (int32_t r = 0; r < reps; ++r)
          link(fwdReady[k * reps + r], t);
        ot.fwdOut[j * tiles + k] = t;
      }
    }
  }
  return llvm::Error::success();
}

void TaskGraph::buildEdge(size_t e, std::vector<TaskId> &owned) {
  const Edge &ed = edges_[e];
  const Op &p = ctx_->graph.op(ed.producer);
  const Op &c = ctx_->graph.op(ed.consumer);
  const OpConfig &pc = strategy_.configs[ed.producer];
  const OpConfig &cc = strategy_.configs[ed.consumer];
  const Value &v = ctx_->graph.value(p.outputs[ed.output]);
  const OpTasks &pt = opTasks_[ed.producer];
  const OpTasks &ct = opTasks_[ed.consumer];
  int64_t ptiles = pc.numTiles(), ctiles = cc.numTiles();
  int32_t prep = pc.replicas, crep = cc.replicas;
  int64_t eb = dtypeBytes(v.dtype);
  bool grad = std::find(c.sem.gradInputs.begin(), c.sem.gradInputs.end(),
                        ed.input) != c.sem.gradInputs.end();
  std::vector<Box> pbox(ptiles), cbox(ctiles);
  for (int64_t k = 0; k < ptiles; ++k)
    pbox[k] = p.sem.outputRegion(ed.output, pc.tile(p.sem, k));
  for (int64_t k = 0; k < ctiles; ++k)
    cbox[k] = regionIn(c.sem, ed.input, cc.tile(c.sem, k), v.shape.dims);
  auto transfer = [&](TaskId from, TaskId to, DeviceId a, DeviceId b,
                      Bytes bytes, uint32_t dir, int64_t kp, int64_t kc,
                      int32_t r) {
    if (a == b) {
      link(from, to);
      return;
    }
    Task t;
    t.kind = TaskKind::Transfer;
    t.key = key(TaskKind::Transfer, static_cast<uint32_t>(e),
                dir * 65536u + static_cast<uint32_t>(r),
                (static_cast<uint64_t>(kp) << 32) | static_cast<uint64_t>(kc));
    t.bytes = bytes;
    t.exe = transferTime(a, b, bytes);
    t.resources = routeResources(a, b);
    t.op = ed.consumer;
    if (dir == 0)
      t.bufferDevice = static_cast<int32_t>(b);
    TaskId id = newTask(std::move(t));
    owned.push_back(id);
    link(from, id);
    link(id, to);
  };
  // Producer tiles writing the same region (partial sums) are one source;
  // send from the copy on the receiving device when there is one.
  std::map<std::vector<int64_t>, std::vector<int64_t>> sources;
  for (int64_t k = 0; k < ptiles; ++k) {
    std::vector<int64_t> b = pbox[k].lo;
    b.insert(b.end(), pbox[k].hi.begin(), pbox[k].hi.end());
    sources[b].push_back(k);
  }
  for (const auto &[boxKey, members] : sources) {
    const Box &pb = pbox[members[0]];
    for (int64_t kc = 0; kc < ctiles; ++kc) {
      Box inter = pb.intersect(cbox[kc]);
      if (inter.empty())
        continue;
      Bytes bytes = inter.volume() * eb;
      // Forward: every replica of the consumer tile needs the region.
      for (int32_t rc = 0; rc < crep; ++rc) {
        DeviceId dst = cc.device(kc, rc);
        int64_t src = members[0];
        int32_t srcRep = 0;
        for (int64_t kp : members)
          for (int32_t rp = 0; rp < prep; ++rp)
            if (pc.device(kp, rp) == dst && pc.device(src, srcRep) != dst) {
              src = kp;
              srcRep = rp;
            }
        transfer(pt.fwdOut[ed.output * ptiles + src],
                 ct.fwd[kc * crep + rc], pc.device(src, srcRep), dst, bytes, 0,
                 src, kc, rc);
      }
      if (!grad)
        continue;
      // Backward: every producer task needs the gradient of its region.
      for (int64_t kp : members)
        for (int32_t rp = 0; rp < prep; ++rp) {
          DeviceId dst = pc.device(kp, rp);
          int32_t srcRep = 0;
          for (int32_t rc = 0; rc < crep; ++rc)
            if (cc.device(kc, rc) == dst)
              srcRep = rc;
          transfer(ct.bwdOut[kc * crep + srcRep], pt.bwd[kp * prep + rp],
                   cc.device(kc, srcRep), dst, bytes, 1,
                   kp * prep + rp, kc, srcRep);
        }
    }
  }
}

void TaskGraph::buildWeight(ValueId w, std::vector<TaskId> &owned) {
  const Value &wv = ctx_->graph.value(w);
  Bytes eb = dtypeBytes(wv.dtype);
  // Every shard (op, input, tile, replica) of the weight with its box.
  struct Shard {
    Box box;
    DeviceId device;
    TaskId bwd;
  };
  std::vector<Shard> shards;
  for (OpId o : wv.users) {
    const Op &op = ctx_->graph.op(o);
    const OpConfig &c = strategy_.configs[o];
    for (size_t i = 0; i < op.inputs.size(); ++i) {
      if (op.inputs[i] != w)
        continue;
      for (int64_t k = 0; k < c.numTiles(); ++k) {
        Box b = op.sem.inputRegion(static_cast<int>(i), c.tile(op.sem, k));
        for (int32_t r = 0; r < c.replicas; ++r)
          shards.push_back({b, c.device(k, r),
                            opTasks_[o].bwd[k * c.replicas + r]});
      }
    }
  }
  // Shards that overlap hold copies of the same elements (two ops splitting
  // a shared weight differently): their gradients are summed over every
  // device that holds one.
  std::vector<Box> boxes;
  for (const Shard &sh : shards)
    boxes.push_back(sh.box);
  std::vector<size_t> groupOf = overlapGroups(boxes);
  std::vector<std::vector<size_t>> groups;
  for (size_t i = 0; i < shards.size(); ++i) {
    if (groupOf[i] >= groups.size())
      groups.resize(groupOf[i] + 1);
    groups[groupOf[i]].push_back(i);
  }
  uint32_t gi = 0;
  double bw = ctx_->cost.memoryBandwidth();
  int state = optimizerStateFactor(ctx_->optimizer);
  for (const std::vector<size_t> &members : groups) {
    std::vector<DeviceId> devs;
    Bytes bytes = 0;
    for (size_t i : members) {
      devs.push_back(shards[i].device);
      bytes = std::max(bytes, shards[i].box.volume() * eb);
    }
    std::sort(devs.begin(), devs.end());
    devs.erase(std::unique(devs.begin(), devs.end()), devs.end());
    TaskId sync = kNoTask;
    if (devs.size() > 1) {
      sync = collective(CollectiveRole::WeightGrad,
                        key(TaskKind::Collective, 0x80000000u | uint32_t(w),
                            gi, 0),
                        -1, devs, bytes);
      tasks_[sync].weight = w;
      owned.push_back(sync);
      for (size_t i : members)
        link(shards[i].bwd, sync);
    }
    // The optimizer step: read weight and gradient (and state), write the
    // weight (and state).
    Seconds upd = static_cast<double>(bytes) * (3 + 2 * state) / bw +
                  ctx_->cost.device().launchOverhead;
    for (DeviceId d : devs) {
      Task u;
      u.kind = TaskKind::Update;
      u.key = key(TaskKind::Update, uint32_t(w), gi, d);
      u.exe = upd;
      u.resources = {d};
      u.weight = w;
      TaskId id = newTask(std::move(u));
      owned.push_back(id);
      if (sync != kNoTask)
        link(sync, id);
      else
        for (size_t i : members)
          if (shards[i].device == d)
            link(shards[i].bwd, id);
    }
    ++gi;
  }
}

llvm::Expected<TaskGraph> TaskGraph::build(const SimContext &ctx,
                                           const Strategy &s) {
  if (auto err = verifyStrategy(s, ctx.graph, ctx.topo))
    return llvm::Error(std::move(err));
  TaskGraph tg(ctx);
  tg.strategy_ = s;
  const Graph &g = ctx.graph;
  tg.opTasks_.resize(g.numOps());
  tg.edgesOfOp_.resize(g.numOps());
  std::set<ValueId> weights;
  for (const Op &c : g.ops()) {
    for (size_t i = 0; i < c.inputs.size(); ++i) {
      ValueId v = c.inputs[i];
      if (v == kNoValue)
        continue;
      const Value &val = g.value(v);
      if (val.kind == ValueKind::Weight)
        weights.insert(v);
      if (val.producer < 0 || !c.sem.inputs[i].present)
        continue;
      tg.edgesOfOp_[val.producer].push_back(tg.edges_.size());
      tg.edgesOfOp_[c.id].push_back(tg.edges_.size());
      tg.edges_.push_back(
          {val.producer, val.producerOutput, c.id, static_cast<int>(i)});
    }
  }
  tg.weights_.assign(weights.begin(), weights.end());
  tg.mem_.assign(ctx.topo.numDevices(), DeviceMemory());
  tg.workspaces_.assign(ctx.topo.numDevices(), {});
  for (const Op &o : g.ops())
    tg.addOpMemory(o.id, +1);
  for (const Op &o : g.ops())
    if (auto err = tg.buildOp(o.id))
      return llvm::Error(std::move(err));
  tg.edgeTasks_.resize(tg.edges_.size());
  for (size_t e = 0; e < tg.edges_.size(); ++e)
    tg.buildEdge(e, tg.edgeTasks_[e]);
  for (ValueId w : tg.weights_)
    tg.buildWeight(w, tg.weightTasks_[w]);
  tg.predsChanged_.clear();
  return llvm::Expected<TaskGraph>(std::move(tg));
}

llvm::Error TaskGraph::changeConfig(OpId o, const OpConfig &c,
                                    std::vector<TaskId> &changed,
                                    std::vector<Seconds> &removedReady) {
  const Op &op = ctx_->graph.op(o);
  if (auto err = verifyConfig(c, op.sem, ctx_->topo.numDevices(),
                              ctx_->graph.where(o)))
    return err;
  std::set<ValueId> ws;
  for (int i : op.sem.weightInputs)
    ws.insert(op.inputs[i]);
  std::vector<TaskId> touched;
  predsChanged_.clear();
  for (TaskId t : opTasks_[o].own)
    removeTask(t, touched, removedReady);
  for (size_t e : edgesOfOp_[o]) {
    for (TaskId t : edgeTasks_[e])
      removeTask(t, touched, removedReady);
    edgeTasks_[e].clear();
  }
  for (ValueId w : ws) {
    for (TaskId t : weightTasks_[w])
      removeTask(t, touched, removedReady);
    weightTasks_[w].clear();
  }
  addOpMemory(o, -1);
  strategy_.configs[o] = c;
  addOpMemory(o, +1);
  if (auto err = buildOp(o))
    return err;
  changed = opTasks_[o].own;
  for (size_t e : edgesOfOp_[o]) {
    buildEdge(e, edgeTasks_[e]);
    changed.insert(changed.end(), edgeTasks_[e].begin(), edgeTasks_[e].end());
  }
  for (ValueId w : ws) {
    buildWeight(w, weightTasks_[w]);
    changed.insert(changed.end(), weightTasks_[w].begin(),
                   weightTasks_[w].end());
  }
  for (TaskId t : touched)
    if (tasks_[t].alive)
      changed.push_back(t);
  for (TaskId t : predsChanged_)
    if (tasks_[t].alive)
      changed.push_back(t);
  std::sort(changed.begin(), changed.end());
  changed.erase(std::unique(changed.begin(), changed.end()), changed.end());
  return llvm::Error::success();
}

std::vector<TaskId> TaskGraph::segmentTasks(OpId o) const {
  const Op &op = ctx_->graph.op(o);
  std::vector<TaskId> ids = opTasks_[o].own;
  for (size_t e : edgesOfOp_[o])
    ids.insert(ids.end(), edgeTasks_[e].begin(), edgeTasks_[e].end());
  std::set<ValueId> ws;
  for (int i : op.sem.weightInputs)
    ws.insert(op.inputs[i]);
  for (ValueId w : ws) {
    auto it = weightTasks_.find(w);
    if (it != weightTasks_.end())
      ids.insert(ids.end(), it->second.begin(), it->second.end());
  }
  return ids;
}

bool TaskGraph::fits() const {
  Bytes cap = ctx_->topo.deviceSpec().memoryBytes;
  for (const DeviceMemory &m : mem_)
    if (m.total() > cap)
      return false;
  return true;
}

/// Adds (sign +1) or removes (-1) what op `o`'s tiles hold on their
/// devices: saved activations, workspace, and weight shards, each shard
/// counted once per device however many ops or tiles use it.
void TaskGraph::addOpMemory(OpId o, int sign) {
  const Graph &g = ctx_->graph;
  const Op &op = g.op(o);
  const OpConfig &c = strategy_.configs[o];
  std::vector<DType> inT, outT;
  for (ValueId v : op.inputs)
    inT.push_back(v == kNoValue ? DType::F32 : g.value(v).dtype);
  for (ValueId v : op.outputs)
    outT.push_back(v == kNoValue ? DType::F32 : g.value(v).dtype);
  int state = optimizerStateFactor(ctx_->optimizer);
  for (int64_t k = 0; k < c.numTiles(); ++k) {
    Box tile = c.tile(op.sem, k);
    Bytes saved = op.sem.savedBytes(tile, inT, outT);
    Bytes ws = ctx_->cost.memory(g, op, tile, ctx_->optimizer).workspace;
    for (int32_t r = 0; r < c.replicas; ++r) {
      DeviceId d = c.device(k, r);
      DeviceMemory &m = mem_[d];
      m.saved += sign * saved;
      auto &wsm = workspaces_[d];
      if (sign > 0)
        ++wsm[ws];
      else if (--wsm[ws] == 0)
        wsm.erase(ws);
      m.workspace = wsm.empty() ? 0 : wsm.rbegin()->first;
      for (int i : op.sem.weightInputs) {
        Box b = op.sem.inputRegion(i, tile);
        std::vector<int64_t> bk = b.lo;
        bk.insert(bk.end(), b.hi.begin(), b.hi.end());
        int &refs = shardRefs_[{op.inputs[i], bk, d}];
        bool change = sign > 0 ? refs++ == 0 : --refs == 0;
        if (refs == 0)
          shardRefs_.erase({op.inputs[i], bk, d});
        if (!change)
          continue;
        Bytes wb = sign * b.volume() * dtypeBytes(inT[i]);
        m.weights += wb;
        m.gradients += wb;
        m.optimizer += wb * state;
      }
    }
  }
}

} // namespace soap
