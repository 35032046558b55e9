// The constant-folding interpreter: evaluates the small integer (and float)
// tensor ops that PyTorch emits for shape arithmetic, with numpy broadcasting.
#include "FoldOps.h"

#include "soap/Support/Error.h"
#include <algorithm>
#include <cmath>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <set>

namespace soap {
namespace import {
namespace {

using TP = onnx::TensorProto;

const std::set<std::string> &foldableOps() {
  static const std::set<std::string> ops = {"Constant",    "ConstantOfShape",
                                            "Shape",       "Size",
                                            "Identity",    "Cast",
                                            "Neg",         "Abs",
                                            "Sqrt",        "Reciprocal",
                                            "Floor",       "Ceil",
                                            "Not",         "Add",
                                            "Sub",         "Mul",
                                            "Div",         "Pow",
                                            "Mod",         "Min",
                                            "Max",         "Equal",
                                            "Less",        "Greater",
                                            "LessOrEqual", "GreaterOrEqual",
                                            "And",         "Or",
                                            "Xor",         "Where",
                                            "Gather",      "Slice",
                                            "Concat",      "Unsqueeze",
                                            "Squeeze",     "Reshape",
                                            "Expand",      "Range",
                                            "Trilu",       "Transpose",
                                            "ScatterND",   "Cos",
                                            "Sin",         "MatMul"};
  return ops;
}

/// Copies `in` into `out` (same element order), with new dims.
bool reshapeTo(const ConstTensor &in, std::vector<int64_t> dims,
               ConstTensor &out) {
  auto n = elementCount(dims);
  if (!n || *n != in.numElements())
    return false;
  out = in;
  out.dims = std::move(dims);
  return true;
}

/// Ints of an optional input, or of attribute `attr`, or `dflt`.
std::vector<int64_t> intsOf(const onnx::NodeProto &n, Ins ins, size_t i,
                            const std::string &attr,
                            std::vector<int64_t> dflt = {}) {
  if (i < ins.size() && ins[i])
    return ins[i]->asInts();
  if (const onnx::AttributeProto *a = findAttr(n, attr))
    return {a->ints().begin(), a->ints().end()};
  return dflt;
}

llvm::Expected<FoldStatus> foldShapeOp(const onnx::NodeProto &n, Ins ins,
                                       ConstTensor &out, int64_t maxElements) {
  const std::string &op = n.op_type();
  const ConstTensor &a = *ins[0];
  int64_t rank = static_cast<int64_t>(a.dims.size());
  if (op == "Gather") {
    const ConstTensor &idx = *ins[1];
    int64_t axis = intAttr(n, "axis", 0);
    if (axis < 0)
      axis += rank;
    if (axis < 0 || axis >= rank)
      return inputError("Gather axis {} is out of range for rank {}",
                        intAttr(n, "axis", 0), rank);
    std::vector<int64_t> dims(a.dims.begin(), a.dims.begin() + axis);
    dims.insert(dims.end(), idx.dims.begin(), idx.dims.end());
    dims.insert(dims.end(), a.dims.begin() + axis + 1, a.dims.end());
    if (!allocateLike(out, a.elemType, dims, maxElements))
      return FoldStatus::TooLarge;
    int64_t outer =
        elementCount(llvm::ArrayRef<int64_t>(a.dims).take_front(axis))
            .value_or(0);
    int64_t inner =
        elementCount(llvm::ArrayRef<int64_t>(a.dims).drop_front(axis + 1))
            .value_or(0);
    int64_t ni = idx.numElements(), dim = a.dims[axis], o = 0;
    for (int64_t p = 0; p < outer; ++p)
      for (int64_t q = 0; q < ni; ++q) {
        int64_t k = idx.getInt(q);
        if (k < -dim || k >= dim)
          return inputError("Gather index {} is out of range for a dim of {}",
                            k, dim);
        if (k < 0)
          k += dim;
        for (int64_t r = 0; r < inner; ++r)
          setFrom(out, o++, a, (p * dim + k) * inner + r);
      }
    return FoldStatus::Folded;
  }
  if (op == "Slice") {
    auto spec = normaliseSlice(
        a.dims, intsOf(n, ins, 1, "starts"), intsOf(n, ins, 2, "ends"),
        intsOf(n, ins, 3, "axes"), intsOf(n, ins, 4, "steps"));
    if (!spec)
      return spec.takeError();
    if (!allocateLike(out, a.elemType, spec->counts, maxElements))
      return FoldStatus::TooLarge;
    std::vector<int64_t> inStrides = stridesOf(a.dims);
    int64_t total = out.numElements();
    for (int64_t i = 0; i < total; ++i) {
      int64_t lin = i, off = 0;
      for (int64_t d = rank - 1; d >= 0; --d) {
        int64_t idx = lin % spec->counts[d];
        lin /= spec->counts[d];
        off += (spec->starts[d] + idx * spec->steps[d]) * inStrides[d];
      }
      setFrom(out, i, a, off);
    }
    return FoldStatus::Folded;
  }
  if (op == "Concat") {
    int64_t axis = intAttr(n, "axis", 0);
    if (axis < 0)
      axis += rank;
    if (axis < 0 || axis >= rank)
      return inputError("Concat axis {} is out of range for rank {}",
                        intAttr(n, "axis", 0), rank);
    std::vector<int64_t> dims = a.dims;
    dims[axis] = 0;
    for (const ConstTensor *t : ins) {
      if (!t || t->dims.size() != a.dims.size())
        return inputError("Concat inputs differ in rank");
      for (int64_t d = 0; d < rank; ++d)
        if (d != axis && t->dims[d] != a.dims[d])
          return inputError("Concat inputs [{}] and [{}] differ off the axis",
                            fmt::join(a.dims, ", "), fmt::join(t->dims, ", "));
      dims[axis] += t->dims[axis];
    }
    if (!allocateLike(out, a.elemType, dims, maxElements))
      return FoldStatus::TooLarge;
    int64_t outer = elementCount(llvm::ArrayRef<int64_t>(dims).take_front(axis))
                        .value_or(0);
    int64_t o = 0;
    for (int64_t p = 0; p < outer; ++p)
      for (const ConstTensor *t : ins) {
        int64_t chunk = t->numElements() / std::max<int64_t>(outer, 1);
        for (int64_t r = 0; r < chunk; ++r)
          setFrom(out, o++, *t, p * chunk + r);
      }
    return FoldStatus::Folded;
  }
  if (op == "Unsqueeze" || op == "Squeeze") {
    std::vector<int64_t> axes = intsOf(n, ins, 1, "axes");
    std::vector<int64_t> dims;
    if (op == "Unsqueeze") {
      int64_t outRank = rank + static_cast<int64_t>(axes.size());
      auto norm = normaliseAxes(axes, outRank);
      if (!norm)
        return norm.takeError();
      size_t k = 0, j = 0;
      for (int64_t d = 0; d < outRank; ++d)
        dims.push_back(k < norm->size() && (*norm)[k] == d ? (++k, 1)
                                                           : a.dims[j++]);
    } else {
      if (axes.empty())
        for (int64_t d = 0; d < rank; ++d)
          if (a.dims[d] == 1)
            axes.push_back(d);
      auto norm = normaliseAxes(axes, rank);
      if (!norm)
        return norm.takeError();
      for (int64_t d = 0; d < rank; ++d) {
        bool sq = std::binary_search(norm->begin(), norm->end(), d);
        if (sq && a.dims[d] != 1)
          return inputError("Squeeze axis {} has size {}, not 1", d, a.dims[d]);
        if (!sq)
          dims.push_back(a.dims[d]);
      }
    }
    reshapeTo(a, dims, out);
    return FoldStatus::Folded;
  }
  if (op == "Reshape") {
    std::vector<int64_t> shape = ins[1]->asInts();
    bool allowZero = intAttr(n, "allowzero", 0) != 0;
    int64_t known = 1, inferAt = -1;
    for (size_t d = 0; d < shape.size(); ++d) {
      if (shape[d] == 0 && !allowZero) {
        if (d >= a.dims.size())
          return inputError("Reshape copies dim {} of a rank-{} tensor", d,
                            rank);
        shape[d] = a.dims[d];
      }
      if (shape[d] == -1) {
        if (inferAt >= 0)
          return inputError("Reshape target has more than one -1");
        inferAt = static_cast<int64_t>(d);
      } else if (shape[d] < 0) {
        return inputError("Reshape target dim {} is negative", shape[d]);
      } else {
        known *= shape[d];
      }
    }
    if (inferAt >= 0)
      shape[inferAt] = known ? a.numElements() / known : 0;
    if (!reshapeTo(a, shape, out))
      return inputError("Reshape of [{}] to [{}] changes the element count",
                        fmt::join(a.dims, ", "), fmt::join(shape, ", "));
    return FoldStatus::Folded;
  }
  if (op == "Expand") {
    ConstTensor shape;
    shape.elemType = TP::INT64;
    shape.dims = ins[1]->asInts();
    auto dims = broadcastDims({&a, &shape});
    if (!dims)
      return dims.takeError();
    if (!allocateLike(out, a.elemType, *dims, maxElements))
      return FoldStatus::TooLarge;
    for (int64_t i = 0, e = out.numElements(); i < e; ++i)
      setFrom(out, i, a, broadcastOffset(a, *dims, i));
    return FoldStatus::Folded;
  }
  if (op == "Transpose") {
    std::vector<int64_t> perm = intsOf(n, ins, 99, "perm");
    if (perm.empty())
      for (int64_t d = rank - 1; d >= 0; --d)
        perm.push_back(d);
    auto sorted = normaliseAxes(perm, rank);
    if (!sorted || static_cast<int64_t>(perm.size()) != rank) {
      if (!sorted)
        llvm::consumeError(sorted.takeError());
      return inputError("Transpose perm [{}] is not a permutation of rank {}",
                        fmt::join(perm, ", "), rank);
    }
    std::vector<int64_t> dims;
    for (int64_t p : perm)
      dims.push_back(a.dims[p]);
    if (!allocateLike(out, a.elemType, dims, maxElements))
      return FoldStatus::TooLarge;
    std::vector<int64_t> inStrides = stridesOf(a.dims);
    for (int64_t i = 0, e = out.numElements(); i < e; ++i) {
      int64_t lin = i, off = 0;
      for (int64_t d = rank - 1; d >= 0; --d) {
        off += (lin % dims[d]) * inStrides[perm[d]];
        lin /= dims[d];
      }
      setFrom(out, i, a, off);
    }
    return FoldStatus::Folded;
  }
  if (op == "Trilu") {
    if (rank < 2)
      return inputError("Trilu needs rank >= 2, got {}", rank);
    int64_t k = ins.size() > 1 && ins[1] ? ins[1]->getInt(0) : 0;
    bool upper = intAttr(n, "upper", 1) != 0;
    out = a;
    int64_t rows = a.dims[rank - 2], cols = a.dims[rank - 1];
    for (int64_t i = 0, e = a.numElements(); i < e; ++i) {
      int64_t c = i % cols, r = (i / cols) % rows;
      bool keep = upper ? c - r >= k : c - r <= k;
      if (!keep) {
        if (out.isFloat())
          out.floats[i] = 0;
        else
          out.ints[i] = 0;
      }
    }
    return FoldStatus::Folded;
  }
  if (op == "ScatterND") {
    // Swin's shifted-window attention mask: slices of a zero image written
    // with region labels, all from constants.
    const ConstTensor &idx = *ins[1], &upd = *ins[2];
    std::string reduction = "none";
    if (const onnx::AttributeProto *r = findAttr(n, "reduction"))
      reduction = r->s();
    if (reduction != "none" && reduction != "add" && reduction != "mul")
      return inputError("ScatterND reduction '{}' is not supported", reduction);
    int64_t q = static_cast<int64_t>(idx.dims.size());
    int64_t k = q ? idx.dims.back() : 0;
    if (q < 1 || k < 1 || k > rank)
      return inputError("ScatterND indices [{}] do not index data of rank {}",
                        fmt::join(idx.dims, ", "), rank);
    std::vector<int64_t> updDims(idx.dims.begin(), idx.dims.end() - 1);
    updDims.insert(updDims.end(), a.dims.begin() + k, a.dims.end());
    if (upd.dims != updDims)
      return inputError("ScatterND updates [{}] are not [{}]",
                        fmt::join(upd.dims, ", "), fmt::join(updDims, ", "));
    if (!allocateLike(out, a.elemType, a.dims, maxElements))
      return FoldStatus::TooLarge;
    for (int64_t i = 0, e = a.numElements(); i < e; ++i)
      setFrom(out, i, a, i);
    std::vector<int64_t> strides = stridesOf(a.dims);
    int64_t slice = strides[k - 1]; // elements of one indexed slice
    int64_t rows = idx.numElements() / k;
    for (int64_t r = 0; r < rows; ++r) {
      int64_t off = 0;
      for (int64_t d = 0; d < k; ++d) {
        int64_t j = idx.getInt(r * k + d);
        if (j < -a.dims[d] || j >= a.dims[d])
          return inputError("ScatterND index {} is out of range for a dim "
                            "of {}",
                            j, a.dims[d]);
        off += (j < 0 ? j + a.dims[d] : j) * strides[d];
      }
      for (int64_t x = 0; x < slice; ++x) {
        int64_t o = off + x, u = r * slice + x;
        if (reduction == "none") {
          setFrom(out, o, upd, u);
        } else if (out.isFloat()) {
          double v = upd.getDouble(u);
          out.floats[o] =
              reduction == "add" ? out.floats[o] + v : out.floats[o] * v;
        } else {
          int64_t v = upd.getInt(u);
          out.ints[o] = reduction == "add" ? out.ints[o] + v : out.ints[o] * v;
        }
      }
    }
    normalise(out);
    return FoldStatus::Folded;
  }
  return FoldStatus::NotFoldable;
}

} // namespace

bool isFoldableOp(const onnx::NodeProto &n) {
  return (n.domain().empty() || n.domain() == "ai.onnx") &&
         foldableOps().count(n.op_type());
}

llvm::Expected<FoldStatus> foldNode(const onnx::NodeProto &n, Ins ins,
                                    std::vector<ConstTensor> &outs,
                                    int64_t maxElements) {
  const std::string &op = n.op_type();
  outs.assign(1, ConstTensor());
  ConstTensor &out = outs[0];
  auto need = [&](size_t count) {
    if (ins.size() < count)
      return false;
    for (size_t i = 0; i < count; ++i)
      if (!ins[i])
        return false;
    return true;
  };
  if (op == "Constant") {
    if (const onnx::AttributeProto *a = findAttr(n, "value")) {
      auto c = constFromProto(a->t(), maxElements);
      if (!c)
        return c.takeError();
      out = std::move(*c);
      if (out.hasData)
        return FoldStatus::Folded;
      auto count = elementCount(out.dims);
      return count && *count > maxElements && protoHasData(a->t())
                 ? FoldStatus::TooLarge
                 : FoldStatus::NotFoldable;
    }
    out.hasData = true;
    if (const onnx::AttributeProto *a = findAttr(n, "value_float")) {
      out.elemType = TP::FLOAT;
      out.floats = {a->f()};
    } else if (const onnx::AttributeProto *a = findAttr(n, "value_floats")) {
      out.elemType = TP::FLOAT;
      out.floats.assign(a->floats().begin(), a->floats().end());
      out.dims = {static_cast<int64_t>(out.floats.size())};
    } else if (const onnx::AttributeProto *a = findAttr(n, "value_int")) {
      out.elemType = TP::INT64;
      out.ints = {a->i()};
    } else if (const onnx::AttributeProto *a = findAttr(n, "value_ints")) {
      out.elemType = TP::INT64;
      out.ints.assign(a->ints().begin(), a->ints().end());
      out.dims = {static_cast<int64_t>(out.ints.size())};
    } else {
      return FoldStatus::NotFoldable; // strings, sparse tensors
    }
    return FoldStatus::Folded;
  }
  if (op == "Shape" || op == "Size") {
    if (!need(1))
      return FoldStatus::NotFoldable;
    const std::vector<int64_t> &dims = ins[0]->dims;
    int64_t rank = static_cast<int64_t>(dims.size());
    out.elemType = TP::INT64;
    out.hasData = true;
    if (op == "Size") {
      out.ints = {ins[0]->numElements()};
      return FoldStatus::Folded;
    }
    int64_t start = intAttr(n, "start", 0), end = intAttr(n, "end", rank);
    start = std::clamp<int64_t>(start < 0 ? start + rank : start, 0, rank);
    end = std::clamp<int64_t>(end < 0 ? end + rank : end, 0, rank);
    for (int64_t d = start; d < end; ++d)
      out.ints.push_back(dims[d]);
    out.dims = {static_cast<int64_t>(out.ints.size())};
    return FoldStatus::Folded;
  }
  if (op == "ConstantOfShape") {
    if (!need(1))
      return FoldStatus::NotFoldable;
    std::vector<int64_t> dims = ins[0]->asInts();
    for (int64_t d : dims)
      if (d < 0)
        return inputError("ConstantOfShape dim {} is negative", d);
    ConstTensor value;
    value.elemType = TP::FLOAT;
    value.floats = {0.0};
    value.hasData = true;
    if (const onnx::AttributeProto *a = findAttr(n, "value")) {
      auto c = constFromProto(a->t(), 1);
      if (!c)
        return c.takeError();
      if (!c->hasData || c->numElements() != 1)
        return FoldStatus::NotFoldable;
      value = std::move(*c);
    }
    if (!allocateLike(out, value.elemType, dims, maxElements))
      return FoldStatus::TooLarge;
    for (int64_t i = 0, e = out.numElements(); i < e; ++i)
      setFrom(out, i, value, 0);
    return FoldStatus::Folded;
  }
  // Every other op needs its first input.
  if (!need(1))
    return FoldStatus::NotFoldable;
  const ConstTensor &a = *ins[0];
  if (op == "Identity") {
    out = a;
    return FoldStatus::Folded;
  }
  auto arith = foldArithmetic(n, ins, out, maxElements);
  if (!arith || *arith != FoldStatus::NotFoldable)
    return arith;
  if ((op == "Gather" || op == "Reshape" || op == "Expand") && !need(2))
    return FoldStatus::NotFoldable;
  if (op == "Concat" && !need(ins.size()))
    return FoldStatus::NotFoldable;
  if (op == "ScatterND" && !need(3))
    return FoldStatus::NotFoldable;
  if (op == "Slice" && ins.size() > 1 && !need(3))
    return FoldStatus::NotFoldable;
  return foldShapeOp(n, ins, out, maxElements);
}

} // namespace import
} // namespace soap
