// Element-wise folding: casts, unary and binary arithmetic with numpy
// broadcasting, comparisons, Where and Range, on small constant tensors;
// and MatMul of constants (the outer product of inverse frequencies and
// positions that transformers' rotary embedding computes in the graph).
#include "FoldOps.h"

#include "soap/Support/Error.h"
#include <algorithm>
#include <cmath>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <map>
#include <set>

namespace soap {
namespace import {

using TP = onnx::TensorProto;

void normalise(ConstTensor &c) {
  switch (c.elemType) {
  case TP::FLOAT:
    for (double &f : c.floats)
      f = static_cast<float>(f);
    break;
  case TP::INT32:
    for (int64_t &v : c.ints)
      v = static_cast<int32_t>(v);
    break;
  case TP::INT16:
    for (int64_t &v : c.ints)
      v = static_cast<int16_t>(v);
    break;
  case TP::INT8:
    for (int64_t &v : c.ints)
      v = ((v & 0xff) ^ 0x80) - 0x80; // int8 wrap-around
    break;
  case TP::UINT8:
    for (int64_t &v : c.ints)
      v = static_cast<uint8_t>(v);
    break;
  case TP::UINT16:
    for (int64_t &v : c.ints)
      v = static_cast<uint16_t>(v);
    break;
  case TP::UINT32:
    for (int64_t &v : c.ints)
      v = static_cast<uint32_t>(v);
    break;
  case TP::BOOL:
    for (int64_t &v : c.ints)
      v = v != 0;
    break;
  default:
    break;
  }
}

int64_t toInt(double d) {
  if (std::isnan(d))
    return 0;
  if (d >= 9.2233720368547758e18)
    return INT64_MAX;
  if (d <= -9.2233720368547758e18)
    return INT64_MIN;
  return static_cast<int64_t>(d);
}

void setFrom(ConstTensor &out, int64_t i, const ConstTensor &in, int64_t j) {
  if (out.isFloat())
    out.floats[i] = in.getDouble(j);
  else
    out.ints[i] = in.isFloat() ? toInt(in.floats[j]) : in.ints[j];
}

std::vector<int64_t> stridesOf(llvm::ArrayRef<int64_t> dims) {
  std::vector<int64_t> s(dims.size(), 1);
  for (int64_t d = static_cast<int64_t>(dims.size()) - 2; d >= 0; --d)
    s[d] = s[d + 1] * dims[d + 1];
  return s;
}

bool allocateLike(ConstTensor &out, int32_t elemType, std::vector<int64_t> dims,
                  int64_t maxElements) {
  auto n = elementCount(dims);
  if (!n || *n > maxElements)
    return false;
  out.elemType = elemType;
  out.dims = std::move(dims);
  out.allocate(*n);
  return true;
}

llvm::Expected<std::vector<int64_t>>
broadcastDims(llvm::ArrayRef<const ConstTensor *> ts) {
  size_t rank = 0;
  for (const ConstTensor *t : ts)
    rank = std::max(rank, t->dims.size());
  std::vector<int64_t> out(rank, 1);
  for (const ConstTensor *t : ts)
    for (size_t d = 0; d < t->dims.size(); ++d) {
      int64_t &o = out[rank - t->dims.size() + d];
      int64_t v = t->dims[d];
      if (o == 1)
        o = v;
      else if (v != 1 && v != o)
        return inputError("shapes [{}] do not broadcast",
                          fmt::join(t->dims, ", "));
    }
  return out;
}

int64_t broadcastOffset(const ConstTensor &in, llvm::ArrayRef<int64_t> outDims,
                        int64_t linear) {
  int64_t off = 0, stride = 1;
  size_t shift = outDims.size() - in.dims.size();
  for (int64_t d = static_cast<int64_t>(outDims.size()) - 1; d >= 0; --d) {
    int64_t idx = linear % outDims[d];
    linear /= outDims[d];
    if (d >= static_cast<int64_t>(shift)) {
      int64_t id = in.dims[d - shift];
      if (id != 1)
        off += idx * stride;
      stride *= id;
    }
  }
  return off;
}

static llvm::Expected<FoldStatus> binary(const std::string &op,
                                         const ConstTensor &a,
                                         const ConstTensor &b, ConstTensor &out,
                                         int64_t maxElements, bool fmodAttr) {
  auto dims = broadcastDims({&a, &b});
  if (!dims)
    return dims.takeError();
  static const std::set<std::string> cmp = {
      "Equal",          "Less", "Greater", "LessOrEqual",
      "GreaterOrEqual", "And",  "Or",      "Xor"};
  bool isCmp = cmp.count(op);
  if (!allocateLike(out, isCmp ? int32_t(TP::BOOL) : a.elemType, *dims,
                    maxElements))
    return FoldStatus::TooLarge;
  // Decode the op once, not per element.
  enum class Bin { Add, Sub, Mul, Div, Pow, Mod, Min, Max, Eq, Lt, Gt, Le, Ge,
                   And, Or, Xor };
  static const std::map<std::string, Bin> kBin = {
      {"Add", Bin::Add},         {"Sub", Bin::Sub},
      {"Mul", Bin::Mul},         {"Div", Bin::Div},
      {"Pow", Bin::Pow},         {"Mod", Bin::Mod},
      {"Min", Bin::Min},         {"Max", Bin::Max},
      {"Equal", Bin::Eq},        {"Less", Bin::Lt},
      {"Greater", Bin::Gt},      {"LessOrEqual", Bin::Le},
      {"GreaterOrEqual", Bin::Ge}, {"And", Bin::And},
      {"Or", Bin::Or},           {"Xor", Bin::Xor}};
  auto it = kBin.find(op);
  if (it == kBin.end())
    return FoldStatus::NotFoldable;
  Bin k = it->second;
  // What integers and reals share: order, comparison and logic.
  auto common = [k](auto x, auto y, auto &r) {
    switch (k) {
    case Bin::Min: r = std::min(x, y); return true;
    case Bin::Max: r = std::max(x, y); return true;
    case Bin::Eq: r = x == y; return true;
    case Bin::Lt: r = x < y; return true;
    case Bin::Gt: r = x > y; return true;
    case Bin::Le: r = x <= y; return true;
    case Bin::Ge: r = x >= y; return true;
    case Bin::And: r = (x != 0) && (y != 0); return true;
    case Bin::Or: r = (x != 0) || (y != 0); return true;
    case Bin::Xor: r = (x != 0) != (y != 0); return true;
    default: return false;
    }
  };
  bool fl = a.isFloat() || b.isFloat();
  if (fl && (k == Bin::And || k == Bin::Or || k == Bin::Xor))
    return FoldStatus::NotFoldable;
  int64_t n = out.numElements();
  for (int64_t i = 0; i < n; ++i) {
    int64_t ia = broadcastOffset(a, *dims, i),
            ib = broadcastOffset(b, *dims, i);
    if (fl) {
      double x = a.getDouble(ia), y = b.getDouble(ib), r = 0;
      if (!common(x, y, r)) {
        switch (k) {
        case Bin::Add: r = x + y; break;
        case Bin::Sub: r = x - y; break;
        case Bin::Mul: r = x * y; break;
        case Bin::Div: r = x / y; break;
        case Bin::Pow: r = std::pow(x, y); break;
        case Bin::Mod:
          r = fmodAttr ? std::fmod(x, y) : x - y * std::floor(x / y);
          break;
        default: return FoldStatus::NotFoldable;
        }
      }
      if (out.isFloat())
        out.floats[i] = r;
      else
        out.ints[i] = toInt(r);
      continue;
    }
    int64_t x = a.ints[ia], y = b.ints[ib], r = 0;
    if (!common(x, y, r)) {
      // Wrapping arithmetic through uint64 keeps overflow defined.
      auto ux = static_cast<uint64_t>(x), uy = static_cast<uint64_t>(y);
      switch (k) {
      case Bin::Add: r = static_cast<int64_t>(ux + uy); break;
      case Bin::Sub: r = static_cast<int64_t>(ux - uy); break;
      case Bin::Mul: r = static_cast<int64_t>(ux * uy); break;
      case Bin::Div:
      case Bin::Mod:
        if (y == 0)
          return inputError("integer {} by zero",
                            k == Bin::Div ? "division" : "modulo");
        if (x == INT64_MIN && y == -1)
          r = k == Bin::Div ? INT64_MIN : 0;
        else if (k == Bin::Div)
          r = x / y; // ONNX integer Div truncates, as C++ does
        else {
          r = x % y;
          if (!fmodAttr && r != 0 && ((r < 0) != (y < 0)))
            r += y; // Python-style: the sign of the divisor
        }
        break;
      case Bin::Pow: r = toInt(std::pow(double(x), double(y))); break;
      default: return FoldStatus::NotFoldable;
      }
    }
    out.ints[i] = r;
  }
  normalise(out);
  return FoldStatus::Folded;
}

static llvm::Expected<FoldStatus>
unary(const std::string &op, const ConstTensor &a, ConstTensor &out) {
  out = a;
  int64_t n = a.numElements();
  for (int64_t i = 0; i < n; ++i) {
    if (a.isFloat()) {
      double &x = out.floats[i];
      if (op == "Neg")
        x = -x;
      else if (op == "Abs")
        x = std::fabs(x);
      else if (op == "Sqrt")
        x = std::sqrt(x);
      else if (op == "Reciprocal")
        x = 1.0 / x;
      else if (op == "Floor")
        x = std::floor(x);
      else if (op == "Ceil")
        x = std::ceil(x);
      else if (op == "Cos") // rotary position tables
        x = std::cos(x);
      else if (op == "Sin")
        x = std::sin(x);
      else
        return FoldStatus::NotFoldable;
    } else {
      int64_t &x = out.ints[i];
      if (op == "Neg")
        x = static_cast<int64_t>(0 - static_cast<uint64_t>(x));
      else if (op == "Abs")
        x = x < 0 ? static_cast<int64_t>(0 - static_cast<uint64_t>(x)) : x;
      else if (op == "Not")
        x = !x;
      else if (op == "Floor" || op == "Ceil") {
      } else
        return FoldStatus::NotFoldable;
    }
  }
  normalise(out);
  return FoldStatus::Folded;
}

static bool present(Ins ins, size_t count) {
  if (ins.size() < count)
    return false;
  for (size_t i = 0; i < count; ++i)
    if (!ins[i])
      return false;
  return true;
}

/// numpy.matmul of two constants: a rank-1 operand is a row (left) or a
/// column (right) whose dim leaves the result; batch dims broadcast. Sums
/// run in double and are rounded to the element type once.
static llvm::Expected<FoldStatus> matMul(const ConstTensor &a,
                                         const ConstTensor &b, ConstTensor &out,
                                         int64_t maxElements) {
  if (a.dims.empty() || b.dims.empty())
    return inputError("MatMul of a scalar");
  ConstTensor l = a, r = b;
  if (l.dims.size() == 1)
    l.dims.insert(l.dims.begin(), 1);
  if (r.dims.size() == 1)
    r.dims.push_back(1);
  int64_t m = l.dims[l.dims.size() - 2], k = l.dims.back();
  int64_t k2 = r.dims[r.dims.size() - 2], n = r.dims.back();
  if (k != k2)
    return inputError("MatMul of [{}] and [{}]: inner dims differ",
                      fmt::join(a.dims, ", "), fmt::join(b.dims, ", "));
  // The batch dims broadcast as shapes of their own.
  ConstTensor lb, rb;
  lb.dims.assign(l.dims.begin(), l.dims.end() - 2);
  rb.dims.assign(r.dims.begin(), r.dims.end() - 2);
  auto batch = broadcastDims({&lb, &rb});
  if (!batch)
    return batch.takeError();
  std::vector<int64_t> dims = *batch;
  if (a.dims.size() > 1)
    dims.push_back(m);
  if (b.dims.size() > 1)
    dims.push_back(n);
  int32_t type = a.isFloat() || b.isFloat() ? (a.isFloat() ? a.elemType
                                                           : b.elemType)
                                            : a.elemType;
  if (!allocateLike(out, type, dims, maxElements))
    return FoldStatus::TooLarge;
  int64_t batches = elementCount(*batch).value_or(0);
  for (int64_t p = 0; p < batches; ++p) {
    int64_t lo = broadcastOffset(lb, *batch, p) * m * k;
    int64_t ro = broadcastOffset(rb, *batch, p) * k * n;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        int64_t o = (p * m + i) * n + j;
        if (out.isFloat()) {
          double acc = 0;
          for (int64_t q = 0; q < k; ++q)
            acc += l.getDouble(lo + i * k + q) * r.getDouble(ro + q * n + j);
          out.floats[o] = acc;
        } else {
          int64_t acc = 0;
          for (int64_t q = 0; q < k; ++q)
            acc += l.getInt(lo + i * k + q) * r.getInt(ro + q * n + j);
          out.ints[o] = acc;
        }
      }
  }
  normalise(out);
  return FoldStatus::Folded;
}

llvm::Expected<FoldStatus> foldArithmetic(const onnx::NodeProto &n, Ins ins,
                                          ConstTensor &out,
                                          int64_t maxElements) {
  const std::string &op = n.op_type();
  if (!present(ins, 1))
    return FoldStatus::NotFoldable;
  const ConstTensor &a = *ins[0];
  if (op == "Cast") {
    int32_t to = static_cast<int32_t>(intAttr(n, "to", 0));
    if (!isFoldableElemType(to))
      return FoldStatus::NotFoldable;
    if (!allocateLike(out, to, a.dims, maxElements))
      return FoldStatus::TooLarge;
    for (int64_t i = 0, e = out.numElements(); i < e; ++i) {
      if (to == TP::BOOL)
        out.ints[i] = a.getDouble(i) != 0;
      else
        setFrom(out, i, a, i);
    }
    normalise(out);
    return FoldStatus::Folded;
  }
  static const std::set<std::string> unaryOps = {
      "Neg", "Abs", "Sqrt", "Reciprocal", "Floor", "Ceil", "Not", "Cos", "Sin"};
  if (unaryOps.count(op))
    return unary(op, a, out);
  if (op == "Where") {
    if (!present(ins, 3))
      return FoldStatus::NotFoldable;
    auto dims = broadcastDims({ins[0], ins[1], ins[2]});
    if (!dims)
      return dims.takeError();
    if (!allocateLike(out, ins[1]->elemType, *dims, maxElements))
      return FoldStatus::TooLarge;
    for (int64_t i = 0, e = out.numElements(); i < e; ++i) {
      bool c = a.getDouble(broadcastOffset(a, *dims, i)) != 0;
      const ConstTensor &src = c ? *ins[1] : *ins[2];
      setFrom(out, i, src, broadcastOffset(src, *dims, i));
    }
    return FoldStatus::Folded;
  }
  if (op == "Range") {
    if (!present(ins, 3))
      return FoldStatus::NotFoldable;
    out.elemType = a.elemType;
    if (a.isFloat()) {
      double s = a.getDouble(0), l = ins[1]->getDouble(0),
             d = ins[2]->getDouble(0);
      if (d == 0)
        return inputError("Range delta is 0");
      double cnt = std::max(std::ceil((l - s) / d), 0.0);
      if (cnt > static_cast<double>(maxElements))
        return FoldStatus::TooLarge;
      out.dims = {static_cast<int64_t>(cnt)};
      out.allocate(out.dims[0]);
      for (int64_t i = 0; i < out.dims[0]; ++i)
        out.floats[i] = s + i * d;
    } else {
      int64_t s = a.getInt(0), l = ins[1]->getInt(0), d = ins[2]->getInt(0);
      if (d == 0)
        return inputError("Range delta is 0");
      // Counted in double: the int64 difference may overflow.
      double cnt =
          std::max(std::ceil((double(l) - double(s)) / double(d)), 0.0);
      if (cnt > static_cast<double>(maxElements))
        return FoldStatus::TooLarge;
      out.dims = {static_cast<int64_t>(cnt)};
      out.allocate(out.dims[0]);
      for (int64_t i = 0; i < out.dims[0]; ++i)
        out.ints[i] = s + i * d;
    }
    normalise(out);
    return FoldStatus::Folded;
  }
  if (op == "MatMul")
    return present(ins, 2) ? matMul(a, *ins[1], out, maxElements)
                           : FoldStatus::NotFoldable;
  static const std::set<std::string> binaryOps = {"Add",
                                                  "Sub",
                                                  "Mul",
                                                  "Div",
                                                  "Pow",
                                                  "Mod",
                                                  "Min",
                                                  "Max",
                                                  "Equal",
                                                  "Less",
                                                  "Greater",
                                                  "LessOrEqual",
                                                  "GreaterOrEqual",
                                                  "And",
                                                  "Or",
                                                  "Xor"};
  if (binaryOps.count(op)) {
    if (!present(ins, 2))
      return op == "Min" || op == "Max" ? (out = a, FoldStatus::Folded)
                                        : FoldStatus::NotFoldable;
    bool fmodAttr = intAttr(n, "fmod", 0) != 0;
    ConstTensor acc = a;
    // Min and Max are variadic: fold left to right.
    for (size_t i = 1; i < ins.size(); ++i) {
      if (!ins[i])
        return FoldStatus::NotFoldable;
      ConstTensor next;
      auto st = binary(op, acc, *ins[i], next, maxElements, fmodAttr);
      if (!st || *st != FoldStatus::Folded)
        return st;
      acc = std::move(next);
    }
    out = std::move(acc);
    return FoldStatus::Folded;
  }
  return FoldStatus::NotFoldable;
}

} // namespace import
} // namespace soap
