// `soapc cost`: per-op kernel times and memory on one device.
#include "soap/Cost/CostPrinter.h"

#include "soap/Cost/OpSignature.h"
#include "soap/Support/Format.h"
#include <fmt/format.h>

namespace soap {

llvm::Expected<Json> costReport(const Graph &g, const CostModel &cm,
                                Optimizer opt) {
  Json ops = Json::array();
  double fwd = 0, bwd = 0;
  Bytes weights = 0, saved = 0, total = 0;
  int profiled = 0;
  for (const Op &o : g.ops()) {
    Box full = o.sem.fullTile();
    auto k = cm.kernel(g, o, full);
    if (!k)
      return k.takeError();
    TileMemory m = cm.memory(g, o, full, opt);
    fwd += k->forward;
    bwd += k->backward();
    weights += m.weights;
    saved += m.saved;
    total += m.total();
    profiled += k->source == CostSource::Profile;
    ops.push_back({{"name", o.name},
                   {"kind", o.kind},
                   {"signature", opSignature(g, o, full)},
                   {"forward_s", k->forward},
                   {"backward_data_s", k->backwardData},
                   {"backward_weight_s", k->backwardWeight},
                   {"source", costSourceName(k->source).str()},
                   {"memory",
                    {{"weights", m.weights},
                     {"gradients", m.gradients},
                     {"optimizer", m.optimizer},
                     {"saved", m.saved},
                     {"workspace", m.workspace},
                     {"total", m.total()}}}});
  }
  return Json{{"model", g.sourcePath},
              {"device", cm.device().name.str()},
              {"cost_model", costModeName(cm.mode()).str()},
              {"optimizer", optimizerName(opt).str()},
              {"ops", ops},
              {"totals",
               {{"forward_s", fwd},
                {"backward_s", bwd},
                {"weights_bytes", weights},
                {"saved_bytes", saved},
                {"memory_bytes", total},
                {"profiled_ops", profiled},
                {"analytic_ops", static_cast<int>(g.numOps()) - profiled}}}};
}

static std::string ms(double s) { return fmt::format("{:.3f}", s * 1e3); }

void printCostReport(const Json &r, llvm::raw_ostream &os) {
  const Json &t = r["totals"];
  os << fmt::format(
      "model: {}\ndevice: {}\ncost model: {} ({} ops profiled, {} analytic)\n"
      "optimizer: {}\nforward: {} ms  backward: {} ms\n"
      "memory: {} (weights {}, saved activations {})\n\n",
      r["model"].get<std::string>(), r["device"].get<std::string>(),
      r["cost_model"].get<std::string>(), t["profiled_ops"].get<int>(),
      t["analytic_ops"].get<int>(), r["optimizer"].get<std::string>(),
      ms(t["forward_s"]), ms(t["backward_s"]),
      formatBytes(t["memory_bytes"].get<double>()),
      formatBytes(t["weights_bytes"].get<double>()),
      formatBytes(t["saved_bytes"].get<double>()));
  Table tab({"op", "kind", "fwd ms", "bwd-data ms", "bwd-weight ms", "source",
             "memory"},
            {false, false, true, true, true, false, true});
  for (const Json &o : r["ops"])
    tab.addRow({o["name"], o["kind"], ms(o["forward_s"]),
                ms(o["backward_data_s"]), ms(o["backward_weight_s"]),
                o["source"], formatBytes(o["memory"]["total"].get<double>())});
  tab.print(os);
}

} // namespace soap
