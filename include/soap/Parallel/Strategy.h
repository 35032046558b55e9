// Parallel configurations (DESIGN.md, "Parallel configurations"): how one op
// is split (a degree per loop dimension, S/A/P/R alike), how many copies of
// each tile run (replicas), and on which devices; a Strategy gives one to
// every op of a graph.
#ifndef SOAP_PARALLEL_STRATEGY_H
#define SOAP_PARALLEL_STRATEGY_H

#include "soap/IR/Graph.h"
#include "soap/Machine/Topology.h"
#include "llvm/Support/Error.h"
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

namespace soap {

/// One op's configuration. Tiles are numbered in mixed radix over the loops,
/// the last loop fastest; tile k's replica r runs on devices[k * replicas + r].
/// Tile coordinate c of loop l covers [c * chunk, min((c+1) * chunk, size)),
/// chunk = ceil(size / degree): every loop is split evenly except a padded
/// vocabulary's (Strategy::vocabPadding), whose last tile may be shorter, as
/// Megatron-LM's last vocabulary shard holds the rows its padding adds.
struct OpConfig {
  std::vector<int32_t> degree; ///< one per loop of the op; 1 = not split
  int32_t replicas = 1;        ///< copies of every tile (TensorOpt)
  std::vector<DeviceId> devices;

  int64_t numTiles() const;
  int64_t numTasks() const { return numTiles() * replicas; }
  /// The box of tile k (0 <= k < numTiles()).
  Box tile(const OpSemantics &sem, int64_t k) const;
  /// Tile k's coordinate along loop l (0 .. degree[l] - 1).
  int64_t coordinate(int64_t k, size_t l) const;
  DeviceId device(int64_t tileIndex, int32_t replica = 0) const {
    return devices[size_t(tileIndex) * replicas + replica];
  }
  /// Distinct devices, ascending.
  std::vector<DeviceId> deviceSet() const;

  bool operator==(const OpConfig &o) const {
    return degree == o.degree && replicas == o.replicas && devices == o.devices;
  }
  bool operator!=(const OpConfig &o) const { return !(*this == o); }
  bool operator<(const OpConfig &o) const;

  /// "n=4 oc=2 @0-7" (split loops, replicas if > 1, devices as ranges).
  std::string str(const OpSemantics &sem) const;
  /// The single-device configuration: nothing split, on `d`.
  static OpConfig single(const OpSemantics &sem, DeviceId d);
};

/// Checks `c` for an op: one degree per loop, each >= 1 and dividing the
/// loop's size into tiles that respect its granule, unsplittable loops at 1,
/// replicas >= 1, devices.size() == numTasks(), every device in the
/// topology, no device twice among one tile's replicas. Errors name `where`.
/// `unevenLoop` (a padded vocabulary's loop, or -1) may take a degree that
/// does not divide it, as long as every tile is non-empty.
llvm::Error verifyConfig(const OpConfig &c, const OpSemantics &sem,
                         size_t numDevices, llvm::StringRef where,
                         int unevenLoop = -1);

/// How micro-batches run through the stages of a pipeline.
enum class PipelineSchedule : uint8_t {
  GPipe,    ///< every stage runs all forwards, then all backwards
  OneFOneB, ///< PipeDream-Flush / Megatron: warm-up forwards, then one
            ///< forward and one backward in turn, then the drain; with
            ///< several model chunks per device group, Megatron's
            ///< interleaved 1F1B
  ZbH1,     ///< zero-bubble H1 (Qi et al. 2024): 1F1B's forwards and
            ///< backward-data, each stage's weight gradients delayed by its
            ///< index so they fill the drain's bubbles
};
llvm::StringRef scheduleName(PipelineSchedule s);
/// "gpipe", "1f1b" or "zb-h1".
std::optional<PipelineSchedule> parseSchedule(llvm::StringRef name);

/// One item of a device group's schedule: a micro-batch's forward,
/// backward (with its weight gradients, unless the schedule runs those
/// apart) or weight gradients (zb-h1) of every op of one stage.
enum class PipePass : uint8_t { Forward, Backward, Weight };
struct PipeItem {
  int32_t stage = 0;
  int32_t microBatch = 0;
  PipePass pass = PipePass::Forward;
  bool operator==(const PipeItem &o) const {
    return stage == o.stage && microBatch == o.microBatch && pass == o.pass;
  }
};

/// Pipeline parallelism and gradient accumulation: the op graph cut into
/// stages, contiguous in the graph's topological (op id) order, and the
/// per-iteration batch run as `microBatches` micro-batches whose weight
/// gradients are summed before one synchronisation per iteration. Stage s
/// runs on device group s % groups (groups = stages / chunks): with one
/// chunk every stage has its own group; with v chunks (Megatron's virtual
/// pipeline, --num-layers-per-virtual-pipeline-stage) each group holds v
/// stages, the model's chunks g, g + groups, ..., and runs them in the
/// interleaved 1F1B order. Each op's configuration splits one micro-batch
/// (its sample loop's tiles are of batch / (microBatches * degree)
/// samples). One stage and one micro-batch is FlexFlow's SOAP strategy.
struct Pipeline {
  int32_t microBatches = 1;
  PipelineSchedule schedule = PipelineSchedule::OneFOneB;
  /// Model chunks (stages) per device group; 1: not interleaved.
  int32_t chunks = 1;
  /// Per op, its stage (0-based, non-decreasing in op id); empty: one stage.
  std::vector<int32_t> stageOf;

  int32_t numStages() const;
  /// Device groups: stages / chunks (verifyPipeline checks it divides).
  int32_t numGroups() const { return std::max(1, numStages() / chunks); }
  /// The device group of stage `s`.
  int32_t group(int32_t s) const { return s % numGroups(); }
  int32_t stage(OpId o) const {
    return stageOf.empty() ? 0 : stageOf[size_t(o)];
  }
  /// Micro-batches or stages in use.
  bool active() const { return microBatches > 1 || numStages() > 1; }
  /// Whether weight gradients are items of their own (zb-h1).
  bool splitsWeightGrad() const { return schedule == PipelineSchedule::ZbH1; }
  /// Micro-batches whose activations stage `s` holds when its group holds
  /// the most (a micro-batch is held from its forward to its backward, or
  /// to its weight gradients under zb-h1): all of them under GPipe,
  /// min(m, stages - s) under 1F1B, each stage's share of its group's peak
  /// when interleaved, `groups` under zb-h1. Summed over a group's stages
  /// it is the group's peak when its chunks are alike.
  int32_t inFlight(int32_t s) const;
  /// The order device group `grp` runs its items in.
  std::vector<PipeItem> order(int32_t grp) const;
  bool operator==(const Pipeline &o) const {
    return microBatches == o.microBatches && schedule == o.schedule &&
           chunks == o.chunks && stageOf == o.stageOf;
  }
};

/// When a device runs an op's weight gradients (its backward-weight kernel,
/// a task per weight after its backward-data: README, `soapc simulate`).
/// Where the gradients are all-reduced, the order decides which all-reduce
/// can start while the device still computes, and how long the op's saved
/// activations and output gradients are held. A runtime choice, not a
/// numerical one: every order computes the same gradients.
enum class WeightGradOrder : uint8_t {
  Next, ///< after the backward-data of the nearest op with weights up its
        ///< gradient chain: the input gradients one weighted op ahead
        ///< (Megatron-LM's deferred weight gradient); the default
  Last, ///< after the backward of the farthest one along that chain (the
        ///< first weighted op of the stage): every input gradient of the
        ///< stage first, then the weight gradients, those of the ops
        ///< nearest the input first (their all-reduces start soonest)
  Now,  ///< right after its own backward-data (PyTorch's order)
};
llvm::StringRef weightGradOrderName(WeightGradOrder o);
/// "next", "last" or "now".
std::optional<WeightGradOrder> parseWeightGradOrder(llvm::StringRef name);

/// How the runtime synchronises weight gradients over data-parallel groups
/// (Megatron-Core's DistributedDataParallelConfig; the defaults are NeMo's
/// GPT-3 175B recipe), and whether it overlaps tensor-parallel
/// communication with GEMMs. A runtime choice, not a numerical one: every setting
/// computes the same weights.
struct GradSync {
  /// --overlap-grad-reduce: each bucket's all-reduce or reduce-scatter
  /// starts when its last gradient is ready, during the backward pass;
  /// false: every bucket's after the device's backward pass has ended (one
  /// bucket per data-parallel group, as Megatron sets bucket_size=None).
  bool overlapGradReduce = true;
  /// --overlap-param-gather (ZeRO-1/2): the updated weights are all-gathered
  /// bucket by bucket during the next iteration's forward, each before the
  /// first use of its weights; false: after the optimizer step, before the
  /// next iteration starts.
  bool overlapParamGather = true;
  /// --ddp-bucket-size, in parameters (elements) per bucket; 0: Megatron-
  /// Core's default, max(40,000,000, 1,000,000 x the group's devices). As
  /// in Megatron-Core, only the first pipeline stage is bucketed: a later
  /// stage (or model chunk) has one bucket per data-parallel group, its
  /// communication being off the critical path.
  int64_t bucketParams = 0;
  /// Megatron-Core's tp_comm_overlap (Transformer Engine's userbuffers,
  /// which needs sequence parallelism): a tensor-parallel group's
  /// all-gather before a GEMM, and its reduce-scatter after one, are split
  /// into one chunk per device and pipelined with the GEMM's chunks, in the
  /// forward pass and in the backward-data pass of the row-parallel GEMM
  /// (TaskGraph::tpOverlapTime). Only within a node (userbuffers needs
  /// NVLink). Not a gradient setting, but like the others a runtime choice
  /// that computes the same weights.
  bool tpCommOverlap = false;
  bool operator==(const GradSync &o) const {
    return overlapGradReduce == o.overlapGradReduce &&
           overlapParamGather == o.overlapParamGather &&
           bucketParams == o.bucketParams && tpCommOverlap == o.tpCommOverlap;
  }
  bool operator!=(const GradSync &o) const { return !(*this == o); }
  /// The bucket size over a data-parallel group of `devices`.
  int64_t bucketParamsFor(int64_t devices) const {
    return bucketParams > 0
               ? bucketParams
               : std::max<int64_t>(40000000, int64_t(1000000) * devices);
  }
};

/// A configuration for every op of a graph, indexed by OpId, how the
/// iteration is pipelined, and which ops recompute their forward in the
/// backward pass instead of keeping what it saves.
struct Strategy {
  std::vector<OpConfig> configs;
  Pipeline pipeline;
  /// Per op, 1 when it is recomputed; empty: none. A recomputed op keeps
  /// only the saved inputs that a kept (not recomputed) op produced — the
  /// checkpoints — and runs its forward again before its backward.
  std::vector<uint8_t> recompute;
  bool recomputes(OpId o) const {
    return !recompute.empty() && recompute[size_t(o)] != 0;
  }
  /// Per op, the ZeRO stage (0-3) of its weights over each data-parallel
  /// group (the devices that hold copies of one weight shard); empty: none.
  /// 1 shards the optimizer state (DeepSpeed ZeRO-1: one reduce-scatter of
  /// the gradients, the update of 1/D, one all-gather of the weights per
  /// iteration); 2 also the gradients (reduce-scattered after every
  /// micro-batch); 3 also the weights (FSDP: all-gathered before each
  /// micro-batch's forward and backward, prefetched one weighted op ahead).
  /// A weight used by several ops takes the highest stage among them.
  std::vector<uint8_t> zero;
  int zeroStage(OpId o) const { return zero.empty() ? 0 : zero[size_t(o)]; }
  /// Per op with weights, when its weight gradients run (WeightGradOrder's
  /// values); empty: Next everywhere.
  std::vector<uint8_t> weightGrad;
  WeightGradOrder weightGradOrder(OpId o) const {
    return weightGrad.empty() ? WeightGradOrder::Next
                              : WeightGradOrder(weightGrad[size_t(o)]);
  }
  /// How weight gradients are bucketed and overlapped (TaskGraph's
  /// buckets).
  GradSync gradSync;
  /// Megatron-LM's --make-vocab-size-divisible-by: the runtime pads the
  /// vocabulary V to a multiple of this times the degree d its loop is split
  /// by, so every op's loop of V's size (vocabularyLoops: the embedding,
  /// the LM head, the loss) runs on V' / d columns per tile, which keeps
  /// the LM head's GEMM aligned. Priced in kernel times only (the padded
  /// 0.1-1% of the LM head's weights is not counted in memory). 0: none.
  int32_t vocabPadding = 0;
  bool operator==(const Strategy &o) const {
    return configs == o.configs && pipeline == o.pipeline &&
           recompute == o.recompute && zero == o.zero &&
           weightGrad == o.weightGrad && gradSync == o.gradSync &&
           vocabPadding == o.vocabPadding;
  }
};

/// The ZeRO stage of weight `w`: the highest among the ops that use it.
int weightZeroStage(const Graph &g, const Strategy &s, ValueId w);

/// Whether some weight shard of op `o` is held by more than one device
/// (a data-parallel group that ZeRO can shard over).
bool hasDataParallelGroup(const Graph &g, const Strategy &s, OpId o);

/// Clears the ZeRO stage of ops with no data-parallel group (where it means
/// nothing), and the whole vector when no op keeps one.
void dropIdleZero(const Graph &g, Strategy &s);

/// `stage` (0-3) on every op with a data-parallel group, 0 elsewhere.
std::vector<uint8_t> zeroPolicy(const Graph &g, const Strategy &s, int stage);

/// Bytes op `o`'s `tile` keeps for backward under `s`: everything it saves,
/// or, recomputed, every activation input its forward reads again that a
/// kept op (or the graph's input) produced.
Bytes keptBytes(const Graph &g, const Strategy &s, OpId o, const Box &tile);

/// Which ops save anything for backward.
bool savesActivations(const OpSemantics &sem);

/// Whether recomputing op `o` under `s` means anything: it saves something
/// for backward, or a recomputed op reads its output (it runs again for
/// them, so that its output is not kept: a block of recomputed ops keeps
/// only what enters the block).
bool recomputeMatters(const Graph &g, const Strategy &s, OpId o);

/// The checkpoints of full recomputation: the ops after which the output
/// is the only activation still to be read (the residual stream between a
/// transformer's blocks, the output of each stage of a CNN), ascending.
std::vector<OpId> checkpointOps(const Graph &g);

/// Recomputation policies for the searchers and baselines: `selective`
/// recomputes every op without weights that saves something (norms,
/// activations, softmax, dropout: cheap to run again, large to keep, as
/// Megatron's selective recomputation); `full` every op but the
/// checkpoints (checkpointOps) and the ops whose recomputation means
/// nothing: each block between two checkpoints runs its forward again in
/// backward from what entered it, as Megatron's full recomputation keeps
/// only each layer's input.
std::vector<uint8_t> recomputePolicy(const Graph &g, bool full);

/// The pipeline's part of verifyStrategy (stages, device groups, chunks,
/// micro-batch divisibility).
llvm::Error verifyPipeline(const Strategy &s, const Graph &g);

/// The first sample loop of `sem`, or -1.
int sampleLoop(const OpSemantics &sem);

/// Whether `m` micro-batches of an op split `degree`-ways per loop leave
/// each micro-batch's tiles whole granules of its sample loop (true for
/// m <= 1; false when it has no sample loop): verifyPipeline's rule.
bool microBatchesDivide(const OpSemantics &sem,
                        const std::vector<int32_t> &degree, int32_t m);

/// The box of tile `k` of `c` for micro-batch `mb` of `m`: the sample
/// loop's range narrowed to the micro-batch (tile(sem, k) when m == 1).
Box microBatchTile(const OpConfig &c, const OpSemantics &sem, int64_t k,
                   int32_t mb, int32_t m);

/// Every op configured and every configuration valid on `topo`; with a
/// pipeline: stages contiguous and non-decreasing in op order, the device
/// groups (stage % groups) disjoint, every op with a sample loop that m x
/// its degree divides; interleaved: chunks dividing the stages, 1f1b, and
/// m a multiple of the groups (Megatron's rule).
llvm::Error verifyStrategy(const Strategy &s, const Graph &g,
                           const Topology &topo);

} // namespace soap

#endif // SOAP_PARALLEL_STRATEGY_H
