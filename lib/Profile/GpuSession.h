// Measuring op tiles on one CUDA GPU: cuBLAS for GEMM and (batched) MatMul,
// cuDNN for convolution, pooling and batch normalisation, soap-profile's own
// streaming kernel for the rest; warm-up, then the median of repeats timed
// with CUDA events, each run queued behind a kernel that holds the stream
// until the host has enqueued all of it (so the time is the GPU's, not the
// host's calls into the libraries). Built only with CUDA (SOAP_HAVE_CUDA).
#ifndef SOAP_PROFILE_GPUSESSION_H
#define SOAP_PROFILE_GPUSESSION_H

#include "soap/Cost/CostDatabase.h"
#include "soap/IR/Graph.h"
#include "llvm/ADT/STLFunctionalExtras.h"
#include "llvm/Support/Error.h"
#include <map>
#include <memory>
#include <string>

namespace soap {

struct MeasureOptions {
  int warmup = 5;
  int repeats = 25;
  /// Let cuBLAS and cuDNN use TF32 tensor cores for f32 (recorded in the
  /// profile as device.math).
  bool tf32 = false;
  /// Evict the L2 cache before every timed run (cold inputs) instead of
  /// timing repeated runs over the same buffers.
  bool flushL2 = false;
  /// Choose convolution algorithms by timing them all (cudnnFind...)
  /// rather than by cuDNN's heuristics.
  bool findAlgorithms = false;
};

/// A pass's median times: the GPU's (events around the run) and the host's
/// to enqueue it (while the GPU is held).
struct PassTime {
  Seconds gpu = 0, launch = 0;
};

/// The kernels of one op tile with their buffers allocated and filled.
class TileBench {
public:
  virtual ~TileBench();
  /// Whether pass `p` launches anything (a pass with no work does not).
  virtual bool has(Pass p) const = 0;
  /// Enqueues pass `p` on the session's stream.
  virtual llvm::Error run(Pass p) = 0;
  /// How it is measured ("cudnn", "cublas", "stream").
  virtual const char *method() const = 0;
  Bytes workspace = 0;
};

class GpuSession {
public:
  /// Opens CUDA device `ordinal`, cuBLAS and cuDNN. Errors (exit code 2)
  /// when no CUDA device can be used, with the runtime's reason.
  static llvm::Expected<std::unique_ptr<GpuSession>>
  open(int ordinal, const MeasureOptions &opts);
  ~GpuSession();

  /// Device name, driver, CUDA, cuDNN and cuBLAS versions.
  ProfileEnvironment environment(const std::string &catalogName) const;
  const std::string &gpuName() const;
  const MeasureOptions &options() const { return opts_; }

  /// Builds the kernels of `tile` of `op`. Errors when the GPU runs out of
  /// memory or a library refuses the shapes.
  llvm::Expected<std::unique_ptr<TileBench>>
  prepare(const Graph &g, const Op &op, const Box &tile,
          const std::string &signature);
  /// The median times of pass `p` over the repeats, after the warm-up.
  llvm::Expected<PassTime> time(TileBench &b, Pass p);
  /// Enqueues the given passes back to back, untimed.
  llvm::Error enqueue(TileBench &b, const Pass *passes, int numPasses);
  /// One timed run of the given passes back to back (for replays), held.
  llvm::Expected<Seconds> timeOnce(TileBench &b, const Pass *passes,
                                   int numPasses);
  /// One timed run of whatever `enqueue` queues, without holding the
  /// stream: the GPU's time plus the gaps where it waits for the host to
  /// enqueue (a replayed device's whole task sequence).
  llvm::Expected<Seconds>
  timeSequence(llvm::function_ref<llvm::Error()> enqueue);
  /// A measured cost-database entry: the three passes plus the IR's FLOP
  /// and byte counts of the tile.
  /// `method` (optional) receives how it was measured.
  llvm::Expected<KernelEntry> measure(const Graph &g, const Op &op,
                                      const Box &tile,
                                      const std::string &signature,
                                      std::string *method = nullptr);

  /// Device memory bandwidth (bytes read + written per second) of the
  /// streaming kernel copying 1 GiB.
  llvm::Expected<double> measureBandwidth();
  /// Achieved cuBLAS GEMM FLOP/s at m = n = k = `size` by element type
  /// ("f32", "f16", "bf16").
  llvm::Expected<std::map<std::string, double>> measureGemmRates(int64_t size);

  struct Impl;

private:
  GpuSession() = default;
  std::unique_ptr<Impl> impl_;
  MeasureOptions opts_;
};

} // namespace soap

#endif // SOAP_PROFILE_GPUSESSION_H
