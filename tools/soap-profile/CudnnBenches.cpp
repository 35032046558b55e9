// cuDNN benches of soap-profile: convolution (forward, backward-data,
// backward-filter and bias), pooling, and training-mode batch normalisation.
#include "GpuCommon.h"
#include "MeasurePlan.h"

namespace soap {
namespace gpu {

namespace {

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

llvm::Expected<std::unique_ptr<TileBench>>
makeConv(Impl &s, const Graph &g, const Op &op, const Box &tile,
         const std::string &signature) {
  auto b = std::make_unique<ConvBench>(s);
  if (auto err = b->build(g, op, tile, signature))
    return llvm::Error(std::move(err));
  return std::unique_ptr<TileBench>(std::move(b));
}

llvm::Expected<std::unique_ptr<TileBench>>
makePool(Impl &s, const Graph &g, const Op &op, const Box &tile,
         const std::string &signature) {
  auto b = std::make_unique<PoolBench>(s);
  if (auto err = b->build(g, op, tile, signature))
    return llvm::Error(std::move(err));
  return std::unique_ptr<TileBench>(std::move(b));
}

llvm::Expected<std::unique_ptr<TileBench>>
makeBatchNorm(Impl &s, const Op &op, const Box &tile) {
  auto b = std::make_unique<BatchNormBench>(s);
  if (auto err = b->build(op, tile))
    return llvm::Error(std::move(err));
  return std::unique_ptr<TileBench>(std::move(b));
}

} // namespace gpu
} // namespace soap
