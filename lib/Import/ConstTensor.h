// Small constant tensors and the interpreter that folds ONNX shape arithmetic
// (Shape/Gather/Concat/Reshape chains around flatten, attention and LSTM).
// Private to lib/Import.
#ifndef SOAP_IMPORT_CONSTTENSOR_H
#define SOAP_IMPORT_CONSTTENSOR_H

#include "llvm/ADT/ArrayRef.h"
#include "llvm/Support/Error.h"
#include <cstdint>
#include <onnx/onnx_pb.h>
#include <optional>
#include <string>
#include <vector>

namespace soap {
namespace import {

/// Folded tensors larger than this are not materialised: they become
/// constants with a known shape and no data.
constexpr int64_t kMaxFoldElements = int64_t(1) << 20;

bool isFloatElemType(int32_t elemType);
/// Element types the interpreter computes with.
bool isFoldableElemType(int32_t elemType);
/// "FLOAT", "INT64", ...
std::string elemTypeName(int32_t elemType);

/// A constant tensor. Integer and bool elements live in `ints`, floating
/// ones in `floats` (int64 does not fit a double exactly: Slice ends are
/// often INT64_MAX).
struct ConstTensor {
  int32_t elemType = onnx::TensorProto_DataType_FLOAT;
  std::vector<int64_t> dims;
  /// False when the values are not known (too large to keep).
  bool hasData = false;
  /// Without data, what is still known of the values: every element is
  /// `uniform` (ConstantOfShape), or the last two dims are nonzero exactly
  /// on and below the diagonal (Trilu of a nonzero uniform: a causal mask
  /// too large to materialise).
  std::optional<double> uniform;
  bool lowerTriangular = false;
  std::vector<int64_t> ints;
  std::vector<double> floats;

  bool isFloat() const { return isFloatElemType(elemType); }
  int64_t numElements() const;
  double getDouble(int64_t i) const {
    return isFloat() ? floats[i] : static_cast<double>(ints[i]);
  }
  int64_t getInt(int64_t i) const {
    return isFloat() ? static_cast<int64_t>(floats[i]) : ints[i];
  }
  /// Values as int64 (for shapes, axes, indices).
  std::vector<int64_t> asInts() const;
  std::vector<double> asDoubles() const;
  /// Allocates `n` zero elements of the storage that fits elemType.
  void allocate(int64_t n);
};

/// Product of dims, or nullopt when a dim is negative or it overflows.
std::optional<int64_t> elementCount(llvm::ArrayRef<int64_t> dims);

/// Whether a TensorProto carries its values (raw, typed or external data).
bool protoHasData(const onnx::TensorProto &t);
bool protoIsExternal(const onnx::TensorProto &t);
/// Bytes of one element of ONNX element type `t` (1 for unknown types).
int64_t elemBytes(int32_t t);
/// The stored data (raw_data, or the typed field the element type uses)
/// holds exactly the elements its dims need; external or absent data is
/// not checked. The error says what it holds and what is needed.
llvm::Error checkStoredSize(const onnx::TensorProto &t);

/// Reads a TensorProto's values. A tensor with no data, external data, an
/// element type the interpreter does not handle, or more than `maxElements`
/// elements gives a tensor with hasData == false. Errors (malformed data)
/// describe the problem only; the caller prefixes file and tensor.
llvm::Expected<ConstTensor> constFromProto(const onnx::TensorProto &t,
                                           int64_t maxElements);
/// Writes `c` (which must have data) as a TensorProto named `name`.
void constToProto(const ConstTensor &c, const std::string &name,
                  onnx::TensorProto &out);

/// A Slice normalised against the data shape (ONNX Slice-13 clamping): per
/// data dim, the first index read, the step and the number of elements.
struct SliceSpec {
  std::vector<int64_t> starts, steps, counts;
};
llvm::Expected<SliceSpec> normaliseSlice(llvm::ArrayRef<int64_t> dataDims,
                                         llvm::ArrayRef<int64_t> starts,
                                         llvm::ArrayRef<int64_t> ends,
                                         llvm::ArrayRef<int64_t> axes,
                                         llvm::ArrayRef<int64_t> steps);

/// Normalises `axes` against `rank` (negative counts from the end), sorted;
/// errors on out-of-range or repeated axes.
llvm::Expected<std::vector<int64_t>> normaliseAxes(std::vector<int64_t> axes,
                                                   int64_t rank);

enum class FoldStatus { Folded, TooLarge, NotFoldable };

/// Whether `n` is shape arithmetic that the interpreter can evaluate (default
/// domain only).
bool isFoldableOp(const onnx::NodeProto &n);

/// Evaluates node `n` on constant inputs (nullptr for an absent optional
/// input; every present input has data). Shape and Size are evaluated by the
/// caller, which knows shapes. On Folded, `outs` holds one tensor per node
/// output. TooLarge: an output would exceed `maxElements`. Errors describe
/// the problem only (the caller names file and node).
llvm::Expected<FoldStatus> foldNode(const onnx::NodeProto &n,
                                    llvm::ArrayRef<const ConstTensor *> ins,
                                    std::vector<ConstTensor> &outs,
                                    int64_t maxElements);

/// The int value of attribute `name`, or `dflt`.
int64_t intAttr(const onnx::NodeProto &n, const std::string &name,
                int64_t dflt);
/// The attribute `name`, or nullptr.
const onnx::AttributeProto *findAttr(const onnx::NodeProto &n,
                                     const std::string &name);

} // namespace import
} // namespace soap

#endif // SOAP_IMPORT_CONSTTENSOR_H
