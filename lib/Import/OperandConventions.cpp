// Operand conventions of the op registry: constant operands (Reshape's
// shape, Slice's starts, Squeeze's axes, ...) become attributes.
#include "ImportState.h"

#include "soap/Support/Error.h"
#include <algorithm>
#include <fmt/ranges.h>
#include <limits>
#include <tuple>

namespace soap {
namespace import {

bool isReduceOp(const std::string &op) {
  return llvm::StringRef(op).startswith("Reduce");
}

bool keepsOnlyData(const std::string &op) {
  return op == "Reshape" || op == "Slice" || op == "Squeeze" ||
         op == "Unsqueeze" || op == "Expand" || op == "Split" ||
         op == "Dropout" || op == "Clip" || isReduceOp(op);
}

llvm::Expected<std::vector<int64_t>>
ImportState::knownDims(const std::string &tensor) const {
  auto it = infos.find(tensor);
  if (it == infos.end() || !it->second.fullyKnown())
    return inputError("{}: {}: shape unknown after shape inference", path,
                      describe(tensor));
  return it->second.dims;
}

llvm::Expected<const ConstTensor *>
ImportState::constInput(int i, int k, llvm::StringRef what) const {
  const onnx::NodeProto &n = graph().node(i);
  if (k >= n.input_size() || n.input(k).empty())
    return nullptr;
  auto c = consts.find(n.input(k));
  if (c == consts.end() || !c->second.hasData)
    return inputError("{}: input '{}' ({}) must be a constant", where(i),
                      n.input(k), what.str());
  return &c->second;
}

llvm::Error applyConventions(const ImportState &s, int i, IrNode &ir) {
  const onnx::NodeProto &n = s.graph().node(i);
  const std::string &op = n.op_type();
  if (!(n.domain().empty() || n.domain() == "ai.onnx"))
    return llvm::Error::success();
  auto rankOf = [&](const std::string &t) -> llvm::Expected<int64_t> {
    auto d = s.knownDims(t);
    if (!d)
      return d.takeError();
    return static_cast<int64_t>(d->size());
  };
  auto ctx = [&](llvm::Error e) {
    return withContext(std::move(e), s.where(i) + ": ");
  };
  auto normAxis = [&](int64_t axis, int64_t rank) -> llvm::Expected<int64_t> {
    auto r = normaliseAxes({axis}, rank);
    if (!r)
      return ctx(r.takeError());
    return (*r)[0];
  };
  auto ints = [&](const std::string &attr) {
    const onnx::AttributeProto *a = findAttr(n, attr);
    return a ? std::vector<int64_t>(a->ints().begin(), a->ints().end())
             : std::vector<int64_t>();
  };
  // Integers of input k when present, else of attribute `attr` (older opsets).
  auto operandInts = [&](int k, const std::string &attr)
      -> llvm::Expected<std::optional<std::vector<int64_t>>> {
    auto c = s.constInput(i, k, attr);
    if (!c)
      return c.takeError();
    if (*c)
      return std::optional<std::vector<int64_t>>((*c)->asInts());
    if (findAttr(n, attr))
      return std::optional<std::vector<int64_t>>(ints(attr));
    return std::optional<std::vector<int64_t>>();
  };
  if (keepsOnlyData(op))
    ir.inputs.resize(std::min<size_t>(ir.inputs.size(), 1));
  if (n.input_size() == 0)
    return llvm::Error::success();
  const std::string &data = n.input(0);

  if (op == "Reshape") {
    auto out = s.knownDims(n.output(0));
    if (!out)
      return out.takeError();
    ir.attrs["shape"] = *out;
  } else if (op == "Slice") {
    auto dims = s.knownDims(data);
    if (!dims)
      return dims.takeError();
    auto starts = operandInts(1, "starts"), ends = operandInts(2, "ends"),
         axes = operandInts(3, "axes"), steps = operandInts(4, "steps");
    for (auto *e : {&starts, &ends, &axes, &steps})
      if (!*e)
        return e->takeError();
    if (!*starts || !*ends)
      return inputError("{}: Slice has no starts or ends", s.where(i));
    auto spec = normaliseSlice(*dims, **starts, **ends,
                               axes->value_or(std::vector<int64_t>()),
                               steps->value_or(std::vector<int64_t>()));
    if (!spec)
      return ctx(spec.takeError());
    ir.attrs["starts"] = spec->starts;
    ir.attrs["steps"] = spec->steps;
    ir.attrs.erase("ends");
    ir.attrs.erase("axes");
  } else if (op == "Squeeze" || op == "Unsqueeze") {
    auto axes = operandInts(1, "axes");
    if (!axes)
      return axes.takeError();
    auto inDims = s.knownDims(data);
    if (!inDims)
      return inDims.takeError();
    std::vector<int64_t> ax = axes->value_or(std::vector<int64_t>());
    int64_t rank = static_cast<int64_t>(inDims->size());
    if (op == "Squeeze" && ax.empty())
      for (int64_t d = 0; d < rank; ++d)
        if ((*inDims)[d] == 1)
          ax.push_back(d);
    if (op == "Unsqueeze")
      rank += static_cast<int64_t>(ax.size());
    auto norm = normaliseAxes(ax, rank);
    if (!norm)
      return ctx(norm.takeError());
    ir.attrs["axes"] = *norm;
  } else if (op == "Split") {
    auto inRank = rankOf(data);
    if (!inRank)
      return inRank.takeError();
    auto axis = normAxis(intAttr(n, "axis", 0), *inRank);
    if (!axis)
      return axis.takeError();
    std::vector<int64_t> sizes;
    for (const std::string &out : n.output()) {
      auto d = s.knownDims(out);
      if (!d)
        return d.takeError();
      sizes.push_back((*d)[*axis]);
    }
    ir.attrs["axis"] = *axis;
    ir.attrs["split"] = sizes;
    ir.attrs.erase("num_outputs");
  } else if (isReduceOp(op)) {
    auto axes = operandInts(1, "axes");
    if (!axes)
      return axes.takeError();
    auto rank = rankOf(data);
    if (!rank)
      return rank.takeError();
    std::vector<int64_t> ax = axes->value_or(std::vector<int64_t>());
    if (ax.empty() && !intAttr(n, "noop_with_empty_axes", 0))
      for (int64_t d = 0; d < *rank; ++d)
        ax.push_back(d);
    auto norm = normaliseAxes(ax, *rank);
    if (!norm)
      return ctx(norm.takeError());
    ir.attrs["axes"] = *norm;
    ir.attrs["keepdims"] = intAttr(n, "keepdims", 1);
  } else if (op == "Dropout") {
    double ratio = 0.5;
    if (const onnx::AttributeProto *a = findAttr(n, "ratio"))
      ratio = a->f();
    auto r = s.constInput(i, 1, "ratio");
    if (!r)
      return r.takeError();
    if (*r)
      ratio = (*r)->getDouble(0);
    auto t = s.constInput(i, 2, "training_mode");
    if (!t)
      return t.takeError();
    ir.attrs["ratio"] = ratio;
    ir.attrs["training_mode"] = *t ? int64_t((*t)->getInt(0) != 0) : int64_t(0);
  } else if (op == "Clip") {
    // Opset 11 made the bounds operands (ReLU6 exports them as constants);
    // before, attributes. Absent: unbounded.
    double lo = -std::numeric_limits<float>::infinity();
    double hi = std::numeric_limits<float>::infinity();
    if (const onnx::AttributeProto *a = findAttr(n, "min"))
      lo = a->f();
    if (const onnx::AttributeProto *a = findAttr(n, "max"))
      hi = a->f();
    // A bound is a folded constant, or a scalar initializer with data
    // (floating initializers are weights elsewhere, not folded).
    for (auto [k, v, what] :
         {std::make_tuple(1, &lo, "min"), std::make_tuple(2, &hi, "max")}) {
      if (k >= n.input_size() || n.input(k).empty())
        continue;
      auto init = s.initializers.find(n.input(k));
      if (init != s.initializers.end() && !s.consts.count(n.input(k))) {
        const onnx::TensorProto &t = s.graph().initializer(init->second);
        auto c = protoHasData(t) ? constFromProto(t, 1)
                                 : llvm::Expected<ConstTensor>(ConstTensor());
        if (!c)
          return ctx(c.takeError());
        if (!c->hasData || c->numElements() != 1)
          return inputError("{}: Clip's {} '{}' must be a scalar with its "
                            "value stored",
                            s.where(i), what, n.input(k));
        *v = c->getDouble(0);
        continue;
      }
      auto c = s.constInput(i, k, what);
      if (!c)
        return c.takeError();
      if ((*c)->numElements() != 1)
        return inputError("{}: Clip's {} must be a scalar", s.where(i), what);
      *v = (*c)->getDouble(0);
    }
    if (!(lo <= hi))
      return inputError("{}: Clip's min {} exceeds its max {}", s.where(i), lo,
                        hi);
    ir.attrs["min"] = lo;
    ir.attrs["max"] = hi;
  } else if (op == "Softmax" || op == "LogSoftmax" || op == "Hardmax" ||
             op == "LayerNormalization" || op == "Gather") {
    int64_t dflt = op == "Gather"                                ? 0
                   : op == "LayerNormalization" || s.opset >= 13 ? -1
                                                                 : 1;
    auto rank = rankOf(data);
    if (!rank)
      return rank.takeError();
    auto axis = normAxis(intAttr(n, "axis", dflt), *rank);
    if (!axis)
      return axis.takeError();
    ir.attrs["axis"] = *axis;
  } else if (op == "Concat") {
    auto rank = rankOf(n.output(0));
    if (!rank)
      return rank.takeError();
    auto axis = normAxis(intAttr(n, "axis", 0), *rank);
    if (!axis)
      return axis.takeError();
    ir.attrs["axis"] = *axis;
  } else if (op == "Flatten") {
    auto rank = rankOf(data);
    if (!rank)
      return rank.takeError();
    // Flatten's axis may equal the rank.
    auto axis = normAxis(intAttr(n, "axis", 1), *rank + 1);
    if (!axis)
      return axis.takeError();
    ir.attrs["axis"] = *axis;
  } else if (op == "Transpose") {
    auto rank = rankOf(data);
    if (!rank)
      return rank.takeError();
    std::vector<int64_t> perm = ints("perm");
    if (!findAttr(n, "perm"))
      for (int64_t d = *rank - 1; d >= 0; --d)
        perm.push_back(d);
    for (int64_t &p : perm)
      if (p < 0)
        p += *rank;
    std::vector<int64_t> sorted = perm;
    std::sort(sorted.begin(), sorted.end());
    bool isPerm = static_cast<int64_t>(sorted.size()) == *rank;
    for (int64_t d = 0; isPerm && d < *rank; ++d)
      isPerm = sorted[d] == d;
    if (!isPerm)
      return inputError("{}: perm [{}] is not a permutation of rank {}",
                        s.where(i), fmt::join(perm, ", "), *rank);
    ir.attrs["perm"] = perm;
  }
  return llvm::Error::success();
}

} // namespace import
} // namespace soap
