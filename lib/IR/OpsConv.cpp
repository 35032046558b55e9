// Convolution and pooling: sliding windows with stride, dilation and padding.
// Window (kernel) dims are Reduction loops; the input index of a window point
// is out*stride + k*dilation - padBegin, so a tile's input region includes
// its halo exactly.
#include "OpBuilder.h"

namespace soap {
namespace detail {

namespace {

struct Window {
  std::vector<int64_t> kernel, strides, dilations, padBegin;
};

/// Reads kernel/stride/dilation/padding attributes for `nsp` spatial dims and
/// checks them against the input and output extents.
llvm::Expected<Window> readWindow(const Op &op, const Value &x, const Value &y,
                                  std::vector<int64_t> kernel) {
  size_t nsp = x.shape.rank() - 2;
  Window w;
  w.kernel = std::move(kernel);
  w.strides = op.getInts("strides", std::vector<int64_t>(nsp, 1));
  w.dilations = op.getInts("dilations", std::vector<int64_t>(nsp, 1));
  std::vector<int64_t> pads =
      op.getInts("pads", std::vector<int64_t>(2 * nsp, 0));
  if (w.kernel.size() != nsp || w.strides.size() != nsp ||
      w.dilations.size() != nsp || pads.size() != 2 * nsp)
    return inputError("kernel_shape/strides/dilations/pads do not match the "
                      "{} spatial dims of input '{}' {}",
                      nsp, x.name, x.shape.str());
  std::string autoPad = op.getString("auto_pad", "NOTSET");
  for (size_t i = 0; i < nsp; ++i) {
    if (w.kernel[i] <= 0 || w.strides[i] <= 0 || w.dilations[i] <= 0)
      return inputError("kernel, stride and dilation must be positive");
    int64_t in = x.shape[2 + i], out = y.shape[2 + i];
    int64_t span = w.dilations[i] * (w.kernel[i] - 1) + 1;
    int64_t padEnd = 0;
    if (autoPad == "SAME_UPPER" || autoPad == "SAME_LOWER") {
      int64_t total =
          std::max<int64_t>((out - 1) * w.strides[i] + span - in, 0);
      w.padBegin.push_back(autoPad == "SAME_UPPER" ? total / 2
                                                   : total - total / 2);
      padEnd = total - w.padBegin.back();
    } else if (autoPad == "VALID") {
      w.padBegin.push_back(0);
    } else {
      w.padBegin.push_back(pads[i]);
      padEnd = pads[nsp + i];
    }
    // The last output's window must start inside the padded input.
    int64_t lastStart = (out - 1) * w.strides[i] - w.padBegin.back();
    if (lastStart >= in + padEnd)
      return inputError("output '{}' extent {} in spatial dim {} does not "
                        "fit input extent {}",
                        y.name, out, i, in);
  }
  return w;
}

llvm::Expected<OpSemantics> buildConv(const Op &op, const Graph &g) {
  SemBuilder b(op, g);
  auto x = b.need(0, "X");
  if (!x)
    return x.takeError();
  auto w = b.need(1, "W");
  if (!w)
    return w.takeError();
  auto out0 = b.needOut(0, "Y");
  if (!out0)
    return out0.takeError();
  const Value &X = **x, &W = **w, &Y = **out0;
  size_t rank = X.shape.rank();
  if (rank < 3)
    return inputError("input '{}' has rank {}; Conv needs at least 3", X.name,
                      rank);
  if (W.shape.rank() != rank)
    return inputError("weight '{}' has rank {}, input '{}' has rank {}", W.name,
                      W.shape.rank(), X.name, rank);
  if (Y.shape.rank() != rank)
    return inputError("output rank {} differs from input rank {}",
                      Y.shape.rank(), rank);
  int64_t groups = op.getInt("group", 1);
  int64_t C = X.shape[1], M = W.shape[0];
  if (groups <= 0 || C % groups || M % groups || W.shape[1] * groups != C)
    return inputError("weight '{}' {} does not match {} input channels in {} "
                      "groups",
                      W.name, W.shape.str(), C, groups);
  if (Y.shape[0] != X.shape[0] || Y.shape[1] != M)
    return inputError("output shape {} does not match input {} and weight {}",
                      Y.shape.str(), X.shape.str(), W.shape.str());
  std::vector<int64_t> kernel(W.shape.dims.begin() + 2, W.shape.dims.end());
  if (op.hasAttr("kernel_shape") && op.getInts("kernel_shape") != kernel)
    return inputError("kernel_shape does not match weight '{}' {}", W.name,
                      W.shape.str());
  auto win = readWindow(op, X, Y, kernel);
  if (!win)
    return win.takeError();
  size_t nsp = rank - 2;

  int n = b.addLoop("n", b.classOf(&X, 0, DimClass::Sample), X.shape[0]);
  int grp = groups > 1 ? b.addLoop("g", DimClass::Parameter, groups) : -1;
  // Inside a group, channel ranges stay boxes only when the group loop is
  // not split across them: with groups, split channels through `g`.
  int m = b.addLoop("oc", DimClass::Parameter, M / groups, groups == 1);
  int c = b.addLoop("ic", DimClass::Reduction, C / groups, groups == 1);
  std::vector<int> o, k;
  static const char *spatial[] = {"od", "oh", "ow"};
  static const char *window[] = {"kd", "kh", "kw"};
  for (size_t i = 0; i < nsp; ++i) {
    std::string on = nsp <= 3 ? spatial[3 - nsp + i] : "o" + std::to_string(i);
    o.push_back(b.addLoop(on, b.classOf(&X, 2 + i, DimClass::Attribute),
                          Y.shape[2 + i]));
  }
  for (size_t i = 0; i < nsp; ++i) {
    std::string kn = nsp <= 3 ? window[3 - nsp + i] : "k" + std::to_string(i);
    k.push_back(b.addLoop(kn, DimClass::Reduction, kernel[i]));
  }
  auto chan = [&](int inner, int64_t groupStride) {
    DimMap d = DimMap::loop(inner);
    if (grp >= 0)
      d.terms.insert(d.terms.begin(), {grp, groupStride});
    return d;
  };
  std::vector<DimMap> xm{DimMap::loop(n), chan(c, C / groups)};
  std::vector<DimMap> wm{chan(m, M / groups), DimMap::loop(c)};
  std::vector<DimMap> ym{DimMap::loop(n), chan(m, M / groups)};
  for (size_t i = 0; i < nsp; ++i) {
    DimMap d;
    d.terms = {{o[i], win->strides[i]}, {k[i], win->dilations[i]}};
    d.offset = -win->padBegin[i];
    xm.push_back(d);
    wm.push_back(DimMap::loop(k[i]));
    ym.push_back(DimMap::loop(o[i]));
  }
  b.setInput(0, xm);
  b.setInput(1, wm);
  uint64_t outMask = 0;
  for (const DimMap &d : ym)
    for (const IndexTerm &t : d.terms)
      outMask |= uint64_t(1) << t.loop;
  if (const Value *bias = b.in(2)) {
    if (bias->shape.dims != std::vector<int64_t>{M})
      return inputError("bias '{}' {} does not match {} output channels",
                        bias->name, bias->shape.str(), M);
    b.setInput(2, {chan(m, M / groups)});
    b.flops(Pass::Forward, 1, outMask);
    b.flops(Pass::BackwardWeight, 1, outMask);
  }
  b.setOutput(0, ym);
  b.flops(Pass::Forward, 2, b.allLoops());
  b.flops(Pass::BackwardData, 2, b.allLoops());
  b.flops(Pass::BackwardWeight, 2, b.allLoops());
  b.saveInput(0);
  return b.finish();
}

llvm::Expected<OpSemantics> buildPool(const Op &op, const Graph &g) {
  SemBuilder b(op, g);
  auto x = b.need(0, "X");
  if (!x)
    return x.takeError();
  auto out0 = b.needOut(0, "Y");
  if (!out0)
    return out0.takeError();
  const Value &X = **x, &Y = **out0;
  size_t rank = X.shape.rank();
  if (rank < 3 || Y.shape.rank() != rank)
    return inputError("pooling needs matching input and output ranks >= 3");
  if (Y.shape[0] != X.shape[0] || Y.shape[1] != X.shape[1])
    return inputError("output shape {} does not match input {}", Y.shape.str(),
                      X.shape.str());
  bool global = llvm::StringRef(op.kind).startswith("Global");
  bool isMax = llvm::StringRef(op.kind).contains("Max");
  size_t nsp = rank - 2;
  std::vector<int64_t> kernel;
  Window win;
  if (global) {
    kernel.assign(X.shape.dims.begin() + 2, X.shape.dims.end());
    win.kernel = kernel;
    win.strides.assign(nsp, 1);
    win.dilations.assign(nsp, 1);
    win.padBegin.assign(nsp, 0);
  } else {
    if (!op.hasAttr("kernel_shape"))
      return inputError("missing attribute kernel_shape");
    auto w = readWindow(op, X, Y, op.getInts("kernel_shape"));
    if (!w)
      return w.takeError();
    win = *w;
  }
  int n = b.addLoop("n", b.classOf(&X, 0, DimClass::Sample), X.shape[0]);
  int c = b.addLoop("c", b.classOf(&X, 1, DimClass::Parameter), X.shape[1]);
  std::vector<DimMap> xm{DimMap::loop(n), DimMap::loop(c)};
  std::vector<DimMap> ym{DimMap::loop(n), DimMap::loop(c)};
  std::vector<int> o(nsp, -1);
  for (size_t i = 0; i < nsp; ++i)
    if (!global)
      o[i] =
          b.addLoop("o" + std::to_string(i),
                    b.classOf(&X, 2 + i, DimClass::Attribute), Y.shape[2 + i]);
  for (size_t i = 0; i < nsp; ++i) {
    // A max over a split window is not a partial sum: windows stay whole,
    // except a global average, which is a sum.
    int k = b.addLoop("k" + std::to_string(i), DimClass::Reduction,
                      win.kernel[i], global && !isMax);
    DimMap d;
    if (!global)
      d.terms.push_back({o[i], win.strides[i]});
    d.terms.push_back({k, win.dilations[i]});
    d.offset = -win.padBegin[i];
    xm.push_back(d);
    ym.push_back(global ? DimMap::constant(0) : DimMap::loop(o[i]));
  }
  b.setInput(0, xm);
  b.setOutput(0, ym);
  if (b.out(1)) // MaxPool's Indices
    b.setOutput(1, ym);
  b.flops(Pass::Forward, 1, b.allLoops());
  b.flops(Pass::BackwardData, 1, b.allLoops());
  // Max pooling's backward routes each output gradient to its window's
  // maximum: it keeps the argmax (an int64 per output element, as PyTorch's
  // max_pool2d_with_indices), not the input.
  if (isMax) {
    uint64_t outLoops = (uint64_t(1) << n) | (uint64_t(1) << c);
    for (int l : o)
      if (l >= 0)
        outLoops |= uint64_t(1) << l;
    b.sem.savedExtraBytes.push_back({8.0, outLoops});
  }
  return b.finish();
}

} // namespace

void registerConvOps(OpRegistry &r) {
  r.add({"Conv",
         "N-d convolution with groups, stride, dilation, padding",
         buildConv,
         {1, 2},
         false,
         {}});
  r.add({"MaxPool", "max pooling over a window", buildPool, {}, false, {}});
  r.add({"AveragePool",
         "average pooling over a window",
         buildPool,
         {},
         false,
         {}});
  r.add({"GlobalAveragePool",
         "average over all spatial positions",
         buildPool,
         {},
         false,
         {}});
  r.add({"GlobalMaxPool",
         "max over all spatial positions",
         buildPool,
         {},
         false,
         {}});
}

} // namespace detail
} // namespace soap
