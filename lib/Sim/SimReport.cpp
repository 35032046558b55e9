// `soapc simulate` output.
#include "soap/Sim/SimReport.h"

#include "soap/Support/Format.h"
#include <fmt/format.h>

namespace soap {

Json simReport(const Simulator &sim, const SimMetrics &m,
               llvm::StringRef strategyName, int64_t samples) {
  const SimContext &ctx = sim.graph().context();
  Json devices = Json::array();
  for (DeviceId d = 0; d < m.memory.size(); ++d) {
    const auto &mem = m.memory[d];
    devices.push_back({{"device", ctx.topo.deviceName(d)},
                       {"weights", mem.weights},
                       {"gradients", mem.gradients},
                       {"optimizer", mem.optimizer},
                       {"saved", mem.saved},
                       {"buffers", mem.buffers},
                       {"workspace", mem.workspace},
                       {"total", mem.total()}});
  }
  Json classes = Json::object();
  for (const auto &[c, b] : m.transferBytesByClass)
    classes[linkClassName(c).str()] = b;
  return {
      {"model", ctx.graph.sourcePath},
      {"topology", ctx.topo.name()},
      {"strategy", strategyName.str()},
      {"cost_model", costModeName(ctx.cost.mode()).str()},
      {"optimizer", optimizerName(ctx.optimizer).str()},
      {"precision", precisionName(ctx.graph.precision()).str()},
      {"samples", samples},
      {"iteration_s", m.iterationTime},
      {"samples_per_s", m.iterationTime > 0 ? samples / m.iterationTime : 0},
      {"tasks", m.numTasks},
      {"fold", m.fold},
      {"compute_s", m.computeTime},
      {"transfer_bytes", m.transferBytes},
      {"transfer_bytes_by_link_class", classes},
      {"collective_bytes", m.collectiveBytes},
      {"memory",
       {{"peak", m.peakMemory},
        {"peak_device", ctx.topo.deviceName(m.peakDevice)},
        {"capacity", m.capacity},
        {"fits", m.fits},
        {"devices", devices}}},
      {"critical_path",
       {{"tasks", m.criticalPathTasks},
        {"compute_s", m.criticalCompute},
        {"transfer_s", m.criticalTransfer},
        {"collective_s", m.criticalCollective},
        {"update_s", m.criticalUpdate},
        {"contention_s", m.criticalContention}}}};
}

static std::string ms(const Json &s) {
  return fmt::format("{:.3f} ms", s.get<double>() * 1e3);
}
static std::string bytes(const Json &b) { return formatBytes(b.get<double>()); }

void printSimReport(const Json &r, llvm::raw_ostream &os) {
  const Json &mem = r["memory"], &cp = r["critical_path"];
  os << fmt::format(
      "model: {}\ntopology: {}\nstrategy: {}\ncost model: {} "
      "({}, optimizer {})\n",
      r["model"].get<std::string>(), r["topology"].get<std::string>(),
      r["strategy"].get<std::string>(), r["cost_model"].get<std::string>(),
      r["precision"].get<std::string>(), r["optimizer"].get<std::string>());
  os << fmt::format("iteration time: {} ({:.1f} samples/s at batch {})\n",
                    ms(r["iteration_s"]), r["samples_per_s"].get<double>(),
                    r["samples"].get<int64_t>());
  os << fmt::format("peak memory: {} on {} of {} per device: {}\n",
                    bytes(mem["peak"]), mem["peak_device"].get<std::string>(),
                    bytes(mem["capacity"]),
                    mem["fits"].get<bool>() ? "fits" : "DOES NOT FIT");
  std::string classes;
  for (const auto &[c, b] : r["transfer_bytes_by_link_class"].items())
    classes += fmt::format("{}{} {}", classes.empty() ? "" : ", ", c, bytes(b));
  os << fmt::format("bytes moved: transfers {}{}, all-reduces {}\n",
                    bytes(r["transfer_bytes"]),
                    classes.empty() ? "" : " (" + classes + ")",
                    bytes(r["collective_bytes"]));
  int fold = r.value("fold", 1);
  os << fmt::format("compute: {} summed over devices; {} tasks{}\n",
                    ms(r["compute_s"]), r["tasks"].get<size_t>(),
                    fold > 1 ? fmt::format(" (one of {} identical device "
                                           "groups simulated)",
                                           fold)
                             : std::string());
  double contention = cp.value("contention_s", 0.0);
  os << fmt::format("critical path: {} tasks: compute {}, transfers {}, "
                    "all-reduces {}, updates {}{}\n\n",
                    cp["tasks"].get<size_t>(), ms(cp["compute_s"]),
                    ms(cp["transfer_s"]), ms(cp["collective_s"]),
                    ms(cp["update_s"]),
                    contention > 0 ? ", kernels slowed by communication " +
                                         ms(Json(contention))
                                   : std::string());
  Table t({"device", "weights", "gradients", "optimizer", "saved", "buffers",
           "workspace", "total"},
          {false, true, true, true, true, true, true, true});
  for (const Json &d : mem["devices"])
    t.addRow({d["device"], bytes(d["weights"]), bytes(d["gradients"]),
              bytes(d["optimizer"]), bytes(d["saved"]), bytes(d["buffers"]),
              bytes(d["workspace"]), bytes(d["total"])});
  t.print(os);
}

} // namespace soap
