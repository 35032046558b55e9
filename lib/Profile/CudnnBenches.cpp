// cuDNN benches of soap-profile: convolution (forward, backward-data,
// backward-filter and bias), pooling, training-mode batch normalisation, and
// the LSTM.
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

cudnnDataType_t dnnType(DType t) {
  return t == DType::BF16  ? CUDNN_DATA_BFLOAT16
         : t == DType::F16 ? CUDNN_DATA_HALF
                           : CUDNN_DATA_FLOAT;
}

struct TensorDesc {
  cudnnTensorDescriptor_t d = nullptr;
  ~TensorDesc() {
    if (d)
      cudnnDestroyTensorDescriptor(d);
  }
  llvm::Error set(const std::vector<int> &dims, DType t = DType::F32) {
    if (!d)
      SOAP_DNN(cudnnCreateTensorDescriptor(&d));
    std::vector<int> st = packed(dims);
    SOAP_DNN(cudnnSetTensorNdDescriptor(d, dnnType(t), int(dims.size()),
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
    const DType t = plan->dtype;
    type_ = t;
    int nsp = int(plan->window.size());
    if (auto err = x_.set(xd, t))
      return err;
    SOAP_DNN(cudnnCreateFilterDescriptor(&w_));
    SOAP_DNN(cudnnSetFilterNdDescriptor(w_, dnnType(t), CUDNN_TENSOR_NCHW,
                                        int(wd.size()), wd.data()));
    SOAP_DNN(cudnnCreateConvolutionDescriptor(&conv_));
    // f16 and bf16 accumulate in f32 (cuDNN's pseudo-half configurations)
    // on tensor cores, as frameworks run them; f32 without TF32 unless
    // --tf32.
    SOAP_DNN(cudnnSetConvolutionNdDescriptor(
        conv_, nsp, plan->pad.data(), plan->stride.data(),
        plan->dilation.data(), CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    SOAP_DNN(cudnnSetConvolutionGroupCount(conv_, plan->groups));
    SOAP_DNN(cudnnSetConvolutionMathType(conv_, t != DType::F32
                                                    ? CUDNN_TENSOR_OP_MATH
                                                : s_.tf32 ? CUDNN_DEFAULT_MATH
                                                          : CUDNN_FMA_MATH));
    std::vector<int> yd(xd.size());
    SOAP_DNN(cudnnGetConvolutionNdForwardOutputDim(conv_, x_.d, w_,
                                                   int(yd.size()), yd.data()));
    if (auto err = y_.set(yd, t))
      return err;
    bias_ = op.inputs.size() > 2 && op.inputs[2] != kNoValue &&
            op.sem.inputs[2].present;
    std::vector<int> bd(xd.size(), 1);
    bd[1] = yd[1];
    if (auto err = b_.set(bd, t))
      return err;
    weightPass_ = !op.sem.weightInputs.empty();
    for (auto [buf, n] :
         {std::pair{&x, floatsOf(xd)}, {&w, floatsOf(wd)}, {&b, floatsOf(bd)},
          {&y, floatsOf(yd)}, {&dx, floatsOf(xd)}, {&dw, floatsOf(wd)},
          {&db, floatsOf(bd)}, {&dy, floatsOf(yd)}})
      if (auto err = s_.filledAs(*buf, n, t))
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
      if (bias_ && type_ == DType::F32)
        SOAP_DNN(cudnnConvolutionBackwardBias(s_.dnn, &one, y_.d, dy.get(),
                                              &zero, b_.d, db.get()));
      else if (bias_) {
        // cuDNN has no f16/bf16 bias gradient: a framework sums dy over
        // the samples and pixels with its own reduction, one pass over dy,
        // which the streaming kernel times.
        gpu::stream(dy.f(), int64_t(dy.bytes() / 4), db.f(),
                    int64_t(db.bytes() / 4), 0, s_.prop.multiProcessorCount,
                    s_.stream);
        SOAP_CUDA(cudaGetLastError());
      }
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
  DType type_ = DType::F32;
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
  llvm::Error build(const Graph &g, const Op &op, const Box &tile) {
    // f16 and bf16 data with f32 statistics, scale and bias (cuDNN derives
    // their descriptor as f32).
    const DType t = g.value(op.outputs[0]).dtype;
    std::vector<int64_t> xs = shape(op.sem.inputRegion(0, tile));
    if (xs.size() < 2)
      return makeError(ExitCode::Internal, "unsupported batch-norm shape");
    int64_t rest = 1;
    for (size_t d = 3; d < xs.size(); ++d)
      rest *= xs[d];
    std::vector<int> xd = {int(xs[0]), int(xs[1]),
                           int(xs.size() > 2 ? xs[2] : 1), int(rest)};
    if (auto err = x_.set(xd, t))
      return err;
    SOAP_DNN(cudnnCreateTensorDescriptor(&bn_.d));
    SOAP_DNN(cudnnDeriveBNTensorDescriptor(bn_.d, x_.d, CUDNN_BATCHNORM_SPATIAL));
    size_t n = floatsOf(xd), c = size_t(xd[1]);
    for (DevBuf *buf : {&x, &y, &dx, &dy})
      if (auto err = s_.filledAs(*buf, n, t))
        return err;
    for (DevBuf *buf :
         {&scale, &bias, &mean, &var, &saveMean, &saveInv, &dScale, &dBias})
      if (auto err = s_.filled(*buf, c * 4))
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

/// A one-layer LSTM over the whole sequence through cuDNN's RNN API
/// (cudnnRNNForward in training mode, cudnnRNNBackwardData_v8,
/// cudnnRNNBackwardWeights_v8), as PyTorch runs nn.LSTM on a GPU: the
/// recurrence's step-by-step latency is in the time, which no streaming
/// bound has. Zero initial states; sequence-major packed data (frameworks
/// transpose batch-first input to it).
class RnnBench : public TileBench {
public:
  explicit RnnBench(Impl &s) : s_(s) {}
  ~RnnBench() override {
    if (rnn_)
      cudnnDestroyRNNDescriptor(rnn_);
    if (xd_)
      cudnnDestroyRNNDataDescriptor(xd_);
    if (yd_)
      cudnnDestroyRNNDataDescriptor(yd_);
    if (drop_)
      cudnnDestroyDropoutDescriptor(drop_);
  }

  llvm::Error build(const Graph &g, const Op &op, const Box &tile) {
    std::optional<RnnPlan> p = planRnn(g, op, tile);
    if (!p)
      return makeError(ExitCode::Internal, "unsupported LSTM tile");
    const cudnnDataType_t t = dnnType(p->dtype);
    // No dropout (one layer): a descriptor without RNG states.
    SOAP_DNN(cudnnCreateDropoutDescriptor(&drop_));
    SOAP_DNN(cudnnSetDropoutDescriptor(drop_, s_.dnn, 0.0f, nullptr, 0, 0));
    SOAP_DNN(cudnnCreateRNNDescriptor(&rnn_));
    SOAP_DNN(cudnnSetRNNDescriptor_v8(
        rnn_, CUDNN_RNN_ALGO_STANDARD, CUDNN_LSTM,
        p->bias ? CUDNN_RNN_DOUBLE_BIAS : CUDNN_RNN_NO_BIAS,
        p->dirs == 2 ? CUDNN_BIDIRECTIONAL : CUDNN_UNIDIRECTIONAL,
        CUDNN_LINEAR_INPUT, t, CUDNN_DATA_FLOAT,
        p->dtype != DType::F32 ? CUDNN_TENSOR_OP_MATH
        : s_.tf32              ? CUDNN_DEFAULT_MATH
                               : CUDNN_FMA_MATH,
        p->input, p->hidden, p->hidden, 1, drop_,
        CUDNN_RNN_PADDED_IO_DISABLED));
    std::vector<int> lengths(size_t(p->batch), p->seq);
    SOAP_DNN(cudnnCreateRNNDataDescriptor(&xd_));
    SOAP_DNN(cudnnSetRNNDataDescriptor(
        xd_, t, CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED, p->seq, p->batch,
        p->input, lengths.data(), nullptr));
    SOAP_DNN(cudnnCreateRNNDataDescriptor(&yd_));
    SOAP_DNN(cudnnSetRNNDataDescriptor(
        yd_, t, CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED, p->seq, p->batch,
        p->hidden * p->dirs, lengths.data(), nullptr));
    if (auto err = h_.set({p->dirs, p->batch, p->hidden}, p->dtype))
      return err;
    size_t wBytes = 0, workBytes = 0, reserveBytes = 0;
    SOAP_DNN(cudnnGetRNNWeightSpaceSize(s_.dnn, rnn_, &wBytes));
    SOAP_DNN(cudnnGetRNNTempSpaceSizes(s_.dnn, rnn_, CUDNN_FWD_MODE_TRAINING,
                                       xd_, &workBytes, &reserveBytes));
    const size_t es = p->dtype == DType::F32 ? 4 : 2;
    const size_t xs = size_t(p->seq) * size_t(p->batch) * size_t(p->input);
    const size_t ys =
        size_t(p->seq) * size_t(p->batch) * size_t(p->hidden) * size_t(p->dirs);
    for (auto [buf, n] : {std::pair{&x, xs},
                          {&dx, xs},
                          {&y, ys},
                          {&dy, ys},
                          {&w, wBytes / es},
                          {&dw, wBytes / es}})
      if (auto err = s_.filledAs(*buf, n, p->dtype))
        return err;
    if (auto err = reserve.alloc(reserveBytes))
      return err;
    if (auto err = seqLengths.alloc(lengths.size() * sizeof(int32_t)))
      return err;
    SOAP_CUDA(cudaMemcpyAsync(seqLengths.get(), lengths.data(),
                              lengths.size() * sizeof(int32_t),
                              cudaMemcpyHostToDevice, s_.stream));
    wBytes_ = wBytes;
    workBytes_ = workBytes;
    reserveBytes_ = reserveBytes;
    if (auto err = s_.ensureWorkspace(workBytes))
      return err;
    workspace = workBytes;
    // Backward-data reads what forward left in the reserve space, and
    // backward-weight what backward-data left: run the chain once.
    for (Pass pass : {Pass::Forward, Pass::BackwardData})
      if (auto err = run(pass))
        return err;
    SOAP_CUDA(cudaStreamSynchronize(s_.stream));
    return llvm::Error::success();
  }

  bool has(Pass) const override { return true; }
  llvm::Error run(Pass p) override {
    const int32_t *lens = static_cast<const int32_t *>(seqLengths.get());
    void *ws = s_.workspace.get();
    switch (p) {
    case Pass::Forward:
      SOAP_DNN(cudnnRNNForward(s_.dnn, rnn_, CUDNN_FWD_MODE_TRAINING, lens, xd_,
                               x.get(), yd_, y.get(), h_.d, nullptr, nullptr,
                               h_.d, nullptr, nullptr, wBytes_, w.get(),
                               workBytes_, ws, reserveBytes_, reserve.get()));
      break;
    case Pass::BackwardData:
      SOAP_DNN(cudnnRNNBackwardData_v8(
          s_.dnn, rnn_, lens, yd_, y.get(), dy.get(), xd_, dx.get(), h_.d,
          nullptr, nullptr, nullptr, h_.d, nullptr, nullptr, nullptr, wBytes_,
          w.get(), workBytes_, ws, reserveBytes_, reserve.get()));
      break;
    case Pass::BackwardWeight:
      SOAP_DNN(cudnnRNNBackwardWeights_v8(
          s_.dnn, rnn_, CUDNN_WGRAD_MODE_ADD, lens, xd_, x.get(), h_.d, nullptr,
          yd_, y.get(), wBytes_, dw.get(), workBytes_, ws, reserveBytes_,
          reserve.get()));
      break;
    }
    return llvm::Error::success();
  }
  const char *method() const override { return "cudnn"; }

  DevBuf x, dx, y, dy, w, dw, reserve, seqLengths;

private:
  Impl &s_;
  cudnnRNNDescriptor_t rnn_ = nullptr;
  cudnnRNNDataDescriptor_t xd_ = nullptr, yd_ = nullptr;
  cudnnDropoutDescriptor_t drop_ = nullptr;
  TensorDesc h_;
  size_t wBytes_ = 0, workBytes_ = 0, reserveBytes_ = 0;
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
makeBatchNorm(Impl &s, const Graph &g, const Op &op, const Box &tile) {
  auto b = std::make_unique<BatchNormBench>(s);
  if (auto err = b->build(g, op, tile))
    return llvm::Error(std::move(err));
  return std::unique_ptr<TileBench>(std::move(b));
}

llvm::Expected<std::unique_ptr<TileBench>>
makeRnn(Impl &s, const Graph &g, const Op &op, const Box &tile) {
  auto b = std::make_unique<RnnBench>(s);
  if (auto err = b->build(g, op, tile))
    return llvm::Error(std::move(err));
  return std::unique_ptr<TileBench>(std::move(b));
}

} // namespace gpu
} // namespace soap
