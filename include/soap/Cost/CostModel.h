// The cost model: forward and backward kernel times, workspace and memory of
// an op tile on a device type. It answers from the cost database where it has
// the tile's signature, else from an analytic roofline whose sustained
// fractions of peak are fitted to the database's entries of the same kind.
#ifndef SOAP_COST_COSTMODEL_H
#define SOAP_COST_COSTMODEL_H

#include "soap/Cost/CostDatabase.h"
#include "soap/IR/Graph.h"
#include "soap/Machine/DeviceCatalog.h"
#include "llvm/Support/Error.h"
#include <atomic>
#include <map>
#include <optional>
#include <vector>

namespace soap {

/// --cost-model: where kernel times may come from.
enum class CostMode : uint8_t {
  Analytic, ///< the roofline only (calibrated by the database when given)
  Profile,  ///< the database, the roofline where it has no entry
  Strict,   ///< the database only: a missing signature is an error
};
llvm::StringRef costModeName(CostMode m);
std::optional<CostMode> parseCostMode(llvm::StringRef name);

/// --optimizer: the state kept per weight element.
enum class Optimizer : uint8_t { Sgd, Momentum, Adam };
llvm::StringRef optimizerName(Optimizer o);
std::optional<Optimizer> parseOptimizer(llvm::StringRef name);
/// Optimizer state bytes per weight byte: SGD 0, momentum 1, Adam 2.
int optimizerStateFactor(Optimizer o);

/// What one weight element costs the device that holds it: the weight, its
/// gradient, and the optimizer's state — fp32: 4 + 4 + 4 x state; bf16
/// (mixed precision): 2 + 2 + 4 x (1 + state), the fp32 master copy
/// included (16 bytes with Adam, DeepSpeed's figure). A weight with an FP8
/// copy (--precision fp8, Value::fp8Copy) holds 1 byte more as `weight`:
/// 3 + 2 + 4 x (1 + state). `update` is the bytes its optimizer step reads
/// and writes (with an FP8 copy, the step's recast of it counted as the
/// weight's read and write).
struct WeightBytes {
  Bytes weight = 0, gradient = 0, optimizer = 0;
  Bytes update() const { return gradient + 2 * optimizer + 2 * weight; }
};
WeightBytes weightBytes(DType t, Optimizer o, bool fp8Copy = false);
/// The same for the weight `w` (its type and FP8 copy).
WeightBytes weightBytes(const Value &w, Optimizer o);
/// weight + gradient + optimizer of weightBytes.
inline Bytes totalWeightBytes(DType t, Optimizer o, bool fp8Copy = false) {
  WeightBytes w = weightBytes(t, o, fp8Copy);
  return w.weight + w.gradient + w.optimizer;
}
inline Bytes totalWeightBytes(const Value &w, Optimizer o) {
  return totalWeightBytes(w.dtype, o, w.fp8Copy);
}

enum class CostSource : uint8_t { Profile, Analytic };
llvm::StringRef costSourceName(CostSource s);

struct KernelTimes {
  Seconds forward = 0, backwardData = 0, backwardWeight = 0;
  Bytes workspace = 0;
  CostSource source = CostSource::Analytic;
  Seconds backward() const { return backwardData + backwardWeight; }
};

/// Memory a tile holds on its device during an iteration.
struct TileMemory {
  Bytes weights = 0;   ///< the weight shards it reads
  Bytes gradients = 0; ///< their gradients
  Bytes optimizer = 0; ///< optimizer state for them
  Bytes saved = 0;     ///< activations kept for the backward pass
  Bytes workspace = 0; ///< kernel scratch (cuDNN), from the profile
  Bytes total() const {
    return weights + gradients + optimizer + saved + workspace;
  }
};

/// The work figures of `tile` of `op` as the IR counts them, per pass
/// (forward, backward-data, backward-weight): FLOPs and bytes, 0 for the
/// backward-weight pass of an op without weights. What a measured entry
/// records beside its times, so that the roofline can be fitted to it.
void setTileWork(KernelEntry &e, const Graph &g, const Op &op,
                 const Box &tile);

/// (FLOPs or bytes, efficiency) of measured kernel passes, ascending.
using SizedSamples = std::vector<std::pair<double, double>>;

/// Whether an op's backward runs its backward-data kernel, given its
/// backward-weight time: only where some gradient input needs a gradient
/// (Op's sem.backwardDataNeeded), or where one kernel computes the weights'
/// gradients with it (a profiled batch normalisation records both as
/// backward-data, backward-weight 0). Elsewhere backward-data costs 0
/// (CostModel::kernel) and soap-profile --replay does not run it.
bool runsBackwardData(const Op &op, Seconds backwardWeight);
/// MatMul or Gemm: a GEMM kernel.
bool isGemmKind(llvm::StringRef kind);

class CostModel {
public:
  /// `db` may be null (analytic only). With CostMode::Strict it is required.
  CostModel(const DeviceSpec &device, const CostDatabase *db, CostMode mode);

  const DeviceSpec &device() const { return device_; }
  CostMode mode() const { return mode_; }

  /// Kernel times of `tile` of `op`. Strict mode: an error naming the
  /// signature when the database lacks it (exit code 2).
  llvm::Expected<KernelTimes> kernel(const Graph &g, const Op &op,
                                     const Box &tile) const;
  /// The roofline alone: max(FLOPs / sustained FLOP/s, bytes / sustained
  /// bandwidth) + launch overhead, per pass; a pass with no work costs 0.
  KernelTimes analytic(const Graph &g, const Op &op, const Box &tile) const;
  TileMemory memory(const Graph &g, const Op &op, const Box &tile,
                    Optimizer opt) const;

  /// Sustained fraction of peakFlops(t) the roofline uses for `kind` in
  /// element type `t` (fitted to the profile's entries of that type), and
  /// where it came from ("fitted to N entries", "profile default",
  /// "built-in default"). Where the profile measured the GEMM rate of `t`,
  /// the built-in fractions are taken relative to that rate (a GEMM 1).
  double computeEfficiency(llvm::StringRef kind, DType t = DType::F32) const;
  std::string computeEfficiencySource(llvm::StringRef kind,
                                      DType t = DType::F32) const;
  /// Sustained fraction of memoryBandwidth(): fitted to the profile's
  /// bandwidth-bound entries, else the profile's default, else 1 where the
  /// profile measured the bandwidth (the copy kernel's rate is sustained),
  /// else a built-in fraction of the datasheet figure.
  double memoryEfficiency() const { return memEff_; }
  /// The same for `kind` in element type `t`: the median over the profile's
  /// bandwidth-bound entries of that kind and type where it has any (a
  /// kernel that streams its operands at a tenth of the copy rate, such as a
  /// CPU's pooling loop, is not priced at the median of every kind), else
  /// memoryEfficiency().
  double memoryEfficiency(llvm::StringRef kind, DType t = DType::F32) const;
  /// The efficiencies the roofline prices a kernel of `flops` (`bytes`) at:
  /// the median over the (up to 5) measured entries of `kind` nearest in
  /// size on a log scale, where the profile has entries of that kind; else
  /// the kind's fraction above.
  double computeEfficiency(llvm::StringRef kind, DType t, double flops) const;
  double memoryEfficiency(llvm::StringRef kind, DType t, double bytes) const;
  /// Peak FLOP/s for a dtype on this device (measured GEMM rate when the
  /// profile has it).
  double peakFlops(DType t) const;
  double memoryBandwidth() const;
  /// The device's dense FP8 over bf16 tensor-core peak (2 on Hopper; 1
  /// where it has no FP8): an FP8 GEMM (Op::fp8) takes its bf16 time,
  /// measured or fitted, divided by it, no profile having measured FP8
  /// GEMMs yet.
  double fp8Speedup() const;
  /// Transformer Engine's per-tensor scaling work around an FP8 GEMM tile,
  /// per pass (zero for another op): the casts to FP8 it does not fuse
  /// into a neighbouring kernel, each bandwidth-bound plus a launch, with
  /// the amax history update. Forward: the activation input cast with its
  /// transposed copy (read 2, write 1 + 1 bytes an element) unless a norm
  /// or activation kernel writes it in FP8 (TE's LayerNormLinear,
  /// LayerNormMLP), where only the transpose the weight gradient needs
  /// remains (read 1, write 1), in backward-weight. Backward-data: the
  /// output gradient cast to E5M2 with its transpose (read 2, write 2)
  /// unless the output feeds an activation whose backward writes it so.
  /// The amaxes are reduced inside these kernels; the delayed-scaling
  /// update reads and writes each scaled tensor's fp32 amax history
  /// (kFp8AmaxHistory entries) per pass. Weights are cast once a step,
  /// by the optimizer step (weightBytes).
  KernelTimes fp8Scaling(const Graph &g, const Op &op, const Box &tile) const;

  uint64_t hits() const { return hits_; }
  uint64_t misses() const { return misses_; }

private:
  void fit();
  /// "kind|dtype": the key of fitted_ and computeBySize_.
  static std::string fitKey(llvm::StringRef kind, DType t);
  const DeviceSpec &device_;
  const CostDatabase *db_;
  CostMode mode_;
  double memEff_;
  std::map<std::string, std::pair<double, int>> fitted_; // fitKey -> (eff, n)
  std::map<std::string, double> memFitted_; // fitKey -> bandwidth fraction
  /// fitKey -> (FLOPs or bytes, efficiency) of each measured pass, by size;
  /// fitted_ and memFitted_ are their medians.
  std::map<std::string, SizedSamples> computeBySize_, memoryBySize_;
  mutable std::atomic<uint64_t> hits_{0}, misses_{0};
};

} // namespace soap

#endif // SOAP_COST_COSTMODEL_H
