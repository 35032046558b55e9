// soapc: the command-line driver. Parses its flags into DriverOptions and
// calls one subcommand of the driver library (lib/Driver).
//   soapc model.onnx --topology T --search mcmc [-o plan.json]   (search)
//   soapc compare | simulate | explain | diff | check | frontier | emit |
//         cost | dump | topo ...
#include "soap/Driver/Commands.h"
#include "soap/Emit/Emit.h"
#include "soap/Search/Searcher.h"
#include "soap/Support/Error.h"
#include "soap/Support/Logging.h"
#include "soap/Support/ToolOptions.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/raw_ostream.h"
#include <fmt/format.h>
#include <new>
#include <optional>
#include <utility>
#include <vector>

using namespace soap;
namespace cl = llvm::cl;

static cl::OptionCategory soapCat("soapc options");

static cl::SubCommand
    dumpCmd("dump", "Describe a model's ops: kinds, shapes, loop "
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
    explainCmd("explain",
               "Why a plan is what it is: the critical path with each op's "
               "share, per op its configuration, time, memory and bytes, "
               "communication by kind and link level; the plan graph");
static cl::SubCommand
    diffCmd("diff", "The ops whose configuration differs between two plans "
                    "and the predicted effect of each difference");

static cl::SubCommand
    emitCmd("emit", "Write a plan for a training engine: Megatron-LM "
                    "arguments, a NeMo YAML override, torchtitan TOML "
                    "sections, or a PyTorch DTensor program");

static cl::SubCommand
    frontierCmd("frontier",
                "TensorOpt's cost frontier of iteration time against memory "
                "per device (frontier tracking), every point re-scored by "
                "the simulator");

#define SOAP_MODEL_CMDS                                                        \
  cl::sub(dumpCmd), cl::sub(costCmd), cl::sub(simulateCmd),                    \
      cl::sub(compareCmd), cl::sub(checkCmd), cl::sub(frontierCmd),            \
      cl::sub(explainCmd), cl::sub(*cl::TopLevelSubCommand)
#define SOAP_MACHINE_CMDS                                                      \
  cl::sub(costCmd), cl::sub(simulateCmd), cl::sub(compareCmd),                 \
      cl::sub(checkCmd), cl::sub(frontierCmd), cl::sub(explainCmd),            \
      cl::sub(diffCmd), cl::sub(*cl::TopLevelSubCommand)
#define SOAP_SEARCH_CMDS                                                       \
  cl::sub(compareCmd), cl::sub(checkCmd), cl::sub(*cl::TopLevelSubCommand)

static cl::opt<std::string> planPath(cl::Positional, cl::Required,
                                     cl::desc("<plan.json>"), cl::sub(checkCmd),
                                     cl::sub(explainCmd), cl::sub(diffCmd),
                                     cl::sub(emitCmd));
static cl::opt<std::string> otherPlanPath(cl::Positional, cl::Required,
                                          cl::desc("<other-plan.json>"),
                                          cl::sub(diffCmd));
static cl::opt<std::string> modelPath(cl::Positional, cl::desc("<model.onnx>"),
                                      SOAP_MODEL_CMDS, cl::sub(emitCmd));
static cl::opt<std::string> topoPath(cl::Positional, cl::Required,
                                     cl::desc("<cluster.json>"),
                                     cl::sub(topoCmd));

static cl::opt<OutputFormat> format(
    "format",
    cl::desc("Output format (compare: a table on a terminal, CSV otherwise)"),
    cl::values(clEnumValN(OutputFormat::Table, "table", "aligned text"),
               clEnumValN(OutputFormat::Csv, "csv", "CSV (compare only)"),
               clEnumValN(OutputFormat::Json, "json",
                          "JSON (compare: one object per line)")),
    cl::init(OutputFormat::Auto), cl::sub(dumpCmd), cl::sub(topoCmd),
    cl::sub(costCmd), cl::sub(simulateCmd), cl::sub(compareCmd),
    cl::sub(explainCmd), cl::sub(diffCmd), cl::cat(soapCat));

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
                                        SOAP_MACHINE_CMDS, cl::sub(emitCmd),
                                        cl::cat(soapCat));
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
static cl::opt<std::string> precisionOpt(
    "precision",
    cl::desc("fp32, or bf16 mixed precision (bf16 activations, weights and "
             "gradients at the tensor-core rate; fp32 master weights and "
             "optimizer state), or fp8: bf16 with the linear layers' GEMMs "
             "in FP8 as Transformer Engine runs them (Hopper)"),
    cl::init("fp32"), SOAP_MACHINE_CMDS, cl::cat(soapCat));
static cl::opt<std::string> kernelsOpt(
    "kernels",
    cl::desc("fused (the default but for dump and cost: FlashAttention "
             "and fused element-wise epilogues, as "
             "Megatron-Core, NeMo and torchtitan run a transformer), "
             "no-flash (the epilogues fused, attention as batched GEMMs and a "
             "softmax that keep the scores: Megatron-LM before "
             "FlashAttention) or eager (one kernel per ONNX op, as eager "
             "PyTorch runs the export)"),
    cl::init("fused"), SOAP_MODEL_CMDS, cl::sub(diffCmd), cl::cat(soapCat));

static cl::opt<std::string>
    strategyOpt("strategy",
                cl::desc("The strategy to simulate: data (every op split by "
                         "sample over all devices), model (layer-wise "
                         "placement), expert (CNNs: data-parallel conv, "
                         "parameter-parallel dense; RNNs: GNMT), a plan "
                         "file (*.json) written by a search, or a what-if: "
                         "megatron:tp=T,pp=P,mbs=M,recompute=none|selective|"
                         "full,distopt=0|1 (also vp, cp, sp) or fsdp:zero="
                         "1|2|3,mbs=M,recompute=..."),
                cl::init("data"), cl::sub(simulateCmd), cl::cat(soapCat));
static cl::opt<std::string>
    traceOpt("trace",
             cl::desc("Write the simulated timeline as a Chrome trace "
                      "(chrome://tracing, Perfetto)"),
             cl::value_desc("trace.json"), cl::sub(simulateCmd),
             cl::cat(soapCat));
static cl::opt<bool> noFoldOpt(
    "no-fold",
    cl::desc("Simulate every device's tasks even when the strategy treats "
             "groups of nodes alike (by default one group is simulated: the "
             "same timeline; a trace then shows group 0's devices)"),
    cl::sub(simulateCmd), cl::cat(soapCat));

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
static cl::opt<std::string> timeoutOpt(
    "timeout",
    cl::desc("Wall-clock limit per searcher, such as 30s or 2m: a searcher "
             "past it gives its best plan so far (or the fastest baseline "
             "when it has none), marked as such"),
    cl::value_desc("duration"), SOAP_SEARCH_CMDS, cl::sub(frontierCmd),
    cl::cat(soapCat));
static cl::opt<int> jobsOpt(
    "jobs",
    cl::desc("compare: searchers run at once (default 0: all, so every row "
             "comes within --timeout; 1: one after another, rows in the "
             "listed order)"),
    cl::init(0), cl::sub(compareCmd), cl::cat(soapCat));
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
/// option of its own; main() removes it (removeLlvmThreadsOption) and then
/// creates ours.
static cl::opt<int> *threadsOpt = nullptr;
static cl::opt<double> betaOpt(
    "beta",
    cl::desc("MCMC's beta (FlexFlow Eq. 1) per second of iteration time; 0: "
             "a proposal 1% slower is accepted with probability e^-2"),
    cl::init(0), SOAP_SEARCH_CMDS, cl::cat(soapCat));
static cl::opt<std::string>
    outputOpt("o",
              cl::desc("Write the plan here (compare: a directory, one plan "
                       "per searcher as DIR/<searcher>.json)"),
              cl::value_desc("plan.json"), cl::sub(*cl::TopLevelSubCommand),
              cl::sub(simulateCmd), cl::sub(compareCmd), cl::cat(soapCat));
static cl::opt<bool> allowOtherTopologyOpt(
    "allow-other-topology",
    cl::desc("Use a plan on a cluster other than the one it was made for "
             "(refused otherwise; then a warning)"),
    cl::init(false), cl::sub(simulateCmd), cl::sub(explainCmd),
    cl::cat(soapCat));
static cl::opt<bool> allowOtherBatchOpt(
    "allow-other-batch",
    cl::desc("Use a plan at a --batch other than the one it was made for "
             "(refused otherwise; then a warning)"),
    cl::init(false), cl::sub(simulateCmd), cl::sub(explainCmd),
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
static cl::opt<std::string> ftMeshOpt(
    "mesh",
    cl::desc("Configurations: 1d (at most --max-split-loops loops split, "
             "the rest replicas), node (the sample loop over the devices, "
             "one other loop at most a node's devices ways), or auto (node "
             "on more than 64 devices in more than one node, else 1d)"),
    cl::init("auto"), cl::sub(frontierCmd), cl::cat(soapCat));
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
static cl::opt<unsigned> ftMicroBatchesOpt(
    "micro-batches",
    cl::desc("Gradient accumulation: the batch runs as this many "
             "micro-batches on the same devices (must divide it)"),
    cl::init(1), cl::sub(frontierCmd), cl::cat(soapCat));
static cl::opt<bool> ftZeroOpt(
    "zero",
    cl::desc("Also offer ZeRO stages 1-3 of every configuration whose "
             "weights are replicated (slower on graphs with many weighted "
             "ops)"),
    cl::init(false), cl::sub(frontierCmd), cl::cat(soapCat));
static cl::opt<bool> ftNoRecomputeOpt(
    "no-recompute",
    cl::desc("Offer no recomputed configurations (every op keeps what its "
             "backward reads)"),
    cl::init(false), cl::sub(frontierCmd), cl::cat(soapCat));
static cl::opt<bool>
    ftNoLdpOpt("no-ldp",
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

static cl::opt<std::string>
    dotOpt("dot",
           cl::desc("Write the plan graph (ops coloured by "
                    "configuration) as Graphviz DOT here"),
           cl::value_desc("plan.dot"), cl::sub(explainCmd), cl::cat(soapCat));
static cl::opt<std::string>
    svgOpt("svg",
           cl::desc("Draw the plan graph as SVG here (no Graphviz "
                    "needed)"),
           cl::value_desc("plan.svg"), cl::sub(explainCmd), cl::cat(soapCat));
static cl::opt<unsigned> topOpt("top",
                                cl::desc("Ops listed, by time on the "
                                         "critical path (0: all)"),
                                cl::init(10), cl::sub(explainCmd),
                                cl::cat(soapCat));

/// --target: its description lists the targets (main() sets it from the
/// registry, lib/Emit).
static cl::opt<std::string> targetOpt("target", cl::value_desc("name"),
                                      cl::sub(emitCmd), cl::cat(soapCat));
static cl::opt<std::string>
    emitOutputOpt("o",
                  cl::desc("Write the output here (atomically; default: "
                           "stdout)"),
                  cl::value_desc("path"), cl::sub(emitCmd), cl::cat(soapCat));

static cl::opt<bool> verbose("v", cl::desc("Verbose logging"),
                             cl::sub(*cl::AllSubCommands), cl::cat(soapCat));
static cl::opt<bool> quiet("q", cl::desc("Errors only"),
                           cl::sub(*cl::AllSubCommands), cl::cat(soapCat));

/// The flags as the driver library's options. Flags a plan also records
/// stay unset unless given, so the plan's values are used.
static DriverOptions driverOptions() {
  DriverOptions o;
  o.modelPath = modelPath;
  o.topologyPath = topoCmd ? std::string(topoPath) : std::string(topologyOpt);
  o.planPath = planPath;
  o.otherPlanPath = otherPlanPath;
  o.profilePath = profileOpt;
  if (batch.getNumOccurrences())
    o.batch = int64_t(batch);
  if (noLoss.getNumOccurrences())
    o.noLoss = bool(noLoss);
  if (unrollRnn.getNumOccurrences())
    o.unrollRnn = bool(unrollRnn);
  if (costModelOpt.getNumOccurrences())
    o.costModel = std::string(costModelOpt);
  if (optimizerOpt.getNumOccurrences())
    o.optimizer = std::string(optimizerOpt);
  if (precisionOpt.getNumOccurrences())
    o.precision = std::string(precisionOpt);
  if (kernelsOpt.getNumOccurrences())
    o.kernels = std::string(kernelsOpt);
  else if (dumpCmd || costCmd)
    o.kernels = "eager"; // the model as imported, as soap-profile lists it
  o.format = format;
  o.strategy = strategyOpt;
  o.tracePath = traceOpt;
  o.noFold = noFoldOpt;
  o.allowOtherTopology = allowOtherTopologyOpt;
  o.allowOtherBatch = allowOtherBatchOpt;
  o.search = searchOpt;
  o.budget = budgetOpt;
  o.timeout = timeoutOpt;
  o.jobs = jobsOpt;
  o.seed = seedOpt;
  o.space = spaceOpt;
  o.chains = chainsOpt;
  o.threads = *threadsOpt;
  o.beta = betaOpt;
  o.outputPath = frontierCmd ? std::string(ftOutputOpt)
                 : emitCmd   ? std::string(emitOutputOpt)
                             : std::string(outputOpt);
  o.emitTarget = targetOpt;
  o.ftMode = ftModeOpt;
  o.ftJsonPath = ftJsonOpt;
  o.ftSvgPath = ftSvgOpt;
  o.ftPoint = ftPointOpt;
  o.ftMaxSplitLoops = ftSplitOpt;
  o.ftMesh = ftMeshOpt;
  o.ftResolution = ftResolutionOpt;
  o.ftSimulate = ftSimulateOpt;
  o.ftNoReuse = ftNoReuseOpt;
  o.ftNoLdp = ftNoLdpOpt;
  o.ftNoRecompute = ftNoRecomputeOpt;
  o.ftZero = ftZeroOpt;
  o.ftMicroBatches = ftMicroBatchesOpt;
  o.research = researchOpt;
  o.tolerance = toleranceOpt;
  o.dotPath = dotOpt;
  o.svgPath = svgOpt;
  o.top = topOpt;
  o.quiet = quiet;
  return o;
}

static int dispatch(const DriverOptions &o);

/// The subcommands by name.
static std::vector<cl::SubCommand *> subcommands() {
  return {&dumpCmd,    &topoCmd,    &costCmd, &simulateCmd, &checkCmd,
          &compareCmd, &explainCmd, &diffCmd, &frontierCmd, &emitCmd};
}

/// What LLVM's parser does not say well, said before it runs: `soapc help
/// CMD` is `soapc CMD --help`; a misspelt subcommand is named with the one
/// meant; an option that is the start of one option's name (`--topo`)
/// suggests that one, where LLVM would suggest the nearest by edit
/// distance (`-o`). Returns an exit code when it has answered.
static std::optional<int> preParse(std::vector<const char *> &args) {
  if (args.size() >= 2 && llvm::StringRef(args[1]) == "help") {
    args.erase(args.begin() + 1);
    args.push_back("--help");
  }
  cl::SubCommand *sub = &*cl::TopLevelSubCommand;
  if (args.size() >= 2 && args[1][0] != '-') {
    llvm::StringRef first = args[1];
    cl::SubCommand *named = nullptr;
    for (cl::SubCommand *c : subcommands())
      if (first == c->getName())
        named = c;
    if (named) {
      sub = named;
    } else if (!first.empty() && !llvm::sys::fs::exists(first) &&
               !first.contains('.') && !first.contains('/')) {
      // Not a model file: the nearest subcommand, when it is near.
      cl::SubCommand *near = nullptr;
      unsigned best = 3;
      for (cl::SubCommand *c : subcommands()) {
        llvm::StringRef n = c->getName();
        unsigned dist = n.startswith(first) ? 1 : first.edit_distance(n);
        if (dist < best) {
          best = dist;
          near = c;
        }
      }
      if (near) {
        llvm::errs() << "soapc: error: unknown subcommand '" << first
                     << "'; did you mean '" << near->getName() << "'?\n";
        return static_cast<int>(ExitCode::InvalidInput);
      }
    }
  }
  auto &opts = cl::getRegisteredOptions(*sub);
  for (size_t i = 1; i < args.size(); ++i) {
    llvm::StringRef a = args[i];
    if (a == "--")
      break;
    if (!a.startswith("-") || a == "-")
      continue;
    llvm::StringRef name = a.ltrim('-').split('=').first;
    if (name.empty() || opts.count(name))
      continue;
    std::string only;
    size_t prefixOf = 0;
    for (const auto &entry : opts) {
      llvm::StringRef key = entry.getKey();
      if (key.startswith(name) && !entry.getValue()->isPositional() &&
          entry.getValue()->getOptionHiddenFlag() == cl::NotHidden) {
        ++prefixOf;
        only = key.str();
      }
    }
    if (prefixOf == 1) {
      llvm::errs() << "soapc: error: unknown option '" << a.split('=').first
                   << "'; did you mean '--" << only << "'?\n";
      return static_cast<int>(ExitCode::InvalidInput);
    }
  }
  return std::nullopt;
}

int main(int argc, char **argv) {
  removeLlvmThreadsOption();
  static cl::opt<int> threads(
      "threads",
      cl::desc("Threads running mcmc's chains and ft's DP (default: every "
               "core the process may run on; the result does not depend on "
               "it)"),
      cl::init(0), SOAP_SEARCH_CMDS, cl::sub(frontierCmd), cl::cat(soapCat));
  threadsOpt = &threads;
  registerAllSearchers();
  std::string searchers;
  for (const auto &[name, info] : SearcherRegistry::instance().all())
    searchers += fmt::format("    {:<10} {}\n", name, info.description);
  std::string targets = "The engine to write the plan for:";
  for (const EmitTarget &t : emitTargets())
    targets += fmt::format("\n      {:<10} {}", t.name, t.description);
  targetOpt.setDescription(targets);
  cl::SetVersionPrinter([](llvm::raw_ostream &os) {
    os << "soapc 0.1.0 — strategy search for distributed DNN training\n";
  });
  cl::HideUnrelatedOptions(soapCat);
  // One usage line per subcommand ("": the search itself), in this order
  // in `soapc --help`; `soapc CMD --help` shows CMD's line alone, and the
  // searchers where CMD takes --search.
  static const std::pair<llvm::StringRef, const char *> usages[] = {
      {"", "soapc model.onnx --topology cluster.json [--search mcmc] "
           "[--budget 20000|30s] [--timeout 2m] [--seed N] [-o plan.json]"},
      {"compare", "soapc compare model.onnx --topology cluster.json --search "
                  "mcmc,data,model,expert [--timeout 30s] [--jobs J] "
                  "[--format table|csv|json]"},
      {"frontier",
       "soapc frontier model.onnx --topology cluster.json "
       "[--mode frontier|mini-time|mini-parallelism|profile] [--write-json F] "
       "[--svg F] [--point N -o plan.json]"},
      {"check", "soapc check plan.json [model.onnx] [--topology cluster.json] "
                "[--research --tolerance 2%]"},
      {"explain",
       "soapc explain plan.json [model.onnx] [--topology cluster.json] "
       "[--top N] [--dot plan.dot] [--svg plan.svg] [--format table|json]"},
      {"diff", "soapc diff a.json b.json [--format table|json]"},
      {"emit", "soapc emit plan.json [model.onnx] --target "
               "megatron|nemo|torchtitan|dtensor [-o PATH]"},
      {"simulate", "soapc simulate model.onnx --topology cluster.json "
                   "[--strategy data|model|expert|plan.json] "
                   "[--trace trace.json]"},
      {"cost", "soapc cost model.onnx --topology cluster.json "
               "[--cost-model analytic|profile|strict]"},
      {"dump", "soapc dump model.onnx [--batch N] [--format table|json]"},
      {"topo", "soapc topo cluster.json [--format table|json]"}};
  std::vector<const char *> args(argv, argv + argc);
  if (std::optional<int> rc = preParse(args))
    return *rc;
  llvm::StringRef named;
  for (cl::SubCommand *c : subcommands())
    if (args.size() >= 2 && llvm::StringRef(args[1]) == c->getName())
      named = c->getName();
  std::string overview = "soapc: search how to split every operator of a "
                         "DNN across a GPU cluster\n\n";
  for (const auto &[name, usage] : usages)
    if (named.empty() || name == named)
      overview += fmt::format("  {}\n", usage);
  if (named.empty() || named == "compare" || named == "check")
    overview += "\n  searchers:\n" + searchers;
  if (!cl::ParseCommandLineOptions(int(args.size()), args.data(), overview,
                                   &llvm::errs()))
    return static_cast<int>(ExitCode::InvalidInput);
  setupLogging(quiet ? -1 : verbose ? 1 : 0);
  DriverOptions o = driverOptions();
  // A search whose task graphs outgrow the machine's memory (mcmc on
  // 1,024 GPUs keeps one per chain and start) ends with one line, not an
  // abort.
  try {
    return dispatch(o);
  } catch (const std::bad_alloc &) {
    llvm::errs() << "soapc: error: out of memory: the task graphs of this "
                    "model on this topology do not fit in this machine's "
                    "RAM; try a searcher that builds fewer (data, megatron, "
                    "pipeline) or fewer --chains\n";
    return static_cast<int>(ExitCode::Internal);
  }
}

static int dispatch(const DriverOptions &o) {
  llvm::Error err = llvm::Error::success();
  if (dumpCmd)
    err = runDump(o);
  else if (topoCmd)
    err = runTopo(o);
  else if (costCmd)
    err = runCost(o);
  else if (simulateCmd)
    err = runSimulate(o);
  else if (compareCmd)
    err = runCompare(o);
  else if (checkCmd)
    err = runCheck(o);
  else if (frontierCmd)
    err = runFrontier(o);
  else if (explainCmd)
    err = runExplain(o);
  else if (diffCmd)
    err = runDiff(o);
  else if (emitCmd)
    err = runEmit(o);
  else if (!modelPath.empty())
    err = runSearchCommand(o);
  else {
    llvm::errs() << "soapc: error: no model given; try 'soapc model.onnx "
                    "--topology cluster.json' or 'soapc --help'\n";
    return static_cast<int>(ExitCode::InvalidInput);
  }
  if (err)
    return reportError(std::move(err), "soapc");
  return 0;
}
