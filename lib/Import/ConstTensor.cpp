// Constant tensors of the importer: conversion from and to ONNX TensorProto,
// and the Slice / axes normalisation shared by folding and IR building.
#include "ConstTensor.h"

#include "soap/Support/Error.h"
#include <algorithm>
#include <cmath>
#include <cstring>
#include <fmt/format.h>
#include <fmt/ranges.h>

namespace soap {
namespace import {

using TP = onnx::TensorProto;

bool isFloatElemType(int32_t t) {
  return t == TP::FLOAT || t == TP::DOUBLE || t == TP::FLOAT16 ||
         t == TP::BFLOAT16;
}

bool isFoldableElemType(int32_t t) {
  switch (t) {
  case TP::FLOAT:
  case TP::DOUBLE:
  case TP::FLOAT16:
  case TP::BFLOAT16:
  case TP::INT64:
  case TP::INT32:
  case TP::INT16:
  case TP::INT8:
  case TP::UINT8:
  case TP::UINT16:
  case TP::UINT32:
  case TP::BOOL:
    return true;
  default:
    return false;
  }
}

std::string elemTypeName(int32_t t) {
  if (TP::DataType_IsValid(t))
    return TP::DataType_Name(static_cast<TP::DataType>(t));
  return "type " + std::to_string(t);
}

std::optional<int64_t> elementCount(llvm::ArrayRef<int64_t> dims) {
  int64_t n = 1;
  for (int64_t d : dims) {
    if (d < 0 || (d != 0 && n > INT64_MAX / d))
      return std::nullopt;
    n *= d;
  }
  return n;
}

int64_t ConstTensor::numElements() const {
  return elementCount(dims).value_or(0);
}

std::vector<int64_t> ConstTensor::asInts() const {
  std::vector<int64_t> r(numElements());
  for (size_t i = 0; i < r.size(); ++i)
    r[i] = getInt(static_cast<int64_t>(i));
  return r;
}

std::vector<double> ConstTensor::asDoubles() const {
  std::vector<double> r(numElements());
  for (size_t i = 0; i < r.size(); ++i)
    r[i] = getDouble(static_cast<int64_t>(i));
  return r;
}

void ConstTensor::allocate(int64_t n) {
  hasData = true;
  ints.clear();
  floats.clear();
  if (isFloat())
    floats.assign(n, 0.0);
  else
    ints.assign(n, 0);
}

bool protoIsExternal(const TP &t) {
  return t.has_data_location() && t.data_location() == TP::EXTERNAL;
}

llvm::Error checkStoredSize(const TP &t) {
  if (protoIsExternal(t))
    return llvm::Error::success();
  auto n = elementCount({t.dims().data(), static_cast<size_t>(t.dims_size())});
  if (!n)
    return llvm::Error::success(); // the dims are refused elsewhere
  auto dims = [&] { return fmt::format("[{}]", fmt::join(t.dims(), ", ")); };
  if (!t.raw_data().empty()) {
    int64_t eb = elemBytes(t.data_type());
    int64_t have = static_cast<int64_t>(t.raw_data().size());
    if (t.data_type() != TP::STRING && have != *n * eb)
      return inputError("raw_data holds {} bytes; dims {} of {} need {}", have,
                        dims(), elemTypeName(t.data_type()), *n * eb);
    return llvm::Error::success();
  }
  auto count = [&](int64_t have, const char *field) -> llvm::Error {
    if (have != 0 && have != *n)
      return inputError("{} holds {} values; dims {} need {}", field, have,
                        dims(), *n);
    return llvm::Error::success();
  };
  switch (t.data_type()) {
  case TP::FLOAT:
    return count(t.float_data_size(), "float_data");
  case TP::DOUBLE:
    return count(t.double_data_size(), "double_data");
  case TP::INT64:
    return count(t.int64_data_size(), "int64_data");
  case TP::UINT32:
  case TP::UINT64:
    return count(t.uint64_data_size(), "uint64_data");
  case TP::STRING:
    return count(t.string_data_size(), "string_data");
  default: // INT32, INT16, INT8, UINT16, UINT8, BOOL, FLOAT16, BFLOAT16
    return count(t.int32_data_size(), "int32_data");
  }
}

bool protoHasData(const TP &t) {
  if (protoIsExternal(t) || !t.raw_data().empty())
    return true;
  if (t.float_data_size() || t.int32_data_size() || t.int64_data_size() ||
      t.double_data_size() || t.uint64_data_size() || t.string_data_size())
    return true;
  // A tensor with no elements needs no data.
  auto n = elementCount({t.dims().data(), static_cast<size_t>(t.dims_size())});
  return n && *n == 0;
}

int64_t elemBytes(int32_t t) {
  switch (t) {
  case TP::DOUBLE:
  case TP::INT64:
  case TP::UINT64:
    return 8;
  case TP::FLOAT:
  case TP::INT32:
  case TP::UINT32:
    return 4;
  case TP::FLOAT16:
  case TP::BFLOAT16:
  case TP::INT16:
  case TP::UINT16:
    return 2;
  default:
    return 1;
  }
}

static double halfToDouble(uint16_t h) {
  int sign = (h >> 15) & 1, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  double v;
  if (exp == 0)
    v = std::ldexp(mant, -24);
  else if (exp == 31)
    v = mant ? NAN : INFINITY;
  else
    v = std::ldexp(mant + 1024, exp - 25);
  return sign ? -v : v;
}

static uint16_t doubleToHalf(double d) {
  // Round-to-nearest via float; adequate for the small constants folded here.
  float f = static_cast<float>(d);
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint16_t sign = (x >> 16) & 0x8000;
  int exp = static_cast<int>((x >> 23) & 0xff) - 127 + 15;
  uint32_t mant = x & 0x7fffff;
  if (std::isnan(f))
    return sign | 0x7e00;
  if (exp >= 31)
    return sign | 0x7c00;
  if (exp <= 0) {
    if (exp < -10)
      return sign;
    mant |= 0x800000;
    return sign | static_cast<uint16_t>(mant >> (14 - exp));
  }
  return sign | static_cast<uint16_t>(exp << 10) |
         static_cast<uint16_t>(mant >> 13);
}

static double bitsToDouble(int32_t t, uint64_t bits) {
  switch (t) {
  case TP::FLOAT: {
    uint32_t b = static_cast<uint32_t>(bits);
    float f;
    std::memcpy(&f, &b, 4);
    return f;
  }
  case TP::DOUBLE: {
    double d;
    std::memcpy(&d, &bits, 8);
    return d;
  }
  case TP::FLOAT16:
    return halfToDouble(static_cast<uint16_t>(bits));
  default: { // BFLOAT16: the top half of a float
    uint32_t b = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &b, 4);
    return f;
  }
  }
}

static int64_t bitsToInt(int32_t t, uint64_t bits) {
  switch (t) {
  case TP::INT8:
    return static_cast<int64_t>((bits & 0xff) ^ 0x80) -
           0x80; // sign-extend int8
  case TP::INT16:
    return static_cast<int16_t>(bits);
  case TP::INT32:
    return static_cast<int32_t>(bits);
  case TP::BOOL:
    return (bits & 0xff) != 0;
  case TP::UINT8:
    return static_cast<uint8_t>(bits);
  case TP::UINT16:
    return static_cast<uint16_t>(bits);
  case TP::UINT32:
    return static_cast<uint32_t>(bits);
  default:
    return static_cast<int64_t>(bits);
  }
}

llvm::Expected<ConstTensor> constFromProto(const TP &t, int64_t maxElements) {
  ConstTensor c;
  c.elemType = t.data_type();
  c.dims.assign(t.dims().begin(), t.dims().end());
  auto count = elementCount(c.dims);
  if (!count)
    return inputError("dims [{}] are negative or overflow int64",
                      fmt::join(c.dims, ", "));
  int64_t n = *count;
  if (!isFoldableElemType(c.elemType) || protoIsExternal(t) ||
      !protoHasData(t) || n > maxElements)
    return c;
  c.allocate(n);
  auto put = [&](int64_t i, double d, int64_t v, bool isDouble) {
    if (c.isFloat())
      c.floats[i] = isDouble ? d : static_cast<double>(v);
    else
      c.ints[i] = isDouble ? static_cast<int64_t>(d) : v;
  };
  auto mismatch = [&](int64_t have) {
    return inputError("holds {} values, its dims [{}] need {}", have,
                      fmt::join(c.dims, ", "), n);
  };
  if (!t.raw_data().empty()) {
    const std::string &raw = t.raw_data();
    int64_t eb = elemBytes(c.elemType);
    if (static_cast<int64_t>(raw.size()) != n * eb)
      return mismatch(static_cast<int64_t>(raw.size()) / eb);
    for (int64_t i = 0; i < n; ++i) {
      uint64_t bits = 0;
      for (int64_t b = 0; b < eb; ++b) // raw data is little-endian
        bits |= uint64_t(static_cast<uint8_t>(raw[i * eb + b])) << (8 * b);
      if (c.isFloat())
        c.floats[i] = bitsToDouble(c.elemType, bits);
      else
        c.ints[i] = bitsToInt(c.elemType, bits);
    }
    return c;
  }
  switch (c.elemType) {
  case TP::FLOAT:
    if (t.float_data_size() != n)
      return mismatch(t.float_data_size());
    for (int64_t i = 0; i < n; ++i)
      put(i, t.float_data(i), 0, true);
    break;
  case TP::DOUBLE:
    if (t.double_data_size() != n)
      return mismatch(t.double_data_size());
    for (int64_t i = 0; i < n; ++i)
      put(i, t.double_data(i), 0, true);
    break;
  case TP::INT64:
    if (t.int64_data_size() != n)
      return mismatch(t.int64_data_size());
    for (int64_t i = 0; i < n; ++i)
      put(i, 0, t.int64_data(i), false);
    break;
  case TP::UINT32:
    if (t.uint64_data_size() != n)
      return mismatch(t.uint64_data_size());
    for (int64_t i = 0; i < n; ++i)
      put(i, 0, static_cast<int64_t>(t.uint64_data(i)), false);
    break;
  default: // every other foldable type is stored in int32_data
    if (t.int32_data_size() != n)
      return mismatch(t.int32_data_size());
    for (int64_t i = 0; i < n; ++i) {
      uint64_t bits = static_cast<uint32_t>(t.int32_data(i));
      if (c.isFloat())
        c.floats[i] = bitsToDouble(c.elemType, bits);
      else
        c.ints[i] = bitsToInt(c.elemType, bits);
    }
  }
  return c;
}

void constToProto(const ConstTensor &c, const std::string &name, TP &out) {
  out.Clear();
  out.set_name(name);
  out.set_data_type(c.elemType);
  for (int64_t d : c.dims)
    out.add_dims(d);
  int64_t n = c.numElements();
  for (int64_t i = 0; i < n; ++i) {
    switch (c.elemType) {
    case TP::FLOAT:
      out.add_float_data(static_cast<float>(c.floats[i]));
      break;
    case TP::DOUBLE:
      out.add_double_data(c.floats[i]);
      break;
    case TP::INT64:
      out.add_int64_data(c.ints[i]);
      break;
    case TP::UINT32:
      out.add_uint64_data(static_cast<uint64_t>(c.ints[i]));
      break;
    case TP::FLOAT16:
      out.add_int32_data(doubleToHalf(c.floats[i]));
      break;
    case TP::BFLOAT16: {
      float f = static_cast<float>(c.floats[i]);
      uint32_t b;
      std::memcpy(&b, &f, 4);
      out.add_int32_data(static_cast<int32_t>(b >> 16));
      break;
    }
    default:
      out.add_int32_data(static_cast<int32_t>(c.ints[i]));
      break;
    }
  }
}

llvm::Expected<std::vector<int64_t>> normaliseAxes(std::vector<int64_t> axes,
                                                   int64_t rank) {
  for (int64_t &a : axes) {
    int64_t orig = a;
    if (a < 0)
      a += rank;
    if (a < 0 || a >= rank)
      return inputError("axis {} is out of range for rank {}", orig, rank);
  }
  std::sort(axes.begin(), axes.end());
  if (std::adjacent_find(axes.begin(), axes.end()) != axes.end())
    return inputError("axes [{}] repeat an axis", fmt::join(axes, ", "));
  return axes;
}

llvm::Expected<SliceSpec> normaliseSlice(llvm::ArrayRef<int64_t> dataDims,
                                         llvm::ArrayRef<int64_t> starts,
                                         llvm::ArrayRef<int64_t> ends,
                                         llvm::ArrayRef<int64_t> axesIn,
                                         llvm::ArrayRef<int64_t> stepsIn) {
  int64_t rank = static_cast<int64_t>(dataDims.size());
  size_t n = starts.size();
  if (ends.size() != n || (!axesIn.empty() && axesIn.size() != n) ||
      (!stepsIn.empty() && stepsIn.size() != n))
    return inputError("starts, ends, axes and steps differ in length");
  SliceSpec s;
  s.starts.assign(rank, 0);
  s.steps.assign(rank, 1);
  s.counts.assign(dataDims.begin(), dataDims.end());
  std::vector<bool> seen(rank, false);
  for (size_t i = 0; i < n; ++i) {
    int64_t axis = axesIn.empty() ? static_cast<int64_t>(i) : axesIn[i];
    if (axis < 0)
      axis += rank;
    if (axis < 0 || axis >= rank || seen[axis])
      return inputError("slice axis {} is out of range or repeated",
                        axesIn.empty() ? static_cast<int64_t>(i) : axesIn[i]);
    seen[axis] = true;
    int64_t dim = dataDims[axis];
    int64_t step = stepsIn.empty() ? 1 : stepsIn[i];
    if (step == 0)
      return inputError("slice step is 0");
    // Clamp before adding the dim so INT64_MIN/MAX sentinels cannot overflow.
    int64_t start = std::clamp<int64_t>(starts[i], -dim - 1, dim + 1);
    int64_t end = std::clamp<int64_t>(ends[i], -dim - 1, dim + 1);
    if (start < 0)
      start += dim;
    if (end < 0)
      end += dim;
    int64_t count;
    if (step > 0) {
      start = std::clamp<int64_t>(start, 0, dim);
      end = std::clamp<int64_t>(end, 0, dim);
      count = end > start ? (end - start + step - 1) / step : 0;
    } else {
      start = std::clamp<int64_t>(start, 0, dim - 1);
      end = std::clamp<int64_t>(end, -1, dim - 1);
      count = start > end ? (start - end - step - 1) / -step : 0;
    }
    s.starts[axis] = start;
    s.steps[axis] = step;
    s.counts[axis] = count;
  }
  return s;
}

const onnx::AttributeProto *findAttr(const onnx::NodeProto &n,
                                     const std::string &name) {
  for (const auto &a : n.attribute())
    if (a.name() == name)
      return &a;
  return nullptr;
}

int64_t intAttr(const onnx::NodeProto &n, const std::string &name,
                int64_t dflt) {
  const onnx::AttributeProto *a = findAttr(n, name);
  return a && a->has_i() ? a->i() : dflt;
}

} // namespace import
} // namespace soap
