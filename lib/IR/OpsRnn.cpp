// soapc's own kinds for unrolled recurrent layers (FlexFlow unrolls its RNNs so
// that layers and time steps can run on different devices): LSTMCell, one
// time step of an ONNX LSTM, and Stack, which gathers the steps' outputs.
#include "OpBuilder.h"

namespace soap {
namespace detail {

namespace {

/// Inputs: 0 x ([N, I], or the whole sequence [T, N, I] / [N, T, I] read at
/// step `x_time`), 1 W [1, 4H, I], 2 R [1, 4H, H], 3 B [1, 8H] (optional),
/// 4 h_prev, 5 c_prev ([N, H] or initial states [1, N, H]; absent = zeros).
/// Outputs: h, c [N, H].
llvm::Expected<OpSemantics> buildLstmCell(const Op &op, const Graph &g) {
  SemBuilder b(op, g);
  auto x = b.need(0, "x");
  if (!x)
    return x.takeError();
  auto w = b.need(1, "W");
  if (!w)
    return w.takeError();
  auto r = b.need(2, "R");
  if (!r)
    return r.takeError();
  const Value &X = **x, &W = **w, &R = **r;
  int64_t H = op.getInt("hidden_size", 0);
  bool batchFirst = op.getInt("layout", 0) == 1;
  int64_t xRank = X.shape.rank();
  if (W.shape.rank() != 3 || W.shape[0] != 1 || W.shape[1] != 4 * H ||
      R.shape.dims != std::vector<int64_t>{1, 4 * H, H} ||
      (xRank != 2 && xRank != 3))
    return inputError("LSTMCell operands x {}, W {}, R {} do not match "
                      "hidden_size {}",
                      X.shape.str(), W.shape.str(), R.shape.str(), H);
  int64_t I = W.shape[2];
  int64_t N = xRank == 2 ? X.shape[0] : X.shape[batchFirst ? 0 : 1];
  if (X.shape[xRank - 1] != I)
    return inputError("input size {} differs from W's {}", X.shape[xRank - 1],
                      I);
  int n = b.addLoop("n", b.classOf(&X, xRank == 2 ? 0 : (batchFirst ? 0 : 1),
                                   DimClass::Sample),
                    N);
  int gt = b.addLoop("gate", DimClass::Parameter, 4, false);
  int h = b.addLoop("h", DimClass::Parameter, H);
  int i = b.addLoop("i", DimClass::Reduction, I, false);
  int j = b.addLoop("j", DimClass::Reduction, H, false);
  auto L = [](int l) { return DimMap::loop(l); };
  if (xRank == 2) {
    b.setInput(0, {L(n), L(i)});
  } else {
    DimMap t = DimMap::constant(op.getInt("x_time", 0));
    b.setInput(0, batchFirst ? std::vector<DimMap>{L(n), t, L(i)}
                             : std::vector<DimMap>{t, L(n), L(i)});
  }
  DimMap zero = DimMap::constant(0);
  b.setInputView(1, {1, 4, H, I}, {zero, L(gt), L(h), L(i)});
  b.setInputView(2, {1, 4, H, H}, {zero, L(gt), L(h), L(j)});
  if (b.in(3))
    b.setInputView(3, {1, 2, 4, H}, {zero, DimMap::whole(), L(gt), L(h)});
  for (size_t k = 4; k <= 5; ++k) {
    const Value *s = b.in(k);
    if (!s)
      continue;
    int inner = k == 4 ? j : h;
    if (s->shape.rank() == 2)
      b.setInput(k, {L(n), L(inner)});
    else
      b.setInput(k, {zero, L(n), L(inner)});
  }
  b.setOutput(0, {L(n), L(h)});
  if (b.out(1))
    b.setOutput(1, {L(n), L(h)});
  addLstmCosts(b, loopMaskOf({n}), gt, h, i, j, X.dtype);
  return b.finish();
}

/// Stack k tensors of one shape S into [k, S...]. Input i is addressed as
/// [1, S...] at offset i, so a tile reads only the inputs its range covers.
llvm::Expected<OpSemantics> buildStack(const Op &op, const Graph &g) {
  SemBuilder b(op, g);
  auto out0 = b.needOut(0, "Y");
  if (!out0)
    return out0.takeError();
  const Value &Y = **out0;
  int64_t k = static_cast<int64_t>(b.numIn());
  if (Y.shape.rank() < 1 || Y.shape[0] != k)
    return inputError("output {} does not stack {} inputs", Y.shape.str(), k);
  std::vector<int64_t> part(Y.shape.dims.begin() + 1, Y.shape.dims.end());
  const Value *first = b.in(0);
  int s = b.addLoop("step", DimClass::Attribute, k);
  std::vector<int> loops;
  for (size_t d = 0; d < part.size(); ++d)
    loops.push_back(b.addLoop("d" + std::to_string(d),
                              b.classOf(first, d, DimClass::Attribute),
                              part[d]));
  for (int64_t i = 0; i < k; ++i) {
    auto v = b.need(i, "part");
    if (!v)
      return v.takeError();
    if ((*v)->shape.dims != part)
      return inputError("part '{}' {} differs from {}", (*v)->name,
                        (*v)->shape.str(), TensorShape(part).str());
    std::vector<int64_t> view{1};
    view.insert(view.end(), part.begin(), part.end());
    std::vector<DimMap> m{DimMap::loop(s, 1, -i)};
    for (int l : loops)
      m.push_back(DimMap::loop(l));
    b.setInputView(i, view, m);
  }
  std::vector<DimMap> ym{DimMap::loop(s)};
  for (int l : loops)
    ym.push_back(DimMap::loop(l));
  b.setOutput(0, ym);
  return b.finish();
}

} // namespace

void registerRnnOps(OpRegistry &r) {
  r.add({"LSTMCell", "one time step of an unrolled LSTM layer (soapc)",
         buildLstmCell, {1, 2, 3}, false, {}});
  r.add({"Stack", "stack tensors of one shape along a new leading axis (soapc)",
         buildStack, {}, false, {}});
}

} // namespace detail
} // namespace soap
