// soap-profile's own CUDA kernels: random fills, the streaming element-wise
// kernel (16-byte accesses, a grid-stride loop) and the kernel that holds a
// stream while the host enqueues a timed run.
#include "Kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace soap {
namespace gpu {

namespace {

__device__ inline float hashUniform(uint64_t i, uint64_t seed) {
  uint64_t x = i * 0x9E3779B97F4A7C15ull + seed;
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return 0.5f + float(x >> 40) * (1.0f / 16777216.0f);
}

template <typename T> __device__ inline T fromFloat(float f);
template <> __device__ inline float fromFloat<float>(float f) { return f; }
template <> __device__ inline __half fromFloat<__half>(float f) {
  return __float2half(f);
}
template <> __device__ inline __nv_bfloat16 fromFloat<__nv_bfloat16>(float f) {
  return __float2bfloat16(f);
}

template <typename T>
__global__ void fillKernel(T *p, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    p[i] = fromFloat<T>(hashUniform(uint64_t(i), seed));
}

template <typename T>
void fill(T *p, int64_t n, uint64_t seed, cudaStream_t s) {
  if (n <= 0)
    return;
  int64_t blocks = (n + 255) / 256;
  fillKernel<T><<<unsigned(blocks < 65535 ? blocks : 65535), 256, 0, s>>>(
      p, n, seed);
}

/// `fma` fused multiply-adds on each of the four elements: four
/// independent chains, so they are not one latency-bound chain.
__device__ inline void work(float4 &a, int fma) {
  for (int k = 0; k < fma; ++k) {
    a.x = fmaf(a.x, 0.999f, 0.001f);
    a.y = fmaf(a.y, 0.999f, 0.001f);
    a.z = fmaf(a.z, 0.999f, 0.001f);
    a.w = fmaf(a.w, 0.999f, 0.001f);
  }
}

/// Vectors of 4 floats: n4 = max(read4, write4) work items. Item i reads
/// src[i] when i < read4 and writes dst[i] when i < write4; an item past
/// write4 writes only if its value equals `never` (inputs are in [0.5,
/// 1.5), so it never does), which keeps its reads and arithmetic alive.
__global__ void streamKernel(const float4 *__restrict__ src, int64_t read4,
                             float4 *__restrict__ dst, int64_t write4,
                             int64_t n4, int fma, float never) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n4;
       i += int64_t(gridDim.x) * blockDim.x) {
    float4 a = i < read4 ? src[i] : make_float4(1.f, 1.f, 1.f, 1.f);
    work(a, fma);
    if (i < write4)
      dst[i] = a;
    else if (a.x + a.y + a.z + a.w == never)
      dst[0] = a;
  }
}

__device__ inline uint64_t nowNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void holdKernel(const volatile int *release, volatile int *timedOut,
                           int64_t timeoutNs) {
  const uint64_t start = nowNs();
  while (*release == 0)
    if (int64_t(nowNs() - start) > timeoutNs) {
      *timedOut = 1;
      return;
    }
}

} // namespace

void hold(const volatile int *release, volatile int *timedOut,
          int64_t timeoutNs, cudaStream_t s) {
  holdKernel<<<1, 1, 0, s>>>(release, timedOut, timeoutNs);
}

void fillF32(float *p, int64_t n, uint64_t seed, cudaStream_t s) {
  fill(p, n, seed, s);
}
void fillF16(void *p, int64_t n, uint64_t seed, cudaStream_t s) {
  fill(static_cast<__half *>(p), n, seed, s);
}
void fillBF16(void *p, int64_t n, uint64_t seed, cudaStream_t s) {
  fill(static_cast<__nv_bfloat16 *>(p), n, seed, s);
}

void stream(const float *src, int64_t nRead, float *dst, int64_t nWrite,
            int fmaPerElement, int multiprocessors, cudaStream_t s) {
  int64_t read4 = (nRead + 3) / 4, write4 = (nWrite + 3) / 4;
  int64_t n4 = read4 > write4 ? read4 : write4;
  if (n4 == 0)
    return;
  // Enough blocks to fill every multiprocessor several times over, then a
  // grid-stride loop.
  int64_t blocks = (n4 + 255) / 256;
  int64_t cap = int64_t(multiprocessors) * 16;
  if (blocks > cap)
    blocks = cap;
  streamKernel<<<unsigned(blocks), 256, 0, s>>>(
      reinterpret_cast<const float4 *>(src), read4,
      reinterpret_cast<float4 *>(dst), write4, n4, fmaPerElement, -1.0f);
}

} // namespace gpu
} // namespace soap
