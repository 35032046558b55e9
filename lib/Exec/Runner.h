// The executor's per-rank driver (private to lib/Exec): the tasks of every
// op and micro-batch on this rank, the weights it holds (whole boxes, or
// ZeRO shards), their gradients and optimizer state, and the schedule that
// walks forward, recomputation, backward and the optimizer step in the same
// order on every rank. Executor.cpp runs the ops; ExecutorWeights.cpp
// holds, synchronises and updates the weights.
#ifndef SOAP_EXEC_RUNNER_H
#define SOAP_EXEC_RUNNER_H

#include "Assemble.h"
#include "Bf16.h"
#include "Kernels.h"
#include "soap/Exec/Executor.h"
#include "soap/Support/Error.h"
#include "soap/Support/Json.h"
#include <map>
#include <set>
#include <tuple>

namespace soap {
namespace exec {

/// The shape a weight is addressed in: its users' view where they share
/// one (checkExecutable refuses others), else its own.
const std::vector<int64_t> &weightShape(const Graph &g, const Value &w);

class Runner : public StatsExchange {
public:
  Runner(const Graph &g, const Strategy &s, Comm &comm, const ExecOptions &opts)
      : storage_(opts.precision == "bf16"), g_(g), s_(s), comm_(comm),
        opts_(opts), me_(comm.rank()), bf16_(opts.precision == "bf16") {}

  llvm::Expected<std::vector<StepResult>> run();

  void allReduce(const std::vector<bool> &keep, std::vector<Buf *> &rows,
                 Combine c) override;
  void allGather(const std::vector<bool> &keep, int wide,
                 std::vector<Buf *> &rows, bool partial) override;

private:
  struct OpPlan {
    std::vector<Box> tiles;
    std::vector<std::vector<Box>> inReg, outReg; // [operand][tile]
    std::vector<int> localTask;                  // per tile, -1 if none
  };

  /// One distinct box of a weight that some ranks read, with the ranks
  /// that hold it (its data-parallel group). Under ZeRO the box's elements
  /// (row-major over the box) are split in parts of ceil(n / D), the last
  /// ones shorter (possibly empty): member i owns part i.
  struct WeightBox {
    ValueId w = kNoValue;
    Box box;
    std::vector<int> group; ///< ascending
    int zero = 0;           ///< effective stage: 0 on a group of one
    std::vector<size_t> counts;
    int member = -1; ///< this rank's index in group, -1 if not held here
    size_t offset = 0, part = 0; ///< this member's part
    // This rank's storage (member >= 0), tracked by the memory counter.
    Buf weight;      ///< the whole box (zero < 3); lent to the tasks
    FloatVec shard;  ///< zero == 3: this member's part of the weight
    FloatVec grad;   ///< the whole box (zero < 2), else this member's part
    FloatVec mbGrad; ///< zero >= 2: the current micro-batch's whole box
    Fp32Vec m, v;    ///< optimizer state (of the part under ZeRO)
    /// bf16: the fp32 master weight (of the part under ZeRO), which the
    /// optimizer updates; `weight` (or `shard`) holds it rounded to bf16.
    Fp32Vec master;
    /// A gradient was added to `grad` this step (without micro-batches it
    /// is lent to a kernel only before: adding a tile's rows onto an
    /// earlier sum rounds otherwise than one rank's sum of contributions).
    bool touched = false;
  };

  std::vector<int> ranksOf(OpId o, int64_t k) const {
    const OpConfig &c = s_.configs[o];
    std::vector<int> r;
    for (int32_t x = 0; x < c.replicas; ++x)
      r.push_back(static_cast<int>(c.device(k, x)));
    return r;
  }
  /// The current micro-batch's plan and tasks of op `o`.
  const OpPlan &plan(OpId o) const { return plans_[size_t(mb_)][size_t(o)]; }
  std::vector<Task> &tasks(OpId o) { return tasks_[size_t(mb_)][size_t(o)]; }
  const Task *localTask(OpId o, int64_t k) const {
    int t = plan(o).localTask[k];
    return t < 0 ? nullptr : &tasks_[size_t(mb_)][size_t(o)][size_t(t)];
  }
  Task *localTask(OpId o, int64_t k) {
    int t = plan(o).localTask[k];
    return t < 0 ? nullptr : &tasks_[size_t(mb_)][size_t(o)][size_t(t)];
  }

  void assemble(const std::vector<Src> &srcs, const std::vector<Dst> &dsts,
                Combine c) {
    exec::assemble(comm_, srcs, dsts, c);
  }
  void setUp();
  void fillLocal(const Value &v, const Box &box, Buf &out);
  /// Gathers op `o`'s activation input `i` from its producer's tiles.
  void gatherInput(OpId o, size_t i);
  /// The forward pass of `o` for micro-batch mb_; `again`: a
  /// recomputation before its backward (the kept inputs stay).
  void forward(OpId o, bool again = false);
  /// A recomputed op's forward run again (its recomputed producers first).
  void recompute(OpId o);
  void backward(OpId o);
  /// Whether task `t` of Relu `o` runs its backward from its kept mask in
  /// its output gradient's buffer.
  bool reluInPlace(OpId o, const Task &t) const;
  /// Whether every tile of reshape-like `o` holds the same elements in the
  /// same order as its input's box: the buffer passes through, no copy.
  bool aliasesReshape(OpId o) const;
  /// Frees what `o`'s forward leaves that its backward does not read.
  void dropAfterForward(OpId o);
  /// Frees `o`'s outputs that no forward reads and no backward needs.
  void pendingDone(OpId o);
  /// After output `j` of `prod`'s last reader: frees it, or keeps what its
  /// backward reads (a Relu's mask).
  void outputRead(OpId prod, size_t j);
  /// After the last recomputed reader of output `j` of recomputed `prod`:
  /// frees it unless `prod`'s backward reads it (a Relu: as its mask).
  void reread(OpId prod, size_t j);
  /// A Relu's output replaced by its 1-byte mask (what its backward reads).
  void keepReluMask(OpId relu);
  /// Whether output `j` of `prod` is freed once its readers have run.
  bool freedAfterReaders(OpId prod, size_t j) const;
  /// Whether `o`'s input `i` is exactly `prod`'s output `j` tile by tile
  /// (same boxes on the same ranks, no partial sums): a move, not a copy.
  bool sameTiling(OpId o, size_t i, OpId prod, size_t j) const;
  /// After `stage`'s forward of micro-batch mb_: its outputs that later
  /// stages read are sent to them at once (the receivers hold them, as
  /// the simulator's receive buffers; the sender frees them).
  void sendForward(int32_t stage);
  /// One micro-batch's forward, backward or (zb-h1) weight-gradient sums
  /// of the ops of `stage`.
  llvm::Error runItem(int32_t stage, PipePass pass);
  /// Every micro-batch of a step, each stage's work in its schedule's
  /// order, interleaved across stages as their dependencies allow.
  llvm::Error runStep();
  double gatherLoss();
  std::vector<int64_t> gatherPeaks(int64_t mine);

  // ExecutorDump.cpp.
  /// Every weight whole, written by rank 0 to `dir`; rank 0's manifest
  /// (name, file, shape of each). Every rank calls it.
  llvm::Expected<Json> writeWeights(const std::string &dir);
  /// --dump-weights, after the last step.
  llvm::Error dumpWeights();
  /// --dump-forward: which values step 1 keeps copies of (the model's
  /// outputs: what each loss scores, and the other graph outputs).
  void setUpForwardDump();
  /// --dump-forward, before step 1: the directory and the weights step 1
  /// reads; rank 0's manifest of them.
  llvm::Expected<Json> startForwardDump();
  /// After `o`'s forward in step 1: copies of this rank's tiles of the
  /// outputs setUpForwardDump chose.
  void captureOutputs(OpId o);
  /// After step 1: the outputs assembled on rank 0 and written with the
  /// inputs and forward.json. Every rank calls it.
  llvm::Error dumpForward(const Json &weights);
  llvm::Error backendError(OpId o) const {
    std::string e = exec::takeBackendError();
    if (e.empty())
      return llvm::Error::success();
    return internalError("{}: {} backend: {}", g_.where(o), opts_.backend, e);
  }

  // ExecutorWeights.cpp.
  llvm::Error setUpWeights();
  /// Puts every weight input of `o`'s local tasks in place (a lent box,
  /// or, under ZeRO-3, gathered from the group's shards; in the backward
  /// pass, the copy prefetchWeights gathered when there is one).
  void lendWeights(OpId o, bool backwardPass = false);
  /// ZeRO-3's backward prefetch, as FSDP's (and the simulator's,
  /// TaskGraph::addOpMemory): while `o`'s backward runs, the previous
  /// weighted op of its stage (the next to run its backward) has its
  /// weights gathered, held until its backward lends them.
  void prefetchWeights(OpId o);
  /// Takes them back (ZeRO-3: frees the gathered copies).
  void returnWeights(OpId o);
  /// Hands the kernels the gradient accumulators to add into (where they
  /// add: not oneDNN's convolution, which writes its weight gradient).
  void lendGradients(OpId o);
  /// Adds the weight gradients of `o`'s local tasks to the accumulators
  /// and, after the last user of a ZeRO-2/3 weight, reduce-scatters the
  /// micro-batch's gradient.
  void accumulateGradients(OpId o);
  /// Sums every weight's gradient over its group and takes the optimizer
  /// step (ZeRO: on this member's part, then the parts all-gathered).
  void syncWeights();
  void updatePart(float *w, const float *g, float *m, float *v, size_t n);
  /// The optimizer step of `wb`'s `n` elements held at `w` (the weight's
  /// storage from this member's first element) from gradient `g`; bf16:
  /// of the master weight, whose rounding `w` then holds.
  void stepBox(WeightBox &wb, float *w, const float *g, size_t n);
  /// The whole box of `wb` on a member (ZeRO-3: gathered into `tmp`).
  const Buf &wholeWeight(WeightBox &wb, Buf &tmp);
  /// The whole fp32 box of `wb` (bf16: its master, gathered under ZeRO).
  const Buf &wholeMaster(WeightBox &wb, Buf &tmp);

  // bf16: values stored as bf16 are rounded where they are stored.
  /// `o`'s floating outputs on this rank (not a loss's value).
  void roundOutputs(OpId o);
  /// Rounds `n` floats at `p` (nothing under fp32).
  void roundStored(float *p, size_t n) {
    if (bf16_)
      roundBf16(p, n);
  }
  void roundStored(Buf &b) { roundStored(b.data.data(), b.data.size()); }

  /// First: every buffer below is freed while it still counts bf16.
  Bf16Storage storage_;
  const Graph &g_;
  const Strategy &s_;
  Comm &comm_;
  const ExecOptions &opts_;
  int me_;
  bool bf16_; ///< the plan's precision is bf16
  int64_t step_ = 0;
  OpId cur_ = -1;
  int32_t mb_ = 0; ///< the micro-batch being run
  /// Per micro-batch and op (one micro-batch without a pipeline).
  std::vector<std::vector<OpPlan>> plans_;
  std::vector<std::vector<std::vector<Task>>> tasks_;
  std::map<ValueId, int64_t> intRange_; // integer inputs' range
  /// Per micro-batch, op and output: consumer forwards yet to read it.
  std::vector<std::vector<std::vector<int>>> pending_;
  /// Per micro-batch, op and output: recomputed consumers yet to read it
  /// again (recomputation of a recomputed op).
  std::vector<std::vector<std::vector<int>>> rereads_;
  /// Per micro-batch, op and input: received from an earlier stage.
  std::vector<std::vector<std::vector<uint8_t>>> sent_;
  /// Per micro-batch and op: its forward ran again for the backward.
  std::vector<std::vector<uint8_t>> recomputed_;
  std::vector<WeightBox> boxes_;
  /// ZeRO-3 boxes (indices in boxes_) gathered ahead of their backward.
  std::map<size_t, Buf> prefetched_;
  /// Per op: the previous op in id order with weights, or -1.
  std::vector<OpId> prevWeighted_;
  /// Per op, per operand: the index in boxes_ of each tile's weight box
  /// (empty for operands that are not weights).
  std::vector<std::vector<std::vector<size_t>>> boxOf_;
  /// Per weight: its boxes (indices in boxes_), and its last user in
  /// backward order (the lowest op id), after which ZeRO-2/3 reduce.
  std::map<ValueId, std::vector<size_t>> boxesOfWeight_;
  std::map<ValueId, OpId> lastUser_;
  /// Weights whose boxes overlap partially: summed by assembly.
  std::set<ValueId> unclean_;
  /// --dump-forward: the values dumped, and this rank's copies of their
  /// tiles in step 1, by micro-batch, producer, output and tile. Plain
  /// vectors: not counted in the step's peak.
  std::vector<ValueId> forwardOutputs_;
  std::map<std::tuple<int32_t, OpId, size_t, int64_t>, std::vector<float>>
      captured_;
};

} // namespace exec
} // namespace soap

#endif // SOAP_EXEC_RUNNER_H
