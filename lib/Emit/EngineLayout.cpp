// A plan read back as the settings of Megatron-LM's layout
// (include/soap/Emit/EngineLayout.h): the pipeline from the plan, the
// tensor and context degrees by rebuilding each candidate with the what-if
// builder and comparing it op for op, then recomputation and ZeRO from the
// per-op marks.
#include "soap/Emit/EngineLayout.h"

#include "soap/Parallel/ContextParallel.h"
#include "soap/Parallel/Megatron.h"
#include "soap/Support/Error.h"
#include <algorithm>
#include <fmt/format.h>
#include <optional>

namespace soap {

namespace {

/// The loop of `sem` with that name, or -1.
int loopNamed(const OpSemantics &sem, llvm::StringRef name) {
  for (size_t l = 0; l < sem.loops.size(); ++l)
    if (sem.loops[l].name == name)
      return int(l);
  return -1;
}

/// The first op whose stage or configuration differs between the plan's
/// strategy and `built`; numOps() when none does.
size_t firstDifference(const Graph &g, const Strategy &plan,
                       const Strategy &built) {
  for (const Op &op : g.ops())
    if (plan.pipeline.stage(op.id) != built.pipeline.stage(op.id) ||
        plan.configs[size_t(op.id)] != built.configs[size_t(op.id)])
      return size_t(op.id);
  return g.numOps();
}

/// The what-if builder's message without its flag's prefix.
std::string builderReason(llvm::Error err) {
  std::string msg = errorMessage(std::move(err));
  llvm::StringRef m(msg);
  m.consume_front("--strategy megatron: ");
  return m.str();
}

/// Positive divisors of n, ascending.
std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> d;
  for (int64_t k = 1; k <= n; ++k)
    if (n % k == 0)
      d.push_back(k);
  return d;
}

/// One way to read the plan: the settings and the layout they build.
struct Candidate {
  MegatronConfig config;
  int64_t dp = 1;
  Strategy built;
  size_t matched = 0; ///< ops before the first that differs
};

/// Why op `o` of the plan is not what `best` builds.
OpFinding describeDifference(const EmitContext &c, llvm::StringRef engine,
                             const Candidate &best, OpId o) {
  const Graph &g = c.graph;
  const OpSemantics &sem = g.op(o).sem;
  const Strategy &s = c.strategy;
  const MegatronConfig &k = best.config;
  std::string layout = fmt::format("tp={}, cp={}, dp={}{}", k.tp, k.cp, best.dp,
                                   k.sp.value_or(false) ? ", sequence parallel" : "");
  int32_t planStage = s.pipeline.stage(o);
  int32_t builtStage = best.built.pipeline.stage(o);
  if (planStage != builtStage) {
    int64_t stages = best.built.pipeline.numStages();
    int64_t layers = int64_t(transformerLayerStarts(g).size());
    return {o, "stage",
            fmt::format("is on pipeline stage {}, where {} cuts the {} "
                        "transformer layers into {} stages of {} (the "
                        "embedding with the first, the LM head and loss with "
                        "the last) and puts it on stage {}",
                        planStage, engine.str(), layers, stages,
                        stages > 0 ? layers / stages : 0, builtStage)};
  }
  const OpConfig &p = s.configs[size_t(o)];
  const OpConfig &e = best.built.configs[size_t(o)];
  std::vector<int> seq = sequenceLoops(g);
  for (size_t l = 0; l < sem.loops.size(); ++l) {
    if (p.degree[l] <= 1 || e.degree[l] != 1)
      continue;
    const LoopDim &d = sem.loops[l];
    std::string what;
    switch (d.cls) {
    case DimClass::Attribute:
      if (seq[size_t(o)] == int(l))
        what = fmt::format("splits its sequence loop '{}' {} ways, where {} "
                           "({}) keeps the sequence of this op whole",
                           d.name, p.degree[l], engine.str(), layout);
      else
        what = fmt::format("splits its attribute loop '{}' (a position "
                           "inside each sample, such as a convolution's "
                           "height) {} ways; {} splits a sample only along "
                           "a transformer's sequence (context and sequence "
                           "parallelism)",
                           d.name, p.degree[l], engine.str());
      break;
    case DimClass::Reduction:
      what = fmt::format("splits its reduction loop '{}' {} ways (partial "
                         "sums); {} splits a reduction only in the "
                         "row-parallel matmul that follows a column-parallel "
                         "one",
                         d.name, p.degree[l], engine.str());
      break;
    case DimClass::Parameter:
      what = fmt::format("splits its parameter loop '{}' {} ways, which {}'s "
                         "tensor parallelism ({}: column-parallel, then "
                         "row-parallel weight matmuls) leaves whole",
                         d.name, p.degree[l], engine.str(), layout);
      break;
    case DimClass::Sample:
      what = fmt::format("splits its sample loop '{}' {} ways, which {} ({}) "
                         "leaves whole here",
                         d.name, p.degree[l], engine.str(), layout);
      break;
    }
    return {o, "loops/" + d.name, what};
  }
  if (p.degree == e.degree && p.replicas == e.replicas)
    return {o, "devices",
            fmt::format("runs as {}, where {}'s rank order (tensor-parallel "
                        "ranks adjacent, then context-parallel, "
                        "data-parallel and pipeline ranks; {}) puts it on {}",
                        p.str(sem), engine.str(), layout, e.str(sem))};
  return {o, "",
          fmt::format("runs as {}, where {} ({}) runs it as {}", p.str(sem),
                      engine.str(), layout, e.str(sem))};
}

/// The tensor and context degrees a Megatron layout of the plan would have:
/// the most ways any op splits its parameter loops (the column-parallel
/// matmuls), and the ways the first attention op splits its query loop.
std::pair<int64_t, int64_t> suggestedDegrees(const EmitContext &c) {
  int64_t tensor = 1, context = 1;
  bool attention = false;
  for (const Op &op : c.graph.ops()) {
    const OpConfig &cfg = c.strategy.configs[size_t(op.id)];
    int64_t p = 1;
    for (size_t l = 0; l < op.sem.loops.size(); ++l)
      if (op.sem.loops[l].cls == DimClass::Parameter)
        p *= cfg.degree[l];
    tensor = std::max(tensor, p);
    if (!attention && isAttentionOp(op)) {
      attention = true;
      int q = loopNamed(op.sem, "q");
      if (q < 0 && op.sem.loops.size() == 4)
        q = 2; // an eager [batch, heads, q, k] softmax
      if (q >= 0)
        context = cfg.degree[size_t(q)];
    }
  }
  return {tensor, context};
}

/// The tensor and context degrees (and sequence parallelism) of the plan,
/// with `l`'s pipeline: the layout each candidate builds, compared op for
/// op; the first that matches, else the one that matches longest. An error
/// when no candidate builds at all.
llvm::Expected<Candidate> matchLayout(const EmitContext &c,
                                      llvm::StringRef engine,
                                      const EngineLayout &l) {
  const Graph &g = c.graph;
  const Topology &topo = c.topo;
  int64_t devices = int64_t(topo.numDevices());
  std::optional<Candidate> best;
  std::string firstReason;
  bool tried = false;
  // The degrees to try: those the plan suggests first (the widest split of
  // parameter loops is the tensor degree, the attention's query split the
  // context degree), then every other, smallest first.
  std::vector<std::pair<int64_t, int64_t>> degrees;
  for (int64_t t : divisors(int64_t(topo.devicesPerNode())))
    if (devices % (t * l.pp) == 0)
      for (int64_t cp : divisors(devices / (t * l.pp)))
        degrees.push_back({t, cp});
  std::pair<int64_t, int64_t> guess = suggestedDegrees(c);
  auto it = std::find(degrees.begin(), degrees.end(), guess);
  if (it != degrees.end())
    std::rotate(degrees.begin(), it, it + 1);
  for (auto [t, cp] : degrees)
    for (bool sp : {false, true}) {
      if (sp && t < 2)
        continue;
      int64_t dp = devices / (t * l.pp * cp);
      if (l.batch % (dp * l.microBatches) != 0)
        continue;
      tried = true;
      Candidate cand;
      cand.config.tp = int32_t(t);
      cand.config.pp = l.pp;
      cand.config.vp = l.vp;
      cand.config.cp = int32_t(cp);
      cand.config.sp = sp;
      cand.config.mbs = l.batch / (dp * l.microBatches);
      cand.dp = dp;
      auto built = megatronConfigStrategy(g, topo, cand.config);
      if (!built) {
        std::string why = builderReason(built.takeError());
        if (firstReason.empty())
          firstReason = why;
        continue;
      }
      cand.built = std::move(*built);
      cand.matched = firstDifference(g, c.strategy, cand.built);
      if (cand.matched == g.numOps())
        return cand;
      if (!best || cand.matched > best->matched)
        best = std::move(cand);
    }
  if (!tried)
    return planError(c, "/pipeline/micro_batches",
                     fmt::format("the batch of {} does not split into {} "
                                 "micro-batches over the data-parallel ranks "
                                 "{} could give it",
                                 l.batch, l.microBatches, engine.str()));
  if (!best)
    return planError(c, "/pipeline",
                     fmt::format("{} cannot lay out this plan: {}",
                                 engine.str(), firstReason));
  return std::move(*best);
}

/// The plan's recomputation as the nearest of Megatron's policies, and
/// the first op that policy marks otherwise when it is not exactly one.
RecomputeMode readRecompute(const EmitContext &c, llvm::StringRef engine,
                            std::vector<OpFinding> &findings) {
  const Graph &g = c.graph;
  std::vector<uint8_t> planned(g.numOps(), 0);
  for (const Op &op : g.ops())
    planned[size_t(op.id)] = c.strategy.recomputes(op.id);
  const RecomputeMode modes[] = {RecomputeMode::None, RecomputeMode::Selective,
                                 RecomputeMode::Full};
  std::vector<uint8_t> policies[] = {std::vector<uint8_t>(g.numOps(), 0),
                                     megatronSelectiveRecompute(g),
                                     recomputePolicy(g, true)};
  size_t nearest = 0, fewest = g.numOps() + 1;
  for (size_t i = 0; i < 3; ++i) {
    policies[i].resize(g.numOps(), 0);
    size_t differ = 0;
    for (size_t o = 0; o < g.numOps(); ++o)
      differ += (policies[i][o] != 0) != (planned[o] != 0);
    if (differ == 0)
      return modes[i];
    if (differ < fewest) {
      fewest = differ;
      nearest = i;
    }
  }
  for (size_t o = 0; o < g.numOps(); ++o)
    if ((policies[nearest][o] != 0) != (planned[o] != 0)) {
      findings.push_back(
          {OpId(o), "recompute",
           fmt::format("is {}, so the plan's recomputation is none of {}'s: "
                       "the core attention (selective) or each transformer "
                       "layer from its input (full); the nearest, {}, {} it",
                       planned[o] ? "recomputed" : "not recomputed",
                       engine.str(), recomputeModeName(modes[nearest]).str(),
                       planned[o] ? "keeps" : "recomputes")});
      break;
    }
  return modes[nearest];
}

/// The ZeRO stage of the ops whose weights a data-parallel group holds,
/// and the first op whose stage differs from the first's.
void readZero(const EmitContext &c, llvm::StringRef engine, EngineLayout &l) {
  const Graph &g = c.graph;
  const Strategy &s = c.strategy;
  auto stage = [](int st) {
    return st ? fmt::format("ZeRO-{}", st) : std::string("no ZeRO stage");
  };
  for (const Op &op : g.ops()) {
    if (s.weightGradOrder(op.id) != WeightGradOrder::Next)
      ++l.ownWeightGradOrder;
    if (!hasDataParallelGroup(g, s, op.id))
      continue;
    int z = s.zeroStage(op.id);
    if (l.zeroOp < 0) {
      l.zeroOp = op.id;
      l.zero = z;
    } else if (z != l.zero && std::none_of(l.findings.begin(), l.findings.end(),
                                           [](const OpFinding &f) {
                                             return f.field == "zero";
                                           })) {
      l.findings.push_back(
          {op.id, "zero",
           fmt::format("has {}, where op '{}' has {}; {} shards every weight "
                       "alike",
                       stage(z), g.op(OpId(l.zeroOp)).name, stage(l.zero),
                       engine.str())});
    }
  }
}

/// The what-if a plan was built from, checked against what its ops say.
llvm::Error crossCheckWhatIf(const EmitContext &c, const EngineLayout &l) {
  llvm::StringRef searcher = c.plan.inputs.searcher;
  auto differs = [&](llvm::StringRef keys) {
    return planError(c, "/search/searcher",
                     fmt::format("the plan records the what-if '{}', but its "
                                 "ops are laid out as {}",
                                 keys.str(), l.str()));
  };
  bool dataGroups = l.zeroOp >= 0;
  if (searcher.consume_front("simulate megatron:")) {
    auto k = parseMegatronConfig(searcher);
    if (!k)
      return withContext(k.takeError(), c.planPath + ": /search/searcher: ");
    bool same = k->tp == l.tp && k->pp == l.pp && k->vp == l.vp &&
                k->cp == l.cp && k->sequenceParallel(c.graph) == l.sp && k->mbs == l.microBatchSize &&
                k->recompute == l.recompute &&
                (!dataGroups || k->distopt == (l.zero == 1)) &&
                (l.pp == 1 || k->schedule == l.schedule);
    return same ? llvm::Error::success() : differs(searcher);
  }
  if (searcher.consume_front("simulate fsdp:")) {
    auto k = parseFsdpConfig(searcher);
    if (!k)
      return withContext(k.takeError(), c.planPath + ": /search/searcher: ");
    bool same = l.tp == 1 && l.pp == 1 && l.cp == 1 &&
                (k->mbs == 0 || k->mbs == l.microBatchSize) &&
                k->recompute == l.recompute &&
                (!dataGroups || k->zero == l.zero);
    return same ? llvm::Error::success() : differs(searcher);
  }
  return llvm::Error::success();
}

} // namespace

std::string EngineLayout::str() const {
  return fmt::format("tp={},pp={},vp={},cp={},sp={},dp={},mbs={},recompute={},"
                     "zero={}",
                     tp, pp, vp, cp, int(sp), dp, microBatchSize,
                     recomputeModeName(recompute).str(), zero);
}

llvm::Error opError(const EmitContext &c, OpId op, llvm::StringRef field,
                    const std::string &what) {
  const Op &o = c.graph.op(op);
  // The plan's own index of the op (its ops are matched by name).
  size_t index = size_t(op);
  for (size_t i = 0; i < c.plan.ops.size(); ++i)
    if (c.plan.ops[i].name == o.name) {
      index = i;
      break;
    }
  std::string ptr = fmt::format("/ops/{}", index);
  if (!field.empty())
    ptr += "/" + field.str();
  return inputError("{}: {}: op '{}' ({}) {}", c.planPath, ptr, o.name, o.kind,
                    what);
}

llvm::Error planError(const EmitContext &c, llvm::StringRef pointer,
                      const std::string &what) {
  return inputError("{}: {}: {}", c.planPath, pointer.str(), what);
}

llvm::Error firstOpError(const EmitContext &c,
                         const std::vector<OpFinding> &findings) {
  const OpFinding *first = nullptr;
  for (const OpFinding &f : findings)
    if (!first || f.op < first->op)
      first = &f;
  return first ? opError(c, first->op, first->field, first->what)
               : llvm::Error::success();
}

ModelShape modelShape(const Graph &g) {
  ModelShape m;
  std::vector<OpId> starts = transformerLayerStarts(g);
  m.layers = int64_t(starts.size());
  OpId attention = -1;
  for (const Op &op : g.ops()) {
    if (!isAttentionOp(op))
      continue;
    attention = op.id;
    const OpSemantics &sem = op.sem;
    if (op.kind == "FlashAttention") {
      // "h" runs over the kv heads, "r" over the query heads of each.
      int h = loopNamed(sem, "h"), r = loopNamed(sem, "r"),
          q = loopNamed(sem, "q");
      int64_t kv = h >= 0 ? sem.loops[size_t(h)].size : 0;
      m.kvHeads = kv;
      m.heads = kv * (r >= 0 ? sem.loops[size_t(r)].size : 1);
      m.seqLength = q >= 0 ? sem.loops[size_t(q)].size : 0;
    } else {
      // An eager [batch, heads, q, k] softmax.
      m.heads = m.kvHeads = sem.loops[1].size;
      m.seqLength = sem.loops[2].size;
    }
    break;
  }
  if (starts.size() < 2 || attention < 0)
    return m;
  const Op *down = nullptr;
  for (OpId o = attention; o < starts[1]; ++o) {
    const Op &op = g.op(o);
    if (!op.sem.weightInputs.empty() &&
        (op.kind == "MatMul" || op.kind == "Gemm"))
      down = &op;
  }
  if (!down || down->outputs.empty() || down->outputs[0] == kNoValue)
    return m;
  const std::vector<int64_t> &out = g.value(down->outputs[0]).shape.dims;
  for (const LoopDim &l : down->sem.loops)
    if (l.cls == DimClass::Reduction && !out.empty()) {
      m.ffnHidden = l.size;
      m.hidden = out.back();
      break;
    }
  return m;
}

llvm::Expected<EngineLayout> readEngineLayout(const EmitContext &c,
                                              llvm::StringRef engine) {
  const Graph &g = c.graph;
  const Strategy &s = c.strategy;
  EngineLayout l;
  l.batch = c.plan.inputs.batch;
  l.pp = s.pipeline.numGroups();
  l.vp = s.pipeline.chunks;
  l.microBatches = s.pipeline.microBatches;
  l.schedule = s.pipeline.schedule;
  l.gradSync = s.gradSync;
  l.shape = modelShape(g);

  // Every rank runs a part of the model.
  int64_t devices = int64_t(c.topo.numDevices());
  std::vector<bool> used(size_t(devices), false);
  for (const OpConfig &cfg : s.configs)
    for (DeviceId d : cfg.devices)
      used[size_t(d)] = true;
  int64_t usedCount = std::count(used.begin(), used.end(), true);
  if (usedCount < devices)
    return planError(c, "/ops",
                     fmt::format("the plan runs on {} of the {} devices of "
                                 "{}; {} gives every rank a part of the "
                                 "model",
                                 usedCount, devices, c.plan.topologyName,
                                 engine.str()));
  if (s.pipeline.numStages() > 1 && l.shape.layers == 0)
    return planError(c, "/pipeline/stages",
                     fmt::format("the plan has {} pipeline stages, but {} has "
                                 "no transformer layer stack for {} to cut "
                                 "into stages",
                                 s.pipeline.numStages(), c.modelPath,
                                 engine.str()));

  auto match = matchLayout(c, engine, l);
  if (!match)
    return match.takeError();
  l.tp = match->config.tp;
  l.cp = match->config.cp;
  l.sp = match->config.sp.value_or(false);
  l.dp = match->dp;
  l.microBatchSize = match->config.mbs;
  l.matches = match->matched == g.numOps();
  if (!l.matches)
    l.findings.push_back(
        describeDifference(c, engine, *match, OpId(match->matched)));
  l.recompute = readRecompute(c, engine, l.findings);
  readZero(c, engine, l);
  if (l.findings.empty())
    if (auto err = crossCheckWhatIf(c, l))
      return llvm::Error(std::move(err));
  return l;
}

} // namespace soap
