// The execution simulator (FlexFlow section 5, Appendices A and B): a full
// simulation of a task graph in ready-time order with FIFO devices and links
// (Algorithm 1), and a delta simulation after one op's configuration changes
// that gives exactly the same timeline (every task's start and end) as a full
// simulation of the new strategy.
//
// Delta simulation differs from FlexFlow's Algorithm 2, which propagates
// updates Bellman-Ford style and must re-order FIFO queues: the full
// simulation is a deterministic list schedule in (ready time, canonical task
// key) order, so every task popped before the first time T* at which the
// change can matter is popped identically in both schedules. The delta
// simulator rebuilds only the changed segments of the task graph, keeps the
// schedule's prefix before T*, restores each device's and link's queue at
// that point, and re-simulates the rest. Exact by construction.
#ifndef SOAP_SIM_SIMULATOR_H
#define SOAP_SIM_SIMULATOR_H

#include "soap/Sim/TaskGraph.h"
#include <limits>
#include <map>
#include <optional>

namespace soap {

struct SimMetrics {
  Seconds iterationTime = 0;
  std::vector<TaskGraph::DeviceMemory> memory; ///< per device
  Bytes peakMemory = 0;
  DeviceId peakDevice = 0;
  Bytes capacity = 0; ///< per device
  bool fits = true;   ///< every device's memory within its capacity
  /// Bytes of point-to-point transfers by the link classes they cross.
  std::map<LinkClass, Bytes> transferBytesByClass;
  Bytes transferBytes = 0;
  /// Bytes sent in all-reduces, summed over devices (a ring's 2(n-1)/n of
  /// the buffer from each of n devices).
  Bytes collectiveBytes = 0;
  Seconds computeTime = 0; ///< sum of compute task times, all devices
  /// The chain of tasks that determines the iteration time, and how its
  /// time divides between kinds of task.
  size_t criticalPathTasks = 0;
  Seconds criticalCompute = 0, criticalTransfer = 0, criticalCollective = 0,
          criticalUpdate = 0;
  /// Time on the critical path that communication took from a device's
  /// kernels (DeviceSpec::ncclComputeShareIntra/Inter).
  Seconds criticalContention = 0;
  size_t numTasks = 0; ///< simulated (a folded graph's: block 0's)
  /// Blocks the graph was folded over (TaskGraph::fold; 1: not folded).
  int32_t fold = 1;
};

class Simulator {
public:
  explicit Simulator(TaskGraph &tg);

  /// Algorithm 1: simulates the whole graph; returns the iteration time.
  Seconds simulateFull();
  /// The same, stopped as soon as the iteration time is certain to exceed
  /// `limit` (nullopt; resume() as after stage()).
  std::optional<Seconds> simulateFull(Seconds limit);
  /// Changes op `o`'s configuration and simulates the change (delta):
  /// stage() then resume().
  llvm::Expected<Seconds> apply(OpId o, const OpConfig &c,
                                std::optional<WeightGradOrder> order = {});
  /// Changes op `o`'s configuration (the task graph, its memory) and keeps
  /// the schedule before the first time the change can matter, without
  /// simulating the rest: the caller may look at the graph's memory first.
  /// With `order`, the op's weight-gradient order changes too
  /// (TaskGraph::changeConfig).
  llvm::Error stage(OpId o, const OpConfig &c,
                    std::optional<WeightGradOrder> order = {});
  /// Simulates what stage() left. With a limit, stops as soon as the
  /// makespan is certain to exceed it (returns nullopt; resume() with a
  /// higher limit goes on, undo() takes the change back): every device's
  /// or link's remaining tasks run one after another after the time it is
  /// free, so the latest such end bounds the makespan from below. Exact:
  /// a run that is not stopped gives the full simulation's timeline.
  std::optional<Seconds>
  resume(Seconds limit = std::numeric_limits<Seconds>::infinity());
  /// Takes back the last stage() or apply(), finished or not: the previous
  /// configuration and exactly the previous timeline, restored from what
  /// stage() replaced instead of simulated again (a rejected MCMC proposal
  /// costs the graph rebuild and as much simulation as it took to reject
  /// it). Only directly after stage(), apply() or resume().
  llvm::Error undo();

  Seconds iterationTime() const;
  SimMetrics metrics() const;
  /// The chain of tasks that determines the iteration time, first to last:
  /// from the last task to finish back through, at each step, the
  /// predecessor or the device/link queue it waited for.
  std::vector<TaskId> criticalPath() const;
  /// The same, adding the time on it that communication took from a
  /// device's kernels (DeviceSpec::ncclComputeShareIntra/Inter) to
  /// `*contention` where not null.
  std::vector<TaskId> criticalPath(Seconds *contention) const;
  /// Tasks re-simulated by the last call (for benchmarks).
  size_t lastResimulated() const { return lastResimulated_; }
  /// Chrome trace (chrome://tracing, Perfetto): one track per device and
  /// per link.
  Json chromeTrace() const;

  TaskGraph &graph() { return tg_; }
  const TaskGraph &graph() const { return tg_; }

private:
  struct QItem {
    Seconds ready;
    TaskKey key;
    TaskId id;
    /// The ready queue's heap of tasks ready at one time puts the least key
    /// first (std's heaps put the greatest first).
    static bool laterKey(const QItem &x, const QItem &y) {
      return y.key < x.key;
    }
  };
  /// The ready tasks, popped in (ready time, key) order, a total order.
  /// A run never pushes a task ready before the last one popped (a task is
  /// ready no earlier than the end of the predecessor that made it ready),
  /// so this is a radix heap over the ready time's bits: a push files the
  /// task in the bucket of the highest bit where its time differs from the
  /// last popped one, and a pop re-files only the least bucket's tasks. The
  /// tasks ready at exactly the last popped time are a binary heap by key.
  class ReadyQueue {
  public:
    void clear();
    bool empty() const { return size_ == 0; }
    void push(const QItem &item);
    QItem pop();

  private:
    /// Bucket b (1-64): the highest differing bit is b - 1; 0: the same.
    int bucketOf(Seconds ready) const;
    void file(const QItem &item);
    uint64_t last_ = 0; ///< the last popped ready time's bits
    size_t size_ = 0;
    std::vector<QItem> same_;
    std::vector<std::vector<QItem>> buckets_ =
        std::vector<std::vector<QItem>>(65);
    uint64_t nonEmpty_ = 0; ///< bit b - 1: bucket b holds tasks
  };
  /// One task a resource ran: its position in the order, its end, and the
  /// resource's summed task time up to and including it (picoseconds).
  struct LogEntry {
    uint32_t seq;
    Seconds end;
    int64_t done;
  };
  /// Clears the timeline and starts a run of every task.
  void startFull();
  /// Starts a run at position `fromSeq` from the ready tasks `initial`.
  void start(uint32_t fromSeq, const std::vector<TaskId> &initial);
  /// The makespan's lower bound from resource `r`: the time it is free plus
  /// its tasks not yet run.
  Seconds resourceBound(uint32_t r) const;
  /// A staged run's first look at task `id` (the journal keeps what it
  /// held for undo()): it is taken off the kept timeline, and its ready
  /// time and predecessors left are counted from the kept prefix.
  void touch(TaskId id);
  /// The per-task scratch vectors as long as the task vector.
  void growScratch();
  /// Collective `t`, just scheduled, takes its share of its GPUs' time
  /// (DeviceSpec::ncclComputeShareIntra/Inter).
  void contend(const Task &t);
  /// Whether resource `r`'s log entry `e` is time a collective took from
  /// device `r` (contend()) rather than a task of its own.
  bool contentionEntry(uint32_t r, const LogEntry &e) const;
  /// The task `t` waited for to start (kNoTask: none), adding the time
  /// communication took from its device on the way to `*contention`.
  TaskId waitedFor(const Task &t, Seconds *contention) const;

  TaskGraph &tg_;
  /// One position of the timeline: the task, one past the position of the
  /// predecessor that made it ready (0: none; so stage() finds the tasks
  /// ready at a position without visiting the others), its ready time, and
  /// the latest end so far.
  struct Slot {
    TaskId task;
    uint32_t readyAfter;
    Seconds ready, maxEnd;
  };
  std::vector<Slot> timeline_;
  /// Per resource: the tasks it ran, in order.
  std::vector<std::vector<LogEntry>> resourceLog_;
  /// The run in progress: ready tasks, and the next position.
  ReadyQueue queue_;
  uint32_t nextSeq_ = 0;
  /// Per resource: whether tasks on it wait for one another (devices and
  /// links; not the links Topology::nonBlocking names).
  std::vector<uint8_t> exclusive_;
  /// Per link: its GPU ends (-1: none) and whether it leaves the node;
  /// empty where communication takes no share of the GPUs' time.
  struct LinkEnds {
    int32_t from = -1, to = -1;
    bool inter = false;
  };
  std::vector<LinkEnds> linkEnds_;
  double shareIntra_ = 0, shareInter_ = 0;
  std::vector<uint32_t> contended_; ///< contend()'s scratch
  /// Per task, for the run in progress: predecessors left, and one past
  /// the position of the one that made it ready.
  std::vector<uint32_t> remaining_, readyAfter_;
  size_t lastResimulated_ = 0;
  /// A staged run visits only the tasks it re-simulates: a task whose stamp
  /// is not the run's epoch still holds the kept timeline. `keep_` is the
  /// run's first position (every position in a full run).
  std::vector<uint32_t> stamp_;
  uint32_t epoch_ = 0;
  uint32_t keep_ = 0;

  /// What the last stage() replaced, for undo(): only what the run touched.
  struct Timing {
    Seconds ready, start, end;
    uint32_t seq;
  };
  /// Task `t` back as it was simulated with timing `old`.
  static void restore(Task &t, const Timing &old);
  struct Touched {
    TaskId id;
    Timing old;
    bool simulated; ///< false: a task the change created
  };
  struct Rebuilt {
    size_t pos; ///< in the old suffix
    TaskKey key;
    Timing old;
  };
  struct Journal {
    bool valid = false;
    OpId op = -1;
    OpConfig previous;
    WeightGradOrder previousOrder = WeightGradOrder::Next;
    uint32_t keep = 0;
    /// The old schedule's suffix (positions keep and on), copied whole; the
    /// tasks the run touched, with their old timings; and the tasks of
    /// rebuilt segments (their ids change), by key.
    std::vector<Slot> tail;
    std::vector<std::vector<LogEntry>> logTails;
    std::vector<Touched> touched;
    std::vector<Rebuilt> rebuilt;
  };
  /// Per task, scratch flags of stage(), clear between calls.
  enum : uint8_t { kChanged = 1 };
  std::vector<uint8_t> mark_;
  Journal journal_;
};

} // namespace soap

#endif // SOAP_SIM_SIMULATOR_H
