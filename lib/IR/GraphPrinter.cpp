// `soapc dump`: what the IR knows of each op, as a table or as JSON.
#include "soap/IR/GraphPrinter.h"

#include "soap/Support/Format.h"
#include <fmt/format.h>

namespace soap {

std::string formatLoops(const OpSemantics &sem) {
  std::string s;
  for (const LoopDim &l : sem.loops) {
    if (!s.empty())
      s += ' ';
    s += fmt::format("{}:{}{}{}", l.name, l.size, dimClassLetter(l.cls),
                     l.splittable ? "" : "*");
  }
  return s;
}

/// Parameters of the weights an op is the first to use (shared weights,
/// such as an unrolled LSTM's or a tied embedding, are counted once).
static int64_t opParams(const Graph &g, const Op &o) {
  int64_t n = 0;
  for (int i : o.sem.weightInputs) {
    const Value &w = g.value(o.inputs[i]);
    if (!w.users.empty() && w.users.front() == o.id)
      n += w.shape.numElements().value_or(0);
  }
  return n;
}

static std::string outputShapes(const Graph &g, const Op &o) {
  std::string s;
  for (ValueId v : o.outputs)
    if (v != kNoValue)
      s += (s.empty() ? "" : " ") + g.value(v).shape.str();
  return s;
}

void printGraphTable(const Graph &g, int64_t batch, llvm::raw_ostream &os) {
  os << fmt::format("model: {}\nbatch: {}\nops: {}\nparameters: {}\n"
                    "forward FLOPs: {} ({:.0f})\n\n",
                    g.sourcePath, batch, g.numOps(),
                    withCommas(g.parameterCount()),
                    formatSi(g.forwardFlops()), g.forwardFlops());
  Table t({"#", "op", "kind", "output", "loops", "GFLOP fwd", "params"},
          {true, false, false, false, false, true, true});
  for (const Op &o : g.ops()) {
    double gf = o.sem.tileFlops(Pass::Forward, o.sem.fullTile()) / 1e9;
    int64_t p = opParams(g, o);
    t.addRow({std::to_string(o.id), o.name, o.kind, outputShapes(g, o),
              formatLoops(o.sem), fmt::format("{:.3f}", gf),
              p ? withCommas(p) : ""});
  }
  t.print(os);
}

Json graphToJson(const Graph &g, int64_t batch) {
  Json ops = Json::array();
  auto tensors = [&](const std::vector<ValueId> &ids) {
    Json arr = Json::array();
    for (ValueId v : ids) {
      if (v == kNoValue) {
        arr.push_back(nullptr);
        continue;
      }
      const Value &val = g.value(v);
      arr.push_back({{"name", val.name},
                     {"shape", val.shape.dims},
                     {"dtype", dtypeName(val.dtype).str()},
                     {"kind", valueKindName(val.kind).str()}});
    }
    return arr;
  };
  for (const Op &o : g.ops()) {
    Json loops = Json::array();
    for (const LoopDim &l : o.sem.loops)
      loops.push_back({{"name", l.name},
                       {"class", std::string(1, dimClassLetter(l.cls))},
                       {"size", l.size},
                       {"splittable", l.splittable},
                       {"granule", l.granule},
                       {"stat_reduced", l.statReduced},
                       {"exchange_steps", l.exchangeSteps}});
    Box full = o.sem.fullTile();
    std::vector<DType> inT, outT;
    for (ValueId v : o.inputs)
      inT.push_back(v == kNoValue ? DType::F32 : g.value(v).dtype);
    for (ValueId v : o.outputs)
      outT.push_back(v == kNoValue ? DType::F32 : g.value(v).dtype);
    ops.push_back(
        {{"name", o.name},
         {"kind", o.kind},
         {"inputs", tensors(o.inputs)},
         {"outputs", tensors(o.outputs)},
         {"loops", loops},
         {"flops",
          {{"forward", o.sem.tileFlops(Pass::Forward, full)},
           {"backward_data", o.sem.tileFlops(Pass::BackwardData, full)},
           {"backward_weight", o.sem.tileFlops(Pass::BackwardWeight, full)}}},
         {"saved_bytes", o.sem.savedBytes(full, inT, outT)},
         {"params", opParams(g, o)}});
  }
  return {{"model", g.sourcePath},
          {"batch", batch},
          {"parameters", g.parameterCount()},
          {"forward_flops", g.forwardFlops()},
          {"ops", ops}};
}

} // namespace soap
