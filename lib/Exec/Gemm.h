// The CPU kernels' library calls. Contractions (Gemm, MatMul, and Conv
// where oneDNN's convolution does not take it) as batched matrix products
// in a BLAS (oneDNN's sgemm): a tile's
// loops are classified from the index maps into batch, rows, columns and
// contracted loops; operands whose buffers are plain strided matrices are
// used in place, others are packed (im2col for a convolution's input) and
// results scattered back (private to lib/Exec).
#ifndef SOAP_EXEC_GEMM_H
#define SOAP_EXEC_GEMM_H

#include "Tensor.h"
#include <cstdint>

namespace soap {
namespace exec {

/// A strided matrix: element (r, c) at p[r * rs + c * cs].
struct MatView {
  const float *p;
  int64_t rows, cols, rs, cs;

  MatView t() const { return {p, cols, rows, cs, rs}; }
};

/// Whether the library GEMM is built in (oneDNN found).
bool haveLibraryGemm();

/// C += alpha * A * B for strided views (C's pointer is written through).
/// Views with a unit stride go to the BLAS as they are; others are copied.
void matmulAcc(const MatView &c, const MatView &a, const MatView &b,
               float alpha);

/// The forward (Y += alpha * A * B over the tile) and backward (dA, dB) of a
/// task of a contraction `sem` (output 0 from inputs 0 and 1) through the
/// BLAS; false (nothing written) when a loop of the tile is none of batch,
/// row, column or contracted (the caller runs its generic loop nest).
bool gemmForward(const OpSemantics &sem, Task &t, float alpha);
bool gemmBackward(const OpSemantics &sem, Task &t, float alpha);

/// A Conv task through oneDNN's convolution primitives (forward; backward
/// data and weights); false (nothing added) when oneDNN is not built in or
/// does not take the tile's shape.
bool convForward(const OpSemantics &sem, Task &t);
bool convBackward(const OpSemantics &sem, Task &t);

/// Sets the threads of the CPU kernels' library (oneDNN's OpenMP pool).
void setKernelThreads(int n);

} // namespace exec
} // namespace soap

#endif // SOAP_EXEC_GEMM_H
