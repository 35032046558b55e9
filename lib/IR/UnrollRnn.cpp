// LSTM unrolling: a graph rewrite on the IR, then dead-op removal.
#include "soap/IR/UnrollRnn.h"

#include "soap/Support/Error.h"
#include <map>

namespace soap {

namespace {

/// Copies `g` keeping only ops that reach a graph output (and the values
/// they touch, plus all graph inputs).
std::unique_ptr<Graph> withoutDeadOps(const Graph &g) {
  std::vector<bool> liveValue(g.numValues(), false), liveOp(g.numOps(), false);
  for (ValueId v : g.outputs)
    liveValue[v] = true;
  for (size_t k = g.numOps(); k-- > 0;) {
    const Op &o = g.op(static_cast<OpId>(k));
    bool live = false;
    for (ValueId v : o.outputs)
      live |= v != kNoValue && liveValue[v];
    if (!live)
      continue;
    liveOp[k] = true;
    for (ValueId v : o.inputs)
      if (v != kNoValue)
        liveValue[v] = true;
    for (ValueId v : o.outputs)
      if (v != kNoValue)
        liveValue[v] = true;
  }
  for (ValueId v : g.inputs)
    liveValue[v] = true;
  auto out = std::make_unique<Graph>();
  out->name = g.name;
  out->sourcePath = g.sourcePath;
  std::vector<ValueId> remap(g.numValues(), kNoValue);
  for (const Value &v : g.values()) {
    if (!liveValue[v.id])
      continue;
    Value c = v;
    c.users.clear();
    c.producer = -1;
    c.producerOutput = -1;
    remap[v.id] = out->addValue(std::move(c));
  }
  for (const Op &o : g.ops()) {
    if (!liveOp[o.id])
      continue;
    Op c = o;
    for (ValueId &v : c.inputs)
      v = v == kNoValue ? kNoValue : remap[v];
    for (ValueId &v : c.outputs)
      v = v == kNoValue || !liveValue[v] ? kNoValue : remap[v];
    out->addOp(std::move(c));
  }
  for (ValueId v : g.inputs)
    out->inputs.push_back(remap[v]);
  for (ValueId v : g.outputs)
    out->outputs.push_back(remap[v]);
  return out;
}

class Unroller {
public:
  explicit Unroller(const Graph &g) : src_(g) {
    out_.name = g.name;
    out_.sourcePath = g.sourcePath;
  }

  llvm::Expected<std::unique_ptr<Graph>> run() {
    for (const Value &v : src_.values()) {
      Value c = v;
      c.users.clear();
      c.producer = -1;
      c.producerOutput = -1;
      out_.addValue(std::move(c)); // same ids as the source
    }
    for (const Op &o : src_.ops()) {
      if (isUnrollable(o)) {
        if (auto err = unroll(o))
          return llvm::Error(std::move(err));
      } else if (!forwardSqueeze(o)) {
        Op c = o;
        c.sem = OpSemantics();
        out_.addOp(std::move(c));
      }
    }
    out_.inputs = src_.inputs;
    out_.outputs = src_.outputs;
    std::unique_ptr<Graph> g = withoutDeadOps(out_);
    if (auto err = g->computeSemantics())
      return llvm::Error(std::move(err));
    if (auto err = g->verify())
      return llvm::Error(std::move(err));
    return llvm::Expected<std::unique_ptr<Graph>>(std::move(g));
  }

private:
  const Graph &src_;
  Graph out_;
  /// Per unrolled LSTM output Y: its step outputs h_t in time order and the
  /// stacked [T, N, H] value.
  struct Steps {
    std::vector<ValueId> h;
    ValueId stacked = kNoValue;
  };
  std::map<ValueId, Steps> stepsOfY_;
  /// Squeeze outputs that stand for an unrolled Y without its direction axis.
  std::map<ValueId, ValueId> squeezedY_;

  bool isUnrollable(const Op &o) const {
    return o.kind == "LSTM" && o.getString("direction", "forward") != "bidirectional" &&
           o.input(4) == kNoValue && o.input(7) == kNoValue &&
           o.getInt("layout", 0) == 0;
  }

  /// Squeeze(Y, axes=[1]) of an unrolled Y is the stacked steps themselves.
  bool forwardSqueeze(const Op &o) {
    if (o.kind != "Squeeze" || o.getInts("axes") != std::vector<int64_t>{1})
      return false;
    auto it = stepsOfY_.find(o.input(0));
    if (it == stepsOfY_.end())
      return false;
    squeezedY_[o.output(0)] = o.input(0);
    Op id;
    id.kind = "Identity";
    id.name = o.name;
    id.inputs = {it->second.stacked};
    id.outputs = {o.output(0)};
    out_.addOp(std::move(id));
    return true;
  }

  ValueId newValue(const std::string &name, std::vector<int64_t> shape,
                   DType t) {
    Value v;
    v.name = name;
    v.shape = TensorShape(std::move(shape));
    v.dtype = t;
    return out_.addValue(std::move(v));
  }

  llvm::Error unroll(const Op &o) {
    const Value &X = src_.value(o.input(0));
    int64_t T = X.shape[0], N = X.shape[1];
    int64_t H = o.getInt("hidden_size", 0);
    if (H <= 0 || X.shape.rank() != 3)
      return inputError("{}: cannot unroll: hidden_size and X's shape are "
                        "required",
                        src_.where(o.id));
    bool reverse = o.getString("direction", "forward") == "reverse";
    // A layer fed by an unrolled layer reads its steps directly.
    const Steps *inSteps = nullptr;
    auto sq = squeezedY_.find(o.input(0));
    if (sq != squeezedY_.end())
      inSteps = &stepsOfY_[sq->second];
    DType dt = X.dtype;
    ValueId Y = o.output(0);
    std::string base = Y != kNoValue ? src_.value(Y).name : o.name;
    std::vector<ValueId> h(T, kNoValue);
    ValueId hPrev = o.input(5), cPrev = o.input(6), cLast = kNoValue;
    for (int64_t k = 0; k < T; ++k) {
      int64_t t = reverse ? T - 1 - k : k;
      Op cell;
      cell.kind = "LSTMCell";
      cell.name = fmt::format("{}.t{}", o.name, t);
      cell.attrs["hidden_size"] = H;
      ValueId x = o.input(0);
      if (inSteps)
        x = inSteps->h[t];
      else
        cell.attrs["x_time"] = t;
      cell.inputs = {x, o.input(1), o.input(2), o.input(3), hPrev, cPrev};
      h[t] = newValue(fmt::format("{}.h{}", base, t), {N, H}, dt);
      cLast = newValue(fmt::format("{}.c{}", base, t), {N, H}, dt);
      cell.outputs = {h[t], cLast};
      out_.addOp(std::move(cell));
      hPrev = h[t];
      cPrev = cLast;
    }
    Steps steps;
    steps.h = h;
    steps.stacked = newValue(base + ".steps", {T, N, H}, dt);
    Op stack;
    stack.kind = "Stack";
    stack.name = o.name + ".stack";
    stack.inputs = h;
    stack.outputs = {steps.stacked};
    out_.addOp(std::move(stack));
    auto unsqueeze = [&](ValueId in, ValueId outId, int64_t axis,
                         const std::string &name) {
      Op u;
      u.kind = "Unsqueeze";
      u.name = name;
      u.attrs["axes"] = std::vector<int64_t>{axis};
      u.inputs = {in};
      u.outputs = {outId};
      out_.addOp(std::move(u));
    };
    if (Y != kNoValue)
      unsqueeze(steps.stacked, Y, 1, o.name + ".Y");
    ValueId last = h[reverse ? 0 : T - 1];
    if (o.output(1) != kNoValue)
      unsqueeze(last, o.output(1), 0, o.name + ".Y_h");
    if (o.output(2) != kNoValue)
      unsqueeze(cLast, o.output(2), 0, o.name + ".Y_c");
    if (Y != kNoValue)
      stepsOfY_[Y] = std::move(steps);
    return llvm::Error::success();
  }
};

} // namespace

llvm::Expected<std::unique_ptr<Graph>> unrollLstms(const Graph &g) {
  return Unroller(g).run();
}

} // namespace soap
