// The task graph of one training iteration under a strategy (FlexFlow
// section 5.1, extended to the SOAP space): a forward and a backward task per
// tile, a transfer per pair of tiles whose regions intersect on different
// devices (forward activations and backward gradients, the exact
// intersection's bytes, on the links of the route), collectives for partial
// sums, split statistics and weight-gradient synchronisation, and an update
// task per weight shard. It is built in segments (an op's tasks, an edge's
// transfers, a weight's synchronisation) so that changing one op's
// configuration rebuilds only the segments that touch it.
#ifndef SOAP_SIM_TASKGRAPH_H
#define SOAP_SIM_TASKGRAPH_H

#include "soap/Cost/CostModel.h"
#include "soap/Machine/Collectives.h"
#include "soap/Parallel/Strategy.h"
#include "soap/Sim/Fold.h"
#include "llvm/ADT/SmallVector.h"
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

namespace soap {

using TaskId = uint32_t;
constexpr TaskId kNoTask = ~TaskId(0);

enum class TaskKind : uint8_t {
  Forward,    ///< a tile's forward kernel, on its device
  Backward,   ///< a tile's backward-data kernel (with the recomputed
              ///< forward first, where the op is recomputed); of an op
              ///< without weights, its whole backward
  Transfer,   ///< a region sent between two devices, on the route's links
  Collective, ///< all-reduce of partial sums, statistics or weight gradients
  Update,     ///< the optimizer step of a weight shard
  Gate,       ///< no time, no resource: a pipeline stage's schedule (its
              ///< next micro-batch item waits for the previous one), or a
              ///< weight's join with its gradient bucket (keyed by the
              ///< weight, high bit set: SyncUnit)
  WeightGrad, ///< a tile's backward-weight kernel, after its backward-data
              ///< kernel; last in key order, so that when both are ready
              ///< together a device runs the next op's backward-data first
              ///< (the weight gradient deferred, as Megatron-LM defers the
              ///< embedding's)
};
llvm::StringRef taskKindName(TaskKind k);

/// What a collective task reduces.
enum class CollectiveRole : uint8_t {
  PartialSum,
  Statistics,
  WeightGrad,   ///< all-reduce or (ZeRO) reduce-scatter of weight gradients
  Exchange,     ///< a recurrence's state, every step (LoopDim::exchangeSteps)
  WeightGather, ///< ZeRO's all-gather of weights: the updated shards (1, 2)
                ///< or the whole weight before a forward or backward (3)
  /// An edge's region all-gathered: each device of the group holds one
  /// slice of what every one of them reads (TaskGraph::EdgeGather) — a
  /// sequence-parallel activation before a column-parallel GEMM ...
  ActivationGather,
  GradientGather, ///< ... or its gradient before a row-parallel one's backward
};

/// A canonical identity of a task, independent of the order the graph was
/// built in, so that ties in ready time break the same way in a full and a
/// delta simulation.
struct TaskKey {
  uint8_t kind = 0;
  uint32_t a = 0, b = 0;
  uint64_t c = 0;
  bool operator<(const TaskKey &o) const {
    if (kind != o.kind)
      return kind < o.kind;
    if (a != o.a)
      return a < o.a;
    if (b != o.b)
      return b < o.b;
    return c < o.c;
  }
  bool operator==(const TaskKey &o) const {
    return kind == o.kind && a == o.a && b == o.b && c == o.c;
  }
};

/// A task's resources, predecessors or successors: most have one or two,
/// held in the task itself (a graph of millions of tasks allocated three
/// small vectors per task before). Its move cannot throw, and says so, so
/// that a growing std::vector<Task> moves its tasks instead of copying them
/// (llvm::SmallVector's move constructor is not declared noexcept).
class TaskList : public llvm::SmallVector<uint32_t, 2> {
  using Base = llvm::SmallVector<uint32_t, 2>;

public:
  using Base::Base;
  TaskList() = default;
  TaskList(const TaskList &) = default;
  TaskList(TaskList &&o) noexcept : Base(std::move(static_cast<Base &>(o))) {}
  TaskList &operator=(const TaskList &) = default;
  TaskList &operator=(TaskList &&o) noexcept {
    Base::operator=(std::move(static_cast<Base &>(o)));
    return *this;
  }
};

/// Members ordered by size, so that a task is 176 bytes, not 200.
struct Task {
  TaskKey key;
  Seconds exe = 0;
  Bytes bytes = 0; ///< moved by a transfer or a collective
  /// Devices [0, N) and directed links (N + link id) the task occupies.
  TaskList resources;
  TaskList preds, succs;
  int64_t tile = -1; ///< tile index for compute tasks
  // Filled by the simulator.
  Seconds ready = 0, start = 0, end = 0;
  OpId op = -1;           ///< the op (compute, transfer into it, its reductions)
  int32_t microBatch = 0; ///< the micro-batch of a compute, transfer or
                          ///< per-micro-batch collective task
  ValueId weight = -1;    ///< the weight of a WeightGrad collective or update
  uint32_t groupSize = 0; ///< devices in a collective
  /// A forward transfer's receiving device (for the micro-batches its stage
  /// holds). Not counted in memory: the consumer's forward frees what it
  /// received or keeps it as a saved input (`saved`), so no receive buffer
  /// is left when the backward pass peaks.
  int32_t bufferDevice = -1;
  uint32_t seq = 0; ///< position in the simulated order (simulator)
  TaskKind kind = TaskKind::Forward;
  CollectiveRole role = CollectiveRole::PartialSum;
  Collective comm = Collective::AllReduce; ///< what a collective does
  /// A collective of a folded graph whose devices span blocks (one task
  /// for all of them); every other task of a folded graph stands for one
  /// per block.
  bool spans = false;
  bool alive = false;
  bool simulated = false; ///< (simulator)
};
static_assert(std::is_nothrow_move_constructible_v<Task>,
              "a growing task vector must move its tasks, not copy them");

/// Every op's gradient-assembly bytes per device (TaskGraph's memory model)
/// for the last strategy built with it, kept between builds. They depend
/// only on the graph, the ops' configurations, the micro-batch count and
/// the fold, which the rungs of a memory ladder (ZeRO, recomputation) and
/// the build() that follows the buildMemory() that fit all share; on GPT-3
/// 175B over 1,024 GPUs computing them was most of a buildMemory(). One
/// entry, compared whole (never a hash): a hit gives exactly the integers
/// the computation gives. Shared by the threads of a search.
class AssemblyCache {
public:
  using PerOp = std::vector<std::map<DeviceId, Bytes>>;
  /// The entry for `s` (its configurations and micro-batch count) folded
  /// as `f` over `g`, or null.
  std::shared_ptr<const PerOp> find(const Graph &g, const Strategy &s,
                                    const Fold &f) const;
  void put(const Graph &g, const Strategy &s, const Fold &f,
           std::shared_ptr<const PerOp> value);
  size_t hits() const;

private:
  mutable std::mutex mu_;
  const Graph *graph_ = nullptr;
  std::vector<OpConfig> configs_;
  int32_t microBatches_ = 0, factor_ = 0;
  uint32_t block_ = 0, period_ = 0;
  std::shared_ptr<const PerOp> value_;
  mutable size_t hits_ = 0;
};

/// Everything the graph is built from; all must outlive the TaskGraph.
struct SimContext {
  const Graph &graph;
  const Topology &topo;
  const CostModel &cost;
  const CollectiveModel &collectives;
  Optimizer optimizer = Optimizer::Sgd;
  /// TaskGraph::build gives up (TaskGraphTooLarge) past this many tasks; 0:
  /// no limit. Searchers skip a start whose graph would not fit in RAM.
  size_t maxTasks = 0;
  /// Fold a symmetric strategy (Fold.h): the same timeline, memory and
  /// iteration time from block 0's tasks.
  bool fold = false;
  /// Derive each kind of edge's transfers once and replay them for every
  /// edge of that kind (TaskGraph::edgePlan); false derives every edge's
  /// own (the same graph, slower: for tests that compare the two).
  bool shareEdgePlans = true;
  /// The runtime runs an op's weight gradients as tasks of their own after
  /// its backward-data, deferred one weighted op (TaskKind::WeightGrad), as
  /// a GPU runtime with a communication stream does; false: an op's
  /// backward is one task, as soap-run runs it (its memory prediction).
  /// Never on devices whose communication occupies them (CPU ranks).
  bool splitWeightGrad = true;
  /// Where builds of one search keep what the next build of the same
  /// configurations reuses (null: nothing kept).
  std::shared_ptr<AssemblyCache> assembly = nullptr;
};

/// The loop of `c` that splits a ring-attention loop (LoopDim::ring) of
/// `sem`, or -1: the op's tiles then compute 1/degree of their kernel per
/// ring step (TaskGraph::buildRing).
int ringSplitLoop(const OpSemantics &sem, const OpConfig &c);
/// Whether the ring of loop `l` carries input `i` (K and V: the ring's
/// paired loop indexes it, `l` does not): its gradient comes home with the
/// ring, not by an all-reduce of partial sums.
bool ringCarries(const OpSemantics &sem, int l, int i);

/// Whether graphs built in `ctx` run weight gradients as tasks of their own
/// (SimContext::splitWeightGrad, and not on CPU ranks).
inline bool splitsWeightGrad(const SimContext &ctx) {
  return ctx.splitWeightGrad && !ctx.topo.deviceSpec().commOccupiesCompute;
}

/// TaskGraph::build passed SimContext::maxTasks.
class TaskGraphTooLarge : public llvm::ErrorInfo<TaskGraphTooLarge> {
public:
  static char ID;
  explicit TaskGraphTooLarge(size_t limit) : limit_(limit) {}
  void log(llvm::raw_ostream &os) const override;
  std::error_code convertToErrorCode() const override;

private:
  size_t limit_;
};

/// TaskGraph::changeConfig on a folded graph was given a configuration that
/// does not fold: the graph keeps the previous one.
class FoldBroken : public llvm::ErrorInfo<FoldBroken> {
public:
  static char ID;
  explicit FoldBroken(std::string op) : op_(std::move(op)) {}
  void log(llvm::raw_ostream &os) const override;
  std::error_code convertToErrorCode() const override;

private:
  std::string op_;
};

/// `err` with a TaskGraphTooLarge taken out: success when that was all it
/// held (a searcher then skips the strategy); `tooLarge` says whether it
/// did.
llvm::Error dropTooLarge(llvm::Error err, bool &tooLarge);

class TaskGraph {
public:
  /// Builds the whole graph. Errors come from the cost model (strict mode).
  static llvm::Expected<TaskGraph> build(const SimContext &ctx,
                                         const Strategy &s);
  /// Only the memory of what build() would make: every device's
  /// memory() and fits() exactly as build() gives them, without a task.
  /// Costs about one pass over the tiles, so a searcher can drop a
  /// strategy that does not fit before building and simulating it (on
  /// 1,024 GPUs a graph has tens of millions of tasks).
  static llvm::Expected<TaskGraph> buildMemory(const SimContext &ctx,
                                               const Strategy &s);

  /// Changes op `o`'s configuration, rebuilding its segments in place.
  /// `changed` receives every task whose existence, edges or time changed
  /// (new tasks and neighbours whose edges changed) and `removedReady` the
  /// old ready times of removed tasks, for the delta simulator (`changed`
  /// in no particular order, each task once). A folded
  /// graph takes only a configuration that keeps the fold (FoldBroken
  /// otherwise, the previous configuration kept; restoredAfterBreak()
  /// says whether its segments were rebuilt meanwhile). With `order`, the
  /// op's weight-gradient order (Strategy::weightGrad) changes with it:
  /// its weight gradients wait for another op's backward-data.
  llvm::Error changeConfig(OpId o, const OpConfig &c,
                           std::vector<TaskId> &changed,
                           std::vector<Seconds> &removedReady,
                           std::optional<WeightGradOrder> order = {});

  /// The weight-gradient orders that give op `o` different anchors: Next
  /// and Now, and Last where its anchor is not Next's; none where the
  /// order cannot matter (no weighted op up its gradient chain, or weight
  /// gradients not tasks of their own).
  std::vector<WeightGradOrder> weightGradOrders(OpId o) const;

  /// The tasks changeConfig(o, ...) removes and rebuilds: op `o`'s own
  /// segment, its edges' and its weights'.
  std::vector<TaskId> segmentTasks(OpId o) const;

  const Strategy &strategy() const { return strategy_; }
  std::vector<Task> &tasks() { return tasks_; }
  const std::vector<Task> &tasks() const { return tasks_; }
  size_t numAlive() const { return numAlive_; }
  size_t numResources() const {
    return ctx_->topo.numDevices() + ctx_->topo.links().size();
  }
  const SimContext &context() const { return *ctx_; }
  /// The fold this graph was built with (Fold.h; inactive: the full graph).
  const Fold &fold() const { return fold_; }
  /// Whether the last changeConfig() failed with FoldBroken after
  /// rebuilding segments (the previous configuration was rebuilt: the
  /// tasks' ids changed, so a simulation must start again).
  bool restoredAfterBreak() const { return restoredAfterBreak_; }

  /// Memory each device holds at its peak: weights, gradients and optimizer
  /// state of its shards, each counted once per device; saved activations
  /// (every op's, as at the end of the forward pass); receive buffers (none
  /// today: Task::bufferDevice); and as workspace, the most that the backward
  /// pass holds beyond the saved activations it has not yet freed (an op's
  /// output and input gradients, or while it assembles its output gradients
  /// the readers' pieces and those received from other devices; gradients
  /// waiting for their producer, recomputed activations, ZeRO's gathered
  /// weights and whole weight gradients; an op's saved activations and
  /// output gradients until its deferred weight gradients have run, through
  /// the previous weighted op's backward), which can be less than a workspace
  /// since the later ops' saved activations are freed by then.
  struct DeviceMemory {
    Bytes weights = 0, gradients = 0, optimizer = 0, saved = 0, buffers = 0,
          workspace = 0;
    Bytes total() const {
      return weights + gradients + optimizer + saved + buffers + workspace;
    }
  };
  const std::vector<DeviceMemory> &memory() const { return mem_; }
  /// Edge plans derived since the graph was made (not found shared).
  size_t edgePlansDerived() const { return edgePlansDerived_; }
  /// Every device's memory within its capacity.
  bool fits() const;
  /// Per resource (devices, then links): the summed time of the alive tasks
  /// that occupy it, in integer picoseconds (toPicoseconds of each task's
  /// time), so that adding and removing tasks never drifts. The delta
  /// simulator's lower bound on the makespan reads it.
  const std::vector<int64_t> &resourceWork() const { return work_; }
  static int64_t toPicoseconds(Seconds s) {
    return static_cast<int64_t>(s * 1e12 + 0.5);
  }

private:
  explicit TaskGraph(const SimContext &ctx) : ctx_(&ctx) {}
  /// build() and buildMemory(): the edges, weights and memory.
  static llvm::Expected<TaskGraph> prepare(const SimContext &ctx,
                                           const Strategy &s, bool fold);
  static llvm::Expected<TaskGraph> buildGraph(const SimContext &ctx,
                                              const Strategy &s, bool fold);
  /// Whether device `d` has tasks in this graph (block 0 of a fold).
  bool mine(DeviceId d) const { return fold_.first(d); }
  /// Whether a collective over `devs` (ascending) is in this graph: not
  /// when every device is past block 0; spanning blocks, only when the
  /// fold maps `devs` onto itself (else the fold is broken).
  bool foldKeeps(const std::vector<DeviceId> &devs);
  /// Every block's devices' memory from block 0's.
  void mirrorMemory();

  struct Edge {
    OpId producer;
    int output;
    OpId consumer;
    int input;
  };
  /// Per op: its compute tasks and the handles others depend on.
  /// Indexed micro-batch-major: micro-batch mb's task (tile k, replica r)
  /// is [mb * numTasks + k * replicas + r].
  struct OpTasks {
    std::vector<TaskId> fwd, bwd; ///< per micro-batch and task
    /// Per micro-batch, task and weight input (sem.weightInputs): the
    /// weight-gradient task, [(mb * tasks + t) * weightsPer + j]; of an op
    /// without weights, the backward task (weightsPer 1).
    std::vector<TaskId> wgrad;
    size_t weightsPer = 1;
    bool splitWeight = false; ///< wgrad holds TaskKind::WeightGrad tasks
    /// Per micro-batch, output and tile: output ready (after reductions),
    /// [(mb * outputs + j) * tiles + k].
    std::vector<TaskId> fwdOut;
    std::vector<TaskId> bwdOut; ///< per micro-batch and task: input
                                ///< gradients ready
    std::vector<TaskId> own;    ///< every task of the segment
    /// The collectives of partial sums (of an output, or of an input's
    /// gradient), whose kind follows the neighbours' configurations
    /// (sumsScatter): changing a neighbour updates them in place.
    struct Sum {
      TaskId task;
      int32_t mb;
      int32_t index; ///< output j, or input i
      int64_t group;
      bool input;
      std::vector<DeviceId> devs;
    };
    std::vector<Sum> sums;
  };

  TaskId newTask(Task t);
  /// Per micro-batch and group (`members`, tiles of op `o` writing one
  /// region), whether the partial sums of o's output `index` (or, with
  /// `input`, of the gradient of its input `index`) are reduce-scattered
  /// rather than all-reduced: the tasks that take the summed region (the
  /// output's readers; the input's producer) each take a distinct equal
  /// slice of it, on the group's own devices, one slice per device
  /// (TaskGraphSums.cpp).
  /// The tiles of op `o` whose partial sums of output `index` (or, with
  /// `input`, of input `index`'s gradient) are combined: each group's tiles
  /// differ only in split loops missing from the operand's map. Empty when
  /// no such loop is split.
  std::vector<std::vector<int64_t>> sumGroups(OpId o, bool input,
                                              int index) const;
  std::vector<std::vector<bool>>
  sumsScatter(OpId o, bool input, int index,
              const std::vector<std::vector<int64_t>> &members) const;
  /// Sets the kind of op `o`'s partial-sum collectives (of outputs, or
  /// with `input` of input gradients) from the neighbours' current
  /// configurations, in place; appends those that changed to `changed`.
  void refreshSums(OpId o, bool input, std::vector<TaskId> &changed);
  void removeTask(TaskId id, std::vector<TaskId> &touched,
                  std::vector<Seconds> &removedReady);
  void link(TaskId from, TaskId to);
  /// Puts task `t` after the ready task of each of `members`' replicas
  /// (index base + k * reps + r in `ready`) and makes it theirs: what
  /// follows them in the pass follows `t`.
  void chainReady(TaskId t, std::vector<TaskId> &ready,
                  const std::vector<int64_t> &members, int64_t base,
                  int32_t reps);
  llvm::Error buildOp(OpId o);
  /// Op `o`'s ring-attention exchange over its split ring loop
  /// (TaskGraphRing.cpp), after its tiles' forward and backward tasks.
  void buildRing(OpId o, int ringLoop, std::vector<TaskId> &fwdReady,
                 std::vector<TaskId> &bwdReady);
  /// Links op `anchor`'s backward-data tasks to op `later`'s weight-gradient
  /// tasks on the same device and micro-batch, once both are built.
  void deferWeightGrad(OpId later, OpId anchor);
  /// Whether op `o`'s weight gradients wait for its anchor (gradAnchor_):
  /// it has one, and o's configuration holds a weight shard on two devices
  /// (a gradient all-reduce the deferral lets start sooner), where
  /// splitsWeightGrad().
  bool defersWeightGrad(OpId o) const;
  bool splitsWeightGrad() const { return soap::splitsWeightGrad(*ctx_); }
  /// Builds edge `e`'s transfers; with `count`, only counts them into it.
  void buildEdge(size_t e, std::vector<TaskId> &owned, size_t *count = nullptr);
  /// One transfer of an edge (or, when both ends are on one device, one
  /// dependency), as edgePlan derives it from the two configurations:
  /// micro-batch, direction (0 forward, 1 backward), the index of its source
  /// in the producer's forward outputs or the consumer's input gradients and
  /// of its destination in the consumer's forwards or the producer's
  /// backwards (within the micro-batch), and the parts of its key.
  struct EdgeStep {
    int64_t from, to, kp, kc;
    Bytes bytes;
    DeviceId a, b;
    int32_t mb, r;
    uint8_t dir;
  };
  /// Transfers of an edge that are one all-gather: the devices of `devs`
  /// each hold one distinct slice of a region that every one of them reads
  /// whole (a sequence-parallel activation before a column-parallel GEMM,
  /// forward; its gradient before a row-parallel GEMM's backward). `from`
  /// and `to` index tasks as EdgeStep's do, one per device.
  struct EdgeGather {
    std::vector<int64_t> from, to;
    std::vector<DeviceId> devs; ///< relative to the plan's base, ascending
    Bytes bytes;                ///< the whole region
    int32_t mb;
    uint8_t dir;
  };
  struct EdgePlan {
    std::vector<EdgeStep> steps; ///< in build order; only block 0's
    std::vector<EdgeGather> gathers; ///< only block 0's
    bool broken = false;         ///< a transfer crosses blocks
  };
  /// Edge `e`'s plan with devices relative to `base` (the lowest device of
  /// its two configurations), from edgePlans_ when an edge with the same
  /// inputs was planned before (the repeated layers of a GPT).
  std::shared_ptr<const EdgePlan> edgePlan(size_t e, DeviceId base);
  /// The edge whose forward transfers edge `e` takes (buildEdge): the first
  /// edge from the same output into `e`'s consumer's later pipeline stage
  /// whose consumer has the same configuration, loops and region map; `e`
  /// itself when none is, or when `e` stays within a stage.
  size_t sharedForward(size_t e) const;
  void buildWeight(ValueId w, std::vector<TaskId> &owned);
  /// One shard group of a weight (buildWeight): the devices holding copies
  /// of one region, whose gradients are combined. Its bucket's collectives
  /// (TaskGraphBuckets.cpp) link to the unit's zero-time gates, which are
  /// the weight segment's, so that rebuilding a bucket relinks one gate per
  /// member rather than every tile's weight-gradient task.
  struct SyncUnit {
    uint32_t group = 0;
    std::vector<DeviceId> devs; ///< ascending, at least two
    Bytes bytes = 0;            ///< the gradient buffer
    int64_t params = 0;         ///< its elements
    int zero = 0;               ///< ZeRO stage (0: all-reduced)
    int32_t stage = 0;          ///< pipeline stage of its first user
    OpId firstUser = 0; ///< its lowest user, whose backward completes it
    /// Gradients ready: one gate after every micro-batch's, or (ZeRO-2/3,
    /// reduce-scattered per micro-batch) one per micro-batch.
    std::vector<TaskId> ready;
    TaskId reduced = kNoTask;  ///< the updates wait for it
    TaskId updated = kNoTask;  ///< after the updates (ZeRO-1/2, gathered
                               ///< after the step)
    TaskId gathered = kNoTask; ///< before the micro-batch 0 forwards that
                               ///< read it (ZeRO-1/2, gathered overlapped)
  };
  /// A bucket: consecutive units (in the order their gradients complete) of
  /// one pipeline stage, ZeRO stage and device group, one collective each
  /// (per micro-batch under ZeRO-2/3) for all of them.
  using UnitId = std::pair<ValueId, uint32_t>; ///< weight, group
  struct Bucket {
    std::vector<UnitId> members;
    std::vector<DeviceId> devs;
    std::vector<TaskId> tasks; ///< its collectives
    TaskId gather = kNoTask;   ///< ZeRO-1/2's all-gather of the weights
  };
  /// The buckets every sequence (stage, ZeRO stage, devices) of units falls
  /// into under the strategy's GradSync, in gradient order.
  std::vector<std::vector<std::vector<UnitId>>> assignBuckets() const;
  const SyncUnit &syncUnit(UnitId u) const;
  /// Builds the collectives of a bucket of `members` into buckets_; without
  /// overlapGradReduce they wait for `rank(mb)`'s tasks on their devices.
  using RankTasks =
      std::function<const std::vector<std::vector<TaskId>> &(int32_t mb)>;
  void buildBucket(const std::vector<UnitId> &members, const RankTasks &rank);
  /// Builds every bucket (build()), or rebuilds those changeConfig()
  /// affects: the ones holding a unit of a weight in `ws`, the ones whose
  /// members changed, and without overlapGradReduce the ones on `devs`
  /// (the changed op's devices before and after). New tasks and relinked
  /// ones go to `changed`.
  void buildBuckets(const std::set<ValueId> *ws,
                    const std::vector<DeviceId> &devs,
                    std::vector<TaskId> &touched,
                    std::vector<Seconds> &removedReady,
                    std::vector<TaskId> *changed);
  /// Per device: the backward and weight-gradient tasks of micro-batch `mb`
  /// (what a bucket waits for without overlapGradReduce).
  std::vector<std::vector<TaskId>> rankTasks(int32_t mb) const;
  /// Removes weight `w`'s segment: its tasks and the memory it accounted.
  void removeWeight(ValueId w, std::vector<TaskId> &touched,
                    std::vector<Seconds> &removedReady);
  /// The weights whose segments change with op `o`'s configuration: its
  /// own, and those of the ops whose ZeRO-3 prefetch waits on `o`.
  std::set<ValueId> weightsTouching(OpId o) const;
  /// The op whose forward (dir -1) or backward (+1) a ZeRO-3 all-gather of
  /// `o`'s weights waits for (two weighted ops earlier in the forward or
  /// backward order, in the same stage), or -1.
  OpId prefetchAnchor(OpId o, int dir) const;
  /// The gates that order device group `grp`'s pipeline items.
  void buildStage(int32_t grp, std::vector<TaskId> &owned);
  Seconds transferTime(DeviceId a, DeviceId b, Bytes bytes) const;
  std::vector<uint32_t> routeResources(DeviceId a, DeviceId b) const;
  const std::vector<uint32_t> &ringResources(const std::vector<DeviceId> &g);
  /// GradSync::tpCommOverlap: collective `id` (an all-gather or
  /// reduce-scatter over `devs`) pipelined with the GEMM tasks `gemms` it
  /// feeds or follows, as Transformer Engine's userbuffers run them: the
  /// GEMM in one chunk per device, each chunk's communication beside the
  /// next chunk's compute. The task keeps only what is not hidden, plus the
  /// GEMM's slowdown (NCCL's compute share) while hidden. Nothing changes
  /// where the setting is off, the collective is not an all-gather or
  /// reduce-scatter, its devices span nodes, or `gemmOp` is not a GEMM.
  void overlapTensorParallel(TaskId id, const std::vector<DeviceId> &devs,
                             OpId gemmOp, llvm::ArrayRef<TaskId> gemms);
  /// Op `o`'s forward tasks of micro-batch `mb` among tiles `members` (the
  /// GEMMs whose partial sums a collective combines).
  std::vector<TaskId> sumGemms(OpId o, int32_t mb,
                               const std::vector<int64_t> &members);
  /// Sets task `id`'s time, keeping its resources' work totals.
  void setExe(TaskId id, Seconds exe);
  /// `count` back-to-back collectives of `bytes` each as one task.
  TaskId collective(CollectiveRole role, TaskKey key, OpId op,
                    const std::vector<DeviceId> &devs, Bytes bytes,
                    Collective kind = Collective::AllReduce, int64_t count = 1);
  llvm::Expected<KernelTimes> kernelTimes(OpId o, const Box &tile);

  const SimContext *ctx_;
  Strategy strategy_;
  std::vector<Task> tasks_;
  std::vector<TaskId> free_;
  size_t numAlive_ = 0;
  std::vector<Edge> edges_;
  std::vector<std::vector<size_t>> edgesOfOp_; ///< in and out edges per op
  std::vector<OpTasks> opTasks_;
  std::vector<std::vector<TaskId>> edgeTasks_;
  std::vector<ValueId> weights_; ///< weight values used by ops
  std::map<ValueId, std::vector<TaskId>> weightTasks_;
  /// Per weight: its shard groups that have collectives in this graph.
  std::map<ValueId, std::vector<SyncUnit>> weightUnits_;
  /// Every bucket, by its first member.
  std::map<UnitId, Bucket> buckets_;
  std::vector<std::vector<TaskId>> stageTasks_; ///< gates, per group
  std::map<std::vector<DeviceId>, std::vector<uint32_t>> ringCache_;
  /// Edge plans keyed by everything they depend on: both ops' loops, the
  /// producer's output map and the consumer's input map, the value's shape
  /// and element size, whether a gradient flows back, both configurations,
  /// the micro-batch count and the fold. Bounded by kEdgePlanBytes.
  std::unordered_map<std::string, std::shared_ptr<const EdgePlan>> edgePlans_;
  size_t edgePlanBytes_ = 0;
  size_t edgePlansDerived_ = 0;
  std::vector<TaskId> predsChanged_; ///< during changeConfig
  /// changeConfig()'s list without repeats: a task is in it once when its
  /// stamp is the call's (sorting it cost more than the rest of the call
  /// for a change that rebuilt 100,000 transfers).
  std::vector<uint32_t> changedStamp_;
  uint32_t changedEpoch_ = 0;
  std::vector<int64_t> work_;        ///< per resource, picoseconds
  bool memoryOnly_ = false;          ///< buildMemory(): no tasks
  Fold fold_;
  /// Set while building when something crosses blocks (Fold.h).
  bool foldBroken_ = false;
  bool restoredAfterBreak_ = false;

  // Memory, kept up to date as segments are built and removed.
  void addOpMemory(OpId o, int sign);
  /// Per tile of op `o`, what keptBytes counts for it (at its micro-batch
  /// tile) that its device does not hold for it (addOpMemory):
  ///  - a saved input that a lower op (whose backward runs later) with o's
  ///    configuration saves too: autograd saves the one tensor once (the
  ///    LayerNorm's output that Llama's separate q, k and v projections, or
  ///    its gate and up projections, all read);
  ///  - of a saved input all-gathered from sequence-parallel slices
  ///    (TaskGraph::edgePlan's EdgeGather: the slices of one producer, each
  ///    on one of the devices reading the region), all but the device's
  ///    slice: Megatron-LM saves its slice and gathers the input again in
  ///    backward (Korthikanti et al. 2022, section 4.2.2), a gather the task
  ///    graph does not add (under tp_comm_overlap it runs beside the
  ///    backward-data GEMM).
  std::vector<Bytes> unheldSavedBytes(OpId o) const;
  /// Per op, the other ops whose addOpMemory reads its configuration: the
  /// readers of its outputs and the ops saving an input it saves.
  std::vector<std::vector<OpId>> memoryReaders_;
  std::vector<DeviceMemory> mem_;
  /// What each weight's segment added to mem_, per device.
  std::map<ValueId, std::vector<std::pair<DeviceId, DeviceMemory>>> weightMem_;
  std::vector<OpId> weighted_;       ///< ops with weights, in id order
  std::vector<int32_t> weightedPos_; ///< per op: index in weighted_, or -1
  /// Per weighted op: the op whose backward-data its weight gradients wait
  /// for (build(), by the strategy's WeightGradOrder), or -1; and per op,
  /// the ops that wait for it.
  std::vector<OpId> gradAnchor_;
  std::vector<std::vector<OpId>> anchoredBy_;
  /// Per weighted op: its anchor under WeightGradOrder::Next and under
  /// Last (the root of the chain of Next anchors), or -1.
  std::vector<OpId> nextAnchor_, rootAnchor_;
  /// Sets op `o`'s weight-gradient order in the strategy and its anchor
  /// (setAnchor).
  void setWeightGradOrder(OpId o, WeightGradOrder order);
  /// Sets gradAnchor_[o] (and anchoredBy_) for `order`.
  void setAnchor(OpId o, WeightGradOrder order);
  /// The backward pass's memory over time, per device: leaf o is what the
  /// device holds (beyond weights, gradients, optimizer state and buffers)
  /// while op o's backward runs. Ops run their backward in descending id
  /// order, so an op's saved activations are added to leaves [o, N); its
  /// gradients to leaf o. Range-add / global-max segment tree: adding and
  /// removing an op's memory in any order gives the same integers, so a
  /// delta simulation's peak equals a full one's.
  struct PeakTree {
    size_t size = 0;               ///< leaves, a power of two
    std::vector<int64_t> add, max; ///< per node
    void init(size_t leaves);
    void rangeAdd(size_t lo, size_t hi, int64_t v) {
      if (lo < hi && v != 0)
        rangeAdd(1, 0, size, lo, hi, v);
    }
    int64_t peak() const { return max[1]; }

  private:
    void rangeAdd(size_t node, size_t nlo, size_t nhi, size_t lo, size_t hi,
                  int64_t v);
  };
  std::vector<PeakTree> peaks_; ///< per device, built on first use
  /// Per op and device: what its backward's kernel phase holds (the output
  /// and input gradients, the workspace, ZeRO's gathered weights).
  std::vector<std::map<DeviceId, Bytes>> kernelMem_;
  /// Per op: what setLeafMemory added at its leaf, per device.
  std::vector<std::vector<std::pair<DeviceId, Bytes>>> leafMem_;
  std::map<DeviceId, Bytes> assemblyBytes(OpId p) const;
  void setLeafMemory(OpId p) { setLeafMemory(p, assemblyBytes(p)); }
  void setLeafMemory(OpId p, const std::map<DeviceId, Bytes> &assembly);
  /// Per op: the highest op whose backward recomputes it (its own id when
  /// it is not recomputed, or first recomputed by its own backward).
  std::vector<OpId> recomputedUntil_;
  std::map<std::pair<OpId, Box>, KernelTimes> kernelCache_;
  /// vocabularyLoops(graph), found at the first kernel a padded
  /// vocabulary (Strategy::vocabPadding) could change.
  std::optional<std::vector<int>> vocabLoops_;
};

} // namespace soap

#endif // SOAP_SIM_TASKGRAPH_H
