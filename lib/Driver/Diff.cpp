// soapc diff: the ops whose configuration differs between two plans of one
// model and topology, and the predicted effect of each difference alone
// (plan A with only that op as in plan B, by delta simulation).
#include "soap/Driver/Commands.h"
#include "soap/Driver/Output.h"
#include "soap/Driver/PlanGraph.h"
#include "soap/Driver/Session.h"

#include "soap/Support/Error.h"
#include "soap/Support/Format.h"

namespace soap {

static Bytes peakOf(const TaskGraph &tg) {
  Bytes peak = 0;
  for (const TaskGraph::DeviceMemory &m : tg.memory())
    peak = std::max(peak, m.total());
  return peak;
}

static void printDiff(const Json &j, llvm::raw_ostream &os) {
  auto side = [&](const char *k) {
    const Json &s = j[k];
    return fmt::format(
        "{} ({}): {:.3f} ms, peak {}", s["plan"].get<std::string>(),
        s["searcher"].get<std::string>(), s["iteration_s"].get<double>() * 1e3,
        formatBytes(s["peak_memory_bytes"].get<double>()));
  };
  os << "a: " << side("a") << "\n"
     << "b: " << side("b") << "\n";
  double a = j["a"]["iteration_s"].get<double>();
  double b = j["b"]["iteration_s"].get<double>();
  os << fmt::format("{} of {} ops differ; b is {:+.3f} ms ({:+.1f}%) against "
                    "a\n",
                    j["ops"].size(), j["num_ops"].get<int64_t>(), (b - a) * 1e3,
                    a > 0 ? 100 * (b - a) / a : 0.0);
  if (j["ops"].empty())
    return;
  os << "\neach difference alone (a with only that op as in b):\n";
  Table t({"op", "kind", "a", "b", "effect ms", "peak memory"},
          {false, false, false, false, true, true});
  for (const Json &o : j["ops"])
    t.addRow({o["op"].get<std::string>(), o["kind"].get<std::string>(),
              o["a"].get<std::string>(), o["b"].get<std::string>(),
              fmt::format("{:+.3f}", o["effect_s"].get<double>() * 1e3),
              formatBytes(o["peak_memory_bytes"].get<double>())});
  t.print(os);
}

llvm::Error runDiff(const DriverOptions &o) {
  auto a = openPlan(o, o.planPath);
  if (!a)
    return a.takeError();
  Session &s = *a->session;
  auto b = readPlan(o.otherPlanPath);
  if (!b)
    return b.takeError();
  const PlanInputs &ia = a->plan.inputs, &ib = b->inputs;
  if (ib.modelSha256 != ia.modelSha256)
    return inputError("{}: /model/sha256: made for another model than {} "
                      "(its SHA-256 {}..., {}'s {}...)",
                      o.otherPlanPath, o.planPath, ib.modelSha256.substr(0, 12),
                      o.planPath, ia.modelSha256.substr(0, 12));
  if (ib.topologySha256 != ia.topologySha256)
    return inputError("{}: /topology/sha256: made for another topology than "
                      "{}",
                      o.otherPlanPath, o.planPath);
  if (ib.batch != s.batch || ib.unrollRnn != ia.unrollRnn ||
      ib.appendLoss != ia.appendLoss)
    return inputError("{}: /model: the model was imported otherwise (batch "
                      "{}, unrolled {}, loss {}) than for {} (batch {}, "
                      "unrolled {}, loss {})",
                      o.otherPlanPath, ib.batch, ib.unrollRnn, ib.appendLoss,
                      o.planPath, s.batch, ia.unrollRnn, ia.appendLoss);
  auto sb = planStrategy(*b, *s.graph, *s.topo, o.otherPlanPath);
  if (!sb)
    return sb.takeError();
  SimContext ctx = s.problem().context();
  // Every device's own tasks (explained, or changed op by op).
  ctx.fold = false;
  auto tgB = TaskGraph::build(ctx, *sb);
  if (!tgB)
    return tgB.takeError();
  Simulator simB(*tgB);
  Seconds timeB = simB.simulateFull();
  auto tg = TaskGraph::build(ctx, a->strategy);
  if (!tg)
    return tg.takeError();
  Simulator sim(*tg);
  Seconds timeA = sim.simulateFull();
  Json j;
  j["a"] = {{"plan", o.planPath},
            {"searcher", ia.searcher},
            {"iteration_s", timeA},
            {"peak_memory_bytes", peakOf(*tg)}};
  j["b"] = {{"plan", o.otherPlanPath},
            {"searcher", ib.searcher},
            {"iteration_s", timeB},
            {"peak_memory_bytes", peakOf(*tgB)}};
  j["num_ops"] = s.graph->numOps();
  j["ops"] = Json::array();
  // A configuration, and its weight-gradient order where not the default.
  auto label = [](const Op &op, const OpConfig &c, WeightGradOrder w) {
    std::string s = c.str(op.sem);
    if (w != WeightGradOrder::Next)
      s += " weight_grad=" + weightGradOrderName(w).str();
    return s;
  };
  for (const Op &op : s.graph->ops()) {
    const OpConfig &ca = a->strategy.configs[size_t(op.id)];
    const OpConfig &cb = sb->configs[size_t(op.id)];
    WeightGradOrder oa = a->strategy.weightGradOrder(op.id),
                    ob = sb->weightGradOrder(op.id);
    if (ca == cb && oa == ob)
      continue;
    auto t =
        sim.apply(op.id, cb,
                  oa != ob ? std::optional<WeightGradOrder>(ob) : std::nullopt);
    if (!t)
      return t.takeError();
    Bytes peak = peakOf(*tg);
    if (auto err = sim.undo())
      return err;
    j["ops"].push_back({{"op", op.name},
                        {"kind", op.kind},
                        {"a", label(op, ca, oa)},
                        {"b", label(op, cb, ob)},
                        {"a_shape", configShape(op.sem, ca)},
                        {"b_shape", configShape(op.sem, cb)},
                        {"alone_s", *t},
                        {"effect_s", *t - timeA},
                        {"peak_memory_bytes", peak}});
  }
  emit(o, j, printDiff);
  return llvm::Error::success();
}

} // namespace soap
