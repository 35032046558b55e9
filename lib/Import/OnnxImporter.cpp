// ONNX → IR import: the driver that runs loading, shape inference with
// constant folding, and IR construction (see OnnxImporter.h).
#include "soap/Import/OnnxImporter.h"

#include "soap/IR/Fusion.h"

#include "ImportState.h"
#include "soap/IR/OpRegistry.h"
#include "soap/IR/UnrollRnn.h"
#include "soap/Support/Error.h"
#include <algorithm>
#include <map>
#include <set>

namespace soap {

llvm::Error ImportOptions::validate() const {
  if (batch < 1)
    return inputError("invalid batch size {}: it must be at least 1", batch);
  return llvm::Error::success();
}

namespace import {
namespace {

/// Why soapc's IR cannot hold an op whose reads or shapes depend on the
/// values it computes with (a mixture of experts' routing is made of
/// them); "" for other ops.
llvm::StringRef dataDependence(const onnx::NodeProto &n) {
  if (!n.domain().empty() && n.domain() != "ai.onnx")
    return "";
  const std::string &op = n.op_type();
  if (op == "TopK")
    return "it selects elements by their values (as a mixture of experts' "
           "top-k router does), and soapc's ops read regions that shapes "
           "alone decide";
  if (op == "NonZero" || op == "Unique" || op == "Compress")
    return "its output's shape depends on its input's values, and soapc's "
           "tensors have static shapes";
  if (op == "OneHot" || op == "ScatterElements" || op == "GatherElements" ||
      op == "GatherND")
    return "the positions it reads or writes are the values of an operand, "
           "and soapc's ops read regions that shapes alone decide";
  return "";
}

/// Rejects unknown operators before shape inference, so that the user reads
/// "unsupported operator" rather than whatever inference makes of it. The
/// line names the first and why where the reason is the op's semantics,
/// and the other kinds the model needs that soapc lacks.
llvm::Error checkOperators(const ImportState &s) {
  registerAllOps();
  const onnx::GraphProto &g = s.graph();
  int first = -1;
  std::string firstKind;
  std::vector<std::string> others;
  for (int i = 0; i < g.node_size(); ++i) {
    const onnx::NodeProto &n = g.node(i);
    bool defaultDomain = n.domain().empty() || n.domain() == "ai.onnx";
    std::string kind =
        defaultDomain ? n.op_type() : n.domain() + "." + n.op_type();
    // Shape arithmetic may fold away and a Pad may merge into its reader;
    // what remains of them is checked when the IR is built.
    if (OpRegistry::instance().lookup(kind) || isLoweredOp(n) ||
        (defaultDomain && (isFoldableOp(n) || n.op_type() == "Pad")))
      continue;
    if (first < 0) {
      first = i;
      firstKind = kind;
    } else if (kind != firstKind &&
             std::find(others.begin(), others.end(), kind) == others.end())
      others.push_back(kind);
  }
  if (first < 0)
    return llvm::Error::success();
  const onnx::NodeProto &n = g.node(first);
  llvm::StringRef why = dataDependence(n);
  std::string also;
  for (size_t k = 0; k < others.size(); ++k)
    also += (k ? ", " : "; the model also needs ") + others[k];
  return inputError("{}: unsupported operator '{}' (domain '{}'){}{}{}",
                    s.where(first), n.op_type(), n.domain(),
                    why.empty() ? "" : ": ", why, also);
}

/// Window attributes that ONNX's shape inference divides by or sizes with
/// unchecked (a stride of 0 is a division by zero in onnx 1.12's
/// convPoolShapeInference, found by fuzz-onnx): every stride, dilation,
/// kernel size and group must be positive, every pad non-negative.
llvm::Error checkWindowAttributes(const ImportState &s) {
  static const std::set<std::string> windowed = {
      "Conv", "ConvTranspose", "MaxPool", "AveragePool", "LpPool"};
  const onnx::GraphProto &g = s.graph();
  // Ranks known before inference: graph inputs and initializers. onnx 1.12
  // dereferences null when a Conv's data has rank < 3 or its weights another
  // rank (found by fuzz-onnx).
  std::map<std::string, int> rank;
  for (const auto &vi : g.input())
    if (vi.type().has_tensor_type() && vi.type().tensor_type().has_shape())
      rank[vi.name()] = vi.type().tensor_type().shape().dim_size();
  for (const auto &t : g.initializer())
    rank[t.name()] = t.dims_size();
  for (int i = 0; i < g.node_size(); ++i) {
    const onnx::NodeProto &n = g.node(i);
    if (!windowed.count(n.op_type()))
      continue;
    auto x = n.input_size() > 0 ? rank.find(n.input(0)) : rank.end();
    if (x != rank.end() && x->second < 3)
      return inputError("{}: input '{}' has rank {}; {} needs rank >= 3",
                        s.where(i), n.input(0), x->second, n.op_type());
    auto w = n.input_size() > 1 && n.op_type().rfind("Conv", 0) == 0
                 ? rank.find(n.input(1))
                 : rank.end();
    if (x != rank.end() && w != rank.end() && w->second != x->second)
      return inputError("{}: weight '{}' has rank {}, input '{}' has rank {}",
                        s.where(i), n.input(1), w->second, n.input(0),
                        x->second);
    for (const onnx::AttributeProto &a : n.attribute()) {
      bool positive = a.name() == "strides" || a.name() == "dilations" ||
                      a.name() == "kernel_shape";
      if (positive || a.name() == "pads")
        for (int64_t v : a.ints())
          if (positive ? v < 1 : v < 0)
            return inputError("{}: attribute '{}' holds {}; it must be {}",
                              s.where(i), a.name(), v,
                              positive ? "positive" : "non-negative");
      if (a.name() == "group" && a.i() < 1)
        return inputError("{}: attribute 'group' is {}; it must be positive",
                          s.where(i), a.i());
    }
  }
  return llvm::Error::success();
}

} // namespace
} // namespace import

namespace {

llvm::Expected<std::unique_ptr<Graph>> runImport(llvm::StringRef path,
                                                 const llvm::StringRef *bytes,
                                                 const ImportOptions &opts) {
  if (auto err = opts.validate())
    return llvm::Expected<std::unique_ptr<Graph>>(std::move(err));
  import::ImportState s;
  s.path = path.str();
  s.opts = opts;
  s.buffer = bytes;
  if (auto err = import::loadModel(s))
    return err;
  if (auto err = import::checkOperators(s))
    return err;
  if (auto err = import::checkWindowAttributes(s))
    return err;
  if (auto err = import::foldAndInfer(s))
    return err;
  import::fusePads(s);
  auto g = import::buildGraph(s);
  if (g && opts.unrollRnn)
    g = unrollLstms(**g);
  if (g && opts.kernels != KernelMode::Eager)
    g = fuseKernels(**g, nullptr, opts.kernels);
  if (g && opts.precision != Precision::FP32)
    if (auto err = (*g)->setPrecision(opts.precision))
      return llvm::Expected<std::unique_ptr<Graph>>(std::move(err));
  return g;
}

} // namespace

llvm::Expected<std::unique_ptr<Graph>> importOnnx(llvm::StringRef path,
                                                  const ImportOptions &opts) {
  return runImport(path, nullptr, opts);
}

llvm::Expected<std::unique_ptr<Graph>>
importOnnxBuffer(llvm::StringRef bytes, llvm::StringRef name,
                 const ImportOptions &opts) {
  return runImport(name, &bytes, opts);
}

} // namespace soap
