// From a plan back to a strategy for a graph and topology (soapc simulate
// --plan, soap-run), and `soapc check`'s comparison of a plan with the model
// and topology as they are now. Both match ops by name, not by position, so
// the checks can say which op no longer fits.
#include "soap/Plan/Plan.h"

#include "soap/Parallel/Megatron.h"
#include "soap/Support/Error.h"
#include <fmt/format.h>
#include <functional>

namespace soap {

namespace {

std::string loopNames(const OpSemantics &sem) {
  std::string s;
  for (const LoopDim &l : sem.loops)
    s += (s.empty() ? "" : ", ") + l.name;
  return s.empty() ? "none" : s;
}

/// Builds op `op`'s configuration from `po` (whose name and kind match) and
/// verifies it. `where(suffix)` gives the prefix of an error message for
/// the plan's JSON pointer suffix ("/loops/oc", "/devices/3", "" for the op).
/// `vocabLoop` (-1: none) is the op's padded-vocabulary loop, which may
/// split unevenly (Strategy::vocabPadding).
llvm::Expected<OpConfig>
opConfig(const PlanOp &po, const Op &op, const Topology &topo, int vocabLoop,
         const std::function<std::string(const std::string &)> &where) {
  OpConfig c;
  c.degree.assign(op.sem.loops.size(), 1);
  for (const auto &[name, degree] : po.loops) {
    size_t l = 0;
    while (l < op.sem.loops.size() && op.sem.loops[l].name != name)
      ++l;
    if (l == op.sem.loops.size())
      return inputError("{}: no loop '{}' (the op's loops: {})",
                        where(jsonPointer("/loops", name)), name,
                        loopNames(op.sem));
    c.degree[l] = degree;
  }
  c.replicas = po.replicas;
  c.devices = po.devices;
  // Checked here rather than left to verifyConfig so the message can point
  // at the offending entry.
  for (size_t k = 0; k < c.devices.size(); ++k)
    if (c.devices[k] >= topo.numDevices())
      return inputError("{}: device {} is not in topology '{}' ({} devices)",
                        where(jsonPointer("/devices", k)), c.devices[k],
                        topo.name(), topo.numDevices());
  if (auto err =
          verifyConfig(c, op.sem, topo.numDevices(), where(""), vocabLoop))
    return err;
  return c;
}

/// Per op of `g`, `value(po)` of the plan's op of its name; empty where
/// every value is 0 (a Strategy's per-op vectors: recompute, zero, ...).
template <typename Value>
std::vector<uint8_t> perOp(const Plan &p, const Graph &g, Value value) {
  std::vector<uint8_t> out;
  for (const PlanOp &po : p.ops) {
    uint8_t v = value(po);
    OpId id = v ? g.findOp(po.name) : -1;
    if (id < 0)
      continue;
    if (out.empty())
      out.assign(g.numOps(), 0);
    out[size_t(id)] = v;
  }
  return out;
}

/// The plan's pipeline on `s` (whose configs are set): stages by op name.
void setPipeline(const Plan &p, const Graph &g, Strategy &s) {
  s.recompute =
      perOp(p, g, [](const PlanOp &po) { return uint8_t(po.recompute); });
  s.zero = perOp(p, g, [](const PlanOp &po) { return uint8_t(po.zero); });
  s.weightGrad =
      perOp(p, g, [](const PlanOp &po) { return uint8_t(po.weightGrad); });
  s.pipeline = Pipeline();
  s.pipeline.microBatches = p.microBatches;
  s.pipeline.schedule = p.schedule;
  s.pipeline.chunks = p.chunks;
  s.gradSync = p.gradSync;
  s.vocabPadding = p.vocabPadding;
  bool staged = false;
  for (const PlanOp &po : p.ops)
    staged |= po.stage > 0;
  if (!staged)
    return;
  s.pipeline.stageOf.assign(g.numOps(), 0);
  for (const PlanOp &po : p.ops) {
    OpId id = g.findOp(po.name);
    if (id >= 0)
      s.pipeline.stageOf[size_t(id)] = po.stage;
  }
}

} // namespace

llvm::Expected<Strategy> planStrategy(const Plan &p, const Graph &g,
                                      const Topology &topo,
                                      llvm::StringRef planPath) {
  Strategy s;
  s.configs.resize(g.numOps());
  std::vector<bool> configured(g.numOps(), false);
  std::vector<int> vocab;
  if (p.vocabPadding > 0)
    vocab = vocabularyLoops(g);
  for (size_t i = 0; i < p.ops.size(); ++i) {
    const PlanOp &po = p.ops[i];
    std::string ptr = jsonPointer("/ops", i);
    OpId id = g.findOp(po.name);
    if (id < 0)
      return inputError("{}: {}: op '{}' is not in the model {}; a plan for "
                        "another model?",
                        planPath.str(), jsonPointer(ptr, "op"), po.name,
                        g.sourcePath);
    const Op &op = g.op(id);
    if (op.kind != po.kind)
      return inputError("{}: {}: op '{}' is {} in the model, {} in the plan",
                        planPath.str(), jsonPointer(ptr, "kind"), po.name,
                        op.kind, po.kind);
    if (configured[id])
      return inputError("{}: {}: op '{}' appears twice", planPath.str(),
                        jsonPointer(ptr, "op"), po.name);
    int vl = vocab.empty() ? -1 : vocab[size_t(id)];
    auto c = opConfig(po, op, topo, vl, [&](const std::string &suffix) {
      return fmt::format("{}: {}{}: op '{}'", planPath.str(), ptr, suffix,
                         po.name);
    });
    if (!c)
      return c.takeError();
    s.configs[id] = std::move(*c);
    configured[id] = true;
  }
  for (const Op &op : g.ops())
    if (!configured[op.id])
      return inputError("{}: /ops: op '{}' ({}) of the model {} is missing "
                        "from the plan",
                        planPath.str(), op.name, op.kind, g.sourcePath);
  setPipeline(p, g, s);
  if (auto err = verifyPipeline(s, g))
    return inputError("{}: /pipeline: {}", planPath.str(),
                      errorMessage(std::move(err)));
  for (size_t i = 0; i < p.ops.size(); ++i) {
    OpId id = g.findOp(p.ops[i].name);
    if (p.ops[i].recompute && !recomputeMatters(g, s, id))
      return inputError("{}: {}: op '{}' is recomputed, but it saves nothing "
                        "for backward and no recomputed op reads its output",
                        planPath.str(),
                        jsonPointer(jsonPointer("/ops", i), "recompute"),
                        p.ops[i].name);
    if (p.ops[i].zero && g.op(id).sem.weightInputs.empty())
      return inputError("{}: {}: op '{}' has ZeRO stage {}, but it has no "
                        "weights",
                        planPath.str(),
                        jsonPointer(jsonPointer("/ops", i), "zero"),
                        p.ops[i].name, p.ops[i].zero);
    if (p.ops[i].weightGrad != WeightGradOrder::Next &&
        g.op(id).sem.weightInputs.empty())
      return inputError(
          "{}: {}: op '{}' orders its weight gradients '{}', "
          "but it has no weights",
          planPath.str(), jsonPointer(jsonPointer("/ops", i), "weight_grad"),
          p.ops[i].name, weightGradOrderName(p.ops[i].weightGrad));
  }
  return s;
}

std::vector<CheckFinding> checkPlan(const Plan &p, llvm::StringRef modelSha256,
                                    llvm::StringRef topologySha256,
                                    int64_t batch, const Graph &g,
                                    const Topology &topo,
                                    const SimMetrics *resimulated,
                                    const CheckGiven &given) {
  std::vector<CheckFinding> out;
  auto add = [&](std::string what) { out.push_back({std::move(what)}); };
  // An input file whose SHA-256 differs from the plan's: the plan's own
  // file changed, or another file was given.
  auto file = [&](const char *kind, llvm::StringRef planPath,
                  llvm::StringRef planSha, llvm::StringRef givenPath,
                  llvm::StringRef sha) {
    if (planSha == sha)
      return;
    add(givenPath.empty()
            ? fmt::format("{} {} changed: SHA-256 {} in the plan, {} now", kind,
                          planPath.str(), planSha.str(), sha.str())
            : fmt::format("{} {} was given, but the plan was made for {} "
                          "(SHA-256 {} in the plan, {} given)",
                          kind, givenPath.str(), planPath.str(), planSha.str(),
                          sha.str()));
  };
  file("model", p.inputs.modelPath, p.inputs.modelSha256, given.modelPath,
       modelSha256);
  file("topology", p.inputs.topologyPath, p.inputs.topologySha256,
       given.topologyPath, topologySha256);
  if (p.inputs.batch != batch)
    add(given.batch ? fmt::format("batch {} was given, but the plan was made "
                                  "for batch {}",
                                  batch, p.inputs.batch)
                    : fmt::format("batch changed: {} in the plan, {} now",
                                  p.inputs.batch, batch));

  std::vector<bool> inPlan(g.numOps(), false);
  Strategy whole;
  whole.configs.resize(g.numOps());
  std::vector<int> vocab;
  if (p.vocabPadding > 0)
    vocab = vocabularyLoops(g);
  size_t valid = 0;
  for (const PlanOp &po : p.ops) {
    OpId id = g.findOp(po.name);
    if (id < 0) {
      add(fmt::format("op '{}' ({}) of the plan is not in the model", po.name,
                      po.kind));
      continue;
    }
    inPlan[id] = true;
    const Op &op = g.op(id);
    if (op.kind != po.kind) {
      add(fmt::format("op '{}' changed kind: {} in the plan, {} in the model",
                      po.name, po.kind, op.kind));
      continue;
    }
    auto c = opConfig(po, op, topo, vocab.empty() ? -1 : vocab[size_t(id)],
                      [&](const std::string &) {
                        return fmt::format("op '{}'", po.name);
                      });
    if (!c) {
      add(errorMessage(c.takeError()));
      continue;
    }
    whole.configs[size_t(id)] = std::move(*c);
    ++valid;
  }
  for (const Op &op : g.ops())
    if (!inPlan[op.id])
      add(fmt::format("op '{}' ({}) of the model is not in the plan", op.name,
                      op.kind));
  // The pipeline, once every op has a valid configuration: stages
  // contiguous, device groups disjoint, micro-batches dividing the batch.
  if (valid == g.numOps()) {
    setPipeline(p, g, whole);
    if (auto err = verifyPipeline(whole, g))
      add(errorMessage(std::move(err)));
    for (const Op &op : g.ops())
      if (whole.recomputes(op.id) && !recomputeMatters(g, whole, op.id))
        add(fmt::format("op '{}' ({}) is recomputed, but it saves nothing "
                        "for backward and no recomputed op reads its output",
                        op.name, op.kind));
    for (const Op &op : g.ops()) {
      int z = whole.zeroStage(op.id);
      if (z && op.sem.weightInputs.empty())
        add(fmt::format("op '{}' ({}) has ZeRO stage {}, but it has no "
                        "weights",
                        op.name, op.kind, z));
      else if (z && !hasDataParallelGroup(g, whole, op.id))
        add(fmt::format("op '{}' ({}) has ZeRO stage {}, but no "
                        "data-parallel group: no device shares its weight "
                        "shards",
                        op.name, op.kind, z));
    }
    for (const Op &op : g.ops())
      if (whole.weightGradOrder(op.id) != WeightGradOrder::Next &&
          op.sem.weightInputs.empty())
        add(fmt::format("op '{}' ({}) orders its weight gradients '{}', but "
                        "it has no weights",
                        op.name, op.kind,
                        weightGradOrderName(whole.weightGradOrder(op.id))));
  }

  if (resimulated && !resimulated->fits) {
    const SimMetrics &m = *resimulated;
    // A plan written with fits=false never fitted; say so rather than
    // "no longer".
    add(fmt::format(
        "memory {}: device {} ({}) needs {} bytes, capacity {}",
        p.figures.fits ? "no longer fits" : "does not fit", m.peakDevice,
        m.peakDevice < topo.numDevices() ? topo.deviceName(m.peakDevice)
                                         : std::string("?"),
        m.peakMemory, m.capacity));
  }
  return out;
}

} // namespace soap
