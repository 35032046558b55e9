// Full and delta simulation of a task graph, and the metrics of a timeline.
#include "soap/Sim/Simulator.h"
#include "soap/Support/Error.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <limits>
#include <map>

namespace soap {

Simulator::Simulator(TaskGraph &tg) : tg_(tg) {
  const Topology &topo = tg.context().topo;
  size_t n = topo.numDevices();
  exclusive_.assign(tg.numResources(), 1);
  for (size_t r = n; r < exclusive_.size(); ++r)
    exclusive_[r] = !topo.nonBlocking(LinkId(r - n));
  // NCCL's share of the GPUs' time while they communicate: each link's
  // GPU ends and whether it leaves the node.
  const DeviceSpec &spec = topo.deviceSpec();
  shareIntra_ = spec.ncclComputeShareIntra;
  shareInter_ = spec.ncclComputeShareInter;
  if (!spec.commOccupiesCompute && (shareIntra_ > 0 || shareInter_ > 0)) {
    std::vector<int32_t> deviceOf(topo.vertices().size(), -1);
    for (DeviceId d = 0; d < n; ++d)
      deviceOf[topo.device(d).vertex] = int32_t(d);
    linkEnds_.resize(topo.links().size());
    for (const Link &l : topo.links()) {
      LinkEnds &e = linkEnds_[l.id];
      e.from = deviceOf[l.from];
      e.to = deviceOf[l.to];
      e.inter = l.cls == LinkClass::Network || l.cls == LinkClass::Uplink;
    }
  }
}

void Simulator::contend(const Task &t) {
  // The GPUs at the collective's link ends, each given the share once; none
  // where the task occupies devices itself (a ring attention step, a CPU
  // rank's copy).
  uint32_t n = uint32_t(tg_.context().topo.numDevices());
  bool inter = false;
  contended_.clear();
  for (uint32_t r : t.resources) {
    if (r < n)
      return;
    const LinkEnds &e = linkEnds_[r - n];
    inter = inter || e.inter;
    for (int32_t d : {e.from, e.to})
      if (d >= 0)
        contended_.push_back(uint32_t(d));
  }
  double share = inter ? shareInter_ : shareIntra_;
  if (share <= 0 || contended_.empty())
    return;
  std::sort(contended_.begin(), contended_.end());
  contended_.erase(std::unique(contended_.begin(), contended_.end()),
                   contended_.end());
  Seconds lost = share * t.exe;
  for (uint32_t d : contended_) {
    if (!exclusive_[d])
      continue;
    // Its kernels lose `lost` from the collective's start: the device
    // is occupied that much longer, after what it runs at that time. Not
    // counted as task work (`done`), so resourceBound() stays a lower
    // bound; logged under the communication's position, so stage() and
    // undo() keep or drop it with the collective.
    auto &log = resourceLog_[d];
    LogEntry &e = log.emplace_back();
    e.seq = t.seq;
    e.end = std::max(log.size() > 1 ? log[log.size() - 2].end : 0.0,
                     t.start) +
            lost;
    e.done = log.size() > 1 ? log[log.size() - 2].done : 0;
  }
}

void Simulator::start(uint32_t fromSeq, const std::vector<TaskId> &initial) {
  const std::vector<Task> &tasks = tg_.tasks();
  queue_.clear();
  for (TaskId t : initial)
    queue_.push({tasks[t].ready, tasks[t].key, t});
  nextSeq_ = fromSeq;
  lastResimulated_ = 0;
}

void Simulator::ReadyQueue::clear() {
  for (uint64_t m = nonEmpty_; m; m &= m - 1)
    buckets_[size_t(__builtin_ctzll(m)) + 1].clear();
  same_.clear();
  nonEmpty_ = 0;
  last_ = 0;
  size_ = 0;
}

int Simulator::ReadyQueue::bucketOf(Seconds ready) const {
  uint64_t x;
  std::memcpy(&x, &ready, sizeof x); // (>= 0: the bits order as the times)
  assert(ready >= 0 && x >= last_ && "a task ready before the last popped");
  return x == last_ ? 0 : 64 - __builtin_clzll(x ^ last_);
}

void Simulator::ReadyQueue::file(const QItem &item) {
  int b = bucketOf(item.ready);
  if (b == 0) {
    same_.push_back(item);
    std::push_heap(same_.begin(), same_.end(), QItem::laterKey);
    return;
  }
  buckets_[size_t(b)].push_back(item);
  nonEmpty_ |= uint64_t(1) << (b - 1);
}

void Simulator::ReadyQueue::push(const QItem &item) {
  file(item);
  ++size_;
}

Simulator::QItem Simulator::ReadyQueue::pop() {
  if (same_.empty()) {
    // The least bucket's earliest time is the next; its tasks move to
    // lower buckets (they agree with it on every higher bit).
    size_t b = size_t(__builtin_ctzll(nonEmpty_)) + 1;
    std::vector<QItem> &bucket = buckets_[b];
    Seconds next = bucket.front().ready;
    for (const QItem &q : bucket)
      next = std::min(next, q.ready);
    std::memcpy(&last_, &next, sizeof last_);
    nonEmpty_ &= ~(uint64_t(1) << (b - 1));
    for (const QItem &q : bucket)
      file(q);
    bucket.clear();
  }
  std::pop_heap(same_.begin(), same_.end(), QItem::laterKey);
  QItem top = same_.back();
  same_.pop_back();
  --size_;
  return top;
}

Seconds Simulator::resourceBound(uint32_t r) const {
  const auto &log = resourceLog_[r];
  int64_t left = tg_.resourceWork()[r] - (log.empty() ? 0 : log.back().done);
  return (log.empty() ? 0 : log.back().end) + Seconds(left) * 1e-12;
}

void Simulator::restore(Task &t, const Timing &old) {
  t.ready = old.ready;
  t.start = old.start;
  t.end = old.end;
  t.seq = old.seq;
  t.simulated = true;
}

void Simulator::growScratch() {
  size_t n = tg_.tasks().size();
  if (remaining_.size() < n) {
    remaining_.resize(n, 0);
    readyAfter_.resize(n, 0);
  }
  if (stamp_.size() < n)
    stamp_.resize(n, 0);
  if (mark_.size() < n)
    mark_.resize(n, 0);
}

void Simulator::touch(TaskId id) {
  Task &t = tg_.tasks()[id];
  stamp_[id] = epoch_;
  journal_.touched.push_back(
      {id, {t.ready, t.start, t.end, t.seq}, t.simulated});
  t.simulated = false;
  t.seq = std::numeric_limits<uint32_t>::max();
  // Its predecessors on the kept prefix are done; the others (this run's,
  // or the old suffix's not yet re-simulated) are left.
  const std::vector<Task> &tasks = tg_.tasks();
  Seconds ready = 0;
  uint32_t left = 0, after = 0;
  for (TaskId p : t.preds) {
    const Task &pt = tasks[p];
    if (pt.simulated && pt.seq < keep_) {
      ready = std::max(ready, pt.end);
      after = std::max(after, pt.seq + 1);
    } else {
      ++left;
    }
  }
  t.ready = ready;
  remaining_[id] = left;
  readyAfter_[id] = after;
}

std::optional<Seconds> Simulator::resume(Seconds limit) {
  std::vector<Task> &tasks = tg_.tasks();
  // The bound is in summed picoseconds, rounded per task, while the
  // timeline adds seconds: stop only past the limit by more than both
  // roundings could make up.
  bool bounded = limit < std::numeric_limits<Seconds>::infinity();
  Seconds stopAt = limit * (1 + 1e-9) + Seconds(tasks.size()) * 1e-12;
  if (bounded) {
    if (iterationTime() > stopAt)
      return std::nullopt;
    for (uint32_t r = 0; r < resourceLog_.size(); ++r)
      if (exclusive_[r] && resourceBound(r) > stopAt)
        return std::nullopt;
  }
  while (!queue_.empty()) {
    QItem item = queue_.pop();
    Task &t = tasks[item.id];
    // Its successors' tasks are read below, each a cache miss: start them
    // all now, so that they overlap.
    for (TaskId s : t.succs)
      __builtin_prefetch(&tasks[s]);
    Seconds begin = t.ready;
    for (uint32_t r : t.resources)
      if (exclusive_[r] && !resourceLog_[r].empty())
        begin = std::max(begin, resourceLog_[r].back().end);
    t.start = begin;
    t.end = begin + t.exe;
    t.seq = nextSeq_++;
    t.simulated = true;
    int64_t ps = TaskGraph::toPicoseconds(t.exe);
    bool past = bounded && t.end > stopAt;
    for (uint32_t r : t.resources)
      if (exclusive_[r]) {
        auto &log = resourceLog_[r];
        int64_t done = (log.empty() ? 0 : log.back().done) + ps;
        // Written in place: a braced temporary went through the stack, and
        // its copy waited on store forwarding.
        LogEntry &e = log.emplace_back();
        e.seq = t.seq;
        e.end = t.end;
        e.done = done;
        past = past || (bounded && resourceBound(r) > stopAt);
      }
    if (!linkEnds_.empty() && t.kind == TaskKind::Collective)
      contend(t);
    timeline_.push_back(
        {item.id, readyAfter_[item.id], t.ready,
         std::max(timeline_.empty() ? 0.0 : timeline_.back().maxEnd, t.end)});
    ++lastResimulated_;
    for (TaskId s : t.succs) {
      // A staged run meets an old-suffix task for the first time.
      if (stamp_[s] != epoch_)
        touch(s);
      Task &n = tasks[s];
      n.ready = std::max(n.ready, t.end);
      if (--remaining_[s] == 0) {
        readyAfter_[s] = t.seq + 1;
        queue_.push({n.ready, n.key, s});
      }
    }
    if (past)
      return std::nullopt;
  }
  return iterationTime();
}

Seconds Simulator::simulateFull() {
  return *simulateFull(std::numeric_limits<Seconds>::infinity());
}

std::optional<Seconds> Simulator::simulateFull(Seconds limit) {
  startFull();
  return resume(limit);
}

void Simulator::startFull() {
  std::vector<Task> &tasks = tg_.tasks();
  journal_.valid = false;
  timeline_.clear();
  resourceLog_.assign(tg_.numResources(), {});
  remaining_.assign(tasks.size(), 0);
  readyAfter_.assign(tasks.size(), 0);
  // Every task is this run's: none is met for the first time.
  if (++epoch_ == 0)
    epoch_ = 1;
  stamp_.assign(tasks.size(), epoch_);
  keep_ = 0;
  // The run's vectors at their final sizes: growing them a doubling at a
  // time copied millions of entries on 1,024-GPU graphs.
  timeline_.reserve(tg_.numAlive());
  std::vector<uint32_t> perResource(tg_.numResources(), 0);
  std::vector<TaskId> initial;
  for (TaskId id = 0; id < tasks.size(); ++id) {
    Task &t = tasks[id];
    if (!t.alive)
      continue;
    t.ready = 0;
    t.simulated = false;
    remaining_[id] = static_cast<uint32_t>(t.preds.size());
    if (t.preds.empty())
      initial.push_back(id);
    for (uint32_t r : t.resources)
      ++perResource[r];
  }
  for (size_t r = 0; r < perResource.size(); ++r)
    if (exclusive_[r])
      resourceLog_[r].reserve(perResource[r]);
  start(0, initial);
}

llvm::Expected<Seconds> Simulator::apply(OpId o, const OpConfig &c,
                                         std::optional<WeightGradOrder> order) {
  if (auto err = stage(o, c, order))
    return llvm::Error(std::move(err));
  return *resume();
}

llvm::Error Simulator::stage(OpId o, const OpConfig &c,
                             std::optional<WeightGradOrder> order) {
  std::vector<TaskId> changed;
  std::vector<Seconds> removedReady;
  if (timeline_.empty() && tg_.numAlive() > 0)
    simulateFull();
  else if (!queue_.empty())
    resume(); // a run stopped at a limit and neither resumed nor undone
  journal_.valid = false;
  queue_.clear();
  std::vector<Task> &tasks = tg_.tasks();
  // The segments about to be rebuilt, so undo() can find them again by
  // key under their new ids; their slots may be reused, so their old
  // timings are kept now.
  std::vector<TaskId> segment = tg_.segmentTasks(o);
  std::vector<std::pair<TaskKey, Timing>> segmentOld;
  segmentOld.reserve(segment.size());
  for (TaskId t : segment)
    segmentOld.push_back(
        {tasks[t].key,
         {tasks[t].ready, tasks[t].start, tasks[t].end, tasks[t].seq}});
  OpConfig previous = tg_.strategy().configs[o];
  WeightGradOrder previousOrder = tg_.strategy().weightGradOrder(o);
  if (auto err = tg_.changeConfig(o, c, changed, removedReady, order)) {
    // A folded graph refused the configuration after rebuilding segments:
    // the previous timeline again, under the rebuilt tasks' ids.
    if (tg_.restoredAfterBreak())
      simulateFull();
    return err;
  }
  growScratch();
  // T*: the earliest time the change can matter in either schedule.
  constexpr Seconds inf = std::numeric_limits<Seconds>::infinity();
  Seconds tStar = inf;
  for (Seconds r : removedReady)
    tStar = std::min(tStar, r);
  for (TaskId t : changed)
    mark_[t] |= kChanged;
  for (TaskId id : changed) {
    const Task &t = tasks[id];
    if (t.simulated)
      tStar = std::min(tStar, t.ready);
    // A lower bound of its new ready time: the unchanged predecessors' ends
    // (a predecessor that is itself changed contributes its own bound).
    Seconds lb = t.preds.empty() ? 0 : inf;
    for (TaskId p : t.preds)
      if (tasks[p].simulated && !(mark_[p] & kChanged))
        lb = lb == inf ? tasks[p].end : std::max(lb, tasks[p].end);
    tStar = std::min(tStar, lb);
  }
  // Keep the schedule before T*. Every changed or removed task lies after
  // it (its ready time is at least T*), so the prefix is unchanged.
  uint32_t keep = static_cast<uint32_t>(
      std::lower_bound(timeline_.begin(), timeline_.end(), tStar,
                       [](const Slot &s, Seconds t) { return s.ready < t; }) -
      timeline_.begin());
  // The journal: the old suffix's positions, copied whole; the tasks of the
  // rebuilt segments by key (their ids change); the other tasks only as the
  // run touches them.
  Journal &j = journal_;
  j.op = o;
  j.previous = std::move(previous);
  j.previousOrder = previousOrder;
  j.keep = keep;
  j.tail.assign(timeline_.begin() + keep, timeline_.end());
  j.touched.clear();
  j.rebuilt.clear();
  for (size_t i = 0; i < segment.size(); ++i) {
    const Timing &old = segmentOld[i].second;
    if (old.seq >= keep && old.seq < timeline_.size() &&
        timeline_[old.seq].task == segment[i])
      j.rebuilt.push_back({old.seq - keep, segmentOld[i].first, old});
  }
  j.logTails.resize(resourceLog_.size());
  for (size_t r = 0; r < resourceLog_.size(); ++r) {
    auto &log = resourceLog_[r];
    auto it = std::lower_bound(
        log.begin(), log.end(), keep,
        [](const LogEntry &e, uint32_t s) { return e.seq < s; });
    j.logTails[r].assign(it, log.end());
    log.erase(it, log.end());
  }
  j.valid = true;
  if (++epoch_ == 0) {
    std::fill(stamp_.begin(), stamp_.end(), 0);
    epoch_ = 1;
  }
  keep_ = keep;
  // The run starts from the tasks ready at position `keep`: those of the
  // old suffix that a kept task made ready (their ready time stands), and
  // the changed tasks whose predecessors are all kept. The rest of the old
  // suffix is met as the run reaches it.
  std::vector<TaskId> initial;
  for (size_t i = 0; i < j.tail.size(); ++i) {
    if (j.tail[i].readyAfter > keep)
      continue;
    TaskId id = j.tail[i].task;
    const Task &t = tasks[id];
    // (A removed task's slot: dead, or reused by a new task.)
    if (!t.alive || !t.simulated || t.seq != keep + i || (mark_[id] & kChanged))
      continue;
    touch(id); // (all its predecessors kept: its ready time stands)
    initial.push_back(id);
  }
  for (TaskId id : changed) {
    mark_[id] &= uint8_t(~kChanged);
    if (!tasks[id].alive || stamp_[id] == epoch_)
      continue;
    touch(id);
    if (remaining_[id] == 0)
      initial.push_back(id);
  }
  timeline_.resize(keep);
  start(keep, initial);
  return llvm::Error::success();
}

llvm::Error Simulator::undo() {
  if (!journal_.valid)
    return makeError(ExitCode::Internal, "undo() without a preceding apply()");
  Journal &j = journal_;
  j.valid = false;
  queue_.clear();
  std::vector<Task> &tasks = tg_.tasks();
  // The tasks the run touched get their old timings back, before the graph
  // changes back (which frees the new tasks' slots, and may reuse them).
  for (const Touched &t : j.touched) {
    if (!t.simulated)
      continue;
    restore(tasks[t.id], t.old);
  }
  std::vector<TaskId> changed;
  std::vector<Seconds> removedReady;
  if (auto err = tg_.changeConfig(j.op, j.previous, changed, removedReady,
                                  j.previousOrder))
    return err;
  growScratch();
  // The rebuilt segments have the same tasks as before, under new ids.
  std::map<TaskKey, TaskId> byKey;
  std::vector<TaskId> segment = tg_.segmentTasks(j.op);
  for (TaskId t : segment)
    byKey.emplace(tasks[t].key, t);
  if (byKey.size() != segment.size()) {
    // Keys are canonical and unique; were they not, simulate again.
    simulateFull();
    return llvm::Error::success();
  }
  for (const Rebuilt &r : j.rebuilt) {
    auto it = byKey.find(r.key);
    if (it == byKey.end())
      return makeError(ExitCode::Internal,
                       "undo(): a rebuilt task has no counterpart");
    j.tail[r.pos].task = it->second;
    restore(tasks[it->second], r.old);
  }
  // The old suffix back in place of the run's.
  timeline_.resize(j.keep);
  timeline_.insert(timeline_.end(), j.tail.begin(), j.tail.end());
  for (size_t r = 0; r < resourceLog_.size(); ++r) {
    auto &log = resourceLog_[r];
    auto it = std::lower_bound(
        log.begin(), log.end(), j.keep,
        [](const LogEntry &e, uint32_t s) { return e.seq < s; });
    log.erase(it, log.end());
    log.insert(log.end(), j.logTails[r].begin(), j.logTails[r].end());
  }
  lastResimulated_ = 0;
  return llvm::Error::success();
}

Seconds Simulator::iterationTime() const {
  return timeline_.empty() ? 0 : timeline_.back().maxEnd;
}

std::vector<TaskId> Simulator::criticalPath() const {
  return criticalPath(nullptr);
}

bool Simulator::contentionEntry(uint32_t r, const LogEntry &e) const {
  if (r >= tg_.context().topo.numDevices())
    return false;
  const Task &c = tg_.tasks()[timeline_[e.seq].task];
  return c.kind == TaskKind::Collective &&
         std::find(c.resources.begin(), c.resources.end(), r) ==
             c.resources.end();
}

TaskId Simulator::waitedFor(const Task &t, Seconds *contention) const {
  const std::vector<Task> &tasks = tg_.tasks();
  TaskId next = kNoTask;
  for (TaskId p : t.preds)
    if (tasks[p].end == t.start)
      next = p;
  if (next != kNoTask || t.start <= t.ready)
    return next;
  // The resource's previous task, the one that ended at our start.
  for (uint32_t r : t.resources) {
    const auto &log = resourceLog_[r];
    auto it = std::lower_bound(
        log.begin(), log.end(), t.seq,
        [](const LogEntry &e, uint32_t s) { return e.seq < s; });
    if (it == log.begin() || std::prev(it)->end != t.start)
      continue;
    --it;
    // Time a communication took from the device (contend()), after the
    // device's task before it, or from the communication's start where
    // the device had nothing to run then.
    while (contentionEntry(r, *it)) {
      const Task &c = tasks[timeline_[it->seq].task];
      Seconds before = it == log.begin() ? 0 : std::prev(it)->end;
      if (contention)
        *contention += it->end - std::max(before, c.start);
      if (it == log.begin() || before < c.start)
        return waitedFor(c, contention);
      --it;
    }
    return timeline_[it->seq].task;
  }
  return kNoTask;
}

std::vector<TaskId> Simulator::criticalPath(Seconds *contention) const {
  const std::vector<Task> &tasks = tg_.tasks();
  TaskId last = kNoTask;
  for (TaskId id = 0; id < tasks.size(); ++id)
    if (tasks[id].alive && (last == kNoTask || tasks[id].end > tasks[last].end))
      last = id;
  // Walk back from the last task to finish: each task waited either for
  // its latest predecessor or for its device or link.
  std::vector<TaskId> path;
  for (TaskId cur = last; cur != kNoTask;
       cur = waitedFor(tasks[cur], contention))
    path.push_back(cur);
  std::reverse(path.begin(), path.end());
  return path;
}

SimMetrics Simulator::metrics() const {
  const std::vector<Task> &tasks = tg_.tasks();
  const Topology &topo = tg_.context().topo;
  SimMetrics m;
  m.iterationTime = iterationTime();
  m.memory = tg_.memory();
  m.capacity = topo.deviceSpec().memoryBytes;
  for (DeviceId d = 0; d < m.memory.size(); ++d)
    if (m.memory[d].total() > m.peakMemory) {
      m.peakMemory = m.memory[d].total();
      m.peakDevice = d;
    }
  m.fits = m.peakMemory <= m.capacity;
  m.fold = tg_.fold().factor;
  uint32_t n = static_cast<uint32_t>(topo.numDevices());
  for (TaskId id = 0; id < tasks.size(); ++id) {
    const Task &t = tasks[id];
    if (!t.alive)
      continue;
    ++m.numTasks;
    // A folded graph's task stands for one per block, but a spanning
    // collective for itself.
    int64_t copies = t.spans ? 1 : m.fold;
    switch (t.kind) {
    case TaskKind::Forward:
    case TaskKind::Backward:
    case TaskKind::WeightGrad:
    case TaskKind::Update:
      m.computeTime += t.exe * double(copies);
      break;
    case TaskKind::Transfer: {
      m.transferBytes += t.bytes * copies;
      std::set<LinkClass> classes;
      for (uint32_t r : t.resources)
        if (r >= n) // (a CPU's transfer also occupies its devices)
          classes.insert(topo.link(r - n).cls);
      for (LinkClass c : classes)
        m.transferBytesByClass[c] += t.bytes * copies;
      break;
    }
    case TaskKind::Collective: {
      // A ring all-reduce: each of n devices sends 2 (n - 1) / n of it;
      // a ring all-gather or reduce-scatter half that.
      m.collectiveBytes += (t.comm == Collective::AllReduce ? 2 : 1) *
                           (Bytes(t.groupSize) - 1) * t.bytes * copies;
      break;
    }
    case TaskKind::Gate:
      break;
    }
  }
  for (TaskId id : criticalPath(&m.criticalContention)) {
    const Task &t = tasks[id];
    ++m.criticalPathTasks;
    switch (t.kind) {
    case TaskKind::Forward:
    case TaskKind::Backward:
    case TaskKind::WeightGrad:
      m.criticalCompute += t.exe;
      break;
    case TaskKind::Transfer:
      m.criticalTransfer += t.exe;
      break;
    case TaskKind::Collective:
      m.criticalCollective += t.exe;
      break;
    case TaskKind::Update:
      m.criticalUpdate += t.exe;
      break;
    case TaskKind::Gate:
      break;
    }
  }
  return m;
}

Json Simulator::chromeTrace() const {
  const std::vector<Task> &tasks = tg_.tasks();
  const Topology &topo = tg_.context().topo;
  const Graph &g = tg_.context().graph;
  uint32_t n = static_cast<uint32_t>(topo.numDevices());
  Json events = Json::array();
  for (uint32_t d = 0; d < n; ++d)
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", 0},
                      {"tid", d},
                      {"args", {{"name", topo.deviceName(d)}}}});
  std::set<uint32_t> usedLinks;
  for (const Slot &slot : timeline_) {
    const Task &t = tasks[slot.task];
    std::string name = std::string(taskKindName(t.kind));
    if (t.op >= 0)
      name += " " + g.op(t.op).name;
    if (t.weight >= 0)
      name += " " + g.value(t.weight).name;
    for (uint32_t r : t.resources) {
      bool link = r >= n;
      if (link)
        usedLinks.insert(r - n);
      events.push_back({{"name", name},
                        {"cat", taskKindName(t.kind).str()},
                        {"ph", "X"},
                        {"pid", link ? 1 : 0},
                        {"tid", link ? r - n : r},
                        {"ts", t.start * 1e6},
                        {"dur", t.exe * 1e6},
                        {"args", {{"bytes", t.bytes}, {"tile", t.tile}}}});
    }
  }
  for (uint32_t l : usedLinks) {
    const Link &lk = topo.link(l);
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", 1},
                      {"tid", l},
                      {"args",
                       {{"name", topo.vertices()[lk.from].name + " -> " +
                                     topo.vertices()[lk.to].name + " (" +
                                     linkClassName(lk.cls).str() + ")"}}}});
  }
  events.push_back({{"name", "process_name"},
                    {"ph", "M"},
                    {"pid", 0},
                    {"args", {{"name", "devices"}}}});
  events.push_back({{"name", "process_name"},
                    {"ph", "M"},
                    {"pid", 1},
                    {"args", {{"name", "links"}}}});
  return {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
}

} // namespace soap
