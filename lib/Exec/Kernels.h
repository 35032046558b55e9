// The CPU kernels of the reference executor, by op kind: each computes the
// tasks of one op on this rank in global coordinates (private to lib/Exec).
#ifndef SOAP_EXEC_KERNELS_H
#define SOAP_EXEC_KERNELS_H

#include "Tensor.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include <string>

namespace soap {
namespace exec {

struct Kernel {
  /// Errors (naming nothing; the caller prefixes the op) when an attribute
  /// or operand of `op` is outside what the kernel computes.
  llvm::Error (*check)(const Graph &g, const Op &op);
  /// Fills every task's `out` (reset to zeros over the output regions).
  void (*forward)(KernelCtx &ctx);
  /// Adds every task's input gradients to `gin` (reset to zeros over the
  /// input regions) from `gout` (the full gradient of the output regions).
  void (*backward)(KernelCtx &ctx);
  /// Whether backward skips an input whose gradient buffer is empty: the
  /// executor then leaves the gradients of graph inputs and constants
  /// unallocated, as a framework does for tensors that need no gradient
  /// (and as the simulator counts them: not at all).
  bool skipsEmptyGradients = false;
};

/// The kernel of an op kind on a backend ("cpu", "cuda"), or nullptr. The
/// CUDA backend answers with its own kernel where it has one, else the CPU's.
const Kernel *findKernel(llvm::StringRef kind, llvm::StringRef backend = "cpu");
/// The first error a backend met since the last call ("" if none).
std::string takeBackendError();
#ifdef SOAP_HAVE_CUDA
const Kernel *findCudaKernel(llvm::StringRef kind);
llvm::Error initCudaBackend(int localRank);
std::string takeCudaError();
#endif

// Per-family tables (one per file).
const Kernel *findLinearKernel(llvm::StringRef kind);
const Kernel *findPointwiseKernel(llvm::StringRef kind);
const Kernel *findNormKernel(llvm::StringRef kind);
const Kernel *findShapeKernel(llvm::StringRef kind);
const Kernel *findRnnKernel(llvm::StringRef kind);
const Kernel *findFusedKernel(llvm::StringRef kind);
const Kernel *findAttentionKernel(llvm::StringRef kind);

/// The reduced loops of output 0 as a mask, and whether `tile` starts at 0
/// in all of them (the one tile of a partial-sum group that adds a bias).
std::vector<bool> reducedMask(const OpSemantics &sem, int output);
bool firstOfPartialGroup(const OpSemantics &sem, const Box &tile, int output);
/// `tile` with the loops in `mask` collapsed to their first index.
Box collapse(const Box &tile, const std::vector<bool> &mask);
/// A map giving loop l's index as an offset (with box loopIndexBox).
TensorMap loopIndexMap(const OpSemantics &sem, int l);
Box loopIndexBox(const OpSemantics &sem, int l);
/// The statReduced loops of an op as a mask; `keep` is its complement.
std::vector<bool> statMask(const OpSemantics &sem);

/// Softmax (`log`: log-softmax) of ctx.op along its statReduced loops
/// (KernelsNorm.cpp): every task's out[0] from x[k] (task k's operand,
/// read through xMap), the row maxima and sums combined over the tiles
/// that share a row (KernelCtx::stats) when those loops are split.
void softmaxRows(KernelCtx &ctx, const TensorMap &xMap,
                 const std::vector<const Buf *> &x, bool log);
/// Its backward: adds to dx[k] the gradient of x from task k's gout[0] and
/// out[0], the rows' sums of dy ∘ y combined over the row's tiles.
void softmaxRowsBackward(KernelCtx &ctx, const TensorMap &dxMap,
                         const std::vector<Buf *> &dx, bool log);

} // namespace exec
} // namespace soap

#endif // SOAP_EXEC_KERNELS_H
