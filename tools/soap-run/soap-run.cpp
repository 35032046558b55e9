// soap-run: the reference executor. Runs training steps of a model under a
// plan, one MPI rank per device of the plan, and prints each step's loss and
// wall time, so a plan on N ranks can be checked against the same model on
// one; --memory adds each rank's measured peak bytes beside the simulator's
// prediction for its device.
//
//   mpirun -np N soap-run model.onnx plan.json [--steps K] [--seed S]
//   soap-run model.onnx plan.json            (a plan for one device)
#include "soap/Driver/Session.h"
#include "soap/Exec/Executor.h"
#include "soap/Import/OnnxImporter.h"
#include "soap/Machine/TopologyLoader.h"
#include "soap/Plan/Plan.h"
#include "soap/Sim/TaskGraph.h"
#include "soap/Support/Error.h"
#include "soap/Support/Sha256.h"
#include "soap/Support/ToolOptions.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/raw_ostream.h"
#include <algorithm>
#include <fmt/format.h>

using namespace soap;
namespace cl = llvm::cl;

static cl::OptionCategory runCat("soap-run options");
static cl::opt<std::string> modelPath(cl::Positional, cl::desc("<model.onnx>"),
                                      cl::cat(runCat));
static cl::opt<std::string> planPath(cl::Positional, cl::desc("<plan.json>"),
                                     cl::cat(runCat));
static cl::opt<int64_t> stepsOpt("steps", cl::desc("Training steps to run"),
                                 cl::init(3), cl::cat(runCat));
static cl::opt<uint64_t>
    seedOpt("seed",
            cl::desc("Seed of the weights, inputs, labels and dropout masks "
                     "(drawn by global element index)"),
            cl::init(0), cl::cat(runCat));
static cl::opt<double> lrOpt(
    "lr",
    cl::desc("Learning rate (of the plan's optimizer: sgd, momentum or adam)"),
    cl::init(0.1), cl::cat(runCat));
static cl::opt<std::string>
    dumpOpt("dump-weights",
            cl::desc("Write the final weights to this directory (rank 0): "
                     "<id>-<name>.f32 and weights.json"),
            cl::value_desc("dir"), cl::cat(runCat));
static cl::opt<std::string> dumpForwardOpt(
    "dump-forward",
    cl::desc("Write step 1's forward to this directory (rank 0): the inputs "
             "as drawn, the weights as read, the model's outputs, and "
             "forward.json listing them"),
    cl::value_desc("dir"), cl::cat(runCat));
static cl::opt<std::string>
    topologyOpt("topology",
                cl::desc("Refuse the plan unless it was made for this "
                         "cluster description"),
                cl::value_desc("cluster.json"), cl::cat(runCat));

static cl::opt<bool>
    memoryOpt("memory",
              cl::desc("Print each rank's measured peak bytes (weights, "
                       "gradients, optimizer state, activations, buffers) "
                       "beside the simulator's prediction for its device, "
                       "from the model, topology and cost model the plan "
                       "records (--topology if given)"),
              cl::init(false), cl::cat(runCat));
static cl::opt<std::string>
    backendOpt("backend",
               cl::desc("Kernel backend: cpu, or cuda (contractions and "
                        "element-wise ops on the rank's GPU) when built with "
                        "CUDA"),
               cl::init("cpu"), cl::cat(runCat));
/// --threads: libLLVM registers an unrelated, undocumented "threads"
/// option of its own; main() removes it (removeLlvmThreadsOption) and then
/// creates ours.
static cl::opt<int> *threadsOpt = nullptr;
static cl::opt<std::string>
    commOpt("comm",
            cl::desc("Communication: mpi, or nccl (grouped send/recv on the "
                     "rank's GPU, bootstrapped through MPI) when built with "
                     "NCCL"),
            cl::init("mpi"), cl::cat(runCat));

/// The exit code of an error, consuming it without printing.
static int exitCodeOf(llvm::Error err) {
  int code = static_cast<int>(ExitCode::Internal);
  llvm::handleAllErrors(
      std::move(err),
      [&](const SoapError &e) { code = static_cast<int>(e.code()); },
      [&](const llvm::ErrorInfoBase &) {});
  return code;
}

/// The simulator's peak memory of every device under the plan, as
/// `soapc simulate` computes it for a runtime that runs each op's backward
/// whole, as soap-run does.
static llvm::Expected<std::vector<TaskGraph::DeviceMemory>> predictedMemory() {
  DriverOptions o;
  o.modelPath = modelPath;
  o.topologyPath = topologyOpt;
  o.quiet = true;
  auto ps = openPlan(o, planPath);
  if (!ps)
    return ps.takeError();
  SimContext ctx = ps->session->problem().context();
  // soap-run runs an op's backward whole: its weight gradients are not
  // deferred, so nothing is held for them.
  ctx.splitWeightGrad = false;
  auto tg = TaskGraph::build(ctx, ps->strategy);
  if (!tg)
    return tg.takeError();
  return tg->memory();
}

static llvm::Error run(Comm &comm) {
  if (modelPath.empty() || planPath.empty())
    return inputError("usage: soap-run model.onnx plan.json [--steps K] "
                      "[--seed S] [--dump-weights DIR] [--dump-forward DIR]");
  ExecOptions opts;
  opts.steps = stepsOpt;
  opts.seed = seedOpt;
  opts.learningRate = lrOpt;
  opts.dumpWeightsDir = dumpOpt;
  opts.dumpForwardDir = dumpForwardOpt;
  opts.backend = backendOpt;
  opts.threads = *threadsOpt;
  if (threadsOpt->getNumOccurrences() > 0 && *threadsOpt < 1)
    return inputError("--threads must be at least 1, got {}",
                      threadsOpt->getValue());
  if (auto err = opts.validate())
    return err;
  std::vector<std::string> comms = builtCommBackends();
  if (commOpt != "mpi" && commOpt != "nccl")
    return inputError("--comm '{}': expected mpi or nccl", commOpt.getValue());
  // Without MPI one rank still runs (the default needs no launcher); asking
  // for a backend that is not built is an error.
  if (commOpt.getNumOccurrences() > 0 &&
      std::find(comms.begin(), comms.end(), commOpt.getValue()) == comms.end())
    return inputError("--comm '{}': not built in", commOpt.getValue());
  auto plan = readPlan(planPath);
  if (!plan)
    return plan.takeError();
  // Refused before anything else is read: there are no FP8 kernels here.
  if (plan->inputs.precision == "fp8") {
    ExecOptions fp8 = opts;
    fp8.precision = plan->inputs.precision;
    if (auto err = fp8.validate())
      return inputError("{}: /search/precision: {}", planPath.getValue(),
                        toString(std::move(err)));
  }
  auto modelSha = sha256File(modelPath);
  if (!modelSha)
    return modelSha.takeError();
  if (*modelSha != plan->inputs.modelSha256)
    return inputError("{}: /model/sha256: the plan was made for another "
                      "model ({}), not {}",
                      planPath.getValue(), plan->inputs.modelPath,
                      modelPath.getValue());
  Topology topo;
  if (!topologyOpt.empty()) {
    auto sha = sha256File(topologyOpt);
    if (!sha)
      return sha.takeError();
    if (*sha != plan->inputs.topologySha256)
      return inputError("{}: /topology/sha256: the plan was made for another "
                        "topology ({}), not {}",
                        planPath.getValue(), plan->inputs.topologyPath,
                        topologyOpt.getValue());
    auto t = loadTopology(topologyOpt);
    if (!t)
      return t.takeError();
    topo = std::move(*t);
  } else {
    // Only the device count matters here: one rank per device.
    topo.setName(plan->topologyName);
    for (int64_t d = 0; d < plan->numDevices; ++d)
      topo.addDevice(
          topo.addVertex(VertexKind::Device, fmt::format("gpu{}", d), 0, 0), 0,
          static_cast<uint32_t>(d), 0, 0);
  }
  if (plan->numDevices != comm.size())
    return inputError("{}: /topology/devices: the plan is for {} devices "
                      "(topology '{}'); run it on as many ranks, not {}",
                      planPath.getValue(), plan->numDevices, plan->topologyName,
                      comm.size());
  ImportOptions io;
  io.batch = plan->inputs.batch;
  io.appendLoss = plan->inputs.appendLoss;
  // Weights stored as external data must be there (the zoo's GPT-3 files
  // have only dims); stripped weights without external data are seeded.
  io.requireExternalData = true;
  io.keepConstantData = true; // masks are computed with, not only sized
  io.unrollRnn = plan->inputs.unrollRnn;
  io.kernels = *parseKernelMode(plan->inputs.kernels); // checked by readPlan
  auto g = importOnnx(modelPath, io);
  if (!g)
    return g.takeError();
  std::unique_ptr<Graph> graph = std::move(*g);
  // bf16 plans run on the CPU kernels (bf16 storage, fp32 accumulation,
  // fp32 master weights); refused before any compute where they cannot.
  opts.optimizer = plan->inputs.optimizer;
  if (auto err = opts.validate())
    return err;
  opts.precision = plan->inputs.precision;
  if (auto err = opts.validate())
    return inputError("{}: /search/precision: {}", planPath.getValue(),
                      toString(std::move(err)));
  auto strategy = planStrategy(*plan, *graph, topo, planPath);
  if (!strategy)
    return strategy.takeError();
  if (auto err = checkExecutable(*graph))
    return err;
  if (auto err = prepareBackend(opts, comm))
    return err;
  std::unique_ptr<Comm> nccl;
  if (commOpt == "nccl") {
    auto c = createNcclComm(comm);
    if (!c)
      return c.takeError();
    nccl = std::move(*c);
  }
  if (comm.rank() == 0)
    llvm::outs() << fmt::format(
        "soap-run: {} ({} ops, batch {}) under {} ({}): {} rank{} ({}, {}{}), "
        "{} steps, seed {}, {} thread{} per rank\n",
        modelPath.getValue(), graph->numOps(), plan->inputs.batch,
        planPath.getValue(), plan->inputs.searcher, comm.size(),
        comm.size() == 1 ? "" : "s", opts.backend,
        nccl ? nccl->name() : comm.name(),
        opts.precision == "fp32" ? "" : ", " + opts.precision, opts.steps,
        opts.seed,
        kernelThreads(opts, comm), kernelThreads(opts, comm) == 1 ? "" : "s");
  // The prediction first (every rank, so an unreadable topology stops all
  // of them before any step).
  std::vector<TaskGraph::DeviceMemory> predicted;
  if (memoryOpt) {
    auto pred = predictedMemory();
    if (!pred)
      return pred.takeError();
    predicted = std::move(*pred);
  }
  auto steps = runTraining(*graph, *strategy, nccl ? *nccl : comm, opts);
  if (!steps) {
    // An error met by some ranks only (a GPU failure, an unwritable
    // --dump-weights directory) would leave the others waiting.
    if (comm.size() > 1) {
      int code = reportError(steps.takeError(), "soap-run");
      comm.abort(code);
      return makeError(static_cast<ExitCode>(code), "aborted");
    }
    return steps.takeError();
  }
  if (comm.rank() == 0) {
    for (size_t k = 0; k < steps->size(); ++k)
      llvm::outs() << fmt::format("step {} loss {:.9g} time {:.6f} s\n", k + 1,
                                  (*steps)[k].loss, (*steps)[k].seconds);
    if (memoryOpt) {
      std::vector<int64_t> peak((*steps)[0].peakBytes.size(), 0);
      for (const StepResult &r : *steps)
        for (size_t k = 0; k < peak.size(); ++k)
          peak[k] = std::max(peak[k], r.peakBytes[k]);
      for (size_t k = 0; k < peak.size(); ++k) {
        const TaskGraph::DeviceMemory &m = predicted[k];
        llvm::outs() << fmt::format(
            "memory: rank {} peak {} bytes measured, {} predicted (weights "
            "{}, gradients {}, optimizer {}, saved {}, buffers {}, "
            "workspace {}), measured/predicted {}\n",
            k, peak[k], m.total(), m.weights, m.gradients, m.optimizer, m.saved,
            m.buffers, m.workspace,
            // A rank the plan gives nothing holds nothing: no ratio.
            m.total() > 0
                ? fmt::format("{:.3f}", double(peak[k]) / double(m.total()))
                : std::string(peak[k] > 0 ? "inf" : "-"));
      }
    }
    if (!opts.dumpForwardDir.empty())
      llvm::outs() << "forward: " << opts.dumpForwardDir << "\n";
    if (!opts.dumpWeightsDir.empty())
      llvm::outs() << "weights: " << opts.dumpWeightsDir << "\n";
    llvm::outs().flush();
  }
  return llvm::Error::success();
}

int main(int argc, char **argv) {
  removeLlvmThreadsOption();
  static cl::opt<int> threads(
      "threads",
      cl::desc("Threads of each rank's CPU kernels (default: the cores this "
               "process may use / the ranks on its machine, at least 1)"),
      cl::init(0), cl::cat(runCat));
  threadsOpt = &threads;
  std::unique_ptr<Comm> comm = createComm(argc, argv);
  cl::SetVersionPrinter([](llvm::raw_ostream &os) {
    os << "soap-run 0.1.0 — the reference executor of soapc plans\n";
  });
  cl::HideUnrelatedOptions(runCat);
  std::string overview =
      "soap-run: run training steps of a model under a soapc plan, one rank "
      "per "
      "device\n\n"
      "  mpirun -np N soap-run model.onnx plan.json [--steps K] [--seed S] "
      "[--dump-weights DIR] [--dump-forward DIR]\n"
      "  soap-run model.onnx plan.json   (a plan for one device)\n";
  int code = 0;
  if (!cl::ParseCommandLineOptions(argc, argv, overview,
                                   comm->rank() == 0 ? &llvm::errs()
                                                     : &llvm::nulls()))
    code = static_cast<int>(ExitCode::InvalidInput);
  else if (llvm::Error err = run(*comm))
    code = comm->rank() == 0 ? reportError(std::move(err), "soap-run")
                             : exitCodeOf(std::move(err));
  finalizeComm(std::move(comm));
  return code;
}
