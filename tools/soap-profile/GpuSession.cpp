// Measuring op tiles on one CUDA GPU (see GpuSession.h).
#include "GpuSession.h"

#include "Kernels.h"
#include "MeasurePlan.h"
#include "soap/Support/Error.h"
#include "llvm/ADT/StringRef.h"
#include <algorithm>
#include <cmath>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <fstream>
#include <sstream>
#include <vector>

namespace soap {

namespace {

llvm::Error cudaFail(const char *what, cudaError_t e) {
  cudaGetLastError(); // clear a sticky launch error where possible
  return makeError(ExitCode::Internal, "{}: {}", what, cudaGetErrorString(e));
}
llvm::Error blasFail(const char *what, cublasStatus_t st) {
  return makeError(ExitCode::Internal, "{}: cuBLAS status {}", what,
                   static_cast<int>(st));
}
llvm::Error dnnFail(const char *what, cudnnStatus_t st) {
  return makeError(ExitCode::Internal, "{}: {}", what,
                   cudnnGetErrorString(st));
}

#define SOAP_CUDA(expr)                                                        \
  do {                                                                         \
    cudaError_t e_ = (expr);                                                   \
    if (e_ != cudaSuccess)                                                     \
      return cudaFail(#expr, e_);                                              \
  } while (0)
#define SOAP_BLAS(expr)                                                        \
  do {                                                                         \
    cublasStatus_t st_ = (expr);                                                \
    if (st_ != CUBLAS_STATUS_SUCCESS)                                           \
      return blasFail(#expr, st_);                                              \
  } while (0)
#define SOAP_DNN(expr)                                                         \
  do {                                                                         \
    cudnnStatus_t st_ = (expr);                                                 \
    if (st_ != CUDNN_STATUS_SUCCESS)                                            \
      return dnnFail(#expr, st_);                                               \
  } while (0)

/// Device memory, freed with its owner.
class DevBuf {
public:
  DevBuf() = default;
  DevBuf(const DevBuf &) = delete;
  DevBuf &operator=(const DevBuf &) = delete;
  DevBuf(DevBuf &&o) noexcept : p_(o.p_), bytes_(o.bytes_) {
    o.p_ = nullptr;
    o.bytes_ = 0;
  }
  DevBuf &operator=(DevBuf &&o) noexcept {
    std::swap(p_, o.p_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  ~DevBuf() {
    if (p_)
      cudaFree(p_);
  }
  /// Rounded up to 16 bytes (the streaming kernel reads float4s).
  llvm::Error alloc(size_t bytes) {
    if (p_)
      cudaFree(p_);
    p_ = nullptr;
    bytes_ = std::max<size_t>(16, (bytes + 15) / 16 * 16);
    cudaError_t e = cudaMalloc(&p_, bytes_);
    if (e != cudaSuccess) {
      p_ = nullptr;
      return cudaFail("cudaMalloc", e);
    }
    return llvm::Error::success();
  }
  void *get() const { return p_; }
  float *f() const { return static_cast<float *>(p_); }
  size_t bytes() const { return bytes_; }

private:
  void *p_ = nullptr;
  size_t bytes_ = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::vector<int64_t> shape(const Box &b) {
  std::vector<int64_t> s;
  for (size_t d = 0; d < b.rank(); ++d)
    s.push_back(b.hi[d] - b.lo[d]);
  return s;
}


} // namespace

struct GpuSession::Impl {
  int device = 0;
  cudaDeviceProp prop{};
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  cudnnHandle_t dnn = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  DevBuf workspace; ///< shared cuDNN workspace; grows in prepare only
  DevBuf l2;        ///< written to evict the L2 cache
  std::string name;
  uint64_t seed = 1;
  bool tf32 = false;
  bool findAlgorithms = false;

  ~Impl() {
    if (e0)
      cudaEventDestroy(e0);
    if (e1)
      cudaEventDestroy(e1);
    if (dnn)
      cudnnDestroy(dnn);
    if (blas)
      cublasDestroy(blas);
    if (stream)
      cudaStreamDestroy(stream);
  }

  llvm::Error ensureWorkspace(size_t bytes) {
    if (workspace.bytes() >= bytes)
      return llvm::Error::success();
    SOAP_CUDA(cudaStreamSynchronize(stream));
    return workspace.alloc(bytes);
  }

  llvm::Error filled(DevBuf &b, size_t bytes) {
    if (auto err = b.alloc(bytes))
      return err;
    gpu::fillF32(b.f(), int64_t(b.bytes() / 4), seed++, stream);
    SOAP_CUDA(cudaGetLastError());
    return llvm::Error::success();
  }

  /// The largest workspace cuDNN may be offered while choosing algorithms:
  /// a quarter of what is free, at most 2 GiB.
  size_t findWorkspaceLimit() const {
    size_t freeB = 0, total = 0;
    if (cudaMemGetInfo(&freeB, &total) != cudaSuccess)
      return size_t(256) << 20;
    return std::min(freeB / 4, size_t(2) << 30);
  }
};

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

// --- cuDNN: convolution, pooling, batch normalisation -----------------------

/// Packed NCHW strides.
std::vector<int> packed(const std::vector<int> &dims) {
  std::vector<int> st(dims.size(), 1);
  for (int d = int(dims.size()) - 2; d >= 0; --d)
    st[d] = st[d + 1] * dims[d + 1];
  return st;
}

struct TensorDesc {
  cudnnTensorDescriptor_t d = nullptr;
  ~TensorDesc() {
    if (d)
      cudnnDestroyTensorDescriptor(d);
  }
  llvm::Error set(const std::vector<int> &dims) {
    if (!d)
      SOAP_DNN(cudnnCreateTensorDescriptor(&d));
    std::vector<int> st = packed(dims);
    SOAP_DNN(cudnnSetTensorNdDescriptor(d, CUDNN_DATA_FLOAT, int(dims.size()),
                                        dims.data(), st.data()));
    return llvm::Error::success();
  }
};

size_t floatsOf(const std::vector<int> &dims) {
  size_t v = 1;
  for (int x : dims)
    v *= size_t(x);
  return v;
}

/// The first algorithm that ran (or, from the heuristics, may run) within
/// the workspace limit; cuDNN lists them fastest first.
template <typename Perf, typename Algo>
bool pick(const Perf *perf, int n, size_t limit, Algo &algo, size_t &ws) {
  for (int i = 0; i < n; ++i)
    if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].memory <= limit) {
      algo = perf[i].algo;
      ws = perf[i].memory;
      return true;
    }
  return false;
}

class ConvBench : public TileBench {
public:
  explicit ConvBench(Impl &s) : s_(s) {}
  ~ConvBench() override {
    if (w_)
      cudnnDestroyFilterDescriptor(w_);
    if (conv_)
      cudnnDestroyConvolutionDescriptor(conv_);
  }

  llvm::Error build(const Graph &g, const Op &op, const Box &tile,
                    const std::string &sig) {
    std::optional<WindowPlan> plan = planWindow(g, op, tile, sig);
    if (!plan || plan->filter.empty())
      return makeError(ExitCode::Internal, "unsupported convolution shape");
    const std::vector<int> &xd = plan->input, &wd = plan->filter;
    int nsp = int(plan->window.size());
    if (auto err = x_.set(xd))
      return err;
    SOAP_DNN(cudnnCreateFilterDescriptor(&w_));
    SOAP_DNN(cudnnSetFilterNdDescriptor(w_, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW,
                                        int(wd.size()), wd.data()));
    SOAP_DNN(cudnnCreateConvolutionDescriptor(&conv_));
    SOAP_DNN(cudnnSetConvolutionNdDescriptor(
        conv_, nsp, plan->pad.data(), plan->stride.data(),
        plan->dilation.data(), CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    SOAP_DNN(cudnnSetConvolutionGroupCount(conv_, plan->groups));
    SOAP_DNN(cudnnSetConvolutionMathType(
        conv_, s_.tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH));
    std::vector<int> yd(xd.size());
    SOAP_DNN(cudnnGetConvolutionNdForwardOutputDim(conv_, x_.d, w_,
                                                   int(yd.size()), yd.data()));
    if (auto err = y_.set(yd))
      return err;
    bias_ = op.inputs.size() > 2 && op.inputs[2] != kNoValue &&
            op.sem.inputs[2].present;
    std::vector<int> bd(xd.size(), 1);
    bd[1] = yd[1];
    if (auto err = b_.set(bd))
      return err;
    weightPass_ = !op.sem.weightInputs.empty();
    for (auto [buf, n] :
         {std::pair{&x, floatsOf(xd)}, {&w, floatsOf(wd)}, {&b, floatsOf(bd)},
          {&y, floatsOf(yd)}, {&dx, floatsOf(xd)}, {&dw, floatsOf(wd)},
          {&db, floatsOf(bd)}, {&dy, floatsOf(yd)}})
      if (auto err = s_.filled(*buf, n * 4))
        return err;
    // Each pass's algorithm: cuDNN's heuristics (frameworks' default), or
    // with --cudnn-find the fastest by trial (their benchmark mode).
    size_t limit = s_.findWorkspaceLimit();
    int got = 0;
    cudnnConvolutionFwdAlgoPerf_t fp[8];
    cudnnConvolutionBwdDataAlgoPerf_t dp[8];
    cudnnConvolutionBwdFilterAlgoPerf_t wp[8];
    if (s_.findAlgorithms) {
      if (auto err = s_.ensureWorkspace(limit))
        return err;
      void *ws = s_.workspace.get();
      size_t wsb = s_.workspace.bytes();
      SOAP_DNN(cudnnFindConvolutionForwardAlgorithmEx(
          s_.dnn, x_.d, x.get(), w_, w.get(), conv_, y_.d, y.get(), 8, &got,
          fp, ws, wsb));
      if (!pick(fp, got, limit, fwd_, wsF_))
        return makeError(ExitCode::Internal, "no forward algorithm");
      SOAP_DNN(cudnnFindConvolutionBackwardDataAlgorithmEx(
          s_.dnn, w_, w.get(), y_.d, dy.get(), conv_, x_.d, dx.get(), 8, &got,
          dp, ws, wsb));
      if (!pick(dp, got, limit, bwdData_, wsD_))
        return makeError(ExitCode::Internal, "no backward-data algorithm");
      SOAP_DNN(cudnnFindConvolutionBackwardFilterAlgorithmEx(
          s_.dnn, x_.d, x.get(), y_.d, dy.get(), conv_, w_, dw.get(), 8, &got,
          wp, ws, wsb));
      if (!pick(wp, got, limit, bwdFilter_, wsW_))
        return makeError(ExitCode::Internal, "no backward-filter algorithm");
    } else {
      SOAP_DNN(cudnnGetConvolutionForwardAlgorithm_v7(s_.dnn, x_.d, w_, conv_,
                                                      y_.d, 8, &got, fp));
      if (!pick(fp, got, limit, fwd_, wsF_))
        return makeError(ExitCode::Internal, "no forward algorithm");
      SOAP_DNN(cudnnGetConvolutionBackwardDataAlgorithm_v7(
          s_.dnn, w_, y_.d, conv_, x_.d, 8, &got, dp));
      if (!pick(dp, got, limit, bwdData_, wsD_))
        return makeError(ExitCode::Internal, "no backward-data algorithm");
      SOAP_DNN(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
          s_.dnn, x_.d, y_.d, conv_, w_, 8, &got, wp));
      if (!pick(wp, got, limit, bwdFilter_, wsW_))
        return makeError(ExitCode::Internal, "no backward-filter algorithm");
    }
    if (auto err = s_.ensureWorkspace(std::max({wsF_, wsD_, wsW_})))
      return err;
    workspace = std::max({wsF_, wsD_, wsW_});
    return llvm::Error::success();
  }

  bool has(Pass p) const override {
    return p != Pass::BackwardWeight || weightPass_;
  }
  llvm::Error run(Pass p) override {
    const float one = 1, zero = 0;
    void *ws = s_.workspace.get();
    switch (p) {
    case Pass::Forward:
      SOAP_DNN(cudnnConvolutionForward(s_.dnn, &one, x_.d, x.get(), w_,
                                       w.get(), conv_, fwd_, ws, wsF_, &zero,
                                       y_.d, y.get()));
      if (bias_)
        SOAP_DNN(cudnnAddTensor(s_.dnn, &one, b_.d, b.get(), &one, y_.d,
                                y.get()));
      break;
    case Pass::BackwardData:
      SOAP_DNN(cudnnConvolutionBackwardData(s_.dnn, &one, w_, w.get(), y_.d,
                                            dy.get(), conv_, bwdData_, ws,
                                            wsD_, &zero, x_.d, dx.get()));
      break;
    case Pass::BackwardWeight:
      SOAP_DNN(cudnnConvolutionBackwardFilter(s_.dnn, &one, x_.d, x.get(),
                                              y_.d, dy.get(), conv_,
                                              bwdFilter_, ws, wsW_, &zero, w_,
                                              dw.get()));
      if (bias_)
        SOAP_DNN(cudnnConvolutionBackwardBias(s_.dnn, &one, y_.d, dy.get(),
                                              &zero, b_.d, db.get()));
      break;
    }
    return llvm::Error::success();
  }
  const char *method() const override { return "cudnn"; }

  DevBuf x, w, b, y, dx, dw, db, dy;

private:
  Impl &s_;
  TensorDesc x_, y_, b_;
  cudnnFilterDescriptor_t w_ = nullptr;
  cudnnConvolutionDescriptor_t conv_ = nullptr;
  cudnnConvolutionFwdAlgo_t fwd_{};
  cudnnConvolutionBwdDataAlgo_t bwdData_{};
  cudnnConvolutionBwdFilterAlgo_t bwdFilter_{};
  size_t wsF_ = 0, wsD_ = 0, wsW_ = 0;
  bool bias_ = false, weightPass_ = true;
};

class PoolBench : public TileBench {
public:
  explicit PoolBench(Impl &s) : s_(s) {}
  ~PoolBench() override {
    if (pool_)
      cudnnDestroyPoolingDescriptor(pool_);
  }
  llvm::Error build(const Graph &g, const Op &op, const Box &tile,
                    const std::string &sig) {
    std::optional<WindowPlan> plan = planWindow(g, op, tile, sig);
    if (!plan || !plan->filter.empty())
      return makeError(ExitCode::Internal, "unsupported pooling shape");
    const std::vector<int> &xd = plan->input;
    int nsp = int(plan->window.size());
    cudnnPoolingMode_t mode =
        plan->max ? CUDNN_POOLING_MAX
        : plan->countIncludePad ? CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING
                                : CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING;
    SOAP_DNN(cudnnCreatePoolingDescriptor(&pool_));
    SOAP_DNN(cudnnSetPoolingNdDescriptor(pool_, mode, CUDNN_NOT_PROPAGATE_NAN,
                                         nsp, plan->window.data(),
                                         plan->pad.data(),
                                         plan->stride.data()));
    if (auto err = x_.set(xd))
      return err;
    std::vector<int> yd(xd.size());
    SOAP_DNN(cudnnGetPoolingNdForwardOutputDim(pool_, x_.d, int(yd.size()),
                                               yd.data()));
    if (auto err = y_.set(yd))
      return err;
    for (auto [buf, n] : {std::pair{&x, floatsOf(xd)}, {&y, floatsOf(yd)},
                          {&dx, floatsOf(xd)}, {&dy, floatsOf(yd)}})
      if (auto err = s_.filled(*buf, n * 4))
        return err;
    return llvm::Error::success();
  }
  bool has(Pass p) const override { return p != Pass::BackwardWeight; }
  llvm::Error run(Pass p) override {
    const float one = 1, zero = 0;
    if (p == Pass::Forward)
      SOAP_DNN(cudnnPoolingForward(s_.dnn, pool_, &one, x_.d, x.get(), &zero,
                                   y_.d, y.get()));
    else if (p == Pass::BackwardData)
      SOAP_DNN(cudnnPoolingBackward(s_.dnn, pool_, &one, y_.d, y.get(), y_.d,
                                    dy.get(), x_.d, x.get(), &zero, x_.d,
                                    dx.get()));
    return llvm::Error::success();
  }
  const char *method() const override { return "cudnn"; }
  DevBuf x, y, dx, dy;

private:
  Impl &s_;
  TensorDesc x_, y_;
  cudnnPoolingDescriptor_t pool_ = nullptr;
};

/// Training-mode batch normalisation (spatial). cuDNN's backward computes
/// the data and the scale/bias gradients in one call: its time is recorded
/// as backward-data, backward-weight as 0.
class BatchNormBench : public TileBench {
public:
  explicit BatchNormBench(Impl &s) : s_(s) {}
  llvm::Error build(const Op &op, const Box &tile) {
    std::vector<int64_t> xs = shape(op.sem.inputRegion(0, tile));
    if (xs.size() < 2)
      return makeError(ExitCode::Internal, "unsupported batch-norm shape");
    int64_t rest = 1;
    for (size_t d = 3; d < xs.size(); ++d)
      rest *= xs[d];
    std::vector<int> xd = {int(xs[0]), int(xs[1]),
                           int(xs.size() > 2 ? xs[2] : 1), int(rest)};
    if (auto err = x_.set(xd))
      return err;
    SOAP_DNN(cudnnCreateTensorDescriptor(&bn_.d));
    SOAP_DNN(cudnnDeriveBNTensorDescriptor(bn_.d, x_.d, CUDNN_BATCHNORM_SPATIAL));
    size_t n = floatsOf(xd), c = size_t(xd[1]);
    for (auto [buf, cnt] :
         {std::pair{&x, n}, {&y, n}, {&dx, n}, {&dy, n}, {&scale, c},
          {&bias, c}, {&mean, c}, {&var, c}, {&saveMean, c}, {&saveInv, c},
          {&dScale, c}, {&dBias, c}})
      if (auto err = s_.filled(*buf, cnt * 4))
        return err;
    return llvm::Error::success();
  }
  bool has(Pass p) const override { return p != Pass::BackwardWeight; }
  llvm::Error run(Pass p) override {
    const float one = 1, zero = 0;
    if (p == Pass::Forward)
      SOAP_DNN(cudnnBatchNormalizationForwardTraining(
          s_.dnn, CUDNN_BATCHNORM_SPATIAL, &one, &zero, x_.d, x.get(), x_.d,
          y.get(), bn_.d, scale.get(), bias.get(), 0.1, mean.get(), var.get(),
          1e-5, saveMean.get(), saveInv.get()));
    else if (p == Pass::BackwardData)
      SOAP_DNN(cudnnBatchNormalizationBackward(
          s_.dnn, CUDNN_BATCHNORM_SPATIAL, &one, &zero, &one, &zero, x_.d,
          x.get(), x_.d, dy.get(), x_.d, dx.get(), bn_.d, scale.get(),
          dScale.get(), dBias.get(), 1e-5, saveMean.get(), saveInv.get()));
    return llvm::Error::success();
  }
  const char *method() const override { return "cudnn"; }
  DevBuf x, y, dx, dy, scale, bias, mean, var, saveMean, saveInv, dScale,
      dBias;

private:
  Impl &s_;
  TensorDesc x_, bn_;
};

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
  if (proc && std::getline(proc, line)) {
    size_t at = line.find("Kernel Module");
    if (at != std::string::npos) {
      std::istringstream is(line.substr(at + 13));
      is >> env.driver;
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
  std::unique_ptr<TileBench> bench;
  llvm::Error err = llvm::Error::success();
  if (method == "cudnn" && op.kind == "BatchNormalization") {
    auto b = std::make_unique<BatchNormBench>(s);
    err = b->build(op, tile);
    bench = std::move(b);
  } else if (method == "cudnn" && op.kind == "Conv") {
    auto b = std::make_unique<ConvBench>(s);
    err = b->build(g, op, tile, signature);
    bench = std::move(b);
  } else if (method == "cudnn") {
    auto b = std::make_unique<PoolBench>(s);
    err = b->build(g, op, tile, signature);
    bench = std::move(b);
  } else if (method == "cublas") {
    auto b = makeGemm(s, g, op, tile);
    if (!b)
      return b.takeError();
    bench = std::move(*b);
  } else {
    auto b = makeStream(s, g, op, tile);
    if (!b)
      return b.takeError();
    bench = std::move(*b);
  }
  if (err)
    return llvm::Error(std::move(err));
  if (!bench)
    return makeError(ExitCode::Internal, "no {} plan for the tile",
                     method.str());
  SOAP_CUDA(cudaStreamSynchronize(s.stream));
  return llvm::Expected<std::unique_ptr<TileBench>>(std::move(bench));
}

llvm::Expected<Seconds> GpuSession::time(TileBench &b, Pass p) {
  Impl &s = *impl_;
  if (!b.has(p))
    return 0.0;
  for (int i = 0; i < opts_.warmup; ++i)
    if (auto err = b.run(p))
      return llvm::Error(std::move(err));
  SOAP_CUDA(cudaStreamSynchronize(s.stream));
  std::vector<double> ms;
  for (int r = 0; r < std::max(1, opts_.repeats); ++r) {
    if (opts_.flushL2) {
      SOAP_CUDA(cudaMemsetAsync(s.l2.get(), r & 0xff, s.l2.bytes(), s.stream));
    }
    SOAP_CUDA(cudaEventRecord(s.e0, s.stream));
    if (auto err = b.run(p))
      return llvm::Error(std::move(err));
    SOAP_CUDA(cudaEventRecord(s.e1, s.stream));
    SOAP_CUDA(cudaEventSynchronize(s.e1));
    float t = 0;
    SOAP_CUDA(cudaEventElapsedTime(&t, s.e0, s.e1));
    ms.push_back(t);
  }
  return median(ms) * 1e-3;
}

llvm::Expected<Seconds> GpuSession::timeOnce(TileBench &b, const Pass *passes,
                                             int numPasses) {
  Impl &s = *impl_;
  SOAP_CUDA(cudaEventRecord(s.e0, s.stream));
  for (int i = 0; i < numPasses; ++i)
    if (b.has(passes[i]))
      if (auto err = b.run(passes[i]))
        return llvm::Error(std::move(err));
  SOAP_CUDA(cudaEventRecord(s.e1, s.stream));
  SOAP_CUDA(cudaEventSynchronize(s.e1));
  float t = 0;
  SOAP_CUDA(cudaEventElapsedTime(&t, s.e0, s.e1));
  return double(t) * 1e-3;
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
  std::vector<DType> inT, outT;
  for (ValueId v : op.inputs)
    inT.push_back(v == kNoValue ? DType::F32 : g.value(v).dtype);
  for (ValueId v : op.outputs)
    outT.push_back(v == kNoValue ? DType::F32 : g.value(v).dtype);
  for (int p = 0; p < 3; ++p) {
    auto t = time(**b, static_cast<Pass>(p));
    if (!t)
      return t.takeError();
    *out[p] = *t;
    Pass pass = static_cast<Pass>(p);
    bool none = pass == Pass::BackwardWeight && op.sem.weightInputs.empty();
    e.flops[p] = none ? 0 : op.sem.tileFlops(pass, tile);
    // What cuBLAS computed, where the IR splits the passes otherwise (the
    // second gradient of a product of two activations), so that fitting
    // the roofline to the entry divides the right FLOPs by the time.
    if (plan)
      e.flops[p] = plan->flops(pass);
    e.bytes[p] = none ? 0 : double(op.sem.tileBytes(pass, tile, inT, outT));
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
  return 2.0 * double(floats) * 4 / *t;
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
    out[name] = 2.0 * double(size) * double(size) * double(size) / *t;
  }
  return out;
}

} // namespace soap
