// The reference executor (DESIGN.md, "The reference executor"): runs SGD
// training steps of a graph under a strategy, one rank per device, so that a
// plan on N ranks can be checked against the same plan's model on one.
//
// Every rank walks the whole graph in the same order. It computes the tiles
// its device holds in GLOBAL coordinates (a tile reads the regions its
// semantics give, halos included, as dense boxes), and moves data with one
// primitive, `assemble`: a destination box receives the sum (or max) of the
// source boxes that intersect it, summed in source order. Forward values,
// partial sums of split reduction dims, gradients of activations, weight
// gradients (every holder of a weight element gets the sum over every tile
// that read it) and statistics of split normalisations all go through it.
// Weights, inputs, labels and dropout masks are functions of the seed and
// the global element index, so any partition draws the same numbers.
#ifndef SOAP_EXEC_EXECUTOR_H
#define SOAP_EXEC_EXECUTOR_H

#include "soap/Exec/Comm.h"
#include "soap/IR/Graph.h"
#include "soap/Parallel/Strategy.h"
#include "llvm/Support/Error.h"
#include <cstdint>
#include <string>
#include <vector>

namespace soap {

struct ExecOptions {
  int64_t steps = 3;
  uint64_t seed = 0;
  double learningRate = 0.1;
  /// The optimizer the plan was made for: "sgd", "momentum" (0.9) or
  /// "adam" (0.9, 0.999, 1e-8, bias-corrected); its state is held per
  /// weight element, sharded under ZeRO.
  std::string optimizer = "sgd";
  /// The plan's precision: "fp32", or "bf16" (CPU backend): mixed
  /// precision as Megatron-LM and DeepSpeed train, and as the simulator
  /// counts it — activations, their gradients, the weights the kernels
  /// read and the weight gradients rounded to bf16 where they are stored
  /// (kernels accumulate in fp32), fp32 master weights and optimizer state.
  std::string precision = "fp32";
  /// When set, rank 0 writes every final (master) weight here (DIR/<name>.f32, raw
  /// little-endian float32, and DIR/weights.json listing name, file, shape).
  std::string dumpWeightsDir;
  /// When set, rank 0 writes step 1's forward here: every graph input as
  /// drawn (the loss's labels too), every weight as step 1 reads it, and
  /// the model's outputs (what each loss scores, and any other graph
  /// output) as step 1 computed them, assembled from every tile
  /// (DIR/<id>-<name>.f32, raw little-endian float32, integers as their
  /// values; DIR/forward.json lists inputs with their dtype, weights and
  /// outputs, each with name, file and shape).
  std::string dumpForwardDir;
  /// Kernel backend: "cpu", or "cuda" (contractions and element-wise ops on
  /// the rank's GPU, the other ops on the CPU) when built with CUDA.
  std::string backend = "cpu";
  /// Threads of each rank's CPU kernels; 0: the cores this process may run
  /// on divided by the ranks on its machine, at least 1.
  int threads = 0;

  llvm::Error validate() const;
};

struct StepResult {
  double loss = 0;    ///< the sum of the graph's losses (valid on rank 0)
  double seconds = 0; ///< wall time of the step on rank 0
  /// Per rank, the most bytes of tensor storage (weights, gradients,
  /// optimizer state, activations, transfer buffers) it held during the
  /// step (valid on rank 0).
  std::vector<int64_t> peakBytes;
};

/// The kernel backends built in: "cpu", and "cuda" with CUDA.
std::vector<std::string> builtKernelBackends();

/// The CPU kernel threads of this rank under `opts` (see threads).
int kernelThreads(const ExecOptions &opts, const Comm &comm);

/// Readies the kernel backend on this rank (CPU kernel threads set) (the CUDA
/// backend picks the GPU numbered rank % device count); errors (exit code 2)
/// without a GPU. runTraining calls it too.
llvm::Error prepareBackend(const ExecOptions &opts, const Comm &comm);

/// Whether the executor can run every op of `g` (an error names the first
/// op it cannot: an unsupported kind, attribute or operand).
llvm::Error checkExecutable(const Graph &g);

/// Runs opts.steps training steps of `g` under `s` (verified, with
/// comm.size() devices). Every rank calls it; results are valid on rank 0.
llvm::Expected<std::vector<StepResult>> runTraining(const Graph &g,
                                                    const Strategy &s,
                                                    Comm &comm,
                                                    const ExecOptions &opts);

} // namespace soap

#endif // SOAP_EXEC_EXECUTOR_H
