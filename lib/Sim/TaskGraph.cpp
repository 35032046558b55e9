// Task graph construction and in-place update (FlexFlow section 5.1 and
// Algorithm 2's UPDATETASKGRAPH), over tiles, regions and the routes of the
// machine model.
#include "soap/Sim/TaskGraph.h"
#include "TaskGraphDetail.h"

#include "soap/Parallel/Megatron.h"
#include "soap/Support/Error.h"
#include <algorithm>
#include <limits>
#include <tuple>

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
    std::map<std::vector<int64_t>, DeviceId> first;
    for (int64_t k = 0; k < c.numTiles(); ++k) {
      Box b = op.sem.inputRegion(i, c.tile(op.sem, k));
      std::vector<int64_t> bk = b.lo;
      bk.insert(bk.end(), b.hi.begin(), b.hi.end());
      for (int32_t r = 0; r < c.replicas; ++r) {
        auto [it, fresh] = first.emplace(bk, c.device(k, r));
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
          std::vector<TaskId> &ready = pass == 0 ? fwdReady : bwdReady;
          for (int64_t k : mem[size_t(gi)])
            for (int32_t r = 0; r < reps; ++r) {
              size_t i = size_t(mb * per + k * reps + r);
              link(ready[i], t);
              ready[i] = t;
            }
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
          for (int64_t k : mem[size_t(g)])
            for (int32_t r = 0; r < reps; ++r) {
              size_t i = size_t(mb * per + k * reps + r);
              link(bwdReady[i], t);
              bwdReady[i] = t;
            }
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

void TaskGraph::mirrorMemory() {
  if (!fold_.active())
    return;
  for (DeviceId d = 0; d < mem_.size(); ++d)
    if (!mine(d))
      mem_[d] = mem_[fold_.home(d)];
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
  if (auto err = verifyConfig(c, op.sem, ctx_->topo.numDevices(),
                              ctx_->graph.where(o)))
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
  addOpMemory(o, -1);
  strategy_.configs[o] = c;
  if (order)
    setWeightGradOrder(o, *order);
  addOpMemory(o, +1);
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
  std::vector<std::map<std::vector<int64_t>, std::set<DeviceId>>> holders(
      op.inputs.size());
  std::vector<int> zeroStage(op.inputs.size(), 0);
  for (int i : op.sem.weightInputs) {
    zeroStage[size_t(i)] = weightZeroStage(g, strategy_, op.inputs[size_t(i)]);
    if (zeroStage[size_t(i)] < 2)
      continue;
    for (int64_t k = 0; k < c.numTiles(); ++k) {
      Box b = op.sem.inputRegion(i, c.tile(op.sem, k));
      std::vector<int64_t> bk = b.lo;
      bk.insert(bk.end(), b.hi.begin(), b.hi.end());
      for (int32_t r = 0; r < c.replicas; ++r)
        holders[size_t(i)][bk].insert(c.device(k, r));
    }
  }
  for (int64_t k = 0; k < c.numTiles(); ++k) {
    bool any = false;
    for (int32_t r = 0; r < c.replicas; ++r)
      any = any || mine(c.device(k, r));
    if (!any)
      continue;
    Box tile = c.tile(op.sem, k);
    Box mbTile = microBatchTile(c, op.sem, k, 0, m);
    Bytes kept = keptBytes(g, strategy_, o, mbTile);
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
      std::vector<int64_t> bk = b.lo;
      bk.insert(bk.end(), b.hi.begin(), b.hi.end());
      if (holders[size_t(i)][bk].size() < 2)
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
