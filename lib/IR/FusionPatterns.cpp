// RMSNorm and rotary-embedding patterns for kernel fusion (FusionPatterns.h):
// each anchored at the one op every way of writing it contains (the mean,
// the concatenation), then followed to its ends through values that only
// the pattern reads.
#include "FusionPatterns.h"

#include <algorithm>
#include <optional>

namespace soap::detail {

namespace {

class Matcher {
public:
  explicit Matcher(const Graph &g) : g_(g) {}

  const Op *producer(ValueId v) const {
    if (v == kNoValue)
      return nullptr;
    OpId p = g_.value(v).producer;
    return p < 0 ? nullptr : &g_.op(p);
  }
  /// The one op that reads `v` (and `v` is no graph output), or null.
  const Op *soleUser(ValueId v) const {
    const Value &val = g_.value(v);
    if (val.users.size() != 1 ||
        std::find(g_.outputs.begin(), g_.outputs.end(), v) != g_.outputs.end())
      return nullptr;
    return &g_.op(val.users[0]);
  }
  std::optional<double> scalar(ValueId v) const {
    const Value &val = g_.value(v);
    if (val.kind != ValueKind::Constant || val.data.size() != 1)
      return std::nullopt;
    return val.data[0];
  }
  bool isScalar(ValueId v, double x) const {
    auto s = scalar(v);
    return s && *s == x;
  }
  /// For a binary op, the operand that is not `v` (kNoValue when neither
  /// or both are).
  ValueId other(const Op &op, ValueId v) const {
    if (op.inputs.size() != 2 || (op.inputs[0] == v) == (op.inputs[1] == v))
      return kNoValue;
    return op.inputs[0] == v ? op.inputs[1] : op.inputs[0];
  }
  bool isActivation(ValueId v) const {
    return v != kNoValue && g_.value(v).isActivationLike() &&
           isFloating(g_.value(v).dtype);
  }
  const std::vector<int64_t> &shape(ValueId v) const {
    return g_.value(v).shape.dims;
  }

private:
  const Graph &g_;
};

std::string scopeOf(const std::string &name) {
  size_t slash = name.rfind('/');
  return slash == std::string::npos ? std::string() : name.substr(0, slash);
}

bool lastAxis(int64_t axis, size_t rank) {
  return axis == -1 || axis == int64_t(rank) - 1;
}

} // namespace

std::vector<FusedPattern> matchRmsNorms(const Graph &g) {
  Matcher m(g);
  std::vector<FusedPattern> out;
  for (const Op &mean : g.ops()) {
    if (mean.kind != "ReduceMean" || mean.inputs.size() != 1 ||
        mean.outputs.size() != 1 || mean.getInt("keepdims", 1) != 1)
      continue;
    std::vector<int64_t> axes = mean.getInts("axes");
    ValueId sqV = mean.inputs[0];
    size_t rank = m.shape(sqV).size();
    if (axes.size() != 1 || rank < 1 || !lastAxis(axes[0], rank))
      continue;
    // The square: Pow(x, 2) or Mul(x, x).
    const Op *sq = m.producer(sqV);
    if (!sq || m.soleUser(sqV) != &mean || sq->inputs.size() != 2)
      continue;
    ValueId x = sq->inputs[0];
    if (!(sq->kind == "Pow" && m.isScalar(sq->inputs[1], 2)) &&
        !(sq->kind == "Mul" && sq->inputs[1] == x))
      continue;
    if (!m.isActivation(x) || m.shape(x) != m.shape(sqV))
      continue;
    // + eps, sqrt, reciprocal.
    const Op *add = m.soleUser(mean.outputs[0]);
    if (!add || add->kind != "Add")
      continue;
    ValueId epsV = m.other(*add, mean.outputs[0]);
    auto eps = epsV == kNoValue ? std::nullopt : m.scalar(epsV);
    if (!eps)
      continue;
    const Op *root = m.soleUser(add->outputs[0]);
    if (!root || root->kind != "Sqrt")
      continue;
    const Op *inv = m.soleUser(root->outputs[0]);
    if (!inv || !((inv->kind == "Div" && inv->inputs.size() == 2 &&
                   inv->inputs[1] == root->outputs[0] &&
                   m.isScalar(inv->inputs[0], 1)) ||
                  inv->kind == "Reciprocal"))
      continue;
    // x · r, then · w.
    const Op *scaled = m.soleUser(inv->outputs[0]);
    if (!scaled || scaled->kind != "Mul" ||
        m.other(*scaled, inv->outputs[0]) != x)
      continue;
    FusedPattern p;
    p.members = {sq->id, mean.id, add->id, root->id, inv->id, scaled->id};
    p.inputs = {x};
    ValueId y = scaled->outputs[0];
    if (const Op *byW = m.soleUser(y); byW && byW->kind == "Mul") {
      ValueId w = m.other(*byW, y);
      const Value *wv = w == kNoValue ? nullptr : &g.value(w);
      if (wv && wv->kind == ValueKind::Weight && wv->shape.rank() == 1 &&
          wv->shape[0] == m.shape(x).back() && m.shape(byW->outputs[0]) ==
                                                   m.shape(x)) {
        p.members.push_back(byW->id);
        p.inputs.push_back(w);
        y = byW->outputs[0];
      }
    }
    std::sort(p.members.begin(), p.members.end());
    p.kind = "RMSNormalization";
    p.scope = scopeOf(mean.name);
    p.outputs = {y};
    p.attrs["axis"] = int64_t(-1);
    p.attrs["epsilon"] = *eps;
    out.push_back(std::move(p));
  }
  return out;
}

std::vector<FusedPattern> matchRotaries(const Graph &g,
                                        const std::vector<bool> &taken) {
  Matcher m(g);
  std::vector<FusedPattern> out;
  auto free = [&](const Op *op) { return op && !taken[size_t(op->id)]; };
  // Slice of x's last axis [start, start + half) with every other dim whole.
  auto halfOf = [&](const Op *s, ValueId x, int64_t start) {
    if (!free(s) || s->kind != "Slice" || s->inputs.empty() ||
        s->inputs[0] != x)
      return false;
    const std::vector<int64_t> &xs = m.shape(x), &ys = m.shape(s->outputs[0]);
    std::vector<int64_t> starts = s->getInts("starts"),
                         steps = s->getInts("steps");
    size_t r = xs.size();
    if (ys.size() != r || starts.size() != r || steps.size() != r ||
        xs.back() % 2 || ys.back() != xs.back() / 2)
      return false;
    for (size_t d = 0; d < r; ++d) {
      int64_t want = d + 1 == r ? start : 0;
      if (steps[d] != 1 || starts[d] != want || (d + 1 < r && ys[d] != xs[d]))
        return false;
    }
    return true;
  };
  auto isTable = [&](ValueId v) {
    return v != kNoValue && g.value(v).kind == ValueKind::Constant;
  };
  for (const Op &cat : g.ops()) {
    if (taken[size_t(cat.id)] || cat.kind != "Concat" ||
        cat.inputs.size() != 2 || cat.outputs.size() != 1)
      continue;
    ValueId rot = cat.outputs[0];
    size_t rank = m.shape(rot).size();
    if (rank < 2 || !lastAxis(cat.getInt("axis", 0), rank))
      continue;
    const Op *neg = m.producer(cat.inputs[0]);
    if (!free(neg) || neg->kind != "Neg" ||
        m.soleUser(cat.inputs[0]) != &cat)
      continue;
    const Op *hi = m.producer(neg->inputs[0]);
    const Op *lo = m.producer(cat.inputs[1]);
    if (!hi || !lo || m.soleUser(neg->inputs[0]) != neg ||
        m.soleUser(cat.inputs[1]) != &cat)
      continue;
    ValueId x = hi->inputs.empty() ? kNoValue : hi->inputs[0];
    if (!m.isActivation(x) || m.shape(x) != m.shape(rot) ||
        !halfOf(hi, x, m.shape(x).back() / 2) || !halfOf(lo, x, 0))
      continue;
    // rot · sin + x · cos, in either order.
    const Op *bySin = m.soleUser(rot);
    if (!free(bySin) || bySin->kind != "Mul")
      continue;
    ValueId sin = m.other(*bySin, rot);
    const Op *add = m.soleUser(bySin->outputs[0]);
    if (!isTable(sin) || !free(add) || add->kind != "Add")
      continue;
    ValueId xc = m.other(*add, bySin->outputs[0]);
    const Op *byCos = m.producer(xc);
    if (xc == kNoValue || !free(byCos) || byCos->kind != "Mul" ||
        m.soleUser(xc) != add)
      continue;
    ValueId cos = m.other(*byCos, x);
    if (!isTable(cos) || m.shape(add->outputs[0]) != m.shape(x))
      continue;
    FusedPattern p;
    p.members = {byCos->id, hi->id, neg->id, lo->id, cat.id, bySin->id,
                 add->id};
    std::sort(p.members.begin(), p.members.end());
    p.kind = "RotaryEmbedding";
    p.scope = scopeOf(cat.name);
    p.inputs = {x, cos, sin};
    p.outputs = {add->outputs[0]};
    p.attrs["interleaved"] = int64_t(0);
    out.push_back(std::move(p));
  }
  return out;
}

} // namespace soap::detail
