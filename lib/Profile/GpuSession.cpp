// Measuring op tiles on one CUDA GPU (see GpuSession.h): the session, the
// streaming kernel's and cuBLAS's benches, timing, and calibration.
#include "GpuSession.h"

#include "GpuCommon.h"
#include "MeasurePlan.h"
#include "soap/Cost/CostModel.h"
#include "soap/Support/Format.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/raw_ostream.h"
#include <atomic>
#include <chrono>
#include <cctype>
#include <cmath>
#include <fstream>
#include <sstream>

namespace soap {

TileBench::~TileBench() = default;

namespace {

using Impl = GpuSession::Impl;

// --- the streaming kernel: element-wise and data-movement ops --------------

class StreamBench : public TileBench {
public:
  struct PassWork {
    int64_t read = 0, write = 0; ///< floats
    int fma = 0;
  };
  StreamBench(Impl &s) : s_(s) {}
  PassWork work[3];
  DevBuf src, dst;

  bool has(Pass p) const override {
    const PassWork &w = work[int(p)];
    return w.read > 0 || w.write > 0;
  }
  llvm::Error run(Pass p) override {
    const PassWork &w = work[int(p)];
    gpu::stream(src.f(), w.read, dst.f(), w.write, w.fma,
                s_.prop.multiProcessorCount, s_.stream);
    SOAP_CUDA(cudaGetLastError());
    return llvm::Error::success();
  }
  const char *method() const override { return "stream"; }

private:
  Impl &s_;
};

llvm::Expected<std::unique_ptr<TileBench>>
makeStream(Impl &s, const Graph &g, const Op &op, const Box &tile) {
  auto b = std::make_unique<StreamBench>(s);
  // Element counts as 4-byte floats of the operands' real sizes.
  auto floats = [&](ValueId v, const Box &region) -> int64_t {
    int64_t bytes = region.volume() * dtypeBytes(g.value(v).dtype);
    return (bytes + 3) / 4;
  };
  int64_t inData = 0, inWeight = 0, out = 0;
  for (size_t i = 0; i < op.inputs.size(); ++i) {
    if (op.inputs[i] == kNoValue || !op.sem.inputs[i].present)
      continue;
    int64_t n = floats(op.inputs[i], op.sem.inputRegion(int(i), tile));
    bool weight = std::find(op.sem.weightInputs.begin(),
                            op.sem.weightInputs.end(),
                            int(i)) != op.sem.weightInputs.end();
    (weight ? inWeight : inData) += n;
  }
  for (size_t j = 0; j < op.outputs.size(); ++j)
    if (op.outputs[j] != kNoValue && op.sem.outputs[j].present)
      out += floats(op.outputs[j], op.sem.outputRegion(int(j), tile));
  std::vector<DType> inT, outT;
  for (ValueId v : op.inputs)
    inT.push_back(v == kNoValue ? DType::F32 : g.value(v).dtype);
  for (ValueId v : op.outputs)
    outT.push_back(v == kNoValue ? DType::F32 : g.value(v).dtype);
  const int64_t writes[3] = {out, inData, inWeight};
  for (int p = 0; p < 3; ++p) {
    Pass pass = static_cast<Pass>(p);
    double flops = op.sem.tileFlops(pass, tile);
    int64_t bytes = op.sem.tileBytes(pass, tile, inT, outT);
    bool none = (flops <= 0 && bytes <= 0) ||
                (pass == Pass::BackwardWeight && op.sem.weightInputs.empty());
    if (none)
      continue;
    // The bytes the IR counts for the pass (what the roofline uses; for a
    // gather only the rows it reads), of which the pass's outputs are
    // written and the rest read.
    StreamBench::PassWork &w = b->work[p];
    int64_t total = (bytes + 3) / 4;
    w.write = std::min(writes[p], total);
    w.read = total - w.write;
    int64_t items = std::max<int64_t>(1, std::max(w.read, w.write));
    // f32 arithmetic without tensor cores runs on the same FMA units as
    // this kernel, so a compute-bound op (an LSTM) is timed at their rate.
    w.fma = static_cast<int>(
        std::min<double>(1 << 24, std::ceil(flops / (2.0 * double(items)))));
  }
  int64_t maxRead = 0, maxWrite = 0;
  for (const auto &w : b->work) {
    maxRead = std::max(maxRead, w.read);
    maxWrite = std::max(maxWrite, w.write);
  }
  if (auto err = s.filled(b->src, size_t(maxRead) * 4))
    return llvm::Error(std::move(err));
  if (auto err = b->dst.alloc(size_t(maxWrite) * 4))
    return llvm::Error(std::move(err));
  return std::unique_ptr<TileBench>(std::move(b));
}

// --- cuBLAS: Gemm and MatMul ------------------------------------------------

class GemmBench : public TileBench {
public:
  GemmBench(Impl &s, cudaDataType_t t) : s_(s), type_(t) {}
  std::vector<GemmShape> calls[3];
  DevBuf bufs[6]; ///< by GemmShape::Operand

  bool has(Pass p) const override { return !calls[int(p)].empty(); }
  llvm::Error run(Pass p) override {
    const float one = 1, zero = 0;
    for (const GemmShape &c : calls[int(p)]) {
      // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T.
      SOAP_BLAS(cublasGemmStridedBatchedEx(
          s_.blas, c.tB ? CUBLAS_OP_T : CUBLAS_OP_N,
          c.tA ? CUBLAS_OP_T : CUBLAS_OP_N, int(c.n), int(c.m), int(c.k), &one,
          bufs[c.b].get(), type_, int(c.tB ? c.k : c.n), c.strideB,
          bufs[c.a].get(), type_, int(c.tA ? c.m : c.k), c.strideA, &zero,
          bufs[c.c].get(), type_, int(c.n), c.strideC, int(c.batch),
          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
    return llvm::Error::success();
  }
  const char *method() const override { return "cublas"; }

  /// Allocates and fills a buffer of `elements` of the bench's type.
  llvm::Error fill(GemmShape::Operand o, int64_t elements) {
    size_t esize = type_ == CUDA_R_32F ? 4 : 2;
    DevBuf &buf = bufs[o];
    if (auto err = buf.alloc(size_t(elements) * esize))
      return err;
    int64_t cnt = int64_t(buf.bytes() / esize);
    if (type_ == CUDA_R_32F)
      gpu::fillF32(buf.f(), cnt, s_.seed++, s_.stream);
    else if (type_ == CUDA_R_16F)
      gpu::fillF16(buf.get(), cnt, s_.seed++, s_.stream);
    else
      gpu::fillBF16(buf.get(), cnt, s_.seed++, s_.stream);
    SOAP_CUDA(cudaGetLastError());
    return llvm::Error::success();
  }

private:
  Impl &s_;
  cudaDataType_t type_;
};

cudaDataType_t cudaType(DType t) {
  return t == DType::F16 ? CUDA_R_16F : t == DType::BF16 ? CUDA_R_16BF
                                                         : CUDA_R_32F;
}

/// Nothing when planGemm has no plan for the tile.
llvm::Expected<std::unique_ptr<TileBench>>
makeGemm(Impl &s, const Graph &g, const Op &op, const Box &tile) {
  std::optional<GemmPlan> plan = planGemm(g, op, tile);
  if (!plan)
    return nullptr;
  auto bench = std::make_unique<GemmBench>(s, cudaType(plan->dtype));
  for (int o = 0; o < 6; ++o) {
    auto operand = static_cast<GemmShape::Operand>(o);
    if (auto err = bench->fill(operand, plan->elements(operand)))
      return llvm::Error(std::move(err));
  }
  for (int p = 0; p < 3; ++p)
    bench->calls[p] = plan->passes[p];
  return std::unique_ptr<TileBench>(std::move(bench));
}
} // namespace

// --- the session ------------------------------------------------------------

llvm::Expected<std::unique_ptr<GpuSession>>
GpuSession::open(int ordinal, const MeasureOptions &opts) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess)
    return inputError("no usable CUDA device: {}", cudaGetErrorString(e));
  if (count == 0)
    return inputError("no usable CUDA device: the runtime found none");
  if (ordinal < 0 || ordinal >= count)
    return inputError("--gpu {}: this machine has {} CUDA device(s)", ordinal,
                      count);
  std::unique_ptr<GpuSession> s(new GpuSession());
  s->opts_ = opts;
  s->impl_ = std::make_unique<Impl>();
  Impl &im = *s->impl_;
  im.device = ordinal;
  im.tf32 = opts.tf32;
  im.findAlgorithms = opts.findAlgorithms;
  SOAP_CUDA(cudaSetDevice(ordinal));
  SOAP_CUDA(cudaGetDeviceProperties(&im.prop, ordinal));
  im.name = im.prop.name;
  SOAP_CUDA(cudaStreamCreateWithFlags(&im.stream, cudaStreamNonBlocking));
  SOAP_CUDA(cudaEventCreate(&im.e0));
  SOAP_CUDA(cudaEventCreate(&im.e1));
  {
    void *gate = nullptr, *deviceGate = nullptr;
    SOAP_CUDA(cudaHostAlloc(&gate, 2 * sizeof(int), cudaHostAllocMapped));
    im.gate = static_cast<volatile int *>(gate);
    im.gate[0] = im.gate[1] = 0;
    SOAP_CUDA(cudaHostGetDevicePointer(&deviceGate, gate, 0));
    im.deviceGate = static_cast<volatile int *>(deviceGate);
  }
  SOAP_BLAS(cublasCreate(&im.blas));
  SOAP_BLAS(cublasSetStream(im.blas, im.stream));
  SOAP_BLAS(cublasSetMathMode(im.blas, opts.tf32 ? CUBLAS_TF32_TENSOR_OP_MATH
                                                 : CUBLAS_DEFAULT_MATH));
  SOAP_DNN(cudnnCreate(&im.dnn));
  SOAP_DNN(cudnnSetStream(im.dnn, im.stream));
  if (opts.flushL2)
    if (auto err = im.l2.alloc(size_t(std::max(im.prop.l2CacheSize, 1)) * 2))
      return llvm::Error(std::move(err));
  return llvm::Expected<std::unique_ptr<GpuSession>>(std::move(s));
}

GpuSession::~GpuSession() = default;

const std::string &GpuSession::gpuName() const { return impl_->name; }

ProfileEnvironment
GpuSession::environment(const std::string &catalogName) const {
  ProfileEnvironment env;
  env.device = catalogName;
  env.gpuName = impl_->name;
  env.math = opts_.tf32 ? "tf32" : "fp32";
  auto ver = [](int v) {
    return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
  };
  int v = 0;
  // The kernel driver's own version where the system shows it, else the
  // CUDA version the driver supports.
  std::ifstream proc("/proc/driver/nvidia/version");
  std::string line;
  // "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.54.03  ..." or
  // "... UNIX Open Kernel Module for x86_64  580.159.04  Release Build ...":
  // the first word after "Kernel Module" that is a dotted number.
  if (proc && std::getline(proc, line)) {
    size_t at = line.find("Kernel Module");
    if (at != std::string::npos) {
      std::istringstream is(line.substr(at + 13));
      for (std::string w; is >> w;)
        if (std::isdigit(static_cast<unsigned char>(w[0])) &&
            w.find('.') != std::string::npos) {
          env.driver = w;
          break;
        }
    }
  }
  if (env.driver.empty() && cudaDriverGetVersion(&v) == cudaSuccess)
    env.driver = "cuda " + ver(v);
  if (cudaRuntimeGetVersion(&v) == cudaSuccess)
    env.cuda = ver(v);
  size_t dv = cudnnGetVersion();
  env.cudnn = std::to_string(dv / 10000) + "." +
              std::to_string(dv % 10000 / 100) + "." + std::to_string(dv % 100);
  int maj = 0, min = 0, pat = 0;
  cublasGetProperty(MAJOR_VERSION, &maj);
  cublasGetProperty(MINOR_VERSION, &min);
  cublasGetProperty(PATCH_LEVEL, &pat);
  env.cublas = std::to_string(maj) + "." + std::to_string(min) + "." +
               std::to_string(pat);
  return env;
}

llvm::Expected<std::unique_ptr<TileBench>>
GpuSession::prepare(const Graph &g, const Op &op, const Box &tile,
                    const std::string &signature) {
  Impl &s = *impl_;
  // The method measureMethod names (what --list shows). A library that
  // refuses a tile it was planned for is an error, not a silent switch to
  // the streaming kernel, which would time some other computation.
  llvm::StringRef method = measureMethod(g, op, tile);
  llvm::Expected<std::unique_ptr<TileBench>> bench =
      method == "cudnn" && op.kind == "BatchNormalization"
          ? gpu::makeBatchNorm(s, g, op, tile)
      : method == "cudnn" && op.kind == "LSTM" ? gpu::makeRnn(s, g, op, tile)
      : method == "cudnn" && op.kind == "Conv"
          ? gpu::makeConv(s, g, op, tile, signature)
      : method == "cudnn"  ? gpu::makePool(s, g, op, tile, signature)
      : method == "cublas" ? makeGemm(s, g, op, tile)
                           : makeStream(s, g, op, tile);
  if (!bench)
    return bench.takeError();
  if (!*bench)
    return makeError(ExitCode::Internal, "no {} plan for the tile",
                     method.str());
  SOAP_CUDA(cudaStreamSynchronize(s.stream));
  return bench;
}

namespace {

/// How long the host may take to enqueue one timed run behind gpu::hold:
/// cuDNN's and cuBLAS's calls take microseconds to tens of microseconds.
constexpr int64_t kHoldTimeoutNs = 50'000'000;

/// One run of what `enqueue` queues on the session's stream, timed with
/// events (seconds). The stream is held (gpu::hold) until the host has
/// queued the whole run, so the time is the GPU's alone: without the hold,
/// the first event fires on an idle GPU and the interval includes the host's
/// time in the libraries' calls, which for kernels of a few microseconds is
/// most of it and varies from run to run.
template <typename Enqueue>
llvm::Expected<Seconds> timedRun(Impl &s, Enqueue enqueue, bool hold = true,
                                 Seconds *host = nullptr) {
  const bool held = hold && s.held;
  if (held) {
    s.gate[0] = 0;
    s.gate[1] = 0;
    std::atomic_thread_fence(std::memory_order_seq_cst);
    gpu::hold(s.deviceGate, s.deviceGate + 1, kHoldTimeoutNs, s.stream);
    SOAP_CUDA(cudaGetLastError());
  }
  auto release = [&] {
    if (held) {
      std::atomic_thread_fence(std::memory_order_seq_cst);
      s.gate[0] = 1;
    }
  };
  SOAP_CUDA(cudaEventRecord(s.e0, s.stream));
  auto began = std::chrono::steady_clock::now();
  if (auto err = enqueue()) {
    release();
    cudaStreamSynchronize(s.stream);
    return llvm::Error(std::move(err));
  }
  auto enqueued = std::chrono::steady_clock::now();
  SOAP_CUDA(cudaEventRecord(s.e1, s.stream));
  release();
  SOAP_CUDA(cudaEventSynchronize(s.e1));
  if (held && s.gate[1]) {
    // The hold ran out before the host released it: the host blocked inside
    // the run (a library's first call may allocate and synchronise) or is
    // that slow. Run it again; after the third time, hold no more runs.
    if (++s.holdTimeouts == 3) {
      llvm::errs() << fmt::format(
          "soap-profile: enqueueing a timed run took over {} ms three "
          "times in a row; timing without holding the stream from here on\n",
          kHoldTimeoutNs / 1'000'000);
      s.held = false;
    }
    return timedRun(s, enqueue, hold, host);
  }
  if (held)
    s.holdTimeouts = 0;
  if (host)
    *host = std::chrono::duration<double>(enqueued - began).count();
  float ms = 0;
  SOAP_CUDA(cudaEventElapsedTime(&ms, s.e0, s.e1));
  return double(ms) * 1e-3;
}

} // namespace

llvm::Expected<PassTime> GpuSession::time(TileBench &b, Pass p) {
  Impl &s = *impl_;
  if (!b.has(p))
    return PassTime{};
  for (int i = 0; i < opts_.warmup; ++i)
    if (auto err = b.run(p))
      return llvm::Error(std::move(err));
  SOAP_CUDA(cudaStreamSynchronize(s.stream));
  std::vector<double> runs, hosts;
  for (int r = 0; r < std::max(1, opts_.repeats); ++r) {
    if (opts_.flushL2) {
      SOAP_CUDA(cudaMemsetAsync(s.l2.get(), r & 0xff, s.l2.bytes(), s.stream));
    }
    Seconds host = 0;
    auto t = timedRun(s, [&] { return b.run(p); }, true, &host);
    if (!t)
      return t.takeError();
    runs.push_back(*t);
    hosts.push_back(host);
  }
  return PassTime{median(runs), median(hosts)};
}

llvm::Error GpuSession::enqueue(TileBench &b, const Pass *passes,
                                int numPasses) {
  for (int i = 0; i < numPasses; ++i)
    if (b.has(passes[i]))
      if (auto err = b.run(passes[i]))
        return err;
  return llvm::Error::success();
}

llvm::Expected<Seconds> GpuSession::timeOnce(TileBench &b, const Pass *passes,
                                             int numPasses) {
  return timedRun(*impl_, [&] { return enqueue(b, passes, numPasses); });
}

llvm::Expected<Seconds>
GpuSession::timeSequence(llvm::function_ref<llvm::Error()> enqueue) {
  return timedRun(*impl_, enqueue, /*hold=*/false);
}

llvm::Expected<KernelEntry> GpuSession::measure(const Graph &g, const Op &op,
                                                const Box &tile,
                                                const std::string &signature,
                                                std::string *method) {
  auto b = prepare(g, op, tile, signature);
  if (!b)
    return b.takeError();
  if (method)
    *method = (*b)->method();
  KernelEntry e;
  std::optional<GemmPlan> plan;
  if (std::string((*b)->method()) == "cublas")
    plan = planGemm(g, op, tile);
  Seconds *out[3] = {&e.forward, &e.backwardData, &e.backwardWeight};
  setTileWork(e, g, op, tile);
  for (int p = 0; p < 3; ++p) {
    auto t = time(**b, static_cast<Pass>(p));
    if (!t)
      return t.takeError();
    *out[p] = t->gpu;
    e.launch[p] = t->launch;
    // What cuBLAS computed, where the IR splits the passes otherwise (the
    // second gradient of a product of two activations), so that fitting
    // the roofline to the entry divides the right FLOPs by the time.
    if (plan)
      e.flops[p] = plan->flops(static_cast<Pass>(p));
  }
  e.workspace = (*b)->workspace;
  e.repeats = std::max(1, opts_.repeats);
  return e;
}

llvm::Expected<double> GpuSession::measureBandwidth() {
  Impl &s = *impl_;
  const int64_t floats = int64_t(1) << 28; // 1 GiB each way
  DevBuf src, dst;
  if (auto err = s.filled(src, size_t(floats) * 4))
    return llvm::Error(std::move(err));
  if (auto err = dst.alloc(size_t(floats) * 4))
    return llvm::Error(std::move(err));
  StreamBench b(s);
  b.work[0] = {floats, floats, 0};
  // Borrow the buffers for the run.
  b.src = std::move(src);
  b.dst = std::move(dst);
  auto t = time(b, Pass::Forward);
  if (!t)
    return t.takeError();
  return 2.0 * double(floats) * 4 / t->gpu;
}

llvm::Expected<std::map<std::string, double>>
GpuSession::measureGemmRates(int64_t size) {
  Impl &s = *impl_;
  std::map<std::string, double> out;
  for (auto [name, dtype] : {std::pair{"f32", DType::F32},
                             {"f16", DType::F16},
                             {"bf16", DType::BF16}}) {
    GemmBench b(s, cudaType(dtype));
    for (auto o : {GemmShape::A, GemmShape::B, GemmShape::Y})
      if (auto err = b.fill(o, size * size))
        return llvm::Error(std::move(err));
    b.calls[0].push_back({false, false, size, size, size, 1, 0, 0, 0,
                          GemmShape::A, GemmShape::B, GemmShape::Y});
    auto t = time(b, Pass::Forward);
    if (!t)
      return t.takeError();
    out[name] = 2.0 * double(size) * double(size) * double(size) / t->gpu;
  }
  return out;
}

} // namespace soap