// Kernel fusion (include/soap/IR/Fusion.h): pattern matching on the imported
// graph, then one new graph in which each matched pattern is one op placed
// where its last member was (every external input of a pattern is produced
// before its last member, so the order stays topological).
#include "soap/IR/Fusion.h"

#include "FusionPatterns.h"
#include "soap/Support/Error.h"
#include <algorithm>
#include <map>
#include <queue>
#include <set>

namespace soap {

llvm::StringRef kernelModeName(KernelMode m) {
  switch (m) {
  case KernelMode::Eager:
    return "eager";
  case KernelMode::Fused:
    return "fused";
  case KernelMode::NoFlash:
    return "no-flash";
  }
  return "?";
}

std::optional<KernelMode> parseKernelMode(llvm::StringRef name) {
  if (name == "eager")
    return KernelMode::Eager;
  if (name == "fused")
    return KernelMode::Fused;
  if (name == "no-flash")
    return KernelMode::NoFlash;
  return std::nullopt;
}

bool isFusibleElementwise(llvm::StringRef kind) {
  // Floating element-wise maps (not comparisons, casts or broadcasts, whose
  // outputs are not what a fused epilogue writes).
  static const char *const kKinds[] = {
      "Add",  "Sub",         "Mul",       "Div",  "Pow",     "Max",
      "Min",  "Where",       "Relu",      "LeakyRelu",       "Clip",
      "HardSigmoid",         "HardSwish", "Gelu", "Sigmoid", "Tanh",
      "Erf",  "Exp",         "Log",       "Sqrt", "Reciprocal",
      "Neg",  "Abs",         "Dropout"};
  for (const char *k : kKinds)
    if (kind == k)
      return true;
  return false;
}

namespace {

/// One matched attention: the eager ops it replaces and its operands.
struct AttentionMatch {
  std::vector<OpId> members;
  OpId softmax = -1;
  ValueId q = kNoValue, k = kNoValue, v = kNoValue, o = kNoValue;
  ValueId mask = kNoValue;
  /// Per tensor dim of each operand, its logical dim: [batch..., seq, feat].
  std::vector<int64_t> qDims, kDims, vDims, oDims;
  int64_t batchDims = 0;
  double scale = 1;
  bool causal = false;
  std::string maskKind = "none";
  double maskFill = 0;
  double dropoutRatio = 0;
  std::string dropoutName;
  int transposes = 0;
  /// Grouped-query attention: K and V have kvHeads heads, each read by
  /// heads / kvHeads query heads (the repeat before attention absorbed).
  int64_t heads = 0, kvHeads = 0;
};

/// Group numbers of the fixed patterns (FusionPatterns.h), above those of
/// attention and element-wise groups.
constexpr int kPatternBase = 1 << 28;

class Fuser {
public:
  explicit Fuser(const Graph &g) : g_(g), group_(g.numOps(), -1) {}

  llvm::Expected<std::unique_ptr<Graph>> run(FusionStats *stats,
                                             bool attention);

private:
  const Graph &g_;
  /// Per op, the pattern it belongs to (-1: none).
  std::vector<int> group_;
  std::vector<AttentionMatch> attention_;
  /// Element-wise groups: members ascending.
  std::vector<std::vector<OpId>> eltGroups_;
  std::vector<detail::FusedPattern> patterns_;

  const Op *producer(ValueId v) const {
    if (v == kNoValue)
      return nullptr;
    OpId p = g_.value(v).producer;
    return p < 0 ? nullptr : &g_.op(p);
  }
  bool soleUse(ValueId v, OpId user) const {
    const Value &val = g_.value(v);
    return val.users.size() == 1 && val.users[0] == user &&
           std::find(g_.outputs.begin(), g_.outputs.end(), v) ==
               g_.outputs.end();
  }
  bool free(OpId o) const { return group_[size_t(o)] < 0; }
  /// The single known value of a one-element constant.
  std::optional<double> scalar(ValueId v) const {
    const Value &val = g_.value(v);
    if (val.kind != ValueKind::Constant || val.data.size() != 1)
      return std::nullopt;
    return val.data[0];
  }
  bool isActivation(ValueId v) const {
    return v != kNoValue && g_.value(v).isActivationLike() &&
           isFloating(g_.value(v).dtype);
  }

  /// Whether `op` adds a bias (a 1-D weight of the last dim's size) to a
  /// GEMM's output that nothing else reads: Transformer Engine's Linear
  /// adds it in the GEMM's epilogue (Op::absorbed).
  bool biasEpilogue(const Op &op) const {
    if (op.kind != "Add" || op.inputs.size() != 2)
      return false;
    for (size_t i = 0; i < 2; ++i) {
      ValueId b = op.inputs[i], x = op.inputs[1 - i];
      if (b == kNoValue || x == kNoValue)
        return false;
      const Value &bv = g_.value(b), &xv = g_.value(x);
      const Op *p = producer(x);
      if (bv.kind == ValueKind::Weight && bv.shape.rank() == 1 &&
          xv.shape.rank() >= 1 && bv.shape.dims[0] == xv.shape.dims.back() &&
          p && (p->kind == "MatMul" || p->kind == "Gemm") && soleUse(x, op.id))
        return true;
    }
    return false;
  }
  void matchPatterns();
  void matchAttention();
  std::optional<AttentionMatch> matchAt(const Op &pv) const;
  void absorbTransposes(AttentionMatch &m) const;
  void absorbRepeats(AttentionMatch &m) const;
  std::optional<std::vector<OpId>> repeatOf(ValueId v, size_t headDim,
                                            OpId user, ValueId &source) const;
  void groupElementwise();
  Op attentionOp(const AttentionMatch &m, Graph &ng,
                 const std::function<ValueId(ValueId)> &map) const;
  Op elementwiseOp(const std::vector<OpId> &members, Graph &ng,
                   const std::function<ValueId(ValueId)> &map) const;
  Op patternOp(const detail::FusedPattern &p, Graph &ng,
               const std::function<ValueId(ValueId)> &map) const;
};

/// Whether `s` (a [.., Sq, Sk] causal-mask constant) is what causal
/// attention of Sq queries over Sk keys applies.
bool isCausalMask(const Value &mask, int64_t sq, int64_t sk) {
  if (!mask.lowerTriangular || mask.shape.rank() < 2)
    return false;
  size_t r = mask.shape.rank();
  return mask.shape[r - 2] == sq && mask.shape[r - 1] == sk;
}

std::optional<AttentionMatch> Fuser::matchAt(const Op &pv) const {
  // P·V: probabilities (softmax, then dropout) times values.
  if (pv.kind != "MatMul" || pv.inputs.size() != 2 ||
      !isActivation(pv.inputs[0]) || !isActivation(pv.inputs[1]))
    return std::nullopt;
  AttentionMatch m;
  m.members.push_back(pv.id);
  const Value &out = g_.value(pv.outputs[0]);
  size_t r = out.shape.rank();
  if (r != 3 && r != 4)
    return std::nullopt;
  ValueId probs = pv.inputs[0];
  const Op *p = producer(probs);
  if (p && p->kind == "Dropout" && free(p->id) && soleUse(probs, pv.id)) {
    if (p->getInt("training_mode", 0) != 0 && p->getFloat("ratio", 0.5) > 0) {
      m.dropoutRatio = p->getFloat("ratio", 0.5);
      m.dropoutName = p->name;
    }
    m.members.push_back(p->id);
    if (p->outputs.size() > 1 && p->outputs[1] != kNoValue &&
        !g_.value(p->outputs[1]).users.empty())
      return std::nullopt; // the mask is read elsewhere
    probs = p->inputs[0];
    p = producer(probs);
  }
  if (!p || p->kind != "Softmax" || !free(p->id) ||
      !soleUse(probs, m.members.back()) ||
      p->getInt("axis", -1) != int64_t(r) - 1)
    return std::nullopt;
  m.softmax = p->id;
  m.members.push_back(p->id);
  ValueId scores = p->inputs[0];
  OpId reader = p->id;
  p = producer(scores);
  // Optional mask (Where with a constant condition and fill, or an added
  // mask), after an optional scale (Mul or Div by a scalar constant).
  if (p && free(p->id) && soleUse(scores, reader) && p->kind == "Where" &&
      p->inputs.size() == 3) {
    auto fill = scalar(p->inputs[2]);
    const Value &cond = g_.value(p->inputs[0]);
    if (!fill || cond.kind != ValueKind::Constant)
      return std::nullopt;
    m.maskKind = "where";
    m.maskFill = *fill;
    m.mask = p->inputs[0];
    m.members.push_back(p->id);
    reader = p->id;
    scores = p->inputs[1];
    p = producer(scores);
  } else if (p && free(p->id) && soleUse(scores, reader) && p->kind == "Add" &&
             p->inputs.size() == 2) {
    // The scores are the operand a MatMul (or its scale) produced.
    int si = -1;
    for (int i = 0; i < 2; ++i) {
      const Op *q = producer(p->inputs[size_t(i)]);
      if (q && (q->kind == "MatMul" || q->kind == "Mul" || q->kind == "Div"))
        si = i;
    }
    ValueId maskV = si >= 0 ? p->inputs[size_t(1 - si)] : kNoValue;
    if (si < 0 || g_.value(maskV).kind == ValueKind::Weight ||
        !isFloating(g_.value(maskV).dtype))
      return std::nullopt;
    m.maskKind = "add";
    m.mask = maskV;
    m.members.push_back(p->id);
    reader = p->id;
    scores = p->inputs[size_t(si)];
    p = producer(scores);
  }
  if (p && free(p->id) && soleUse(scores, reader) &&
      (p->kind == "Mul" || p->kind == "Div") && p->inputs.size() == 2) {
    int ci = scalar(p->inputs[1]) ? 1 : scalar(p->inputs[0]) ? 0 : -1;
    if (ci < 0 || (p->kind == "Div" && ci == 0))
      return std::nullopt;
    double c = *scalar(p->inputs[size_t(ci)]);
    if (p->kind == "Div" && c == 0)
      return std::nullopt;
    m.scale = p->kind == "Mul" ? c : 1 / c;
    m.members.push_back(p->id);
    reader = p->id;
    scores = p->inputs[size_t(1 - ci)];
    p = producer(scores);
  }
  if (!p || p->kind != "MatMul" || !free(p->id) || !soleUse(scores, reader) ||
      !isActivation(p->inputs[0]) || !isActivation(p->inputs[1]))
    return std::nullopt;
  m.members.push_back(p->id);
  // Shapes: Q [B.., Sq, E], Kᵀ [B.., E, Sk], V [B.., Sk, Ev], the batch
  // dims equal (no broadcasting).
  const auto &q = g_.value(p->inputs[0]).shape.dims;
  const auto &kt = g_.value(p->inputs[1]).shape.dims;
  const auto &v = g_.value(pv.inputs[1]).shape.dims;
  if (q.size() != r || kt.size() != r || v.size() != r)
    return std::nullopt;
  size_t nb = r - 2;
  for (size_t d = 0; d < nb; ++d)
    if (q[d] != kt[d] || q[d] != v[d])
      return std::nullopt;
  if (q[nb + 1] != kt[nb] || kt[nb + 1] != v[nb])
    return std::nullopt;
  if (m.mask != kNoValue) {
    const Value &mv = g_.value(m.mask);
    if (m.maskKind == "where" && isCausalMask(mv, q[nb], kt[nb + 1])) {
      m.causal = true;
      m.mask = kNoValue;
    } else if (mv.shape.rank() > r) {
      return std::nullopt;
    }
  }
  m.batchDims = int64_t(nb);
  m.q = p->inputs[0];
  m.k = p->inputs[1];
  m.v = pv.inputs[1];
  m.o = pv.outputs[0];
  for (size_t d = 0; d < r; ++d) {
    m.qDims.push_back(int64_t(d));
    m.vDims.push_back(int64_t(d));
    m.oDims.push_back(int64_t(d));
  }
  // Kᵀ's last two dims are the logical [Sk, E] swapped.
  m.kDims = m.qDims;
  std::swap(m.kDims[nb], m.kDims[nb + 1]);
  std::sort(m.members.begin(), m.members.end());
  return m;
}

/// Folds a Transpose that only this attention reads (or that alone reads
/// its output) into the operand's layout: FlashAttention reads and writes
/// [batch, seq, heads, head dim] directly.
void Fuser::absorbTransposes(AttentionMatch &m) const {
  auto absorbIn = [&](ValueId &v, std::vector<int64_t> &dims, OpId user) {
    const Op *t = producer(v);
    if (!t || t->kind != "Transpose" || !free(t->id) || !soleUse(v, user) ||
        !isActivation(t->inputs[0]))
      return;
    std::vector<int64_t> perm = t->getInts("perm");
    if (perm.size() != dims.size())
      return;
    std::vector<int64_t> nd(dims.size());
    for (size_t i = 0; i < perm.size(); ++i)
      nd[size_t(perm[i])] = dims[i];
    dims = nd;
    v = t->inputs[0];
    m.members.push_back(t->id);
    ++m.transposes;
  };
  OpId qk = -1, pv = m.members.back();
  for (OpId o : m.members)
    if (g_.op(o).kind == "MatMul" && o < pv)
      qk = o;
  absorbIn(m.q, m.qDims, qk);
  // Q and K may be one tensor read twice (self-attention without
  // projections); then neither transpose is private.
  absorbIn(m.k, m.kDims, qk);
  absorbIn(m.v, m.vDims, pv);
  // Grouped-query attention: K and V repeated to the query heads; then
  // the transposes before the repeat.
  ValueId k = m.k, v = m.v;
  absorbRepeats(m);
  auto reader = [&](ValueId x) { return g_.value(x).users.front(); };
  if (m.k != k)
    absorbIn(m.k, m.kDims, reader(m.k));
  if (m.v != v)
    absorbIn(m.v, m.vDims, reader(m.v));
  const Value &o = g_.value(m.o);
  if (o.users.size() == 1 &&
      std::find(g_.outputs.begin(), g_.outputs.end(), m.o) ==
          g_.outputs.end()) {
    const Op &t = g_.op(o.users[0]);
    std::vector<int64_t> perm = t.getInts("perm");
    if (t.kind == "Transpose" && free(t.id) && perm.size() == m.oDims.size()) {
      std::vector<int64_t> nd(perm.size());
      for (size_t i = 0; i < perm.size(); ++i)
        nd[i] = m.oDims[size_t(perm[i])];
      m.oDims = nd;
      m.o = t.outputs[0];
      m.members.push_back(t.id);
      ++m.transposes;
    }
  }
  std::sort(m.members.begin(), m.members.end());
}

/// Whether `v` (read by `user`) is Reshape(Expand(Unsqueeze(src))) that
/// repeats each head of src's head dim `headDim` r times in a row
/// (transformers' repeat_kv); then sets `source` and returns the three ops.
std::optional<std::vector<OpId>> Fuser::repeatOf(ValueId v, size_t headDim,
                                                 OpId user,
                                                 ValueId &source) const {
  const Op *re = producer(v);
  if (!re || re->kind != "Reshape" || !free(re->id) || !soleUse(v, user))
    return std::nullopt;
  const Op *ex = producer(re->inputs[0]);
  if (!ex || ex->kind != "Expand" || !free(ex->id) ||
      !soleUse(re->inputs[0], re->id))
    return std::nullopt;
  const Op *un = producer(ex->inputs[0]);
  if (!un || un->kind != "Unsqueeze" || !free(un->id) ||
      !soleUse(ex->inputs[0], ex->id) || !isActivation(un->inputs[0]))
    return std::nullopt;
  const auto &out = g_.value(v).shape.dims;
  const auto &rep = g_.value(re->inputs[0]).shape.dims;
  const auto &one = g_.value(ex->inputs[0]).shape.dims;
  const auto &src = g_.value(un->inputs[0]).shape.dims;
  // src [.., G, ..] -> [.., G, 1, ..] -> [.., G, R, ..] -> [.., G*R, ..].
  size_t h = headDim;
  if (src.size() != out.size() || rep.size() != out.size() + 1 ||
      one.size() != rep.size() || h >= src.size())
    return std::nullopt;
  for (size_t d = 0, e = 0; d < out.size(); ++d, ++e) {
    if (d == h) {
      if (rep[e] != src[d] || one[e] != src[d] || one[e + 1] != 1 ||
          rep[e + 1] * src[d] != out[d] || rep[e + 1] < 2)
        return std::nullopt;
      ++e;
      continue;
    }
    if (rep[e] != out[d] || one[e] != out[d] || src[d] != out[d])
      return std::nullopt;
  }
  source = un->inputs[0];
  return std::vector<OpId>{re->id, ex->id, un->id};
}

void Fuser::absorbRepeats(AttentionMatch &m) const {
  // The heads are the last batch dim; K and V are repeated alike.
  int64_t headLogical = m.batchDims - 1;
  if (headLogical < 1)
    return;
  auto tensorDim = [](const std::vector<int64_t> &dims, int64_t logical) {
    return size_t(std::find(dims.begin(), dims.end(), logical) -
                  dims.begin());
  };
  // The readers of K and V: a MatMul or the transpose before it.
  auto readerOf = [&](ValueId v) {
    const Value &val = g_.value(v);
    return val.users.size() == 1 ? val.users[0] : OpId(-1);
  };
  ValueId ks = kNoValue, vs = kNoValue;
  auto kOps = repeatOf(m.k, tensorDim(m.kDims, headLogical), readerOf(m.k), ks);
  auto vOps = repeatOf(m.v, tensorDim(m.vDims, headLogical), readerOf(m.v), vs);
  if (!kOps || !vOps || m.k == m.v)
    return;
  int64_t heads = g_.value(m.k).shape[tensorDim(m.kDims, headLogical)];
  int64_t kv = g_.value(ks).shape[tensorDim(m.kDims, headLogical)];
  if (g_.value(vs).shape[tensorDim(m.vDims, headLogical)] != kv)
    return;
  m.k = ks;
  m.v = vs;
  m.heads = heads;
  m.kvHeads = kv;
  for (OpId o : *kOps)
    m.members.push_back(o);
  for (OpId o : *vOps)
    m.members.push_back(o);
  std::sort(m.members.begin(), m.members.end());
}

void Fuser::matchPatterns() {
  std::vector<bool> taken(g_.numOps(), false);
  auto add = [&](std::vector<detail::FusedPattern> found) {
    for (auto &p : found) {
      for (OpId o : p.members) {
        taken[size_t(o)] = true;
        group_[size_t(o)] = kPatternBase + int(patterns_.size());
      }
      patterns_.push_back(std::move(p));
    }
  };
  add(detail::matchRmsNorms(g_));
  add(detail::matchRotaries(g_, taken));
}

void Fuser::matchAttention() {
  for (const Op &op : g_.ops()) {
    auto m = matchAt(op);
    if (!m)
      continue;
    absorbTransposes(*m);
    int id = int(attention_.size());
    for (OpId o : m->members)
      group_[size_t(o)] = id;
    attention_.push_back(std::move(*m));
  }
}

/// Element-wise groups, grown backwards from each root: a producer joins
/// when it is a fusible element-wise op of the root's shape whose outputs
/// only members read. Candidates are taken latest first, so every reader of
/// one has been decided before it is.
void Fuser::groupElementwise() {
  auto candidate = [&](const Op &op, const std::vector<int64_t> &shape) {
    if (!free(op.id) || !isFusibleElementwise(op.kind) || op.outputs.empty())
      return false;
    const Value &y = g_.value(op.outputs[0]);
    if (!isFloating(y.dtype) || y.shape.dims != shape)
      return false;
    if (op.kind == "Dropout" && op.outputs.size() > 1 &&
        op.outputs[1] != kNoValue && !g_.value(op.outputs[1]).users.empty())
      return false;
    return true;
  };
  int base = int(attention_.size());
  for (size_t ri = g_.numOps(); ri-- > 0;) {
    const Op &root = g_.op(OpId(ri));
    if (root.outputs.empty() || root.outputs[0] == kNoValue)
      continue;
    const std::vector<int64_t> shape = g_.value(root.outputs[0]).shape.dims;
    // A softmax over the last axis takes its element-wise prologue (the
    // scale and mask of attention scores) into one kernel, as Megatron-LM's
    // FusedScaleMaskSoftmax does.
    bool softmax = root.kind == "Softmax" && free(root.id) &&
                   isFloating(g_.value(root.outputs[0]).dtype) &&
                   root.getInt("axis", -1) == int64_t(shape.size()) - 1;
    if (!softmax && !candidate(root, shape))
      continue;
    std::set<OpId> members{root.id};
    std::priority_queue<OpId> todo;
    auto pushInputs = [&](const Op &op) {
      for (ValueId v : op.inputs)
        if (const Op *p = producer(v))
          todo.push(p->id);
    };
    pushInputs(root);
    while (!todo.empty()) {
      OpId p = todo.top();
      todo.pop();
      if (members.count(p) || !candidate(g_.op(p), shape))
        continue;
      ValueId y = g_.op(p).outputs[0];
      const Value &val = g_.value(y);
      bool inside = std::find(g_.outputs.begin(), g_.outputs.end(), y) ==
                    g_.outputs.end();
      for (OpId u : val.users)
        inside = inside && members.count(u);
      if (!inside)
        continue;
      members.insert(p);
      pushInputs(g_.op(p));
    }
    if (members.size() < 2)
      continue;
    int id = base + int(eltGroups_.size());
    for (OpId o : members)
      group_[size_t(o)] = id;
    eltGroups_.emplace_back(members.begin(), members.end());
  }
  std::reverse(eltGroups_.begin(), eltGroups_.end());
  // Groups were numbered from the end; renumber in op order.
  for (size_t i = 0; i < eltGroups_.size(); ++i)
    for (OpId o : eltGroups_[i])
      group_[size_t(o)] = base + int(i);
}

std::string scopeOf(const std::string &name) {
  size_t slash = name.rfind('/');
  return slash == std::string::npos ? std::string() : name.substr(0, slash);
}

Op Fuser::attentionOp(const AttentionMatch &m, Graph &ng,
                      const std::function<ValueId(ValueId)> &map) const {
  Op op;
  op.kind = "FlashAttention";
  std::string base = scopeOf(g_.op(m.softmax).name) + "/FlashAttention";
  op.name = base;
  for (int k = 1; ng.findOp(op.name) >= 0 || g_.findOp(op.name) >= 0; ++k)
    op.name = base + "_" + std::to_string(k);
  op.inputs = {map(m.q), map(m.k), map(m.v)};
  if (m.mask != kNoValue)
    op.inputs.push_back(map(m.mask));
  op.outputs = {map(m.o)};
  op.attrs["q_dims"] = m.qDims;
  op.attrs["k_dims"] = m.kDims;
  op.attrs["v_dims"] = m.vDims;
  op.attrs["o_dims"] = m.oDims;
  op.attrs["batch_dims"] = m.batchDims;
  op.attrs["scale"] = m.scale;
  op.attrs["causal"] = int64_t(m.causal);
  op.attrs["mask"] = m.maskKind;
  op.attrs["mask_fill"] = m.maskFill;
  op.attrs["dropout_ratio"] = m.dropoutRatio;
  op.attrs["dropout_name"] = m.dropoutName;
  if (m.kvHeads > 0) {
    op.attrs["heads"] = m.heads;
    op.attrs["kv_heads"] = m.kvHeads;
  }
  return op;
}

Op Fuser::patternOp(const detail::FusedPattern &p, Graph &ng,
                    const std::function<ValueId(ValueId)> &map) const {
  Op op;
  op.kind = p.kind;
  std::string base = p.scope + "/" + p.kind;
  op.name = base;
  for (int k = 1; ng.findOp(op.name) >= 0 || g_.findOp(op.name) >= 0; ++k)
    op.name = base + "_" + std::to_string(k);
  for (ValueId v : p.inputs)
    op.inputs.push_back(map(v));
  for (ValueId v : p.outputs)
    op.outputs.push_back(map(v));
  op.attrs = p.attrs;
  return op;
}

Op Fuser::elementwiseOp(const std::vector<OpId> &members, Graph &ng,
                        const std::function<ValueId(ValueId)> &map) const {
  const Op &root = g_.op(members.back());
  Op op;
  op.kind = root.kind == "Softmax" ? "FusedSoftmax" : "FusedElementwise";
  op.name = root.name + "/Fused";
  for (int k = 1; ng.findOp(op.name) >= 0 || g_.findOp(op.name) >= 0; ++k)
    op.name = root.name + "/Fused_" + std::to_string(k);
  // Operand references: i >= 0 the fused op's input i, -(j + 1) member j's
  // output.
  std::vector<ValueId> external;
  std::string kinds;
  for (size_t j = 0; j < members.size(); ++j) {
    const Op &m = g_.op(members[j]);
    std::vector<int64_t> refs;
    for (ValueId v : m.inputs) {
      if (v == kNoValue) {
        refs.push_back(std::numeric_limits<int64_t>::min());
        continue;
      }
      auto it = std::find(members.begin(), members.end(), g_.value(v).producer);
      if (g_.value(v).producer >= 0 && it != members.end()) {
        refs.push_back(-int64_t(it - members.begin()) - 1);
        continue;
      }
      auto e = std::find(external.begin(), external.end(), v);
      refs.push_back(int64_t(e - external.begin()));
      if (e == external.end())
        external.push_back(v);
    }
    std::string pre = "m" + std::to_string(j) + ".";
    op.attrs[pre + "kind"] = m.kind;
    op.attrs[pre + "name"] = m.name;
    op.attrs[pre + "in"] = refs;
    for (const auto &[key, value] : m.attrs)
      op.attrs[pre + key] = value;
    kinds += (j ? "," : "") + m.kind;
  }
  op.attrs["members"] = int64_t(members.size());
  if (root.kind == "Softmax")
    op.attrs["axis"] = root.getInt("axis", -1);
  op.attrs["kinds"] = kinds;
  for (ValueId v : external)
    op.inputs.push_back(map(v));
  op.outputs = {map(root.outputs[0])};
  return op;
}

llvm::Expected<std::unique_ptr<Graph>> Fuser::run(FusionStats *stats,
                                                   bool attention) {
  matchPatterns();
  if (attention)
    matchAttention();
  groupElementwise();
  auto ng = std::make_unique<Graph>();
  ng->name = g_.name;
  ng->sourcePath = g_.sourcePath;
  std::vector<ValueId> remap(g_.numValues(), kNoValue);
  std::function<ValueId(ValueId)> map = [&](ValueId v) -> ValueId {
    if (v == kNoValue)
      return kNoValue;
    if (remap[size_t(v)] == kNoValue) {
      Value c = g_.value(v);
      c.users.clear();
      c.producer = -1;
      c.producerOutput = -1;
      remap[size_t(v)] = ng->addValue(std::move(c));
    }
    return remap[size_t(v)];
  };
  for (ValueId v : g_.inputs)
    ng->inputs.push_back(map(v));
  // Each pattern is emitted at its last member.
  std::map<int, OpId> last;
  for (size_t o = 0; o < g_.numOps(); ++o)
    if (group_[o] >= 0)
      last[group_[o]] = OpId(o);
  for (const Op &op : g_.ops()) {
    int grp = group_[size_t(op.id)];
    if (grp < 0) {
      Op c;
      c.name = op.name;
      c.kind = op.kind;
      c.attrs = op.attrs;
      c.absorbed = isViewKind(op.kind) || (attention && biasEpilogue(op));
      for (ValueId v : op.inputs)
        c.inputs.push_back(map(v));
      for (ValueId v : op.outputs)
        c.outputs.push_back(map(v));
      ng->addOp(std::move(c));
      continue;
    }
    if (last[grp] != op.id)
      continue;
    if (grp >= kPatternBase)
      ng->addOp(patternOp(patterns_[size_t(grp - kPatternBase)], *ng, map));
    else if (size_t(grp) < attention_.size())
      ng->addOp(attentionOp(attention_[size_t(grp)], *ng, map));
    else
      ng->addOp(elementwiseOp(eltGroups_[size_t(grp) - attention_.size()],
                              *ng, map));
  }
  for (ValueId v : g_.outputs)
    ng->outputs.push_back(map(v));
  if (auto err = ng->verify())
    return internalError("kernel fusion broke the graph: {}",
                         llvm::toString(std::move(err)));
  if (auto err = ng->computeSemantics())
    return llvm::Error(std::move(err));
  if (stats) {
    stats->attention = int(attention_.size());
    stats->elementwise = int(eltGroups_.size());
    stats->elementwiseOps = 0;
    stats->transposes = 0;
    for (const auto &grp : eltGroups_)
      stats->elementwiseOps += int(grp.size());
    stats->groupedQuery = 0;
    for (const auto &m : attention_) {
      stats->transposes += m.transposes;
      stats->groupedQuery += m.kvHeads > 0;
    }
    stats->rmsNorm = stats->rotary = 0;
    for (const auto &p : patterns_) {
      stats->rmsNorm += p.kind == "RMSNormalization";
      stats->rotary += p.kind == "RotaryEmbedding";
    }
    stats->opsBefore = g_.numOps();
    stats->opsAfter = ng->numOps();
  }
  return ng;
}

} // namespace

llvm::Expected<std::unique_ptr<Graph>>
fuseKernels(const Graph &g, FusionStats *stats, KernelMode mode) {
  if (mode == KernelMode::Eager)
    return internalError("fuseKernels asked for the eager graph");
  return Fuser(g).run(stats, mode == KernelMode::Fused);
}

} // namespace soap
