// `soapc topo`: what a topology file describes, summarised by locality level
// and link class so that a wrong bandwidth or a missing link shows at once.
#include "soap/Machine/TopologyPrinter.h"

#include "soap/Support/Format.h"
#include <algorithm>
#include <fmt/format.h>
#include <limits>
#include <map>

namespace soap {

namespace {

/// Min/max of a quantity over a set of pairs or links.
struct Range {
  double lo = std::numeric_limits<double>::infinity();
  double hi = -std::numeric_limits<double>::infinity();
  void add(double v) {
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  std::string str(double scale, const char *f = "{:.2f}") const {
    std::string a = fmt::format(fmt::runtime(f), lo * scale);
    std::string b = fmt::format(fmt::runtime(f), hi * scale);
    return a == b ? a : a + ".." + b;
  }
};

struct LevelStats {
  size_t pairs = 0;
  Range bandwidth, latency;
  DeviceId exampleA = 0, exampleB = 0;
};

/// Ordered device pairs grouped by their lowest common level.
std::vector<LevelStats> levelStats(const Topology &t) {
  std::vector<LevelStats> stats(kNumLevels);
  for (DeviceId a = 0; a < t.numDevices(); ++a)
    for (DeviceId b = 0; b < t.numDevices(); ++b) {
      if (a == b)
        continue;
      LevelStats &s = stats[int(t.levelOf(a, b))];
      if (s.pairs++ == 0) {
        s.exampleA = a;
        s.exampleB = b;
      }
      s.bandwidth.add(t.pathBandwidth(a, b));
      s.latency.add(t.pathLatency(a, b));
    }
  return stats;
}

struct ClassStats {
  size_t links = 0; ///< physical (full-duplex) links
  Range bandwidth, latency;
};

std::map<int, ClassStats> classStats(const Topology &t) {
  std::map<int, ClassStats> out;
  for (const Link &l : t.links()) {
    if (l.id % 2)
      continue; // one entry per physical link
    ClassStats &s = out[int(l.cls)];
    ++s.links;
    s.bandwidth.add(l.bandwidthBytesPerSec);
    s.latency.add(l.latency);
  }
  return out;
}

/// "pcie x2, network x2, pcie x2": the classes a route crosses, run-length.
std::string routeClasses(const Topology &t, DeviceId a, DeviceId b) {
  std::string out;
  const auto &r = t.route(a, b);
  for (size_t i = 0; i < r.size();) {
    LinkClass c = t.link(r[i]).cls;
    size_t j = i;
    while (j < r.size() && t.link(r[j]).cls == c)
      ++j;
    if (!out.empty())
      out += ", ";
    out += linkClassName(c).str();
    if (j - i > 1)
      out += fmt::format(" x{}", j - i);
    i = j;
  }
  return out;
}

std::map<int, size_t> vertexCounts(const Topology &t) {
  std::map<int, size_t> out;
  for (const Vertex &v : t.vertices())
    ++out[int(v.kind)];
  return out;
}

std::string plural(size_t n, const char *one, const char *many) {
  return fmt::format("{} {}", n, n == 1 ? one : many);
}

} // namespace

static std::string tflops(double f) { return fmt::format("{:.2f}", f / 1e12); }

void printTopology(const Topology &t, llvm::raw_ostream &os) {
  const DeviceSpec &d = t.deviceSpec();
  os << "topology: " << t.name() << "\n";
  if (!t.description().empty())
    os << "description: " << t.description() << "\n";
  os << fmt::format("device: {} ({}) x {}\n", d.name.str(), d.fullName.str(),
                    t.numDevices());
  os << fmt::format("  peak dense TFLOP/s: fp64 {}, fp32 {}, tf32 {}, "
                    "fp16/bf16 {}{}{}\n",
                    tflops(d.fp64FlopsPerSec), tflops(d.fp32FlopsPerSec),
                    tflops(d.tf32FlopsPerSec), tflops(d.fp16FlopsPerSec),
                    d.fp8FlopsPerSec > 0 ? ", fp8 " + tflops(d.fp8FlopsPerSec)
                                         : std::string(),
                    d.tensorCores ? " (tensor cores)" : "");
  os << fmt::format("  memory: {} at {:.0f} GB/s\n",
                    formatBytes(double(d.memoryBytes)),
                    d.memoryBandwidthBytesPerSec / 1e9);
  os << fmt::format("  kernel launch overhead: {:.1f} us ({})\n",
                    d.launchOverhead * 1e6, d.launchSource.str());
  os << "  source: " << d.source << "\n";
  os << "intra-node fabric: " << t.intraKind() << "\n";
  auto vc = vertexCounts(t);
  size_t switches = vc[int(VertexKind::NVSwitch)] +
                    vc[int(VertexKind::PcieSwitch)] + vc[int(VertexKind::Cpu)];
  size_t netSwitches =
      vc[int(VertexKind::NetworkSwitch)] + vc[int(VertexKind::Spine)];
  os << fmt::format(
      "counts: {}, {}, {}, {}\n", plural(t.numDevices(), "device", "devices"),
      plural(t.numSwitchGroups(), "switch group", "switch groups"),
      plural(t.numNodes(), "node", "nodes"),
      plural(t.numRacks(), "rack", "racks"));
  os << fmt::format("  {} (nvswitch {}, pcie {}, cpu {}), {}, {}\n",
                    plural(switches, "node switch", "node switches"),
                    vc[int(VertexKind::NVSwitch)],
                    vc[int(VertexKind::PcieSwitch)], vc[int(VertexKind::Cpu)],
                    plural(vc[int(VertexKind::Nic)], "nic", "nics"),
                    plural(netSwitches, "network switch", "network switches"));

  os << "\nlevels:\n";
  Table levels({"level", "groups", "devices per group"}, {false, true, true});
  for (int l = 0; l < kNumLevels; ++l) {
    auto groups = t.groupsAt(Level(l));
    Range size;
    for (const auto &g : groups)
      size.add(double(g.size()));
    levels.addRow({levelName(Level(l)).str(), std::to_string(groups.size()),
                   size.str(1, "{:.0f}")});
  }
  levels.print(os);

  os << "\ndevice pairs by lowest common level (bandwidth: least over the "
        "route, per direction; latency: summed over the route):\n";
  Table pairs({"level", "pairs", "GB/s", "latency us", "example route"},
              {false, true, true, true, false});
  auto stats = levelStats(t);
  for (int l = int(Level::Switch); l < kNumLevels; ++l) {
    const LevelStats &s = stats[l];
    if (!s.pairs) {
      pairs.addRow({levelName(Level(l)).str(), "0", "-", "-", "-"});
      continue;
    }
    pairs.addRow({levelName(Level(l)).str(), withCommas(int64_t(s.pairs)),
                  s.bandwidth.str(1e-9), s.latency.str(1e6),
                  fmt::format("{} -> {}: {}", t.deviceName(s.exampleA),
                              t.deviceName(s.exampleB),
                              routeClasses(t, s.exampleA, s.exampleB))});
  }
  pairs.print(os);

  os << "\nlinks by class (full duplex; bandwidth per direction):\n";
  Table links({"class", "links", "GB/s", "Gb/s", "latency us"},
              {false, true, true, true, true});
  for (const auto &[cls, s] : classStats(t))
    links.addRow({linkClassName(LinkClass(cls)).str(),
                  withCommas(int64_t(s.links)), s.bandwidth.str(1e-9),
                  s.bandwidth.str(8e-9, "{:.0f}"), s.latency.str(1e6)});
  links.print(os);

  const NcclCalibration &c = t.nccl();
  if (!c.enabled)
    return;
  os << fmt::format("\nNCCL calibration (collectives): launch {:.2f} us",
                    c.launch * 1e6);
  if (c.nvlsEfficiency > 0)
    os << fmt::format(", NVLink SHARP at {:.2f} of the NVSwitch link",
                      c.nvlsEfficiency);
  if (c.nvlsStepLatency)
    os << fmt::format(" with {:.2f} us steps", *c.nvlsStepLatency * 1e6);
  os << "\n";
  Table cal({"class", "efficiency", "step latency us"}, {false, true, true});
  for (const auto &[cls, stats] : classStats(t)) {
    auto step = c.stepLatency[size_t(cls)];
    cal.addRow({linkClassName(LinkClass(cls)).str(),
                fmt::format("{:.2f}", c.efficiency[size_t(cls)]),
                step ? fmt::format("{:.2f}", *step * 1e6)
                     : std::string("link's")});
  }
  cal.print(os);
}

Json deviceSpecToJson(const DeviceSpec &d) {
  return Json{{"name", d.name.str()},
              {"full_name", d.fullName.str()},
              {"peak_flops_per_sec",
               {{"fp64", d.fp64FlopsPerSec},
                {"fp32", d.fp32FlopsPerSec},
                {"tf32", d.tf32FlopsPerSec},
                {"fp16", d.fp16FlopsPerSec},
                {"fp8", d.fp8FlopsPerSec}}},
              {"tensor_cores", d.tensorCores},
              {"memory_bytes", d.memoryBytes},
              {"memory_bandwidth_bytes_per_sec", d.memoryBandwidthBytesPerSec},
              {"launch_overhead_seconds", d.launchOverhead},
              {"source", d.source.str()},
              {"launch_overhead_source", d.launchSource.str()}};
}

static Json rangeJson(const Range &r) {
  return Json{{"min", r.lo}, {"max", r.hi}};
}

Json topologyToJson(const Topology &t) {
  Json doc;
  doc["name"] = t.name();
  doc["description"] = t.description();
  doc["intra"] = t.intraKind();
  doc["device"] = deviceSpecToJson(t.deviceSpec());
  Json counts = {{"devices", t.numDevices()},
                 {"switch_groups", t.numSwitchGroups()},
                 {"nodes", t.numNodes()},
                 {"racks", t.numRacks()},
                 {"links", t.links().size() / 2}};
  Json vertices = Json::object();
  for (const auto &[kind, n] : vertexCounts(t)) {
    std::string key = vertexKindName(VertexKind(kind)).str();
    std::replace(key.begin(), key.end(), ' ', '_'); // "pcie_switch"
    vertices[key] = n;
  }
  counts["vertices"] = vertices;
  doc["counts"] = counts;
  Json levels = Json::array();
  for (int l = 0; l < kNumLevels; ++l) {
    auto groups = t.groupsAt(Level(l));
    Range size;
    for (const auto &g : groups)
      size.add(double(g.size()));
    levels.push_back({{"level", levelName(Level(l)).str()},
                      {"groups", groups.size()},
                      {"devices_per_group", rangeJson(size)}});
  }
  doc["levels"] = levels;
  Json pairs = Json::array();
  auto stats = levelStats(t);
  for (int l = int(Level::Switch); l < kNumLevels; ++l) {
    const LevelStats &s = stats[l];
    Json p = {{"level", levelName(Level(l)).str()}, {"pairs", s.pairs}};
    if (s.pairs) {
      p["bandwidth_bytes_per_sec"] = rangeJson(s.bandwidth);
      p["latency_seconds"] = rangeJson(s.latency);
      p["example"] = {t.deviceName(s.exampleA), t.deviceName(s.exampleB)};
      p["example_route"] = routeClasses(t, s.exampleA, s.exampleB);
    }
    pairs.push_back(p);
  }
  doc["device_pairs"] = pairs;
  Json classes = Json::array();
  for (const auto &[cls, s] : classStats(t))
    classes.push_back({{"class", linkClassName(LinkClass(cls)).str()},
                       {"links", s.links},
                       {"bandwidth_bytes_per_sec", rangeJson(s.bandwidth)},
                       {"latency_seconds", rangeJson(s.latency)}});
  doc["link_classes"] = classes;
  if (const NcclCalibration &c = t.nccl(); c.enabled) {
    Json links = Json::object();
    for (const auto &[cls, stats] : classStats(t)) {
      Json l = {{"efficiency", c.efficiency[size_t(cls)]}};
      if (auto step = c.stepLatency[size_t(cls)])
        l["step_latency_seconds"] = *step;
      links[linkClassName(LinkClass(cls)).str()] = l;
    }
    doc["nccl"] = {{"launch_seconds", c.launch},
                   {"nvls_efficiency", c.nvlsEfficiency},
                   {"links", links}};
    if (c.nvlsStepLatency)
      doc["nccl"]["nvls_step_latency_seconds"] = *c.nvlsStepLatency;
  }
  Json devices = Json::array();
  for (const DeviceInfo &d : t.devices())
    devices.push_back({{"id", d.id},
                       {"name", t.deviceName(d.id)},
                       {"node", d.node},
                       {"local_rank", d.localRank},
                       {"switch", d.switchGroup},
                       {"rack", d.rack}});
  doc["devices"] = devices;
  return doc;
}

void printDeviceCatalog(llvm::raw_ostream &os) {
  Table t({"device", "fp64 TF", "fp32 TF", "tf32 TF", "fp16 TF", "fp8 TF",
           "memory", "mem GB/s", "launch us"},
          {false, true, true, true, true, true, true, true, true});
  for (const DeviceSpec &d : deviceCatalog())
    t.addRow({d.name.str(), tflops(d.fp64FlopsPerSec),
              tflops(d.fp32FlopsPerSec), tflops(d.tf32FlopsPerSec),
              tflops(d.fp16FlopsPerSec),
              d.fp8FlopsPerSec > 0 ? tflops(d.fp8FlopsPerSec) : "-",
              formatBytes(double(d.memoryBytes)),
              fmt::format("{:.0f}", d.memoryBandwidthBytesPerSec / 1e9),
              fmt::format("{:.1f}", d.launchOverhead * 1e6)});
  t.print(os);
  os << "\nsources (peaks are dense, no sparsity):\n";
  for (const DeviceSpec &d : deviceCatalog())
    os << "  " << d.name << ": " << d.source << "\n";
}

Json deviceCatalogToJson() {
  Json out = Json::array();
  for (const DeviceSpec &d : deviceCatalog())
    out.push_back(deviceSpecToJson(d));
  return out;
}

} // namespace soap
