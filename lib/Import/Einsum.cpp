// Einsum lowered to the IR's Transpose, Reshape, ReduceSum and batched
// MatMul (MaxViT's attention: "bghid,bghjd->bghij"), so every loop keeps
// the op semantics those kinds already have: a letter shared by both
// operands and the output stays a MatMul batch loop (the sample dim keeps
// its S loop), a contracted letter is the MatMul's reduction loop.
#include "ImportState.h"

#include "soap/Support/Error.h"
#include <algorithm>
#include <cctype>
#include <fmt/ranges.h>
#include <functional>
#include <map>
#include <numeric>
#include <optional>

namespace soap {
namespace import {
namespace {

/// A letter of the equation; the dims an ellipsis stands for get ids past
/// the letters (kEllipsis + k, right-aligned across operands).
using Sym = int;
constexpr Sym kEllipsis = 256;
using Syms = std::vector<Sym>;

struct Parsed {
  std::vector<Syms> ins;
  Syms out;
};

bool contains(const Syms &v, Sym x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

/// Parses `eq` against the operands' ranks. Errors say what is wrong.
llvm::Expected<Parsed> parse(std::string eq, const std::vector<size_t> &ranks) {
  eq.erase(std::remove(eq.begin(), eq.end(), ' '), eq.end());
  size_t arrow = eq.find("->");
  std::string lhs = eq.substr(0, arrow);
  std::vector<std::string> terms;
  for (size_t p = 0;;) {
    size_t c = lhs.find(',', p);
    terms.push_back(lhs.substr(p, c == std::string::npos ? c : c - p));
    if (c == std::string::npos)
      break;
    p = c + 1;
  }
  if (terms.size() != ranks.size())
    return inputError("it names {} operands, the node has {}", terms.size(),
                      ranks.size());
  // Letters of each term, with the ellipsis as a marker (-1).
  auto letters = [](const std::string &t) -> llvm::Expected<Syms> {
    Syms out;
    for (size_t k = 0; k < t.size(); ++k) {
      if (t.compare(k, 3, "...") == 0) {
        if (contains(out, -1))
          return inputError("'{}' has two ellipses", t);
        out.push_back(-1);
        k += 2;
      } else if (std::isalpha(static_cast<unsigned char>(t[k]))) {
        out.push_back(static_cast<unsigned char>(t[k]));
      } else {
        return inputError("'{}' holds '{}'", t, t[k]);
      }
    }
    return out;
  };
  Parsed p;
  size_t ellipsisRank = 0;
  std::vector<Syms> raw;
  for (size_t i = 0; i < terms.size(); ++i) {
    auto l = letters(terms[i]);
    if (!l)
      return l.takeError();
    size_t named = l->size() - (contains(*l, -1) ? 1 : 0);
    if (named > ranks[i] || (!contains(*l, -1) && named != ranks[i]))
      return inputError("'{}' has {} letters for an operand of rank {}",
                        terms[i], named, ranks[i]);
    if (contains(*l, -1))
      ellipsisRank = std::max(ellipsisRank, ranks[i] - named);
    raw.push_back(std::move(*l));
  }
  auto expand = [&](const Syms &l, size_t rank) {
    Syms out;
    for (Sym x : l) {
      if (x != -1) {
        out.push_back(x);
        continue;
      }
      size_t e = rank - (l.size() - 1);
      for (size_t k = 0; k < e; ++k)
        out.push_back(kEllipsis + static_cast<Sym>(ellipsisRank - e + k));
    }
    return out;
  };
  for (size_t i = 0; i < raw.size(); ++i)
    p.ins.push_back(expand(raw[i], ranks[i]));
  if (arrow != std::string::npos) {
    auto l = letters(eq.substr(arrow + 2));
    if (!l)
      return l.takeError();
    p.out = expand(*l, ellipsisRank + (l->size() - (contains(*l, -1) ? 1 : 0)));
  } else {
    // Implicit output: the ellipsis dims, then the letters used once, sorted.
    for (size_t k = 0; k < ellipsisRank; ++k)
      p.out.push_back(kEllipsis + static_cast<Sym>(k));
    std::map<Sym, int> uses;
    for (const Syms &in : p.ins)
      for (Sym x : in)
        if (x < kEllipsis)
          ++uses[x];
    for (const auto &[x, n] : uses)
      if (n == 1)
        p.out.push_back(x);
  }
  for (size_t k = 0; k < p.out.size(); ++k)
    if (std::count(p.out.begin(), p.out.end(), p.out[k]) > 1)
      return inputError("the output repeats a letter");
  return p;
}

/// Emits the IR nodes of one lowering; intermediate tensors get their
/// types in s.infos.
class Emitter {
public:
  Emitter(ImportState &s, int node, int32_t elemType)
      : s_(s), node_(node), elemType_(elemType), base_(s.nodeNames[node]) {}

  std::vector<IrNode> take() { return std::move(nodes_); }

  /// `in` (dims `dims`) with its dims in order `perm`; `in` when the
  /// order is already that.
  std::string transpose(const std::string &in, std::vector<int64_t> &dims,
                        const std::vector<int64_t> &perm) {
    std::vector<int64_t> id(perm.size());
    std::iota(id.begin(), id.end(), 0);
    if (perm == id)
      return in;
    std::vector<int64_t> out;
    for (int64_t p : perm)
      out.push_back(dims[static_cast<size_t>(p)]);
    dims = out;
    return add("Transpose", in, dims, {{"perm", perm}});
  }
  std::string reshape(const std::string &in, const std::vector<int64_t> &from,
                      const std::vector<int64_t> &to) {
    if (from == to)
      return in;
    return add("Reshape", in, to, {{"shape", to}});
  }
  std::string reduceSum(const std::string &in, const std::vector<int64_t> &to,
                        const std::vector<int64_t> &axes) {
    return add("ReduceSum", in, to, {{"axes", axes}, {"keepdims", int64_t(0)}});
  }
  std::string matMul(const std::string &a, const std::string &b,
                     const std::vector<int64_t> &dims) {
    IrNode n = make("MatMul", dims, /*own name*/ true);
    n.inputs = {a, b};
    nodes_.push_back(std::move(n));
    return nodes_.back().outputs[0];
  }
  /// Renames the last node's output to the Einsum's; false when nothing
  /// was emitted after `last` (the result is an input: an identity).
  bool finish(const std::string &result, const std::string &output,
              const std::vector<int64_t> &dims) {
    if (nodes_.empty() || nodes_.back().outputs[0] != result)
      return false;
    nodes_.back().outputs[0] = output;
    s_.infos[output] = TensorInfo{elemType_, true, dims};
    return true;
  }
  std::string identity(const std::string &in, const std::vector<int64_t> &d) {
    return add("Identity", in, d, {});
  }

private:
  ImportState &s_;
  int node_;
  int32_t elemType_;
  std::string base_;
  std::vector<IrNode> nodes_;

  IrNode make(const std::string &kind, const std::vector<int64_t> &dims,
              bool ownName = false) {
    IrNode n;
    n.node = node_;
    n.kind = kind;
    n.info = OpRegistry::instance().lookup(kind);
    std::string name =
        fmt::format("{}/soapc.{}{}", base_, kind,
                    nodes_.empty() ? "" : fmt::format("_{}", nodes_.size()));
    n.name = ownName ? base_ : name;
    std::string out = name + "_output";
    n.outputs = {out};
    s_.infos[out] = TensorInfo{elemType_, true, dims};
    return n;
  }
  std::string add(const std::string &kind, const std::string &in,
                  const std::vector<int64_t> &dims,
                  std::map<std::string, AttrValue> attrs) {
    IrNode n = make(kind, dims);
    n.inputs = {in};
    n.attrs = std::move(attrs);
    nodes_.push_back(std::move(n));
    return nodes_.back().outputs[0];
  }
};

/// An operand on its way through the lowering: tensor, dims, letters.
struct Term {
  std::string tensor;
  std::vector<int64_t> dims;
  Syms syms;
};

/// Sums away the letters of `t` that `keep` does not hold.
void sumAway(Emitter &e, Term &t, const std::function<bool(Sym)> &keep) {
  std::vector<int64_t> axes, dims;
  Syms syms;
  for (size_t k = 0; k < t.syms.size(); ++k) {
    if (keep(t.syms[k])) {
      dims.push_back(t.dims[k]);
      syms.push_back(t.syms[k]);
    } else {
      axes.push_back(static_cast<int64_t>(k));
    }
  }
  if (axes.empty())
    return;
  t.tensor = e.reduceSum(t.tensor, dims, axes);
  t.dims = dims;
  t.syms = syms;
}

/// Puts the dims of `t` in the order `order` (a permutation of t.syms).
void permute(Emitter &e, Term &t, const Syms &order) {
  std::vector<int64_t> perm;
  for (Sym x : order)
    perm.push_back(std::find(t.syms.begin(), t.syms.end(), x) - t.syms.begin());
  t.tensor = e.transpose(t.tensor, t.dims, perm);
  t.syms = order;
}

int64_t sizeOf(const Term &t, const Syms &syms) {
  int64_t p = 1;
  for (Sym x : syms)
    p *= t.dims[std::find(t.syms.begin(), t.syms.end(), x) - t.syms.begin()];
  return p;
}

std::vector<int64_t> dimsOf(const Term &t, const Syms &syms) {
  std::vector<int64_t> d;
  for (Sym x : syms)
    d.push_back(
        t.dims[std::find(t.syms.begin(), t.syms.end(), x) - t.syms.begin()]);
  return d;
}

template <typename Pred> Syms select(const Syms &from, Pred p) {
  Syms out;
  for (Sym x : from)
    if (p(x))
      out.push_back(x);
  return out;
}

/// The equation of Einsum `n` applied to operands of dims `dims`: the
/// letters of every operand and of the output, and each letter's size.
/// Errors say why soapc does not lower it.
struct Analysis {
  std::vector<Syms> ins;
  Syms out;
  std::map<Sym, int64_t> size;
  std::vector<int64_t> outDims;
};

llvm::Expected<Analysis>
analyse(const onnx::NodeProto &n,
        const std::vector<std::vector<int64_t>> &dims) {
  if (n.input_size() < 1 || n.input_size() > 2 || n.output_size() != 1)
    return inputError("soapc lowers Einsum of one or two operands");
  std::vector<size_t> ranks;
  for (const auto &d : dims)
    ranks.push_back(d.size());
  const onnx::AttributeProto *eq = findAttr(n, "equation");
  auto parsed = parse(eq ? eq->s() : "", ranks);
  if (!parsed)
    return parsed.takeError();
  Analysis a;
  a.ins = parsed->ins;
  a.out = parsed->out;
  for (size_t t = 0; t < a.ins.size(); ++t) {
    const Syms &syms = a.ins[t];
    for (size_t k = 0; k < syms.size(); ++k) {
      if (std::count(syms.begin(), syms.end(), syms[k]) > 1)
        return inputError("operand {} repeats a letter (a diagonal)", t);
      auto [it, fresh] = a.size.insert({syms[k], dims[t][k]});
      if (!fresh && it->second != dims[t][k])
        return inputError("a letter has sizes {} and {} (broadcasting is "
                          "not lowered)",
                          it->second, dims[t][k]);
    }
  }
  for (Sym x : a.out) {
    if (!a.size.count(x))
      return inputError("the output has a letter no operand has");
    a.outDims.push_back(a.size[x]);
  }
  return a;
}

std::string equationOf(const onnx::NodeProto &n) {
  const onnx::AttributeProto *eq = findAttr(n, "equation");
  return eq ? eq->s() : "";
}

} // namespace

bool isLoweredOp(const onnx::NodeProto &n) {
  return (n.domain().empty() || n.domain() == "ai.onnx") &&
         n.op_type() == "Einsum";
}

std::optional<std::vector<int64_t>> einsumDims(const ImportState &s, int i) {
  const onnx::NodeProto &n = s.graph().node(i);
  std::vector<std::vector<int64_t>> dims;
  for (const std::string &in : n.input()) {
    auto it = s.infos.find(in);
    if (it == s.infos.end() || !it->second.fullyKnown())
      return std::nullopt;
    dims.push_back(it->second.dims);
  }
  auto a = analyse(n, dims);
  if (!a) {
    llvm::consumeError(a.takeError()); // lowerEinsum says why
    return std::nullopt;
  }
  return a->outDims;
}

llvm::Expected<std::vector<IrNode>> lowerEinsum(ImportState &s, int i) {
  const onnx::NodeProto &n = s.graph().node(i);
  std::vector<Term> terms;
  std::vector<std::vector<int64_t>> dims;
  for (const std::string &in : n.input()) {
    auto d = s.knownDims(in);
    if (!d)
      return d.takeError();
    terms.push_back({in, *d, {}});
    dims.push_back(*d);
  }
  auto a = analyse(n, dims);
  if (!a)
    return inputError("{}: Einsum equation '{}' is not supported: {}",
                      s.where(i), equationOf(n), toString(a.takeError()));
  const Syms &out = a->out;
  std::map<Sym, int64_t> &size = a->size;
  const std::vector<int64_t> &want = a->outDims;
  for (size_t t = 0; t < terms.size(); ++t)
    terms[t].syms = a->ins[t];

  auto info = s.infos.find(n.input(0));
  Emitter e(s, i, info == s.infos.end() ? 0 : info->second.elemType);
  auto inOut = [&](Sym x) { return contains(out, x); };
  std::string result;
  if (terms.size() == 1) {
    Term &a = terms[0];
    sumAway(e, a, inOut);
    permute(e, a, out);
    result = a.tensor;
  } else {
    Term *a = &terms[0], *b = &terms[1];
    // Letters only one operand has and the output lacks are summed first.
    sumAway(e, *a, [&](Sym x) { return inOut(x) || contains(b->syms, x); });
    sumAway(e, *b, [&](Sym x) { return inOut(x) || contains(a->syms, x); });
    auto inA = [&](Sym x) { return contains(a->syms, x); };
    auto inB = [&](Sym x) { return contains(b->syms, x); };
    Syms batch = select(out, [&](Sym x) { return inA(x) && inB(x); });
    Syms freeA = select(out, [&](Sym x) { return inA(x) && !inB(x); });
    Syms freeB = select(out, [&](Sym x) { return inB(x) && !inA(x); });
    Syms red = select(a->syms, [&](Sym x) { return inB(x) && !inOut(x); });
    // The left operand keeps its free dims unmerged (they become MatMul
    // batch loops against a broadcast right operand); the right one's
    // merge into the MatMul's columns.
    if (freeB.size() > freeA.size()) {
      std::swap(a, b);
      std::swap(freeA, freeB);
    }
    Syms orderA = batch, orderB = batch;
    orderA.insert(orderA.end(), freeA.begin(), freeA.end());
    orderA.insert(orderA.end(), red.begin(), red.end());
    orderB.insert(orderB.end(), red.begin(), red.end());
    orderB.insert(orderB.end(), freeB.begin(), freeB.end());
    permute(e, *a, orderA);
    permute(e, *b, orderB);
    std::vector<int64_t> batchDims = dimsOf(*a, batch);
    int64_t k = sizeOf(*a, red), cols = sizeOf(*b, freeB);
    std::vector<int64_t> lhs = batchDims, rhs = batchDims;
    std::vector<int64_t> rows = dimsOf(*a, freeA);
    if (rows.empty())
      rows.push_back(1);
    lhs.insert(lhs.end(), rows.begin(), rows.end());
    lhs.push_back(k);
    // numpy broadcasting aligns from the right: the right operand needs
    // unit dims against the left's extra row dims only past batch dims.
    if (!batch.empty())
      rhs.insert(rhs.end(), rows.size() - 1, 1);
    rhs.push_back(k);
    rhs.push_back(cols);
    std::string l = e.reshape(a->tensor, a->dims, lhs);
    std::string r = e.reshape(b->tensor, b->dims, rhs);
    std::vector<int64_t> y = batchDims;
    y.insert(y.end(), rows.begin(), rows.end());
    y.push_back(cols);
    Term prod{e.matMul(l, r, y), y, {}};
    // Back to the letters: batch, free of the left, free of the right.
    std::vector<int64_t> unmerged = batchDims;
    Syms syms = batch;
    for (Sym x : freeA) {
      unmerged.push_back(size[x]);
      syms.push_back(x);
    }
    for (Sym x : freeB) {
      unmerged.push_back(size[x]);
      syms.push_back(x);
    }
    prod.tensor = e.reshape(prod.tensor, y, unmerged);
    prod.dims = unmerged;
    prod.syms = syms;
    permute(e, prod, out);
    result = prod.tensor;
  }
  if (!e.finish(result, n.output(0), want))
    e.finish(e.identity(result, want), n.output(0), want);
  return e.take();
}

} // namespace import
} // namespace soap
