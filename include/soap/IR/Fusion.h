// Kernel fusion (DESIGN.md, "The execution model"): the imported eager graph
// rewritten into the kernels production stacks run. Attention (Q·Kᵀ, scale,
// mask, softmax, dropout, ·V, the transposes around it, and the repeat of
// K and V to the query heads of grouped-query attention) becomes one
// FlashAttention op; RMSNorm and rotary embeddings written out as
// element-wise ops become RMSNormalization and RotaryEmbedding; every chain of element-wise ops whose intermediates
// nothing else reads (bias + GELU, bias + dropout + residual add) becomes
// one FusedElementwise op that reads its inputs once and writes its output
// once. What is computed is unchanged.
#ifndef SOAP_IR_FUSION_H
#define SOAP_IR_FUSION_H

#include "soap/IR/Graph.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include <memory>
#include <optional>

namespace soap {

/// --kernels: how the graph's ops map to kernels.
enum class KernelMode : uint8_t {
  Eager, ///< one kernel per ONNX op, as eager PyTorch runs the export
  Fused, ///< FlashAttention and fused element-wise epilogues
  /// Fused element-wise epilogues, attention as batched GEMMs around a
  /// softmax that keeps the scores: Megatron-LM before FlashAttention
  /// (the SC21 runs), or any stack without a fused attention kernel.
  NoFlash,
};
llvm::StringRef kernelModeName(KernelMode m);
/// "eager", "fused" or "no-flash".
std::optional<KernelMode> parseKernelMode(llvm::StringRef name);

/// What a rewrite did.
struct FusionStats {
  int attention = 0;        ///< attention patterns replaced
  int elementwise = 0;      ///< FusedElementwise ops made
  int elementwiseOps = 0;   ///< element-wise ops they replaced
  int transposes = 0;       ///< transposes folded into attention's layouts
  int groupedQuery = 0;     ///< attentions with K/V repeats absorbed (GQA)
  int rmsNorm = 0;          ///< RMSNorm patterns made RMSNormalization
  int rotary = 0;           ///< rotary patterns made RotaryEmbedding
  size_t opsBefore = 0, opsAfter = 0;
};

/// The fused graph of `g` (whose semantics are computed), with semantics
/// computed. Op names of the fused ops: "<scope>/FlashAttention" (the scope
/// of the softmax it replaces) and "<last member>/Fused"; every other op and
/// value keeps its name. `stats`, when given, says what was rewritten.
llvm::Expected<std::unique_ptr<Graph>>
fuseKernels(const Graph &g, FusionStats *stats = nullptr,
            KernelMode mode = KernelMode::Fused);

/// The element-wise kinds a FusedElementwise may contain.
bool isFusibleElementwise(llvm::StringRef kind);

} // namespace soap

#endif // SOAP_IR_FUSION_H
