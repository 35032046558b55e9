// Contractions: Gemm, batched MatMul, the LSTM layer, and Gather (embedding
// lookup). Contracted dims are Reduction loops; dims that index a weight are
// Parameter loops.
#include "OpBuilder.h"

namespace soap {
namespace detail {

namespace {

/// The class of the "columns" loop of a contraction: Parameter when the
/// operand is a weight, else the class the activation's dim carries.
DimClass columnClass(const SemBuilder &b, const Value &v, int64_t dim) {
  if (v.kind == ValueKind::Weight || v.kind == ValueKind::Constant)
    return DimClass::Parameter;
  return b.classOf(&v, dim, DimClass::Parameter);
}

void saveActivations(SemBuilder &b) {
  for (size_t i = 0; i < b.numIn(); ++i)
    if (const Value *v = b.in(i))
      if (v->isActivationLike())
        b.saveInput(static_cast<int>(i));
}

llvm::Expected<OpSemantics> buildGemm(const Op &op, const Graph &g) {
  SemBuilder b(op, g);
  auto a = b.need(0, "A");
  if (!a)
    return a.takeError();
  auto bb = b.need(1, "B");
  if (!bb)
    return bb.takeError();
  auto out0 = b.needOut(0, "Y");
  if (!out0)
    return out0.takeError();
  const Value &A = **a, &B = **bb, &Y = **out0;
  if (A.shape.rank() != 2 || B.shape.rank() != 2 || Y.shape.rank() != 2)
    return inputError("Gemm needs rank-2 operands, got {} and {}",
                      A.shape.str(), B.shape.str());
  bool ta = op.getInt("transA", 0), tb = op.getInt("transB", 0);
  int64_t M = A.shape[ta ? 1 : 0], K = A.shape[ta ? 0 : 1];
  int64_t KB = B.shape[tb ? 1 : 0], N = B.shape[tb ? 0 : 1];
  if (K != KB)
    return inputError("inner dims differ: A {} and B {}", A.shape.str(),
                      B.shape.str());
  if (Y.shape.dims != std::vector<int64_t>{M, N})
    return inputError("output shape {} is not [{}, {}]", Y.shape.str(), M, N);
  int m = b.addLoop("m", b.classOf(&A, ta ? 1 : 0, DimClass::Sample), M);
  int n = b.addLoop("n", columnClass(b, B, tb ? 0 : 1), N);
  int k = b.addLoop("k", DimClass::Reduction, K);
  b.setInput(0, ta ? std::vector<DimMap>{DimMap::loop(k), DimMap::loop(m)}
                   : std::vector<DimMap>{DimMap::loop(m), DimMap::loop(k)});
  b.setInput(1, tb ? std::vector<DimMap>{DimMap::loop(n), DimMap::loop(k)}
                   : std::vector<DimMap>{DimMap::loop(k), DimMap::loop(n)});
  uint64_t mn = loopMaskOf({m, n});
  if (b.in(2)) {
    if (auto err = b.setBroadcastInput(2, {m, n}, {M, N}))
      return llvm::Error(std::move(err));
    b.flops(Pass::Forward, 1, mn);
    b.flops(Pass::BackwardWeight, 1, mn);
  }
  b.setOutput(0, {DimMap::loop(m), DimMap::loop(n)});
  for (Pass p : {Pass::Forward, Pass::BackwardData, Pass::BackwardWeight})
    b.flops(p, 2, b.allLoops());
  saveActivations(b);
  return b.finish();
}

llvm::Expected<OpSemantics> buildMatMul(const Op &op, const Graph &g) {
  SemBuilder b(op, g);
  auto a = b.need(0, "A");
  if (!a)
    return a.takeError();
  auto bb = b.need(1, "B");
  if (!bb)
    return bb.takeError();
  auto out0 = b.needOut(0, "Y");
  if (!out0)
    return out0.takeError();
  const Value &A = **a, &B = **bb, &Y = **out0;
  int64_t ra = A.shape.rank(), rb = B.shape.rank();
  if (ra == 0 || rb == 0)
    return inputError("MatMul operands must have rank >= 1");
  // numpy semantics: a 1-D A is a row, a 1-D B a column; both dropped after.
  int64_t M = ra >= 2 ? A.shape[ra - 2] : 1, K = A.shape[ra - 1];
  int64_t KB = rb >= 2 ? B.shape[rb - 2] : B.shape[0];
  int64_t N = rb >= 2 ? B.shape[rb - 1] : 1;
  if (K != KB)
    return inputError("inner dims differ: A {} and B {}", A.shape.str(),
                      B.shape.str());
  int64_t batchRank = std::max<int64_t>(ra - 2, rb - 2);
  batchRank = std::max<int64_t>(batchRank, 0);
  std::vector<int64_t> expect(Y.shape.dims.begin(),
                              Y.shape.dims.begin() +
                                  std::min<int64_t>(batchRank, Y.shape.rank()));
  std::vector<int> batchLoops;
  for (int64_t d = 0; d < batchRank; ++d) {
    // Class from whichever operand carries this batch dim un-broadcast.
    int64_t da = d - (batchRank - (ra - 2)), db = d - (batchRank - (rb - 2));
    int64_t size = static_cast<int64_t>(Y.shape.rank()) > d ? Y.shape[d] : 1;
    DimClass cls = DimClass::Attribute;
    if (da >= 0 && A.shape[da] == size && A.isActivationLike())
      cls = b.classOf(&A, da, cls);
    else if (db >= 0 && B.shape[db] == size && B.isActivationLike())
      cls = b.classOf(&B, db, cls);
    batchLoops.push_back(b.addLoop("b" + std::to_string(d), cls, size));
  }
  int m = b.addLoop("m", ra >= 2 ? b.classOf(&A, ra - 2, DimClass::Attribute)
                                 : DimClass::Attribute,
                    M);
  int n = b.addLoop("n", columnClass(b, B, rb - 1), N);
  int k = b.addLoop("k", DimClass::Reduction, K);
  std::vector<int64_t> yShape;
  std::vector<DimMap> ym;
  for (int64_t d = 0; d < batchRank; ++d) {
    yShape.push_back(b.sem.loops[batchLoops[d]].size);
    ym.push_back(DimMap::loop(batchLoops[d]));
  }
  if (ra >= 2) {
    yShape.push_back(M);
    ym.push_back(DimMap::loop(m));
  }
  if (rb >= 2) {
    yShape.push_back(N);
    ym.push_back(DimMap::loop(n));
  }
  if (Y.shape.dims != yShape)
    return inputError("output shape {} is not {}", Y.shape.str(),
                      TensorShape(yShape).str());
  auto operandMap = [&](const Value &v, int64_t rank, bool isA)
      -> llvm::Expected<std::vector<DimMap>> {
    std::vector<DimMap> dims;
    int64_t vb = std::max<int64_t>(rank - 2, 0);
    for (int64_t d = 0; d < vb; ++d) {
      int64_t od = batchRank - vb + d;
      if (v.shape[d] == yShape[od])
        dims.push_back(DimMap::loop(batchLoops[od]));
      else if (v.shape[d] == 1)
        dims.push_back(DimMap::constant(0));
      else
        return inputError("batch dims of {} and {} do not broadcast",
                          A.shape.str(), B.shape.str());
    }
    if (isA) {
      if (rank >= 2)
        dims.push_back(DimMap::loop(m));
      dims.push_back(DimMap::loop(k));
    } else {
      dims.push_back(DimMap::loop(k));
      if (rank >= 2)
        dims.push_back(DimMap::loop(n));
    }
    return dims;
  };
  auto am = operandMap(A, ra, true);
  if (!am)
    return am.takeError();
  auto bm = operandMap(B, rb, false);
  if (!bm)
    return bm.takeError();
  b.setInput(0, *am);
  b.setInput(1, *bm);
  b.setOutput(0, ym);
  for (Pass p : {Pass::Forward, Pass::BackwardData, Pass::BackwardWeight})
    b.flops(p, 2, b.allLoops());
  saveActivations(b);
  return b.finish();
}

/// Gather along `axis`. With a constant scalar index it selects one slice
/// (a fixed offset); otherwise the gathered dim is a Reduction loop over the
/// data's rows (an embedding split by vocabulary yields partial sums).
llvm::Expected<OpSemantics> buildGather(const Op &op, const Graph &g) {
  SemBuilder b(op, g);
  auto d = b.need(0, "data");
  if (!d)
    return d.takeError();
  auto ix = b.need(1, "indices");
  if (!ix)
    return ix.takeError();
  const Value &D = **d, &I = **ix;
  int64_t rank = D.shape.rank();
  auto axis = normAxis(op.getInt("axis", 0), rank, "axis");
  if (!axis)
    return axis.takeError();
  bool weightTable = D.kind == ValueKind::Weight;
  std::vector<DimMap> dm(rank), im, ym;
  for (int64_t k = 0; k < *axis; ++k) {
    int l = b.addLoop("d" + std::to_string(k),
                      b.classOf(&D, k, DimClass::Attribute), D.shape[k]);
    dm[k] = DimMap::loop(l);
    ym.push_back(DimMap::loop(l));
  }
  bool scalarConst = I.kind == ValueKind::Constant && I.shape.rank() == 0 &&
                     I.data.size() == 1;
  if (scalarConst) {
    int64_t idx = static_cast<int64_t>(I.data[0]);
    if (idx < 0)
      idx += D.shape[*axis];
    if (idx < 0 || idx >= D.shape[*axis])
      return inputError("index {} out of range for dim of size {}",
                        static_cast<int64_t>(I.data[0]), D.shape[*axis]);
    dm[*axis] = DimMap::constant(idx);
    b.setInput(1, {});
  } else {
    for (size_t k = 0; k < I.shape.rank(); ++k) {
      int l = b.addLoop("i" + std::to_string(k),
                        b.classOf(&I, k, k == 0 ? DimClass::Sample
                                                : DimClass::Attribute),
                        I.shape[k]);
      im.push_back(DimMap::loop(l));
      ym.push_back(DimMap::loop(l));
    }
    b.setInput(1, im);
  }
  for (int64_t k = *axis + 1; k < rank; ++k) {
    int l = b.addLoop("d" + std::to_string(k),
                      weightTable ? DimClass::Parameter
                                  : b.classOf(&D, k, DimClass::Attribute),
                      D.shape[k]);
    dm[k] = DimMap::loop(l);
    ym.push_back(DimMap::loop(l));
  }
  if (!scalarConst) {
    int v = b.addLoop("v", DimClass::Reduction, D.shape[*axis], weightTable);
    dm[*axis] = DimMap::loop(v);
  }
  b.setInput(0, dm);
  b.setOutput(0, ym);
  uint64_t outMask = b.allLoops();
  if (!scalarConst)
    outMask &= ~(uint64_t(1) << (b.sem.loops.size() - 1));
  b.flops(Pass::BackwardWeight, 1, outMask); // scatter-add of the gradient
  if (!weightTable)
    b.flops(Pass::BackwardData, 1, outMask);
  return b.finish();
}

/// The ONNX LSTM layer: a recurrence over time (not splittable), split by
/// batch, direction or hidden unit. The gate-stacked weights [D, 4H, I] are
/// addressed as [D, 4, H, I] so a hidden-unit tile's weight rows form a box.
llvm::Expected<OpSemantics> buildLstm(const Op &op, const Graph &g) {
  SemBuilder b(op, g);
  auto x = b.need(0, "X");
  if (!x)
    return x.takeError();
  auto w = b.need(1, "W");
  if (!w)
    return w.takeError();
  auto r = b.need(2, "R");
  if (!r)
    return r.takeError();
  const Value &X = **x, &W = **w, &R = **r;
  int64_t H = op.getInt("hidden_size", R.shape.rank() == 3 ? R.shape[2] : 0);
  bool batchFirst = op.getInt("layout", 0) == 1;
  if (X.shape.rank() != 3 || W.shape.rank() != 3 || R.shape.rank() != 3)
    return inputError("LSTM needs rank-3 X, W and R");
  int64_t T = X.shape[batchFirst ? 1 : 0], N = X.shape[batchFirst ? 0 : 1];
  int64_t I = X.shape[2], D = W.shape[0];
  if (W.shape.dims != std::vector<int64_t>{D, 4 * H, I} ||
      R.shape.dims != std::vector<int64_t>{D, 4 * H, H})
    return inputError("weights W {} and R {} do not match hidden_size {} and "
                      "input size {}",
                      W.shape.str(), R.shape.str(), H, I);
  int t = b.addLoop("t", b.classOf(&X, batchFirst ? 1 : 0, DimClass::Attribute),
                    T, /*splittable=*/false);
  int d = b.addLoop("dir", DimClass::Parameter, D);
  int n = b.addLoop("n", b.classOf(&X, batchFirst ? 0 : 1, DimClass::Sample), N);
  int gt = b.addLoop("gate", DimClass::Parameter, 4, false);
  int h = b.addLoop("h", DimClass::Parameter, H);
  int i = b.addLoop("i", DimClass::Reduction, I, false);
  int j = b.addLoop("j", DimClass::Reduction, H, false);
  auto L = [](int l) { return DimMap::loop(l); };
  b.setInput(0, batchFirst ? std::vector<DimMap>{L(n), L(t), L(i)}
                           : std::vector<DimMap>{L(t), L(n), L(i)});
  b.setInputView(1, {D, 4, H, I}, {L(d), L(gt), L(h), L(i)});
  b.setInputView(2, {D, 4, H, H}, {L(d), L(gt), L(h), L(j)});
  if (const Value *bias = b.in(3)) {
    if (bias->shape.dims != std::vector<int64_t>{D, 8 * H})
      return inputError("bias {} is not [{}, {}]", bias->shape.str(), D, 8 * H);
    b.setInputView(3, {D, 2, 4, H}, {L(d), DimMap::whole(), L(gt), L(h)});
  }
  if (b.in(4))
    b.setInput(4, {L(n)});
  auto state = [&](int inner) {
    return batchFirst ? std::vector<DimMap>{L(n), L(d), L(inner)}
                      : std::vector<DimMap>{L(d), L(n), L(inner)};
  };
  if (b.in(5))
    b.setInput(5, state(j));
  if (b.in(6))
    b.setInput(6, state(h));
  if (b.in(7))
    b.setInputView(7, {D, 3, H}, {L(d), DimMap::whole(), L(h)});
  if (b.out(0))
    b.setOutput(0, batchFirst ? std::vector<DimMap>{L(n), L(t), L(d), L(h)}
                              : std::vector<DimMap>{L(t), L(d), L(n), L(h)});
  for (int k = 1; k <= 2; ++k)
    if (b.out(k))
      b.setOutput(k, state(h));
  addLstmCosts(b, loopMaskOf({t, d, n}), gt, h, i, j, X.dtype);
  // Step t needs all of h_{t-1}: tiles split on h exchange it every step.
  b.sem.loops[size_t(h)].exchangeSteps = T;
  return b.finish();
}

} // namespace

void addLstmCosts(SemBuilder &b, uint64_t outer, int gate, int hidden,
                  int input, int recur, DType dt) {
  uint64_t g = outer | loopMaskOf({gate, hidden});
  uint64_t cell = outer | loopMaskOf({hidden});
  for (Pass p : {Pass::Forward, Pass::BackwardData, Pass::BackwardWeight}) {
    b.flops(p, 2, g | loopMaskOf({input}));
    b.flops(p, 2, g | loopMaskOf({recur}));
  }
  b.flops(Pass::Forward, 10, cell);
  b.flops(Pass::BackwardData, 12, cell);
  b.saveInput(0);
  b.saveOutput(0);
  // Gate activations and cell states kept for backward-through-time.
  double eb = static_cast<double>(dtypeBytes(dt));
  b.sem.savedExtraBytes.push_back({eb, g});
  b.sem.savedExtraBytes.push_back({eb, cell});
}

void registerLinearOps(OpRegistry &r) {
  r.add({"Gemm", "C = alpha*op(A)*op(B) + beta*C", buildGemm, {1, 2}, false,
         {}});
  r.add({"MatMul", "batched matrix product with numpy broadcasting",
         buildMatMul, {}, true, {}});
  r.add({"Gather", "gather slices along an axis (embedding lookup)",
         buildGather, {0}, false, {}});
  r.add({"LSTM", "LSTM layer over a sequence", buildLstm, {1, 2, 3, 7}, false,
         {}});
}

} // namespace detail
} // namespace soap
