// The cost model: database lookups, the roofline fallback and its fitting
// (DESIGN.md, "Cost model"), and the memory of a tile.
#include "soap/Cost/CostModel.h"

#include "soap/Cost/OpSignature.h"
#include "soap/Support/Error.h"
#include "soap/Support/Statistics.h"
#include <algorithm>
#include <array>
#include <cmath>

namespace soap {

llvm::StringRef costModeName(CostMode m) {
  static const char *names[] = {"analytic", "profile", "strict"};
  return names[static_cast<int>(m)];
}

std::optional<CostMode> parseCostMode(llvm::StringRef name) {
  for (CostMode m : {CostMode::Analytic, CostMode::Profile, CostMode::Strict})
    if (name == costModeName(m))
      return m;
  return std::nullopt;
}

llvm::StringRef optimizerName(Optimizer o) {
  static const char *names[] = {"sgd", "momentum", "adam"};
  return names[static_cast<int>(o)];
}

std::optional<Optimizer> parseOptimizer(llvm::StringRef name) {
  for (Optimizer o : {Optimizer::Sgd, Optimizer::Momentum, Optimizer::Adam})
    if (name == optimizerName(o))
      return o;
  return std::nullopt;
}

WeightBytes weightBytes(DType t, Optimizer o, bool fp8Copy) {
  Bytes eb = dtypeBytes(t);
  Bytes state = optimizerStateFactor(o);
  Bytes copy = fp8Copy ? 1 : 0;
  if (t == DType::BF16 || t == DType::F16)
    return {eb + copy, eb, 4 * (1 + state)};
  return {eb + copy, eb, eb * state};
}

WeightBytes weightBytes(const Value &w, Optimizer o) {
  return weightBytes(w.dtype, o, w.fp8Copy);
}

int optimizerStateFactor(Optimizer o) {
  switch (o) {
  case Optimizer::Sgd:
    return 0;
  case Optimizer::Momentum:
    return 1;
  case Optimizer::Adam:
    return 2;
  }
  return 0;
}

llvm::StringRef costSourceName(CostSource s) {
  return s == CostSource::Profile ? "profile" : "analytic";
}

namespace {

/// Sustained fractions of peak used when nothing better is known: dense
/// contractions reach a large part of peak with cuBLAS/cuDNN; everything
/// else is bandwidth-bound, so its compute fraction hardly matters.
double builtinComputeEfficiency(llvm::StringRef kind) {
  if (kind == "MatMul" || kind == "Gemm")
    return 0.7;
  if (kind == "Conv")
    return 0.6;
  if (kind == "LSTM" || kind == "LSTMCell")
    return 0.5;
  return 0.3;
}
constexpr double kBuiltinMemoryEfficiency = 0.7;

/// The rate of fused attention's `pass` (bf16/fp16, head dim 128, causal,
/// FLOPs of the executed blocks) on kernels of `seq` queries and keys where
/// soap-profile has not measured it, from published throughput; 0 where
/// none is known (the roofline's fraction applies).
/// A100: FlashAttention-2 (Dao 2023, Fig. 4-6: 50-73% of peak forward,
/// about 55% forward + backward): 0.55 x 312 TFLOP/s at any length.
/// H100 and H200 (the same SMs): FlashAttention-3 (Shah et al. 2024, cuDNN
/// within a few % of it), about 525 TFLOP/s forward and 425 backward at
/// sequence 2k, scaled along the paper's curves over the sequence: a short
/// kernel spends more of its time loading Q and writing O and, causal, on
/// diagonal blocks (Fig. 5e, causal forward, head dim 128: 292, 423, 521,
/// 579, 602, 616 TFLOP/s at 512 .. 16k; Fig. 6, backward, head dim 128:
/// 316, 424, 501, 542, 559, 561), interpolated in log2(seq) and held flat
/// past either end.
double publishedAttentionFlops(llvm::StringRef device, DType t, Pass pass,
                               int64_t seq) {
  if (t != DType::BF16 && t != DType::F16)
    return 0;
  if (device.startswith("A100"))
    return 0.55 * 312e12;
  if (!device.startswith("H100") && !device.startswith("H200"))
    return 0;
  static constexpr double kForward[] = {292, 423, 521, 579, 602, 616};
  static constexpr double kBackward[] = {316, 424, 501, 542, 559, 561};
  constexpr int kAt2k = 2; // 512 x 2^i
  bool fwd = pass == Pass::Forward;
  const double *curve = fwd ? kForward : kBackward;
  double x = std::log2(double(std::max<int64_t>(seq, 1)) / 512);
  x = std::clamp(x, 0.0, 5.0);
  int i = std::min(int(x), 4);
  double rel = (curve[i] + (curve[i + 1] - curve[i]) * (x - i)) / curve[kAt2k];
  return (fwd ? 525e12 : 425e12) * rel;
}
/// The sequence a fused attention kernel runs over: the shorter of its
/// tile's query and key extents (a ring-attention step is one query block
/// against one key block). 0 when the op has no such loops.
int64_t kernelSequence(const Op &op, const Box &tile) {
  int64_t q = 0, k = 0;
  for (size_t l = 0; l < op.sem.loops.size(); ++l) {
    if (op.sem.loops[l].name == "q")
      q = tile.hi[l] - tile.lo[l];
    else if (op.sem.loops[l].name == "k")
      k = tile.hi[l] - tile.lo[l];
  }
  return std::min(q, k);
}
/// The built-in fraction a GEMM reaches: measured GEMM rates stand for it.
constexpr double kBuiltinGemmEfficiency = 0.7;

DType opDType(const Graph &g, const Op &op) {
  for (ValueId v : op.outputs)
    if (v != kNoValue && isFloating(g.value(v).dtype))
      return g.value(v).dtype;
  return DType::F32;
}

const char *dtypeKey(DType t) {
  switch (t) {
  case DType::F16:
    return "f16";
  case DType::BF16:
    return "bf16";
  case DType::F64:
    return "f64";
  default:
    return "f32";
  }
}

/// The element types of `op`'s operands; with `fp8`, an FP8 GEMM's two
/// operands read as 1 byte.
void operandTypes(const Graph &g, const Op &op, std::vector<DType> &in,
                  std::vector<DType> &out, bool fp8 = true) {
  for (ValueId v : op.inputs)
    in.push_back(v == kNoValue ? DType::F32 : g.value(v).dtype);
  for (ValueId v : op.outputs)
    out.push_back(v == kNoValue ? DType::F32 : g.value(v).dtype);
  // An FP8 GEMM reads its two operands in FP8 (1 byte: U8 stands for it
  // in the byte counts) and writes bf16.
  if (fp8 && op.fp8)
    for (size_t i = 0; i < 2 && i < in.size(); ++i)
      in[i] = DType::U8;
}

/// The op `v` comes from, looking through layout ops; null for a graph
/// input or weight.
const Op *producerThroughLayout(const Graph &g, ValueId v) {
  while (v != kNoValue && g.value(v).producer >= 0) {
    const Op &p = g.op(g.value(v).producer);
    if (!isLayoutKind(p.kind))
      return &p;
    v = p.input(0);
  }
  return nullptr;
}

/// An activation function, alone or in a fused element-wise chain (its
/// member kinds): the kernels Transformer Engine's LayerNormMLP fuses the
/// FP8 cast into, forward and backward.
bool activationKernel(const Op &op) {
  static const char *const kinds[] = {"Gelu",      "Relu", "Sigmoid",
                                      "Tanh",      "Erf",  "Softplus",
                                      "HardSwish", "Mish", "Elu"};
  std::string members =
      op.kind == "FusedElementwise" ? op.getString("kinds", "") : op.kind;
  llvm::SmallVector<llvm::StringRef, 8> parts;
  llvm::StringRef(members).split(parts, ',');
  for (llvm::StringRef p : parts)
    for (const char *k : kinds)
      if (p == k)
        return true;
  return false;
}

} // namespace

void setTileWork(KernelEntry &e, const Graph &g, const Op &op,
                 const Box &tile) {
  std::vector<DType> inT, outT;
  // What soap-profile measures is the bf16 kernel (it has no FP8 ones).
  operandTypes(g, op, inT, outT, false);
  for (int p = 0; p < 3; ++p) {
    Pass pass = static_cast<Pass>(p);
    bool none = pass == Pass::BackwardWeight && op.sem.weightInputs.empty();
    e.flops[p] = none ? 0 : op.sem.tileFlops(pass, tile);
    e.bytes[p] = none ? 0 : double(op.sem.tileBytes(pass, tile, inT, outT));
  }
}

CostModel::CostModel(const DeviceSpec &device, const CostDatabase *db,
                     CostMode mode)
    : device_(device), db_(db), mode_(mode), memEff_(kBuiltinMemoryEfficiency) {
  if (db_ && db_->memoryEfficiency > 0)
    memEff_ = db_->memoryEfficiency;
  else if (db_ && db_->memoryBandwidthBytesPerSec > 0)
    memEff_ = 1.0;
  fit();
}

double CostModel::peakFlops(DType t) const {
  if (db_) {
    auto it = db_->gemmFlopsPerSec.find(dtypeKey(t));
    if (it != db_->gemmFlopsPerSec.end())
      return it->second;
  }
  switch (t) {
  case DType::F16:
  case DType::BF16:
    return device_.peakFlopsPerSec(PeakFormat::FP16);
  case DType::F64:
    return device_.peakFlopsPerSec(PeakFormat::FP64);
  default:
    return device_.peakFlopsPerSec(PeakFormat::FP32);
  }
}

double CostModel::memoryBandwidth() const {
  if (db_ && db_->memoryBandwidthBytesPerSec > 0)
    return db_->memoryBandwidthBytesPerSec;
  return device_.memoryBandwidthBytesPerSec;
}

double CostModel::fp8Speedup() const {
  double bf16 = device_.peakFlopsPerSec(PeakFormat::FP16),
         fp8 = device_.peakFlopsPerSec(PeakFormat::FP8);
  return fp8 > 0 && bf16 > 0 ? fp8 / bf16 : 1;
}

KernelTimes CostModel::fp8Scaling(const Graph &g, const Op &op,
                                  const Box &tile) const {
  KernelTimes k;
  if (!op.fp8)
    return k;
  int x = -1;
  for (int i = 0; i < 2 && i < int(op.inputs.size()); ++i)
    if (op.inputs[size_t(i)] != kNoValue &&
        g.value(op.inputs[size_t(i)]).kind != ValueKind::Weight)
      x = i;
  double bw = memoryBandwidth() * memoryEfficiency();
  Seconds launch = device_.launchOverhead;
  // Each scaled tensor's fp32 amax history, read and written per pass.
  double history = double(kFp8AmaxHistory) * 4 * 2;
  if (x >= 0) {
    double n = double(op.sem.inputRegion(x, tile).volume());
    const Op *from = producerThroughLayout(g, op.inputs[size_t(x)]);
    bool fused =
        from && (llvm::StringRef(from->kind).endswith("Normalization") ||
                 activationKernel(*from));
    // The input's and the weight's histories.
    if (fused) {
      k.forward = 2 * history / bw;
      k.backwardWeight = 2 * n / bw + launch;
    } else {
      k.forward = (4 * n + 2 * history) / bw + launch;
    }
  }
  ValueId y = op.output(0);
  if (y != kNoValue) {
    double n = double(op.sem.outputRegion(0, tile).volume());
    // Fused when every reader (through layout ops) is an activation.
    bool fused = !g.value(y).users.empty();
    std::vector<ValueId> work{y};
    while (!work.empty() && fused) {
      ValueId v = work.back();
      work.pop_back();
      for (OpId u : g.value(v).users) {
        const Op &user = g.op(u);
        if (isLayoutKind(user.kind))
          work.insert(work.end(), user.outputs.begin(), user.outputs.end());
        else
          fused = fused && activationKernel(user);
      }
    }
    k.backwardData = fused ? history / bw : (4 * n + history) / bw + launch;
  }
  return k;
}

std::string CostModel::fitKey(llvm::StringRef kind, DType t) {
  return kind.str() + "|" + dtypeKey(t);
}

bool isGemmKind(llvm::StringRef kind) {
  return kind == "MatMul" || kind == "Gemm";
}

namespace {

/// Tensor-core GEMMs need every operand's leading dimension a multiple of
/// 16 bytes (8 bf16 elements); cuBLAS runs others on slower kernels (the
/// H100 profile: the 50,257-column LM heads at 100-155 TFLOP/s, aligned
/// MatMuls at 700-900). Such GEMMs are fitted and priced apart, which is
/// why Megatron-LM pads its vocabulary (--make-vocab-size-divisible-by).
constexpr int64_t kGemmAlignment = 8;
const char *const kUnaligned = "|unaligned";

/// Kernels whose half-precision time is the tensor cores' (the ones a
/// power-limited clock slows: DeviceSpec::sustainedTensorRatio).
bool tensorCoreKernel(llvm::StringRef kind, DType t) {
  return (t == DType::BF16 || t == DType::F16) &&
         (isGemmKind(kind) || kind == "Conv" || kind == "FlashAttention");
}

/// Whether a GEMM signature ("Gemm|bf16|in=AxB,CxD,1|out=ExF|...") has an
/// operand of rank >= 2 whose last dim is not aligned.
bool unalignedSignature(llvm::StringRef sig) {
  llvm::SmallVector<llvm::StringRef, 8> fields;
  sig.split(fields, '|');
  for (llvm::StringRef f : fields) {
    if (!f.consume_front("in=") && !f.consume_front("out="))
      continue;
    llvm::SmallVector<llvm::StringRef, 4> tensors;
    f.split(tensors, ',');
    for (llvm::StringRef t : tensors) {
      if (!t.contains('x'))
        continue;
      int64_t last = 0;
      if (!t.rsplit('x').second.getAsInteger(10, last) &&
          last % kGemmAlignment != 0)
        return true;
    }
  }
  return false;
}

/// The same for `tile` of a GEMM op. A dim that one loop indexes one to one
/// has that loop's extent in the tile, also where the tile reaches past the
/// tensor: a padded vocabulary's tile (TaskGraph::kernelTimes) is priced as
/// the padded shard Megatron-LM runs, not as the tensor's clamped edge.
bool unalignedTile(const Op &op, const Box &tile) {
  auto last = [&](const TensorMap &m, const Box &region) -> int64_t {
    if (region.rank() < 2)
      return kGemmAlignment;
    const DimMap &d = m.dims.back();
    if (!d.full && d.terms.size() == 1 && d.terms[0].coeff == 1 &&
        d.divisor == 1 && d.offset == 0)
      return tile.hi[size_t(d.terms[0].loop)] - tile.lo[size_t(d.terms[0].loop)];
    return region.hi.back() - region.lo.back();
  };
  for (int i = 0; i < 2 && i < int(op.inputs.size()); ++i)
    if (op.inputs[size_t(i)] != kNoValue &&
        last(op.sem.inputs[size_t(i)], op.sem.inputRegion(i, tile)) %
                kGemmAlignment !=
            0)
      return true;
  return !op.outputs.empty() &&
         last(op.sem.outputs[0], op.sem.outputRegion(0, tile)) %
                 kGemmAlignment !=
             0;
}

} // namespace

/// Fits the roofline to measured entries: for each op kind and element type,
/// the median over
/// its compute-bound measurements of FLOPs / (peak * (time - launch)), and
/// over its bandwidth-bound ones of bytes / (bandwidth * (time - launch));
/// the memory fraction of a kind without any from those of every kind.
void CostModel::fit() {
  if (!db_)
    return;
  std::vector<double> memory;
  double bw = memoryBandwidth();
  for (const auto &[sig, e] : db_->kernels()) {
    size_t bar = sig.find('|');
    std::string kind = sig.substr(0, bar);
    size_t bar2 = sig.find('|', bar + 1);
    auto dt = parseDType(sig.substr(bar + 1, bar2 - bar - 1));
    double peak = peakFlops(dt.value_or(DType::F32));
    // A kind's efficiencies are per element type: its bf16 kernels'
    // fraction of the bf16 rate says nothing of its f32 ones', and a bf16
    // convolution the bf16 rate calls bandwidth-bound is no f32 one's guide.
    std::string key = fitKey(kind, dt.value_or(DType::F32));
    if (isGemmKind(kind) && unalignedSignature(sig))
      key += kUnaligned;
    const Seconds times[3] = {e.forward, e.backwardData, e.backwardWeight};
    for (int p = 0; p < 3; ++p) {
      double busy = times[p] - device_.launchOverhead;
      if (busy <= 0 || (e.flops[p] <= 0 && e.bytes[p] <= 0))
        continue;
      if (e.flops[p] / peak >= e.bytes[p] / bw) {
        computeBySize_[key].push_back(
            {e.flops[p], std::min(1.0, e.flops[p] / (peak * busy))});
      } else {
        double f = std::min(1.0, e.bytes[p] / (bw * busy));
        memory.push_back(f);
        memoryBySize_[key].push_back({e.bytes[p], f});
      }
    }
  }
  auto efficiencies = [](const SizedSamples &samples) {
    std::vector<double> f;
    for (const auto &sample : samples)
      f.push_back(sample.second);
    return f;
  };
  for (auto &[kind, samples] : computeBySize_) {
    std::sort(samples.begin(), samples.end());
    fitted_[kind] = {median(efficiencies(samples)),
                     static_cast<int>(samples.size())};
  }
  for (auto &[kind, samples] : memoryBySize_) {
    std::sort(samples.begin(), samples.end());
    memFitted_[kind] = median(efficiencies(samples));
  }
  if (!memory.empty())
    memEff_ = median(memory);
}

/// The median efficiency of the (at most) kSizeNeighbours samples nearest
/// to `size` on a log scale, from `samples` sorted by size; `fallback`
/// where there are none or the size is 0.
static double nearestBySize(const SizedSamples *samples, double size,
                            double fallback) {
  if (!samples || size <= 0)
    return fallback;
  constexpr size_t kSizeNeighbours = 5;
  const SizedSamples &s = *samples;
  size_t n = s.size(), k = std::min(kSizeNeighbours, n);
  // The window of k consecutive samples nearest in log size, grown from
  // the first whose size is at least `size`.
  size_t hi = size_t(std::lower_bound(s.begin(), s.end(),
                                      std::make_pair(size, 0.0)) -
                     s.begin());
  size_t lo = hi;
  double ls = std::log(std::max(size, 1.0));
  auto dist = [&](size_t i) {
    return std::abs(std::log(std::max(s[i].first, 1.0)) - ls);
  };
  while (hi - lo < k) {
    if (lo == 0)
      ++hi;
    else if (hi == n || dist(lo - 1) <= dist(hi))
      --lo;
    else
      ++hi;
  }
  // Their median, sorted in place (at most kSizeNeighbours values).
  std::array<double, kSizeNeighbours> f{};
  for (size_t i = 0; i < k; ++i) {
    size_t j = i;
    for (double x = s[lo + i].second; j > 0 && f[j - 1] > x; --j)
      f[j] = f[j - 1];
    f[j] = s[lo + i].second;
  }
  return k % 2 ? f[k / 2] : (f[k / 2 - 1] + f[k / 2]) / 2;
}

/// The samples of `kind` in `bySize`, or null.
static const SizedSamples *
samplesOf(const std::map<std::string, SizedSamples> &bySize,
          llvm::StringRef kind) {
  auto it = bySize.find(kind.str());
  return it == bySize.end() ? nullptr : &it->second;
}

double CostModel::computeEfficiency(llvm::StringRef kind, DType t,
                                    double flops) const {
  return nearestBySize(samplesOf(computeBySize_, fitKey(kind, t)), flops,
                       computeEfficiency(kind, t));
}

double CostModel::memoryEfficiency(llvm::StringRef kind, DType t,
                                   double bytes) const {
  return nearestBySize(samplesOf(memoryBySize_, fitKey(kind, t)), bytes,
                       memoryEfficiency(kind, t));
}

double CostModel::memoryEfficiency(llvm::StringRef kind, DType t) const {
  auto it = memFitted_.find(fitKey(kind, t));
  return it != memFitted_.end() ? it->second : memEff_;
}

double CostModel::computeEfficiency(llvm::StringRef kind, DType t) const {
  auto it = fitted_.find(fitKey(kind, t));
  if (it != fitted_.end())
    return it->second.first;
  if (db_) {
    auto d = db_->computeEfficiency.find(kind.str());
    if (d != db_->computeEfficiency.end())
      return d->second;
    d = db_->computeEfficiency.find("*");
    if (d != db_->computeEfficiency.end())
      return d->second;
    if (db_->gemmFlopsPerSec.count(dtypeKey(t)))
      return std::min(1.0,
                      builtinComputeEfficiency(kind) / kBuiltinGemmEfficiency);
  }
  return builtinComputeEfficiency(kind);
}

std::string CostModel::computeEfficiencySource(llvm::StringRef kind,
                                               DType t) const {
  auto it = fitted_.find(fitKey(kind, t));
  if (it != fitted_.end())
    return fmt::format("fitted to {} measurements", it->second.second);
  if (db_ && (db_->computeEfficiency.count(kind.str()) ||
              db_->computeEfficiency.count("*")))
    return "profile default";
  if (db_ && db_->gemmFlopsPerSec.count(dtypeKey(t)))
    return "built-in default, relative to the measured GEMM rate";
  return "built-in default";
}

bool runsBackwardData(const Op &op, Seconds backwardWeight) {
  return op.sem.backwardDataNeeded ||
         (!op.sem.weightInputs.empty() && backwardWeight <= 0);
}

static KernelTimes withoutUnneededBackwardData(const Op &op, KernelTimes k) {
  if (!runsBackwardData(op, k.backwardWeight))
    k.backwardData = 0;
  return k;
}

/// An FP8 GEMM's times with its scaling work added. The output gradient's
/// cast serves both backward GEMMs: it goes with backward-weight where no
/// backward-data pass runs.
static KernelTimes withFp8Scaling(KernelTimes k, const KernelTimes &s) {
  k.forward += s.forward;
  (k.backwardData > 0 ? k.backwardData : k.backwardWeight) += s.backwardData;
  k.backwardWeight += s.backwardWeight;
  return k;
}

KernelTimes CostModel::analytic(const Graph &g, const Op &op,
                                const Box &tile) const {
  std::vector<DType> inT, outT;
  operandTypes(g, op, inT, outT);
  DType dt = opDType(g, op);
  // The efficiency of measured kernels of this kind and about each pass's
  // size: a kind's small tiles (launch- and tail-bound) say little about
  // its large ones (a vocabulary-sized GEMM).
  std::string key = fitKey(op.kind, dt);
  bool unaligned = isGemmKind(op.kind) && unalignedTile(op, tile);
  if (unaligned)
    key += kUnaligned;
  const SizedSamples *computed = samplesOf(computeBySize_, key),
                     *streamed = samplesOf(memoryBySize_, key);
  double computeEff = computeEfficiency(op.kind, dt),
         memoryEff = memoryEfficiency(op.kind, dt);
  Seconds t[3];
  for (int p = 0; p < 3; ++p) {
    Pass pass = static_cast<Pass>(p);
    double flops = op.sem.tileFlops(pass, tile);
    double bytes = static_cast<double>(op.sem.tileBytes(pass, tile, inT, outT));
    if (pass == Pass::BackwardWeight && op.sem.weightInputs.empty())
      flops = bytes = 0;
    double peak = peakFlops(dt) * nearestBySize(computed, flops, computeEff) *
                  (op.fp8 ? fp8Speedup() : 1);
    double attention =
        op.kind == "FlashAttention"
            ? publishedAttentionFlops(device_.name, dt, pass,
                                      kernelSequence(op, tile))
            : 0;
    bool burst = db_ != nullptr; // rates measured in short bursts
    if (op.kind == "FlashAttention" && !computed && attention > 0) {
      peak = attention;
      burst = true;
    }
    if (burst && tensorCoreKernel(op.kind, dt))
      peak *= device_.sustainedTensorRatio;
    double bw = memoryBandwidth() * nearestBySize(streamed, bytes, memoryEff);
    t[p] = flops <= 0 && bytes <= 0
               ? 0
               : std::max(flops / peak, bytes / bw) + device_.launchOverhead;
  }
  KernelTimes k;
  k.forward = t[0];
  k.backwardData = t[1];
  k.backwardWeight = t[2];
  k.source = CostSource::Analytic;
  return withFp8Scaling(withoutUnneededBackwardData(op, k),
                        fp8Scaling(g, op, tile));
}

llvm::Expected<KernelTimes> CostModel::kernel(const Graph &g, const Op &op,
                                              const Box &tile) const {
  if (op.absorbed)
    return KernelTimes{}; // a view or a GEMM's epilogue (Op::absorbed)
  if (mode_ != CostMode::Analytic && db_) {
    std::string sig = opSignature(g, op, tile);
    if (const KernelEntry *e = db_->find(sig)) {
      ++hits_;
      // A pass the host enqueues more slowly than the GPU runs it takes the
      // host's time: issued back to back, the GPU waits for the host.
      // Measured in bursts: a tensor-core kernel's sustained time is longer.
      // An FP8 GEMM: the measured bf16 kernel at the FP8 rate.
      double slow = tensorCoreKernel(op.kind, opDType(g, op))
                        ? 1 / device_.sustainedTensorRatio
                        : 1;
      if (op.fp8)
        slow /= fp8Speedup();
      KernelTimes k;
      k.forward = std::max(e->forward * slow, e->launch[0]);
      k.backwardData = std::max(e->backwardData * slow, e->launch[1]);
      k.backwardWeight = std::max(e->backwardWeight * slow, e->launch[2]);
      k.workspace = e->workspace;
      k.source = CostSource::Profile;
      return withFp8Scaling(withoutUnneededBackwardData(op, k),
                            fp8Scaling(g, op, tile));
    }
    ++misses_;
    if (mode_ == CostMode::Strict)
      return inputError("{}: --cost-model strict: the cost database of '{}' "
                        "has no entry for signature '{}'",
                        g.where(op.id), db_->env.device, sig);
  } else if (mode_ == CostMode::Strict) {
    return inputError("--cost-model strict needs a cost database (--profile)");
  }
  return analytic(g, op, tile);
}

TileMemory CostModel::memory(const Graph &g, const Op &op, const Box &tile,
                             Optimizer opt) const {
  std::vector<DType> inT, outT;
  operandTypes(g, op, inT, outT);
  TileMemory m;
  for (int i : op.sem.weightInputs) {
    int64_t n = op.sem.inputRegion(i, tile).volume();
    WeightBytes wb = weightBytes(g.value(op.inputs[size_t(i)]), opt);
    m.weights += n * wb.weight;
    m.gradients += n * wb.gradient;
    m.optimizer += n * wb.optimizer;
  }
  m.saved = op.sem.savedBytes(tile, inT, outT);
  if (db_ && mode_ != CostMode::Analytic)
    if (const KernelEntry *e = db_->find(opSignature(g, op, tile)))
      m.workspace = e->workspace;
  return m;
}

} // namespace soap
