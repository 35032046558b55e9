// Loading, merging and writing cost databases (profiles/<device>.json).
#include "soap/Cost/CostDatabase.h"

#include "soap/Support/Error.h"
#include <climits>

namespace soap {

static constexpr const char *kFormat = "soapc-profile";
static constexpr int kVersion = 1;

const KernelEntry *CostDatabase::find(const std::string &signature) const {
  auto it = kernels_.find(signature);
  return it == kernels_.end() ? nullptr : &it->second;
}

void CostDatabase::add(const std::string &signature, KernelEntry e) {
  kernels_[signature] = e;
}

llvm::Error CostDatabase::merge(const CostDatabase &other) {
  if (!env.device.empty() && !other.env.device.empty() &&
      env.device != other.env.device)
    return inputError("cannot merge a profile of '{}' into one of '{}'",
                      other.env.device, env.device);
  if (!env.math.empty() && !other.env.math.empty() && env.math != other.env.math)
    return inputError("cannot merge a profile measured with {} arithmetic into "
                      "one measured with {}",
                      other.env.math, env.math);
  if (env.device.empty())
    env = other.env;
  else
    // The newer measurement's software versions describe the merged file.
    for (auto [mine, theirs] :
         {std::pair{&env.gpuName, &other.env.gpuName},
          {&env.driver, &other.env.driver}, {&env.cuda, &other.env.cuda},
          {&env.cudnn, &other.env.cudnn}, {&env.cublas, &other.env.cublas},
          {&env.math, &other.env.math}, {&env.cpuName, &other.env.cpuName},
          {&env.libraries, &other.env.libraries}})
      if (!theirs->empty())
        *mine = *theirs;
  for (auto [mine, theirs] :
       {std::pair{&env.cores, &other.env.cores},
        {&env.ranks, &other.env.ranks},
        {&env.threadsPerRank, &other.env.threadsPerRank}})
    if (*theirs > 0)
      *mine = *theirs;
  for (const auto &[sig, e] : other.kernels_)
    kernels_[sig] = e;
  if (other.memoryBandwidthBytesPerSec > 0)
    memoryBandwidthBytesPerSec = other.memoryBandwidthBytesPerSec;
  for (const auto &[k, v] : other.gemmFlopsPerSec)
    gemmFlopsPerSec[k] = v;
  for (const auto &[k, v] : other.computeEfficiency)
    computeEfficiency[k] = v;
  if (other.memoryEfficiency > 0)
    memoryEfficiency = other.memoryEfficiency;
  for (const auto &[key, curve] : other.collectives.curves())
    collectives.add(curve);
  return llvm::Error::success();
}

llvm::Expected<CostDatabase> CostDatabase::load(llvm::StringRef path) {
  auto doc = readJsonFile(path);
  if (!doc)
    return doc.takeError();
  return fromJson(*doc, JsonReader(path.str()));
}

namespace {
llvm::Error fraction(const JsonReader &r, const Json &obj, const std::string &ptr,
                     const std::string &key, double &out) {
  auto v = r.positive(obj, ptr, key);
  if (!v)
    return v.takeError();
  if (*v > 1)
    return r.error(jsonPointer(ptr, key),
                   fmt::format("a fraction of peak must be at most 1, got {}",
                               *v));
  out = *v;
  return llvm::Error::success();
}
} // namespace

llvm::Expected<CostDatabase> CostDatabase::fromJson(const Json &doc,
                                                    const JsonReader &r) {
  CostDatabase db;
  auto format = r.string(doc, "", "format");
  if (!format)
    return format.takeError();
  if (*format != kFormat)
    return r.error("/format", fmt::format("expected \"{}\", got \"{}\"",
                                          kFormat, *format));
  auto version = r.integer(doc, "", "version", 1);
  if (!version)
    return version.takeError();
  if (*version != kVersion)
    return r.error("/version",
                   fmt::format("unsupported version {}", *version));
  auto dev = r.object(doc, "", "device");
  if (!dev)
    return dev.takeError();
  auto name = r.string(**dev, "/device", "name");
  if (!name)
    return name.takeError();
  db.env.device = *name;
  for (auto [key, field] :
       {std::pair{"gpu_name", &db.env.gpuName}, {"driver", &db.env.driver},
        {"cuda", &db.env.cuda}, {"cudnn", &db.env.cudnn},
        {"cublas", &db.env.cublas}, {"math", &db.env.math},
        {"cpu_name", &db.env.cpuName}, {"libraries", &db.env.libraries}}) {
    if (!(*dev)->contains(key))
      continue;
    auto v = r.string(**dev, "/device", key);
    if (!v)
      return v.takeError();
    *field = *v;
  }
  for (auto [key, field] :
       {std::pair{"cores", &db.env.cores}, {"ranks", &db.env.ranks},
        {"threads_per_rank", &db.env.threadsPerRank}}) {
    if (!(*dev)->contains(key))
      continue;
    auto v = r.integer(**dev, "/device", key, 1);
    if (!v)
      return v.takeError();
    *field = *v;
  }
  if (doc.contains("calibration")) {
    auto cal = r.object(doc, "", "calibration");
    if (!cal)
      return cal.takeError();
    if ((*cal)->contains("memory_bandwidth_bytes_per_sec")) {
      auto bw = r.positive(**cal, "/calibration",
                           "memory_bandwidth_bytes_per_sec");
      if (!bw)
        return bw.takeError();
      db.memoryBandwidthBytesPerSec = *bw;
    }
    if ((*cal)->contains("gemm_flops_per_sec")) {
      auto g = r.object(**cal, "/calibration", "gemm_flops_per_sec");
      if (!g)
        return g.takeError();
      for (const auto &[k, v] : (*g)->items()) {
        auto f = r.positive(**g, "/calibration/gemm_flops_per_sec", k);
        if (!f)
          return f.takeError();
        db.gemmFlopsPerSec[k] = *f;
      }
    }
  }
  if (doc.contains("defaults")) {
    auto d = r.object(doc, "", "defaults");
    if (!d)
      return d.takeError();
    if ((*d)->contains("compute_efficiency")) {
      auto ce = r.object(**d, "/defaults", "compute_efficiency");
      if (!ce)
        return ce.takeError();
      for (const auto &[k, v] : (*ce)->items()) {
        double f;
        if (auto err = fraction(r, **ce, "/defaults/compute_efficiency", k, f))
          return llvm::Error(std::move(err));
        db.computeEfficiency[k] = f;
      }
    }
    if ((*d)->contains("memory_efficiency"))
      if (auto err = fraction(r, **d, "/defaults", "memory_efficiency",
                              db.memoryEfficiency))
        return llvm::Error(std::move(err));
  }
  if (doc.contains("kernels")) {
    auto ks = r.array(doc, "", "kernels");
    if (!ks)
      return ks.takeError();
    for (size_t i = 0; i < (*ks)->size(); ++i) {
      const Json &k = (**ks)[i];
      std::string ptr = jsonPointer("/kernels", i);
      auto sig = r.string(k, ptr, "signature");
      if (!sig)
        return sig.takeError();
      KernelEntry e;
      for (auto [key, field] : {std::pair{"forward_s", &e.forward},
                                {"backward_data_s", &e.backwardData},
                                {"backward_weight_s", &e.backwardWeight}}) {
        auto v = r.number(k, ptr, key, 0);
        if (!v)
          return v.takeError();
        *field = *v;
      }
      if (k.contains("workspace_bytes")) {
        auto w = r.integer(k, ptr, "workspace_bytes", 0);
        if (!w)
          return w.takeError();
        e.workspace = *w;
      }
      if (k.contains("repeats")) {
        auto n = r.integer(k, ptr, "repeats", 1);
        if (!n)
          return n.takeError();
        if (*n > INT_MAX)
          return r.error(jsonPointer(ptr, "repeats"),
                         fmt::format("{} is more than {}", *n, INT_MAX));
        e.repeats = static_cast<int>(*n);
      }
      for (auto [key, arr] : {std::pair{"flops", e.flops},
                              {"bytes", e.bytes},
                              {"launch_s", e.launch}}) {
        if (!k.contains(key))
          continue;
        auto a = r.array(k, ptr, key);
        if (!a)
          return a.takeError();
        if ((*a)->size() != 3)
          return r.error(jsonPointer(ptr, key),
                         "expected 3 numbers (forward, backward-data, "
                         "backward-weight)");
        for (size_t p = 0; p < 3; ++p) {
          const Json &x = (**a)[p];
          if (!x.is_number() || !(x.get<double>() >= 0))
            return r.error(jsonPointer(jsonPointer(ptr, key), p),
                           "expected a non-negative number");
          arr[p] = x.get<double>();
        }
      }
      if (db.kernels_.count(*sig))
        return r.error(jsonPointer(ptr, "signature"),
                       "duplicate signature '" + *sig + "'");
      db.kernels_[*sig] = e;
    }
  }
  if (doc.contains("collectives")) {
    auto cs = r.array(doc, "", "collectives");
    if (!cs)
      return cs.takeError();
    auto prof = CollectiveProfile::fromJson(**cs, r, "/collectives");
    if (!prof)
      return prof.takeError();
    db.collectives = std::move(*prof);
  }
  return db;
}

Json CostDatabase::toJson() const {
  Json kernels = Json::array();
  for (const auto &[sig, e] : kernels_) {
    Json k = {{"signature", sig},
              {"forward_s", e.forward},
              {"backward_data_s", e.backwardData},
              {"backward_weight_s", e.backwardWeight},
              {"workspace_bytes", e.workspace},
              {"flops", {e.flops[0], e.flops[1], e.flops[2]}},
              {"bytes", {e.bytes[0], e.bytes[1], e.bytes[2]}}};
    // 0 = unknown (the file gave none); the reader wants at least 1.
    if (e.repeats > 0)
      k["repeats"] = e.repeats;
    if (e.launch[0] > 0 || e.launch[1] > 0 || e.launch[2] > 0)
      k["launch_s"] = {e.launch[0], e.launch[1], e.launch[2]};
    kernels.push_back(std::move(k));
  }
  Json device = {{"name", env.device}};
  for (auto [key, v] : {std::pair{"gpu_name", &env.gpuName},
                        {"driver", &env.driver}, {"cuda", &env.cuda},
                        {"cudnn", &env.cudnn}, {"cublas", &env.cublas},
                        {"math", &env.math}, {"cpu_name", &env.cpuName},
                        {"libraries", &env.libraries}})
    if (!v->empty())
      device[key] = *v;
  for (auto [key, v] : {std::pair{"cores", env.cores}, {"ranks", env.ranks},
                        {"threads_per_rank", env.threadsPerRank}})
    if (v > 0)
      device[key] = v;
  Json doc = {{"format", kFormat},
              {"version", kVersion},
              {"device", device},
              {"kernels", kernels}};
  Json cal = Json::object();
  if (memoryBandwidthBytesPerSec > 0)
    cal["memory_bandwidth_bytes_per_sec"] = memoryBandwidthBytesPerSec;
  if (!gemmFlopsPerSec.empty())
    cal["gemm_flops_per_sec"] = gemmFlopsPerSec;
  if (!cal.empty())
    doc["calibration"] = cal;
  Json defaults = Json::object();
  if (!computeEfficiency.empty())
    defaults["compute_efficiency"] = computeEfficiency;
  if (memoryEfficiency > 0)
    defaults["memory_efficiency"] = memoryEfficiency;
  if (!defaults.empty())
    doc["defaults"] = defaults;
  if (!collectives.empty())
    doc["collectives"] = collectives.toJson();
  return doc;
}

llvm::Error CostDatabase::save(llvm::StringRef path) const {
  return writeFileAtomic(path, dumpJson(toJson()));
}

} // namespace soap
