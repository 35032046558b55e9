// FlashAttention (IR/Fusion.h): softmax(scale · Q·Kᵀ [masked]) [dropout] · V
// computed a query row at a time against all keys, in the eager graph's
// order (the scores scaled, then masked, then the softmax, then dropout with
// the eager Dropout's mask), so that it computes what the eager ops compute.
// Backward recomputes the scores and probabilities from Q, K and V.
// Grouped-query attention: query head h * rep + r reads kv head h of K and
// V (transformers' repeat_kv order); K's and V's gradients sum over the rep
// query heads of each kv head.
#include "Kernels.h"

#include "soap/Support/Error.h"
#include "soap/Support/Rng.h"
#include <cmath>
#include <limits>
#include <optional>

namespace soap {
namespace exec {

namespace {

/// The attention's attributes and the logical shape [batch..., seq, feat].
struct Attn {
  size_t rank = 0, nb = 0;      ///< operand rank, batch dims
  std::vector<int64_t> dims[4]; ///< Q, K, V, O: per tensor dim its logical dim
  std::vector<int64_t> batch;   ///< batch dims' sizes (Q's heads)
  int64_t sq = 0, sk = 0, e = 0, ev = 0;
  /// Query heads per kv head: 1, or with grouped-query attention the op's
  /// loop "r" after the kv heads' "h".
  int64_t rep = 1;
  float scale = 1;
  bool causal = false;
  enum { None, Where, Add } mask = None;
  float fill = 0; ///< the scores where a "where" mask or causality drops them
  float ratio = 0, keepScale = 1;
  bool drops = false;
  uint64_t stream = 0;
};

llvm::Error checkAttention(const Graph &g, const Op &op) {
  std::string mask = op.getString("mask", "none");
  if (mask != "none" && mask != "where" && mask != "add")
    return inputError("mask '{}' is not supported (none, where, add)", mask);
  if ((mask == "add" || (mask == "where" && !op.getInt("causal", 0))) &&
      (op.inputs.size() < 4 || op.inputs[3] == kNoValue))
    return inputError("mask '{}' without a mask operand", mask);
  double r = op.getFloat("dropout_ratio", 0);
  if (r < 0 || r >= 1)
    return inputError("dropout ratio {} is outside [0, 1)", r);
  size_t rank = g.value(op.inputs[0]).shape.rank();
  if (rank != 3 && rank != 4)
    return inputError("operands of rank {} (3 or 4 supported)", rank);
  return llvm::Error::success();
}

Attn attnOf(const Graph &g, const Op &op, int64_t step) {
  Attn a;
  const char *keys[] = {"q_dims", "k_dims", "v_dims", "o_dims"};
  ValueId vals[] = {op.inputs[0], op.inputs[1], op.inputs[2], op.outputs[0]};
  a.rank = g.value(op.inputs[0]).shape.rank();
  a.nb = a.rank - 2;
  std::vector<int64_t> logical[4];
  for (size_t i = 0; i < 4; ++i) {
    a.dims[i] = op.getInts(keys[i]);
    const std::vector<int64_t> &shape = g.value(vals[i]).shape.dims;
    logical[i].assign(a.rank, 0);
    for (size_t t = 0; t < a.rank; ++t)
      logical[i][size_t(a.dims[i][t])] = shape[t];
  }
  a.batch.assign(logical[0].begin(), logical[0].begin() + long(a.nb));
  a.sq = logical[0][a.nb];
  a.e = logical[0][a.nb + 1];
  a.sk = logical[1][a.nb];
  a.ev = logical[2][a.nb + 1];
  if (a.nb >= 2 && logical[1][a.nb - 1] != logical[0][a.nb - 1])
    a.rep = logical[0][a.nb - 1] / logical[1][a.nb - 1];
  a.scale = float(op.getFloat("scale", 1));
  a.causal = op.getInt("causal", 0) != 0;
  std::string mask = op.getString("mask", "none");
  bool operand = op.inputs.size() > 3 && op.inputs[3] != kNoValue;
  a.mask = !operand ? Attn::None : mask == "add" ? Attn::Add : Attn::Where;
  // A causal mask was a Where with this fill (the exporters' float32
  // lowest): the same value, so that the same probabilities come out.
  a.fill = float(op.getFloat("mask_fill", -3.4028234663852886e38));
  a.ratio = float(op.getFloat("dropout_ratio", 0));
  a.drops = a.ratio > 0;
  a.keepScale = a.drops ? 1 / (1 - a.ratio) : 1.0f;
  // As the eager Dropout draws it (KernelsPointwise.cpp, dropoutWalk).
  a.stream = fnv1a(op.getString("dropout_name", "")) ^
             (uint64_t(step) * 0x9E3779B97F4A7C15ull);
  return a;
}

/// Offsets into a buffer of one operand by logical index: per logical dim
/// the buffer's stride and the box's first index.
struct Layout {
  std::vector<int64_t> stride, lo;
  const float *data = nullptr;

  Layout(const Buf &b, const std::vector<int64_t> &dims) {
    std::vector<int64_t> bs = boxStrides(b.box);
    stride.assign(dims.size(), 0);
    lo.assign(dims.size(), 0);
    for (size_t t = 0; t < dims.size(); ++t) {
      stride[size_t(dims[t])] = bs[t];
      lo[size_t(dims[t])] = b.box.lo[t];
    }
    data = b.data.data();
  }
  /// The offset of [batch..., seq, 0] (`idx` holds the batch indices).
  int64_t row(const int64_t *idx, size_t nb, int64_t seq) const {
    int64_t off = (seq - lo[nb]) * stride[nb];
    for (size_t d = 0; d < nb; ++d)
      off += (idx[d] - lo[d]) * stride[d];
    return off - lo[nb + 1] * stride[nb + 1];
  }
  int64_t feat() const { return stride.back(); }
};

/// The mask operand broadcast onto [batch..., Sq, Sk] (numpy: aligned to
/// the right, extent-1 dims repeated).
struct MaskLayout {
  std::vector<int64_t> stride, lo; ///< per score dim; stride 0 where repeated
  const float *data = nullptr;

  MaskLayout(const Buf &b, const std::vector<int64_t> &shape, size_t rank) {
    std::vector<int64_t> bs = boxStrides(b.box);
    stride.assign(rank, 0);
    lo.assign(rank, 0);
    size_t skip = rank - shape.size();
    for (size_t d = 0; d < shape.size(); ++d)
      if (shape[d] != 1 || b.box.hi[d] - b.box.lo[d] != 1) {
        stride[skip + d] = bs[d];
        lo[skip + d] = b.box.lo[d];
      }
    data = b.data.data();
  }
  /// The offset of [batch..., q, 0].
  int64_t row(const int64_t *idx, size_t nb, int64_t q) const {
    int64_t off = (q - lo[nb]) * stride[nb] - lo[nb + 1] * stride[nb + 1];
    for (size_t d = 0; d < nb; ++d)
      off += (idx[d] - lo[d]) * stride[d];
    return off;
  }
};

/// One query row's scores and probabilities.
struct Row {
  std::vector<float> p;      ///< the softmax
  std::vector<uint8_t> keep; ///< dropout's mask
  std::vector<uint8_t> open; ///< not masked (the Where passes the score)
};

/// The probabilities of query `q` at batch index `idx` (Q's; `kv` K's).
void probabilities(const Attn &a, const Layout &Q, const Layout &K,
                   const MaskLayout *M, const int64_t *idx, const int64_t *kv,
                   int64_t q, uint64_t seed, Row &r) {
  size_t nb = a.nb;
  r.p.assign(size_t(a.sk), 0.0f);
  r.open.assign(size_t(a.sk), 1);
  r.keep.assign(size_t(a.sk), 1);
  const float *qr = Q.data + Q.row(idx, nb, q);
  int64_t qs = Q.feat(), ks = K.feat();
  const float *mrow = M ? M->data + M->row(idx, nb, q) : nullptr;
  int64_t mstep = M ? M->stride[nb + 1] : 0;
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t k = 0; k < a.sk; ++k) {
    const float *kr = K.data + K.row(kv, nb, k);
    float s = 0;
    for (int64_t e = 0; e < a.e; ++e)
      s += qr[e * qs] * kr[e * ks];
    s *= a.scale;
    if (a.mask == Attn::Add)
      s += mrow[k * mstep];
    if ((a.mask == Attn::Where && mrow[k * mstep] == 0) ||
        (a.causal && k > q)) {
      s = a.fill;
      r.open[size_t(k)] = 0;
    }
    r.p[size_t(k)] = s;
    mx = std::max(mx, s);
  }
  float sum = 0;
  for (float &s : r.p) {
    s = std::exp(s - mx);
    sum += s;
  }
  for (float &s : r.p)
    s /= sum;
  if (!a.drops)
    return;
  // The global index in the eager probabilities [batch..., Sq, Sk].
  int64_t flat = 0;
  for (size_t d = 0; d < nb; ++d)
    flat = flat * a.batch[d] + idx[d];
  flat = (flat * a.sq + q) * a.sk;
  for (int64_t k = 0; k < a.sk; ++k)
    r.keep[size_t(k)] =
        hashUniform(seed, a.stream, uint64_t(flat + k)) >= a.ratio;
}

/// Calls f(idx, kv, q) for every batch index (Q's, and K's and V's) and
/// query of the task's tile: loops [batch..., q], or [n, h, r, q] with
/// grouped query heads (query head h * rep + r, kv head h).
template <class F> void forEachRow(const Attn &a, const Box &tile, F f) {
  size_t nb = a.nb, ql = nb + (a.rep > 1 ? 1 : 0);
  int64_t idx[2] = {0, 0}, kv[2] = {0, 0};
  int64_t r0 = a.rep > 1 ? tile.lo[nb] : 0, r1 = a.rep > 1 ? tile.hi[nb] : 1;
  for (int64_t n = tile.lo[0]; n < tile.hi[0]; ++n)
    for (int64_t h = nb > 1 ? tile.lo[1] : 0; h < (nb > 1 ? tile.hi[1] : 1);
         ++h)
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t q = tile.lo[ql]; q < tile.hi[ql]; ++q) {
          idx[0] = kv[0] = n;
          kv[1] = h;
          idx[1] = h * a.rep + r;
          f(idx, kv, q);
        }
}

/// The mask operand's data: its buffer, else (freed after forward: the
/// semantics save Q, K, V and O only) the copy forward kept in saved[0],
/// else a constant's values filled again.
const Buf *maskBuf(const Graph &g, const Op &op, Task &t) {
  if (op.inputs.size() < 4 || op.inputs[3] == kNoValue)
    return nullptr;
  if (!t.in[3].data.empty() || t.in[3].box.empty())
    return &t.in[3];
  if (!t.saved.empty() && !t.saved[0].data.empty())
    return &t.saved[0];
  const Value &v = g.value(op.inputs[3]);
  t.saved.assign(1, Buf());
  t.saved[0].reset(t.in[3].box);
  forEachIndex(t.in[3].box, v.shape.dims, [&](int64_t flat, int64_t off) {
    t.saved[0].data[size_t(off)] =
        float(v.data.size() == 1 ? v.data[0] : v.data[size_t(flat)]);
  });
  return &t.saved[0];
}

void attentionForward(KernelCtx &ctx) {
  const Op &op = ctx.op;
  Attn a = attnOf(ctx.graph, op, ctx.step);
  Row r;
  for (Task &t : ctx.tasks) {
    Layout Q(t.in[0], a.dims[0]), K(t.in[1], a.dims[1]), V(t.in[2], a.dims[2]),
        O(t.out[0], a.dims[3]);
    const Buf *mb = maskBuf(ctx.graph, op, t);
    std::optional<MaskLayout> M;
    if (mb) {
      M.emplace(*mb, ctx.graph.value(op.inputs[3]).shape.dims, a.rank);
      // A computed mask (or a graph input) is freed after forward;
      // backward reads a copy. A constant's is filled again.
      const Value &mv = ctx.graph.value(op.inputs[3]);
      if (mv.kind != ValueKind::Constant && isFloating(mv.dtype))
        t.saved.assign(1, t.in[3]);
    }
    float *out = t.out[0].data.data();
    int64_t vs = V.feat(), os = O.feat();
    forEachRow(a, t.loops, [&](const int64_t *idx, const int64_t *kv,
                               int64_t q) {
      probabilities(a, Q, K, M ? &*M : nullptr, idx, kv, q, ctx.seed, r);
      float *orow = out + O.row(idx, a.nb, q);
      for (int64_t k = 0; k < a.sk; ++k) {
        float pk = r.keep[size_t(k)] ? r.p[size_t(k)] * a.keepScale : 0.0f;
        const float *vr = V.data + V.row(kv, a.nb, k);
        for (int64_t j = 0; j < a.ev; ++j)
          orow[j * os] += pk * vr[j * vs];
      }
    });
  }
}

void attentionBackward(KernelCtx &ctx) {
  const Op &op = ctx.op;
  Attn a = attnOf(ctx.graph, op, ctx.step);
  Row r;
  std::vector<float> ds(size_t(a.sk));
  for (Task &t : ctx.tasks) {
    Layout Q(t.in[0], a.dims[0]), K(t.in[1], a.dims[1]), V(t.in[2], a.dims[2]),
        dO(t.gout[0], a.dims[3]);
    const Buf *mb = maskBuf(ctx.graph, op, t);
    std::optional<MaskLayout> M;
    if (mb)
      M.emplace(*mb, ctx.graph.value(op.inputs[3]).shape.dims, a.rank);
    // The input gradients (absent where nothing needs one).
    float *g[3] = {nullptr, nullptr, nullptr};
    std::optional<Layout> G[3];
    for (size_t i = 0; i < 3; ++i)
      if (i < t.gin.size() && !t.gin[i].data.empty()) {
        G[i].emplace(t.gin[i], a.dims[i]);
        g[i] = t.gin[i].data.data();
      }
    int64_t qs = Q.feat(), ks = K.feat(), vs = V.feat(), os = dO.feat();
    forEachRow(a, t.loops, [&](const int64_t *idx, const int64_t *kv,
                               int64_t q) {
      probabilities(a, Q, K, M ? &*M : nullptr, idx, kv, q, ctx.seed, r);
      const float *dorow = dO.data + dO.row(idx, a.nb, q);
      const float *qr = Q.data + Q.row(idx, a.nb, q);
      // dV = P'ᵀ dO; dP = dO Vᵀ through dropout; dS by the softmax's
      // backward, zero where the Where dropped the score.
      float dot = 0;
      for (int64_t k = 0; k < a.sk; ++k) {
        size_t kk = size_t(k);
        const float *vr = V.data + V.row(kv, a.nb, k);
        if (g[2]) {
          float pk = r.keep[kk] ? r.p[kk] * a.keepScale : 0.0f;
          float *gv = g[2] + G[2]->row(kv, a.nb, k);
          int64_t gs = G[2]->feat();
          for (int64_t j = 0; j < a.ev; ++j)
            gv[j * gs] += pk * dorow[j * os];
        }
        float dp = 0;
        for (int64_t j = 0; j < a.ev; ++j)
          dp += dorow[j * os] * vr[j * vs];
        ds[kk] = r.keep[kk] ? dp * a.keepScale : 0.0f;
        dot += ds[kk] * r.p[kk];
      }
      for (int64_t k = 0; k < a.sk; ++k) {
        size_t kk = size_t(k);
        ds[kk] = r.open[kk] ? r.p[kk] * (ds[kk] - dot) * a.scale : 0.0f;
      }
      if (g[0]) {
        float *gq = g[0] + G[0]->row(idx, a.nb, q);
        int64_t gs = G[0]->feat();
        for (int64_t k = 0; k < a.sk; ++k) {
          const float *kr = K.data + K.row(kv, a.nb, k);
          for (int64_t e = 0; e < a.e; ++e)
            gq[e * gs] += ds[size_t(k)] * kr[e * ks];
        }
      }
      if (g[1]) {
        int64_t gs = G[1]->feat();
        for (int64_t k = 0; k < a.sk; ++k) {
          float *gk = g[1] + G[1]->row(kv, a.nb, k);
          for (int64_t e = 0; e < a.e; ++e)
            gk[e * gs] += ds[size_t(k)] * qr[e * qs];
        }
      }
    });
  }
}

const Kernel kAttention = {checkAttention, attentionForward, attentionBackward,
                           true};

} // namespace

const Kernel *findAttentionKernel(llvm::StringRef kind) {
  return kind == "FlashAttention" ? &kAttention : nullptr;
}

} // namespace exec
} // namespace soap
