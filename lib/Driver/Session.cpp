// The session behind every subcommand: options checked, inputs loaded, and
// plans read and written with the inputs they record.
#include "soap/Driver/Session.h"

#include "soap/Driver/Layout.h"
#include "soap/Import/OnnxImporter.h"
#include "soap/Machine/TopologyLoader.h"
#include "soap/Support/Cores.h"
#include "soap/Support/Error.h"
#include "soap/Support/Sha256.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Process.h"
#include <algorithm>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace soap {

/// `given`, or `dir`/`given`.json when `given` names no file but a bundled
/// one (a bare name, no folder or suffix).
static std::string resolveBundled(const std::string &given, const char *dir) {
  if (given.empty() || given == "-" || llvm::sys::fs::exists(given) ||
      given.find('/') != std::string::npos ||
      llvm::StringRef(given).endswith(".json"))
    return given;
  llvm::SmallString<256> p(dir);
  llvm::sys::path::append(p, given + ".json");
  return llvm::sys::fs::exists(p) ? std::string(p) : given;
}

/// The bundled names in `dir` (its *.json files), for an error message.
static std::string bundledNames(const char *dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (llvm::sys::fs::directory_iterator it(dir, ec), end; !ec && it != end;
       it.increment(ec))
    if (llvm::StringRef(it->path()).endswith(".json"))
      names.push_back(llvm::sys::path::stem(it->path()).str());
  std::sort(names.begin(), names.end());
  std::string out;
  for (const std::string &n : names)
    out += (out.empty() ? "" : ", ") + n;
  return out;
}

std::string resolveTopologyPath(const std::string &given) {
  return resolveBundled(given, SOAP_TOPOLOGIES_DIR);
}

std::string resolveProfilePath(const std::string &given) {
  return resolveBundled(given, SOAP_PROFILES_DIR);
}

/// A path that is neither a file nor a bundled name: say which names are.
static llvm::Error checkBundled(const std::string &path, llvm::StringRef flag,
                                const char *dir, llvm::StringRef what) {
  if (path.empty() || llvm::sys::fs::exists(path) ||
      path.find('/') != std::string::npos ||
      llvm::StringRef(path).endswith(".json"))
    return llvm::Error::success();
  return inputError("{} {}: no such file, nor a bundled {} of that name (the "
                    "bundled ones: {})",
                    flag.str(), path, what.str(), bundledNames(dir));
}

llvm::Expected<Topology> loadTopologyArg(const std::string &given) {
  std::string path = resolveTopologyPath(given);
  if (auto err =
          checkBundled(path, "--topology", SOAP_TOPOLOGIES_DIR, "cluster"))
    return llvm::Error(std::move(err));
  return loadTopology(path);
}

int64_t effectiveBatch(const DriverOptions &o, int64_t devices) {
  return o.batch && *o.batch > 0 ? *o.batch : kSamplesPerDevice * devices;
}

llvm::Expected<std::unique_ptr<Graph>> loadModel(const DriverOptions &o,
                                                 int64_t devices) {
  if (o.modelPath.empty())
    return inputError("no model given");
  if (o.batch && *o.batch <= 0)
    return inputError("--batch must be at least 1, got {}", *o.batch);
  std::string precision = o.precision.value_or("fp32");
  auto prec = parsePrecision(precision);
  if (!prec)
    return inputError("--precision must be fp32, bf16 or fp8, got '{}'",
                      precision);
  ImportOptions opts;
  opts.batch = effectiveBatch(o, devices);
  opts.appendLoss = !o.noLoss.value_or(false);
  opts.unrollRnn = o.unrollRnn.value_or(false);
  opts.precision = *prec;
  std::string kernels = o.kernels.value_or("fused");
  auto mode = parseKernelMode(kernels);
  if (!mode)
    return inputError("--kernels must be fused, no-flash or eager, got '{}'",
                      kernels);
  opts.kernels = *mode;
  return importOnnx(o.modelPath, opts);
}

/// The cost database for a device: --profile, else the source tree's
/// profiles/<device>.json when it exists.
static llvm::Expected<std::optional<CostDatabase>>
loadProfile(const DriverOptions &o, llvm::StringRef device) {
  std::string path = resolveProfilePath(o.profilePath);
  if (auto err = checkBundled(path, "--profile", SOAP_PROFILES_DIR, "profile"))
    return llvm::Error(std::move(err));
  if (path.empty()) {
    llvm::SmallString<256> p(SOAP_PROFILES_DIR);
    llvm::sys::path::append(p, llvm::StringRef(device).lower() + ".json");
    if (!llvm::sys::fs::exists(p))
      return std::nullopt;
    path = std::string(p);
  }
  auto db = CostDatabase::load(path);
  if (!db)
    return db.takeError();
  if (db->env.device != device)
    return inputError("{}: a profile of '{}', but the topology's devices are "
                      "'{}'",
                      path, db->env.device, device.str());
  return std::optional<CostDatabase>(std::move(*db));
}

/// The catalog's devices with FP8 tensor cores, for the error message.
static std::string fp8DeviceNames() {
  std::string out;
  for (const DeviceSpec &d : deviceCatalog())
    if (d.peakFlopsPerSec(PeakFormat::FP8) > 0)
      out += (out.empty() ? "" : ", ") + d.name.str();
  return out;
}

llvm::Expected<std::unique_ptr<Session>> Session::open(const DriverOptions &o) {
  if (o.topologyPath.empty())
    return inputError("--topology is required");
  std::string costModel = o.costModel.value_or("profile");
  auto mode = parseCostMode(costModel);
  if (!mode)
    return inputError("--cost-model must be analytic, profile or strict, got "
                      "'{}'",
                      costModel);
  std::string optimizer = o.optimizer.value_or("sgd");
  auto opt = parseOptimizer(optimizer);
  if (!opt)
    return inputError("--optimizer must be sgd, momentum or adam, got '{}'",
                      optimizer);
  auto topo = loadTopologyArg(o.topologyPath);
  if (!topo)
    return topo.takeError();
  auto s = std::make_unique<Session>();
  s->options = o;
  s->mode = *mode;
  s->optimizer = *opt;
  s->topo = std::make_unique<Topology>(std::move(*topo));
  const DeviceSpec &device = s->topo->deviceSpec();
  if (o.precision && *o.precision == "fp8" &&
      device.peakFlopsPerSec(PeakFormat::FP8) <= 0)
    return inputError("{}: --precision fp8: the device '{}' has no FP8 "
                      "tensor cores (FP8 needs Hopper or later: {})",
                      resolveTopologyPath(o.topologyPath), device.name.str(),
                      fp8DeviceNames());
  auto db = loadProfile(o, device.name);
  if (!db)
    return db.takeError();
  s->db = std::move(*db);
  int64_t devices = static_cast<int64_t>(s->topo->numDevices());
  auto g = loadModel(o, devices);
  if (!g)
    return g.takeError();
  s->graph = std::move(*g);
  s->batch = effectiveBatch(o, devices);
  s->cost = std::make_unique<CostModel>(s->topo->deviceSpec(),
                                        s->db ? &*s->db : nullptr, s->mode);
  s->collectives = std::make_unique<CollectiveModel>(
      *s->topo, s->db ? &s->db->collectives : nullptr);
  return s;
}

std::string assumptions(const Session &s) {
  int64_t devices = int64_t(s.topo->numDevices());
  std::string perDevice =
      s.batch % devices == 0
          ? std::to_string(s.batch / devices)
          : fmt::format("{:.2f}", double(s.batch) / double(devices));
  return fmt::format("{}, optimizer {}, batch {} ({} samples per device)",
                     precisionName(s.graph->precision()).str(),
                     optimizerName(s.optimizer).str(), s.batch, perDevice);
}

void warnIdle(const Session &s, const Layout &l) {
  std::string w = idleWarning(l, s.topo->numDevices());
  if (!w.empty())
    spdlog::warn("{}", w);
}

void adoptPlanInputs(DriverOptions &o, const Plan &plan, bool paths) {
  const PlanInputs &in = plan.inputs;
  if (paths && o.modelPath.empty())
    o.modelPath = in.modelPath;
  if (paths && o.topologyPath.empty())
    o.topologyPath = in.topologyPath;
  if (!o.batch)
    o.batch = in.batch;
  if (!o.unrollRnn)
    o.unrollRnn = in.unrollRnn;
  if (!o.noLoss)
    o.noLoss = !in.appendLoss;
  if (!o.costModel)
    o.costModel = in.costModel;
  if (!o.optimizer)
    o.optimizer = in.optimizer;
  if (!o.precision)
    o.precision = in.precision;
  if (!o.kernels)
    o.kernels = in.kernels;
}

llvm::Expected<SearchOptions> searchOptions(const DriverOptions &d,
                                            bool progress) {
  SearchOptions o;
  auto b = Budget::parse(d.budget);
  if (!b)
    return b.takeError();
  o.budget = *b;
  o.seed = d.seed;
  auto space = parseSpaceKind(d.space);
  if (!space)
    return inputError("--space must be flexflow or full, got '{}'", d.space);
  o.space.kind = *space;
  o.chains = d.chains;
  o.threads = d.threads == 0 ? std::min(256, availableCores()) : d.threads;
  o.beta = d.beta;
  if (!d.timeout.empty()) {
    auto t = parseDuration(d.timeout, "--timeout");
    if (!t)
      return t.takeError();
    o.timeoutSeconds = *t;
  }
  if (auto err = o.validate())
    return llvm::Error(std::move(err));
  if (progress && llvm::sys::Process::StandardErrIsDisplayed() && !d.quiet)
    o.progress = [](const SearchProgress &p) {
      llvm::errs() << fmt::format(
          "\rbest {:.3f} ms  {} proposals  {:.0f}/s  acceptance {:.0f}%   ",
          p.best * 1e3, p.proposals,
          p.elapsedSeconds > 0 ? p.proposals / p.elapsedSeconds : 0.0,
          100 * p.acceptanceRate);
    };
  return o;
}

llvm::Error checkOutputPath(llvm::StringRef flag, llvm::StringRef path) {
  if (path.empty() || path == "-")
    return llvm::Error::success();
  if (llvm::sys::fs::is_directory(path))
    return inputError("{} {}: a directory, not a file", flag.str(), path.str());
  llvm::SmallString<256> dir(path);
  llvm::sys::path::remove_filename(dir);
  if (dir.empty())
    dir = ".";
  if (!llvm::sys::fs::is_directory(dir))
    return inputError("{} {}: no such directory '{}'", flag.str(), path.str(),
                      dir.str().str());
  // Written atomically (a temporary file beside it, then renamed): the
  // folder must be writable, and an existing file too.
  if (llvm::sys::fs::access(dir, llvm::sys::fs::AccessMode::Write))
    return inputError("{} {}: the directory '{}' is not writable", flag.str(),
                      path.str(), dir.str().str());
  if (llvm::sys::fs::exists(path) &&
      llvm::sys::fs::access(path, llvm::sys::fs::AccessMode::Write))
    return inputError("{} {}: the file is not writable", flag.str(),
                      path.str());
  return llvm::Error::success();
}

llvm::Expected<InputDigests> inputDigests(const DriverOptions &o) {
  auto model = sha256File(o.modelPath);
  if (!model)
    return model.takeError();
  auto topology = sha256File(resolveTopologyPath(o.topologyPath));
  if (!topology)
    return topology.takeError();
  return InputDigests{std::move(*model), std::move(*topology)};
}

llvm::Error writeSearchPlan(const Session &s, const Strategy &strategy,
                            const SimMetrics &m, Seconds dpTime,
                            const std::string &searcher, uint64_t seed,
                            const std::string &path,
                            const SearchOutcome *outcome,
                            llvm::raw_ostream *pathTo) {
  const DriverOptions &o = s.options;
  auto digests = inputDigests(o);
  if (!digests)
    return digests.takeError();
  PlanInputs in;
  in.modelPath = o.modelPath;
  in.modelSha256 = digests->model;
  in.batch = s.batch;
  in.unrollRnn = o.unrollRnn.value_or(false);
  in.appendLoss = !o.noLoss.value_or(false);
  in.topologyPath = o.topologyPath;
  in.topologySha256 = digests->topology;
  in.searcher = searcher;
  in.seed = seed;
  in.budget = o.budget;
  in.space = o.space;
  in.costModel = o.costModel.value_or("profile");
  in.optimizer = o.optimizer.value_or("sgd");
  in.precision = o.precision.value_or("fp32");
  in.kernels = o.kernels.value_or("fused");
  if (outcome) {
    in.interrupted = outcome->interrupted;
    // What ran, not the budget, when --timeout cut it short.
    in.timedOut = outcome->timedOut;
    in.proposalsRun = outcome->timedOut ? outcome->result.proposals : 0;
  }
  Plan plan = makePlan(*s.graph, *s.topo, strategy, in,
                       planFigures(m, s.batch, dpTime));
  if (auto err = writePlan(plan, path))
    return err;
  // With --format csv or json stdout holds the figures alone (a parser
  // reads them), so the plan's path goes to stderr.
  if (path != "-")
    (pathTo ? *pathTo
     : o.format == OutputFormat::Csv || o.format == OutputFormat::Json
         ? llvm::errs()
         : llvm::outs())
        << "plan: " << path << "\n";
  return llvm::Error::success();
}

llvm::Expected<PlanSession> openPlan(const DriverOptions &given,
                                     llvm::StringRef planPath) {
  auto plan = readPlan(planPath);
  if (!plan)
    return plan.takeError();
  // A batch other than the plan's splits its ops otherwise: refused
  // unless asked for.
  if (given.batch && *given.batch != plan->inputs.batch) {
    if (!given.allowOtherBatch)
      return inputError("{}: /model/batch: the plan was made for batch {}, "
                        "but --batch {} was given; give --allow-other-batch "
                        "to use it at that batch anyway",
                        planPath.str(), plan->inputs.batch, *given.batch);
    spdlog::warn("{}: the plan was made for batch {}, used at batch {} "
                 "(--allow-other-batch)",
                 planPath.str(), plan->inputs.batch, *given.batch);
  }
  DriverOptions o = given;
  adoptPlanInputs(o, *plan, /*paths=*/true);
  auto s = Session::open(o);
  if (!s)
    return s.takeError();
  // Another cluster: its devices, links or memory differ from those the
  // plan was searched for, so its figures do not hold there.
  if (!given.topologyPath.empty()) {
    auto tsha = sha256File(resolveTopologyPath(given.topologyPath));
    if (!tsha)
      return tsha.takeError();
    if (*tsha != plan->inputs.topologySha256) {
      const Topology &t = *(*s)->topo;
      std::string what = fmt::format(
          "the plan was made for {} ({}, {} x {}), not {} ({}, {} x {})",
          plan->inputs.topologyPath, plan->topologyName, plan->numDevices,
          plan->deviceType, given.topologyPath, t.name(), t.numDevices(),
          t.deviceSpec().name);
      if (!given.allowOtherTopology)
        return inputError("{}: /topology/sha256: {}; give "
                          "--allow-other-topology to use it there anyway",
                          planPath.str(), what);
      spdlog::warn("{}: {} (--allow-other-topology)", planPath.str(), what);
    }
  }
  auto strategy = planStrategy(*plan, *(*s)->graph, *(*s)->topo, planPath);
  if (!strategy)
    return strategy.takeError();
  // Op names first (the message names the op), then the bytes: a model
  // whose op names match but whose shapes or weights differ is refused too.
  auto sha = sha256File(o.modelPath);
  if (!sha)
    return sha.takeError();
  if (*sha != plan->inputs.modelSha256)
    return inputError("{}: /model/sha256: the plan was made for another "
                      "model than {} (SHA-256 {}..., the file's is {}...); "
                      "`soapc check` lists what changed",
                      planPath.str(), o.modelPath,
                      plan->inputs.modelSha256.substr(0, 12),
                      sha->substr(0, 12));
  return PlanSession{std::move(*plan), std::move(*s), std::move(*strategy)};
}

} // namespace soap
