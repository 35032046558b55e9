// Internal to soap-profile's GPU code: CUDA, cuBLAS and cuDNN error
// checks, device buffers, the session's state, and the cuDNN benches'
// factories (CudnnBenches.cpp).
#ifndef SOAP_PROFILE_GPUCOMMON_H
#define SOAP_PROFILE_GPUCOMMON_H

#include "GpuSession.h"
#include "Kernels.h"
#include "soap/Support/Error.h"
#include "soap/Support/Statistics.h"
#include <algorithm>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <vector>

namespace soap {

inline llvm::Error cudaFail(const char *what, cudaError_t e) {
  cudaGetLastError(); // clear a sticky launch error where possible
  return makeError(ExitCode::Internal, "{}: {}", what, cudaGetErrorString(e));
}
inline llvm::Error blasFail(const char *what, cublasStatus_t st) {
  return makeError(ExitCode::Internal, "{}: cuBLAS status {}", what,
                   static_cast<int>(st));
}
inline llvm::Error dnnFail(const char *what, cudnnStatus_t st) {
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


inline std::vector<int64_t> shape(const Box &b) {
  std::vector<int64_t> s;
  for (size_t d = 0; d < b.rank(); ++d)
    s.push_back(b.hi[d] - b.lo[d]);
  return s;
}

struct GpuSession::Impl {
  int device = 0;
  cudaDeviceProp prop{};
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  cudnnHandle_t dnn = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  DevBuf workspace; ///< shared cuDNN workspace; grows in prepare only
  DevBuf l2;        ///< written to evict the L2 cache
  /// Mapped pinned memory for gpu::hold: [0] the release flag, [1] set when
  /// the hold timed out. `held` is false once holds have timed out three
  /// times (the host takes too long to enqueue a run): later runs are timed
  /// without.
  volatile int *gate = nullptr;
  volatile int *deviceGate = nullptr;
  bool held = true;
  int holdTimeouts = 0;
  std::string name;
  uint64_t seed = 1;
  bool tf32 = false;
  bool findAlgorithms = false;

  ~Impl() {
    if (gate)
      cudaFreeHost(const_cast<int *>(gate));
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

  /// `elements` of type `t` (f32, f16 or bf16), random.
  llvm::Error filledAs(DevBuf &b, size_t elements, DType t) {
    if (t == DType::F32)
      return filled(b, elements * 4);
    if (auto err = b.alloc(elements * 2))
      return err;
    int64_t cnt = int64_t(b.bytes() / 2);
    if (t == DType::F16)
      gpu::fillF16(b.get(), cnt, seed++, stream);
    else
      gpu::fillBF16(b.get(), cnt, seed++, stream);
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

namespace gpu {
using Impl = GpuSession::Impl;
/// cuDNN benches; errors when cuDNN refuses the tile or memory runs out.
llvm::Expected<std::unique_ptr<TileBench>>
makeConv(Impl &s, const Graph &g, const Op &op, const Box &tile,
         const std::string &signature);
llvm::Expected<std::unique_ptr<TileBench>>
makePool(Impl &s, const Graph &g, const Op &op, const Box &tile,
         const std::string &signature);
llvm::Expected<std::unique_ptr<TileBench>>
makeBatchNorm(Impl &s, const Graph &g, const Op &op, const Box &tile);
llvm::Expected<std::unique_ptr<TileBench>>
makeRnn(Impl &s, const Graph &g, const Op &op, const Box &tile);
} // namespace gpu

} // namespace soap

#endif // SOAP_PROFILE_GPUCOMMON_H
