// soapc explain: why a plan is what it is. The critical path with each op's
// share, per op its configuration and the time, memory and bytes it
// contributes, and the communication by kind and link level; --dot/--svg
// draw the plan graph.
#include "soap/Driver/Explain.h"
#include "soap/Driver/Commands.h"
#include "soap/Driver/Layout.h"
#include "soap/Driver/Output.h"
#include "soap/Driver/PlanGraph.h"
#include "soap/Driver/Session.h"

#include "soap/Support/Error.h"
#include "soap/Support/Format.h"
#include <algorithm>
#include <map>

namespace soap {

/// The kind of communication a task is, for the breakdown.
static std::string commKind(const Task &t) {
  if (t.kind == TaskKind::Transfer)
    return t.bufferDevice >= 0 ? "activations (forward)"
                               : "gradients (backward)";
  if (t.kind != TaskKind::Collective)
    return "";
  switch (t.role) {
  case CollectiveRole::PartialSum:
    return "partial sums";
  case CollectiveRole::Statistics:
    return "statistics";
  case CollectiveRole::WeightGrad:
    return "weight gradients";
  case CollectiveRole::Exchange:
    return "recurrent state";
  case CollectiveRole::WeightGather:
    return "weights (ZeRO all-gather)";
  case CollectiveRole::ActivationGather:
    return "activations (all-gather)";
  case CollectiveRole::GradientGather:
    return "gradients (all-gather)";
  }
  return "";
}

/// The slowest class of link a task crosses ("local" when none).
static std::string linkLevel(const Task &t, const Topology &topo) {
  uint32_t n = static_cast<uint32_t>(topo.numDevices());
  int level = -1;
  for (uint32_t r : t.resources)
    if (r >= n)
      level = std::max(level, int(topo.link(r - n).cls));
  return level < 0 ? "local" : linkClassName(LinkClass(level)).str();
}

Json explainStrategy(const Simulator &sim, const SimMetrics &m) {
  const TaskGraph &tg = sim.graph();
  const SimContext &ctx = tg.context();
  const Graph &g = ctx.graph;
  const std::vector<Task> &tasks = tg.tasks();
  size_t nOps = g.numOps();

  struct OpRow {
    Seconds compute = 0, critical = 0;
    size_t criticalTasks = 0;
    Bytes transferIn = 0, collective = 0;
  };
  std::vector<OpRow> ops(nOps);
  struct CommRow {
    size_t tasks = 0;
    Bytes bytes = 0;
    Seconds seconds = 0, critical = 0;
  };
  std::map<std::pair<std::string, std::string>, CommRow> comm;
  std::vector<bool> onPath(tasks.size(), false);
  Seconds contention = 0;
  std::vector<TaskId> path = sim.criticalPath(&contention);
  for (TaskId id : path)
    onPath[id] = true;
  Seconds byKind[7] = {0, 0, 0, 0, 0, 0, 0};
  for (TaskId id = 0; id < tasks.size(); ++id) {
    const Task &t = tasks[id];
    if (!t.alive)
      continue;
    OpRow *row =
        t.op >= 0 && size_t(t.op) < nOps ? &ops[size_t(t.op)] : nullptr;
    if (onPath[id]) {
      byKind[int(t.kind)] += t.exe;
      if (row) {
        row->critical += t.exe;
        ++row->criticalTasks;
      }
    }
    switch (t.kind) {
    case TaskKind::Forward:
    case TaskKind::Backward:
    case TaskKind::WeightGrad:
    case TaskKind::Update:
      if (row)
        row->compute += t.exe;
      break;
    case TaskKind::Gate:
      break;
    case TaskKind::Transfer:
    case TaskKind::Collective: {
      if (row)
        (t.kind == TaskKind::Transfer ? row->transferIn : row->collective) +=
            t.bytes;
      CommRow &c = comm[{commKind(t), linkLevel(t, ctx.topo)}];
      ++c.tasks;
      c.bytes += t.bytes;
      c.seconds += t.exe;
      if (onPath[id])
        c.critical += t.exe;
      break;
    }
    }
  }

  Json j;
  j["iteration_s"] = m.iterationTime;
  j["peak_memory_bytes"] = m.peakMemory;
  j["peak_device"] = m.peakDevice;
  j["capacity_bytes"] = m.capacity;
  j["fits"] = m.fits;
  Seconds total = 0;
  for (TaskId id : path)
    total += tasks[id].exe;
  Json cp;
  cp["tasks"] = path.size();
  cp["busy_s"] = total;
  cp["compute_s"] = byKind[int(TaskKind::Forward)] +
                    byKind[int(TaskKind::Backward)] +
                    byKind[int(TaskKind::WeightGrad)];
  cp["transfer_s"] = byKind[int(TaskKind::Transfer)];
  cp["collective_s"] = byKind[int(TaskKind::Collective)];
  cp["update_s"] = byKind[int(TaskKind::Update)];
  cp["contention_s"] = contention;
  j["critical_path"] = cp;

  Json opsJson = Json::array();
  for (const Op &op : g.ops()) {
    const OpConfig &c = tg.strategy().configs[size_t(op.id)];
    std::vector<DType> inT, outT;
    for (ValueId v : op.inputs)
      inT.push_back(v == kNoValue ? DType::F32 : g.value(v).dtype);
    for (ValueId v : op.outputs)
      outT.push_back(v == kNoValue ? DType::F32 : g.value(v).dtype);
    // What the op holds on each device: saved activations, and its weight
    // shards with their gradients and optimizer state (a weight shared by
    // several ops is counted for each here, once in the totals).
    std::map<DeviceId, Bytes> held;
    const Pipeline &pipe = tg.strategy().pipeline;
    for (int64_t k = 0; k < c.numTiles(); ++k) {
      Box tile = c.tile(op.sem, k);
      // A micro-batch's activations, for each micro-batch in flight.
      Bytes b = keptBytes(g, tg.strategy(), op.id,
                          microBatchTile(c, op.sem, k, 0, pipe.microBatches)) *
                pipe.inFlight(pipe.stage(op.id));
      for (int i : op.sem.weightInputs)
        b += op.sem.inputRegion(i, tile).volume() *
             totalWeightBytes(g.value(op.inputs[size_t(i)]), ctx.optimizer);
      for (int32_t r = 0; r < c.replicas; ++r)
        held[c.device(k, r)] += b;
    }
    Bytes most = 0;
    for (const auto &[d, b] : held)
      most = std::max(most, b);
    const OpRow &row = ops[size_t(op.id)];
    opsJson.push_back(
        {{"op", op.name},
         {"kind", op.kind},
         {"config", c.str(op.sem)},
         {"devices", c.deviceSet().size()},
         {"device_compute_s", row.compute},
         {"critical_s", row.critical},
         {"critical_share",
          m.iterationTime > 0 ? row.critical / m.iterationTime : 0.0},
         {"memory_bytes", most},
         {"transfer_in_bytes", row.transferIn},
         {"collective_bytes", row.collective}});
  }
  j["ops"] = std::move(opsJson);
  Json commJson = Json::array();
  for (const auto &[key, c] : comm)
    commJson.push_back({{"kind", key.first},
                        {"level", key.second},
                        {"tasks", c.tasks},
                        {"bytes", c.bytes},
                        {"busy_s", c.seconds},
                        {"critical_s", c.critical}});
  j["communication"] = std::move(commJson);
  return j;
}

static std::string ms(double s) { return fmt::format("{:.3f}", s * 1e3); }
static std::string pct(double x) { return fmt::format("{:.1f}%", x * 100); }

void printExplain(const Json &j, size_t top, llvm::raw_ostream &os) {
  double it = j["iteration_s"].get<double>();
  os << fmt::format(
      "{}: {} plan for {} on {} ({} devices, batch {})\n",
      j["plan"].get<std::string>(), j["searcher"].get<std::string>(),
      j["model"].get<std::string>(), j["topology"].get<std::string>(),
      j["devices"].get<int64_t>(), j["batch"].get<int64_t>());
  if (j.contains("layout"))
    os << "layout: " << j["layout"].get<std::string>() << "\n";
  if (j.contains("assumed"))
    os << "assumed: " << j["assumed"].get<std::string>() << "\n";
  os << fmt::format("predicted iteration time: {} ms; peak memory {} of {} "
                    "(device {}){}\n",
                    ms(it), formatBytes(j["peak_memory_bytes"].get<double>()),
                    formatBytes(j["capacity_bytes"].get<double>()),
                    j["peak_device"].get<int64_t>(),
                    j["fits"].get<bool>() ? "" : ", does not fit");
  const Json &cp = j["critical_path"];
  auto share = [&](const char *k) {
    double v = cp[k].get<double>();
    return fmt::format("{} ms ({})", ms(v), pct(it > 0 ? v / it : 0));
  };
  double contention = cp.value("contention_s", 0.0);
  os << fmt::format("critical path: {} tasks; compute {}, transfers {}, "
                    "collectives {}, updates {}{}; waiting {} ms\n",
                    cp["tasks"].get<int64_t>(), share("compute_s"),
                    share("transfer_s"), share("collective_s"),
                    share("update_s"),
                    contention > 0 ? ", kernels slowed by communication " +
                                         share("contention_s")
                                   : std::string(),
                    ms(std::max(0.0, it - cp["busy_s"].get<double>() - contention)));

  // Ops by their time on the critical path, then by compute.
  std::vector<const Json *> ops;
  for (const Json &o : j["ops"])
    ops.push_back(&o);
  std::stable_sort(ops.begin(), ops.end(), [](const Json *a, const Json *b) {
    double ca = (*a)["critical_s"].get<double>(),
           cb = (*b)["critical_s"].get<double>();
    if (ca != cb)
      return ca > cb;
    return (*a)["device_compute_s"].get<double>() >
           (*b)["device_compute_s"].get<double>();
  });
  size_t shown = top == 0 ? ops.size() : std::min(top, ops.size());
  os << fmt::format("\nops ({} of {}, by time on the critical path):\n", shown,
                    ops.size());
  Table t({"op", "kind", "configuration", "critical ms", "share", "device ms",
           "memory", "bytes in", "collective"},
          {false, false, false, true, true, true, true, true, true});
  for (size_t i = 0; i < shown; ++i) {
    const Json &o = *ops[i];
    t.addRow({o["op"].get<std::string>(), o["kind"].get<std::string>(),
              o["config"].get<std::string>(), ms(o["critical_s"].get<double>()),
              pct(o["critical_share"].get<double>()),
              ms(o["device_compute_s"].get<double>()),
              formatBytes(o["memory_bytes"].get<double>()),
              formatBytes(o["transfer_in_bytes"].get<double>()),
              formatBytes(o["collective_bytes"].get<double>())});
  }
  t.print(os);
  os << "(device ms: the op's forward, backward and update time summed over "
        "its devices; memory: the most it holds on one device)\n";

  os << "\ncommunication:\n";
  Table c({"kind", "link level", "tasks", "bytes", "busy ms", "critical ms"},
          {false, false, true, true, true, true});
  for (const Json &r : j["communication"])
    c.addRow({r["kind"].get<std::string>(), r["level"].get<std::string>(),
              withCommas(r["tasks"].get<int64_t>()),
              formatBytes(r["bytes"].get<double>()),
              ms(r["busy_s"].get<double>()),
              ms(r["critical_s"].get<double>())});
  if (j["communication"].empty())
    os << "none: every op runs where its inputs are\n";
  else
    c.print(os);
}

llvm::Error runExplain(const DriverOptions &o) {
  if (auto err = checkOutputPath("--dot", o.dotPath))
    return err;
  if (auto err = checkOutputPath("--svg", o.svgPath))
    return err;
  auto ps = openPlan(o, o.planPath);
  if (!ps)
    return ps.takeError();
  Session &s = *ps->session;
  SimContext ctx = s.problem().context();
  // Every device's own tasks (explained, or changed op by op).
  ctx.fold = false;
  auto tg = TaskGraph::build(ctx, ps->strategy);
  if (!tg)
    return tg.takeError();
  Simulator sim(*tg);
  sim.simulateFull();
  SimMetrics m = sim.metrics();
  Json j = explainStrategy(sim, m);
  j["plan"] = o.planPath;
  j["searcher"] = ps->plan.inputs.searcher;
  j["model"] = s.options.modelPath;
  j["topology"] = s.topo->name();
  j["devices"] = s.topo->numDevices();
  j["batch"] = s.batch;
  Layout layout = describeLayout(*s.graph, ps->strategy, s.topo->numDevices(),
                                 s.batch);
  j["layout"] = layout.text;
  j["assumed"] = assumptions(s);
  if (!o.dotPath.empty() || !o.svgPath.empty()) {
    std::string dot = planGraphDot(*s.graph, ps->strategy, j);
    if (!o.dotPath.empty())
      if (auto err = writeFileAtomic(o.dotPath, dot))
        return err;
    if (!o.svgPath.empty())
      if (auto err = writeFileAtomic(
              o.svgPath, planGraphSvg(*s.graph, ps->strategy, j)))
        return err;
  }
  if (o.format == OutputFormat::Json)
    llvm::outs() << dumpJson(j);
  else
    printExplain(j, o.top, llvm::outs());
  return llvm::Error::success();
}

} // namespace soap
