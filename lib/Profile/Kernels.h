// soap-profile's own CUDA kernels, behind a plain C++ interface so that the
// host code around them builds with the host compiler's warnings.
#ifndef SOAP_PROFILE_KERNELS_H
#define SOAP_PROFILE_KERNELS_H

#include <cstdint>
#include <cuda_runtime_api.h>

namespace soap {
namespace gpu {

/// Uniform pseudo-random values in [0.5, 1.5) from `seed` (never zeros:
/// zeros can run faster than real data).
void fillF32(float *p, int64_t n, uint64_t seed, cudaStream_t s);
void fillF16(void *p, int64_t n, uint64_t seed, cudaStream_t s);
void fillBF16(void *p, int64_t n, uint64_t seed, cudaStream_t s);

/// The element-wise kernel: reads `nRead` floats of `src` once, writes
/// `nWrite` floats of `dst` once, with `fmaPerElement` fused multiply-adds
/// per element of the larger of the two. With fmaPerElement 0 and nRead ==
/// nWrite it is a copy (the bandwidth calibration).
void stream(const float *src, int64_t nRead, float *dst, int64_t nWrite,
            int fmaPerElement, int multiprocessors, cudaStream_t s);

/// Holds stream `s` until the host writes a non-zero value to `*release`
/// (mapped pinned memory), or until `timeoutNs` nanoseconds have passed, in
/// which case it writes 1 to `*timedOut` (also mapped). A timed run queued
/// behind it starts only once the host has enqueued all of it, so the events
/// around the run time the GPU's work and not the host's calls into cuBLAS
/// or cuDNN (what nvbench's blocking kernel does).
void hold(const volatile int *release, volatile int *timedOut,
          int64_t timeoutNs, cudaStream_t s);

} // namespace gpu
} // namespace soap

#endif // SOAP_PROFILE_KERNELS_H
