// Keeping the sample dim through PyTorch's attention output projection: a
// Gemm over rows that merge sequence and batch (sequence first) is computed
// as a batched MatMul over the unmerged rows (see unmergeSampleRows).
#include "ImportState.h"

#include <numeric>

namespace soap {
namespace import {
namespace {

int64_t product(const std::vector<int64_t> &dims, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t k = begin; k < end; ++k)
    p *= dims[k];
  return p;
}

/// Whether the rows of `x` reshaped to [rows, ...] hold the sample dim but
/// not as their leading dim: the leading dims of x whose product is `rows`
/// (the last of them possibly only its leading factor, as [T, N*h, d] gives
/// rows T*N) include a Sample dim and do not start with one.
bool samplesInsideRows(const Value &x, int64_t rows) {
  auto isSample = [&](size_t d) {
    return d < x.dimClasses.size() && x.dimClasses[d] == DimClass::Sample;
  };
  if (x.shape.rank() == 0 || isSample(0))
    return false;
  int64_t p = 1;
  size_t d = 0;
  bool sample = false;
  while (d < x.shape.rank() && p * x.shape[d] <= rows) {
    p *= x.shape[d];
    sample |= isSample(d);
    ++d;
  }
  if (p == rows)
    return sample;
  // A leading factor of dim d ends the rows: an S dim split as N*h.
  return d < x.shape.rank() && rows % p == 0 && x.shape[d] % (rows / p) == 0 &&
         isSample(d);
}

double floatAttr(const IrNode &n, const char *name, double dflt) {
  auto it = n.attrs.find(name);
  if (it == n.attrs.end())
    return dflt;
  if (const double *d = std::get_if<double>(&it->second))
    return *d;
  return dflt;
}

int64_t intAttrOf(const IrNode &n, const char *name, int64_t dflt) {
  auto it = n.attrs.find(name);
  if (it == n.attrs.end())
    return dflt;
  if (const int64_t *i = std::get_if<int64_t>(&it->second))
    return *i;
  return dflt;
}

} // namespace

bool unmergeSampleRows(ImportState &s, const Graph &g,
                       std::vector<IrNode> &nodes) {
  std::map<std::string, std::vector<size_t>> readers;
  std::map<std::string, size_t> producers;
  for (size_t j = 0; j < nodes.size(); ++j) {
    for (const std::string &in : nodes[j].inputs)
      if (!in.empty())
        readers[in].push_back(j);
    for (const std::string &out : nodes[j].outputs)
      if (!out.empty())
        producers[out] = j;
  }
  std::set<std::string> graphOutputs;
  for (const auto &vi : s.graph().output())
    graphOutputs.insert(vi.name());
  auto onlyReader = [&](const std::string &t) -> const IrNode * {
    auto it = readers.find(t);
    if (graphOutputs.count(t) || it == readers.end() || it->second.size() != 1)
      return nullptr;
    return &nodes[it->second[0]];
  };
  // Dims as the first build gave them (initializers included).
  auto dimsOf = [&](const std::string &t) -> const std::vector<int64_t> * {
    ValueId v = g.findValue(t);
    return v == kNoValue ? nullptr : &g.value(v).shape.dims;
  };
  auto opName = [&](const IrNode &n) {
    return n.name.empty() ? s.nodeNames[n.node] : n.name;
  };

  // First the replacements of each rewritten Gemm (the Reshapes before
  // them are changed in place), then the new node list.
  std::map<size_t, std::vector<IrNode>> replaced;
  for (size_t j = 0; j < nodes.size(); ++j) {
    const IrNode &gemm = nodes[j];
    if (gemm.kind != "Gemm" || gemm.inputs.size() < 2 ||
        gemm.outputs.size() != 1 || intAttrOf(gemm, "transA", 0) != 0 ||
        floatAttr(gemm, "alpha", 1.0) != 1.0) {
      continue;
    }
    const std::string &a = gemm.inputs[0], &b = gemm.inputs[1];
    std::string c = gemm.inputs.size() > 2 ? gemm.inputs[2] : "";
    const std::string y = gemm.outputs[0];
    auto reshapeIn = producers.find(a);
    const IrNode *reshapeOut = onlyReader(y);
    const std::vector<int64_t> *aDims = dimsOf(a), *bDims = dimsOf(b),
                               *yDims = dimsOf(y);
    if (reshapeIn == producers.end() ||
        nodes[reshapeIn->second].kind != "Reshape" || !onlyReader(a) ||
        !reshapeOut || reshapeOut->kind != "Reshape" || !aDims || !yDims ||
        (!c.empty() && floatAttr(gemm, "beta", 1.0) != 1.0) ||
        (intAttrOf(gemm, "transB", 0) && !bDims)) {
      continue;
    }
    const std::vector<int64_t> *zDims = dimsOf(reshapeOut->outputs[0]);
    int64_t rows = (*yDims)[0], cols = (*yDims)[1];
    if (!zDims || zDims->size() < 3 || zDims->back() != cols ||
        product(*zDims, 0, zDims->size() - 1) != rows) {
      continue;
    }
    const std::vector<int64_t> *cDims = c.empty() ? nullptr : dimsOf(c);
    if (!c.empty() && (!cDims || product(*cDims, 0, cDims->size()) != cols ||
                       cDims->back() != cols)) {
      continue;
    }
    IrNode &reshape = nodes[reshapeIn->second];
    ValueId x = g.findValue(reshape.inputs[0]);
    if (x == kNoValue || !samplesInsideRows(g.value(x), rows)) {
      continue;
    }
    // Rewrite: rows unmerged to the dims the Reshape after the Gemm gives.
    std::vector<int64_t> lead(zDims->begin(), zDims->end() - 1);
    std::vector<int64_t> newA = lead, newY = lead;
    newA.push_back((*aDims)[1]);
    newY.push_back(cols);
    reshape.attrs["shape"] = newA;
    s.infos[a].dims = newA;
    int32_t elem = s.infos[y].elemType;
    std::string name = opName(gemm);
    std::string rhs = b;
    if (intAttrOf(gemm, "transB", 0)) {
      IrNode t;
      t.node = gemm.node;
      t.name = name + "/soapc.transB";
      t.kind = "Transpose";
      t.info = OpRegistry::instance().lookup(t.kind);
      t.inputs = {b};
      rhs = name + "/soapc.transB_output";
      t.outputs = {rhs};
      t.attrs["perm"] = std::vector<int64_t>{1, 0};
      s.infos[rhs] = TensorInfo{elem, true, {(*bDims)[1], (*bDims)[0]}};
      replaced[j].push_back(std::move(t));
    }
    IrNode mm;
    mm.node = gemm.node;
    mm.name = name;
    mm.kind = "MatMul";
    mm.info = OpRegistry::instance().lookup(mm.kind);
    mm.inputs = {a, rhs};
    std::string mmOut = c.empty() ? y : name + "/soapc.MatMul_output";
    mm.outputs = {mmOut};
    s.infos[mmOut] = TensorInfo{elem, true, newY};
    replaced[j].push_back(std::move(mm));
    if (!c.empty()) {
      IrNode add;
      add.node = gemm.node;
      add.name = name + "/soapc.bias";
      add.kind = "Add";
      add.info = OpRegistry::instance().lookup(add.kind);
      add.inputs = {mmOut, c};
      add.outputs = {y};
      s.infos[y] = TensorInfo{elem, true, newY};
      replaced[j].push_back(std::move(add));
    }
  }
  if (replaced.empty())
    return false;
  std::vector<IrNode> out;
  for (size_t j = 0; j < nodes.size(); ++j) {
    auto it = replaced.find(j);
    if (it == replaced.end())
      out.push_back(std::move(nodes[j]));
    else
      for (IrNode &n : it->second)
        out.push_back(std::move(n));
  }
  nodes = std::move(out);
  return true;
}

} // namespace import
} // namespace soap
