// Alternates ONNX shape inference with constant folding of shape arithmetic
// until a fixpoint: folding makes Reshape targets known, inference then makes
// more Shape nodes foldable.
#include "ImportState.h"

#include "soap/Support/Error.h"
#include <exception>
#include <onnx/defs/schema.h>
#include <onnx/shape_inference/implementation.h>

namespace soap {
namespace import {
namespace {

void setTensorType(onnx::ValueInfoProto &vi, const std::string &name,
                   int32_t elemType, llvm::ArrayRef<int64_t> dims) {
  vi.Clear();
  vi.set_name(name);
  auto *tt = vi.mutable_type()->mutable_tensor_type();
  tt->set_elem_type(elemType);
  auto *shape = tt->mutable_shape();
  for (int64_t d : dims)
    shape->add_dim()->set_dim_value(d);
}

/// The model shape inference runs on: the remaining nodes; integer
/// initializers and folded constants with data as initializers; weights and
/// constants without data as typed graph inputs (inference must not read
/// stripped or external data).
onnx::ModelProto inferenceModel(const ImportState &s) {
  const onnx::GraphProto &g = s.graph();
  onnx::ModelProto m;
  m.set_ir_version(std::max<int64_t>(s.model.ir_version(), 4));
  *m.mutable_opset_import() = s.model.opset_import();
  *m.mutable_functions() = s.model.functions();
  onnx::GraphProto *ig = m.mutable_graph();
  ig->set_name(g.name());
  for (const auto &vi : g.input())
    if (!s.initializers.count(vi.name()))
      *ig->add_input() = vi;
  for (const auto &t : g.initializer()) {
    auto c = s.consts.find(t.name());
    if (c != s.consts.end() && c->second.hasData)
      *ig->add_initializer() = t;
    else
      setTensorType(*ig->add_input(), t.name(), t.data_type(),
                    {t.dims().data(), static_cast<size_t>(t.dims_size())});
  }
  for (int i = 0; i < g.node_size(); ++i) {
    const onnx::NodeProto &n = g.node(i);
    if (!s.folded[i]) {
      onnx::NodeProto *copy = ig->add_node();
      *copy = n;
      // Inference errors name the node; give it the name users see.
      copy->set_name(s.nodeNames[i]);
      continue;
    }
    for (const std::string &out : n.output()) {
      auto c = s.consts.find(out);
      if (out.empty() || c == s.consts.end())
        continue;
      if (c->second.hasData)
        constToProto(c->second, out, *ig->add_initializer());
      else
        setTensorType(*ig->add_input(), out, c->second.elemType,
                      c->second.dims);
    }
  }
  for (const auto &[name, info] : s.inferredHere)
    setTensorType(*ig->add_value_info(), name, info.elemType, info.dims);
  for (const auto &vi : g.output()) {
    onnx::ValueInfoProto *o = ig->add_output();
    o->set_name(vi.name());
    // Keep the element type, drop the symbolic shape: inference refills it.
    if (vi.type().has_tensor_type())
      o->mutable_type()->mutable_tensor_type()->set_elem_type(
          vi.type().tensor_type().elem_type());
  }
  return m;
}

/// "... (op_type:Add, node name: add1): [ShapeInferenceError] Incompatible
/// dimensions" -> "node 'add1': shape inference failed: Incompatible ..."
llvm::Error inferenceError(const ImportState &s, std::string msg) {
  for (char &c : msg)
    if (c == '\n' || c == '\r')
      c = ' ';
  auto strip = [&](const std::string &tag) {
    for (size_t p; (p = msg.find(tag)) != std::string::npos;)
      msg.erase(p, tag.size());
  };
  strip("[ShapeInferenceError] ");
  strip("[TypeInferenceError] ");
  strip("Shape inference error(s): ");
  llvm::StringRef rest = llvm::StringRef(msg).trim();
  size_t at = rest.find("node name: ");
  if (at != llvm::StringRef::npos) {
    llvm::StringRef after = rest.drop_front(at + 11);
    size_t close = after.find("): ");
    if (close != llvm::StringRef::npos)
      return inputError("{}: node '{}': shape inference failed: {}", s.path,
                        after.take_front(close).str(),
                        after.drop_front(close + 3).trim().str());
  }
  return inputError("{}: shape inference failed: {}", s.path, rest.str());
}

TensorInfo infoOf(const onnx::TypeProto &type) {
  TensorInfo info;
  if (!type.has_tensor_type())
    return info;
  const auto &tt = type.tensor_type();
  info.elemType = tt.elem_type();
  info.hasShape = tt.has_shape();
  for (const auto &d : tt.shape().dim())
    info.dims.push_back(d.has_dim_value() ? d.dim_value() : -1);
  return info;
}

/// Output types of Einsum nodes whose operands' shapes the last inference
/// knew and that inference left unknown; whether it found any.
bool inferEinsums(ImportState &s) {
  bool found = false;
  const onnx::GraphProto &g = s.graph();
  for (int i = 0; i < g.node_size(); ++i) {
    const onnx::NodeProto &n = g.node(i);
    if (s.folded[i] || !isLoweredOp(n) || n.output_size() != 1 ||
        s.inferredHere.count(n.output(0)))
      continue;
    auto dims = einsumDims(s, i);
    auto in = s.infos.find(n.input(0));
    if (!dims || in == s.infos.end())
      continue;
    s.inferredHere[n.output(0)] = TensorInfo{in->second.elemType, true, *dims};
    found = true;
  }
  return found;
}

llvm::Error inferOnce(ImportState &s) {
  onnx::ModelProto m = inferenceModel(s);
  try {
    // check_type, strict errors, data propagation (Shape -> Reshape chains).
    onnx::ShapeInferenceOptions options(true, 1, true);
    onnx::shape_inference::InferShapes(m, onnx::OpSchemaRegistry::Instance(),
                                       options);
  } catch (const std::exception &e) {
    return inferenceError(s, e.what());
  }
  s.infos.clear();
  const onnx::GraphProto &g = m.graph();
  for (const auto &t : g.initializer()) {
    TensorInfo &info = s.infos[t.name()];
    info.elemType = t.data_type();
    info.hasShape = true;
    info.dims.assign(t.dims().begin(), t.dims().end());
  }
  for (const auto *list : {&g.input(), &g.value_info(), &g.output()})
    for (const auto &vi : *list)
      s.infos[vi.name()] = infoOf(vi.type());
  return llvm::Error::success();
}

/// ONNX inference, then soapc's for the Einsums it could not size, until
/// those are known.
llvm::Error runInference(ImportState &s) {
  do {
    if (auto err = inferOnce(s))
      return err;
  } while (inferEinsums(s));
  return llvm::Error::success();
}

/// What is known of the values of node `n`'s outputs `outs` that are too
/// large to materialise, from its inputs `ins`: a ConstantOfShape is
/// uniform, and a lower Trilu of a nonzero uniform tensor (ones(t, t).tril(),
/// the causal mask of an exported decoder) is lower-triangular, which the
/// fusion pass needs to price attention as causal at long sequences.
void describeLargeConstant(const onnx::NodeProto &n,
                           const std::vector<const ConstTensor *> &ins,
                           std::vector<ConstTensor> &outs) {
  if (outs.size() != 1)
    return;
  const std::string &op = n.op_type();
  if (op == "ConstantOfShape") {
    double value = 0; // the operator's default: a float 0
    for (const onnx::AttributeProto &a : n.attribute())
      if (a.name() == "value") {
        auto t = constFromProto(a.t(), 1);
        if (!t) {
          llvm::consumeError(t.takeError());
          return;
        }
        if (!t->hasData || t->numElements() != 1)
          return;
        value = t->getDouble(0);
      }
    outs[0].uniform = value;
    return;
  }
  if (op == "Cast" && !ins.empty() && ins[0]) {
    // Zero stays zero and nonzero nonzero, between bool and numbers.
    outs[0].lowerTriangular = ins[0]->lowerTriangular;
    if (ins[0]->uniform)
      outs[0].uniform = *ins[0]->uniform != 0 ? 1.0 : 0.0;
    return;
  }
  if (op != "Trilu" || ins.empty() || !ins[0] || outs[0].dims.size() < 2)
    return;
  int64_t upper = 1;
  for (const onnx::AttributeProto &a : n.attribute())
    if (a.name() == "upper")
      upper = a.i();
  int64_t k = 0;
  if (ins.size() > 1 && ins[1]) {
    if (!ins[1]->hasData || ins[1]->numElements() != 1)
      return;
    k = ins[1]->getInt(0);
  }
  outs[0].lowerTriangular =
      upper == 0 && k == 0 && ins[0]->uniform && *ins[0]->uniform != 0;
}

/// One pass over the remaining nodes in topological order; returns whether
/// any node was folded.
llvm::Expected<bool> foldPass(ImportState &s) {
  const onnx::GraphProto &g = s.graph();
  bool changed = false;
  for (int i = 0; i < g.node_size(); ++i) {
    const onnx::NodeProto &n = g.node(i);
    if (s.folded[i] || !isFoldableOp(n))
      continue;
    std::vector<const ConstTensor *> ins;
    ConstTensor shapeOnly; // Shape and Size need only the input's dims
    bool allConst = true, allData = true;
    if (n.op_type() == "Shape" || n.op_type() == "Size") {
      auto it = n.input_size() ? s.infos.find(n.input(0)) : s.infos.end();
      if (it == s.infos.end() || !it->second.fullyKnown())
        continue;
      shapeOnly.dims = it->second.dims;
      ins.push_back(&shapeOnly);
    } else {
      for (const std::string &in : n.input()) {
        if (in.empty()) {
          ins.push_back(nullptr);
          continue;
        }
        auto c = s.consts.find(in);
        if (c == s.consts.end()) {
          allConst = false;
          break;
        }
        allData &= c->second.hasData;
        ins.push_back(&c->second);
      }
    }
    if (!allConst)
      continue;
    std::vector<ConstTensor> outs;
    FoldStatus status = FoldStatus::TooLarge;
    if (allData) {
      auto st = foldNode(n, ins, outs, kMaxFoldElements);
      if (!st)
        return withContext(st.takeError(), s.where(i) + ": ");
      status = *st;
    }
    if (status == FoldStatus::NotFoldable)
      continue;
    if (status == FoldStatus::TooLarge) {
      // Too large to materialise (a causal mask): a constant of known shape
      // without data, once inference knows the shape.
      outs.assign(n.output_size(), ConstTensor());
      bool known = true;
      for (int k = 0; k < n.output_size(); ++k) {
        auto it = s.infos.find(n.output(k));
        if (n.output(k).empty())
          continue;
        if (it == s.infos.end() || !it->second.fullyKnown() ||
            !it->second.elemType) {
          known = false;
          break;
        }
        outs[k].elemType = it->second.elemType;
        outs[k].dims = it->second.dims;
        outs[k].hasData = false;
      }
      if (!known)
        continue;
      describeLargeConstant(n, ins, outs);
    }
    if (static_cast<int>(outs.size()) != n.output_size())
      continue;
    for (int k = 0; k < n.output_size(); ++k)
      if (!n.output(k).empty())
        s.consts[n.output(k)] = std::move(outs[k]);
    s.folded[i] = true;
    changed = true;
  }
  return changed;
}

} // namespace

llvm::Error foldAndInfer(ImportState &s) {
  const onnx::GraphProto &g = s.graph();
  s.folded.assign(g.node_size(), false);
  // Integer initializers with data are constants for folding; floating ones
  // are parameters and buffers and stay out of it.
  for (const auto &t : g.initializer()) {
    if (isFloatElemType(t.data_type()) || !protoHasData(t))
      continue;
    auto c = constFromProto(t, kMaxFoldElements);
    if (!c)
      return withContext(c.takeError(),
                         fmt::format("{}: {}: ", s.path, s.describe(t.name())));
    if (c->hasData)
      s.consts[t.name()] = std::move(*c);
  }
  // Each pass folds at least one node, so this ends; the last inference ran
  // after the last fold.
  for (;;) {
    if (auto err = runInference(s))
      return err;
    auto changed = foldPass(s);
    if (!changed)
      return changed.takeError();
    if (!*changed)
      return llvm::Error::success();
  }
}

} // namespace import
} // namespace soap
