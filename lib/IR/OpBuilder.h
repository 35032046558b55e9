// Shared machinery for the op kinds' semantics builders (private to lib/IR).
#ifndef SOAP_IR_OPBUILDER_H
#define SOAP_IR_OPBUILDER_H

#include "soap/IR/Graph.h"
#include "soap/IR/OpRegistry.h"
#include "soap/Support/Error.h"

namespace soap {
namespace detail {

/// Accumulates an OpSemantics for one op.
class SemBuilder {
public:
  SemBuilder(const Op &op, const Graph &g);

  const Op &op;
  const Graph &graph;
  OpSemantics sem;

  /// The operand value, or nullptr when the optional operand is absent.
  const Value *in(size_t i) const;
  const Value *out(size_t j) const;
  size_t numIn() const { return op.inputs.size(); }
  size_t numOut() const { return op.outputs.size(); }
  /// Errors unless input i is present.
  llvm::Expected<const Value *> need(size_t i, llvm::StringRef what) const;
  /// Errors unless output j is present.
  llvm::Expected<const Value *> needOut(size_t j, llvm::StringRef what) const;

  int addLoop(std::string name, DimClass cls, int64_t size,
              bool splittable = true);
  /// The class an input's dim carries; `dflt` when unknown (weights,
  /// constants) or the dim is out of range.
  DimClass classOf(const Value *v, int64_t dim, DimClass dflt) const;

  void setInput(size_t i, std::vector<DimMap> dims);
  void setInputView(size_t i, std::vector<int64_t> viewShape,
                    std::vector<DimMap> dims);
  void setOutput(size_t j, std::vector<DimMap> dims);
  /// Maps input i by numpy broadcasting onto loops `outLoops` (one per
  /// output dim, right-aligned). Errors if not broadcastable.
  llvm::Error setBroadcastInput(size_t i, const std::vector<int> &outLoops,
                                const std::vector<int64_t> &outShape);

  uint64_t allLoops() const;
  void flops(Pass p, double coeff, uint64_t mask) {
    sem.flops[static_cast<int>(p)].push_back({coeff, mask});
  }
  /// Save operand for backward with its element size (or `bytesPerElem`).
  void saveInput(int i, double bytesPerElem = 0);
  void saveOutput(int j, double bytesPerElem = 0);

  /// Fills absent maps, weight and gradient inputs; checks ranks.
  llvm::Expected<OpSemantics> finish();
};

/// FLOPs and saved state of an LSTM step or layer: gate pre-activations from
/// the input and recurrent matmuls over (outer loops x gate x hidden), the
/// cell's point-wise work, and gates and cell states kept for backward.
void addLstmCosts(SemBuilder &b, uint64_t outer, int gate, int hidden,
                  int input, int recur, DType dt);

/// A normalised axis in [0, rank), or an error.
llvm::Expected<int64_t> normAxis(int64_t axis, int64_t rank,
                                 llvm::StringRef what);

/// The output's loops for an element-wise op with numpy broadcasting of its
/// first `numData` inputs (each mapped onto them; the outputs as the loops):
/// a dim's class is the one an activation operand carries there, Parameter
/// where only a weight indexes it (a bias).
llvm::Expected<std::vector<int>> broadcastLoops(SemBuilder &b,
                                                size_t numData);
/// An element-wise kind's nominal FLOPs per point and what its backward
/// needs ('i' inputs, 'o' output, 'm' a 1-byte mask, '-' nothing); false for
/// a kind that is not element-wise.
bool eltSpecCosts(llvm::StringRef kind, double &fwdFlops, double &bwdFlops,
                  char &saves);

void registerConvOps(OpRegistry &r);
void registerFusedOps(OpRegistry &r);
void registerLinearOps(OpRegistry &r);
void registerElementwiseOps(OpRegistry &r);
void registerNormOps(OpRegistry &r);
void registerShapeOps(OpRegistry &r);
void registerRnnOps(OpRegistry &r);

} // namespace detail
} // namespace soap

#endif // SOAP_IR_OPBUILDER_H
