// The GPU catalog: peak dense throughput per data type, memory bandwidth and
// capacity, and kernel launch overhead of the devices topology files can name.
// Every figure comes from the vendor document named in `source`.
#ifndef SOAP_MACHINE_DEVICECATALOG_H
#define SOAP_MACHINE_DEVICECATALOG_H

#include "soap/Machine/Units.h"
#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"
#include <string>

namespace soap {

/// Arithmetic formats the catalog gives peaks for.
enum class PeakFormat : uint8_t {
  FP64, ///< double precision (FP64 tensor cores where the GPU has them)
  FP32, ///< single precision on the CUDA cores (no tensor cores)
  TF32, ///< TF32 tensor cores; GPUs without them run FP32 at the FP32 rate
  FP16, ///< FP16/BF16 (tensor cores where present); BF16 needs Ampere or later
  FP8,  ///< FP8 (E4M3/E5M2) tensor cores, Hopper or later; 0 elsewhere
};

/// One GPU model. Peaks are dense (no structured sparsity) and at boost clock.
struct DeviceSpec {
  llvm::StringRef name;     ///< the name topology files use: "H100-SXM"
  llvm::StringRef fullName; ///< "NVIDIA H100 SXM5 80 GB"
  double fp64FlopsPerSec;
  double fp32FlopsPerSec;
  double tf32FlopsPerSec;
  double fp16FlopsPerSec;
  bool tensorCores;
  double memoryBandwidthBytesPerSec;
  /// The datasheet's capacity read as GiB; the usable amount is a little
  /// smaller (ECC, driver reserve); topology files may override it.
  Bytes memoryBytes;
  /// Host-side cost of one kernel launch: an assumed typical value, not a
  /// datasheet figure (see `launchSource`).
  Seconds launchOverhead;
  llvm::StringRef source;       ///< the document the figures come from
  llvm::StringRef launchSource; ///< the basis of the launch overhead
  /// Data moves through the compute units themselves: a CPU core copies
  /// an MPI message (shared memory) or a collective's share, and runs no
  /// kernel meanwhile; a GPU's copy engines and NICs move data beside its
  /// kernels. The simulator makes a transfer or collective occupy the
  /// devices at its ends (or in its group) as well as its links.
  bool commOccupiesCompute = false;
  /// NCCL's collectives run as kernels on the GPU's own SMs, so a kernel
  /// that runs beside a collective of its GPU runs slower: the GPU loses
  /// this fraction of the collective's time to it (the simulator occupies
  /// the GPU for that long when the collective starts). Within a node
  /// (NVLink, NVSwitch, PCIe) and across the network; 0 where no published
  /// figure is known. Point-to-point sends take none: NCCL gives them a
  /// channel or two, and the source of these figures (Calculon) charges
  /// them none either.
  double ncclComputeShareIntra = 0, ncclComputeShareInter = 0;
  /// Sustained over burst throughput of tensor-core kernels: a GEMM,
  /// convolution or attention kernel timed alone for a few milliseconds
  /// (soap-profile's measurements, published kernel benchmarks) runs at a
  /// higher clock than the same kernel in a training step that keeps the
  /// GPU at its power limit for seconds with training data's operands. The
  /// cost model scales such measured rates by it (1: none known).
  double sustainedTensorRatio = 1;
  /// Dense FP8 tensor-core peak (E4M3 or E5M2 operands); 0 on a GPU without
  /// FP8 tensor cores, which cannot run --precision fp8.
  double fp8FlopsPerSec = 0;

  double peakFlopsPerSec(PeakFormat f) const;
};

/// Every catalog entry, oldest GPU first.
llvm::ArrayRef<DeviceSpec> deviceCatalog();
/// The entry named `name` (exact match), or nullptr.
const DeviceSpec *findDevice(llvm::StringRef name);
/// "K80, P100-SXM2, ..." for error messages.
std::string knownDeviceNames();

} // namespace soap

#endif // SOAP_MACHINE_DEVICECATALOG_H
