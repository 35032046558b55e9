// TensorOpt's Frontier Tracking (Cai et al., "TensorOpt: Exploring the
// Tradeoffs in Distributed DNN Training with Auto-Parallelism", sections 3
// and 4): the Pareto frontier of (iteration time, memory per device) over
// per-op parallel configurations, by eliminations down to a linear graph
// and a linear DP over frontiers.
//
// The configuration set (TensorOpt 2.1): every op is parallelised over all
// devices in use, with power-of-two degrees on at most `maxSplitLoops` of
// its IR loops (S/A/P/R alike) and the rest of the devices as replicas;
// devices follow the tile order (no placement choice).
#ifndef SOAP_SEARCH_FRONTIERTRACKING_H
#define SOAP_SEARCH_FRONTIERTRACKING_H

#include "soap/Search/Frontier.h"
#include "soap/Search/Searcher.h"
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace soap {

struct FtOptions {
  /// Devices the configurations use: 0 = the largest power of two that the
  /// topology has (TensorOpt's parallelism; mini-parallelism varies it).
  size_t devices = 0;
  /// Loops split at once (a device mesh of this many dimensions).
  int maxSplitLoops = 2;
  /// 0: the meshes above. Else the node mesh (Megatron-LM's layout): the
  /// sample loop split over as many of the devices as it can take, at most
  /// one other loop split up to this many ways (a node's devices: tensor
  /// parallelism inside a node, data parallelism across nodes), replicas
  /// only for what the sample loop cannot take; maxSplitLoops is not used.
  /// A 1-D mesh cannot split an op both ways, and a 2-D one on 1,024
  /// devices has so many configurations that FT does not finish (nodeMeshFor).
  int32_t nodeMesh = 0;
  /// `topo`'s node mesh: its devices per node, or 0 when that is not a
  /// power of two or does not divide the devices (`--mesh node`).
  static int32_t nodeMeshOf(const Topology &topo);
  /// The node mesh `ft` and `soapc frontier --mesh auto` use on `topo`:
  /// nodeMeshOf on more than 64 devices in more than one node, else 0.
  static int32_t nodeMeshFor(const Topology &topo);
  /// TensorOpt 4.2: a re-scheduled tensor both sides save for backward may
  /// keep the copy before, after, or both.
  bool tensorReuse = true;
  /// Recomputation as a configuration (the extension TensorOpt section 2
  /// names, and memory dimension): every configuration of an op
  /// that saves activations also comes recomputed, its forward run again
  /// before its backward instead of its saved tensors kept; it then keeps
  /// the activation inputs that kept producers (or the graph) give it, as
  /// the simulator counts them (keptBytes).
  bool recompute = true;
  /// Gradient accumulation: each iteration's batch runs as this many
  /// micro-batches on the same devices (one stage), gradients synchronised
  /// once. Kernels, activation transfers and per-row statistics run once
  /// per micro-batch; one micro-batch's activations are held at a time.
  /// Configurations whose sample split leaves a micro-batch no whole
  /// granule are left out; an op with no sample loop cannot run in more
  /// than one (FtModel::build says so).
  int32_t microBatches = 1;
  /// Sharding as a configuration: every configuration of an op
  /// whose weights (read by it alone) are replicated over a data-parallel
  /// group also comes with ZeRO stages 1, 2 and 3 over that group — the
  /// optimizer state, then the gradients, then the weights held 1/R; the
  /// gradient's reduce-scatter and all-gather cost what its all-reduce did
  /// (a ring all-reduce is the two), and stage 3 gathers the weight before
  /// the op's forward and backward of each micro-batch, exposed where it
  /// is longer than that pass's kernel (FSDP's prefetch hides the rest).
  /// Off by default: the three variants multiply what branch elimination
  /// merges (NMT on 8 GPUs: 0.18 s with neither, 1.65 s with recomputation,
  /// 82 s with both); the ft searcher turns it on when no point fits
  /// without it.
  bool zero = false;
  /// Linear DP over the marked backbone (FT-LDP); false eliminates down to
  /// one node instead (FT-Elimination, for comparison).
  bool useLdp = true;
  /// Branch elimination may merge two nodes into one of at most this many
  /// joint configurations; beyond it heuristic elimination fixes a node.
  size_t maxMergedConfigs = 4096;
  /// Relative time a frontier point must gain to be kept (0: the exact
  /// frontier; see reduceCandidates).
  double resolution = 0;
  int threads = 1;
  /// Polled between eliminations and products: true stops the search
  /// (FtResult::cancelled; a searcher's deadline).
  std::function<bool()> cancelled;
  bool isCancelled() const { return cancelled && cancelled(); }
  llvm::Error validate() const;
  /// What `--search ft` and `soapc frontier` use by default: 1-D device
  /// meshes and a 1% epsilon-frontier (bench shows the cost of
  /// the exact 2-D one).
  static FtOptions fast() {
    FtOptions o;
    o.maxSplitLoops = 1;
    o.resolution = 0.01;
    return o;
  }
};

/// One configuration of an op: a degree per loop and a replica count whose
/// product is the device count.
struct FtConfig {
  std::vector<int32_t> degree;
  int32_t replicas = 1;
  bool recompute = false; ///< FtOptions::recompute
  uint8_t zero = 0;       ///< FtOptions::zero: the ZeRO stage, 0 to 3
};

/// One producer-output -> consumer-input use of an activation, or (with
/// `weight`) two consecutive users of one weight: the simulator all-reduces
/// the gradients of a shared weight's overlapping shards once over every
/// holder, so its cost depends on both users' configurations. `producer` is
/// then the earlier user, `output` -1, and `input` the later user's operand.
struct FtEdge {
  OpId producer;
  int output;
  OpId consumer;
  int input;
  ValueId value;
  bool weight = false;
};

/// An edge option: re-scheduling time (forward and backward), memory delta
/// (tensor reuse drops a saved copy), and its name.
struct FtEdgeOption {
  Seconds time = 0;
  double memory = 0;
};

/// Initialisation (TensorOpt Eq. 1 and 2): the configurations of every op
/// with their costs, and every edge's options per configuration pair.
class FtModel {
public:
  static llvm::Expected<FtModel> build(const SearchProblem &p,
                                       const FtOptions &o);

  size_t numOps() const { return configs_.size(); }
  size_t devices() const { return devices_; }
  int32_t microBatches() const { return microBatches_; }
  const std::vector<FtConfig> &configs(OpId o) const { return configs_[o]; }
  /// Eq. 1 per configuration: computation (forward + backward kernels),
  /// synchronisation (weight-gradient, statistics and partial-sum
  /// all-reduces, re-scheduling of graph inputs loaded data-parallel), and
  /// memory per device (weights, gradients, optimizer state, saved
  /// activations). A weight with several users is left to weight edges.
  Seconds computeTime(OpId o, size_t k) const { return compute_[o][k]; }
  Seconds syncTime(OpId o, size_t k) const { return sync_[o][k]; }
  double memory(OpId o, size_t k) const { return memory_[o][k]; }
  /// What the op's backward holds while it runs, beyond `memory`: the
  /// kernel's workspace, its output gradients and the input gradients it
  /// writes (a whole input's partial sum where the op splits a loop the
  /// input does not index). A peak, not a sum: assignmentCosts takes the
  /// largest over the ops (FtCosts::transient).
  double transient(OpId o, size_t k) const { return transient_[o][k]; }
  /// A recomputed configuration's saved activations, which exist again
  /// while the backward of its recomputed chain runs (0 when not
  /// recomputed).
  double recomputedBytes(OpId o, size_t k) const { return again_[o][k]; }
  const Graph &graph() const { return problem_->graph; }
  const std::vector<FtEdge> &edges() const { return edges_; }
  /// Eq. 2 options of edge `e` for producer config `a`, consumer config `b`:
  /// option 0 keeps both copies; with tensor reuse 1 keeps the copy before
  /// re-scheduling, 2 the copy after (neither when either side is
  /// recomputed). A recomputed consumer of a kept producer holds its input
  /// region in every option. A weight edge has one option: the shared
  /// weight's exposed gradient all-reduce and its memory per device.
  const std::vector<FtEdgeOption> &edgeOptions(size_t e, size_t a,
                                               size_t b) const {
    return edgeOpts_[e][a * configs_[edges_[e].consumer].size() + b];
  }
  /// The cheapest sequence of collectives from one split of a tensor to
  /// another (a shortest path over the collective model); exposed for tests.
  /// Splits are log2 degrees per tensor dim, then partial sum, replicas.
  Seconds reschedule(const std::vector<int64_t> &shape, Bytes elemBytes,
                     const std::vector<uint8_t> &from,
                     const std::vector<uint8_t> &to) const;

  /// The configuration as a Strategy op config (devices in tile order).
  OpConfig opConfig(OpId o, size_t k) const;

private:
  friend struct FtModelBuilder;
  friend struct FtPaths;
  size_t devices_ = 1;
  int maxSplitLoops_ = 2;
  int32_t nodeMesh_ = 0;
  bool recompute_ = true;
  bool zero_ = false;
  int32_t microBatches_ = 1;
  const SearchProblem *problem_ = nullptr;
  std::vector<std::vector<FtConfig>> configs_;
  std::vector<std::vector<Seconds>> compute_, sync_;
  std::vector<std::vector<double>> memory_, transient_, again_;
  std::vector<FtEdge> edges_;
  std::vector<std::vector<std::vector<FtEdgeOption>>> edgeOpts_;
  /// Shortest paths per (rank, bytes, source split): target -> time.
  mutable std::map<std::tuple<size_t, double, uint64_t>,
                   std::vector<std::pair<uint64_t, Seconds>>>
      pathCache_;
};

/// A full choice: a configuration per op and an option per edge.
struct FtAssignment {
  std::vector<int32_t> config; ///< per op
  std::vector<uint8_t> reuse;  ///< per edge
};

/// Eq. 3 of an assignment: time (compute + network) and memory per device.
struct FtCosts {
  Seconds time = 0, compute = 0, network = 0;
  double memory = 0;
  /// Bytes an op's backward holds at once beyond `memory`, the most over
  /// the ops (FtModel::transient): the simulator's workspace, which Eq. 3's
  /// sum does not count. Not part of the frontier's order (assignmentCosts
  /// sets it).
  double transient = 0;
  /// FT's estimate of a device's peak: what it holds plus the largest
  /// backward working set.
  double peakMemory() const { return memory + transient; }
};
FtCosts assignmentCosts(const FtModel &m, const FtAssignment &a);
Strategy assignmentStrategy(const FtModel &m, const FtAssignment &a);

struct FtStats {
  size_t nodeEliminations = 0, edgeEliminations = 0, branchEliminations = 0,
         heuristicEliminations = 0;
  size_t backbone = 0;     ///< nodes left for the linear DP
  size_t maxFrontier = 0;  ///< largest frontier seen
  size_t totalConfigs = 0; ///< configurations over all ops
  size_t traceEntries = 0;
  /// Exact unless heuristic elimination ran (TensorOpt 3.2).
  bool exact() const { return heuristicEliminations == 0; }
};

struct FtPoint {
  FtCosts costs;
  FtAssignment assignment;
};

struct FtResult {
  std::vector<FtPoint> points; ///< ascending memory, descending time
  FtStats stats;
  bool cancelled = false; ///< FtOptions::cancelled stopped it: no points
};

/// TensorOpt Algorithm 2: initialisation is `m`; eliminations (Eq. 4-7)
/// with the linear backbone marked, the linear DP (Algorithm 3), and
/// unrolling into one assignment per frontier point. Deterministic whatever
/// `o.threads`.
FtResult frontierTracking(const FtModel &m, const FtOptions &o);

/// TensorOpt 4.1's modes.
enum class FtMode : uint8_t { Frontier, MiniTime, MiniParallelism, Profile };
std::optional<FtMode> parseFtMode(llvm::StringRef s);

/// A frontier point re-scored by the simulator.
struct FtScored {
  FtPoint point;
  Strategy strategy;
  size_t devices = 0;
  Seconds simTime = 0;
  Bytes simPeakMemory = 0;
  bool simFits = false;
  bool simulated = false; ///< false: beyond maxSimulated, not re-scored
  /// Not simulated: its task graph passes taskLimit (RAM).
  bool tooLarge = false;
  /// Not simulated: building or simulating it ran out of memory.
  bool outOfMemory = false;
};

/// The frontier on `o.devices` devices; up to `maxSimulated` points spread
/// evenly over it (the first and last always) are simulated, 0 = all. With
/// `memoryCap` > 0 they are spread over the points whose FT memory is at
/// most that many bytes, and the least-memory point is simulated always.
struct FtFrontierReport {
  size_t devices = 0;
  FtOptions options;
  std::vector<FtScored> points;
  FtStats stats;
  double seconds = 0; ///< FT running time (not the simulations)
};
llvm::Expected<FtFrontierReport> frontierReport(const SearchProblem &p,
                                                const FtOptions &o,
                                                size_t maxSimulated = 0,
                                                double memoryCap = 0);

/// Mini-time: the point the simulator finds fastest among the simulated
/// ones that fit; an index into `r.points`, or -1.
int miniTimePoint(const FtFrontierReport &r);

/// The frontier's turning point (TensorOpt Figure 6): the point furthest
/// below the chord from the least-memory point to the fastest one, both axes
/// scaled to their ranges, with the slopes of FT's time against memory
/// before and after it.
struct FtKnee {
  int index = -1;                         ///< -1: fewer than three points
  double slopeBefore = 0, slopeAfter = 0; ///< seconds per byte
  double timeShare = 0;   ///< of the time gained, the part before the knee
  double memoryShare = 0; ///< of the memory range, the part before the knee
};
FtKnee frontierKnee(const FtFrontierReport &r);

/// Profile / mini-parallelism: the frontier at 1, 2, 4, ... devices.
llvm::Expected<std::vector<FtFrontierReport>>
profileReports(const SearchProblem &p, const FtOptions &o,
               size_t maxSimulated = 0);

/// Ops a point's strategy recomputes, and those it gives a ZeRO stage (the
/// table's and JSON's counts).
size_t recomputedOps(const Strategy &s);
size_t zeroOps(const Strategy &s);

/// JSON of a report (schema in README, "Frontier tracking") and an SVG plot
/// of memory per device against time, FT's estimate and the simulator's.
Json frontierJson(const FtFrontierReport &r, const Graph &g,
                  const Topology &topo, Seconds dataParallelTime,
                  Bytes dataParallelMemory);
std::string frontierSvg(const FtFrontierReport &r, const Graph &g,
                        Seconds dataParallelTime, Bytes dataParallelMemory);

/// Adds "ft" to the registry (registerAllSearchers calls it).
void registerFtSearcher(SearcherRegistry &r);

} // namespace soap

#endif // SOAP_SEARCH_FRONTIERTRACKING_H
