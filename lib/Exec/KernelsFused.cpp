// The fused kernels of `--kernels fused` (IR/Fusion.h). FusedElementwise: a
// chain of element-wise ops evaluated point by point with the element-wise
// kernel's functions (ElementwiseMath.h), its dropout masks drawn as the
// eager Dropout draws them; backward runs the chain again from its inputs
// and back-propagates through the members. FusedSoftmax: such a chain (the
// scale and mask of attention scores) into a last-axis softmax, which runs
// the Softmax kernel's rows (statistics combined across a split axis).
// RotaryEmbedding: x cos + rotate_half(x) sin over the (whole) last axis.
#include "ElementwiseMath.h"
#include "Kernels.h"

#include "soap/IR/Fusion.h"
#include "soap/Support/Error.h"
#include "soap/Support/Rng.h"
#include <limits>

namespace soap {
namespace exec {

namespace {

constexpr int64_t kAbsent = std::numeric_limits<int64_t>::min();
constexpr size_t kMaxOperands = 3;

/// One member of the chain.
struct Member {
  ElemParams fn;
  bool isDropout = false;
  bool drops = false; ///< a Dropout in training with ratio > 0
  float ratio = 0, scale = 1;
  uint64_t stream = 0; ///< the eager Dropout's mask stream
  std::vector<int64_t> in;
  /// Its byte in each point's slice of Task::mask, or -1: a dropping
  /// Dropout's keep bit; a Relu's or LeakyRelu's sign of its input when
  /// backward has no values.
  int slot = -1;
};

struct Chain {
  std::vector<Member> members;
  /// Whether some member's partials read values (the semantics then save
  /// the activation inputs, and backward evaluates the chain again); else
  /// every partial is a constant or reads a mask.
  bool needsValues = false;
  int slots = 0;
  bool drops = false;
};

std::string memberKey(int64_t j, llvm::StringRef key) {
  return "m" + std::to_string(j) + "." + key.str();
}

/// Kinds whose partial derivatives read no values (the semantics' '-' and
/// 'm' element-wise kinds): a chain of only these saves no inputs.
bool valueFree(llvm::StringRef kind) {
  return kind == "Add" || kind == "Sub" || kind == "Neg" || kind == "Relu" ||
         kind == "LeakyRelu" || kind == "Dropout";
}

/// Checks members 0 .. n-1 as a FusedElementwise's.
llvm::Error checkMembers(const Op &op, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    std::string kind = op.getString(memberKey(j, "kind"), "");
    if (!isFusibleElementwise(kind))
      return inputError("member {} of kind '{}' is not a fusible "
                        "element-wise op",
                        j, kind);
    if (kind == "Gelu" &&
        op.getString(memberKey(j, "approximate"), "none") != "none")
      return inputError("member {}: Gelu approximate='{}' is not supported", j,
                        op.getString(memberKey(j, "approximate"), "none"));
    if (kind == "Dropout") {
      double r = op.getFloat(memberKey(j, "ratio"), 0.5);
      if (r < 0 || r >= 1)
        return inputError("member {}: Dropout ratio {} is outside [0, 1)", j,
                          r);
    }
    std::vector<int64_t> in = op.getInts(memberKey(j, "in"));
    if (in.empty() || in.size() > kMaxOperands)
      return inputError("member {} ({}) has {} operands", j, kind, in.size());
    for (int64_t r : in)
      if (r != kAbsent &&
          (r >= int64_t(op.inputs.size()) || (r < 0 && -r - 1 >= j)))
        return inputError("member {} reads operand {}, which is neither an "
                          "input nor an earlier member",
                          j, r);
  }
  return llvm::Error::success();
}

llvm::Error checkFusedElementwise(const Graph &, const Op &op) {
  int64_t n = op.getInt("members", 0);
  if (n < 1)
    return inputError("FusedElementwise has no members");
  return checkMembers(op, n);
}

/// Members 0 .. n-1 of `op` as a chain; `values`: backward evaluates the
/// chain again (no member keeps a sign) whatever its kinds.
Chain chainOf(const Op &op, int64_t step, int64_t n, bool values) {
  Chain c;
  c.needsValues = values;
  for (int64_t j = 0; j < n; ++j)
    c.needsValues |= !valueFree(op.getString(memberKey(j, "kind"), ""));
  for (int64_t j = 0; j < n; ++j) {
    Member m;
    std::string kind = op.getString(memberKey(j, "kind"), "");
    m.in = op.getInts(memberKey(j, "in"));
    if (kind == "Dropout") {
      // As the eager kernel (KernelsPointwise.cpp, dropoutWalk) draws it.
      m.isDropout = true;
      m.ratio = float(op.getFloat(memberKey(j, "ratio"), 0.5));
      m.drops = op.getInt(memberKey(j, "training_mode"), 0) != 0 && m.ratio > 0;
      m.scale = m.drops ? 1 / (1 - m.ratio) : 1.0f;
      m.stream = fnv1a(op.getString(memberKey(j, "name"), "")) ^
                 (uint64_t(step) * 0x9E3779B97F4A7C15ull);
      if (m.drops)
        m.slot = c.slots++;
      c.drops |= m.drops;
    } else {
      m.fn.fn = elemFnOf(kind).value_or(ElemFn::Identity);
      ElemScalars sc = elemScalars(m.fn.fn, [&](const char *key, double d) {
        return op.getFloat(memberKey(j, key), d);
      });
      m.fn.alpha = sc.a;
      m.fn.beta = sc.b;
      if (!c.needsValues &&
          (m.fn.fn == ElemFn::Relu || m.fn.fn == ElemFn::LeakyRelu))
        m.slot = c.slots++;
    }
    c.members.push_back(std::move(m));
  }
  return c;
}

/// The point iterator's operands: the output, every input, and (when a
/// member drops) the output over the whole tensor, whose offset is the
/// global index the masks are drawn at.
std::vector<Operand> operands(const Graph &g, const Op &op, const Box &out,
                              const std::vector<Buf> &in, bool global) {
  std::vector<Operand> ops{{&op.sem.outputs[0], out}};
  for (size_t i = 0; i < op.inputs.size(); ++i)
    ops.push_back({&op.sem.inputs[i], in[i].box});
  if (global)
    ops.push_back(
        {&op.sem.outputs[0], Box::full(g.value(op.outputs[0]).shape.dims)});
  return ops;
}

/// Operand ref `r` at the point: 0 when absent, a member's value, or input
/// r's (`in` its data, `o` the point's offsets: 1 + r is input r's).
float operandAt(int64_t r, const float *const *in, const int64_t *o,
                const float *vals) {
  return r == kAbsent ? 0.0f : r < 0 ? vals[-r - 1] : in[r][o[1 + r]];
}

/// The data of a task's inputs.
std::vector<const float *> inputData(const Task &t) {
  std::vector<const float *> in;
  for (const Buf &b : t.in)
    in.push_back(b.data.data());
  return in;
}

/// Evaluates the chain at one point into `vals` (per member), drawing the
/// dropout masks (`mask` the point's slice, written) or reading them back
/// (`draw` false).
void evaluate(const Chain &c, const float *const *in, const int64_t *o,
              uint64_t seed, size_t globalOp, bool draw, uint8_t *mask,
              float *vals) {
  for (size_t j = 0; j < c.members.size(); ++j) {
    const Member &m = c.members[j];
    float x[kMaxOperands] = {0, 0, 0};
    for (size_t k = 0; k < m.in.size(); ++k)
      x[k] = operandAt(m.in[k], in, o, vals);
    if (m.isDropout) {
      bool keep = true;
      if (m.drops) {
        if (draw) {
          keep = hashUniform(seed, m.stream, uint64_t(o[globalOp])) >= m.ratio;
          mask[m.slot] = keep;
        } else {
          keep = mask[m.slot] != 0;
        }
      }
      vals[j] = keep ? x[0] * m.scale : 0.0f;
      continue;
    }
    vals[j] = elemApply(m.fn, x);
    if (draw && m.slot >= 0)
      mask[m.slot] = x[0] > 0;
  }
}

/// Evaluates the chain over each task's output box, drawing its masks, and
/// writes operand ref `result` of each point into out[k] (over that box).
void chainForward(KernelCtx &ctx, const Chain &c, int64_t result,
                  const std::vector<float *> &out) {
  const Op &op = ctx.op;
  size_t slots = size_t(c.slots);
  size_t globalOp = 1 + op.inputs.size();
  std::vector<float> vals(c.members.size() + 1);
  for (size_t k = 0; k < ctx.tasks.size(); ++k) {
    Task &t = ctx.tasks[k];
    PointIter it(op.sem, operands(ctx.graph, op, t.out[0].box, t.in, c.drops));
    t.mask.assign(t.out[0].data.size() * slots, 0);
    std::vector<const float *> in = inputData(t);
    float *y = out[k];
    it.run(t.loops, [&](const int64_t *o) {
      evaluate(c, in.data(), o, ctx.seed, globalOp, true,
               slots ? t.mask.data() + size_t(o[0]) * slots : nullptr,
               vals.data());
      y[o[0]] = operandAt(result, in.data(), o, vals.data());
    });
  }
}

void fusedForward(KernelCtx &ctx) {
  int64_t n = ctx.op.getInt("members", 0);
  std::vector<float *> out;
  for (Task &t : ctx.tasks)
    out.push_back(t.out[0].data.data());
  chainForward(ctx, chainOf(ctx.op, ctx.step, n, false), -n, out);
}

/// A constant input whose buffer the executor freed after forward (the
/// semantics save activations only), filled again as the executor fills it.
void refillConstant(const Value &v, Buf &b) {
  if (v.kind != ValueKind::Constant || !b.data.empty() || b.box.empty())
    return;
  b.reset(b.box);
  forEachIndex(b.box, v.shape.dims, [&](int64_t flat, int64_t off) {
    b.data[size_t(off)] =
        float(v.data.size() == 1 ? v.data[0] : v.data[size_t(flat)]);
  });
}

/// Back-propagates each task's gradient of operand ref `result` (dres[k],
/// over the output box) through the chain into the inputs whose gradient
/// buffers are allocated. With values, the chain is evaluated again from
/// the inputs; one the executor dropped (its values read by no partial the
/// semantics count) reads as zeros.
void chainBackward(KernelCtx &ctx, const Chain &c, int64_t result,
                   const std::vector<const float *> &dres) {
  const Op &op = ctx.op;
  size_t n = c.members.size(), slots = size_t(c.slots);
  std::vector<float> vals(n + 1, 0.0f), adj(n + 1);
  for (size_t k = 0; k < ctx.tasks.size(); ++k) {
    Task &t = ctx.tasks[k];
    std::vector<Buf> zeros(op.inputs.size());
    std::vector<const float *> in = inputData(t);
    if (c.needsValues)
      for (size_t i = 0; i < op.inputs.size(); ++i) {
        refillConstant(ctx.graph.value(op.inputs[i]), t.in[i]);
        in[i] = t.in[i].data.data();
        if (t.in[i].data.empty() && !t.in[i].box.empty()) {
          zeros[i].reset(t.in[i].box);
          in[i] = zeros[i].data.data();
        }
      }
    std::vector<uint8_t> want(op.inputs.size());
    for (size_t i = 0; i < want.size(); ++i)
      want[i] = i < t.gin.size() && !t.gin[i].data.empty();
    // The output gradient's box is the output's: offsets index the masks.
    PointIter it(op.sem, operands(ctx.graph, op, t.gout[0].box, t.in, false));
    const float *dy = dres[k];
    it.run(t.loops, [&](const int64_t *o) {
      uint8_t *mask = slots ? t.mask.data() + size_t(o[0]) * slots : nullptr;
      if (c.needsValues)
        evaluate(c, in.data(), o, 0, 0, false, mask, vals.data());
      std::fill(adj.begin(), adj.end(), 0.0f);
      if (result < 0)
        adj[size_t(-result - 1)] = dy[o[0]];
      else if (result != kAbsent && want[size_t(result)])
        t.gin[size_t(result)].data[size_t(o[1 + result])] += dy[o[0]];
      for (size_t j = n; j-- > 0;) {
        const Member &m = c.members[j];
        float x[kMaxOperands] = {0, 0, 0};
        if (c.needsValues) {
          for (size_t q = 0; q < m.in.size(); ++q)
            x[q] = operandAt(m.in[q], in.data(), o, vals.data());
        } else if (m.slot >= 0 && !m.isDropout) {
          x[0] = mask[m.slot] ? 1.0f : -1.0f; // a Relu's input's sign
        }
        for (size_t q = 0; q < m.in.size(); ++q) {
          int64_t r = m.in[q];
          if (r == kAbsent || (r >= 0 && !want[size_t(r)]))
            continue;
          float d;
          if (m.isDropout)
            d = !m.drops || mask[m.slot] ? m.scale : 0.0f;
          else
            d = elemPartial(m.fn, x, vals[j], q);
          d *= adj[j];
          if (r < 0)
            adj[size_t(-r - 1)] += d;
          else
            t.gin[size_t(r)].data[size_t(o[1 + r])] += d;
        }
      }
    });
  }
}

void fusedBackward(KernelCtx &ctx) {
  int64_t n = ctx.op.getInt("members", 0);
  std::vector<const float *> dy;
  for (Task &t : ctx.tasks)
    dy.push_back(t.gout[0].data.data());
  chainBackward(ctx, chainOf(ctx.op, ctx.step, n, false), -n, dy);
}

// --- FusedSoftmax ----------------------------------------------------------

/// The softmax member's operand ref (its input: a prologue member's
/// result).
int64_t softmaxOperand(const Op &op) {
  int64_t n = op.getInt("members", 0);
  std::vector<int64_t> in = op.getInts(memberKey(n - 1, "in"));
  return in.empty() ? kAbsent : in[0];
}

llvm::Error checkFusedSoftmax(const Graph &g, const Op &op) {
  int64_t n = op.getInt("members", 0);
  if (n < 2 || op.getString(memberKey(n - 1, "kind"), "") != "Softmax")
    return inputError("FusedSoftmax needs a prologue and a Softmax as its "
                      "last member");
  int64_t rank = int64_t(g.value(op.outputs[0]).shape.rank());
  int64_t axis = op.getInt("axis", rank - 1);
  if (axis != rank - 1 && axis != -1)
    return inputError("FusedSoftmax's axis {} is not the last of rank {}", axis,
                      rank);
  int64_t r = softmaxOperand(op);
  if (r == kAbsent || r >= 0 || -r - 1 >= n - 1)
    return inputError("the Softmax member does not read a prologue member");
  return checkMembers(op, n - 1);
}

/// The prologue into per-task temporaries over the output box, then the
/// Softmax kernel's rows on them.
void fusedSoftmaxForward(KernelCtx &ctx) {
  const Op &op = ctx.op;
  int64_t n = op.getInt("members", 0);
  std::vector<Buf> z(ctx.tasks.size());
  std::vector<float *> out;
  std::vector<const Buf *> x;
  for (size_t k = 0; k < ctx.tasks.size(); ++k) {
    z[k].reset(ctx.tasks[k].out[0].box);
    out.push_back(z[k].data.data());
    x.push_back(&z[k]);
  }
  chainForward(ctx, chainOf(op, ctx.step, n - 1, true), softmaxOperand(op),
               out);
  softmaxRows(ctx, op.sem.outputs[0], x, false);
}

/// dz = y ∘ (dy − rowsum(dy ∘ y)) by the Softmax kernel's rows, then back
/// through the prologue.
void fusedSoftmaxBackward(KernelCtx &ctx) {
  const Op &op = ctx.op;
  int64_t n = op.getInt("members", 0);
  std::vector<Buf> dz(ctx.tasks.size());
  std::vector<Buf *> dx;
  std::vector<const float *> dres;
  for (size_t k = 0; k < ctx.tasks.size(); ++k) {
    dz[k].reset(ctx.tasks[k].gout[0].box);
    dx.push_back(&dz[k]);
    dres.push_back(dz[k].data.data());
  }
  softmaxRowsBackward(ctx, op.sem.outputs[0], dx, false);
  chainBackward(ctx, chainOf(op, ctx.step, n - 1, true), softmaxOperand(op),
                dres);
}

// --- RotaryEmbedding ------------------------------------------------------
// y_i = x_i cos_i - x_{i+h} sin_i (i < h), x_i cos_i + x_{i-h} sin_i
// (i >= h) over the last axis of length 2h, which every tile holds whole
// (the semantics keep it unsplit): an element's partner is h floats away
// in x, y and the tables alike. Linear in x, so backward is the transpose:
// dx_j = dy_j cos_j + dy_{j+h} sin_{j+h} (j < h), dy_j cos_j -
// dy_{j-h} sin_{j-h} (j >= h).

llvm::Error checkRotary(const Graph &g, const Op &op) {
  if (op.getInt("interleaved", 0) != 0)
    return inputError("interleaved rotary embeddings are not supported");
  const std::vector<int64_t> &x = g.value(op.inputs[0]).shape.dims;
  for (size_t i = 1; i < 3; ++i) {
    const std::vector<int64_t> &t = g.value(op.inputs[i]).shape.dims;
    if (t.empty() || t.back() != x.back())
      return inputError("the {} table's last dim is not x's {}",
                        i == 1 ? "cos" : "sin", x.back());
  }
  if (x.back() % 2)
    return inputError("the last dim {} is odd", x.back());
  return llvm::Error::success();
}

PointIter rotaryIter(const OpSemantics &sem, const Task &t, const Buf &y) {
  return PointIter(sem, {{&sem.inputs[0], t.in[0].box},
                         {&sem.inputs[1], t.in[1].box},
                         {&sem.inputs[2], t.in[2].box},
                         {&sem.outputs[0], y.box}});
}

void rotaryForward(KernelCtx &ctx) {
  const OpSemantics &sem = ctx.op.sem;
  int64_t d = ctx.graph.value(ctx.op.inputs[0]).shape.dims.back(), h = d / 2;
  for (Task &t : ctx.tasks) {
    const float *x = t.in[0].data.data(), *c = t.in[1].data.data(),
                *s = t.in[2].data.data();
    float *y = t.out[0].data.data();
    rotaryIter(sem, t, t.out[0]).run(t.loops, [&](const int64_t *o) {
      bool low = o[3] % d < h;
      float partner = low ? -x[o[0] + h] : x[o[0] - h];
      y[o[3]] = x[o[0]] * c[o[1]] + partner * s[o[2]];
    });
  }
}

void rotaryBackward(KernelCtx &ctx) {
  const OpSemantics &sem = ctx.op.sem;
  int64_t d = ctx.graph.value(ctx.op.inputs[0]).shape.dims.back(), h = d / 2;
  for (Task &t : ctx.tasks) {
    if (t.gin[0].data.empty())
      continue; // no gradient for a graph input; the tables are constants
    const float *dy = t.gout[0].data.data(), *c = t.in[1].data.data(),
                *s = t.in[2].data.data();
    float *dx = t.gin[0].data.data();
    rotaryIter(sem, t, t.gout[0]).run(t.loops, [&](const int64_t *o) {
      bool low = o[3] % d < h;
      float partner = low ? dy[o[3] + h] * s[o[2] + h]
                          : -dy[o[3] - h] * s[o[2] - h];
      dx[o[0]] += dy[o[3]] * c[o[1]] + partner;
    });
  }
}

const Kernel kRotary = {checkRotary, rotaryForward, rotaryBackward, true};

const Kernel kFusedElementwise = {checkFusedElementwise, fusedForward,
                                  fusedBackward, true};
const Kernel kFusedSoftmax = {checkFusedSoftmax, fusedSoftmaxForward,
                              fusedSoftmaxBackward, true};

} // namespace

const Kernel *findFusedKernel(llvm::StringRef kind) {
  if (kind == "FusedElementwise")
    return &kFusedElementwise;
  if (kind == "FusedSoftmax")
    return &kFusedSoftmax;
  if (kind == "RotaryEmbedding")
    return &kRotary;
  return nullptr;
}

} // namespace exec
} // namespace soap
