// Full and delta simulation of a task graph, and the metrics of a timeline.
#include "soap/Sim/Simulator.h"
#include "soap/Support/Error.h"

#include <algorithm>
#include <limits>
#include <map>
#include <queue>

namespace soap {

namespace {
struct QItem {
  Seconds ready;
  TaskKey key;
  TaskId id;
  // std::priority_queue is a max-heap: "less" means later.
  bool operator<(const QItem &o) const {
    if (ready != o.ready)
      return ready > o.ready;
    return o.key < key;
  }
};
} // namespace

Simulator::Simulator(TaskGraph &tg) : tg_(tg) {
  const Topology &topo = tg.context().topo;
  size_t n = topo.numDevices();
  exclusive_.assign(tg.numResources(), 1);
  for (size_t r = n; r < exclusive_.size(); ++r)
    exclusive_[r] = !topo.nonBlocking(LinkId(r - n));
}

void Simulator::run(uint32_t seq, std::vector<TaskId> initial) {
  std::vector<Task> &tasks = tg_.tasks();
  std::priority_queue<QItem> queue;
  for (TaskId t : initial)
    queue.push({tasks[t].ready, tasks[t].key, t});
  size_t count = 0;
  while (!queue.empty()) {
    QItem item = queue.top();
    queue.pop();
    Task &t = tasks[item.id];
    Seconds start = t.ready;
    for (uint32_t r : t.resources)
      if (exclusive_[r] && !resourceLog_[r].empty())
        start = std::max(start, resourceLog_[r].back().second);
    t.start = start;
    t.end = start + t.exe;
    t.seq = seq++;
    t.simulated = true;
    for (uint32_t r : t.resources)
      if (exclusive_[r])
        resourceLog_[r].push_back({t.seq, t.end});
    order_.push_back(item.id);
    orderReady_.push_back(t.ready);
    prefixMaxEnd_.push_back(
        std::max(prefixMaxEnd_.empty() ? 0.0 : prefixMaxEnd_.back(), t.end));
    ++count;
    for (TaskId s : t.succs) {
      Task &n = tasks[s];
      n.ready = std::max(n.ready, t.end);
      if (--remaining_[s] == 0)
        queue.push({n.ready, n.key, s});
    }
  }
  lastResimulated_ = count;
}

Seconds Simulator::simulateFull() {
  std::vector<Task> &tasks = tg_.tasks();
  order_.clear();
  orderReady_.clear();
  prefixMaxEnd_.clear();
  resourceLog_.assign(tg_.numResources(), {});
  remaining_.assign(tasks.size(), 0);
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
  }
  run(0, std::move(initial));
  return iterationTime();
}

llvm::Expected<Seconds> Simulator::apply(OpId o, const OpConfig &c) {
  std::vector<TaskId> changed;
  std::vector<Seconds> removedReady;
  if (order_.empty() && tg_.numAlive() > 0)
    simulateFull();
  journal_.valid = false;
  std::vector<Task> &tasks = tg_.tasks();
  // The segments about to be rebuilt, so undo() can find them again by
  // key under their new ids.
  std::vector<bool> wasRebuilt(tasks.size(), false);
  for (TaskId t : tg_.segmentTasks(o))
    wasRebuilt[t] = true;
  OpConfig previous = tg_.strategy().configs[o];
  // The whole old schedule's timings are still in the tasks until the
  // change; keep those of the segments (their slots may be reused).
  std::map<TaskId, std::pair<TaskKey, Timing>> rebuiltOld;
  for (TaskId t = 0; t < wasRebuilt.size(); ++t)
    if (wasRebuilt[t])
      rebuiltOld[t] = {
          tasks[t].key,
          {tasks[t].ready, tasks[t].start, tasks[t].end, tasks[t].seq}};
  if (auto err = tg_.changeConfig(o, c, changed, removedReady))
    return llvm::Error(std::move(err));
  if (remaining_.size() < tasks.size())
    remaining_.resize(tasks.size(), 0);
  // T*: the earliest time the change can matter in either schedule.
  constexpr Seconds inf = std::numeric_limits<Seconds>::infinity();
  Seconds tStar = inf;
  for (Seconds r : removedReady)
    tStar = std::min(tStar, r);
  std::vector<bool> isChanged(tasks.size(), false);
  for (TaskId t : changed)
    isChanged[t] = true;
  for (TaskId id : changed) {
    const Task &t = tasks[id];
    if (t.simulated)
      tStar = std::min(tStar, t.ready);
    // A lower bound of its new ready time: the unchanged predecessors' ends
    // (a predecessor that is itself changed contributes its own bound).
    Seconds lb = t.preds.empty() ? 0 : inf;
    for (TaskId p : t.preds)
      if (tasks[p].simulated && !isChanged[p])
        lb = lb == inf ? tasks[p].end : std::max(lb, tasks[p].end);
    tStar = std::min(tStar, lb);
  }
  // Keep the schedule before T*.
  uint32_t keep = static_cast<uint32_t>(
      std::lower_bound(orderReady_.begin(), orderReady_.end(), tStar) -
      orderReady_.begin());
  std::vector<TaskId> suffix(order_.begin() + keep, order_.end());
  // The journal: the old suffix, as undo() must put it back.
  journal_ = Journal();
  journal_.op = o;
  journal_.previous = std::move(previous);
  journal_.keep = keep;
  journal_.orderTail = suffix;
  journal_.orderReadyTail.assign(orderReady_.begin() + keep, orderReady_.end());
  journal_.prefixMaxEndTail.assign(prefixMaxEnd_.begin() + keep,
                                   prefixMaxEnd_.end());
  for (TaskId id : suffix) {
    auto it = rebuiltOld.find(id);
    bool rebuilt = id < wasRebuilt.size() && wasRebuilt[id];
    journal_.rebuilt.push_back(rebuilt);
    if (rebuilt) {
      journal_.keys.push_back(it->second.first);
      journal_.timings.push_back(it->second.second);
    } else {
      const Task &t = tasks[id];
      journal_.keys.push_back(t.key);
      journal_.timings.push_back({t.ready, t.start, t.end, t.seq});
    }
  }
  journal_.logTails.resize(resourceLog_.size());
  order_.resize(keep);
  orderReady_.resize(keep);
  prefixMaxEnd_.resize(keep);
  for (auto &log : resourceLog_) {
    auto it = std::lower_bound(log.begin(), log.end(), keep,
                               [](const std::pair<uint32_t, Seconds> &e,
                                  uint32_t s) { return e.first < s; });
    journal_.logTails[&log - resourceLog_.data()].assign(it, log.end());
    log.erase(it, log.end());
  }
  journal_.valid = true;
  // Everything else is re-simulated: the old suffix still alive, and the
  // new tasks.
  for (TaskId id : changed)
    if (!tasks[id].simulated)
      suffix.push_back(id);
  std::vector<TaskId> todo;
  for (TaskId id : suffix) {
    Task &t = tasks[id];
    if (!t.alive || (t.simulated && t.seq < keep))
      continue;
    t.simulated = false;
    t.seq = std::numeric_limits<uint32_t>::max();
    todo.push_back(id);
  }
  std::sort(todo.begin(), todo.end());
  todo.erase(std::unique(todo.begin(), todo.end()), todo.end());
  std::vector<TaskId> initial;
  for (TaskId id : todo) {
    Task &t = tasks[id];
    t.ready = 0;
    uint32_t left = 0;
    for (TaskId p : t.preds) {
      const Task &pt = tasks[p];
      if (pt.simulated && pt.seq < keep)
        t.ready = std::max(t.ready, pt.end);
      else
        ++left;
    }
    remaining_[id] = left;
    if (left == 0)
      initial.push_back(id);
  }
  run(keep, std::move(initial));
  return iterationTime();
}

llvm::Error Simulator::undo() {
  if (!journal_.valid)
    return makeError(ExitCode::Internal, "undo() without a preceding apply()");
  Journal j = std::move(journal_);
  journal_ = Journal();
  std::vector<TaskId> changed;
  std::vector<Seconds> removedReady;
  if (auto err = tg_.changeConfig(j.op, j.previous, changed, removedReady))
    return err;
  std::vector<Task> &tasks = tg_.tasks();
  if (remaining_.size() < tasks.size())
    remaining_.resize(tasks.size(), 0);
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
  // Every task simulated after the kept prefix is forgotten, then the old
  // suffix is put back.
  for (size_t i = j.keep; i < order_.size(); ++i) {
    Task &t = tasks[order_[i]];
    if (t.alive)
      t.simulated = false;
  }
  order_.resize(j.keep);
  orderReady_.resize(j.keep);
  prefixMaxEnd_.resize(j.keep);
  for (size_t i = 0; i < j.orderTail.size(); ++i) {
    TaskId id = j.orderTail[i];
    if (j.rebuilt[i]) {
      auto it = byKey.find(j.keys[i]);
      if (it == byKey.end())
        return makeError(ExitCode::Internal,
                         "undo(): a rebuilt task has no counterpart");
      id = it->second;
    }
    Task &t = tasks[id];
    t.ready = j.timings[i].ready;
    t.start = j.timings[i].start;
    t.end = j.timings[i].end;
    t.seq = j.timings[i].seq;
    t.simulated = true;
    order_.push_back(id);
  }
  orderReady_.insert(orderReady_.end(), j.orderReadyTail.begin(),
                     j.orderReadyTail.end());
  prefixMaxEnd_.insert(prefixMaxEnd_.end(), j.prefixMaxEndTail.begin(),
                       j.prefixMaxEndTail.end());
  for (size_t r = 0; r < resourceLog_.size(); ++r) {
    auto &log = resourceLog_[r];
    auto it = std::lower_bound(log.begin(), log.end(), j.keep,
                               [](const std::pair<uint32_t, Seconds> &e,
                                  uint32_t s) { return e.first < s; });
    log.erase(it, log.end());
    log.insert(log.end(), j.logTails[r].begin(), j.logTails[r].end());
  }
  lastResimulated_ = 0;
  return llvm::Error::success();
}

Seconds Simulator::iterationTime() const {
  return prefixMaxEnd_.empty() ? 0 : prefixMaxEnd_.back();
}

std::vector<TaskId> Simulator::criticalPath() const {
  const std::vector<Task> &tasks = tg_.tasks();
  TaskId last = kNoTask;
  for (TaskId id = 0; id < tasks.size(); ++id)
    if (tasks[id].alive && (last == kNoTask || tasks[id].end > tasks[last].end))
      last = id;
  // Walk back from the last task to finish: each task waited either for
  // its latest predecessor or for its device or link.
  std::vector<TaskId> path;
  TaskId cur = last;
  while (cur != kNoTask) {
    path.push_back(cur);
    const Task &t = tasks[cur];
    TaskId next = kNoTask;
    for (TaskId p : t.preds)
      if (tasks[p].end == t.start)
        next = p;
    if (next == kNoTask && t.start > t.ready) {
      // The resource's previous task, the one that ended at our start.
      for (uint32_t r : t.resources) {
        const auto &log = resourceLog_[r];
        auto it = std::lower_bound(log.begin(), log.end(), t.seq,
                                   [](const std::pair<uint32_t, Seconds> &e,
                                      uint32_t s) { return e.first < s; });
        if (it != log.begin() && std::prev(it)->second == t.start) {
          next = order_[std::prev(it)->first];
          break;
        }
      }
    }
    cur = next;
  }
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
  uint32_t n = static_cast<uint32_t>(topo.numDevices());
  for (TaskId id = 0; id < tasks.size(); ++id) {
    const Task &t = tasks[id];
    if (!t.alive)
      continue;
    ++m.numTasks;
    switch (t.kind) {
    case TaskKind::Forward:
    case TaskKind::Backward:
    case TaskKind::Update:
      m.computeTime += t.exe;
      break;
    case TaskKind::Transfer: {
      m.transferBytes += t.bytes;
      std::set<LinkClass> classes;
      for (uint32_t r : t.resources)
        classes.insert(topo.link(r - n).cls);
      for (LinkClass c : classes)
        m.transferBytesByClass[c] += t.bytes;
      break;
    }
    case TaskKind::Collective: {
      // A ring all-reduce: each of n devices sends 2 (n - 1) / n of it;
      // a ring all-gather or reduce-scatter half that.
      m.collectiveBytes += (t.comm == Collective::AllReduce ? 2 : 1) *
                           (Bytes(t.groupSize) - 1) * t.bytes;
      break;
    }
    case TaskKind::Gate:
      break;
    }
  }
  for (TaskId id : criticalPath()) {
    const Task &t = tasks[id];
    ++m.criticalPathTasks;
    switch (t.kind) {
    case TaskKind::Forward:
    case TaskKind::Backward:
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
  for (TaskId id : order_) {
    const Task &t = tasks[id];
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
