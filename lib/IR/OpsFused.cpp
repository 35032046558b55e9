// The fused kernels of the fused execution model (IR/Fusion.h):
// FlashAttention (Dao et al. 2022: one kernel over query blocks, keys
// streamed through on-chip memory; saves Q, K, V, O and the row log-sum-exp;
// backward recomputes the scores in the kernel) and FusedElementwise (a
// chain of element-wise ops run as one kernel: its inputs read once, its
// output written once).
#include "OpBuilder.h"

#include <algorithm>
#include <limits>

namespace soap {
namespace detail {

namespace {

/// Operand `i`'s logical dims (per tensor dim, the logical dim it holds),
/// checked to be a permutation of 0..rank-1.
llvm::Expected<std::vector<int64_t>> logicalDims(const Op &op,
                                                 llvm::StringRef key,
                                                 size_t rank) {
  std::vector<int64_t> dims = op.getInts(key);
  std::vector<int64_t> sorted = dims;
  std::sort(sorted.begin(), sorted.end());
  for (size_t d = 0; d < sorted.size(); ++d)
    if (sorted[d] != int64_t(d))
      sorted.clear();
  if (dims.size() != rank || sorted.size() != rank)
    return inputError("attribute '{}' is not a permutation of the operand's "
                      "{} dims",
                      key, rank);
  return dims;
}

llvm::Expected<OpSemantics> buildFlashAttention(const Op &op, const Graph &g) {
  SemBuilder b(op, g);
  const char *names[] = {"Q", "K", "V"};
  const char *keys[] = {"q_dims", "k_dims", "v_dims"};
  const Value *in[3];
  std::vector<int64_t> dims[4];
  for (size_t i = 0; i < 3; ++i) {
    auto v = b.need(i, names[i]);
    if (!v)
      return v.takeError();
    in[i] = *v;
  }
  auto out = b.needOut(0, "O");
  if (!out)
    return out.takeError();
  size_t rank = in[0]->shape.rank();
  int64_t nb = op.getInt("batch_dims", int64_t(rank) - 2);
  if (rank < 3 || rank > 4 || nb != int64_t(rank) - 2)
    return inputError("FlashAttention takes rank-3 or rank-4 operands with "
                      "{} batch dims, got rank {}",
                      nb, rank);
  const Value *operand[4] = {in[0], in[1], in[2], *out};
  const char *allKeys[] = {keys[0], keys[1], keys[2], "o_dims"};
  // Logical shapes [batch..., seq, feature].
  std::vector<int64_t> logical[4];
  for (size_t i = 0; i < 4; ++i) {
    if (operand[i]->shape.rank() != rank)
      return inputError("operand '{}' {} is not of rank {}", operand[i]->name,
                        operand[i]->shape.str(), rank);
    auto d = logicalDims(op, allKeys[i], rank);
    if (!d)
      return d.takeError();
    dims[i] = *d;
    logical[i].assign(rank, 0);
    for (size_t t = 0; t < rank; ++t)
      logical[i][size_t(dims[i][t])] = operand[i]->shape[t];
  }
  size_t s = size_t(nb), f = s + 1;
  // Grouped-query attention: K and V hold kv heads in the last batch dim,
  // each read by `rep` query heads in a row.
  int64_t rep = 1;
  if (s >= 2 && logical[1][s - 1] != logical[0][s - 1] &&
      logical[1][s - 1] > 0 && logical[0][s - 1] % logical[1][s - 1] == 0 &&
      logical[2][s - 1] == logical[1][s - 1])
    rep = logical[0][s - 1] / logical[1][s - 1];
  for (size_t d = 0; d < s; ++d)
    for (size_t i = 1; i < 4; ++i) {
      bool kv = i < 3 && d == s - 1 && rep > 1;
      if (logical[i][d] * (kv ? rep : 1) != logical[0][d])
        return inputError("the batch dims of Q, K, V and O differ");
    }
  if (logical[0][f] != logical[1][f] || logical[1][s] != logical[2][s] ||
      logical[0][s] != logical[3][s] || logical[2][f] != logical[3][f])
    return inputError("Q {}, K {}, V {} and O {} do not make attention",
                      in[0]->shape.str(), in[1]->shape.str(),
                      in[2]->shape.str(), (*out)->shape.str());
  // Loops: the batch dims (sample, heads), the query sequence, and the key
  // sequence and head dims, which the kernel keeps whole. With grouped
  // query heads, "h" runs over the kv heads (what tensor parallelism
  // splits) and "r" over the query heads of each, kept whole.
  std::vector<int> batch;
  int repLoop = -1;
  for (size_t d = 0; d < s; ++d) {
    size_t t = size_t(std::find(dims[0].begin(), dims[0].end(), int64_t(d)) -
                      dims[0].begin());
    DimClass dflt = d == 0 ? DimClass::Sample : DimClass::Parameter;
    DimClass cls = b.classOf(in[0], int64_t(t), dflt);
    if (d > 0 && cls == DimClass::Attribute)
      cls = DimClass::Parameter; // heads
    bool grouped = d == s - 1 && rep > 1;
    batch.push_back(b.addLoop(d == 0 ? "n" : "h", cls,
                              grouped ? logical[1][d] : logical[0][d]));
    if (grouped)
      repLoop = b.addLoop("r", cls, rep, false);
  }
  int q = b.addLoop("q", DimClass::Attribute, logical[0][s]);
  int k = b.addLoop("k", DimClass::Reduction, logical[1][s], false);
  int e = b.addLoop("e", DimClass::Reduction, logical[0][f], false);
  int ev = b.addLoop("ev", DimClass::Attribute, logical[2][f], false);
  // Split on q, the kernel runs ring attention: each tile keeps its own
  // block of K and V and the blocks go round (Megatron-Core's context
  // parallelism).
  b.sem.loops[size_t(q)].ring = k;
  int seqLoop[4] = {q, k, k, q}, featLoop[4] = {e, e, ev, ev};
  for (size_t i = 0; i < 4; ++i) {
    std::vector<DimMap> m;
    for (size_t t = 0; t < rank; ++t) {
      size_t l = size_t(dims[i][t]);
      m.push_back(DimMap::loop(l < s    ? batch[l]
                               : l == s ? seqLoop[i]
                                        : featLoop[i]));
      // Query head h * rep + r of Q and O.
      if (repLoop >= 0 && l == s - 1 && (i == 0 || i == 3)) {
        m.back().terms[0].coeff = rep;
        m.back().terms.push_back({repLoop, 1});
      }
    }
    if (i < 3)
      b.setInput(i, m);
    else
      b.setOutput(0, m);
  }
  std::vector<int> scoreLoops = batch;
  // A mask over query heads would need the (h, r) pair; one that has no
  // heads dim (a [q, k] causal mask too large to fold) is broadcast.
  if (repLoop >= 0 && b.numIn() > 3 && b.in(3)) {
    const std::vector<int64_t> &md = b.in(3)->shape.dims;
    size_t fromEnd = rank - (s - 1); // the heads dim, counted from the end
    if (md.size() >= fromEnd && md[md.size() - fromEnd] != 1)
      return inputError("grouped-query attention with a mask over heads");
  }
  scoreLoops.push_back(q);
  scoreLoops.push_back(k);
  std::vector<int64_t> scoreShape(logical[0].begin(), logical[0].begin() + s);
  scoreShape.push_back(logical[0][s]);
  scoreShape.push_back(logical[1][s]);
  if (b.numIn() > 3 && b.in(3))
    if (auto err = b.setBroadcastInput(3, scoreLoops, scoreShape))
      return llvm::Error(std::move(err));
  uint64_t bm = 0;
  for (int l : batch)
    bm |= uint64_t(1) << l;
  if (repLoop >= 0)
    bm |= uint64_t(1) << repLoop;
  uint64_t qk = bm | (uint64_t(1) << q) | (uint64_t(1) << k);
  uint64_t withE = qk | (uint64_t(1) << e), withEv = qk | (uint64_t(1) << ev);
  // A causal kernel skips the blocks above the diagonal: half the work.
  double c = op.getInt("causal", 0) ? 0.5 : 1.0;
  // Forward: S = Q Kᵀ, the online softmax, O = P V.
  b.flops(Pass::Forward, 2 * c, withE);
  b.flops(Pass::Forward, 2 * c, withEv);
  b.flops(Pass::Forward, 5 * c, qk);
  // Backward: S recomputed, dV = Pᵀ dO, dP = dO Vᵀ, dS, dQ = dS K,
  // dK = dSᵀ Q.
  b.flops(Pass::BackwardData, 6 * c, withE);
  b.flops(Pass::BackwardData, 4 * c, withEv);
  b.flops(Pass::BackwardData, 8 * c, qk);
  for (int i = 0; i < 3; ++i)
    b.saveInput(i);
  b.saveOutput(0);
  // The row log-sum-exp, fp32; the dropout mask is drawn again from the
  // seed in backward, never kept.
  b.sem.savedExtraBytes.push_back({4, bm | (uint64_t(1) << q)});
  return b.finish();
}

/// What the element-wise members [0, count) of a fused op cost and what
/// their backward needs: FLOPs per point, dropout masks (a byte per point
/// each), Relu signs, and whether it reads the members' values.
/// `byOperands`: a member needs values only when its derivative does (a
/// non-linear unary map, a product of two activations), not a scale by a
/// constant or a constant mask; otherwise every member whose eager op
/// saves values does.
struct ChainCosts {
  double fwd = 0, bwd = 0;
  bool needsValues = false;
  int masks = 0, signs = 0;
};

llvm::Expected<ChainCosts> chainCosts(const SemBuilder &b, const Op &op,
                                      int64_t count, bool byOperands) {
  ChainCosts c;
  for (int64_t j = 0; j < count; ++j) {
    std::string pre = "m" + std::to_string(j) + ".";
    std::string kind = op.getString(pre + "kind", "");
    double f = 0, bw = 0;
    char saves = '-';
    if (!eltSpecCosts(kind, f, bw, saves))
      return inputError("member {} of kind '{}' is not element-wise", j, kind);
    c.fwd += f;
    c.bwd += bw;
    if (kind == "Dropout") {
      c.masks += op.getInt(pre + "training_mode", 0) != 0 &&
                 op.getFloat(pre + "ratio", 0.5) > 0;
      continue;
    }
    if (!byOperands) {
      if (saves == 'm')
        ++c.signs; // a Relu's sign, a byte per point, as the eager op keeps
      else if (saves == 'i' || saves == 'o')
        c.needsValues = true;
      continue;
    }
    int activations = 0, operands = 0;
    for (int64_t ref : op.getInts(pre + "in")) {
      if (ref == std::numeric_limits<int64_t>::min())
        continue;
      ++operands;
      const Value *v = ref >= 0 ? b.in(size_t(ref)) : nullptr;
      activations += ref < 0 || (v && v->isActivationLike());
    }
    if ((saves == 'i' || saves == 'o' || saves == 'm') &&
        (operands == 1 || activations > 1))
      c.needsValues = true;
  }
  return c;
}

/// Saves every activation input (the values a chain runs again from).
void saveActivationInputs(SemBuilder &b) {
  for (size_t i = 0; i < b.numIn(); ++i)
    if (b.in(i) && b.in(i)->isActivationLike())
      b.saveInput(int(i));
}

llvm::Expected<OpSemantics> buildFusedElementwise(const Op &op,
                                                  const Graph &g) {
  SemBuilder b(op, g);
  auto loops = broadcastLoops(b, b.numIn());
  if (!loops)
    return loops.takeError();
  int64_t members = op.getInt("members", 0);
  if (members < 2)
    return inputError("FusedElementwise has {} members; it needs at least 2",
                      members);
  auto c = chainCosts(b, op, members, /*byOperands=*/false);
  if (!c)
    return c.takeError();
  if (c->fwd > 0)
    b.flops(Pass::Forward, c->fwd, b.allLoops());
  if (c->bwd > 0)
    b.flops(Pass::BackwardData, c->bwd, b.allLoops());
  for (size_t i = 0; i < b.numIn(); ++i)
    if (b.in(i) && b.in(i)->kind == ValueKind::Weight) {
      b.flops(Pass::BackwardWeight, 1, b.allLoops());
      break;
    }
  // Backward runs the chain again from its inputs (what a fused epilogue
  // such as Megatron's bias-GELU keeps), and reads each dropout's mask and
  // each Relu's sign (a byte per point each).
  if (c->needsValues)
    saveActivationInputs(b);
  // The signs come from the values when those are kept.
  int masks = c->masks + (c->needsValues ? 0 : c->signs);
  if (masks > 0)
    b.sem.savedExtraBytes.push_back({double(masks), b.allLoops()});
  return b.finish();
}

/// A softmax over the last axis with its element-wise prologue (the scale
/// and mask of attention scores: Megatron-LM's FusedScaleMaskSoftmax):
/// the members' encoding of FusedElementwise, the last a Softmax. It reads
/// its inputs once and writes the probabilities once, and keeps the
/// probabilities (what the softmax's backward needs); the prologue's
/// inputs only where a member's derivative needs values (a product of two
/// activations, a non-linear map), not for a scale by a constant or a
/// constant mask.
llvm::Expected<OpSemantics> buildFusedSoftmax(const Op &op, const Graph &g) {
  SemBuilder b(op, g);
  auto loops = broadcastLoops(b, b.numIn());
  if (!loops)
    return loops.takeError();
  int64_t members = op.getInt("members", 0);
  int64_t rank = int64_t(loops->size());
  int64_t axis = op.getInt("axis", rank - 1);
  if (members < 2 || axis != rank - 1 ||
      op.getString("m" + std::to_string(members - 1) + ".kind", "") !=
          "Softmax")
    return inputError("FusedSoftmax needs a prologue and a last-axis "
                      "Softmax as its last member");
  b.sem.loops[size_t((*loops)[size_t(axis)])].statReduced = true;
  // The softmax's own 5 and 3 FLOPs per point.
  auto c = chainCosts(b, op, members - 1, /*byOperands=*/true);
  if (!c)
    return c.takeError();
  b.flops(Pass::Forward, 5 + c->fwd, b.allLoops());
  b.flops(Pass::BackwardData, 3 + c->bwd, b.allLoops());
  b.saveOutput(0);
  if (c->needsValues)
    saveActivationInputs(b);
  if (c->masks > 0)
    b.sem.savedExtraBytes.push_back({double(c->masks), b.allLoops()});
  return b.finish();
}

/// Rotary position embedding (Su et al. 2021), non-interleaved: y = x cos
/// + rotate_half(x) sin over the last axis, cos and sin tables broadcast
/// over the leading dims. The last axis pairs element i with i + half, so
/// it is kept whole. Linear in x: backward needs only the tables.
llvm::Expected<OpSemantics> buildRotaryEmbedding(const Op &op,
                                                 const Graph &g) {
  SemBuilder b(op, g);
  if (b.numIn() != 3 || !b.in(0) || !b.in(1) || !b.in(2))
    return inputError("RotaryEmbedding takes X, cos and sin");
  auto loops = broadcastLoops(b, 3);
  if (!loops)
    return loops.takeError();
  if (loops->empty() || !b.out(0) || b.in(0)->shape.dims != b.out(0)->shape.dims)
    return inputError("RotaryEmbedding's output must be X's shape");
  b.sem.loops[size_t(loops->back())].splittable = false;
  b.flops(Pass::Forward, 3, b.allLoops());
  b.flops(Pass::BackwardData, 3, b.allLoops());
  return b.finish();
}

} // namespace

void registerFusedOps(OpRegistry &r) {
  r.add({"FusedSoftmax",
         "a last-axis softmax with its element-wise prologue (scale, mask) "
         "as one kernel (soapc --kernels fused|no-flash)",
         buildFusedSoftmax, {}, false, {}});
  r.add({"FlashAttention",
         "softmax(scale * Q Kᵀ + mask) V with dropout, as one kernel that "
         "keeps no scores (soapc --kernels fused)",
         buildFlashAttention, {}, false, {}});
  r.add({"RotaryEmbedding",
         "x cos + rotate_half(x) sin over the last axis, as one kernel "
         "(soapc --kernels fused|no-flash)",
         buildRotaryEmbedding, {}, false, {}});
  r.add({"FusedElementwise",
         "a chain of element-wise ops as one kernel (soapc --kernels fused)",
         buildFusedElementwise, {}, false, {}});
}

} // namespace detail
} // namespace soap
