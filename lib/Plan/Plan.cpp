// Plans as JSON: building one from a strategy, writing it with stable bytes,
// and reading it back with errors that name the file and the JSON pointer.
#include "soap/Plan/Plan.h"

#include "soap/IR/Fusion.h"
#include "soap/Support/Error.h"
#include <cassert>
#include <cmath>
#include <fmt/format.h>
#include <initializer_list>
#include <limits>

namespace soap {

bool PlanInputs::operator==(const PlanInputs &o) const {
  return modelPath == o.modelPath && modelSha256 == o.modelSha256 &&
         batch == o.batch && unrollRnn == o.unrollRnn &&
         appendLoss == o.appendLoss && topologyPath == o.topologyPath &&
         topologySha256 == o.topologySha256 && searcher == o.searcher &&
         seed == o.seed && budget == o.budget && space == o.space &&
         costModel == o.costModel && optimizer == o.optimizer &&
         precision == o.precision && kernels == o.kernels &&
         interrupted == o.interrupted && timedOut == o.timedOut &&
         proposalsRun == o.proposalsRun;
}

bool PlanFigures::operator==(const PlanFigures &o) const {
  return iterationSeconds == o.iterationSeconds &&
         samplesPerSecond == o.samplesPerSecond &&
         memoryPerDevice == o.memoryPerDevice && peakMemory == o.peakMemory &&
         fits == o.fits && transferBytes == o.transferBytes &&
         collectiveBytes == o.collectiveBytes &&
         speedupOverDataParallel == o.speedupOverDataParallel;
}

bool PlanOp::operator==(const PlanOp &o) const {
  return name == o.name && kind == o.kind && loops == o.loops &&
         replicas == o.replicas && devices == o.devices && stage == o.stage &&
         recompute == o.recompute && zero == o.zero &&
         weightGrad == o.weightGrad;
}

bool Plan::operator==(const Plan &o) const {
  return inputs == o.inputs && numOps == o.numOps &&
         topologyName == o.topologyName && numDevices == o.numDevices &&
         deviceType == o.deviceType && figures == o.figures &&
         microBatches == o.microBatches && schedule == o.schedule &&
         chunks == o.chunks && gradSync == o.gradSync &&
         vocabPadding == o.vocabPadding && ops == o.ops;
}

PlanFigures planFigures(const SimMetrics &m, int64_t batch,
                        Seconds dataParallelSeconds) {
  PlanFigures f;
  f.iterationSeconds = m.iterationTime;
  // A zero-time iteration (an empty graph) would make both ratios infinite,
  // which JSON cannot hold; report 0 samples/s and speedup 1 instead.
  f.samplesPerSecond =
      m.iterationTime > 0 ? static_cast<double>(batch) / m.iterationTime : 0;
  f.speedupOverDataParallel =
      m.iterationTime > 0 ? dataParallelSeconds / m.iterationTime : 1;
  for (const TaskGraph::DeviceMemory &mem : m.memory)
    f.memoryPerDevice.push_back(mem.total());
  f.peakMemory = m.peakMemory;
  f.fits = m.fits;
  f.transferBytes = m.transferBytes;
  f.collectiveBytes = m.collectiveBytes;
  return f;
}

Plan makePlan(const Graph &g, const Topology &topo, const Strategy &s,
              PlanInputs inputs, PlanFigures figures) {
  assert(s.configs.size() == g.numOps() && "strategy does not match graph");
  Plan p;
  p.inputs = std::move(inputs);
  p.numOps = static_cast<int64_t>(g.numOps());
  p.topologyName = topo.name();
  p.numDevices = static_cast<int64_t>(topo.numDevices());
  p.deviceType = topo.deviceSpec().name.str();
  p.figures = std::move(figures);
  p.microBatches = s.pipeline.microBatches;
  p.schedule = s.pipeline.schedule;
  p.chunks = s.pipeline.chunks;
  p.gradSync = s.gradSync;
  p.vocabPadding = s.vocabPadding;
  for (const Op &op : g.ops()) {
    const OpConfig &c = s.configs[op.id];
    assert(c.degree.size() == op.sem.loops.size() && "unverified strategy");
    PlanOp po;
    po.name = op.name;
    po.kind = op.kind;
    for (size_t l = 0; l < c.degree.size(); ++l)
      if (c.degree[l] > 1)
        po.loops[op.sem.loops[l].name] = c.degree[l];
    po.replicas = c.replicas;
    po.devices = c.devices;
    po.stage = s.pipeline.stage(op.id);
    po.recompute = s.recomputes(op.id);
    po.zero = s.zeroStage(op.id);
    po.weightGrad = s.weightGradOrder(op.id);
    p.ops.push_back(std::move(po));
  }
  return p;
}

Json planToJson(const Plan &p) {
  Json j = Json::object();
  j["format"] = "soapc-plan";
  j["version"] = kPlanVersion;
  j["model"] = {{"path", p.inputs.modelPath},
                {"sha256", p.inputs.modelSha256},
                {"batch", p.inputs.batch},
                {"unroll_rnn", p.inputs.unrollRnn},
                {"append_loss", p.inputs.appendLoss},
                {"ops", p.numOps}};
  j["topology"] = {{"path", p.inputs.topologyPath},
                   {"sha256", p.inputs.topologySha256},
                   {"name", p.topologyName},
                   {"devices", p.numDevices},
                   {"device_type", p.deviceType}};
  j["search"] = {
      {"searcher", p.inputs.searcher},    {"seed", p.inputs.seed},
      {"budget", p.inputs.budget},        {"space", p.inputs.space},
      {"cost_model", p.inputs.costModel}, {"optimizer", p.inputs.optimizer},
      {"precision", p.inputs.precision},  {"kernels", p.inputs.kernels}};
  if (p.inputs.interrupted)
    j["search"]["interrupted"] = true;
  if (p.inputs.timedOut) {
    j["search"]["timed_out"] = true;
    j["search"]["proposals"] = p.inputs.proposalsRun;
  }
  const PlanFigures &f = p.figures;
  j["predicted"] = {{"iteration_time_s", f.iterationSeconds},
                    {"samples_per_sec", f.samplesPerSecond},
                    {"memory_per_device_bytes", f.memoryPerDevice},
                    {"peak_memory_bytes", f.peakMemory},
                    {"fits", f.fits},
                    {"transfer_bytes", f.transferBytes},
                    {"collective_bytes", f.collectiveBytes},
                    {"speedup_over_data_parallel",
                     f.speedupOverDataParallel > 0
                         ? Json(f.speedupOverDataParallel)
                         : Json(nullptr)}};
  int32_t stages = 1;
  for (const PlanOp &po : p.ops)
    stages = std::max(stages, po.stage + 1);
  j["pipeline"] = {{"micro_batches", p.microBatches},
                   {"schedule", scheduleName(p.schedule).str()},
                   {"stages", stages}};
  if (p.chunks > 1)
    j["pipeline"]["virtual_stages"] = p.chunks;
  if (p.gradSync != GradSync())
    j["grad_sync"] = {{"overlap_grad_reduce", p.gradSync.overlapGradReduce},
                      {"overlap_param_gather", p.gradSync.overlapParamGather},
                      {"bucket_size", p.gradSync.bucketParams}};
  if (p.gradSync.tpCommOverlap)
    j["grad_sync"]["tp_comm_overlap"] = true;
  if (p.vocabPadding > 0)
    j["vocab_padding"] = p.vocabPadding;
  Json ops = Json::array();
  for (const PlanOp &po : p.ops) {
    Json loops = Json::object();
    for (const auto &[name, degree] : po.loops)
      loops[name] = degree;
    Json jo = {{"op", po.name},
               {"kind", po.kind},
               {"loops", std::move(loops)},
               {"replicas", po.replicas},
               {"devices", po.devices},
               {"stage", po.stage}};
    if (po.recompute)
      jo["recompute"] = true;
    if (po.zero)
      jo["zero"] = po.zero;
    if (po.weightGrad != WeightGradOrder::Next)
      jo["weight_grad"] = weightGradOrderName(po.weightGrad).str();
    ops.push_back(std::move(jo));
  }
  j["ops"] = std::move(ops);
  return j;
}

llvm::Error writePlan(const Plan &p, llvm::StringRef path) {
  const PlanFigures &f = p.figures;
  // nlohmann::json writes NaN and infinities as null, which the reader (and
  // the schema) would reject: refuse to write such a plan at all.
  for (double v :
       {f.iterationSeconds, f.samplesPerSecond, f.speedupOverDataParallel})
    if (!std::isfinite(v))
      return internalError("{}: a predicted figure is not finite ({})",
                           path.str(), v);
  return writeFileAtomic(path, dumpJson(planToJson(p)));
}

namespace {

/// JsonReader plus what a plan needs beyond it: unknown-field checks,
/// booleans, bounded and unsigned integers.
class PlanParser {
public:
  explicit PlanParser(llvm::StringRef file) : r_(file.str()) {}

  llvm::Expected<Plan> parse(const Json &j);

private:
  llvm::Error knownKeys(const Json &obj, llvm::StringRef ptr,
                        std::initializer_list<llvm::StringRef> known) const;
  llvm::Expected<bool> boolean(const Json &obj, llvm::StringRef ptr,
                               llvm::StringRef key) const;
  llvm::Expected<int64_t> integerIn(const Json &v, llvm::StringRef ptr,
                                    int64_t lo, int64_t hi) const;
  llvm::Expected<uint64_t> unsignedInt(const Json &obj, llvm::StringRef ptr,
                                       llvm::StringRef key) const;
  llvm::Expected<std::string> sha256(const Json &obj,
                                     llvm::StringRef ptr) const;
  llvm::Error parseModel(const Json &j, Plan &p) const;
  llvm::Error parseTopology(const Json &j, Plan &p) const;
  llvm::Error parseSearch(const Json &j, Plan &p) const;
  llvm::Error parsePredicted(const Json &j, Plan &p) const;
  llvm::Expected<PlanOp> parseOp(const Json &o, llvm::StringRef ptr) const;

  JsonReader r_;
  int64_t version_ = kPlanVersion;
};

} // namespace

// Unwraps an Expected into `var` or returns its error from the function.
#define SOAP_PLAN_TRY(var, expr)                                               \
  auto var##OrErr = (expr);                                                    \
  if (!var##OrErr)                                                             \
    return var##OrErr.takeError();                                             \
  auto var = std::move(*var##OrErr);

llvm::Error
PlanParser::knownKeys(const Json &obj, llvm::StringRef ptr,
                      std::initializer_list<llvm::StringRef> known) const {
  // Objects iterate in sorted key order: the first unknown key reported is
  // the same on every run.
  for (const auto &item : obj.items()) {
    bool ok = false;
    for (llvm::StringRef k : known)
      ok |= item.key() == k;
    if (!ok)
      return r_.error(jsonPointer(ptr, item.key()), "unknown field");
  }
  return llvm::Error::success();
}

llvm::Expected<bool> PlanParser::boolean(const Json &obj, llvm::StringRef ptr,
                                         llvm::StringRef key) const {
  SOAP_PLAN_TRY(v, r_.field(obj, ptr, key));
  if (!v->is_boolean())
    return r_.error(jsonPointer(ptr, key), "expected a boolean");
  return v->get<bool>();
}

llvm::Expected<int64_t> PlanParser::integerIn(const Json &v,
                                              llvm::StringRef ptr, int64_t lo,
                                              int64_t hi) const {
  if (!v.is_number_integer() ||
      (v.is_number_unsigned() &&
       v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)))
    return r_.error(ptr, "expected an integer");
  int64_t i = v.get<int64_t>();
  if (i < lo || i > hi)
    return r_.error(ptr, fmt::format("must be in [{}, {}], got {}", lo, hi, i));
  return i;
}

llvm::Expected<uint64_t> PlanParser::unsignedInt(const Json &obj,
                                                 llvm::StringRef ptr,
                                                 llvm::StringRef key) const {
  SOAP_PLAN_TRY(v, r_.field(obj, ptr, key));
  // Seeds span all of uint64_t, beyond what JsonReader::integer accepts.
  if (!v->is_number_unsigned())
    return r_.error(jsonPointer(ptr, key), "expected a non-negative integer");
  return v->get<uint64_t>();
}

llvm::Expected<std::string> PlanParser::sha256(const Json &obj,
                                               llvm::StringRef ptr) const {
  SOAP_PLAN_TRY(s, r_.string(obj, ptr, "sha256"));
  // sha256File gives lower-case hex; anything else could never match it.
  bool ok = s.size() == 64;
  for (char c : s)
    ok &= (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
  if (!ok)
    return r_.error(jsonPointer(ptr, "sha256"),
                    "expected 64 lower-case hex digits");
  return s;
}

llvm::Error PlanParser::parseModel(const Json &j, Plan &p) const {
  SOAP_PLAN_TRY(m, r_.object(j, "", "model"));
  if (auto err = knownKeys(
          *m, "/model",
          {"path", "sha256", "batch", "ops", "unroll_rnn", "append_loss"}))
    return err;
  for (auto [key, field] : {std::pair{"unroll_rnn", &p.inputs.unrollRnn},
                            {"append_loss", &p.inputs.appendLoss}}) {
    if (!m->contains(key))
      continue;
    const Json &v = m->at(key);
    if (!v.is_boolean())
      return r_.error(jsonPointer("/model", key), "expected a boolean");
    *field = v.get<bool>();
  }
  SOAP_PLAN_TRY(path, r_.string(*m, "/model", "path"));
  SOAP_PLAN_TRY(sha, sha256(*m, "/model"));
  SOAP_PLAN_TRY(batch, r_.integer(*m, "/model", "batch", 1));
  SOAP_PLAN_TRY(ops, r_.integer(*m, "/model", "ops", 0));
  p.inputs.modelPath = path;
  p.inputs.modelSha256 = sha;
  p.inputs.batch = batch;
  p.numOps = ops;
  return llvm::Error::success();
}

llvm::Error PlanParser::parseTopology(const Json &j, Plan &p) const {
  SOAP_PLAN_TRY(t, r_.object(j, "", "topology"));
  if (auto err =
          knownKeys(*t, "/topology",
                    {"path", "sha256", "name", "devices", "device_type"}))
    return err;
  SOAP_PLAN_TRY(path, r_.string(*t, "/topology", "path"));
  SOAP_PLAN_TRY(sha, sha256(*t, "/topology"));
  SOAP_PLAN_TRY(name, r_.string(*t, "/topology", "name"));
  SOAP_PLAN_TRY(devices, r_.integer(*t, "/topology", "devices", 1));
  SOAP_PLAN_TRY(type, r_.string(*t, "/topology", "device_type"));
  p.inputs.topologyPath = path;
  p.inputs.topologySha256 = sha;
  p.topologyName = name;
  p.numDevices = devices;
  p.deviceType = type;
  return llvm::Error::success();
}

llvm::Error PlanParser::parseSearch(const Json &j, Plan &p) const {
  SOAP_PLAN_TRY(s, r_.object(j, "", "search"));
  if (auto err =
          knownKeys(*s, "/search",
                    {"searcher", "seed", "budget", "space", "cost_model",
                     "optimizer", "precision", "kernels", "interrupted",
                     "timed_out", "proposals"}))
    return err;
  SOAP_PLAN_TRY(searcher, r_.string(*s, "/search", "searcher"));
  SOAP_PLAN_TRY(seed, unsignedInt(*s, "/search", "seed"));
  SOAP_PLAN_TRY(budget, r_.string(*s, "/search", "budget"));
  SOAP_PLAN_TRY(space, r_.string(*s, "/search", "space"));
  SOAP_PLAN_TRY(costModel, r_.string(*s, "/search", "cost_model"));
  SOAP_PLAN_TRY(optimizer, r_.string(*s, "/search", "optimizer"));
  p.inputs.searcher = searcher;
  p.inputs.seed = seed;
  p.inputs.budget = budget;
  p.inputs.space = space;
  p.inputs.costModel = costModel;
  p.inputs.optimizer = optimizer;
  if (version_ >= 2) {
    SOAP_PLAN_TRY(precision, r_.string(*s, "/search", "precision"));
    if (!parsePrecision(precision))
      return r_.error("/search/precision",
                      fmt::format("expected \"fp32\", \"bf16\" or "
                                  "\"fp8\", got \"{}\"",
                                  precision));
    p.inputs.precision = precision;
  }
  if (s->contains("kernels")) {
    SOAP_PLAN_TRY(kernels, r_.string(*s, "/search", "kernels"));
    if (!parseKernelMode(kernels))
      return r_.error("/search/kernels",
                      fmt::format("expected \"fused\", \"no-flash\" or "
                                  "\"eager\", got "
                                  "\"{}\"",
                                  kernels));
    p.inputs.kernels = kernels;
  }
  if (s->contains("interrupted")) {
    SOAP_PLAN_TRY(interrupted, boolean(*s, "/search", "interrupted"));
    p.inputs.interrupted = interrupted;
  }
  if (s->contains("timed_out")) {
    SOAP_PLAN_TRY(timedOut, boolean(*s, "/search", "timed_out"));
    p.inputs.timedOut = timedOut;
  }
  if (s->contains("proposals")) {
    SOAP_PLAN_TRY(proposals, unsignedInt(*s, "/search", "proposals"));
    p.inputs.proposalsRun = proposals;
  }
  return llvm::Error::success();
}

llvm::Error PlanParser::parsePredicted(const Json &j, Plan &p) const {
  const char *ptr = "/predicted";
  SOAP_PLAN_TRY(f, r_.object(j, "", "predicted"));
  if (auto err = knownKeys(*f, ptr,
                           {"iteration_time_s", "samples_per_sec",
                            "memory_per_device_bytes", "peak_memory_bytes",
                            "fits", "transfer_bytes", "collective_bytes",
                            "speedup_over_data_parallel"}))
    return err;
  PlanFigures &out = p.figures;
  SOAP_PLAN_TRY(time, r_.number(*f, ptr, "iteration_time_s", 0));
  SOAP_PLAN_TRY(rate, r_.number(*f, ptr, "samples_per_sec", 0));
  SOAP_PLAN_TRY(mem, r_.array(*f, ptr, "memory_per_device_bytes"));
  std::string memPtr = jsonPointer(ptr, "memory_per_device_bytes");
  out.memoryPerDevice.clear();
  for (size_t d = 0; d < mem->size(); ++d) {
    SOAP_PLAN_TRY(b,
                  integerIn((*mem)[d], jsonPointer(memPtr, d), 0, INT64_MAX));
    out.memoryPerDevice.push_back(b);
  }
  if (static_cast<int64_t>(out.memoryPerDevice.size()) != p.numDevices)
    return r_.error(memPtr,
                    fmt::format("{} entries for {} devices "
                                "(/topology/devices)",
                                out.memoryPerDevice.size(), p.numDevices));
  SOAP_PLAN_TRY(peak, r_.integer(*f, ptr, "peak_memory_bytes", 0));
  SOAP_PLAN_TRY(fits, boolean(*f, ptr, "fits"));
  SOAP_PLAN_TRY(transfer, r_.integer(*f, ptr, "transfer_bytes", 0));
  SOAP_PLAN_TRY(collective, r_.integer(*f, ptr, "collective_bytes", 0));
  // null: data parallelism does not fit (read as 0).
  double speedup = 0;
  if (!f->contains("speedup_over_data_parallel") ||
      !(*f)["speedup_over_data_parallel"].is_null()) {
    SOAP_PLAN_TRY(sp, r_.number(*f, ptr, "speedup_over_data_parallel", 0));
    speedup = sp;
  }
  out.iterationSeconds = time;
  out.samplesPerSecond = rate;
  out.peakMemory = peak;
  out.fits = fits;
  out.transferBytes = transfer;
  out.collectiveBytes = collective;
  out.speedupOverDataParallel = speedup;
  return llvm::Error::success();
}

llvm::Expected<PlanOp> PlanParser::parseOp(const Json &o,
                                           llvm::StringRef ptr) const {
  if (!o.is_object())
    return r_.error(ptr, "expected an object");
  if (auto err = knownKeys(o, ptr,
                           {"op", "kind", "loops", "replicas", "devices",
                            "stage", "recompute", "zero", "weight_grad"}))
    return err;
  PlanOp po;
  SOAP_PLAN_TRY(name, r_.string(o, ptr, "op"));
  if (name.empty())
    return r_.error(jsonPointer(ptr, "op"), "empty op name");
  SOAP_PLAN_TRY(kind, r_.string(o, ptr, "kind"));
  po.name = name;
  po.kind = kind;
  SOAP_PLAN_TRY(loops, r_.object(o, ptr, "loops"));
  std::string loopsPtr = jsonPointer(ptr, "loops");
  for (const auto &item : loops->items()) {
    SOAP_PLAN_TRY(degree,
                  integerIn(item.value(), jsonPointer(loopsPtr, item.key()), 1,
                            std::numeric_limits<int32_t>::max()));
    po.loops[item.key()] = static_cast<int32_t>(degree);
  }
  SOAP_PLAN_TRY(replicas, r_.field(o, ptr, "replicas"));
  SOAP_PLAN_TRY(rep, integerIn(*replicas, jsonPointer(ptr, "replicas"), 1,
                               std::numeric_limits<int32_t>::max()));
  po.replicas = static_cast<int32_t>(rep);
  if (version_ >= 2) {
    SOAP_PLAN_TRY(stage, r_.integer(o, ptr, "stage", 0));
    if (stage > std::numeric_limits<int32_t>::max())
      return r_.error(jsonPointer(ptr, "stage"), "stage out of range");
    po.stage = static_cast<int32_t>(stage);
    if (o.contains("recompute")) {
      SOAP_PLAN_TRY(rc, boolean(o, ptr, "recompute"));
      po.recompute = rc;
    }
    if (o.contains("zero")) {
      SOAP_PLAN_TRY(z, integerIn(o.at("zero"), jsonPointer(ptr, "zero"), 0, 3));
      po.zero = static_cast<int32_t>(z);
    }
    if (o.contains("weight_grad")) {
      SOAP_PLAN_TRY(wg, r_.string(o, ptr, "weight_grad"));
      auto order = parseWeightGradOrder(wg);
      if (!order)
        return r_.error(jsonPointer(ptr, "weight_grad"),
                        fmt::format("unknown weight-gradient order '{}' "
                                    "(next, last, now)",
                                    wg));
      po.weightGrad = *order;
    }
  }
  SOAP_PLAN_TRY(devices, r_.array(o, ptr, "devices"));
  std::string devPtr = jsonPointer(ptr, "devices");
  if (devices->empty())
    return r_.error(devPtr, "no devices");
  for (size_t k = 0; k < devices->size(); ++k) {
    SOAP_PLAN_TRY(d, integerIn((*devices)[k], jsonPointer(devPtr, k), 0,
                               std::numeric_limits<DeviceId>::max()));
    po.devices.push_back(static_cast<DeviceId>(d));
  }
  return po;
}

llvm::Expected<Plan> PlanParser::parse(const Json &j) {
  if (!j.is_object())
    return r_.error("", "expected an object");
  if (auto err = knownKeys(j, "",
                           {"$schema", "format", "version", "model", "topology",
                            "search", "predicted", "pipeline", "grad_sync",
                            "vocab_padding", "ops"}))
    return err;
  SOAP_PLAN_TRY(format, r_.string(j, "", "format"));
  if (format != "soapc-plan")
    return r_.error("/format",
                    fmt::format("expected \"soapc-plan\", got \"{}\"", format));
  SOAP_PLAN_TRY(version, r_.integer(j, "", "version"));
  if (version < 1 || version > kPlanVersion)
    return r_.error("/version",
                    fmt::format("unsupported plan version {} (this soapc "
                                "reads versions 1 to {})",
                                version, kPlanVersion));
  version_ = version;
  Plan p;
  // Version 1 plans had no pipeline: one stage, one micro-batch.
  if (version >= 2) {
    SOAP_PLAN_TRY(pipe, r_.object(j, "", "pipeline"));
    if (auto err = knownKeys(
            *pipe, "/pipeline",
            {"micro_batches", "schedule", "stages", "virtual_stages"}))
      return err;
    SOAP_PLAN_TRY(m, r_.integer(*pipe, "/pipeline", "micro_batches", 1));
    if (m > std::numeric_limits<int32_t>::max())
      return r_.error("/pipeline/micro_batches", "out of range");
    p.microBatches = static_cast<int32_t>(m);
    SOAP_PLAN_TRY(sched, r_.string(*pipe, "/pipeline", "schedule"));
    auto sc = parseSchedule(sched);
    if (!sc || (version < 3 && *sc == PipelineSchedule::ZbH1))
      return r_.error("/pipeline/schedule",
                      fmt::format("unknown schedule \"{}\"; expected "
                                  "\"1f1b\", \"gpipe\"{}",
                                  sched,
                                  version < 3 ? " (zb-h1 from version 3)"
                                              : " or \"zb-h1\""));
    p.schedule = *sc;
    if (pipe->contains("virtual_stages")) {
      if (version < 3)
        return r_.error("/pipeline/virtual_stages",
                        "a version 2 plan has no virtual stages");
      SOAP_PLAN_TRY(v,
                    r_.integer(*pipe, "/pipeline", "virtual_stages", 2));
      if (v > std::numeric_limits<int32_t>::max())
        return r_.error("/pipeline/virtual_stages", "out of range");
      p.chunks = static_cast<int32_t>(v);
    }
  } else if (j.contains("pipeline")) {
    return r_.error("/pipeline", "a version 1 plan has no pipeline");
  }
  if (j.contains("grad_sync")) {
    SOAP_PLAN_TRY(gs, r_.object(j, "", "grad_sync"));
    if (auto err = knownKeys(*gs, "/grad_sync",
                             {"overlap_grad_reduce", "overlap_param_gather",
                              "bucket_size", "tp_comm_overlap"}))
      return err;
    for (auto [k, field] :
         {std::pair{"overlap_grad_reduce", &p.gradSync.overlapGradReduce},
          {"overlap_param_gather", &p.gradSync.overlapParamGather},
          {"tp_comm_overlap", &p.gradSync.tpCommOverlap}}) {
      if (!gs->contains(k))
        continue;
      SOAP_PLAN_TRY(v, boolean(*gs, "/grad_sync", k));
      *field = v;
    }
    if (gs->contains("bucket_size")) {
      SOAP_PLAN_TRY(b, r_.integer(*gs, "/grad_sync", "bucket_size", 0));
      p.gradSync.bucketParams = b;
    }
  }
  if (j.contains("vocab_padding")) {
    SOAP_PLAN_TRY(v, r_.integer(j, "", "vocab_padding", 1));
    if (v > (int64_t(1) << 20))
      return r_.error("/vocab_padding", "out of range");
    p.vocabPadding = static_cast<int32_t>(v);
  }
  if (auto err = parseModel(j, p))
    return err;
  if (auto err = parseTopology(j, p))
    return err;
  if (auto err = parseSearch(j, p))
    return err;
  if (auto err = parsePredicted(j, p))
    return err;
  SOAP_PLAN_TRY(ops, r_.array(j, "", "ops"));
  std::map<std::string, size_t> firstAt;
  for (size_t i = 0; i < ops->size(); ++i) {
    std::string ptr = jsonPointer("/ops", i);
    SOAP_PLAN_TRY(po, parseOp((*ops)[i], ptr));
    auto [it, fresh] = firstAt.emplace(po.name, i);
    if (!fresh)
      return r_.error(jsonPointer(ptr, "op"),
                      fmt::format("op '{}' appears twice (first at /ops/{})",
                                  po.name, it->second));
    p.ops.push_back(std::move(po));
  }
  if (static_cast<int64_t>(p.ops.size()) != p.numOps)
    return r_.error("/ops", fmt::format("{} ops listed, /model/ops says {}",
                                        p.ops.size(), p.numOps));
  if (version >= 2) {
    int64_t stages = 1;
    for (const PlanOp &po : p.ops)
      stages = std::max<int64_t>(stages, po.stage + 1);
    SOAP_PLAN_TRY(declared,
                  r_.integer(j["pipeline"], "/pipeline", "stages", 1));
    if (declared != stages)
      return r_.error(
          "/pipeline/stages",
          fmt::format("{} stages declared, the ops use {}", declared, stages));
    if (stages % p.chunks != 0)
      return r_.error("/pipeline/virtual_stages",
                      fmt::format("{} stages do not divide into {} virtual "
                                  "stages per device group",
                                  stages, p.chunks));
  }
  return p;
}

#undef SOAP_PLAN_TRY

llvm::Expected<Plan> planFromJson(const Json &j, llvm::StringRef file) {
  return PlanParser(file).parse(j);
}

llvm::Expected<Plan> readPlan(llvm::StringRef path) {
  auto j = readJsonFile(path);
  if (!j)
    return j.takeError();
  return planFromJson(*j, path);
}

} // namespace soap
