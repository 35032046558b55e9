// Helpers shared by the folding interpreter's files (ShapeFolding.cpp,
// FoldArithmetic.cpp). Private to lib/Import.
#ifndef SOAP_IMPORT_FOLDOPS_H
#define SOAP_IMPORT_FOLDOPS_H

#include "ConstTensor.h"

namespace soap {
namespace import {

using Ins = llvm::ArrayRef<const ConstTensor *>;

/// Brings stored values to what the element type can hold (int32 wraps,
/// floats round to single precision, bools are 0/1).
void normalise(ConstTensor &c);
/// Float to int without undefined behaviour for NaN or out-of-range values.
int64_t toInt(double d);
/// out[i] = in[j], converting between integer and floating storage.
void setFrom(ConstTensor &out, int64_t i, const ConstTensor &in, int64_t j);
std::vector<int64_t> stridesOf(llvm::ArrayRef<int64_t> dims);
/// Allocates `out` with `dims`; false when it would exceed maxElements.
bool allocateLike(ConstTensor &out, int32_t elemType, std::vector<int64_t> dims,
                  int64_t maxElements);
/// The numpy broadcast of the operands' dims, or an error.
llvm::Expected<std::vector<int64_t>>
broadcastDims(llvm::ArrayRef<const ConstTensor *> ts);
/// Offset into `in` of the output element `linear` under broadcasting.
int64_t broadcastOffset(const ConstTensor &in, llvm::ArrayRef<int64_t> outDims,
                        int64_t linear);

/// Cast, unary and binary element-wise ops, comparisons, Where, Range and
/// MatMul; NotFoldable for any other op.
llvm::Expected<FoldStatus> foldArithmetic(const onnx::NodeProto &n, Ins ins,
                                          ConstTensor &out,
                                          int64_t maxElements);

} // namespace import
} // namespace soap

#endif // SOAP_IMPORT_FOLDOPS_H
