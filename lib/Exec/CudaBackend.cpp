// The CUDA kernel backend: contractions (Gemm, MatMul, Conv) and the
// element-wise ops run as CUDA kernels on the GPU of the rank; every other op
// kind runs its CPU kernel. A task's operand boxes are staged to the device
// around each kernel, so the host stays the home of every buffer and the
// executor's data movement is the same for both backends.
#include "Kernels.h"

#include "CudaKernels.h"
#include "soap/Support/Error.h"
#include <cuda_runtime.h>
#include <memory>
#include <string>

namespace soap {
namespace exec {

namespace {

std::string pendingError;

void note(cudaError_t e, const char *what) {
  if (e != cudaSuccess && pendingError.empty())
    pendingError = std::string(what) + ": " + cudaGetErrorString(e);
}

/// A device copy of a host buffer; copied back by download().
class DeviceBuf {
public:
  explicit DeviceBuf(const Buf &b, bool upload = true) : n_(b.size()) {
    if (n_ == 0)
      return;
    note(cudaMalloc(&p_, n_ * sizeof(float)), "cudaMalloc");
    if (upload && p_)
      note(cudaMemcpy(p_, b.data.data(), n_ * sizeof(float),
                      cudaMemcpyHostToDevice),
           "cudaMemcpy");
    else if (p_)
      note(cudaMemset(p_, 0, n_ * sizeof(float)), "cudaMemset");
  }
  ~DeviceBuf() {
    if (p_)
      cudaFree(p_);
  }
  DeviceBuf(const DeviceBuf &) = delete;
  DeviceBuf &operator=(const DeviceBuf &) = delete;
  float *get() const { return p_; }
  void download(Buf &b) const {
    if (p_)
      note(cudaMemcpy(b.data.data(), p_, n_ * sizeof(float),
                      cudaMemcpyDeviceToHost),
           "cudaMemcpy");
  }

private:
  float *p_ = nullptr;
  size_t n_;
};

/// The launch descriptor of `tile` over `ops`; false when it exceeds the
/// descriptor's fixed sizes (the caller then runs the CPU kernel).
bool describe(const OpSemantics &sem, const Box &tile,
              const std::vector<Operand> &ops, cuda::DevSpace &s) {
  if (tile.rank() > size_t(cuda::kMaxLoops) ||
      ops.size() > size_t(cuda::kMaxOperands))
    return false;
  s = cuda::DevSpace();
  s.numLoops = static_cast<int>(tile.rank());
  s.numOperands = static_cast<int>(ops.size());
  s.points = 1;
  for (size_t l = 0; l < tile.rank(); ++l) {
    s.lo[l] = tile.lo[l];
    s.extent[l] = tile.hi[l] - tile.lo[l];
    s.points *= s.extent[l];
  }
  for (size_t o = 0; o < ops.size(); ++o) {
    const TensorMap &m = *ops[o].map;
    if (m.dims.size() > size_t(cuda::kMaxDims))
      return false;
    cuda::DevOperand &d = s.ops[o];
    d.numDims = static_cast<int>(m.dims.size());
    std::vector<int64_t> str = boxStrides(ops[o].box);
    for (size_t k = 0; k < m.dims.size(); ++k) {
      cuda::DevDim &dd = d.dims[k];
      for (int64_t &c : dd.coeff)
        c = 0;
      if (m.dims[k].full)
        return false;
      for (const IndexTerm &t : m.dims[k].terms)
        dd.coeff[t.loop] += t.coeff;
      dd.offset = m.dims[k].offset;
      dd.divisor = m.dims[k].divisor;
      dd.size = m.shape[k];
      dd.lo = ops[o].box.lo[k];
      dd.stride = str[k];
    }
  }
  return true;
}

float gemmAttr(const Op &op, const char *k) {
  return op.kind == "Gemm" ? static_cast<float>(op.getFloat(k, 1)) : 1.0f;
}

bool hasBias(const Op &op) { return op.input(2) != kNoValue; }

/// A contraction tile's index spaces for the CUDA kernels: `s` for the
/// product, `sb` for the bias (added once per partial-sum group; `bias`
/// says whether this tile adds it). False when a space is not one the
/// kernels take: the tile then runs on the CPU.
bool describeContraction(const OpSemantics &sem, const Op &op, const Task &t,
                         cuda::DevSpace &s, cuda::DevSpace &sb, bool &bias) {
  std::vector<Operand> ops{{&sem.outputs[0], t.out[0].box},
                           {&sem.inputs[0], t.in[0].box},
                           {&sem.inputs[1], t.in[1].box}};
  bias = hasBias(op) && firstOfPartialGroup(sem, t.loops, 0);
  return describe(sem, t.loops, ops, s) &&
         (!bias || describe(sem, collapse(t.loops, reducedMask(sem, 0)),
                            {{&sem.outputs[0], t.out[0].box},
                             {&sem.inputs[2], t.in[2].box}},
                            sb));
}

/// Runs the CPU kernel's pass on one task.
void onCpu(KernelCtx &ctx, Task &t, bool forward) {
  std::vector<Task> one{std::move(t)};
  KernelCtx c{ctx.graph, ctx.op, one, ctx.stats, ctx.seed, ctx.step};
  const Kernel *k = findKernel(ctx.op.kind, "cpu");
  (forward ? k->forward : k->backward)(c);
  t = std::move(one[0]);
}

void contractionForward(KernelCtx &ctx) {
  const OpSemantics &sem = ctx.op.sem;
  for (Task &t : ctx.tasks) {
    cuda::DevSpace s, sb;
    bool bias = false;
    if (!describeContraction(sem, ctx.op, t, s, sb, bias)) {
      onCpu(ctx, t, true);
      continue;
    }
    DeviceBuf y(t.out[0], false), a(t.in[0]), b(t.in[1]);
    cuda::contractionForward(s, y.get(), a.get(), b.get(),
                             gemmAttr(ctx.op, "alpha"));
    if (bias) {
      DeviceBuf c(t.in[2]);
      cuda::biasForward(sb, y.get(), c.get(), gemmAttr(ctx.op, "beta"));
    }
    y.download(t.out[0]);
    if (const char *e = cuda::lastError())
      note(cudaErrorLaunchFailure, e);
  }
}

void contractionBackward(KernelCtx &ctx) {
  const OpSemantics &sem = ctx.op.sem;
  for (Task &t : ctx.tasks) {
    cuda::DevSpace s, sb;
    bool bias = false;
    if (!describeContraction(sem, ctx.op, t, s, sb, bias)) {
      onCpu(ctx, t, false);
      continue;
    }
    DeviceBuf dy(t.gout[0]), a(t.in[0]), b(t.in[1]);
    DeviceBuf da(t.gin[0], false), db(t.gin[1], false);
    cuda::contractionBackward(s, dy.get(), a.get(), b.get(), da.get(), db.get(),
                              gemmAttr(ctx.op, "alpha"));
    da.download(t.gin[0]);
    db.download(t.gin[1]);
    if (bias) {
      DeviceBuf dc(t.gin[2], false);
      cuda::biasBackward(sb, dy.get(), dc.get(), gemmAttr(ctx.op, "beta"));
      dc.download(t.gin[2]);
    }
    if (const char *e = cuda::lastError())
      note(cudaErrorLaunchFailure, e);
  }
}

/// The CUDA kernel's function for an element-wise kind; nullopt for other
/// kinds and for Cast, which stays on the CPU (integer targets truncate
/// there).
std::optional<cuda::DevFn> devFn(llvm::StringRef kind) {
  if (kind == "Cast")
    return std::nullopt;
  return elemFnOf(std::string_view(kind.data(), kind.size()));
}

size_t numData(const Op &op) {
  return op.kind == "Expand" ? 1 : op.inputs.size();
}

std::vector<Operand> eltOperands(const Op &op, const Task &t) {
  std::vector<Operand> ops{{&op.sem.outputs[0], t.out[0].box}};
  for (size_t i = 0; i < numData(op); ++i)
    ops.push_back({&op.sem.inputs[i], t.in[i].box});
  return ops;
}

void eltForward(KernelCtx &ctx) {
  cuda::DevFn fn = *devFn(ctx.op.kind);
  ElemScalars sc = elemScalars(fn, [&](const char *name, double dflt) {
    return ctx.op.getFloat(name, dflt);
  });
  int n = static_cast<int>(numData(ctx.op));
  for (Task &t : ctx.tasks) {
    cuda::DevSpace s;
    if (!describe(ctx.op.sem, t.loops, eltOperands(ctx.op, t), s)) {
      onCpu(ctx, t, true);
      continue;
    }
    DeviceBuf y(t.out[0], false);
    std::vector<std::unique_ptr<DeviceBuf>> x;
    for (int i = 0; i < n; ++i)
      x.push_back(std::make_unique<DeviceBuf>(t.in[i]));
    auto ptr = [&](int i) { return i < n ? x[i]->get() : nullptr; };
    cuda::eltForward(s, fn, sc.a, sc.b, n, y.get(), ptr(0), ptr(1), ptr(2));
    y.download(t.out[0]);
    if (const char *e = cuda::lastError())
      note(cudaErrorLaunchFailure, e);
  }
}

void eltBackward(KernelCtx &ctx) {
  cuda::DevFn fn = *devFn(ctx.op.kind);
  ElemScalars sc = elemScalars(fn, [&](const char *name, double dflt) {
    return ctx.op.getFloat(name, dflt);
  });
  int n = static_cast<int>(numData(ctx.op));
  for (Task &t : ctx.tasks) {
    cuda::DevSpace s;
    if (!describe(ctx.op.sem, t.loops, eltOperands(ctx.op, t), s)) {
      onCpu(ctx, t, false);
      continue;
    }
    DeviceBuf y(t.out[0]), dy(t.gout[0]);
    std::vector<std::unique_ptr<DeviceBuf>> x, dx;
    for (int i = 0; i < n; ++i) {
      x.push_back(std::make_unique<DeviceBuf>(t.in[i]));
      dx.push_back(std::make_unique<DeviceBuf>(t.gin[i], false));
    }
    auto ptr = [&](int i) { return i < n ? x[i]->get() : nullptr; };
    auto dptr = [&](int i) { return i < n ? dx[i]->get() : nullptr; };
    cuda::eltBackward(s, fn, sc.a, sc.b, n, y.get(), dy.get(), ptr(0), ptr(1),
                      ptr(2), dptr(0), dptr(1), dptr(2));
    for (int i = 0; i < n; ++i)
      dx[i]->download(t.gin[i]);
    if (const char *e = cuda::lastError())
      note(cudaErrorLaunchFailure, e);
  }
}

const Kernel *withCheck(llvm::StringRef kind, Kernel &k, void (*f)(KernelCtx &),
                        void (*b)(KernelCtx &)) {
  k = {findKernel(kind, "cpu")->check, f, b};
  return &k;
}

} // namespace

const Kernel *findCudaKernel(llvm::StringRef kind) {
  static Kernel contraction, elementwise;
  if (kind == "Gemm" || kind == "MatMul" || kind == "Conv")
    return withCheck(kind, contraction, contractionForward,
                     contractionBackward);
  if (devFn(kind))
    return withCheck(kind, elementwise, eltForward, eltBackward);
  return nullptr;
}

llvm::Error initCudaBackend(int localRank) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0)
    return inputError("--backend cuda: no CUDA device ({})",
                      e == cudaSuccess ? "none found" : cudaGetErrorString(e));
  if ((e = cudaSetDevice(localRank % n)) != cudaSuccess)
    return inputError("--backend cuda: cudaSetDevice: {}",
                      cudaGetErrorString(e));
  return llvm::Error::success();
}

std::string takeCudaError() {
  std::string e;
  std::swap(e, pendingError);
  return e;
}

} // namespace exec
} // namespace soap
