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
#include <map>

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
  size_t numTasks = 0;
};

class Simulator {
public:
  explicit Simulator(TaskGraph &tg);

  /// Algorithm 1: simulates the whole graph; returns the iteration time.
  Seconds simulateFull();
  /// Changes op `o`'s configuration and simulates the change (delta).
  llvm::Expected<Seconds> apply(OpId o, const OpConfig &c);
  /// Takes back the last apply(): the previous configuration and exactly
  /// the previous timeline, restored from what apply() replaced instead of
  /// simulated again (a rejected MCMC proposal costs the graph rebuild,
  /// not a second simulation). Only directly after apply().
  llvm::Error undo();

  Seconds iterationTime() const;
  SimMetrics metrics() const;
  /// The chain of tasks that determines the iteration time, first to last:
  /// from the last task to finish back through, at each step, the
  /// predecessor or the device/link queue it waited for.
  std::vector<TaskId> criticalPath() const;
  /// Tasks re-simulated by the last call (for benchmarks).
  size_t lastResimulated() const { return lastResimulated_; }
  /// Chrome trace (chrome://tracing, Perfetto): one track per device and
  /// per link.
  Json chromeTrace() const;

  TaskGraph &graph() { return tg_; }
  const TaskGraph &graph() const { return tg_; }

private:
  void run(uint32_t fromSeq, std::vector<TaskId> initial);

  TaskGraph &tg_;
  std::vector<TaskId> order_;
  std::vector<Seconds> orderReady_, prefixMaxEnd_;
  /// Per resource: (seq, end) of the tasks it ran, in order.
  std::vector<std::vector<std::pair<uint32_t, Seconds>>> resourceLog_;
  /// Per resource: whether tasks on it wait for one another (devices and
  /// links; not the links Topology::nonBlocking names).
  std::vector<uint8_t> exclusive_;
  std::vector<uint32_t> remaining_;
  size_t lastResimulated_ = 0;

  /// What the last apply() replaced, for undo().
  struct Timing {
    Seconds ready, start, end;
    uint32_t seq;
  };
  struct Journal {
    bool valid = false;
    OpId op = -1;
    OpConfig previous;
    uint32_t keep = 0;
    /// The old schedule's suffix: task (old id), its key, whether it was
    /// rebuilt by the change (its id then changes), its timing.
    std::vector<TaskId> orderTail;
    std::vector<Seconds> orderReadyTail, prefixMaxEndTail;
    std::vector<std::vector<std::pair<uint32_t, Seconds>>> logTails;
    std::vector<TaskKey> keys;
    std::vector<bool> rebuilt;
    std::vector<Timing> timings;
  };
  Journal journal_;
};

} // namespace soap

#endif // SOAP_SIM_SIMULATOR_H
