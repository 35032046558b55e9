// Element-wise ops with numpy broadcasting, from one shared helper: the loop
// space is the output, each operand is mapped by broadcasting. Per-point
// FLOPs are nominal counts (a transcendental is several).
#include "OpBuilder.h"

namespace soap {
namespace detail {

namespace {

struct EltSpec {
  const char *name;
  const char *description;
  double fwdFlops, bwdFlops;
  /// What backward needs: 'i' the inputs, 'o' the output, 'm' a 1-byte mask
  /// of the output, '-' nothing.
  char saves;
};

const EltSpec kEltSpecs[] = {
    {"Add", "a + b", 1, 1, '-'},
    {"Sub", "a - b", 1, 1, '-'},
    {"Mul", "a * b", 1, 2, 'i'},
    {"Div", "a / b", 1, 3, 'i'},
    {"Pow", "a ^ b", 10, 12, 'i'},
    {"Max", "max(a, b)", 1, 1, 'i'},
    {"Min", "min(a, b)", 1, 1, 'i'},
    {"Where", "cond ? a : b", 1, 1, 'i'},
    {"Equal", "a == b", 1, 0, '-'},
    {"Less", "a < b", 1, 0, '-'},
    {"Greater", "a > b", 1, 0, '-'},
    {"Relu", "max(x, 0)", 1, 1, 'm'},
    {"LeakyRelu", "x > 0 ? x : alpha*x", 2, 1, 'm'},
    {"Clip", "min(max(x, min), max) (ReLU6)", 2, 1, 'i'},
    {"HardSigmoid", "max(0, min(1, alpha*x + beta))", 3, 1, 'i'},
    {"HardSwish", "x * max(0, min(1, x/6 + 1/2))", 4, 3, 'i'},
    {"Gelu", "x * Phi(x)", 14, 18, 'i'},
    {"Sigmoid", "1 / (1 + exp(-x))", 4, 2, 'o'},
    {"Tanh", "tanh(x)", 6, 2, 'o'},
    {"Erf", "erf(x)", 10, 6, 'i'},
    {"Exp", "exp(x)", 4, 1, 'o'},
    {"Log", "log(x)", 4, 1, 'i'},
    {"Sqrt", "sqrt(x)", 4, 2, 'o'},
    {"Reciprocal", "1 / x", 1, 2, 'o'},
    {"Neg", "-x", 1, 1, '-'},
    {"Abs", "|x|", 1, 1, 'i'},
    {"Not", "!x", 1, 0, '-'},
    {"Cast", "convert the element type", 0, 0, '-'},
    {"Identity", "copy", 0, 0, '-'},
    {"Dropout", "zero elements with probability ratio (seeded mask)", 2, 1,
     'm'},
    {"Expand", "broadcast to a larger shape", 0, 1, '-'},
};

const EltSpec *findSpec(llvm::StringRef kind) {
  for (const EltSpec &s : kEltSpecs)
    if (kind == s.name)
      return &s;
  return nullptr;
}

} // namespace

bool eltSpecCosts(llvm::StringRef kind, double &fwdFlops, double &bwdFlops,
                  char &saves) {
  const EltSpec *s = findSpec(kind);
  if (!s)
    return false;
  fwdFlops = s->fwdFlops;
  bwdFlops = s->bwdFlops;
  saves = s->saves;
  return true;
}

llvm::Expected<std::vector<int>> broadcastLoops(SemBuilder &b,
                                                size_t numData) {
  auto out0 = b.needOut(0, "Y");
  if (!out0)
    return out0.takeError();
  const Value &Y = **out0;
  const std::vector<int64_t> &shape = Y.shape.dims;
  int64_t rank = static_cast<int64_t>(shape.size());
  std::vector<int> loops;
  for (int64_t d = 0; d < rank; ++d) {
    // The class of an output dim: the class an activation operand's matching
    // dim carries; Parameter when only a weight indexes it (a bias).
    DimClass cls = d == 0 && rank > 1 ? DimClass::Sample : DimClass::Attribute;
    bool fromActivation = false, byWeight = false;
    for (size_t i = 0; i < numData; ++i) {
      const Value *v = b.in(i);
      if (!v)
        continue;
      int64_t vd = d - (rank - static_cast<int64_t>(v->shape.rank()));
      if (vd < 0 || v->shape[vd] != shape[d] || shape[d] == 1)
        continue;
      if (v->kind == ValueKind::Weight)
        byWeight = true;
      else if (!fromActivation && !v->dimClasses.empty()) {
        cls = v->dimClasses[vd];
        fromActivation = true;
      }
    }
    if (byWeight && !fromActivation)
      cls = DimClass::Parameter;
    loops.push_back(b.addLoop("d" + std::to_string(d), cls, shape[d]));
  }
  for (size_t i = 0; i < numData; ++i)
    if (b.in(i))
      if (auto err = b.setBroadcastInput(i, loops, shape))
        return llvm::Error(std::move(err));
  std::vector<DimMap> ym;
  for (int l : loops)
    ym.push_back(DimMap::loop(l));
  for (size_t j = 0; j < b.numOut(); ++j)
    if (const Value *o = b.out(j)) {
      if (o->shape.dims != shape)
        return inputError("output '{}' {} differs from {}", o->name,
                          o->shape.str(), Y.shape.str());
      b.setOutput(j, ym);
    }
  return loops;
}

namespace {

llvm::Expected<OpSemantics> buildElementwise(const Op &op, const Graph &g) {
  SemBuilder b(op, g);
  const EltSpec *spec = findSpec(op.kind);
  // Expand reads only its data operand; the shape operand was folded away.
  size_t numData = op.kind == "Expand" ? 1 : b.numIn();
  auto loops = broadcastLoops(b, numData);
  if (!loops)
    return loops.takeError();
  if (spec->fwdFlops > 0)
    b.flops(Pass::Forward, spec->fwdFlops, b.allLoops());
  if (spec->bwdFlops > 0)
    b.flops(Pass::BackwardData, spec->bwdFlops, b.allLoops());
  // Weight-gradient of a bias or scale operand: a reduction over the output.
  for (size_t i = 0; i < numData; ++i)
    if (b.in(i) && b.in(i)->kind == ValueKind::Weight) {
      b.flops(Pass::BackwardWeight, 1, b.allLoops());
      break;
    }
  switch (spec->saves) {
  case 'i':
    for (size_t i = 0; i < numData; ++i)
      if (b.in(i) && b.in(i)->isActivationLike())
        b.saveInput(static_cast<int>(i));
    break;
  case 'o':
    b.saveOutput(0);
    break;
  case 'm':
    b.saveOutput(0, 1.0);
    break;
  default:
    break;
  }
  return b.finish();
}

} // namespace

void registerElementwiseOps(OpRegistry &r) {
  for (const EltSpec &s : kEltSpecs) {
    bool binary = llvm::StringRef("Add Sub Mul Div").contains(s.name);
    r.add({s.name, s.description, buildElementwise, {}, binary, {}});
  }
}

} // namespace detail
} // namespace soap
