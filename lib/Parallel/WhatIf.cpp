// What-if strategies (include/soap/Parallel/WhatIf.h): Megatron-LM's and
// FSDP's settings parsed and built into a Strategy with the same code the
// megatron baseline uses.
#include "soap/Parallel/WhatIf.h"

#include "soap/Parallel/ContextParallel.h"
#include "soap/Parallel/Megatron.h"
#include "soap/Support/Error.h"
#include "llvm/ADT/SmallVector.h"
#include <algorithm>
#include <fmt/format.h>

namespace soap {

llvm::StringRef recomputeModeName(RecomputeMode r) {
  switch (r) {
  case RecomputeMode::None:
    return "none";
  case RecomputeMode::Selective:
    return "selective";
  case RecomputeMode::Full:
    return "full";
  }
  return "?";
}

std::string MegatronConfig::str() const {
  std::string s = fmt::format("tp={},pp={},vp={},cp={},mbs={},{}"
                              "recompute={},distopt={}",
                              tp, pp, vp, cp, mbs,
                              sp ? fmt::format("sp={},", int(*sp)) : "",
                              recomputeModeName(recompute).str(), int(distopt));
  if (schedule != PipelineSchedule::OneFOneB)
    s += fmt::format(",schedule={}", scheduleName(schedule).str());
  if (!overlapGradReduce)
    s += ",overlap_grad_reduce=0";
  if (overlapParamGather)
    s += fmt::format(",overlap_param_gather={}", int(*overlapParamGather));
  if (bucketSize > 0)
    s += fmt::format(",bucket_size={}", bucketSize);
  if (tpCommOverlap)
    s += fmt::format(",tp_comm_overlap={}", int(*tpCommOverlap));
  return s;
}

GradSync MegatronConfig::gradSync() const {
  GradSync g;
  g.overlapGradReduce = overlapGradReduce;
  g.overlapParamGather =
      overlapParamGather.value_or(distopt && overlapGradReduce);
  g.bucketParams = bucketSize;
  g.tpCommOverlap = tpCommOverlap.value_or(sp.value_or(false));
  return g;
}

bool MegatronConfig::sequenceParallel(const Graph &g) const {
  if (sp)
    return *sp;
  return tp > 1 && hasSequence(g);
}

MegatronConfig MegatronConfig::resolved(const Graph &g) const {
  MegatronConfig c = *this;
  c.sp = sequenceParallel(g);
  return c;
}

namespace {

/// Calls `set(key, value)` for each "key=value" of a comma-separated list;
/// errors name the what-if and the key.
llvm::Error forEachKey(
    llvm::StringRef what, llvm::StringRef keys,
    const std::function<llvm::Error(llvm::StringRef, llvm::StringRef)> &set) {
  llvm::SmallVector<llvm::StringRef, 8> items;
  keys.split(items, ',', -1, false);
  std::vector<std::string> seen;
  for (llvm::StringRef item : items) {
    auto [key, value] = item.trim().split('=');
    if (value.empty() || key.empty())
      return inputError("--strategy {}: '{}' is not key=value", what, item);
    if (std::find(seen.begin(), seen.end(), key.str()) != seen.end())
      return inputError("--strategy {}: key '{}' is given twice", what, key);
    seen.push_back(key.str());
    if (auto err = set(key, value))
      return err;
  }
  return llvm::Error::success();
}

llvm::Expected<int64_t> positive(llvm::StringRef what, llvm::StringRef key,
                                 llvm::StringRef value) {
  int64_t v = 0;
  if (value.getAsInteger(10, v) || v < 1)
    return inputError("--strategy {}: {}={} is not a positive integer", what,
                      key, value);
  return v;
}

llvm::Expected<bool> flag(llvm::StringRef what, llvm::StringRef key,
                          llvm::StringRef value) {
  if (value == "0" || value == "1")
    return value == "1";
  return inputError("--strategy {}: {}={} must be 0 or 1", what, key, value);
}

/// The `recompute` key, shared by every what-if.
llvm::Error setRecompute(llvm::StringRef what, llvm::StringRef value,
                         RecomputeMode &out) {
  if (value == "none")
    out = RecomputeMode::None;
  else if (value == "selective")
    out = RecomputeMode::Selective;
  else if (value == "full")
    out = RecomputeMode::Full;
  else
    return inputError("--strategy {}: recompute={} must be none, selective or "
                      "full",
                      what, value);
  return llvm::Error::success();
}

/// The keys every what-if takes (WhatIfCommon): sets one and returns
/// true, or returns false for another key.
llvm::Expected<bool> setCommonKey(llvm::StringRef what, llvm::StringRef key,
                                  llvm::StringRef value, WhatIfCommon &c) {
  if (key == "recompute") {
    if (auto err = setRecompute(what, value, c.recompute))
      return llvm::Error(std::move(err));
    return true;
  }
  if (key == "overlap_grad_reduce" || key == "overlap_param_gather") {
    auto f = flag(what, key, value);
    if (!f)
      return f.takeError();
    if (key == "overlap_grad_reduce")
      c.overlapGradReduce = *f;
    else
      c.overlapParamGather = *f;
    return true;
  }
  if (key != "bucket_size")
    return false;
  auto v = positive(what, key, value);
  if (!v)
    return v.takeError();
  c.bucketSize = *v;
  return true;
}

/// Heads of an attention op: FlashAttention's "h" loop, or an eager
/// [batch, heads, q, k] softmax's second loop. 0 when it has none.
int64_t headsOf(const Op &op) {
  for (const LoopDim &l : op.sem.loops)
    if (l.name == "h")
      return l.size;
  if ((op.kind == "Softmax" || op.kind == "FusedSoftmax") &&
      op.sem.loops.size() == 4)
    return op.sem.loops[1].size;
  return 0;
}

/// The global batch: the sample loop of the first op that has one.
int64_t globalBatch(const Graph &g) {
  for (const Op &op : g.ops()) {
    int l = sampleLoop(op.sem);
    if (l >= 0)
      return op.sem.loops[size_t(l)].size;
  }
  return 0;
}

} // namespace

std::vector<uint8_t> megatronSelectiveRecompute(const Graph &g) {
  bool fused = std::any_of(g.ops().begin(), g.ops().end(), [](const Op &op) {
    return op.kind == "FlashAttention";
  });
  if (!fused)
    return recomputePolicy(g, false);
  std::vector<uint8_t> r(g.numOps(), 0);
  for (const Op &op : g.ops())
    r[size_t(op.id)] = op.kind == "FlashAttention";
  return r;
}

namespace {

void applyMemoryChoices(const Graph &g, Strategy &s, int zero,
                        RecomputeMode recompute) {
  s.zero.clear();
  if (zero > 0)
    s.zero = zeroPolicy(g, s, zero);
  dropIdleZero(g, s);
  s.recompute.clear();
  if (recompute == RecomputeMode::Selective)
    s.recompute = megatronSelectiveRecompute(g);
  else if (recompute == RecomputeMode::Full)
    s.recompute = recomputePolicy(g, true);
}

} // namespace

llvm::Expected<MegatronConfig> parseMegatronConfig(llvm::StringRef keys) {
  MegatronConfig c;
  const char *what = "megatron";
  auto err = forEachKey(
      what, keys, [&](llvm::StringRef key, llvm::StringRef value) -> llvm::Error {
        if (key == "sp" || key == "distopt") {
          auto f = flag(what, key, value);
          if (!f)
            return f.takeError();
          if (key == "sp")
            c.sp = *f;
          else
            c.distopt = *f;
          return llvm::Error::success();
        }
        if (key == "tp_comm_overlap") {
          auto f = flag(what, key, value);
          if (!f)
            return f.takeError();
          c.tpCommOverlap = *f;
          return llvm::Error::success();
        }
        auto common = setCommonKey(what, key, value, c);
        if (!common)
          return common.takeError();
        if (*common)
          return llvm::Error::success();
        if (key == "schedule") {
          auto sc = parseSchedule(value);
          if (!sc)
            return inputError("--strategy megatron: schedule={} must be "
                              "1f1b, zb-h1 or gpipe",
                              value);
          c.schedule = *sc;
          return llvm::Error::success();
        }
        auto v = positive(what, key, value);
        if (!v)
          return v.takeError();
        if (key == "tp" || key == "pp" || key == "vp" || key == "cp") {
          if (*v > (int64_t(1) << 20))
            return inputError("--strategy megatron: {}={} is too large", key,
                              value);
          int32_t n = int32_t(*v);
          (key == "tp" ? c.tp : key == "pp" ? c.pp : key == "vp" ? c.vp : c.cp) =
              n;
        } else if (key == "mbs") {
          c.mbs = *v;
        } else {
          return inputError("--strategy megatron: unknown key '{}' (keys: tp, "
                            "pp, vp, cp, mbs, sp, recompute, distopt, "
                            "schedule, tp_comm_overlap, overlap_grad_reduce, "
                            "overlap_param_gather, bucket_size)",
                            key);
        }
        return llvm::Error::success();
      });
  if (err)
    return llvm::Error(std::move(err));
  return c;
}

llvm::Expected<FsdpConfig> parseFsdpConfig(llvm::StringRef keys) {
  FsdpConfig c;
  const char *what = "fsdp";
  auto err = forEachKey(
      what, keys, [&](llvm::StringRef key, llvm::StringRef value) -> llvm::Error {
        auto common = setCommonKey(what, key, value, c);
        if (!common)
          return common.takeError();
        if (*common)
          return llvm::Error::success();
        auto v = positive(what, key, value);
        if (!v)
          return v.takeError();
        if (key == "zero") {
          if (*v > 3)
            return inputError("--strategy fsdp: zero={} must be 1, 2 or 3",
                              value);
          c.zero = int(*v);
        } else if (key == "mbs") {
          c.mbs = *v;
        } else {
          return inputError("--strategy fsdp: unknown key '{}' (keys: zero, "
                            "mbs, recompute, overlap_grad_reduce, "
                            "overlap_param_gather, bucket_size)",
                            key);
        }
        return llvm::Error::success();
      });
  if (err)
    return llvm::Error(std::move(err));
  return c;
}

llvm::Expected<Strategy> megatronConfigStrategy(const Graph &g,
                                                const Topology &topo,
                                                const MegatronConfig &given) {
  const MegatronConfig c = given.resolved(g);
  const bool sp = *c.sp;
  if (c.vp > 1 && c.pp < 2)
    return inputError("--strategy megatron: vp={} interleaves the stages of "
                      "a pipeline; it needs pp > 1",
                      c.vp);
  if (c.vp > 1 && c.schedule != PipelineSchedule::OneFOneB)
    return inputError("--strategy megatron: vp={} runs the interleaved 1F1B "
                      "schedule, not schedule={}",
                      c.vp, scheduleName(c.schedule));
  if (sp && c.tp < 2)
    return inputError("--strategy megatron: sp=1 (sequence parallelism) "
                      "needs tp > 1: it splits the tensor-parallel group's "
                      "replicated ops along the sequence");
  // Megatron-LM's check of --tp-comm-overlap (Transformer Engine's
  // userbuffers overlap the sequence-parallel collectives).
  if (c.tpCommOverlap.value_or(false) && !sp)
    return inputError("--strategy megatron: tp_comm_overlap=1 needs sequence "
                      "parallelism (sp=1)");
  // Megatron-LM's own checks of --overlap-param-gather.
  if (c.overlapParamGather.value_or(false) && !c.distopt)
    return inputError("--strategy megatron: overlap_param_gather=1 needs the "
                      "distributed optimizer (distopt=1)");
  if (c.overlapParamGather.value_or(false) && !c.overlapGradReduce)
    return inputError("--strategy megatron: overlap_param_gather=1 needs "
                      "overlap_grad_reduce=1");
  if (c.cp > 1) {
    // Megatron's load-balanced causal layout cuts the sequence in 2 x cp
    // chunks.
    int64_t seq = attentionSequence(g);
    int64_t chunks = hasCausalAttention(g) ? 2 * int64_t(c.cp) : c.cp;
    if (seq <= 0 || seq % chunks != 0)
      return inputError("--strategy megatron: cp={} needs the sequence ({}) "
                        "to divide into {} chunks{}",
                        c.cp, seq, chunks,
                        chunks > c.cp ? " (the causal load-balanced layout)"
                                      : "");
  }
  int64_t devices = int64_t(topo.numDevices());
  int64_t group = int64_t(c.tp) * c.pp * c.cp;
  if (devices % group != 0)
    return inputError("--strategy megatron: tp={} x pp={} x cp={} = {} does "
                      "not divide the {} devices",
                      c.tp, c.pp, c.cp, group, devices);
  int64_t dp = devices / group;
  int64_t perNode = int64_t(topo.devicesPerNode());
  if (perNode % c.tp != 0)
    return inputError("--strategy megatron: tp={} does not divide the {} "
                      "devices of a node",
                      c.tp, perNode);
  std::vector<OpId> starts = transformerLayerStarts(g);
  int64_t layers = int64_t(starts.size());
  if (layers > 0 && c.pp > layers)
    return inputError("--strategy megatron: pp={} is more than the model's "
                      "{} layers",
                      c.pp, layers);
  if (layers > 0 && layers % c.pp != 0)
    return inputError("--strategy megatron: pp={} does not divide the "
                      "model's {} layers",
                      c.pp, layers);
  if (c.vp > 1 && (layers == 0 || layers % (int64_t(c.pp) * c.vp) != 0))
    return inputError("--strategy megatron: pp={} x vp={} does not divide "
                      "the model's {} transformer layers",
                      c.pp, c.vp, layers);
  if (layers == 0 && size_t(c.pp) > g.numOps())
    return inputError("--strategy megatron: pp={} is more than the model's "
                      "{} ops",
                      c.pp, g.numOps());
  for (const Op &op : g.ops())
    if (isAttentionOp(op)) {
      int64_t heads = headsOf(op);
      if (heads > 0 && heads % c.tp != 0)
        return inputError("--strategy megatron: tp={} does not divide the "
                          "{} {}heads of {}",
                          c.tp, heads, op.hasAttr("kv_heads") ? "kv " : "",
                          g.where(op.id));
    }
  if (sp) {
    if (!hasSequence(g))
      return inputError("--strategy megatron: sp=1 (sequence parallelism) "
                        "needs a sequence, and {} has no attention to find "
                        "it by",
                        g.sourcePath);
  }
  int64_t batch = globalBatch(g);
  if (batch <= 0 || batch % (dp * c.mbs) != 0)
    return inputError("--strategy megatron: the batch of {} does not split "
                      "into dp={} x mbs={}",
                      batch, dp, c.mbs);
  int64_t m = batch / (dp * c.mbs);
  if (m > (int64_t(1) << 20))
    return inputError("--strategy megatron: {} micro-batches are too many",
                      m);

  if (c.vp > 1 && m % c.pp != 0)
    return inputError("--strategy megatron: the interleaved schedule needs "
                      "the {} micro-batches (batch {} / (dp={} x mbs={})) to "
                      "be a multiple of pp={}",
                      m, batch, dp, c.mbs, c.pp);

  Strategy s;
  s.pipeline.microBatches = int32_t(m);
  s.pipeline.schedule = c.schedule;
  s.pipeline.chunks = c.vp;
  if (c.pp > 1)
    s.pipeline.stageOf = layerStages(g, c.pp * c.vp);
  s.vocabPadding = megatronVocabPadding(g);
  bool padVocab = s.vocabPadding > 0;
  if (c.cp > 1) {
    auto cfg = contextParallelConfigs(
        g, megatronGroupConfigs(g, c.tp, dp, sp, padVocab), c.tp,
        c.cp, int32_t(m), sp);
    if (!cfg)
      return cfg.takeError();
    s.configs = std::move(*cfg);
    for (const Op &op : g.ops())
      for (DeviceId &dev : s.configs[size_t(op.id)].devices)
        dev += DeviceId(s.pipeline.group(s.pipeline.stage(op.id)) * dp *
                        c.tp * c.cp);
  } else {
    s.configs = megatronStagedConfigs(g, s.pipeline, c.tp, dp, sp, padVocab);
  }
  applyMemoryChoices(g, s, c.distopt ? 1 : 0, c.recompute);
  s.gradSync = c.gradSync();
  if (auto err = verifyStrategy(s, g, topo))
    return llvm::Error(std::move(err));
  return s;
}

bool isWhatIf(llvm::StringRef spec) {
  return spec.startswith("megatron:") || spec.startswith("fsdp:");
}

llvm::Expected<Strategy> whatIfStrategy(llvm::StringRef spec, const Graph &g,
                                        const Topology &topo) {
  auto [kind, keys] = spec.split(':');
  if (kind == "megatron") {
    auto c = parseMegatronConfig(keys);
    if (!c)
      return c.takeError();
    return megatronConfigStrategy(g, topo, *c);
  }
  if (kind != "fsdp")
    return inputError("--strategy: unknown what-if '{}' (megatron:... or "
                      "fsdp:...)",
                      kind);
  auto c = parseFsdpConfig(keys);
  if (!c)
    return c.takeError();
  if (c->overlapParamGather && c->zero == 3)
    return inputError("--strategy fsdp: overlap_param_gather is for zero=1|2 "
                      "(zero=3 gathers the weights before every use, "
                      "prefetched)");
  int64_t devices = int64_t(topo.numDevices());
  int64_t batch = globalBatch(g);
  if (batch <= 0 || batch % devices != 0)
    return inputError("--strategy fsdp: the batch of {} does not split over "
                      "{} devices",
                      batch, devices);
  int64_t mbs = c->mbs > 0 ? c->mbs : batch / devices;
  if (batch % (devices * mbs) != 0)
    return inputError("--strategy fsdp: the batch of {} does not split into "
                      "{} devices x mbs={}",
                      batch, devices, mbs);
  Strategy s;
  s.configs = megatronGroupConfigs(g, 1, devices);
  s.pipeline.microBatches = int32_t(batch / (devices * mbs));
  applyMemoryChoices(g, s, c->zero, c->recompute);
  s.gradSync.overlapGradReduce = c->overlapGradReduce;
  s.gradSync.overlapParamGather = c->overlapParamGather.value_or(true);
  s.gradSync.bucketParams = c->bucketSize;
  if (auto err = verifyStrategy(s, g, topo))
    return llvm::Error(std::move(err));
  return s;
}

} // namespace soap
