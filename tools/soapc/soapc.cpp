// soapc: the command-line driver. Parses options and calls the libraries.
#include "soap/Cost/CostPrinter.h"
#include "soap/Parallel/BuiltinStrategies.h"
#include "soap/Sim/SimReport.h"
#include "soap/IR/GraphPrinter.h"
#include "soap/IR/UnrollRnn.h"
#include "soap/Import/OnnxImporter.h"
#include "soap/Machine/TopologyLoader.h"
#include "soap/Machine/TopologyPrinter.h"
#include "soap/Support/Error.h"
#include "soap/Support/Json.h"
#include "soap/Support/Logging.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
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

static cl::opt<std::string> modelPath(cl::Positional, cl::Required,
                                      cl::desc("<model.onnx>"),
                                      cl::sub(dumpCmd), cl::sub(costCmd),
                                      cl::sub(simulateCmd));
static cl::opt<std::string> topoPath(cl::Positional, cl::Required,
                                     cl::desc("<cluster.json>"),
                                     cl::sub(topoCmd));

enum class OutputFormat { Table, Json };
static cl::opt<OutputFormat>
    format("format", cl::desc("Output format"),
           cl::values(clEnumValN(OutputFormat::Table, "table", "aligned text"),
                      clEnumValN(OutputFormat::Json, "json", "JSON")),
           cl::init(OutputFormat::Table), cl::sub(dumpCmd), cl::sub(topoCmd),
           cl::sub(costCmd), cl::sub(simulateCmd), cl::cat(soapCat));

static cl::opt<int64_t>
    batch("batch",
          cl::desc("Samples per iteration: the value of the model's symbolic "
                   "batch dim (default: 64 per device)"),
          cl::init(0), cl::sub(dumpCmd), cl::sub(costCmd),
          cl::sub(simulateCmd), cl::cat(soapCat));

static cl::opt<bool> noLoss("no-loss",
                            cl::desc("Do not append a softmax cross-entropy "
                                     "loss to a model that has none"),
                            cl::init(false), cl::sub(dumpCmd),
                            cl::sub(costCmd), cl::sub(simulateCmd),
                            cl::cat(soapCat));

static cl::opt<bool>
    unrollRnn("unroll-rnn",
              cl::desc("Unroll LSTM layers into one cell per time step, so "
                       "layers and time steps can be placed apart"),
              cl::init(false), cl::sub(dumpCmd), cl::sub(costCmd),
              cl::sub(simulateCmd), cl::cat(soapCat));

static cl::opt<std::string> topologyOpt("topology",
                                        cl::desc("Cluster description (JSON)"),
                                        cl::value_desc("cluster.json"),
                                        cl::Required, cl::sub(costCmd),
                                        cl::sub(simulateCmd),
                                        cl::cat(soapCat));

static cl::opt<std::string> profileOpt(
    "profile",
    cl::desc("Cost database to use (default: profiles/<device>.json of this "
             "source tree, when it exists)"),
    cl::value_desc("profile.json"), cl::sub(costCmd), cl::sub(simulateCmd),
    cl::cat(soapCat));

static cl::opt<std::string> costModelOpt(
    "cost-model",
    cl::desc("Kernel times from: analytic (roofline), profile (database, "
             "roofline where it has no entry), strict (database only)"),
    cl::init("profile"), cl::sub(costCmd), cl::sub(simulateCmd),
    cl::cat(soapCat));

static cl::opt<std::string>
    optimizerOpt("optimizer",
                 cl::desc("Optimizer whose state is counted: sgd, momentum, "
                          "adam"),
                 cl::init("sgd"), cl::sub(costCmd), cl::sub(simulateCmd),
                 cl::cat(soapCat));

static cl::opt<std::string>
    strategyOpt("strategy",
                cl::desc("The strategy to simulate: data (every op split by "
                         "sample over all devices), model (layer-wise "
                         "placement), expert (CNNs: data-parallel conv, "
                         "parameter-parallel dense; RNNs: GNMT)"),
                cl::init("data"), cl::sub(simulateCmd), cl::cat(soapCat));

static cl::opt<std::string>
    traceOpt("trace",
             cl::desc("Write the simulated timeline as a Chrome trace "
                      "(chrome://tracing, Perfetto)"),
             cl::value_desc("trace.json"), cl::sub(simulateCmd),
             cl::cat(soapCat));

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

static void emit(const Json &j, void (*table)(const Json &, llvm::raw_ostream &)) {
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
/// cluster, its cost database and the model at the cluster's batch.
struct Setup {
  CostMode mode;
  Optimizer optimizer;
  Topology topo;
  std::optional<CostDatabase> db;
  std::unique_ptr<Graph> graph;
  int64_t batch;
};

static llvm::Expected<Setup> setUp() {
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
  auto db = loadProfile(topo->deviceSpec().name);
  if (!db)
    return db.takeError();
  int64_t devices = static_cast<int64_t>(topo->numDevices());
  auto g = loadModel(modelPath, devices);
  if (!g)
    return g.takeError();
  return Setup{*mode, *opt, std::move(*topo), std::move(*db), std::move(*g),
               effectiveBatch(devices)};
}

static llvm::Error runSimulate() {
  auto s = setUp();
  if (!s)
    return s.takeError();
  CostModel cm(s->topo.deviceSpec(), s->db ? &*s->db : nullptr, s->mode);
  CollectiveModel coll(s->topo, s->db ? &s->db->collectives : nullptr);
  auto strategy = builtinStrategy(strategyOpt, *s->graph, s->topo);
  if (!strategy)
    return strategy.takeError();
  SimContext ctx{*s->graph, s->topo, cm, coll, s->optimizer};
  auto tg = TaskGraph::build(ctx, *strategy);
  if (!tg)
    return tg.takeError();
  Simulator sim(*tg);
  sim.simulateFull();
  SimMetrics m = sim.metrics();
  if (!traceOpt.empty())
    if (auto err = writeFileAtomic(traceOpt, sim.chromeTrace().dump() + "\n"))
      return err;
  emit(simReport(sim, m, strategyOpt, s->batch), printSimReport);
  return llvm::Error::success();
}

static llvm::Error runCost() {
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
  const DeviceSpec &dev = topo->deviceSpec();
  auto db = loadProfile(dev.name);
  if (!db)
    return db.takeError();
  auto g = loadModel(modelPath, static_cast<int64_t>(topo->numDevices()));
  if (!g)
    return g.takeError();
  CostModel cm(dev, *db ? &**db : nullptr, *mode);
  auto report = costReport(**g, cm, *opt);
  if (!report)
    return report.takeError();
  emit(*report, printCostReport);
  return llvm::Error::success();
}

int main(int argc, char **argv) {
  cl::SetVersionPrinter([](llvm::raw_ostream &os) {
    os << "soapc 0.1.0 — strategy search for distributed DNN training\n";
  });
  cl::HideUnrelatedOptions(soapCat);
  if (!cl::ParseCommandLineOptions(
          argc, argv,
          "soapc: search how to split every operator of a DNN across a GPU "
          "cluster\n\n"
          "  soapc dump model.onnx [--batch N] [--format table|json]\n"
          "  soapc topo cluster.json [--format table|json]\n"
          "  soapc cost model.onnx --topology cluster.json "
          "[--cost-model analytic|profile|strict]\n"
          "  soapc simulate model.onnx --topology cluster.json "
          "[--strategy data|model|expert] [--trace trace.json]\n",
          &llvm::errs()))
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
  else {
    llvm::errs() << "soapc: error: no command given; try 'soapc dump "
                    "model.onnx' or 'soapc --help'\n";
    return static_cast<int>(ExitCode::InvalidInput);
  }
  if (err)
    return reportError(std::move(err), "soapc");
  return 0;
}
