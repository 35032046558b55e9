// The GPU catalog. Figures are NVIDIA's published peaks, dense (the "with
// sparsity" figures of Ampere and Hopper datasheets are halved), at boost
// clock; each entry names the document it comes from.
#include "soap/Machine/DeviceCatalog.h"

namespace soap {

double DeviceSpec::peakFlopsPerSec(PeakFormat f) const {
  switch (f) {
  case PeakFormat::FP64:
    return fp64FlopsPerSec;
  case PeakFormat::FP32:
    return fp32FlopsPerSec;
  case PeakFormat::TF32:
    return tf32FlopsPerSec;
  case PeakFormat::FP16:
    return fp16FlopsPerSec;
  case PeakFormat::FP8:
    return fp8FlopsPerSec;
  }
  return fp32FlopsPerSec;
}

static constexpr double T = 1e12; // TFLOP/s
static constexpr double GBps = 1e9;
static constexpr Bytes GiB = Bytes(1) << 30;

// Launch overhead is not in any datasheet. Published measurements of the
// host-side cost of launching a small kernel are a few microseconds (e.g. the
// NVIDIA developer blog "Getting Started with CUDA Graphs", 2019); we take the
// upper end for Kepler and Pascal, whose drivers and hosts were slower.
static constexpr llvm::StringLiteral kLaunchOld =
    "assumed typical value (~5 us on Kepler/Pascal-era systems); published "
    "small-kernel launch overheads are a few microseconds";
static constexpr llvm::StringLiteral kLaunchVolta =
    "assumed typical value (~4 us on Volta-era systems); published "
    "small-kernel launch overheads are a few microseconds";
static constexpr llvm::StringLiteral kLaunchNew =
    "assumed typical value (~3 us on Ampere/Hopper-era systems); published "
    "small-kernel launch overheads are a few microseconds";

// The fraction of an A100's or H100's time a concurrent NCCL collective
// takes from its kernels: Calculon (Isaev et al., SC23; its
// systems/a100_80g.json and systems/h100_80g_nvl8.json), `processor_usage`
// 0.15 on the NVLink network and 0.02 on InfiniBand. Not fitted here.
static constexpr double kNcclShareNvlink = 0.15, kNcclShareNetwork = 0.02;
// Hopper's sustained over burst tensor-core throughput (see
// DeviceSpec::sustainedTensorRatio). Fitted, the one constant fitted to a
// Hopper training run: bench/published.py's calibration row nemo-175b-128
// (NeMo GPT-3 175B on 128 H100, 8.91 s, its tensor-parallel communication
// overlapped with the GEMMs), with every other NeMo row held out (8.918 s
// predicted at 0.69, 8.688 s at 0.71: two digits are what one row
// supports). The profile's GEMMs run on operands in
// [0.5, 1.5) for 25 repeats
// of a few milliseconds; a training step's GEMMs take normally distributed
// operands at the 700 W power limit, which lowers the SM clock (Horace He,
// "Strangely, Matrix Multiplications on GPUs Run Faster When Given
// 'Predictable' Data", 2024: 15% on an A100 from the data alone).
// soap-profile can measure it on a lent H100 (randn operands, seconds
// long), which would replace this fit.
static constexpr double kHopperSustained = 0.69;

static const DeviceSpec kCatalog[] = {
    // NVIDIA Tesla K80 datasheet: per board (two GK210 dies) 8.73 TFLOP/s
    // FP32 and 2.91 TFLOP/s FP64 with GPU Boost, 24 GB GDDR5, 480 GB/s. CUDA
    // shows each die as one device, so an entry is one die: half of each.
    // Kepler has no FP16 arithmetic and no tensor cores: TF32 and FP16 run at
    // the FP32 rate.
    {"K80", "NVIDIA Tesla K80, one GK210 die (half a board)", 1.455 * T,
     4.365 * T, 4.365 * T, 4.365 * T, false, 240 * GBps, 12 * GiB, 5e-6,
     "NVIDIA Tesla K80 datasheet (board figures halved per GK210 die)",
     kLaunchOld},
    // NVIDIA Tesla P100 datasheet and Pascal GP100 whitepaper, SXM2 (NVLink)
    // variant: 5.3 FP64, 10.6 FP32, 21.2 FP16 TFLOP/s; 16 GB HBM2 at 732 GB/s.
    // No tensor cores; no TF32 (FP32 rate); no BF16.
    {"P100-SXM2", "NVIDIA Tesla P100 SXM2 16 GB", 5.3 * T, 10.6 * T, 10.6 * T,
     21.2 * T, false, 732 * GBps, 16 * GiB, 5e-6,
     "NVIDIA Tesla P100 whitepaper / datasheet (SXM2)", kLaunchOld},
    // NVIDIA Tesla V100 datasheet, SXM2: 7.8 FP64, 15.7 FP32, 125 tensor
    // (FP16 in, FP32 accumulate) TFLOP/s; 16 GB HBM2 at 900 GB/s. No TF32.
    {"V100-SXM2-16GB", "NVIDIA Tesla V100 SXM2 16 GB", 7.8 * T, 15.7 * T,
     15.7 * T, 125 * T, true, 900 * GBps, 16 * GiB, 4e-6,
     "NVIDIA Tesla V100 datasheet (SXM2)", kLaunchVolta},
    // NVIDIA A100 Tensor Core GPU datasheet, SXM4: FP64 tensor core 19.5
    // (9.7 without), FP32 19.5, TF32 156 dense (312 sparse), FP16/BF16 312
    // dense (624 sparse) TFLOP/s; 40 GB HBM2 at 1,555 GB/s.
    {"A100-SXM4-40GB", "NVIDIA A100 SXM4 40 GB", 19.5 * T, 19.5 * T, 156 * T,
     312 * T, true, 1555 * GBps, 40 * GiB, 3e-6,
     "NVIDIA A100 Tensor Core GPU datasheet (SXM4 40GB)", kLaunchNew, false,
     kNcclShareNvlink, kNcclShareNetwork},
    // The same datasheet, 80 GB HBM2e at 2,039 GB/s; same compute.
    {"A100-SXM4-80GB", "NVIDIA A100 SXM4 80 GB", 19.5 * T, 19.5 * T, 156 * T,
     312 * T, true, 2039 * GBps, 80 * GiB, 3e-6,
     "NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB)", kLaunchNew, false,
     kNcclShareNvlink, kNcclShareNetwork},
    // NVIDIA H100 Tensor Core GPU datasheet, SXM5: FP64 tensor core 67 (34
    // without), FP32 67, TF32 989, FP16/BF16 1,979 and FP8 3,958 TFLOP/s
    // with sparsity, i.e. 494.5, 989.5 and 1,979 dense; 80 GB HBM3 at
    // 3.35 TB/s.
    {"H100-SXM", "NVIDIA H100 SXM5 80 GB", 67 * T, 67 * T, 494.5 * T, 989.5 * T,
     true, 3350 * GBps, 80 * GiB, 3e-6,
     "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM5)", kLaunchNew, false,
     kNcclShareNvlink, kNcclShareNetwork, kHopperSustained, 1979 * T},
    // NVIDIA H200 Tensor Core GPU datasheet, SXM: the H100's compute (FP64
    // tensor core 67, FP32 67, TF32 989, FP16/BF16 1,979 and FP8 3,958
    // sparse) with 141 GB HBM3e at 4.8 TB/s.
    {"H200-SXM", "NVIDIA H200 SXM 141 GB", 67 * T, 67 * T, 494.5 * T, 989.5 * T,
     true, 4800 * GBps, 141 * GiB, 3e-6,
     "NVIDIA H200 Tensor Core GPU datasheet (H200 SXM)", kLaunchNew, false,
     kNcclShareNvlink, kNcclShareNetwork, kHopperSustained, 1979 * T},
    // One core of the 2-core development host (an Intel Xeon guest under
    // KVM whose CPUID hides the model name; family 6 model 167 at 2.6 GHz and
    // model 207 at 2.3 GHz have been seen, both with AVX-512 and FMA) as
    // soap-run uses it: one MPI rank per device, with its share of the cores
    // (one each on two ranks) and of the host's 23.5 GiB of RAM. Peaks from
    // the ISA at 2.6 GHz: two 512-bit FMA ports, 2 x 16 x 2 = 64 f32 FLOP
    // per cycle (32 f64; AVX512-FP16 packs twice as many halves; no TF32).
    // Memory bandwidth: one rank's copy (bytes read + written) while the
    // other copies too, as soap-profile --backend cpu measures it (22-24
    // GB/s on model 207). The launch overhead is an assumed cost per task
    // outside its kernels; a profile's entries include what soap-run does
    // around a kernel (allocating and zeroing its outputs). MPI messages
    // are copied by the cores: communication occupies them.
    {"XEON-AVX512-CORE",
     "Intel Xeon (KVM, AVX-512), one core as one soap-run rank", 83.2e9,
     166.4e9, 166.4e9, 332.8e9, false, 22 * GBps, 11 * GiB, 2e-6,
     "ISA peaks at 2.6 GHz; bandwidth measured by soap-profile --backend "
     "cpu on 2 ranks",
     "assumed: soap-run's per-task cost outside its kernels", true},
};

llvm::ArrayRef<DeviceSpec> deviceCatalog() { return kCatalog; }

const DeviceSpec *findDevice(llvm::StringRef name) {
  for (const DeviceSpec &d : kCatalog)
    if (d.name == name)
      return &d;
  return nullptr;
}

std::string knownDeviceNames() {
  std::string out;
  for (const DeviceSpec &d : kCatalog) {
    if (!out.empty())
      out += ", ";
    out += d.name.str();
  }
  return out;
}

} // namespace soap
