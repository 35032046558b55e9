// Element types, shapes and dimension classes.
#include "soap/IR/Types.h"

#include <fmt/format.h>

namespace soap {

int64_t dtypeBytes(DType t) {
  switch (t) {
  case DType::F32:
  case DType::I32:
    return 4;
  case DType::F16:
  case DType::BF16:
    return 2;
  case DType::F64:
  case DType::I64:
    return 8;
  case DType::I8:
  case DType::U8:
  case DType::Bool:
    return 1;
  }
  return 4;
}

static const char *kDTypeNames[] = {"f32", "f16", "bf16", "f64", "i64",
                                    "i32", "i8",  "u8",   "bool"};

llvm::StringRef dtypeName(DType t) { return kDTypeNames[static_cast<int>(t)]; }

llvm::StringRef precisionName(Precision p) {
  switch (p) {
  case Precision::BF16:
    return "bf16";
  case Precision::FP8:
    return "fp8";
  case Precision::FP32:
    break;
  }
  return "fp32";
}

std::optional<Precision> parsePrecision(llvm::StringRef name) {
  if (name == "fp32")
    return Precision::FP32;
  if (name == "bf16")
    return Precision::BF16;
  if (name == "fp8")
    return Precision::FP8;
  return std::nullopt;
}

std::optional<DType> parseDType(llvm::StringRef name) {
  for (int i = 0; i < 9; ++i)
    if (name == kDTypeNames[i])
      return static_cast<DType>(i);
  return std::nullopt;
}

bool isFloating(DType t) {
  return t == DType::F32 || t == DType::F16 || t == DType::BF16 ||
         t == DType::F64;
}

char dimClassLetter(DimClass c) { return "SAPR"[static_cast<int>(c)]; }

llvm::StringRef dimClassName(DimClass c) {
  static const char *names[] = {"sample", "attribute", "parameter",
                                "reduction"};
  return names[static_cast<int>(c)];
}

std::optional<int64_t> checkedMul(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r))
    return std::nullopt;
  return r;
}

std::optional<int64_t> checkedAdd(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r))
    return std::nullopt;
  return r;
}

std::optional<int64_t> TensorShape::numElements() const {
  int64_t n = 1;
  for (int64_t d : dims) {
    auto r = checkedMul(n, d);
    if (!r)
      return std::nullopt;
    n = *r;
  }
  return n;
}

std::string TensorShape::str() const {
  return fmt::format("[{}]", fmt::join(dims, ", "));
}

} // namespace soap
