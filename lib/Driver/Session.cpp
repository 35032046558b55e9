// The session behind every subcommand: options checked, inputs loaded, and
// plans read and written with the inputs they record.
#include "soap/Driver/Session.h"

#include "soap/Import/OnnxImporter.h"
#include "soap/Machine/TopologyLoader.h"
#include "soap/Support/Cores.h"
#include "soap/Support/Error.h"
#include "soap/Support/Sha256.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Process.h"
#include <fmt/format.h>

namespace soap {

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
    return inputError("--precision must be fp32 or bf16, got '{}'", precision);
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
  std::string path = o.profilePath;
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
  auto topo = loadTopology(o.topologyPath);
  if (!topo)
    return topo.takeError();
  auto s = std::make_unique<Session>();
  s->options = o;
  s->mode = *mode;
  s->optimizer = *opt;
  s->topo = std::make_unique<Topology>(std::move(*topo));
  auto db = loadProfile(o, s->topo->deviceSpec().name);
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
  auto topology = sha256File(o.topologyPath);
  if (!topology)
    return topology.takeError();
  return InputDigests{std::move(*model), std::move(*topology)};
}

llvm::Error writeSearchPlan(const Session &s, const Strategy &strategy,
                            const SimMetrics &m, Seconds dpTime,
                            const std::string &searcher, uint64_t seed,
                            const std::string &path, bool interrupted) {
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
  in.interrupted = interrupted;
  Plan plan = makePlan(*s.graph, *s.topo, strategy, in,
                       planFigures(m, s.batch, dpTime));
  if (auto err = writePlan(plan, path))
    return err;
  // With --format csv or json stdout holds the figures alone (a parser
  // reads them), so the plan's path goes to stderr.
  if (path != "-")
    (o.format == OutputFormat::Csv || o.format == OutputFormat::Json
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
  DriverOptions o = given;
  adoptPlanInputs(o, *plan, /*paths=*/true);
  auto s = Session::open(o);
  if (!s)
    return s.takeError();
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
