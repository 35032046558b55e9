// Element types, tensor shapes and loop-dimension classes of the IR.
#ifndef SOAP_IR_TYPES_H
#define SOAP_IR_TYPES_H

#include "llvm/ADT/StringRef.h"
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace soap {

enum class DType : uint8_t { F32, F16, BF16, F64, I64, I32, I8, U8, Bool };

/// Bytes of one element.
int64_t dtypeBytes(DType t);
llvm::StringRef dtypeName(DType t);

/// --precision: fp32 everywhere, or bf16 mixed precision (bf16 weights,
/// activations and gradients, fp32 master weights and optimizer state, as
/// Megatron-LM and DeepSpeed train), or fp8: bf16 mixed precision whose
/// linear layers' GEMMs run in FP8 as Transformer Engine's delayed-scaling
/// recipe runs them (Graph::setPrecision).
enum class Precision : uint8_t { FP32, BF16, FP8 };
llvm::StringRef precisionName(Precision p);
/// The amax history FP8 keeps per scaled tensor, as NVIDIA's Megatron-LM
/// and NeMo recipes set it (--fp8-amax-history-len 1024 with
/// --fp8-amax-compute-algo max): what the cost model reads and writes per
/// scaling update and what `soapc emit` writes.
constexpr int64_t kFp8AmaxHistory = 1024;
std::optional<Precision> parsePrecision(llvm::StringRef name);
std::optional<DType> parseDType(llvm::StringRef name);
bool isFloating(DType t);

/// The class of a loop dimension of an op (DESIGN.md, "The IR and op
/// semantics"): Sample (batch), Attribute (height, width, sequence), Parameter
/// (indexes weights: channels, hidden units, heads), Reduction (contracted).
enum class DimClass : uint8_t { Sample, Attribute, Parameter, Reduction };

/// One-letter name: S, A, P, R.
char dimClassLetter(DimClass c);
llvm::StringRef dimClassName(DimClass c);

/// A tensor shape: every dim known and positive in a verified graph.
struct TensorShape {
  std::vector<int64_t> dims;

  TensorShape() = default;
  TensorShape(std::vector<int64_t> d) : dims(std::move(d)) {}
  size_t rank() const { return dims.size(); }
  int64_t operator[](size_t i) const { return dims[i]; }
  /// Product of dims; nullopt when it overflows int64 (ONNX safe_math).
  std::optional<int64_t> numElements() const;
  bool operator==(const TensorShape &o) const { return dims == o.dims; }
  bool operator!=(const TensorShape &o) const { return dims != o.dims; }
  /// "[64, 3, 224, 224]"
  std::string str() const;
};

/// Overflow-checked int64 arithmetic for shape computations.
std::optional<int64_t> checkedMul(int64_t a, int64_t b);
std::optional<int64_t> checkedAdd(int64_t a, int64_t b);

} // namespace soap

#endif // SOAP_IR_TYPES_H
