// Enumerating the op-tile signatures of a configuration space.
#include "SignatureSet.h"

#include "soap/Cost/OpSignature.h"
#include "soap/Import/OnnxImporter.h"
#include "soap/Machine/TopologyLoader.h"
#include "soap/Support/Error.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringExtras.h"

namespace soap {

llvm::Error EnumerateOptions::validate() const {
  if (models.empty())
    return inputError("no model given");
  if (batch < 0)
    return inputError("--batch must be at least 1, got {}", batch);
  if (microBatches.empty())
    return inputError("--micro-batches: no micro-batch count given");
  for (int64_t n : deviceCounts)
    if (n < 1 || n > kMaxDevices)
      return inputError("--devices: a device count must be in 1..{}, got {}",
                        kMaxDevices, n);
  return llvm::Error::success();
}

/// "8,16": distinct counts in 1..max, for --devices and --micro-batches.
static llvm::Expected<std::vector<int64_t>>
parseCounts(llvm::StringRef flag, llvm::StringRef what, llvm::StringRef text,
            int64_t max) {
  llvm::SmallVector<llvm::StringRef, 8> parts;
  text.split(parts, ',', -1, false);
  std::vector<int64_t> out;
  for (llvm::StringRef p : parts) {
    int64_t n;
    if (p.trim().getAsInteger(10, n) || n < 1 || n > max)
      return inputError("{} '{}': expected {} in 1..{} separated by commas, "
                        "got '{}'",
                        flag.str(), text.str(), what.str(), max,
                        p.trim().str());
    if (std::find(out.begin(), out.end(), n) != out.end())
      return inputError("{} '{}': {} given twice", flag.str(), text.str(), n);
    out.push_back(n);
  }
  if (out.empty())
    return inputError("{} '{}': no {} given", flag.str(), text.str(),
                      what.drop_back().str());
  return out;
}

llvm::Expected<std::vector<int64_t>> parseDeviceCounts(llvm::StringRef text) {
  return parseCounts("--devices", "device counts", text, kMaxDevices);
}

llvm::Expected<std::vector<int64_t>> parseMicroBatches(llvm::StringRef text) {
  return parseCounts("--micro-batches", "micro-batch counts", text,
                     int64_t(1) << 20);
}

llvm::Expected<Topology> deviceCountTopology(const DeviceSpec &spec,
                                             int64_t devices) {
  Topology t;
  t.setName(fmt::format("{}x{}", devices, spec.name.str()));
  t.setDeviceSpec(spec);
  t.setIntraKind("nvswitch");
  VertexId sw = t.addVertex(VertexKind::NVSwitch, "n0.nvswitch", 0, 0);
  t.setSwitchGroupName(0, "n0.nvswitch");
  for (int64_t d = 0; d < devices; ++d) {
    VertexId v = t.addVertex(VertexKind::Device, fmt::format("n0.gpu{}", d),
                             0, 0);
    t.addDevice(v, 0, static_cast<uint32_t>(d), 0, 0);
    t.addLink(v, sw, LinkClass::NVSwitch, 450e9, 0.5e-6);
  }
  if (auto err = t.finalize())
    return llvm::Error(std::move(err));
  return llvm::Expected<Topology>(std::move(t));
}

void SignatureSet::add(std::unique_ptr<Graph> g, const std::string &model,
                       int64_t devices, int64_t batch, SpaceKind space,
                       const Topology &topo) {
  SpaceOptions so;
  so.kind = space;
  ConfigSpace cs(*g, topo, so);
  CoverageRow row{model, devices, batch, g->numOps(), 0, 0};
  std::set<std::string> here;
  for (const Op &op : g->ops()) {
    // Replicas and placements do not change a tile: only the degrees do.
    std::set<std::vector<int32_t>> degrees;
    for (const SplitShape &s : cs.shapes(op.id))
      degrees.insert(s.first);
    row.shapes += degrees.size();
    for (const std::vector<int32_t> &deg : degrees) {
      OpConfig c;
      c.degree = deg;
      for (int64_t k = 0, n = c.numTiles(); k < n; ++k) {
        Box tile = c.tile(op.sem, k);
        std::string sig = opSignature(*g, op, tile);
        auto [it, fresh] = sigs_.try_emplace(sig);
        SignatureInfo &info = it->second;
        if (fresh) {
          info.kind = op.kind;
          info.site = SignatureSite{g.get(), op.id, tile};
        }
        info.deviceCounts.insert(devices);
        info.models.insert(model);
        ++info.tiles;
        here.insert(std::move(sig));
      }
    }
  }
  row.signatures = here.size();
  coverage_.push_back(row);
  graphs_.push_back(std::move(g));
}

void SignatureSet::addTile(const std::string &signature,
                           const std::string &kind, const SignatureSite &site,
                           const std::string &model, int64_t devices) {
  auto [it, fresh] = sigs_.try_emplace(signature);
  if (fresh) {
    it->second.kind = kind;
    it->second.site = site;
  }
  it->second.deviceCounts.insert(devices);
  it->second.models.insert(model);
  ++it->second.tiles;
}

std::map<std::string, size_t> SignatureSet::kindCounts() const {
  std::map<std::string, size_t> out;
  for (const auto &[sig, info] : sigs_)
    ++out[info.kind];
  return out;
}

llvm::Expected<SignatureSet>
SignatureSet::enumerate(const EnumerateOptions &opts, const DeviceSpec &spec,
                        int64_t topologyDevices) {
  if (auto err = opts.validate())
    return llvm::Error(std::move(err));
  std::vector<int64_t> counts = opts.deviceCounts;
  if (counts.empty())
    counts.push_back(topologyDevices);
  SignatureSet set;
  for (int64_t n : counts) {
    auto topo = deviceCountTopology(spec, n);
    if (!topo)
      return topo.takeError();
    int64_t whole = opts.batch > 0 ? opts.batch : 64 * n;
    for (int64_t m : opts.microBatches) {
    // A micro-batched plan's tiles see batch / m samples.
    if (whole % m != 0)
      continue;
    int64_t batch = whole / m;
    for (const std::string &model : opts.models) {
      ImportOptions io;
      io.batch = batch;
      io.appendLoss = opts.appendLoss;
      io.unrollRnn = opts.unrollRnn;
      io.precision = opts.precision;
      io.kernels = opts.kernels;
      auto g = importOnnx(model, io);
      if (!g)
        return g.takeError();
      set.add(std::move(*g), model, n, batch, opts.space, *topo);
    }
    }
  }
  return llvm::Expected<SignatureSet>(std::move(set));
}

} // namespace soap
