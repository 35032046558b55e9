// Task graph construction and in-place update (FlexFlow section 5.1 and
// Algorithm 2's UPDATETASKGRAPH): tasks and their links, building a graph
// segment by segment, and rebuilding the segments one op's change touches.
#include "soap/Sim/TaskGraph.h"
#include "TaskGraphDetail.h"

#include "soap/Parallel/Megatron.h"
#include "soap/Support/Error.h"
#include <algorithm>

namespace soap {

llvm::StringRef taskKindName(TaskKind k) {
  static const char *names[] = {"forward",    "backward", "transfer",
                                "collective", "update",   "gate",
                                "weight-grad"};
  return names[static_cast<int>(k)];
}

namespace detail {

TaskKey key(TaskKind kind, uint32_t a, uint32_t b, uint64_t c) {
  TaskKey k;
  k.kind = static_cast<uint8_t>(kind);
  k.a = a;
  k.b = b;
  k.c = c;
  return k;
}

} // namespace detail

using namespace detail;

char TaskGraphTooLarge::ID = 0;

void TaskGraphTooLarge::log(llvm::raw_ostream &os) const {
  os << "the task graph has more than " << limit_ << " tasks";
}

std::error_code TaskGraphTooLarge::convertToErrorCode() const {
  return std::make_error_code(std::errc::not_enough_memory);
}

char FoldBroken::ID = 0;

void FoldBroken::log(llvm::raw_ostream &os) const {
  os << "the configuration of " << op_
     << " does not keep the task graph's fold";
}

std::error_code FoldBroken::convertToErrorCode() const {
  return std::make_error_code(std::errc::invalid_argument);
}

llvm::Error dropTooLarge(llvm::Error err, bool &tooLarge) {
  tooLarge = false;
  return llvm::handleErrors(
      std::move(err), [&](const TaskGraphTooLarge &) { tooLarge = true; });
}

TaskId TaskGraph::newTask(Task t) {
  t.alive = true;
  ++numAlive_;
  for (uint32_t r : t.resources)
    work_[r] += toPicoseconds(t.exe);
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
  // A folded graph has no tasks past block 0 (kNoTask in their places).
  if (from == kNoTask || to == kNoTask)
    return;
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
  for (uint32_t r : t.resources)
    work_[r] -= toPicoseconds(t.exe);
  auto erase = [&](TaskList &v) {
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

namespace detail {

std::vector<int64_t> groupTiles(const OpConfig &c,
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
    group[k] =
        ids.emplace(coord, static_cast<int64_t>(ids.size())).first->second;
  }
  numGroups = static_cast<int64_t>(ids.size());
  return group;
}

std::vector<DeviceId> devicesOf(const OpConfig &c,
                                const std::vector<int64_t> &tiles) {
  std::vector<DeviceId> devs;
  for (int64_t k : tiles)
    for (int32_t r = 0; r < c.replicas; ++r)
      devs.push_back(c.device(k, r));
  std::sort(devs.begin(), devs.end());
  devs.erase(std::unique(devs.begin(), devs.end()), devs.end());
  return devs;
}

} // namespace detail

llvm::Expected<TaskGraph> TaskGraph::prepare(const SimContext &ctx,
                                             const Strategy &s, bool fold) {
  if (auto err = verifyStrategy(s, ctx.graph, ctx.topo))
    return llvm::Error(std::move(err));
  TaskGraph tg(ctx);
  tg.strategy_ = s;
  if (fold)
    tg.fold_ = strategyFold(ctx.graph, ctx.topo, s);
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
  // An edge into a later stage may take an earlier reader's transfers
  // (sharedForward): that reader's changes rebuild it too.
  if (s.pipeline.numStages() > 1)
    for (size_t e = 0; e < tg.edges_.size(); ++e) {
      const Edge &ed = tg.edges_[e];
      if (s.pipeline.stage(ed.producer) == s.pipeline.stage(ed.consumer))
        continue;
      std::set<OpId> earlier;
      for (size_t f : tg.edgesOfOp_[ed.producer])
        if (f < e && tg.edges_[f].producer == ed.producer &&
            tg.edges_[f].output == ed.output &&
            tg.edges_[f].consumer != ed.consumer &&
            s.pipeline.stage(tg.edges_[f].consumer) ==
                s.pipeline.stage(ed.consumer))
          earlier.insert(tg.edges_[f].consumer);
      for (OpId u : earlier)
        tg.edgesOfOp_[size_t(u)].push_back(e);
    }
  tg.weights_.assign(weights.begin(), weights.end());
  tg.weightedPos_.assign(g.numOps(), -1);
  for (const Op &o : g.ops())
    if (!o.sem.weightInputs.empty()) {
      tg.weightedPos_[size_t(o.id)] = int32_t(tg.weighted_.size());
      tg.weighted_.push_back(o.id);
    }
  // Each weighted op's weight gradients wait (WeightGradOrder::Next) for
  // the backward-data of the last op with weights (the highest id: the
  // first to run its backward) upstream of it through gradient inputs, in
  // its pipeline stage: the one its input gradients reach next; under Last
  // for the farthest along that chain of nearest ones (its root); under Now
  // for none. DP in id order (ids are topological).
  tg.gradAnchor_.assign(g.numOps(), -1);
  tg.anchoredBy_.assign(g.numOps(), {});
  tg.nextAnchor_.assign(g.numOps(), -1);
  tg.rootAnchor_.assign(g.numOps(), -1);
  std::vector<OpId> upstream(g.numOps(), -1);
  for (const Op &o : g.ops()) {
    for (int i : o.sem.gradInputs) {
      ValueId v = o.inputs[size_t(i)];
      OpId p = v == kNoValue ? -1 : g.value(v).producer;
      if (p < 0 || s.pipeline.stage(p) != s.pipeline.stage(o.id))
        continue;
      OpId best = tg.weightedPos_[size_t(p)] >= 0 ? p : upstream[size_t(p)];
      upstream[size_t(o.id)] = std::max(upstream[size_t(o.id)], best);
    }
    OpId next = upstream[size_t(o.id)];
    if (tg.weightedPos_[size_t(o.id)] < 0 || next < 0)
      continue;
    tg.nextAnchor_[size_t(o.id)] = next;
    OpId root = tg.rootAnchor_[size_t(next)];
    tg.rootAnchor_[size_t(o.id)] = root >= 0 ? root : next;
    tg.setAnchor(o.id, s.weightGradOrder(o.id));
  }
  tg.mem_.assign(ctx.topo.numDevices(), DeviceMemory());
  tg.work_.assign(tg.numResources(), 0);
  tg.peaks_.assign(ctx.topo.numDevices(), PeakTree());
  // A recomputed op runs again when the first (highest) recomputed op that
  // reads it through recomputed ops runs its backward.
  tg.recomputedUntil_.resize(g.numOps());
  for (const Op &o : g.ops())
    tg.recomputedUntil_[size_t(o.id)] = o.id;
  for (size_t u = g.numOps(); u-- > 0;) {
    const Op &o = g.op(OpId(u));
    if (!s.recomputes(o.id))
      continue;
    for (ValueId v : o.inputs) {
      if (v == kNoValue || g.value(v).producer < 0 ||
          !s.recomputes(g.value(v).producer))
        continue;
      OpId &until = tg.recomputedUntil_[size_t(g.value(v).producer)];
      until = std::max(until, tg.recomputedUntil_[u]);
    }
  }
  tg.kernelMem_.assign(g.numOps(), {});
  tg.leafMem_.assign(g.numOps(), {});
  tg.memoryReaders_.assign(g.numOps(), {});
  {
    std::map<ValueId, std::vector<OpId>> savers;
    for (const Op &o : g.ops())
      for (const SavedOperand &so : o.sem.saved)
        if (!so.isOutput && o.input(size_t(so.index)) != kNoValue)
          savers[o.input(size_t(so.index))].push_back(o.id);
    for (const auto &[v, ops] : savers) {
      OpId p = g.value(v).producer;
      for (OpId a : ops) {
        if (p >= 0)
          tg.memoryReaders_[size_t(p)].push_back(a);
        for (OpId b : ops)
          if (a != b)
            tg.memoryReaders_[size_t(a)].push_back(b);
      }
    }
    for (auto &r : tg.memoryReaders_) {
      std::sort(r.begin(), r.end());
      r.erase(std::unique(r.begin(), r.end()), r.end());
    }
  }
  for (const Op &o : g.ops())
    tg.addOpMemory(o.id, +1);
  std::shared_ptr<const AssemblyCache::PerOp> assembly;
  if (ctx.assembly)
    assembly = ctx.assembly->find(g, s, tg.fold_);
  if (!assembly) {
    auto fresh = std::make_shared<AssemblyCache::PerOp>();
    fresh->reserve(g.numOps());
    for (const Op &o : g.ops())
      fresh->push_back(tg.assemblyBytes(o.id));
    assembly = fresh;
    if (ctx.assembly)
      ctx.assembly->put(g, s, tg.fold_, assembly);
  }
  for (const Op &o : g.ops())
    tg.setLeafMemory(o.id, (*assembly)[size_t(o.id)]);
  return llvm::Expected<TaskGraph>(std::move(tg));
}

bool TaskGraph::foldKeeps(const std::vector<DeviceId> &devs) {
  if (!fold_.active())
    return true;
  size_t inFirst = 0;
  for (DeviceId d : devs)
    inFirst += mine(d);
  if (inFirst == devs.size())
    return true;
  if (inFirst == 0)
    return false;
  for (DeviceId d : devs)
    if (!std::binary_search(devs.begin(), devs.end(), fold_.next(d))) {
      foldBroken_ = true;
      break;
    }
  return true;
}

llvm::Expected<TaskGraph> TaskGraph::buildMemory(const SimContext &ctx,
                                                 const Strategy &s) {
  auto tg = prepare(ctx, s, ctx.fold);
  if (!tg)
    return tg.takeError();
  tg->memoryOnly_ = true;
  std::vector<TaskId> none;
  for (ValueId w : tg->weights_)
    tg->buildWeight(w, none);
  tg->mirrorMemory();
  return tg;
}

llvm::Expected<TaskGraph> TaskGraph::build(const SimContext &ctx,
                                           const Strategy &s) {
  auto built = buildGraph(ctx, s, ctx.fold);
  // Something crosses blocks after all: the full graph.
  if (built && built->foldBroken_)
    return buildGraph(ctx, s, false);
  return built;
}

llvm::Expected<TaskGraph> TaskGraph::buildGraph(const SimContext &ctx,
                                                const Strategy &s, bool fold) {
  auto built = prepare(ctx, s, fold);
  if (!built)
    return built.takeError();
  TaskGraph &tg = *built;
  const Graph &g = ctx.graph;
  for (const Op &o : g.ops()) {
    if (auto err = tg.buildOp(o.id))
      return llvm::Error(std::move(err));
    if (ctx.maxTasks && tg.numAlive_ > ctx.maxTasks)
      return llvm::make_error<TaskGraphTooLarge>(ctx.maxTasks);
  }
  tg.edgeTasks_.resize(tg.edges_.size());
  // Transfers are where a graph explodes (every tile of an op sending to
  // every tile of the next): counted before any is made, and the tasks
  // reserved (the weights' and stages' few more with room to spare: an
  // untouched reservation costs no memory, growing a vector of millions
  // of tasks copies them and holds both copies at once).
  size_t total = tg.numAlive_;
  for (size_t e = 0; e < tg.edges_.size(); ++e) {
    tg.buildEdge(e, tg.edgeTasks_[e], &total);
    if (ctx.maxTasks && total > ctx.maxTasks)
      return llvm::make_error<TaskGraphTooLarge>(ctx.maxTasks);
  }
  tg.tasks_.reserve(total + total / 4 + 4096);
  for (size_t e = 0; e < tg.edges_.size(); ++e) {
    tg.buildEdge(e, tg.edgeTasks_[e]);
    if (ctx.maxTasks && tg.numAlive_ > ctx.maxTasks)
      return llvm::make_error<TaskGraphTooLarge>(ctx.maxTasks);
  }
  for (ValueId w : tg.weights_)
    tg.buildWeight(w, tg.weightTasks_[w]);
  {
    std::vector<TaskId> none;
    std::vector<Seconds> noReady;
    tg.buildBuckets(nullptr, {}, none, noReady, nullptr);
  }
  tg.stageTasks_.resize(size_t(s.pipeline.numGroups()));
  for (int32_t grp = 0; grp < s.pipeline.numGroups(); ++grp)
    tg.buildStage(grp, tg.stageTasks_[size_t(grp)]);
  tg.predsChanged_.clear();
  tg.mirrorMemory();
  return built;
}

llvm::Error TaskGraph::changeConfig(OpId o, const OpConfig &c,
                                    std::vector<TaskId> &changed,
                                    std::vector<Seconds> &removedReady,
                                    std::optional<WeightGradOrder> order) {
  restoredAfterBreak_ = false;
  const Op &op = ctx_->graph.op(o);
  // A padded vocabulary's loops may split unevenly (verifyStrategy).
  int uneven = -1;
  if (strategy_.vocabPadding > 0) {
    if (!vocabLoops_)
      vocabLoops_ = vocabularyLoops(ctx_->graph);
    uneven = (*vocabLoops_)[size_t(o)];
  }
  if (auto err = verifyConfig(c, op.sem, ctx_->topo.numDevices(),
                              ctx_->graph.where(o), uneven))
    return err;
  if (fold_.active() && !configFolds(c, op.sem, fold_.block, fold_.period))
    return llvm::make_error<FoldBroken>(ctx_->graph.where(o));
  const Pipeline &pipe = strategy_.pipeline;
  if (pipe.active()) {
    // The new configuration must keep the stages' device groups disjoint
    // and divide the micro-batches.
    OpConfig old = strategy_.configs[o];
    strategy_.configs[o] = c;
    llvm::Error err = verifyPipeline(strategy_, ctx_->graph);
    strategy_.configs[o] = std::move(old);
    if (err)
      return err;
  }
  std::set<ValueId> ws = weightsTouching(o);
  std::vector<TaskId> touched;
  predsChanged_.clear();
  size_t st = size_t(pipe.group(pipe.stage(o)));
  if (pipe.active()) {
    for (TaskId t : stageTasks_[st])
      removeTask(t, touched, removedReady);
    stageTasks_[st].clear();
  }
  for (TaskId t : opTasks_[o].own)
    removeTask(t, touched, removedReady);
  for (size_t e : edgesOfOp_[o]) {
    for (TaskId t : edgeTasks_[e])
      removeTask(t, touched, removedReady);
    edgeTasks_[e].clear();
  }
  for (ValueId w : ws)
    removeWeight(w, touched, removedReady);
  OpConfig previous = strategy_.configs[o];
  WeightGradOrder previousOrder = strategy_.weightGradOrder(o);
  // The devices whose buckets wait for o's tasks (without overlapped
  // gradient reduction): before and after.
  std::vector<DeviceId> onDevices = previous.devices;
  onDevices.insert(onDevices.end(), c.devices.begin(), c.devices.end());
  std::sort(onDevices.begin(), onDevices.end());
  onDevices.erase(std::unique(onDevices.begin(), onDevices.end()),
                  onDevices.end());
  // o's memory and that of the ops whose memory reads o's configuration
  // (unheldSavedBytes), taken out under the old one and put back.
  addOpMemory(o, -1);
  for (OpId r : memoryReaders_[size_t(o)])
    addOpMemory(r, -1);
  strategy_.configs[o] = c;
  if (order)
    setWeightGradOrder(o, *order);
  addOpMemory(o, +1);
  for (OpId r : memoryReaders_[size_t(o)])
    addOpMemory(r, +1);
  // The op's gradient assembly and its producers' (which sum the gradients
  // it gives them) depend on its tiling.
  setLeafMemory(o);
  std::set<OpId> producers;
  for (ValueId v : op.inputs)
    if (v != kNoValue && ctx_->graph.value(v).producer >= 0)
      producers.insert(ctx_->graph.value(v).producer);
  for (OpId p : producers)
    setLeafMemory(p);
  if (auto err = buildOp(o))
    return err;
  changed = opTasks_[o].own;
  for (size_t e : edgesOfOp_[o]) {
    buildEdge(e, edgeTasks_[e]);
    changed.insert(changed.end(), edgeTasks_[e].begin(), edgeTasks_[e].end());
  }
  // Whether a partial sum is all-reduced or reduce-scattered depends on the
  // tiling of the tasks that take it: the sums of o's producers (o reads
  // them) and of its readers' input gradients (o takes them) change kind
  // in place.
  for (OpId p : producers)
    refreshSums(p, false, changed);
  std::set<OpId> readers;
  for (ValueId v : op.outputs)
    if (v != kNoValue)
      readers.insert(ctx_->graph.value(v).users.begin(),
                     ctx_->graph.value(v).users.end());
  for (OpId u : readers)
    refreshSums(u, true, changed);
  for (ValueId w : ws) {
    buildWeight(w, weightTasks_[w]);
    changed.insert(changed.end(), weightTasks_[w].begin(),
                   weightTasks_[w].end());
  }
  buildBuckets(&ws, onDevices, touched, removedReady, &changed);
  if (pipe.active()) {
    buildStage(int32_t(st), stageTasks_[st]);
    changed.insert(changed.end(), stageTasks_[st].begin(),
                   stageTasks_[st].end());
  }
  if (foldBroken_) {
    // A transfer or collective crosses blocks: put the previous
    // configuration back (it folds).
    foldBroken_ = false;
    std::vector<TaskId> ch;
    std::vector<Seconds> rr;
    OpConfig prev = previous;
    if (auto err = changeConfig(o, prev, ch, rr, previousOrder))
      return err;
    restoredAfterBreak_ = true;
    return llvm::make_error<FoldBroken>(ctx_->graph.where(o));
  }
  mirrorMemory();
  for (const std::vector<TaskId> *more : {&touched, &predsChanged_})
    for (TaskId t : *more)
      if (tasks_[t].alive)
        changed.push_back(t);
  // Each task once, by a stamp per task (sorting cost more than the rest of
  // the call for a change that rebuilt 100,000 transfers).
  if (changedStamp_.size() < tasks_.size())
    changedStamp_.resize(tasks_.size(), 0);
  if (++changedEpoch_ == 0) {
    std::fill(changedStamp_.begin(), changedStamp_.end(), 0);
    changedEpoch_ = 1;
  }
  size_t kept = 0;
  for (TaskId t : changed)
    if (changedStamp_[t] != changedEpoch_) {
      changedStamp_[t] = changedEpoch_;
      changed[kept++] = t;
    }
  changed.resize(kept);
  return llvm::Error::success();
}

std::vector<TaskId> TaskGraph::segmentTasks(OpId o) const {
  std::vector<TaskId> ids = opTasks_[o].own;
  for (size_t e : edgesOfOp_[o])
    ids.insert(ids.end(), edgeTasks_[e].begin(), edgeTasks_[e].end());
  for (ValueId w : weightsTouching(o)) {
    auto it = weightTasks_.find(w);
    if (it != weightTasks_.end())
      ids.insert(ids.end(), it->second.begin(), it->second.end());
  }
  if (strategy_.pipeline.active()) {
    const std::vector<TaskId> &g =
        stageTasks_[size_t(strategy_.pipeline.group(strategy_.pipeline.stage(o)))];
    ids.insert(ids.end(), g.begin(), g.end());
  }
  // Which buckets a change rebuilds depends on the new configuration (a
  // weight's units may join another device group's buckets): all of them.
  for (const auto &[k, bk] : buckets_)
    ids.insert(ids.end(), bk.tasks.begin(), bk.tasks.end());
  return ids;
}

} // namespace soap
