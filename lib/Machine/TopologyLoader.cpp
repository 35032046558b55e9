// The topology file reader: one node template repeated `nodes` times, an
// intra-node fabric (NVSwitch, direct NVLink, or a PCIe switch tree), NICs to
// a leaf switch per rack, and an optional spine. Bandwidths are Gb/s per
// direction (`_gbps`), latencies microseconds (`_us`); see
// schemas/topology.schema.json.
#include "soap/Machine/TopologyLoader.h"

#include "soap/Support/Error.h"
#include "soap/Support/Logging.h"
#include <fmt/format.h>
#include <map>
#include <set>

namespace soap {

#define SOAP_TRY(var, expr)                                                    \
  auto var##OrErr = (expr);                                                    \
  if (!var##OrErr)                                                             \
    return var##OrErr.takeError();                                             \
  auto var = std::move(*var##OrErr);

namespace {

struct LinkSpec {
  double bandwidthBytesPerSec = 0;
  Seconds latency = 0;
  LinkClass cls = LinkClass::PCIe;
};

enum class IntraKind { NVSwitch, NVLink, Pcie };

struct PcieSwitchSpec {
  std::string id;
  VertexKind kind = VertexKind::PcieSwitch;
  int parent = -1; ///< index into the switch list; -1 for the root
  std::vector<int64_t> gpus;
  LinkSpec uplink; ///< the link to the parent
};

struct NvlinkConnection {
  int64_t a, b, links;
};

/// The parsed file, before the graph is built.
struct Spec {
  std::string name, description;
  DeviceSpec device;
  int64_t nodes = 1, gpus = 1;
  IntraKind intra = IntraKind::NVSwitch;
  LinkSpec intraLink; ///< per GPU (NVSwitch), per NVLink, or per PCIe link
  LinkSpec pcie;      ///< NVLink/NVSwitch nodes: GPU attachment to host/NIC
  std::vector<NvlinkConnection> nvlinks;
  std::vector<PcieSwitchSpec> switches;
  std::vector<int> nicSwitch; ///< per NIC, the switch it hangs off (PCIe)
  int64_t nics = 0;
  LinkSpec nic;
  int64_t nodesPerRack = 0; ///< 0: one rack
  LinkSpec rackUplink;
  NcclCalibration nccl;
};

class Loader {
public:
  explicit Loader(llvm::StringRef file) : r_(file.str()) {}
  llvm::Expected<Topology> load(const Json &doc);

private:
  void warnUnknown(const Json &obj, llvm::StringRef ptr,
                   std::initializer_list<llvm::StringRef> known) const;
  llvm::Expected<LinkSpec> link(const Json &obj, llvm::StringRef ptr,
                                LinkClass cls,
                                llvm::StringRef bwKey = "bandwidth_gbps",
                                llvm::StringRef latKey = "latency_us") const;
  llvm::Error parseNode(const Json &node, Spec &s) const;
  llvm::Error parseNvlink(const Json &intra, llvm::StringRef ptr,
                          Spec &s) const;
  llvm::Error parsePcieTree(const Json &intra, llvm::StringRef ptr,
                            Spec &s) const;
  llvm::Error parseNicPlacement(const Json &doc, Spec &s) const;
  llvm::Error parseNccl(const Json &doc, Spec &s) const;
  llvm::Expected<Topology> build(const Spec &s) const;

  JsonReader r_;
};

} // namespace

void Loader::warnUnknown(const Json &obj, llvm::StringRef ptr,
                         std::initializer_list<llvm::StringRef> known) const {
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    bool ok = false;
    for (llvm::StringRef k : known)
      ok |= k == it.key();
    if (!ok)
      spdlog::warn("{}: {}: unknown field (ignored)", r_.file(),
                   jsonPointer(ptr, it.key()));
  }
}

llvm::Expected<LinkSpec> Loader::link(const Json &obj, llvm::StringRef ptr,
                                      LinkClass cls, llvm::StringRef bwKey,
                                      llvm::StringRef latKey) const {
  // Physical ranges: 1 Mbit/s to 1 Pbit/s (NVLink 4 is 3.6 Tbit/s per GPU;
  // dgx-h100-128's rack uplinks aggregate 102.4 Tbit/s), 0 to 1 s of
  // latency. A typo like 1e308 is refused, not simulated.
  SOAP_TRY(gbps, r_.inRange(obj, ptr, bwKey, 1e-3, 1e6,
                            "Gbit/s (a link's bandwidth)"));
  SOAP_TRY(us, r_.inRange(obj, ptr, latKey, 0, 1e6,
                          "microseconds (a link's latency)"));
  return LinkSpec{gbpsToBytesPerSec(gbps), usToSeconds(us), cls};
}

llvm::Error Loader::parseNvlink(const Json &intra, llvm::StringRef ptr,
                                Spec &s) const {
  SOAP_TRY(conn, r_.field(intra, ptr, "connections"));
  std::string cptr = jsonPointer(ptr, "connections");
  if (conn->is_string()) {
    if (*conn != "all-to-all")
      return r_.error(cptr, fmt::format("expected \"all-to-all\" or an array "
                                        "of connections, got \"{}\"",
                                        conn->get<std::string>()));
    for (int64_t a = 0; a < s.gpus; ++a)
      for (int64_t b = a + 1; b < s.gpus; ++b)
        s.nvlinks.push_back({a, b, 1});
    return llvm::Error::success();
  }
  if (!conn->is_array())
    return r_.error(cptr, "expected \"all-to-all\" or an array of connections");
  std::map<std::pair<int64_t, int64_t>, size_t> seen;
  for (size_t i = 0; i < conn->size(); ++i) {
    const Json &c = (*conn)[i];
    std::string p = jsonPointer(cptr, i);
    SOAP_TRY(pair, r_.array(c, p, "gpus"));
    std::string gp = jsonPointer(p, "gpus");
    if (pair->size() != 2)
      return r_.error(
          gp, fmt::format("expected two gpu indices, got {}", pair->size()));
    int64_t g[2];
    for (size_t k = 0; k < 2; ++k) {
      const Json &v = (*pair)[k];
      if (!v.is_number_integer() || v.get<int64_t>() < 0 ||
          v.get<int64_t>() >= s.gpus)
        return r_.error(jsonPointer(gp, k),
                        fmt::format("expected a gpu index in [0, {})", s.gpus));
      g[k] = v.get<int64_t>();
    }
    if (g[0] == g[1])
      return r_.error(gp, "a connection needs two different gpus");
    int64_t links = 1;
    if (c.contains("links")) {
      SOAP_TRY(n, r_.integer(c, p, "links", 1));
      links = n;
    }
    warnUnknown(c, p, {"gpus", "links"});
    auto key = std::minmax(g[0], g[1]);
    auto [it, fresh] = seen.emplace(key, i);
    if (!fresh)
      return r_.error(p, fmt::format("duplicate connection between gpus {} "
                                     "and {} (first at {})",
                                     key.first, key.second,
                                     jsonPointer(cptr, it->second)));
    s.nvlinks.push_back({key.first, key.second, links});
  }
  return llvm::Error::success();
}

llvm::Error Loader::parsePcieTree(const Json &intra, llvm::StringRef ptr,
                                  Spec &s) const {
  SOAP_TRY(list, r_.array(intra, ptr, "switches"));
  std::string lptr = jsonPointer(ptr, "switches");
  if (list->empty())
    return r_.error(lptr, "a PCIe tree needs at least one switch");
  std::map<std::string, int> index;
  std::vector<std::string> parents(list->size());
  std::vector<int> attachedTo(s.gpus, -1);
  for (size_t i = 0; i < list->size(); ++i) {
    const Json &sw = (*list)[i];
    std::string p = jsonPointer(lptr, i);
    PcieSwitchSpec spec;
    SOAP_TRY(id, r_.string(sw, p, "id"));
    if (id.empty())
      return r_.error(jsonPointer(p, "id"), "must not be empty");
    auto [it, fresh] = index.emplace(id, int(i));
    if (!fresh)
      return r_.error(jsonPointer(p, "id"),
                      fmt::format("duplicate switch id '{}' (first at {})", id,
                                  jsonPointer(lptr, size_t(it->second))));
    spec.id = id;
    if (sw.contains("kind")) {
      SOAP_TRY(kind, r_.string(sw, p, "kind"));
      if (kind == "cpu")
        spec.kind = VertexKind::Cpu;
      else if (kind != "pcie")
        return r_.error(
            jsonPointer(p, "kind"),
            fmt::format("expected \"pcie\" or \"cpu\", got \"{}\"", kind));
    }
    if (sw.contains("parent")) {
      SOAP_TRY(parent, r_.string(sw, p, "parent"));
      parents[i] = parent;
    }
    spec.uplink = {s.intraLink.bandwidthBytesPerSec, s.intraLink.latency,
                   LinkClass::PCIe};
    if (sw.contains("uplink")) {
      SOAP_TRY(up, r_.object(sw, p, "uplink"));
      std::string up_ptr = jsonPointer(p, "uplink");
      LinkClass cls = LinkClass::PCIe;
      if (up->contains("class")) {
        SOAP_TRY(name, r_.string(*up, up_ptr, "class"));
        auto c = parseLinkClass(name);
        if (!c || (*c != LinkClass::PCIe && *c != LinkClass::Socket))
          return r_.error(jsonPointer(up_ptr, "class"),
                          fmt::format("expected \"pcie\" or \"socket\", got "
                                      "\"{}\"",
                                      name));
        cls = *c;
      }
      SOAP_TRY(l, link(*up, up_ptr, cls));
      spec.uplink = l;
      warnUnknown(*up, up_ptr, {"class", "bandwidth_gbps", "latency_us"});
    }
    if (sw.contains("gpus")) {
      SOAP_TRY(gpus, r_.array(sw, p, "gpus"));
      std::string gp = jsonPointer(p, "gpus");
      for (size_t k = 0; k < gpus->size(); ++k) {
        const Json &v = (*gpus)[k];
        if (!v.is_number_integer() || v.get<int64_t>() < 0 ||
            v.get<int64_t>() >= s.gpus)
          return r_.error(
              jsonPointer(gp, k),
              fmt::format("expected a gpu index in [0, {})", s.gpus));
        int64_t g = v.get<int64_t>();
        if (attachedTo[g] >= 0)
          return r_.error(jsonPointer(gp, k),
                          fmt::format("gpu {} is already attached to switch "
                                      "'{}'",
                                      g,
                                      attachedTo[g] == int(i)
                                          ? spec.id
                                          : s.switches[attachedTo[g]].id));
        attachedTo[g] = int(i);
        spec.gpus.push_back(g);
      }
    }
    warnUnknown(sw, p, {"id", "kind", "parent", "uplink", "gpus"});
    s.switches.push_back(std::move(spec));
  }
  // Parents: exactly one root, known ids, no cycles; otherwise some devices
  // would have no route.
  int root = -1;
  for (size_t i = 0; i < s.switches.size(); ++i) {
    std::string p = jsonPointer(lptr, i);
    if (parents[i].empty()) {
      if (root >= 0)
        return r_.error(p, fmt::format("switch '{}' has no parent, but '{}' "
                                       "is already the root: its devices "
                                       "would have no route to the others",
                                       s.switches[i].id, s.switches[root].id));
      root = int(i);
      continue;
    }
    auto it = index.find(parents[i]);
    if (it == index.end())
      return r_.error(jsonPointer(p, "parent"),
                      fmt::format("unknown switch '{}'", parents[i]));
    s.switches[i].parent = it->second;
  }
  if (root < 0)
    return r_.error(lptr, "no root switch (every switch has a parent): the "
                          "parents form a cycle");
  for (size_t i = 0; i < s.switches.size(); ++i) {
    int at = int(i);
    for (size_t steps = 0; at != root; ++steps) {
      if (steps > s.switches.size())
        return r_.error(jsonPointer(jsonPointer(lptr, i), "parent"),
                        fmt::format("switch '{}' is on a parent cycle, not "
                                    "under the root '{}'",
                                    s.switches[i].id, s.switches[root].id));
      at = s.switches[at].parent;
    }
  }
  // The root goes first, so the loader can make it the node's host.
  std::swap(s.switches[0], s.switches[root]);
  for (PcieSwitchSpec &sw : s.switches)
    if (sw.parent == 0 || sw.parent == root)
      sw.parent = sw.parent == 0 ? root : 0;
  for (int64_t g = 0; g < s.gpus; ++g)
    if (attachedTo[g] < 0)
      return r_.error(lptr, fmt::format("gpu {} is attached to no switch: it "
                                        "would have no route to the other "
                                        "devices",
                                        g));
  return llvm::Error::success();
}

llvm::Error Loader::parseNode(const Json &node, Spec &s) const {
  SOAP_TRY(gpus, r_.integer(node, "/node", "gpus", 1));
  // Checked before anything sized by it is built (all-to-all NVLink pairs,
  // per-gpu tables).
  if (gpus > kMaxDevices)
    return r_.error("/node/gpus",
                    fmt::format("{} gpus per node is more than the {} devices "
                                "soapc supports",
                                gpus, kMaxDevices));
  s.gpus = gpus;
  SOAP_TRY(intra, r_.object(node, "/node", "intra"));
  const std::string ip = "/node/intra";
  SOAP_TRY(kind, r_.string(*intra, ip, "kind"));
  if (kind == "nvswitch") {
    s.intra = IntraKind::NVSwitch;
    SOAP_TRY(l, link(*intra, ip, LinkClass::NVSwitch));
    s.intraLink = l;
    warnUnknown(*intra, ip, {"kind", "bandwidth_gbps", "latency_us"});
  } else if (kind == "nvlink") {
    s.intra = IntraKind::NVLink;
    SOAP_TRY(l, link(*intra, ip, LinkClass::NVLink));
    s.intraLink = l;
    if (auto err = parseNvlink(*intra, ip, s))
      return err;
    warnUnknown(*intra, ip,
                {"kind", "bandwidth_gbps", "latency_us", "connections"});
  } else if (kind == "pcie") {
    s.intra = IntraKind::Pcie;
    SOAP_TRY(l, link(*intra, ip, LinkClass::PCIe));
    s.intraLink = l;
    if (auto err = parsePcieTree(*intra, ip, s))
      return err;
    warnUnknown(
        *intra, ip,
        {"kind", "bandwidth_gbps", "latency_us", "switches", "nics_on"});
  } else {
    return r_.error(jsonPointer(ip, "kind"),
                    fmt::format("expected \"nvswitch\", \"nvlink\" or "
                                "\"pcie\", got \"{}\"",
                                kind));
  }
  if (s.intra != IntraKind::Pcie) {
    // NVLink fabrics carry GPU-to-GPU traffic; PCIe still joins each GPU to
    // the host and to its NIC.
    SOAP_TRY(pcie, r_.object(node, "/node", "pcie"));
    SOAP_TRY(l, link(*pcie, "/node/pcie", LinkClass::PCIe));
    s.pcie = l;
    warnUnknown(*pcie, "/node/pcie", {"bandwidth_gbps", "latency_us"});
    warnUnknown(node, "/node", {"gpus", "intra", "pcie"});
  } else {
    warnUnknown(node, "/node", {"gpus", "intra"});
  }
  return llvm::Error::success();
}

llvm::Error Loader::parseNicPlacement(const Json &doc, Spec &s) const {
  if (s.intra != IntraKind::Pcie) {
    if (s.nics > 0 && s.gpus % s.nics != 0)
      return r_.error("/inter/nics_per_node",
                      fmt::format("must divide node.gpus ({}) so that every "
                                  "NIC serves as many gpus, got {}",
                                  s.gpus, s.nics));
    return llvm::Error::success();
  }
  const Json &intra = doc["node"]["intra"];
  const std::string ptr = "/node/intra/nics_on";
  s.nicSwitch.assign(size_t(s.nics), 0); // default: the root
  if (!intra.contains("nics_on"))
    return llvm::Error::success();
  if (s.nics == 0) {
    spdlog::warn("{}: {}: no inter-node network, so no NICs to place "
                 "(ignored)",
                 r_.file(), ptr);
    return llvm::Error::success();
  }
  SOAP_TRY(list, r_.array(intra, "/node/intra", "nics_on"));
  if (int64_t(list->size()) != s.nics)
    return r_.error(ptr, fmt::format("expected one switch id per NIC ({}), "
                                     "got {}",
                                     s.nics, list->size()));
  for (size_t k = 0; k < list->size(); ++k) {
    const Json &v = (*list)[k];
    int found = -1;
    for (size_t i = 0; i < s.switches.size() && v.is_string(); ++i)
      if (s.switches[i].id == v.get<std::string>())
        found = int(i);
    if (found < 0)
      return r_.error(jsonPointer(ptr, k),
                      v.is_string() ? fmt::format("unknown switch '{}'",
                                                  v.get<std::string>())
                                    : std::string("expected a switch id"));
    s.nicSwitch[k] = found;
  }
  return llvm::Error::success();
}

llvm::Error Loader::parseNccl(const Json &doc, Spec &s) const {
  const std::string ptr = "/nccl";
  SOAP_TRY(nccl, r_.object(doc, "", "nccl"));
  NcclCalibration &c = s.nccl;
  c.enabled = true;
  if (nccl->contains("launch_us")) {
    SOAP_TRY(us, r_.inRange(*nccl, ptr, "launch_us", 0, 1e6,
                            "microseconds (a collective's fixed cost)"));
    c.launch = usToSeconds(us);
  }
  if (nccl->contains("nvls_efficiency")) {
    if (s.intra != IntraKind::NVSwitch)
      return r_.error(jsonPointer(ptr, "nvls_efficiency"),
                      "NVLink SHARP needs an NVSwitch node (node.intra.kind "
                      "\"nvswitch\")");
    SOAP_TRY(e, r_.inRange(*nccl, ptr, "nvls_efficiency", 0.01, 1,
                           "(a fraction of the NVSwitch link bandwidth)"));
    c.nvlsEfficiency = e;
  }
  if (nccl->contains("nvls_step_latency_us")) {
    if (c.nvlsEfficiency <= 0)
      return r_.error(jsonPointer(ptr, "nvls_step_latency_us"),
                      "needs nvls_efficiency (NVLink SHARP) beside it");
    SOAP_TRY(us, r_.inRange(*nccl, ptr, "nvls_step_latency_us", 0, 1e6,
                            "microseconds (an NVLS step's latency)"));
    c.nvlsStepLatency = usToSeconds(us);
  }
  if (nccl->contains("links")) {
    SOAP_TRY(links, r_.object(*nccl, ptr, "links"));
    std::string lptr = jsonPointer(ptr, "links");
    for (auto it = links->begin(); it != links->end(); ++it) {
      std::string p = jsonPointer(lptr, it.key());
      auto cls = parseLinkClass(it.key());
      if (!cls)
        return r_.error(p, "unknown link class; known: nvlink, nvswitch, "
                           "pcie, socket, network, uplink");
      if (!it.value().is_object())
        return r_.error(p, "expected an object");
      const Json &l = it.value();
      if (l.contains("efficiency")) {
        SOAP_TRY(e, r_.inRange(l, p, "efficiency", 0.01, 1,
                               "(a fraction of the link's bandwidth)"));
        c.efficiency[size_t(*cls)] = e;
      }
      if (l.contains("step_latency_us")) {
        SOAP_TRY(us, r_.inRange(l, p, "step_latency_us", 0, 1e6,
                                "microseconds (a pipeline step's latency)"));
        c.stepLatency[size_t(*cls)] = usToSeconds(us);
      }
      warnUnknown(l, p, {"efficiency", "step_latency_us"});
    }
  }
  warnUnknown(*nccl, ptr,
              {"launch_us", "nvls_efficiency", "nvls_step_latency_us",
               "links"});
  return llvm::Error::success();
}

llvm::Expected<Topology> Loader::load(const Json &doc) {
  Spec s;
  if (!doc.is_object())
    return r_.error("", "expected a topology object");
  SOAP_TRY(name, r_.string(doc, "", "name"));
  s.name = name;
  if (doc.contains("description")) {
    SOAP_TRY(d, r_.string(doc, "", "description"));
    s.description = d;
  }
  SOAP_TRY(device, r_.string(doc, "", "device"));
  const DeviceSpec *spec = findDevice(device);
  if (!spec)
    return r_.error("/device", fmt::format("unknown device type '{}'; known: "
                                           "{}",
                                           device, knownDeviceNames()));
  s.device = *spec;
  if (doc.contains("device_memory_gib")) {
    SOAP_TRY(gib, r_.inRange(doc, "", "device_memory_gib", 1.0 / 16, 16384,
                             "GiB (a device's memory)"));
    s.device.memoryBytes = Bytes(gib * kBytesPerGiB);
  }
  SOAP_TRY(nodes, r_.integer(doc, "", "nodes", 1));
  s.nodes = nodes;
  SOAP_TRY(node, r_.object(doc, "", "node"));
  if (auto err = parseNode(*node, s))
    return llvm::Error(std::move(err));
  // Division, not multiplication: nodes may be near INT64_MAX.
  if (s.nodes > kMaxDevices / s.gpus)
    return r_.error("/nodes", fmt::format("{} nodes of {} gpus is more than "
                                          "the {} devices soapc supports",
                                          s.nodes, s.gpus, kMaxDevices));
  if (doc.contains("inter")) {
    SOAP_TRY(inter, r_.object(doc, "", "inter"));
    SOAP_TRY(nics, r_.integer(*inter, "/inter", "nics_per_node", 1));
    s.nics = nics;
    SOAP_TRY(l, link(*inter, "/inter", LinkClass::Network));
    s.nic = l;
    warnUnknown(*inter, "/inter",
                {"nics_per_node", "bandwidth_gbps", "latency_us"});
  } else if (s.nodes > 1) {
    return r_.error("/inter", fmt::format("missing: {} nodes need an "
                                          "inter-node network, else devices "
                                          "on different nodes have no route",
                                          s.nodes));
  }
  if (auto err = parseNicPlacement(doc, s))
    return llvm::Error(std::move(err));
  if (doc.contains("racks")) {
    SOAP_TRY(racks, r_.object(doc, "", "racks"));
    SOAP_TRY(per, r_.integer(*racks, "/racks", "nodes_per_rack", 1));
    s.nodesPerRack = per;
    SOAP_TRY(l, link(*racks, "/racks", LinkClass::Uplink,
                     "uplink_bandwidth_gbps", "uplink_latency_us"));
    s.rackUplink = l;
    warnUnknown(
        *racks, "/racks",
        {"nodes_per_rack", "uplink_bandwidth_gbps", "uplink_latency_us"});
    if (s.nics == 0)
      return r_.error("/inter", "missing: racks need an inter-node network");
  }
  if (doc.contains("nccl"))
    if (auto err = parseNccl(doc, s))
      return llvm::Error(std::move(err));
  warnUnknown(doc, "",
              {"$schema", "name", "description", "device", "device_memory_gib",
               "nodes", "node", "inter", "racks", "nccl"});
  return build(s);
}

llvm::Expected<Topology> Loader::build(const Spec &s) const {
  Topology t;
  t.setName(s.name);
  t.setDescription(s.description);
  t.setDeviceSpec(s.device);
  t.setNccl(s.nccl);
  t.setIntraKind(s.intra == IntraKind::NVSwitch ? "nvswitch"
                 : s.intra == IntraKind::NVLink ? "nvlink"
                                                : "pcie tree");
  int64_t racks =
      s.nodesPerRack ? (s.nodes + s.nodesPerRack - 1) / s.nodesPerRack : 1;
  std::vector<VertexId> leaves;
  if (s.nics > 0) {
    for (int64_t r = 0; r < racks; ++r)
      leaves.push_back(t.addVertex(VertexKind::NetworkSwitch,
                                   fmt::format("rack{}.leaf", r), -1,
                                   int32_t(r)));
    if (racks > 1) {
      VertexId spine = t.addVertex(VertexKind::Spine, "spine", -1, -1);
      for (VertexId leaf : leaves)
        t.addLink(leaf, spine, LinkClass::Uplink,
                  s.rackUplink.bandwidthBytesPerSec, s.rackUplink.latency);
    }
  }
  auto addLink = [&](VertexId a, VertexId b, const LinkSpec &l) {
    t.addLink(a, b, l.cls, l.bandwidthBytesPerSec, l.latency);
  };
  uint32_t groupsPerNode = 1;
  if (s.intra == IntraKind::Pcie) {
    groupsPerNode = 0;
    for (const PcieSwitchSpec &sw : s.switches)
      groupsPerNode += !sw.gpus.empty();
  }
  for (int64_t n = 0; n < s.nodes; ++n) {
    int32_t node = int32_t(n);
    int32_t rack = int32_t(s.nodesPerRack ? n / s.nodesPerRack : 0);
    std::string pre = fmt::format("n{}.", n);
    std::vector<VertexId> gpus;
    for (int64_t g = 0; g < s.gpus; ++g)
      gpus.push_back(t.addVertex(VertexKind::Device,
                                 pre + fmt::format("gpu{}", g), node, rack));
    std::vector<uint32_t> groupOf(s.gpus, uint32_t(n) * groupsPerNode);
    std::vector<VertexId> nics;
    for (int64_t k = 0; k < s.nics; ++k) {
      nics.push_back(t.addVertex(VertexKind::Nic, pre + fmt::format("nic{}", k),
                                 node, rack));
      addLink(nics.back(), leaves[rack], s.nic);
    }
    if (s.intra == IntraKind::Pcie) {
      std::vector<VertexId> sw;
      uint32_t group = uint32_t(n) * groupsPerNode;
      for (const PcieSwitchSpec &spec : s.switches) {
        sw.push_back(t.addVertex(spec.kind, pre + spec.id, node, rack));
        if (spec.gpus.empty())
          continue;
        t.setSwitchGroupName(group, pre + spec.id);
        for (int64_t g : spec.gpus) {
          addLink(gpus[g], sw.back(), s.intraLink);
          groupOf[g] = group;
        }
        ++group;
      }
      for (size_t i = 0; i < s.switches.size(); ++i)
        if (s.switches[i].parent >= 0)
          addLink(sw[i], sw[s.switches[i].parent], s.switches[i].uplink);
      for (int64_t k = 0; k < s.nics; ++k)
        addLink(nics[k], sw[s.nicSwitch[k]], s.intraLink);
    } else {
      // NVLink/NVSwitch node: one NVLink domain. Each NIC sits with its rail
      // of gpus (nics divides gpus) under one PCIe switch, as on DGX
      // systems, so gpu g reaches NIC g * nics / gpus first.
      uint32_t group = uint32_t(n);
      if (s.intra == IntraKind::NVSwitch) {
        VertexId nvs =
            t.addVertex(VertexKind::NVSwitch, pre + "nvswitch", node, rack);
        t.setSwitchGroupName(group, pre + "nvswitch");
        for (VertexId g : gpus)
          addLink(g, nvs, s.intraLink);
      } else {
        t.setSwitchGroupName(group, pre + "nvlink");
        for (const NvlinkConnection &c : s.nvlinks)
          t.addLink(gpus[c.a], gpus[c.b], LinkClass::NVLink,
                    s.intraLink.bandwidthBytesPerSec * double(c.links),
                    s.intraLink.latency);
      }
      VertexId cpu = t.addVertex(VertexKind::Cpu, pre + "cpu", node, rack);
      int64_t rails = std::max<int64_t>(s.nics, 1);
      std::vector<VertexId> psw;
      for (int64_t k = 0; k < rails; ++k) {
        psw.push_back(t.addVertex(VertexKind::PcieSwitch,
                                  pre + fmt::format("pcie{}", k), node, rack));
        addLink(psw.back(), cpu, s.pcie);
        if (k < s.nics)
          addLink(nics[k], psw.back(), s.pcie);
      }
      for (int64_t g = 0; g < s.gpus; ++g)
        addLink(gpus[g], psw[g * rails / s.gpus], s.pcie);
    }
    for (int64_t g = 0; g < s.gpus; ++g)
      t.addDevice(gpus[g], uint32_t(n), uint32_t(g), groupOf[g],
                  uint32_t(rack));
  }
  if (auto err = t.finalize())
    return r_.error("", errorMessage(std::move(err)));
  return t;
}

llvm::Expected<Topology> parseTopology(const Json &doc, llvm::StringRef file) {
  return Loader(file).load(doc);
}

llvm::Expected<Topology> loadTopology(llvm::StringRef path) {
  auto doc = readJsonFile(path);
  if (!doc)
    return doc.takeError();
  return parseTopology(*doc, path);
}

#undef SOAP_TRY

} // namespace soap
