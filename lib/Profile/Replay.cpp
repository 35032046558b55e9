// Compute replay (see Replay.h).
#include "Replay.h"

#include "soap/Cost/CostModel.h"
#include "soap/Cost/OpSignature.h"
#include "soap/Import/OnnxImporter.h"
#include "soap/Machine/Collectives.h"
#include "soap/Machine/TopologyLoader.h"
#include "soap/Plan/Plan.h"
#include "soap/Sim/Simulator.h"
#include "soap/Support/Error.h"
#include "soap/Support/Format.h"
#include "soap/Support/Statistics.h"
#include <algorithm>
#include <cmath>

namespace soap {

llvm::Expected<ReplayPlan> loadReplayPlan(const std::string &planPath,
                                          const std::string &topologyOverride,
                                          const CostDatabase *db) {
  auto plan = readPlan(planPath);
  if (!plan)
    return plan.takeError();
  ReplayPlan rp;
  rp.path = planPath;
  rp.model = plan->inputs.modelPath;
  rp.topology =
      topologyOverride.empty() ? plan->inputs.topologyPath : topologyOverride;
  rp.batch = plan->inputs.batch;
  auto topo = loadTopology(rp.topology);
  if (!topo)
    return topo.takeError();
  rp.topo = std::make_unique<Topology>(std::move(*topo));
  rp.devices = rp.topo->numDevices();
  if (db && db->env.device != rp.topo->deviceSpec().name)
    return inputError("{}: the profile is of '{}', the plan's devices are "
                      "'{}'",
                      planPath, db->env.device,
                      rp.topo->deviceSpec().name.str());
  if (plan->inputs.precision == "fp8")
    return inputError("{}: /search/precision: fp8: soap-profile has no FP8 "
                      "kernels to replay (it measures fp32 and bf16 tiles)",
                      planPath);
  // Imported as the plan was searched: unrolled, at its element type (bf16
  // tiles are other kernels; readPlan checked the name).
  ImportOptions io;
  io.batch = plan->inputs.batch;
  io.appendLoss = plan->inputs.appendLoss;
  io.unrollRnn = plan->inputs.unrollRnn;
  io.precision = parsePrecision(plan->inputs.precision).value_or(Precision::FP32);
  io.kernels = parseKernelMode(plan->inputs.kernels).value_or(KernelMode::Eager);
  auto g = importOnnx(rp.model, io);
  if (!g)
    return g.takeError();
  rp.graph = std::move(*g);
  std::optional<Optimizer> optimizer = parseOptimizer(plan->inputs.optimizer);
  if (!optimizer)
    return inputError("{}: /search/optimizer: expected sgd, momentum or "
                      "adam, got \"{}\"",
                      planPath, plan->inputs.optimizer);
  auto strategy = planStrategy(*plan, *rp.graph, *rp.topo, planPath);
  if (!strategy)
    return strategy.takeError();
  const DeviceSpec &spec = rp.topo->deviceSpec();
  CostModel profiled(spec, db, CostMode::Profile);
  CostModel analytic(spec, nullptr, CostMode::Analytic);
  CollectiveModel coll(*rp.topo, db ? &db->collectives : nullptr);
  SimContext ctx{*rp.graph, *rp.topo, profiled, coll, *optimizer};
  auto tg = TaskGraph::build(ctx, *strategy);
  if (!tg)
    return tg.takeError();
  Simulator sim(*tg);
  sim.simulateFull();
  struct Ordered {
    uint32_t device;
    Seconds start;
    uint32_t seq;
    ReplayTask task;
  };
  // The replay runs an op's backward-data and backward-weight kernels
  // back to back, as one backward: a weight-gradient task's time joins its
  // backward task's (the same op, tile, micro-batch and replica; one
  // weight-gradient task per weight).
  std::map<std::tuple<OpId, int64_t, uint64_t>, Seconds> weightGrad;
  for (const Task &t : sim.graph().tasks())
    if (t.alive && t.kind == TaskKind::WeightGrad)
      weightGrad[{t.op, t.tile, t.key.c}] += t.exe;
  std::vector<Ordered> all;
  for (const Task &t : sim.graph().tasks()) {
    if (!t.alive ||
        (t.kind != TaskKind::Forward && t.kind != TaskKind::Backward))
      continue;
    const Op &op = rp.graph->op(t.op);
    const OpConfig &c = strategy->configs[t.op];
    ReplayTask rt;
    rt.backward = t.kind == TaskKind::Backward;
    rt.op = t.op;
    rt.tile = t.tile;
    // A micro-batch's tile (what the simulator priced), not the batch's.
    rt.box = microBatchTile(c, op.sem, t.tile, t.microBatch,
                            strategy->pipeline.microBatches);
    rt.device = t.resources.empty() ? 0 : t.resources[0];
    rt.replica = static_cast<int32_t>(t.key.c);
    rt.signature = opSignature(*rp.graph, op, rt.box);
    rt.predicted = t.exe;
    if (rt.backward) {
      auto w = weightGrad.find({t.op, t.tile, t.key.c});
      if (w != weightGrad.end())
        rt.predicted += w->second;
    }
    rt.predictedKernels = rt.predicted;
    KernelTimes a = analytic.analytic(*rp.graph, op, rt.box);
    const KernelEntry *e = db ? db->find(rt.signature) : nullptr;
    bool data = runsBackwardData(op, e ? e->backwardWeight : a.backwardWeight);
    if (!rt.backward)
      rt.passes = {Pass::Forward};
    else if (data)
      rt.passes = {Pass::BackwardData, Pass::BackwardWeight};
    else if (!op.sem.weightInputs.empty())
      rt.passes = {Pass::BackwardWeight};
    if (e)
      rt.predictedKernels = !rt.backward ? e->forward
                            : data       ? e->backwardData + e->backwardWeight
                                         : e->backwardWeight;
    rt.analytic = rt.backward ? a.backward() : a.forward;
    all.push_back({rt.device, t.start, t.seq, std::move(rt)});
  }
  std::sort(all.begin(), all.end(), [](const Ordered &a, const Ordered &b) {
    if (a.device != b.device)
      return a.device < b.device;
    if (a.start != b.start)
      return a.start < b.start;
    return a.seq < b.seq;
  });
  for (Ordered &o : all)
    rp.tasks.push_back(std::move(o.task));
  return llvm::Expected<ReplayPlan>(std::move(rp));
}

namespace {


double relErr(double predicted, double measured) {
  return std::fabs(predicted - measured) / measured;
}

struct Totals {
  std::vector<double> predicted, kernels, analytic, measured;
  bool complete = true;
};

Totals deviceTotals(const ReplayPlan &p) {
  Totals t;
  t.predicted.assign(p.devices, 0);
  t.kernels.assign(p.devices, 0);
  t.analytic.assign(p.devices, 0);
  t.measured.assign(p.devices, 0);
  for (const ReplayTask &k : p.tasks) {
    t.predicted[k.device] += k.predicted;
    t.kernels[k.device] += k.predictedKernels;
    t.analytic[k.device] += k.analytic;
    if (k.measured < 0)
      t.complete = false;
    else
      t.measured[k.device] += k.measured;
  }
  return t;
}

double maxOf(const std::vector<double> &v) {
  return v.empty() ? 0 : *std::max_element(v.begin(), v.end());
}

} // namespace

Json replayReport(const std::vector<ReplayPlan> &plans,
                  const ProfileEnvironment &env, bool withTasks) {
  Json out = {{"device", env.device}};
  if (!env.gpuName.empty())
    out["gpu_name"] = env.gpuName;
  Json jp = Json::array();
  std::vector<double> errProfiled, errAnalytic;
  std::vector<double> busiestPred, busiestMeas, busiestSeq, busiestAna;
  bool allMeasured = true, allSequenced = true;
  for (const ReplayPlan &p : plans) {
    Totals t = deviceTotals(p);
    allMeasured &= t.complete;
    Json devs = Json::array();
    for (size_t d = 0; d < p.devices; ++d) {
      Json dj = {{"device", d},
                 {"predicted_s", t.predicted[d]},
                 {"kernels_predicted_s", t.kernels[d]},
                 {"analytic_s", t.analytic[d]}};
      if (t.complete)
        dj["measured_s"] = t.measured[d];
      if (d < p.sequence.size() && p.sequence[d] >= 0)
        dj["sequence_s"] = p.sequence[d];
      devs.push_back(dj);
    }
    Json tasks = Json::array();
    size_t n = 0;
    for (const ReplayTask &k : p.tasks) {
      ++n;
      if (k.measured > 0) {
        errProfiled.push_back(relErr(k.predictedKernels, k.measured));
        errAnalytic.push_back(relErr(k.analytic, k.measured));
      }
      if (!withTasks)
        continue;
      Json tj = {{"device", k.device},
                 {"pass", k.backward ? "backward" : "forward"},
                 {"op", p.graph->op(k.op).name},
                 {"tile", k.tile},
                 {"replica", k.replica},
                 {"signature", k.signature},
                 {"predicted_s", k.predicted},
                 {"kernels_predicted_s", k.predictedKernels},
                 {"analytic_s", k.analytic}};
      if (k.measured >= 0)
        tj["measured_s"] = k.measured;
      tasks.push_back(tj);
    }
    Json pj = {{"plan", p.path},
               {"model", p.model},
               {"topology", p.topology},
               {"batch", p.batch},
               {"compute_tasks", n},
               {"busiest_predicted_s", maxOf(t.predicted)},
               {"busiest_kernels_predicted_s", maxOf(t.kernels)},
               {"busiest_analytic_s", maxOf(t.analytic)},
               {"devices", devs}};
    if (t.complete)
      pj["busiest_measured_s"] = maxOf(t.measured);
    bool sequenced = p.sequence.size() == p.devices &&
                     std::all_of(p.sequence.begin(), p.sequence.end(),
                                 [](Seconds x) { return x >= 0; });
    allSequenced &= sequenced;
    if (sequenced)
      pj["busiest_sequence_s"] = maxOf(p.sequence);
    if (withTasks)
      pj["tasks"] = tasks;
    jp.push_back(pj);
    busiestPred.push_back(maxOf(t.predicted));
    busiestAna.push_back(maxOf(t.analytic));
    busiestMeas.push_back(maxOf(t.measured));
    busiestSeq.push_back(sequenced ? maxOf(p.sequence) : 0);
  }
  out["plans"] = jp;
  if (!errProfiled.empty()) {
    out["task_error"] = {
        {"tasks", errProfiled.size()},
        {"profiled_median", median(errProfiled)},
        {"profiled_worst",
         *std::max_element(errProfiled.begin(), errProfiled.end())},
        {"analytic_median", median(errAnalytic)},
        {"analytic_worst",
         *std::max_element(errAnalytic.begin(), errAnalytic.end())}};
  }
  if (allMeasured && plans.size() >= 2) {
    // Kendall's tau-a over plan pairs: the busiest device's compute, run back
    // to back where every plan's was (else its kernels one by one).
    const std::vector<double> &meas = allSequenced ? busiestSeq : busiestMeas;
    auto order = [&](const std::vector<double> &pred) {
      int64_t agree = 0, disagree = 0;
      for (size_t i = 0; i < plans.size(); ++i)
        for (size_t j = i + 1; j < plans.size(); ++j) {
          double a = pred[i] - pred[j], b = meas[i] - meas[j];
          if (a * b > 0)
            ++agree;
          else if (a * b < 0)
            ++disagree;
        }
      int64_t pairs = int64_t(plans.size() * (plans.size() - 1) / 2);
      return Json{{"pairs", pairs},
                  {"agree", agree},
                  {"disagree", disagree},
                  {"kendall_tau", double(agree - disagree) / double(pairs)}};
    };
    out["plan_order"] = {{"profiled", order(busiestPred)},
                         {"analytic", order(busiestAna)},
                         {"measured_by", allSequenced ? "sequence" : "kernels"}};
  }
  return out;
}

void printReplayReport(const Json &r, llvm::raw_ostream &os) {
  os << "device: " << r["device"].get<std::string>();
  if (r.contains("gpu_name"))
    os << " (" << r["gpu_name"].get<std::string>() << ")";
  os << "\n";
  // The busiest device: predicted against its tasks run back to back; the
  // profile's kernel times against its kernels timed one by one; the
  // roofline.
  Table t({"plan", "tasks", "predicted ms", "in sequence ms",
           "kernels predicted ms", "kernels measured ms", "analytic ms"},
          {false, true, true, true, true, true, true});
  auto ms = [](const Json &p, const char *key) {
    return p.contains(key) ? fmt::format("{:.3f}", p[key].get<double>() * 1e3)
                           : std::string("-");
  };
  for (const Json &p : r["plans"])
    t.addRow({p["plan"].get<std::string>(),
              withCommas(p["compute_tasks"].get<int64_t>()),
              ms(p, "busiest_predicted_s"), ms(p, "busiest_sequence_s"),
              ms(p, "busiest_kernels_predicted_s"),
              ms(p, "busiest_measured_s"), ms(p, "busiest_analytic_s")});
  t.print(os);
  if (r.contains("task_error")) {
    const Json &e = r["task_error"];
    os << fmt::format(
        "kernel time relative error over {} tasks: profiled median {:.1f}% "
        "worst {:.1f}%; analytic median {:.1f}% worst {:.1f}%\n",
        e["tasks"].get<int64_t>(), 100 * e["profiled_median"].get<double>(),
        100 * e["profiled_worst"].get<double>(),
        100 * e["analytic_median"].get<double>(),
        100 * e["analytic_worst"].get<double>());
  }
  if (r.contains("plan_order"))
    for (const char *m : {"profiled", "analytic"}) {
      const Json &o = r["plan_order"][m];
      os << fmt::format("plan order ({}, against the {}): {} of {} pairs "
                        "agree, Kendall tau {:.2f}\n",
                        m,
                        r["plan_order"]["measured_by"] == "sequence"
                            ? "sequence runs"
                            : "kernels",
                        o["agree"].get<int64_t>(), o["pairs"].get<int64_t>(),
                        o["kendall_tau"].get<double>());
    }
}

} // namespace soap
