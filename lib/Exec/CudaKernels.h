// The CUDA kernels' launch interface: plain descriptors of a tile's loop
// space and its operands' index maps (what PointIter walks on the CPU), so
// CudaKernels.cu needs no host library headers (private to lib/Exec).
#ifndef SOAP_EXEC_CUDAKERNELS_H
#define SOAP_EXEC_CUDAKERNELS_H

#include "ElementwiseFn.h"
#include <cstdint>

namespace soap {
namespace exec {
namespace cuda {

constexpr int kMaxLoops = 8;
constexpr int kMaxDims = 6;
constexpr int kMaxOperands = 5;

/// One tensor dim of an operand: index = floor((sum coeff[l] * i[l] +
/// offset) / divisor), outside [0, size) reads nothing; the buffer offset
/// is (index - lo) * stride.
struct DevDim {
  int64_t coeff[kMaxLoops];
  int64_t offset, divisor, size, lo, stride;
};

struct DevOperand {
  int numDims;
  DevDim dims[kMaxDims];
};

/// A box of an op's loop space (one thread per point) and its operands.
struct DevSpace {
  int numLoops;
  int numOperands;
  int64_t lo[kMaxLoops], extent[kMaxLoops];
  int64_t points;
  DevOperand ops[kMaxOperands];
};

/// Element-wise functions: the CPU kernels' list.
using DevFn = ElemFn;

// Launchers: device pointers; operand 0 is the output. Sums go through
// atomics, so results are reproducible only up to the order of float sums.

/// y[o0] += alpha * a[o1] * b[o2] (operands y, a, b).
void contractionForward(const DevSpace &s, float *y, const float *a,
                        const float *b, float alpha);
/// da[o1] += alpha * dy[o0] * b[o2]; db[o2] += alpha * dy[o0] * a[o1].
void contractionBackward(const DevSpace &s, const float *dy, const float *a,
                         const float *b, float *da, float *db, float alpha);
/// y[o0] += beta * c[o1] and dc[o1] += beta * dy[o0] (operands y, c).
void biasForward(const DevSpace &s, float *y, const float *c, float beta);
void biasBackward(const DevSpace &s, const float *dy, float *dc, float beta);
/// y[o0] = fn(x0[o1], x1[o2], x2[o3]) for `n` inputs.
void eltForward(const DevSpace &s, DevFn fn, float alpha, float beta, int n,
                float *y, const float *x0, const float *x1, const float *x2);
/// dxi[o(1+i)] += d fn / d xi * dy[o0] where dxi is set.
void eltBackward(const DevSpace &s, DevFn fn, float alpha, float beta, int n,
                 const float *y, const float *dy, const float *x0,
                 const float *x1, const float *x2, float *dx0, float *dx1,
                 float *dx2);

/// A short message for the last CUDA error, or nullptr if none.
const char *lastError();

} // namespace cuda
} // namespace exec
} // namespace soap

#endif // SOAP_EXEC_CUDAKERNELS_H
