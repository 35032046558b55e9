// soapc: the command-line driver. Parses options and calls the libraries.
//   soapc model.onnx --topology T --search mcmc [-o plan.json]   (search)
//   soapc compare | simulate | cost | dump | topo ...
#include "soap/Cost/CostPrinter.h"
#include "soap/IR/GraphPrinter.h"
#include "soap/IR/UnrollRnn.h"
#include "soap/Import/OnnxImporter.h"
#include "soap/Machine/TopologyLoader.h"
#include "soap/Machine/TopologyPrinter.h"
#include "soap/Parallel/BuiltinStrategies.h"
#include "soap/Plan/Plan.h"
#include "soap/Search/Driver.h"
#include "soap/Search/FrontierTracking.h"
#include "soap/Sim/SimReport.h"
#include "soap/Support/Error.h"
#include "soap/Support/Format.h"
#include "soap/Support/Json.h"
#include "soap/Support/Logging.h"
#include "soap/Support/Sha256.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Process.h"
#include "llvm/Support/raw_ostream.h"

using namespace soap;
namespace cl = llvm::cl;

static cl::OptionCategory soapCat("soapc options");

static cl::SubCommand dumpCmd("dump",
                              "Describe a model's ops: kinds, shapes, loop "
                              "dimensions and their classes, FLOPs, parameters");
static cl::SubCommand topoCmd("topo",
                              "Describe a cluster: devices, hierarchy levels, "
                              "bandwidth and latency between levels");
static cl::SubCommand costCmd("cost",
                              "What the cost model predicts for each op of a "
                              "model run whole on one device of a topology");
static cl::SubCommand
    simulateCmd("simulate",
                "Simulate one training iteration of a model under a "
                "strategy: time, memory per device, bytes moved");
static cl::SubCommand
    checkCmd("check",
             "Tell whether a plan still fits its model and topology (exit 4 "
             "when not); with --research, whether a better plan exists");
static cl::SubCommand
    compareCmd("compare",
               "Run several searchers on one model and topology under the "
               "same simulator, one row each");

static cl::SubCommand
    frontierCmd("frontier",
                "TensorOpt's cost frontier of iteration time against memory "
                "per device (frontier tracking), every point re-scored by "
                "the simulator");

#define SOAP_MODEL_CMDS                                                        \
  cl::sub(dumpCmd), cl::sub(costCmd), cl::sub(simulateCmd),                    \
      cl::sub(compareCmd), cl::sub(checkCmd), cl::sub(frontierCmd),            \
      cl::sub(*cl::TopLevelSubCommand)
#define SOAP_MACHINE_CMDS                                                      \
  cl::sub(costCmd), cl::sub(simulateCmd), cl::sub(compareCmd),                 \
      cl::sub(checkCmd), cl::sub(frontierCmd), cl::sub(*cl::TopLevelSubCommand)
#define SOAP_SEARCH_CMDS                                                       \
  cl::sub(compareCmd), cl::sub(checkCmd), cl::sub(*cl::TopLevelSubCommand)

static cl::opt<std::string> planPath(cl::Positional, cl::Required,
                                     cl::desc("<plan.json>"),
                                     cl::sub(checkCmd));
static cl::opt<std::string> modelPath(cl::Positional, cl::desc("<model.onnx>"),
                                      SOAP_MODEL_CMDS);
static cl::opt<std::string> topoPath(cl::Positional, cl::Required,
                                     cl::desc("<cluster.json>"),
                                     cl::sub(topoCmd));

enum class OutputFormat { Table, Csv, Json };
static cl::opt<OutputFormat> format(
    "format", cl::desc("Output format"),
    cl::values(clEnumValN(OutputFormat::Table, "table", "aligned text"),
               clEnumValN(OutputFormat::Csv, "csv", "CSV (compare only)"),
               clEnumValN(OutputFormat::Json, "json", "JSON")),
    cl::init(OutputFormat::Table), cl::sub(dumpCmd), cl::sub(topoCmd),
    cl::sub(costCmd), cl::sub(simulateCmd), cl::sub(compareCmd),
    cl::cat(soapCat));

static cl::opt<int64_t>
    batch("batch",
          cl::desc("Samples per iteration: the value of the model's symbolic "
                   "batch dim (default: 64 per device)"),
          cl::init(0), SOAP_MODEL_CMDS, cl::cat(soapCat));
static cl::opt<bool> noLoss("no-loss",
                            cl::desc("Do not append a softmax cross-entropy "
                                     "loss to a model that has none"),
                            cl::init(false), SOAP_MODEL_CMDS, cl::cat(soapCat));
static cl::opt<bool>
    unrollRnn("unroll-rnn",
              cl::desc("Unroll LSTM layers into one cell per time step, so "
                       "layers and time steps can be placed apart"),
              cl::init(false), SOAP_MODEL_CMDS, cl::cat(soapCat));

static cl::opt<std::string> topologyOpt("topology",
                                        cl::desc("Cluster description (JSON)"),
                                        cl::value_desc("cluster.json"),
                                        SOAP_MACHINE_CMDS, cl::cat(soapCat));
static cl::opt<std::string> profileOpt(
    "profile",
    cl::desc("Cost database to use (default: profiles/<device>.json of this "
             "source tree, when it exists)"),
    cl::value_desc("profile.json"), SOAP_MACHINE_CMDS, cl::cat(soapCat));
static cl::opt<std::string> costModelOpt(
    "cost-model",
    cl::desc("Kernel times from: analytic (roofline), profile (database, "
             "roofline where it has no entry), strict (database only)"),
    cl::init("profile"), SOAP_MACHINE_CMDS, cl::cat(soapCat));
static cl::opt<std::string>
    optimizerOpt("optimizer",
                 cl::desc("Optimizer whose state is counted: sgd, momentum, "
                          "adam"),
                 cl::init("sgd"), SOAP_MACHINE_CMDS, cl::cat(soapCat));

static cl::opt<std::string>
    strategyOpt("strategy",
                cl::desc("The strategy to simulate: data (every op split by "
                         "sample over all devices), model (layer-wise "
                         "placement), expert (CNNs: data-parallel conv, "
                         "parameter-parallel dense; RNNs: GNMT), or a plan "
                         "file (*.json) written by a search"),
                cl::init("data"), cl::sub(simulateCmd), cl::cat(soapCat));
static cl::opt<std::string>
    traceOpt("trace",
             cl::desc("Write the simulated timeline as a Chrome trace "
                      "(chrome://tracing, Perfetto)"),
             cl::value_desc("trace.json"), cl::sub(simulateCmd),
             cl::cat(soapCat));

static cl::opt<std::string> searchOpt(
    "search",
    cl::desc("Searcher (a comma-separated list for compare); the searchers "
             "are listed above"),
    cl::init("mcmc"), SOAP_SEARCH_CMDS, cl::cat(soapCat));
static cl::opt<std::string> budgetOpt(
    "budget",
    cl::desc("Search budget: a number of proposals (deterministic) or a "
             "duration such as 30s, 500ms, 2m (FlexFlow's; depends on the "
             "machine)"),
    cl::init("20000"), SOAP_SEARCH_CMDS, cl::cat(soapCat));
static cl::opt<uint64_t> seedOpt("seed", cl::desc("Random seed"), cl::init(0),
                                 SOAP_SEARCH_CMDS, cl::cat(soapCat));
static cl::opt<std::string>
    spaceOpt("space",
             cl::desc("Configuration space: flexflow (no reduction splits, "
                      "no replicas) or full (both)"),
             cl::init("flexflow"), SOAP_SEARCH_CMDS, cl::cat(soapCat));
static cl::opt<int> chainsOpt("chains",
                              cl::desc("Independent MCMC chains per initial "
                                       "strategy (the result depends on it)"),
                              cl::init(1), SOAP_SEARCH_CMDS, cl::cat(soapCat));
/// --threads: libLLVM registers an unrelated, undocumented "threads"
/// option of its own; main() removes it and then creates ours.
static cl::opt<int> *threadsOpt = nullptr;
static cl::opt<double> betaOpt(
    "beta",
    cl::desc("MCMC's beta (FlexFlow Eq. 1) per second of iteration time; 0: "
             "a proposal 1% slower is accepted with probability e^-2"),
    cl::init(0), SOAP_SEARCH_CMDS, cl::cat(soapCat));
static cl::opt<std::string> outputOpt("o", cl::desc("Write the plan here"),
                                      cl::value_desc("plan.json"),
                                      cl::sub(*cl::TopLevelSubCommand),
                                      cl::cat(soapCat));

static cl::opt<std::string> ftModeOpt(
    "mode",
    cl::desc("frontier: print the whole frontier; mini-time: the fastest "
             "point that fits; mini-parallelism: the fewest devices (1, 2, "
             "4, ...) with a point that fits; profile: the fastest point "
             "that fits per device count"),
    cl::init("frontier"), cl::sub(frontierCmd), cl::cat(soapCat));
static cl::opt<std::string>
    ftJsonOpt("write-json", cl::desc("Write the frontier as JSON here"),
              cl::value_desc("frontier.json"), cl::sub(frontierCmd),
              cl::cat(soapCat));
static cl::opt<std::string>
    ftSvgOpt("svg", cl::desc("Plot the frontier (memory against time) here"),
             cl::value_desc("frontier.svg"), cl::sub(frontierCmd),
             cl::cat(soapCat));
static cl::opt<int> ftPointOpt(
    "point",
    cl::desc("The frontier point -o writes (default: the mode's choice, "
             "else the mini-time point)"),
    cl::init(-1), cl::sub(frontierCmd), cl::cat(soapCat));
static cl::opt<std::string> ftOutputOpt("o",
                                        cl::desc("Write a point as a plan"),
                                        cl::value_desc("plan.json"),
                                        cl::sub(frontierCmd), cl::cat(soapCat));
static cl::opt<int> ftSplitOpt(
    "max-split-loops",
    cl::desc("Loops an op may split at once (the device mesh's dimensions)"),
    cl::init(1), cl::sub(frontierCmd), cl::cat(soapCat));
static cl::opt<double> ftResolutionOpt(
    "resolution",
    cl::desc("Keep a frontier point only when it is faster by more than this "
             "fraction (0: the exact frontier)"),
    cl::init(0.01), cl::sub(frontierCmd), cl::cat(soapCat));
static cl::opt<unsigned> ftSimulateOpt(
    "simulate",
    cl::desc("Re-score at most this many points, spread over the frontier, "
             "with the simulator (0: all)"),
    cl::init(32), cl::sub(frontierCmd), cl::cat(soapCat));
static cl::opt<bool>
    ftNoReuseOpt("no-reuse",
                 cl::desc("Keep both copies of every re-scheduled tensor "
                          "(no TensorOpt tensor reuse)"),
                 cl::init(false), cl::sub(frontierCmd), cl::cat(soapCat));
static cl::opt<bool> ftNoLdpOpt(
    "no-ldp",
    cl::desc("Eliminate down to one node instead of the linear DP "
             "(FT-Elimination)"),
    cl::init(false), cl::sub(frontierCmd), cl::cat(soapCat));

static cl::opt<bool>
    researchOpt("research",
                cl::desc("Also search again (with the plan's searcher, seed, "
                         "budget and space) and fail when a plan better by "
                         "more than --tolerance exists"),
                cl::init(false), cl::sub(checkCmd), cl::cat(soapCat));
static cl::opt<std::string>
    toleranceOpt("tolerance",
                 cl::desc("How much better a new plan must be to fail "
                          "--research (default 2%)"),
                 cl::init("2%"), cl::sub(checkCmd), cl::cat(soapCat));

static cl::opt<bool> verbose("v", cl::desc("Verbose logging"),
                             cl::sub(*cl::AllSubCommands), cl::cat(soapCat));
static cl::opt<bool> quiet("q", cl::desc("Errors only"),
                           cl::sub(*cl::AllSubCommands), cl::cat(soapCat));

/// FlexFlow's default: 64 samples per device.
static constexpr int64_t kSamplesPerDevice = 64;

static int64_t effectiveBatch(int64_t devices) {
  return batch > 0 ? int64_t(batch) : kSamplesPerDevice * devices;
}

static llvm::Expected<std::unique_ptr<Graph>> loadModel(llvm::StringRef path,
                                                        int64_t devices) {
  if (path.empty())
    return inputError("no model given");
  if (batch.getNumOccurrences() && batch <= 0)
    return inputError("--batch must be at least 1, got {}", int64_t(batch));
  ImportOptions opts;
  opts.batch = effectiveBatch(devices);
  opts.appendLoss = !noLoss;
  if (auto err = opts.validate())
    return llvm::Error(std::move(err));
  auto g = importOnnx(path, opts);
  if (!g || !unrollRnn)
    return g;
  return unrollLstms(**g);
}

static void emit(const Json &j,
                 void (*table)(const Json &, llvm::raw_ostream &)) {
  if (format == OutputFormat::Json)
    llvm::outs() << dumpJson(j);
  else
    table(j, llvm::outs());
}

static llvm::Error runDump() {
  auto g = loadModel(modelPath, 1);
  if (!g)
    return g.takeError();
  if (format == OutputFormat::Json)
    llvm::outs() << dumpJson(graphToJson(**g, effectiveBatch(1)));
  else
    printGraphTable(**g, effectiveBatch(1), llvm::outs());
  return llvm::Error::success();
}

static llvm::Error runTopo() {
  auto t = loadTopology(topoPath);
  if (!t)
    return t.takeError();
  if (format == OutputFormat::Json)
    llvm::outs() << dumpJson(topologyToJson(*t));
  else
    printTopology(*t, llvm::outs());
  return llvm::Error::success();
}

/// The cost database for a device: --profile, else the source tree's
/// profiles/<device>.json when it exists.
static llvm::Expected<std::optional<CostDatabase>>
loadProfile(llvm::StringRef device) {
  std::string path = profileOpt;
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

/// What cost, simulate and the searchers share: options checked, the
/// cluster, its cost database, the model at the cluster's batch, and the
/// cost and collective models over them.
struct Setup {
  CostMode mode;
  Optimizer optimizer;
  std::unique_ptr<Topology> topo;
  std::optional<CostDatabase> db;
  std::unique_ptr<Graph> graph;
  int64_t batch;
  std::unique_ptr<CostModel> cost;
  std::unique_ptr<CollectiveModel> collectives;
  SearchProblem problem() const {
    return SearchProblem{*graph, *topo, *cost, *collectives, optimizer};
  }
};

static llvm::Expected<std::unique_ptr<Setup>> setUp() {
  if (topologyOpt.empty())
    return inputError("--topology is required");
  auto mode = parseCostMode(costModelOpt);
  if (!mode)
    return inputError("--cost-model must be analytic, profile or strict, got "
                      "'{}'",
                      costModelOpt.getValue());
  auto opt = parseOptimizer(optimizerOpt);
  if (!opt)
    return inputError("--optimizer must be sgd, momentum or adam, got '{}'",
                      optimizerOpt.getValue());
  auto topo = loadTopology(topologyOpt);
  if (!topo)
    return topo.takeError();
  auto s = std::make_unique<Setup>();
  s->mode = *mode;
  s->optimizer = *opt;
  s->topo = std::make_unique<Topology>(std::move(*topo));
  auto db = loadProfile(s->topo->deviceSpec().name);
  if (!db)
    return db.takeError();
  s->db = std::move(*db);
  int64_t devices = static_cast<int64_t>(s->topo->numDevices());
  auto g = loadModel(modelPath, devices);
  if (!g)
    return g.takeError();
  s->graph = std::move(*g);
  s->batch = effectiveBatch(devices);
  s->cost = std::make_unique<CostModel>(s->topo->deviceSpec(),
                                        s->db ? &*s->db : nullptr, s->mode);
  s->collectives = std::make_unique<CollectiveModel>(
      *s->topo, s->db ? &s->db->collectives : nullptr);
  return s;
}

static llvm::Error runCost() {
  auto s = setUp();
  if (!s)
    return s.takeError();
  // The whole model on one device: the batch is still the cluster's.
  auto report = costReport(*(*s)->graph, *(*s)->cost, (*s)->optimizer);
  if (!report)
    return report.takeError();
  emit(*report, printCostReport);
  return llvm::Error::success();
}

static llvm::Error runSimulate() {
  // A plan says how its model was imported; flags given again win.
  std::optional<Plan> plan;
  if (llvm::StringRef(strategyOpt).endswith(".json")) {
    auto p = readPlan(strategyOpt);
    if (!p)
      return p.takeError();
    plan = std::move(*p);
    if (!unrollRnn.getNumOccurrences())
      unrollRnn = plan->inputs.unrollRnn;
    if (!noLoss.getNumOccurrences())
      noLoss = !plan->inputs.appendLoss;
  }
  auto su = setUp();
  if (!su)
    return su.takeError();
  Setup &s = **su;
  llvm::Expected<Strategy> strategy =
      plan ? planStrategy(*plan, *s.graph, *s.topo, strategyOpt)
           : builtinStrategy(strategyOpt, *s.graph, *s.topo);
  if (!strategy)
    return strategy.takeError();
  SimContext ctx = s.problem().context();
  auto tg = TaskGraph::build(ctx, *strategy);
  if (!tg)
    return tg.takeError();
  Simulator sim(*tg);
  sim.simulateFull();
  SimMetrics m = sim.metrics();
  if (!traceOpt.empty())
    if (auto err = writeFileAtomic(traceOpt, sim.chromeTrace().dump() + "\n"))
      return err;
  emit(simReport(sim, m, strategyOpt, s.batch), printSimReport);
  return llvm::Error::success();
}

static llvm::Expected<SearchOptions> searchOptions() {
  SearchOptions o;
  auto b = Budget::parse(budgetOpt);
  if (!b)
    return b.takeError();
  o.budget = *b;
  o.seed = seedOpt;
  auto space = parseSpaceKind(spaceOpt);
  if (!space)
    return inputError("--space must be flexflow or full, got '{}'",
                      spaceOpt.getValue());
  o.space.kind = *space;
  o.chains = chainsOpt;
  o.threads = *threadsOpt;
  o.beta = betaOpt;
  if (auto err = o.validate())
    return llvm::Error(std::move(err));
  // A progress line on stderr when it is a terminal.
  if (llvm::sys::Process::StandardErrIsDisplayed() && !quiet)
    o.progress = [](const SearchProgress &p) {
      llvm::errs() << fmt::format(
          "\rbest {:.3f} ms  {} proposals  {:.0f}/s  acceptance {:.0f}%   ",
          p.best * 1e3, p.proposals,
          p.elapsedSeconds > 0 ? p.proposals / p.elapsedSeconds : 0.0,
          100 * p.acceptanceRate);
    };
  return o;
}

/// Writes `strategy` as a plan recording how it was found.
static llvm::Error writeSearchPlan(const Setup &s, const Strategy &strategy,
                                   const SimMetrics &m, Seconds dpTime,
                                   const std::string &searcher, uint64_t seed,
                                   const std::string &path) {
  auto modelSha = sha256File(modelPath);
  if (!modelSha)
    return modelSha.takeError();
  auto topoSha = sha256File(topologyOpt);
  if (!topoSha)
    return topoSha.takeError();
  PlanInputs in;
  in.modelPath = modelPath;
  in.modelSha256 = *modelSha;
  in.batch = s.batch;
  in.unrollRnn = unrollRnn;
  in.appendLoss = !noLoss;
  in.topologyPath = topologyOpt;
  in.topologySha256 = *topoSha;
  in.searcher = searcher;
  in.seed = seed;
  in.budget = budgetOpt;
  in.space = spaceOpt;
  in.costModel = costModelOpt;
  in.optimizer = optimizerOpt;
  Plan plan = makePlan(*s.graph, *s.topo, strategy, in,
                       planFigures(m, s.batch, dpTime));
  if (auto err = writePlan(plan, path))
    return err;
  if (path != "-")
    llvm::outs() << "plan: " << path << "\n";
  return llvm::Error::success();
}

static llvm::Error runSearchCommand() {
  auto su = setUp();
  if (!su)
    return su.takeError();
  Setup &s = **su;
  auto o = searchOptions();
  if (!o)
    return o.takeError();
  auto out = runSearch(s.problem(), searchOpt, *o);
  if (o->progress)
    llvm::errs() << "\n";
  if (!out)
    return out.takeError();
  const SimMetrics &m = out->metrics;
  llvm::outs() << fmt::format(
      "searcher: {} ({} proposals, {:.2f} s{})\n"
      "predicted iteration time: {:.3f} ms ({:.1f} samples/s at batch {})\n"
      "speedup over data parallel: {}\n"
      "peak memory: {} of {} per device\n"
      "bytes moved: transfers {}, all-reduces {}\n",
      out->searcher, out->result.proposals, out->searchSeconds,
      out->result.provenOptimal ? ", proven optimal" : "",
      m.iterationTime * 1e3, s.batch / m.iterationTime, s.batch,
      out->speedup() > 0 ? fmt::format("{:.2f}x", out->speedup())
                         : std::string("n/a (data parallel does not fit)"),
      formatBytes(m.peakMemory), formatBytes(m.capacity),
      formatBytes(m.transferBytes), formatBytes(m.collectiveBytes));
  if (!outputOpt.empty())
    return writeSearchPlan(s, out->result.strategy, m, out->dataParallelTime,
                           out->searcher, o->seed, outputOpt);
  return llvm::Error::success();
}

/// soapc check: exit 0 while the plan fits its model and topology; exit 4
/// naming every change; with --research, exit 4 too when a search with the
/// plan's settings finds a plan faster by more than --tolerance.
static llvm::Error runCheck() {
  auto plan = readPlan(planPath);
  if (!plan)
    return plan.takeError();
  // The plan's recorded inputs unless given again.
  if (modelPath.empty())
    modelPath = plan->inputs.modelPath;
  if (topologyOpt.empty())
    topologyOpt = plan->inputs.topologyPath;
  if (!batch.getNumOccurrences())
    batch = plan->inputs.batch;
  if (!unrollRnn.getNumOccurrences())
    unrollRnn = plan->inputs.unrollRnn;
  if (!noLoss.getNumOccurrences())
    noLoss = !plan->inputs.appendLoss;
  if (!costModelOpt.getNumOccurrences())
    costModelOpt = plan->inputs.costModel;
  if (!optimizerOpt.getNumOccurrences())
    optimizerOpt = plan->inputs.optimizer;
  auto modelSha = sha256File(modelPath);
  if (!modelSha)
    return modelSha.takeError();
  auto topoSha = sha256File(topologyOpt);
  if (!topoSha)
    return topoSha.takeError();
  auto su = setUp();
  if (!su)
    return su.takeError();
  Setup &s = **su;
  std::optional<SimMetrics> metrics;
  auto strategy = planStrategy(*plan, *s.graph, *s.topo, planPath);
  if (strategy) {
    auto m = strategyMetrics(s.problem(), *strategy);
    if (!m)
      return m.takeError();
    metrics = *m;
  } else {
    llvm::consumeError(strategy.takeError());
  }
  std::vector<CheckFinding> findings =
      checkPlan(*plan, *modelSha, *topoSha, s.batch, *s.graph, *s.topo,
                metrics ? &*metrics : nullptr);
  if (findings.empty() && researchOpt) {
    llvm::StringRef tol = llvm::StringRef(toleranceOpt).trim();
    bool percent = tol.consume_back("%");
    double t;
    if (tol.getAsDouble(t) || t < 0 || !std::isfinite(t))
      return inputError("--tolerance '{}': expected a non-negative number or "
                        "percentage such as 2%",
                        toleranceOpt.getValue());
    if (percent)
      t /= 100;
    SearchOptions o;
    auto b = Budget::parse(plan->inputs.budget);
    if (!b)
      return b.takeError();
    o.budget = *b;
    o.seed = plan->inputs.seed;
    auto space = parseSpaceKind(plan->inputs.space);
    if (!space)
      return inputError("{}: /search/space: unknown space '{}'", planPath,
                        plan->inputs.space);
    o.space.kind = *space;
    o.threads = *threadsOpt;
    auto again = runSearch(s.problem(), plan->inputs.searcher, o);
    if (!again)
      return again.takeError();
    double planned = metrics->iterationTime;
    double found = again->metrics.iterationTime;
    if (found < planned * (1 - t))
      findings.push_back(
          {fmt::format("a better plan exists: {} finds {:.3f} ms, the plan "
                       "predicts {:.3f} ms ({:.1f}% faster, tolerance {})",
                       plan->inputs.searcher, found * 1e3, planned * 1e3,
                       100 * (1 - found / planned), toleranceOpt.getValue())});
  }
  if (findings.empty()) {
    llvm::outs() << planPath << ": fresh: the plan fits " << modelPath
                 << " and " << topologyOpt << "\n";
    return llvm::Error::success();
  }
  std::string msg = fmt::format("{}: the plan is stale:", planPath.getValue());
  for (const CheckFinding &f : findings)
    msg += "\n  " + f.what;
  return makeError(ExitCode::Stale, "{}", msg);
}

static llvm::Error runCompare() {
  auto su = setUp();
  if (!su)
    return su.takeError();
  Setup &s = **su;
  auto o = searchOptions();
  if (!o)
    return o.takeError();
  o->progress = nullptr;
  llvm::SmallVector<llvm::StringRef, 8> names;
  llvm::StringRef(searchOpt).split(names, ',', -1, false);
  std::vector<SearchOutcome> rows;
  for (llvm::StringRef n : names) {
    auto out = runSearchForCompare(s.problem(), n.trim(), *o);
    if (!out)
      return out.takeError();
    rows.push_back(std::move(*out));
  }
  Json report = compareReport(rows);
  if (format == OutputFormat::Json)
    llvm::outs() << dumpJson(report);
  else
    printCompareTable(report, llvm::outs(), format == OutputFormat::Csv);
  return llvm::Error::success();
}


static void printFrontier(const FtFrontierReport &r, const SimMetrics &dp,
                          int chosen) {
  llvm::outs() << fmt::format(
      "frontier on {} devices: {} points, {} (eliminations: node {}, edge {}, "
      "branch {}, heuristic {}; backbone {} nodes; {} configurations; "
      "{:.2f} s)\n",
      r.devices, r.points.size(),
      !r.stats.exact() ? std::string("heuristic elimination used, may miss "
                                     "points")
      : r.options.resolution > 0
          ? fmt::format("exact eliminations, {:g}% resolution",
                        r.options.resolution * 100)
          : std::string("exact"),
      r.stats.nodeEliminations, r.stats.edgeEliminations,
      r.stats.branchEliminations, r.stats.heuristicEliminations,
      r.stats.backbone, r.stats.totalConfigs, r.seconds);
  llvm::outs() << fmt::format("{:>5} {:>12} {:>11} {:>11} {:>11} {:>6} "
                              "{:>11} {:>12} {:>4}\n",
                              "point", "memory(FT)", "time(FT)", "compute",
                              "network", "reuse", "time(sim)", "memory(sim)",
                              "fits");
  for (size_t i = 0; i < r.points.size(); ++i) {
    const FtScored &p = r.points[i];
    size_t reused = 0;
    for (uint8_t x : p.point.assignment.reuse)
      reused += x != 0;
    llvm::outs() << fmt::format(
        "{:>5} {:>12} {:>8.3f} ms {:>8.3f} ms {:>8.3f} ms {:>6} {:>11} "
        "{:>12} {:>4}{}\n",
        i, formatBytes(p.point.costs.memory), p.point.costs.time * 1e3,
        p.point.costs.compute * 1e3, p.point.costs.network * 1e3, reused,
        p.simulated ? fmt::format("{:.3f} ms", p.simTime * 1e3) : "-",
        p.simulated ? formatBytes(double(p.simPeakMemory)) : "-",
        !p.simulated ? "-" : p.simFits ? "yes" : "no",
        int(i) == chosen ? "  <- chosen" : "");
  }
  FtKnee k = frontierKnee(r);
  if (k.index >= 0)
    llvm::outs() << fmt::format(
        "turning point: point {} ({}, {:.3f} ms): {:.0f}% of the time gained "
        "from the least-memory to the fastest point within the first {:.0f}% "
        "of the memory range; {:.3f} ms per GiB before, {:.3f} after\n",
        k.index, formatBytes(r.points[size_t(k.index)].point.costs.memory),
        r.points[size_t(k.index)].point.costs.time * 1e3, k.timeShare * 100,
        k.memoryShare * 100, k.slopeBefore * kBytesPerGiB * 1e3,
        k.slopeAfter * kBytesPerGiB * 1e3);
  llvm::outs() << fmt::format(
      "data parallel (simulator): {:.3f} ms, {} per device{}\n",
      dp.iterationTime * 1e3, formatBytes(double(dp.peakMemory)),
      dp.fits ? "" : " (does not fit)");
}

/// soapc frontier: TensorOpt's cost frontier and its modes (section 4.1).
static llvm::Error runFrontier() {
  auto su = setUp();
  if (!su)
    return su.takeError();
  Setup &s = **su;
  auto mode = parseFtMode(ftModeOpt);
  if (!mode)
    return inputError("--mode must be frontier, mini-time, mini-parallelism "
                      "or profile, got '{}'",
                      ftModeOpt.getValue());
  FtOptions o;
  o.threads = *threadsOpt;
  o.maxSplitLoops = ftSplitOpt;
  o.resolution = ftResolutionOpt;
  o.tensorReuse = !ftNoReuseOpt;
  o.useLdp = !ftNoLdpOpt;
  if (auto err = o.validate())
    return err;
  SearchProblem prob = s.problem();
  auto dp = strategyMetrics(prob, dataParallel(*s.graph, *s.topo));
  if (!dp)
    return dp.takeError();
  Seconds dpTime = dp->fits ? dp->iterationTime : 0;
  std::vector<FtFrontierReport> reports;
  size_t chosenReport = 0;
  int chosen = -1;
  if (*mode == FtMode::Frontier || *mode == FtMode::MiniTime) {
    auto r = frontierReport(prob, o, ftSimulateOpt);
    if (!r)
      return r.takeError();
    reports.push_back(std::move(*r));
    chosen = miniTimePoint(reports[0]);
  } else {
    auto rs = profileReports(prob, o, ftSimulateOpt);
    if (!rs)
      return rs.takeError();
    reports = std::move(*rs);
    llvm::outs() << fmt::format("{:>7} {:>7} {:>14} {:>16} {:>6}\n",
                                "devices", "points", "least memory",
                                "fastest fitting", "point");
    for (size_t i = 0; i < reports.size(); ++i) {
      int b = miniTimePoint(reports[i]);
      const FtFrontierReport &r = reports[i];
      llvm::outs() << fmt::format(
          "{:>7} {:>7} {:>14} {:>16} {:>6}\n", r.devices, r.points.size(),
          r.points.empty() ? std::string("-")
                           : formatBytes(double(r.points[0].simPeakMemory)),
          b < 0 ? std::string("does not fit")
                : fmt::format("{:.3f} ms",
                              r.points[size_t(b)].simTime * 1e3),
          b < 0 ? std::string("-") : std::to_string(b));
      if (b >= 0 && chosen < 0 && *mode == FtMode::MiniParallelism) {
        chosen = b;
        chosenReport = i;
      }
    }
    if (*mode == FtMode::Profile) {
      // The fastest over all device counts.
      for (size_t i = 0; i < reports.size(); ++i) {
        int b = miniTimePoint(reports[i]);
        if (b >= 0 &&
            (chosen < 0 || reports[i].points[size_t(b)].simTime <
                               reports[chosenReport]
                                   .points[size_t(chosen)]
                                   .simTime)) {
          chosen = b;
          chosenReport = i;
        }
      }
    }
  }
  FtFrontierReport &rep = reports[chosenReport];
  if (*mode == FtMode::Frontier || *mode == FtMode::MiniTime)
    printFrontier(rep, *dp, chosen);
  if (!ftJsonOpt.empty()) {
    Json j;
    if (reports.size() == 1) {
      j = frontierJson(rep, *s.graph, *s.topo, dpTime, dp->peakMemory);
    } else {
      j["profile"] = Json::array();
      for (const FtFrontierReport &r : reports)
        j["profile"].push_back(
            frontierJson(r, *s.graph, *s.topo, dpTime, dp->peakMemory));
    }
    if (auto err = writeFileAtomic(ftJsonOpt, dumpJson(j)))
      return err;
  }
  if (!ftSvgOpt.empty())
    if (auto err = writeFileAtomic(
            ftSvgOpt, frontierSvg(rep, *s.graph, dpTime, dp->peakMemory)))
      return err;
  if (ftPointOpt >= 0) {
    if (size_t(ftPointOpt) >= rep.points.size())
      return inputError("--point {}: the frontier has {} points (0 to {})",
                        int(ftPointOpt), rep.points.size(),
                        rep.points.size() - 1);
    chosen = ftPointOpt;
  }
  if (chosen < 0) {
    if (*mode == FtMode::Frontier && ftOutputOpt.empty())
      return llvm::Error::success();
    return makeError(ExitCode::Infeasible,
                     "{}: no point of the cost frontier fits in device "
                     "memory on {} ({} per device){}",
                     modelPath.getValue(), s.topo->name(),
                     formatBytes(double(s.topo->deviceSpec().memoryBytes)),
                     rep.points.empty()
                         ? std::string()
                         : fmt::format("; the least memory point needs {}",
                                       formatBytes(double(
                                           rep.points[0].simPeakMemory))));
  }
  FtScored &pt = rep.points[size_t(chosen)];
  if (!pt.simulated) {
    auto sm = strategyMetrics(prob, pt.strategy);
    if (!sm)
      return sm.takeError();
    pt.simTime = sm->iterationTime;
    pt.simPeakMemory = sm->peakMemory;
    pt.simFits = sm->fits;
    pt.simulated = true;
  }
  if (*mode != FtMode::Frontier)
    llvm::outs() << fmt::format("{}: {} devices, point {}: {:.3f} ms, {} per "
                                "device (simulator)\n",
                                ftModeOpt.getValue(), rep.devices, chosen,
                                pt.simTime * 1e3,
                                formatBytes(double(pt.simPeakMemory)));
  if (ftOutputOpt.empty())
    return llvm::Error::success();
  if (!pt.simFits)
    return makeError(ExitCode::Infeasible,
                     "point {} does not fit in device memory under the "
                     "simulator ({} per device); no plan written",
                     chosen, formatBytes(double(pt.simPeakMemory)));
  auto m = strategyMetrics(prob, pt.strategy);
  if (!m)
    return m.takeError();
  return writeSearchPlan(s, pt.strategy, *m, dpTime, "ft", seedOpt,
                         ftOutputOpt);
}

int main(int argc, char **argv) {
  if (cl::Option *llvmThreads =
          cl::getRegisteredOptions(*cl::TopLevelSubCommand).lookup("threads"))
    llvmThreads->removeArgument();
  static cl::opt<int> threads("threads",
                              cl::desc("Threads running the chains (the "
                                       "result does not depend on it)"),
                              cl::init(1), SOAP_SEARCH_CMDS,
                              cl::sub(frontierCmd), cl::cat(soapCat));
  threadsOpt = &threads;
  registerAllSearchers();
  std::string searchers;
  for (const auto &[name, info] : SearcherRegistry::instance().all())
    searchers += fmt::format("    {:<10} {}\n", name, info.description);
  cl::SetVersionPrinter([](llvm::raw_ostream &os) {
    os << "soapc 0.1.0 — strategy search for distributed DNN training\n";
  });
  cl::HideUnrelatedOptions(soapCat);
  std::string overview =
      "soapc: search how to split every operator of a DNN across a GPU "
      "cluster\n\n"
      "  soapc model.onnx --topology cluster.json [--search mcmc] "
      "[--budget 20000|30s] [--seed N] [-o plan.json]\n"
      "  soapc compare model.onnx --topology cluster.json --search "
      "mcmc,data,model,expert\n"
      "  soapc frontier model.onnx --topology cluster.json "
      "[--mode frontier|mini-time|mini-parallelism|profile] [--write-json F] "
      "[--svg F] [--point N -o plan.json]\n"
      "  soapc check plan.json [model.onnx] [--topology cluster.json] "
      "[--research --tolerance 2%]\n"
      "  soapc simulate model.onnx --topology cluster.json "
      "[--strategy data|model|expert|plan.json] [--trace trace.json]\n"
      "  soapc cost model.onnx --topology cluster.json "
      "[--cost-model analytic|profile|strict]\n"
      "  soapc dump model.onnx [--batch N] [--format table|json]\n"
      "  soapc topo cluster.json [--format table|json]\n\n"
      "  searchers:\n" +
      searchers;
  if (!cl::ParseCommandLineOptions(argc, argv, overview, &llvm::errs()))
    return static_cast<int>(ExitCode::InvalidInput);
  setupLogging(quiet ? -1 : verbose ? 1 : 0);
  llvm::Error err = llvm::Error::success();
  if (dumpCmd)
    err = runDump();
  else if (topoCmd)
    err = runTopo();
  else if (costCmd)
    err = runCost();
  else if (simulateCmd)
    err = runSimulate();
  else if (compareCmd)
    err = runCompare();
  else if (checkCmd)
    err = runCheck();
  else if (frontierCmd)
    err = runFrontier();
  else if (!modelPath.empty())
    err = runSearchCommand();
  else {
    llvm::errs() << "soapc: error: no model given; try 'soapc model.onnx "
                    "--topology cluster.json' or 'soapc --help'\n";
    return static_cast<int>(ExitCode::InvalidInput);
  }
  if (err)
    return reportError(std::move(err), "soapc");
  return 0;
}
