// How soap-profile measures an op tile (see MeasurePlan.h).
#include "MeasurePlan.h"

#include "llvm/ADT/StringRef.h"
#include <algorithm>

namespace soap {

namespace {

std::vector<int64_t> shape(const Box &b) {
  std::vector<int64_t> s;
  for (size_t d = 0; d < b.rank(); ++d)
    s.push_back(b.hi[d] - b.lo[d]);
  return s;
}

int64_t volume(const std::vector<int64_t> &s) {
  int64_t v = 1;
  for (int64_t x : s)
    v *= x;
  return v;
}

/// The element type of the op's first output (F64 when it has none, which
/// no library bench takes).
DType outType(const Graph &g, const Op &op) {
  return !op.outputs.empty() && op.outputs[0] != kNoValue
             ? g.value(op.outputs[0]).dtype
             : DType::F64;
}

bool f32(const Graph &g, const Op &op) { return outType(g, op) == DType::F32; }

/// The floating types cuDNN's convolutions, batch normalisation and LSTMs
/// take (f16 and bf16 with f32 accumulation, on tensor cores).
bool dnnFloat(DType t) {
  return t == DType::F32 || t == DType::F16 || t == DType::BF16;
}

/// The "pad=b:a,..." field of a signature (the padding a tile sees at its
/// borders, per dim of input 0); zeros when absent.
std::vector<std::pair<int64_t, int64_t>> signaturePads(llvm::StringRef sig,
                                                       size_t rank) {
  std::vector<std::pair<int64_t, int64_t>> pads(rank, {0, 0});
  size_t at = sig.find("|pad=");
  if (at == llvm::StringRef::npos)
    return pads;
  llvm::StringRef rest = sig.substr(at + 5);
  rest = rest.substr(0, rest.find('|'));
  for (size_t d = 0; d < rank && !rest.empty(); ++d) {
    auto [item, tail] = rest.split(',');
    auto [b, a] = item.split(':');
    b.getAsInteger(10, pads[d].first);
    a.getAsInteger(10, pads[d].second);
    rest = tail;
  }
  return pads;
}

} // namespace

std::vector<int> WindowPlan::output() const {
  std::vector<int> out = {input[0], filter.empty() ? input[1] : filter[0]};
  for (size_t d = 0; d < window.size(); ++d) {
    int span = dilation[d] * (window[d] - 1) + 1;
    out.push_back((input[2 + d] + 2 * pad[d] - span) / stride[d] + 1);
  }
  return out;
}

std::optional<WindowPlan> planWindow(const Graph &g, const Op &op,
                                     const Box &tile,
                                     const std::string &signature) {
  bool conv = op.kind == "Conv";
  bool pool = op.kind == "MaxPool" || op.kind == "AveragePool" ||
              op.kind == "GlobalAveragePool" || op.kind == "GlobalMaxPool";
  // Pooling stays f32 (cuDNN's legacy pooling has no bf16 path).
  if ((!conv && !pool) || !(conv ? dnnFloat(outType(g, op)) : f32(g, op)))
    return std::nullopt;
  std::vector<int64_t> xs = shape(op.sem.inputRegion(0, tile));
  std::vector<int64_t> ys = shape(op.sem.outputRegion(0, tile));
  if (xs.size() < 3 || xs.size() > 5 || ys.size() != xs.size())
    return std::nullopt;
  WindowPlan w;
  w.dtype = outType(g, op);
  size_t sp = xs.size() - 2, nsp = std::max<size_t>(sp, 2);
  std::vector<int64_t> ws;
  if (conv) {
    if (op.inputs.size() < 2)
      return std::nullopt;
    ws = shape(op.sem.inputRegion(1, tile));
    if (ws.size() != xs.size() || ws[1] <= 0 || xs[1] % ws[1] != 0)
      return std::nullopt;
    w.groups = int(xs[1] / ws[1]);
    w.filter = {int(ws[0]), int(ws[1])};
  }
  w.global = llvm::StringRef(op.kind).startswith("Global");
  w.max = llvm::StringRef(op.kind).endswith("MaxPool");
  w.countIncludePad = op.getInt("count_include_pad", 0) != 0;
  std::vector<int64_t> kernel = op.getInts("kernel_shape");
  std::vector<int64_t> strides = op.getInts("strides");
  std::vector<int64_t> dil = op.getInts("dilations");
  auto pads = signaturePads(signature, xs.size());
  w.input = {int(xs[0]), int(xs[1])};
  w.expectedOutput = {int(ys[0]), int(ys[1])};
  for (size_t d = 0; d < nsp; ++d) {
    bool real = d < sp;
    int64_t before = real ? pads[2 + d].first : 0;
    int64_t after = real ? pads[2 + d].second : 0;
    int extent = real ? int(xs[2 + d] + std::max(before, after) -
                            std::min(before, after))
                      : 1;
    w.input.push_back(extent);
    w.pad.push_back(int(std::min(before, after)));
    w.expectedOutput.push_back(real ? int(ys[2 + d]) : 1);
    int win = 1;
    if (real)
      win = conv       ? int(ws[2 + d])
            : w.global ? extent
            : d < kernel.size() ? int(kernel[d])
                                : 1;
    w.window.push_back(win);
    if (conv)
      w.filter.push_back(win);
    w.stride.push_back(real && !w.global && d < strides.size()
                           ? int(strides[d])
                           : 1);
    w.dilation.push_back(real && conv && d < dil.size() ? int(dil[d]) : 1);
  }
  return w;
}

int64_t GemmPlan::elements(GemmShape::Operand o) const {
  switch (o) {
  case GemmShape::A:
  case GemmShape::DA:
    return batchA * m * k;
  case GemmShape::B:
  case GemmShape::DB:
    return batchB * k * n;
  case GemmShape::Y:
  case GemmShape::DY:
    return batch * m * n;
  }
  return 0;
}

double GemmPlan::flops(Pass p) const {
  double f = 0;
  for (const GemmShape &s : passes[int(p)])
    f += s.flops();
  return f;
}

std::optional<GemmPlan> planGemm(const Graph &g, const Op &op,
                                 const Box &tile) {
  if ((op.kind != "Gemm" && op.kind != "MatMul") || op.inputs.size() < 2 ||
      op.outputs.empty() || op.outputs[0] == kNoValue)
    return std::nullopt;
  GemmPlan p;
  p.dtype = g.value(op.outputs[0]).dtype;
  if (p.dtype != DType::F32 && p.dtype != DType::F16 &&
      p.dtype != DType::BF16)
    return std::nullopt;
  std::vector<int64_t> as = shape(op.sem.inputRegion(0, tile));
  std::vector<int64_t> bs = shape(op.sem.inputRegion(1, tile));
  std::vector<int64_t> ys = shape(op.sem.outputRegion(0, tile));
  bool tA = false, tB = false;
  int64_t m, n, k;
  if (op.kind == "Gemm") {
    if (as.size() != 2 || bs.size() != 2)
      return std::nullopt;
    tA = op.getInt("transA", 0) != 0;
    tB = op.getInt("transB", 0) != 0;
    m = tA ? as[1] : as[0];
    k = tA ? as[0] : as[1];
    n = tB ? bs[0] : bs[1];
  } else { // MatMul, numpy semantics
    if (as.empty() || bs.empty())
      return std::nullopt;
    m = as.size() >= 2 ? as[as.size() - 2] : 1;
    k = as.back();
    n = bs.size() >= 2 ? bs.back() : 1;
    for (size_t d = 0; d + 2 < as.size(); ++d)
      p.batchA *= as[d];
    for (size_t d = 0; d + 2 < bs.size(); ++d)
      p.batchB *= bs[d];
  }
  if (m <= 0 || n <= 0 || k <= 0)
    return std::nullopt;
  const int64_t batch = std::max<int64_t>(1, volume(ys) / (m * n));
  if (p.batchA != 1)
    p.batchA = batch;
  if (p.batchB != 1)
    p.batchB = batch;
  p.m = m;
  p.n = n;
  p.k = k;
  p.batch = batch;
  using S = GemmShape;
  const int64_t sA = p.batchA > 1 ? m * k : 0, sB = p.batchB > 1 ? k * n : 0;
  const bool foldB = batch > 1 && p.batchB == 1;
  if (foldB && !tA)
    p.passes[0].push_back({false, tB, batch * m, n, k, 1, 0, 0, 0, S::A, S::B, S::Y});
  else
    p.passes[0].push_back({tA, tB, m, n, k, batch, sA, sB, m * n, S::A, S::B, S::Y});
  S gA;
  if (!tA) {
    if (foldB)
      gA = {false, !tB, batch * m, k, n, 1, 0, 0, 0, S::DY, S::B, S::DA};
    else
      gA = {false, !tB, m, k, n, batch, m * n, sB, m * k, S::DY, S::B, S::DA};
  } else {
    gA = {tB, true, k, m, n, batch, sB, m * n, m * k, S::B, S::DY, S::DA};
  }
  S gB;
  if (foldB && !tA && !tB)
    gB = {true, false, k, n, batch * m, 1, 0, 0, 0, S::A, S::DY, S::DB};
  else if (!tB)
    gB = {!tA, false, k, n, m, batch, sA, m * n, k * n, S::A, S::DY, S::DB};
  else
    gB = {true, tA, n, k, m, batch, m * n, sA, k * n, S::DY, S::A, S::DB};
  auto isWeight = [&](int i) {
    return std::find(op.sem.weightInputs.begin(), op.sem.weightInputs.end(),
                     i) != op.sem.weightInputs.end();
  };
  p.passes[isWeight(0) ? 2 : 1].push_back(gA);
  p.passes[isWeight(1) ? 2 : 1].push_back(gB);
  return p;
}

std::optional<RnnPlan> planRnn(const Graph &g, const Op &op, const Box &tile) {
  DType t = outType(g, op);
  if (op.kind != "LSTM" || !dnnFloat(t) || op.inputs.size() < 3 ||
      op.sem.loops.size() != 7)
    return std::nullopt;
  // cuDNN's LSTM: default activations, no clipping, no coupled input-forget
  // gate, no peepholes.
  if (op.hasAttr("activations") || op.hasAttr("clip") ||
      op.getInt("input_forget", 0) != 0 ||
      (op.inputs.size() > 7 && op.inputs[7] != kNoValue))
    return std::nullopt;
  // Loops (buildLstm): t, dir, n, gate, h, i, j. A tile split on the hidden
  // units computes part of every step's gates from all of h_{t-1}: no cuDNN
  // LSTM does that, so such a tile stays with the streaming kernel.
  auto extent = [&](int l) { return tile.hi[size_t(l)] - tile.lo[size_t(l)]; };
  const auto &loops = op.sem.loops;
  for (int l : {0, 3, 4, 5, 6})
    if (extent(l) != loops[size_t(l)].size)
      return std::nullopt;
  RnnPlan p;
  p.dtype = t;
  p.seq = int(extent(0));
  p.dirs = int(extent(1));
  p.batch = int(extent(2));
  p.hidden = int(extent(4));
  p.input = int(extent(5));
  p.bias = op.inputs.size() > 3 && op.inputs[3] != kNoValue;
  if (p.dirs < 1 || p.dirs > 2 || p.batch < 1 || p.seq < 1)
    return std::nullopt;
  return p;
}

const char *measureMethod(const Graph &g, const Op &op, const Box &tile) {
  if (dnnFloat(outType(g, op)) && op.kind == "BatchNormalization")
    return "cudnn";
  if (planRnn(g, op, tile))
    return "cudnn";
  if (planWindow(g, op, tile, ""))
    return "cudnn";
  if (planGemm(g, op, tile))
    return "cublas";
  return "stream";
}

} // namespace soap
