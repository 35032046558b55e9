// Data-movement ops. Transpose, Concat, Split and Slice are affine. Reshape,
// Flatten, Squeeze and Unsqueeze are not: their dims are matched in groups of
// equal product, and within a merge only the leading output dim may be split,
// in multiples of a granule that keeps every tile's input region a box.
#include "OpBuilder.h"

#include <numeric>

namespace soap {
namespace detail {

namespace {

llvm::Expected<OpSemantics> buildReshapeLike(const Op &op, const Graph &g) {
  SemBuilder b(op, g);
  auto x = b.need(0, "data");
  if (!x)
    return x.takeError();
  auto out0 = b.needOut(0, "Y");
  if (!out0)
    return out0.takeError();
  const Value &X = **x, &Y = **out0;
  const std::vector<int64_t> &in = X.shape.dims, &out = Y.shape.dims;
  if (X.shape.numElements() != Y.shape.numElements())
    return inputError("cannot reshape {} to {}", X.shape.str(), Y.shape.str());
  std::vector<DimMap> xm(in.size(), DimMap::constant(0));
  std::vector<int> loops(out.size(), -1);
  for (size_t o = 0; o < out.size(); ++o)
    loops[o] = b.addLoop("d" + std::to_string(o), DimClass::Attribute, out[o]);
  // Walk both shapes, skipping unit dims, pairing groups of equal product.
  size_t i = 0, o = 0;
  auto skipUnitIn = [&] {
    while (i < in.size() && in[i] == 1)
      ++i;
  };
  auto skipUnitOut = [&] {
    while (o < out.size() && out[o] == 1)
      ++o;
  };
  skipUnitIn();
  skipUnitOut();
  while (i < in.size() && o < out.size()) {
    size_t i0 = i, o0 = o;
    int64_t pi = in[i], po = out[o];
    while (pi != po) {
      if (pi < po) {
        do
          ++i;
        while (i < in.size() && in[i] == 1);
        pi *= in[i];
      } else {
        do
          ++o;
        while (o < out.size() && out[o] == 1);
        po *= out[o];
      }
    }
    size_t i1 = i, o1 = o; // inclusive ends
    // Linear index within the group, over the output loops.
    DimMap lin;
    int64_t stride = 1;
    for (size_t k = o1 + 1; k-- > o0;) {
      if (out[k] > 1)
        lin.terms.insert(lin.terms.begin(), {loops[k], stride});
      stride *= out[k];
    }
    int64_t inRest = 1;
    for (size_t k = i0 + 1; k <= i1; ++k)
      inRest *= in[k];
    int64_t outRest = stride / out[o0];
    DimMap lead = lin;
    lead.divisor = inRest;
    xm[i0] = lead;
    for (size_t k = i0 + 1; k <= i1; ++k)
      xm[k] = in[k] == 1 ? DimMap::constant(0) : DimMap::whole();
    DimClass cls = b.classOf(&X, i0, i0 == 0 ? DimClass::Sample
                                             : DimClass::Attribute);
    for (size_t k = o0; k <= o1; ++k) {
      LoopDim &l = b.sem.loops[loops[k]];
      // A sample dim split in two keeps one sample dim, the leading one.
      l.cls = k != o0 && cls == DimClass::Sample ? DimClass::Attribute : cls;
      // Only the group's leading dim can be split into box regions.
      if (k != o0)
        l.splittable = false;
    }
    LoopDim &leadLoop = b.sem.loops[loops[o0]];
    leadLoop.granule = inRest / std::gcd(outRest, inRest);
    if (leadLoop.granule >= leadLoop.size)
      leadLoop.splittable = false;
    ++i;
    ++o;
    skipUnitIn();
    skipUnitOut();
  }
  b.setInput(0, xm);
  std::vector<DimMap> ym;
  for (int l : loops)
    ym.push_back(DimMap::loop(l));
  b.setOutput(0, ym);
  return b.finish();
}

llvm::Expected<OpSemantics> buildTranspose(const Op &op, const Graph &g) {
  SemBuilder b(op, g);
  auto x = b.need(0, "data");
  if (!x)
    return x.takeError();
  const Value &X = **x;
  int64_t rank = X.shape.rank();
  std::vector<int64_t> perm = op.getInts("perm");
  if (perm.empty())
    for (int64_t d = rank - 1; d >= 0; --d)
      perm.push_back(d);
  std::vector<int64_t> sorted = perm;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t d = 0; d < rank; ++d)
    if (static_cast<int64_t>(sorted.size()) != rank || sorted[d] != d)
      return inputError("perm is not a permutation of {} dims", rank);
  std::vector<DimMap> xm(rank), ym;
  for (int64_t k = 0; k < rank; ++k) {
    int l = b.addLoop("d" + std::to_string(k),
                      b.classOf(&X, perm[k], DimClass::Attribute),
                      X.shape[perm[k]]);
    xm[perm[k]] = DimMap::loop(l);
    ym.push_back(DimMap::loop(l));
  }
  b.setInput(0, xm);
  b.setOutput(0, ym);
  return b.finish();
}

llvm::Expected<OpSemantics> buildConcat(const Op &op, const Graph &g) {
  SemBuilder b(op, g);
  auto out0 = b.needOut(0, "Y");
  if (!out0)
    return out0.takeError();
  const Value &Y = **out0;
  int64_t rank = Y.shape.rank();
  auto axis = normAxis(op.getInt("axis", 0), rank, "axis");
  if (!axis)
    return axis.takeError();
  const Value *first = b.in(0);
  std::vector<int> loops;
  for (int64_t d = 0; d < rank; ++d)
    loops.push_back(b.addLoop("d" + std::to_string(d),
                              b.classOf(first, d, DimClass::Attribute),
                              Y.shape[d]));
  int64_t offset = 0;
  for (size_t i = 0; i < b.numIn(); ++i) {
    auto v = b.need(i, "part");
    if (!v)
      return v.takeError();
    if (static_cast<int64_t>((*v)->shape.rank()) != rank)
      return inputError("part '{}' {} has the wrong rank", (*v)->name,
                        (*v)->shape.str());
    std::vector<DimMap> m;
    for (int64_t d = 0; d < rank; ++d)
      m.push_back(DimMap::loop(loops[d], 1, d == *axis ? -offset : 0));
    b.setInput(i, m);
    offset += (*v)->shape[*axis];
  }
  if (offset != Y.shape[*axis])
    return inputError("parts sum to {} along axis {}, output has {}", offset,
                      *axis, Y.shape[*axis]);
  std::vector<DimMap> ym;
  for (int l : loops)
    ym.push_back(DimMap::loop(l));
  b.setOutput(0, ym);
  return b.finish();
}

llvm::Expected<OpSemantics> buildSplit(const Op &op, const Graph &g) {
  SemBuilder b(op, g);
  auto x = b.need(0, "input");
  if (!x)
    return x.takeError();
  const Value &X = **x;
  int64_t rank = X.shape.rank();
  auto axis = normAxis(op.getInt("axis", 0), rank, "axis");
  if (!axis)
    return axis.takeError();
  std::vector<int> loops;
  for (int64_t d = 0; d < rank; ++d)
    loops.push_back(b.addLoop("d" + std::to_string(d),
                              b.classOf(&X, d, DimClass::Attribute),
                              X.shape[d]));
  std::vector<DimMap> xm;
  for (int l : loops)
    xm.push_back(DimMap::loop(l));
  b.setInput(0, xm);
  int64_t offset = 0;
  for (size_t j = 0; j < b.numOut(); ++j) {
    const Value *y = b.out(j);
    if (!y)
      return inputError("Split output {} is absent", j);
    std::vector<DimMap> m;
    for (int64_t d = 0; d < rank; ++d)
      m.push_back(DimMap::loop(loops[d], 1, d == *axis ? -offset : 0));
    // Output extent along the axis is its own size, not the loop's.
    b.setOutput(j, m);
    b.sem.outputs[j].shape = y->shape.dims;
    offset += y->shape[*axis];
  }
  if (offset != X.shape[*axis])
    return inputError("outputs sum to {} along axis {}, input has {}", offset,
                      *axis, X.shape[*axis]);
  return b.finish();
}

llvm::Expected<OpSemantics> buildSlice(const Op &op, const Graph &g) {
  SemBuilder b(op, g);
  auto x = b.need(0, "data");
  if (!x)
    return x.takeError();
  auto out0 = b.needOut(0, "Y");
  if (!out0)
    return out0.takeError();
  const Value &X = **x, &Y = **out0;
  int64_t rank = X.shape.rank();
  std::vector<int64_t> starts = op.getInts("starts"), steps = op.getInts("steps");
  if (static_cast<int64_t>(starts.size()) != rank ||
      static_cast<int64_t>(steps.size()) != rank ||
      static_cast<int64_t>(Y.shape.rank()) != rank)
    return inputError("Slice needs normalised starts and steps for all {} "
                      "dims",
                      rank);
  std::vector<DimMap> xm, ym;
  for (int64_t d = 0; d < rank; ++d) {
    int64_t last = starts[d] + steps[d] * (Y.shape[d] - 1);
    if (steps[d] == 0 || starts[d] < 0 || starts[d] >= X.shape[d] ||
        last < 0 || last >= X.shape[d])
      return inputError("slice of dim {} (start {}, step {}, {} elements) is "
                        "outside {}",
                        d, starts[d], steps[d], Y.shape[d], X.shape.str());
    int l = b.addLoop("d" + std::to_string(d),
                      b.classOf(&X, d, DimClass::Attribute), Y.shape[d]);
    xm.push_back(DimMap::loop(l, steps[d], starts[d]));
    ym.push_back(DimMap::loop(l));
  }
  b.setInput(0, xm);
  b.setOutput(0, ym);
  return b.finish();
}

/// Constant-mode Pad: output index = input index + padBegin, so a tile's
/// input region is its output box shifted and clamped (pads read nothing).
/// The pads come from the `pads` attribute or a constant second operand.
llvm::Expected<OpSemantics> buildPad(const Op &op, const Graph &g) {
  SemBuilder b(op, g);
  auto x = b.need(0, "data");
  if (!x)
    return x.takeError();
  auto out0 = b.needOut(0, "Y");
  if (!out0)
    return out0.takeError();
  const Value &X = **x, &Y = **out0;
  int64_t rank = X.shape.rank();
  std::string mode = op.getString("mode", "constant");
  if (mode != "constant")
    return inputError("Pad mode '{}' is not supported (only 'constant')",
                      mode);
  std::vector<int64_t> pads = op.getInts("pads");
  if (const Value *p = b.in(1)) {
    if (p->kind != ValueKind::Constant || !p->hasData)
      return inputError("Pad's pads operand '{}' is not a constant", p->name);
    pads.clear();
    for (double d : p->data)
      pads.push_back(static_cast<int64_t>(d));
    b.setInput(1, {DimMap::whole()});
  }
  for (size_t i = 2; i < b.numIn(); ++i) // constant_value, axes
    if (const Value *v = b.in(i)) {
      if (v->kind != ValueKind::Constant)
        return inputError("Pad operand '{}' is not a constant", v->name);
      std::vector<DimMap> all(v->shape.rank(), DimMap::whole());
      b.setInput(i, all);
    }
  if (static_cast<int64_t>(pads.size()) != 2 * rank ||
      static_cast<int64_t>(Y.shape.rank()) != rank)
    return inputError("Pad needs {} pads for rank {}", 2 * rank, rank);
  std::vector<DimMap> xm, ym;
  for (int64_t d = 0; d < rank; ++d) {
    if (X.shape[d] + pads[d] + pads[rank + d] != Y.shape[d])
      return inputError("padded dim {} is {}, output has {}", d,
                        X.shape[d] + pads[d] + pads[rank + d], Y.shape[d]);
    int l = b.addLoop("d" + std::to_string(d),
                      b.classOf(&X, d, DimClass::Attribute), Y.shape[d]);
    xm.push_back(DimMap::loop(l, 1, -pads[d]));
    ym.push_back(DimMap::loop(l));
  }
  b.setInput(0, xm);
  b.setOutput(0, ym);
  return b.finish();
}

} // namespace

void registerShapeOps(OpRegistry &r) {
  for (const char *k : {"Reshape", "Flatten", "Squeeze", "Unsqueeze"})
    r.add({k, "re-factor dims without moving data", buildReshapeLike, {},
           false, {}});
  r.add({"Transpose", "permute dims", buildTranspose, {}, false, {}});
  r.add({"Concat", "concatenate along an axis", buildConcat, {}, false, {}});
  r.add({"Split", "split along an axis", buildSplit, {}, false, {}});
  r.add({"Slice", "strided slice", buildSlice, {}, false, {}});
  r.add({"Pad", "constant padding", buildPad, {}, false, {}});
}

} // namespace detail
} // namespace soap
