// soap-profile: fills a cost database (profiles/<device>.json) by measuring,
// on a CUDA GPU or (--backend cpu, under mpirun) with soap-run's CPU kernels
// and MPI, the op-tile signatures the searchers will ask for; lists those
// signatures without a GPU; merges databases; replays plans' compute.
//   soap-profile model.onnx... --topology T [--devices 8,16] -o profiles/h100-sxm.json
//   mpirun -np N soap-profile --backend cpu model.onnx... --topology T -o profiles/cpu.json
//   soap-profile --list model.onnx... --topology T [--devices 8,16] [--profile P]
//   soap-profile --merge a.json b.json... -o out.json
//   soap-profile --replay plan.json... [--profile P] -o replay.json
#include "CpuRuns.h"
#include "MeasurePlan.h"
#include "Replay.h"
#include "SignatureSet.h"
#include "soap/Cost/CostDatabase.h"
#include "soap/Exec/Executor.h"
#include "soap/Exec/TileTiming.h"
#include "soap/Support/Cores.h"
#include "soap/Machine/TopologyLoader.h"
#include "soap/Support/Error.h"
#include "soap/Support/Format.h"
#include "soap/Support/Json.h"
#include "soap/Support/ToolOptions.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/raw_ostream.h"

#if SOAP_HAVE_CUDA
#include "GpuRuns.h"
#endif

using namespace soap;
namespace cl = llvm::cl;

static cl::OptionCategory cat("soap-profile options");

static cl::list<std::string> inputs(cl::Positional,
                                    cl::desc("<model.onnx | profile.json | "
                                             "plan.json>..."),
                                    cl::cat(cat));
static cl::opt<bool> listMode("list",
                              cl::desc("Print the signatures (or, with "
                                       "--replay, the tasks) and their "
                                       "counts; measure nothing"),
                              cl::cat(cat));
static cl::opt<bool> mergeMode("merge",
                               cl::desc("Merge the given profiles in order "
                                        "(later entries win) into -o"),
                               cl::cat(cat));
static cl::opt<bool> replayMode(
    "replay",
    cl::desc("Run every device's compute tasks of the given plans on this "
             "GPU in turn and write each task's measured time beside the "
             "simulator's prediction"),
    cl::cat(cat));
static cl::opt<std::string> topologyOpt("topology",
                                        cl::desc("Cluster description: its "
                                                 "device type names the "
                                                 "profile"),
                                        cl::value_desc("cluster.json"),
                                        cl::cat(cat));
static cl::opt<std::string>
    devicesOpt("devices",
               cl::desc("Device counts whose configuration spaces to cover, "
                        "e.g. 8,16 (default: the topology's)"),
               cl::cat(cat));
static cl::opt<int64_t> batchOpt("batch",
                                 cl::desc("Samples per iteration (default: 64 "
                                          "per device of each count)"),
                                 cl::init(0), cl::cat(cat));
static cl::opt<std::string> microBatchesOpt(
    "micro-batches",
    cl::desc("Also cover the tiles of plans with these micro-batch counts "
             "(of batch / m samples, where m divides the batch), e.g. 1,2,4 "
             "(default 1)"),
    cl::init("1"), cl::cat(cat));
static cl::opt<std::string> spaceOpt("space",
                                     cl::desc("Configuration space: flexflow "
                                              "or full"),
                                     cl::init("flexflow"), cl::cat(cat));
static cl::opt<bool> noLoss("no-loss",
                            cl::desc("Do not append a loss (as soapc)"),
                            cl::cat(cat));
static cl::opt<std::string> precisionOpt(
    "precision", cl::desc("Element type of the tiles, as soapc: fp32 or bf16"),
    cl::init("fp32"), cl::cat(cat));
static cl::opt<std::string> kernelsOpt(
    "kernels",
    cl::desc("The graph whose tiles to enumerate, as soapc: eager (the "
             "default), fused or no-flash"),
    cl::init("eager"), cl::cat(cat));
static cl::opt<bool> unrollRnn("unroll-rnn",
                               cl::desc("Unroll LSTMs (as soapc)"),
                               cl::cat(cat));
static cl::opt<std::string>
    profileOpt("profile",
               cl::desc("A cost database: --list counts the signatures it "
                        "has; --replay predicts with it"),
               cl::value_desc("profile.json"), cl::cat(cat));
static cl::opt<std::string> outputOpt("o", cl::desc("Output file"),
                                      cl::value_desc("file.json"),
                                      cl::cat(cat));
enum class Format { Table, Json };
static cl::opt<Format>
    formatOpt("format", cl::desc("--list and --replay output"),
              cl::values(clEnumValN(Format::Table, "table", "text"),
                         clEnumValN(Format::Json, "json", "JSON")),
              cl::init(Format::Table), cl::cat(cat));
static cl::opt<int> warmupOpt("warmup",
                              cl::desc("Untimed runs before timing"),
                              cl::init(5), cl::cat(cat));
static cl::opt<int> repeatsOpt("repeats",
                               cl::desc("Timed runs; the median is kept"),
                               cl::init(25), cl::cat(cat));
static cl::opt<bool> tf32Opt("tf32",
                             cl::desc("Allow TF32 tensor cores for f32 in "
                                      "cuBLAS and cuDNN"),
                             cl::cat(cat));
static cl::opt<bool> flushL2Opt("flush-l2",
                                cl::desc("Evict the L2 cache before every "
                                         "timed run"),
                                cl::cat(cat));
static cl::opt<bool> cudnnFindOpt("cudnn-find",
                                  cl::desc("Choose convolution algorithms by "
                                           "timing them (slower to profile)"),
                                  cl::cat(cat));
static cl::opt<double>
    timeLimitOpt("time-limit",
                 cl::desc("Stop measuring after this many seconds, keeping "
                          "what was measured (0: no limit)"),
                 cl::init(0), cl::cat(cat));
static cl::opt<bool> remeasureOpt("remeasure",
                                  cl::desc("Measure signatures the output "
                                           "profile already has"),
                                  cl::cat(cat));
static cl::opt<std::string>
    deviceOpt("device",
              cl::desc("Catalog name of the GPU measured, e.g. H200-SXM "
                       "(default: the topology's device type)"),
              cl::cat(cat));
static cl::opt<bool>
    fromPlansOpt("from-plans",
                 cl::desc("Measure the tiles of the given plans' compute "
                          "tasks instead of a configuration space"),
                 cl::cat(cat));
static cl::opt<int> gpuOpt("gpu", cl::desc("CUDA device ordinal"),
                           cl::init(0), cl::cat(cat));
static cl::opt<std::string>
    backendOpt("backend",
               cl::desc("What measures: cuda (cuBLAS, cuDNN on a GPU) or cpu "
                        "(soap-run's CPU kernels and MPI, one rank per "
                        "device, under mpirun)"),
               cl::init("cuda"), cl::cat(cat));
/// --threads: libLLVM registers an unrelated, undocumented "threads"
/// option of its own; main() removes it (removeLlvmThreadsOption) and then
/// creates ours.
static cl::opt<int> *threadsOpt = nullptr;
static cl::opt<int64_t> collectiveBytesOpt(
    "collective-bytes",
    cl::desc("--backend cpu: the largest message of the MPI collective "
             "curves (sizes 4 B up to it, doubling; 0: none)"),
    cl::init(int64_t(64) << 20), cl::cat(cat));
static cl::opt<bool> tasksOpt("tasks",
                              cl::desc("--replay: write every task, not "
                                       "only the totals"),
                              cl::cat(cat));

static llvm::Expected<EnumerateOptions> enumerateOptions() {
  EnumerateOptions o;
  o.models.assign(inputs.begin(), inputs.end());
  if (batchOpt.getNumOccurrences() && batchOpt <= 0)
    return inputError("--batch must be at least 1, got {}", int64_t(batchOpt));
  o.batch = batchOpt;
  if (!devicesOpt.empty()) {
    auto d = parseDeviceCounts(devicesOpt);
    if (!d)
      return d.takeError();
    o.deviceCounts = *d;
  }
  auto mb = parseMicroBatches(microBatchesOpt);
  if (!mb)
    return mb.takeError();
  o.microBatches = *mb;
  auto space = parseSpaceKind(spaceOpt);
  if (!space)
    return inputError("--space must be flexflow or full, got '{}'",
                      spaceOpt.getValue());
  o.space = *space;
  o.unrollRnn = unrollRnn;
  o.appendLoss = !noLoss;
  auto precision = parsePrecision(precisionOpt);
  if (!precision || *precision == Precision::FP8)
    return inputError("--precision must be fp32 or bf16, got '{}'",
                      precisionOpt.getValue());
  o.precision = *precision;
  auto kernels = parseKernelMode(kernelsOpt);
  if (!kernels)
    return inputError("--kernels must be eager, fused or no-flash, got '{}'",
                      kernelsOpt.getValue());
  o.kernels = *kernels;
  if (auto err = o.validate())
    return llvm::Error(std::move(err));
  return o;
}

static llvm::Expected<Topology> topology() {
  if (topologyOpt.empty())
    return inputError("--topology is required");
  return loadTopology(topologyOpt);
}

static llvm::Expected<std::optional<CostDatabase>>
loadProfileFor(const std::string &path, llvm::StringRef device) {
  if (path.empty())
    return std::nullopt;
  auto db = CostDatabase::load(path);
  if (!db)
    return db.takeError();
  if (!device.empty() && db->env.device != device)
    return inputError("{}: a profile of '{}', but the topology's devices are "
                      "'{}'",
                      path, db->env.device, device.str());
  return std::optional<CostDatabase>(std::move(*db));
}

static llvm::Expected<SignatureSet> enumerateFromOptions(const Topology &t) {
  auto o = enumerateOptions();
  if (!o)
    return o.takeError();
  return SignatureSet::enumerate(*o, t.deviceSpec(),
                                 static_cast<int64_t>(t.numDevices()));
}

static llvm::Expected<SignatureSet>
signaturesToMeasure(std::vector<ReplayPlan> &plans, std::string &device);

static llvm::Error runList() {
  std::vector<ReplayPlan> plans;
  std::string device;
  auto set = signaturesToMeasure(plans, device);
  if (!set)
    return set.takeError();
  auto db = loadProfileFor(profileOpt, device);
  if (!db)
    return db.takeError();
  size_t have = 0;
  std::map<std::string, size_t> methods;
  std::map<std::string, const char *> methodOf;
  for (const auto &[sig, info] : set->signatures()) {
    have += *db && (*db)->find(sig);
    const SignatureSite &site = info.site;
    const Op &op = site.graph->op(site.op);
    const char *m = measureMethod(*site.graph, op, site.tile);
    ++methods[m];
    methodOf[sig] = m;
    // The cuBLAS products must do the FLOPs the IR counts, else the
    // measured time belongs to another computation.
    // cuDNN's output for the geometry it is given must be the tile's.
    if (auto w = planWindow(*site.graph, op, site.tile, sig))
      if (w->output() != w->expectedOutput)
        llvm::errs() << fmt::format(
            "soap-profile: warning: {}: cuDNN would compute an output of {}, "
            "the tile's is {}\n",
            sig, fmt::join(w->output(), "x"),
            fmt::join(w->expectedOutput, "x"));
    // Forward alone, backward as a whole (the IR counts a product of two
    // activations' second gradient as backward-weight; cuBLAS computes it
    // with the first), up to the bias the IR counts too.
    if (auto plan = planGemm(*site.graph, op, site.tile)) {
      auto ir = [&](Pass p) { return op.sem.tileFlops(p, site.tile); };
      double irF = ir(Pass::Forward),
             irB = ir(Pass::BackwardData) + ir(Pass::BackwardWeight);
      double libF = plan->flops(Pass::Forward),
             libB = plan->flops(Pass::BackwardData) +
                    plan->flops(Pass::BackwardWeight);
      double slack = 2.0 * double(plan->batch * plan->m * plan->n);
      for (auto [pass, a, b] : {std::tuple{"forward", libF, irF},
                                {"backward", libB, irB}})
        if (std::abs(a - b) > 0.01 * std::max(a, b) + slack)
          llvm::errs() << fmt::format(
              "soap-profile: warning: {}: the cuBLAS products of the {} "
              "pass do {} FLOPs, the IR counts {}\n",
              sig, pass, a, b);
    }
  }
  Json j = {{"device", device},
            {"space", spaceOpt.getValue()},
            {"signatures", set->signatures().size()}};
  if (*db) {
    j["profile"] = profileOpt.getValue();
    j["in_profile"] = have;
    j["missing"] = set->signatures().size() - have;
  }
  Json cov = Json::array();
  for (const CoverageRow &r : set->coverage())
    cov.push_back({{"model", r.model},
                   {"devices", r.devices},
                   {"batch", r.batch},
                   {"ops", r.ops},
                   {"shapes", r.shapes},
                   {"signatures", r.signatures}});
  j["coverage"] = cov;
  j["kinds"] = set->kindCounts();
  j["methods"] = methods;
  Json sigs = Json::array();
  for (const auto &[sig, info] : set->signatures()) {
    Json s = {{"signature", sig},
              {"kind", info.kind},
              {"tiles", info.tiles},
              {"method", methodOf[sig]},
              {"devices", info.deviceCounts}};
    if (*db)
      s["in_profile"] = (*db)->find(sig) != nullptr;
    sigs.push_back(s);
  }
  j["list"] = sigs;
  llvm::raw_ostream &os = llvm::outs();
  if (formatOpt == Format::Json) {
    os << dumpJson(j);
    return llvm::Error::success();
  }
  os << "device: " << device << "\n";
  if (!fromPlansOpt)
    os << "space: " << spaceOpt << "\n";
  Table ct({"model", "devices", "batch", "ops", "split shapes", "signatures"},
           {false, true, true, true, true, true});
  for (const CoverageRow &r : set->coverage())
    ct.addRow({r.model, std::to_string(r.devices), std::to_string(r.batch),
               std::to_string(r.ops), withCommas(int64_t(r.shapes)),
               withCommas(int64_t(r.signatures))});
  if (!set->coverage().empty())
    ct.print(os);
  os << "distinct signatures: " << set->signatures().size() << "\n";
  if (*db)
    os << fmt::format("in {}: {}, missing: {}\n", profileOpt.getValue(), have,
                      set->signatures().size() - have);
  os << "by kind:";
  for (const auto &[kind, n] : set->kindCounts())
    os << " " << kind << " " << n;
  os << "\nby method:";
  for (const auto &[m, n] : methods)
    os << " " << m << " " << n;
  os << "\n";
  for (const auto &[sig, info] : set->signatures())
    os << (*db ? ((*db)->find(sig) ? "have " : "miss ") : "") << sig << "\n";
  return llvm::Error::success();
}

static llvm::Error runMerge() {
  if (inputs.size() < 2)
    return inputError("--merge needs at least two profiles");
  if (outputOpt.empty())
    return inputError("--merge needs -o out.json");
  CostDatabase out;
  for (const std::string &p : inputs) {
    auto db = CostDatabase::load(p);
    if (!db)
      return db.takeError();
    if (auto err = out.merge(*db))
      return inputError("{}: {}", p, errorMessage(std::move(err)));
  }
  if (auto err = out.save(outputOpt))
    return err;
  llvm::outs() << fmt::format("{}: {} kernels from {} profiles\n",
                              outputOpt.getValue(), out.size(), inputs.size());
  return llvm::Error::success();
}

static llvm::Expected<std::vector<ReplayPlan>>
loadPlans(const CostDatabase *db) {
  if (inputs.empty())
    return inputError("no plan given");
  std::vector<ReplayPlan> plans;
  for (const std::string &p : inputs) {
    auto rp = loadReplayPlan(p, topologyOpt, db);
    if (!rp)
      return rp.takeError();
    // One GPU measures them all: their devices must be of its type.
    if (!plans.empty() && rp->topo->deviceSpec().name !=
                              plans[0].topo->deviceSpec().name)
      return inputError("{}: a plan for '{}' devices, but {} is for '{}': "
                        "replay plans of one device type together",
                        p, rp->topo->deviceSpec().name.str(), plans[0].path,
                        plans[0].topo->deviceSpec().name.str());
    plans.push_back(std::move(*rp));
  }
  return plans;
}

static void emitReplay(const Json &report) {
  if (formatOpt == Format::Json)
    llvm::outs() << dumpJson(report);
  else
    printReplayReport(report, llvm::outs());
}

/// What measuring covers: the configuration space of the models (with
/// --topology), or with --from-plans the compute tiles of the plans, which
/// `plans` keeps alive. `device` receives the device type.
static llvm::Expected<SignatureSet>
signaturesToMeasure(std::vector<ReplayPlan> &plans, std::string &device) {
  if (!fromPlansOpt) {
    auto t = topology();
    if (!t)
      return t.takeError();
    device = t->deviceSpec().name.str();
    return enumerateFromOptions(*t);
  }
  auto loaded = loadPlans(nullptr);
  if (!loaded)
    return loaded.takeError();
  plans = std::move(*loaded);
  device = plans[0].topo->deviceSpec().name.str();
  SignatureSet set;
  for (const ReplayPlan &p : plans)
    for (const ReplayTask &t : p.tasks)
      set.addTile(t.signature, p.graph->op(t.op).kind,
                  SignatureSite{p.graph.get(), t.op, t.box}, p.model,
                  int64_t(p.devices));
  return llvm::Expected<SignatureSet>(std::move(set));
}

/// What a measuring run covers: the signatures (of the models' spaces or
/// the plans' tasks, which `plans` holds), the device they are measured as
/// (--device, else the topology's or plans'), and what -o already holds of
/// it.
struct MeasureTarget {
  std::vector<ReplayPlan> plans;
  std::string device;
  CostDatabase db;
  SignatureSet set;
};

static llvm::Expected<MeasureTarget> measureTarget() {
  if (outputOpt.empty())
    return inputError("measuring needs -o profiles/<device>.json");
  MeasureTarget t;
  auto set = signaturesToMeasure(t.plans, t.device);
  if (!set)
    return set.takeError();
  t.set = std::move(*set);
  if (!deviceOpt.empty()) {
    if (!findDevice(deviceOpt))
      return inputError("--device '{}' is not in the device catalog",
                        deviceOpt.getValue());
    t.device = deviceOpt;
  }
  if (llvm::sys::fs::exists(outputOpt)) {
    auto old = loadProfileFor(outputOpt, t.device);
    if (!old)
      return old.takeError();
    t.db = std::move(**old);
  }
  return llvm::Expected<MeasureTarget>(std::move(t));
}

/// soap-profile --backend cpu: every rank of mpirun measures (see
/// CpuRuns.h); rank 0 writes the database and prints the summary.
static llvm::Error runMeasureCpu(Comm &comm) {
  if (warmupOpt < 0 || repeatsOpt < 1)
    return inputError("--warmup must be at least 0 and --repeats at least 1");
  if (*threadsOpt < 0)
    return inputError("--threads must be at least 1, got {}", int(*threadsOpt));
  if (collectiveBytesOpt < 0)
    return inputError("--collective-bytes must be at least 0, got {}",
                      int64_t(collectiveBytesOpt));
  auto target = measureTarget();
  if (!target)
    return target.takeError();
  CostDatabase &db = target->db;
  const SignatureSet &set = target->set;
  ExecOptions eo;
  eo.threads = *threadsOpt;
  if (auto err = prepareBackend(eo, comm))
    return err;
  CostDatabase fresh;
  fresh.env.device = target->device;
  fresh.env.cpuName = cpuModelName();
  fresh.env.cores = availableCores();
  fresh.env.ranks = comm.size();
  fresh.env.threadsPerRank = kernelThreads(eo, comm);
  fresh.env.libraries = cpuLibraryVersions();
  if (auto err = db.merge(fresh))
    return err;
  CpuMeasureOptions mo;
  mo.warmup = warmupOpt;
  mo.repeats = repeatsOpt;
  mo.timeLimitSeconds = timeLimitOpt;
  mo.remeasure = remeasureOpt;
  mo.maxCollectiveBytes = collectiveBytesOpt;
  mo.output = outputOpt;
  auto sum = measureOnCpu(comm, set, db, mo);
  if (!sum)
    return sum.takeError();
  if (comm.rank() != 0)
    return llvm::Error::success();
  llvm::outs() << fmt::format(
      "{}: {} signatures: {} measured, {} already there, {} left for a later "
      "run (--time-limit), {} failed; {} kernels in all; {} rank(s) of {} "
      "thread(s) on {} ({} cores; {})\n",
      outputOpt.getValue(), set.signatures().size(), sum->measured,
      sum->have, sum->skipped, sum->failed, db.size(), comm.size(),
      db.env.threadsPerRank, db.env.cpuName, db.env.cores, db.env.libraries);
  for (const auto &[kind, n] : sum->kinds)
    llvm::outs() << fmt::format("  {} {}\n", kind, n);
  if (sum->p2pBytesPerSec > 0)
    llvm::outs() << fmt::format(
        "point-to-point between two ranks: {:.2f} us + bytes / {:.2f} GB/s "
        "(a topology's route of two links: latency_us {:.2f} each, "
        "bandwidth_gbps {:.1f})\n",
        sum->p2pLatencySeconds * 1e6, sum->p2pBytesPerSec / 1e9,
        sum->p2pLatencySeconds * 1e6 / 2, sum->p2pBytesPerSec * 8 / 1e9);
  return llvm::Error::success();
}

#if SOAP_HAVE_CUDA

/// The catalog entry a GPU's name belongs to: "NVIDIA H100 80GB HBM3" is an
/// H100-SXM. Compared by the catalog name's model number.
static bool gpuMatches(const std::string &gpu, llvm::StringRef catalog) {
  llvm::StringRef model = catalog.split('-').first;
  return llvm::StringRef(gpu).contains(model);
}

static llvm::Expected<std::unique_ptr<GpuSession>>
openGpu(llvm::StringRef catalogName) {
  MeasureOptions mo;
  if (warmupOpt < 0 || repeatsOpt < 1)
    return inputError("--warmup must be at least 0 and --repeats at least 1");
  mo.warmup = warmupOpt;
  mo.repeats = repeatsOpt;
  mo.tf32 = tf32Opt;
  mo.flushL2 = flushL2Opt;
  mo.findAlgorithms = cudnnFindOpt;
  auto gpu = GpuSession::open(gpuOpt, mo);
  if (!gpu)
    return gpu.takeError();
  if (!gpuMatches((*gpu)->gpuName(), catalogName))
    return inputError("the GPU is '{}', but the topology's devices are '{}': "
                      "its profile would be misnamed",
                      (*gpu)->gpuName(), catalogName.str());
  return gpu;
}

static llvm::Error runMeasure() {
  auto target = measureTarget();
  if (!target)
    return target.takeError();
  CostDatabase &db = target->db;
  const SignatureSet &set = target->set;
  const std::string &device = target->device;
  auto gpu = openGpu(device);
  if (!gpu)
    return gpu.takeError();
  GpuSession &s = **gpu;
  CostDatabase fresh;
  fresh.env = s.environment(device);
  if (auto err = db.merge(fresh)) // device and math agree, versions updated
    return err;
  MeasureRunOptions mo;
  mo.timeLimitSeconds = timeLimitOpt;
  mo.remeasure = remeasureOpt;
  mo.output = outputOpt;
  auto sum = measureSignatures(s, set, db, mo);
  if (!sum)
    return sum.takeError();
  llvm::outs() << fmt::format(
      "{}: {} signatures: {} measured, {} already there, {} left for a later "
      "run (--time-limit), {} failed; {} kernels in all\n",
      outputOpt.getValue(), set.signatures().size(), sum->measured,
      sum->have, sum->skipped, sum->failed, db.size());
  for (const auto &[what, n] : sum->methods)
    llvm::outs() << fmt::format("  {} {}\n", what, n);
  return llvm::Error::success();
}

static llvm::Error runReplay() {
  auto db = loadProfileFor(profileOpt, "");
  if (!db)
    return db.takeError();
  auto plans = loadPlans(*db ? &**db : nullptr);
  if (!plans)
    return plans.takeError();
  std::string device = (*plans)[0].topo->deviceSpec().name.str();
  auto gpu = openGpu(device);
  if (!gpu)
    return gpu.takeError();
  GpuSession &s = **gpu;
  if (auto err = replayOnGpu(s, *plans))
    return err;
  Json report = replayReport(*plans, s.environment(device), tasksOpt);
  if (!outputOpt.empty())
    if (auto err = writeFileAtomic(outputOpt, dumpJson(report)))
      return err;
  emitReplay(report);
  return llvm::Error::success();
}

#else

static llvm::Error noCuda() {
  return inputError("measuring needs a GPU: this soap-profile was built "
                    "without CUDA (SOAP_HAVE_CUDA is off)");
}
static llvm::Error runMeasure() {
  // Inputs are checked first, so bad input is reported as such anywhere.
  if (outputOpt.empty())
    return inputError("measuring needs -o profiles/<device>.json");
  std::vector<ReplayPlan> plans;
  std::string device;
  auto set = signaturesToMeasure(plans, device);
  if (!set)
    return set.takeError();
  return noCuda();
}
static llvm::Error runReplay() {
  auto db = loadProfileFor(profileOpt, "");
  if (!db)
    return db.takeError();
  auto plans = loadPlans(*db ? &**db : nullptr);
  if (!plans)
    return plans.takeError();
  return noCuda();
}

#endif

static llvm::Error runReplayList() {
  auto db = loadProfileFor(profileOpt, "");
  if (!db)
    return db.takeError();
  auto plans = loadPlans(*db ? &**db : nullptr);
  if (!plans)
    return plans.takeError();
  ProfileEnvironment env;
  env.device = (*plans)[0].topo->deviceSpec().name.str();
  emitReplay(replayReport(*plans, env, tasksOpt));
  return llvm::Error::success();
}

static bool cpuBackend() { return backendOpt == "cpu"; }

int main(int argc, char **argv) {
  removeLlvmThreadsOption();
  static cl::opt<int> threads(
      "threads",
      cl::desc("--backend cpu: kernel threads per rank (default: as "
               "soap-run, the cores divided by the ranks on the host)"),
      cl::init(0), cl::cat(cat));
  threadsOpt = &threads;
  // MPI is initialised only to measure on the CPU (under mpirun); it must be
  // before the options are parsed, which needs a look at --backend first.
  std::unique_ptr<Comm> comm;
  for (int i = 1; i < argc; ++i) {
    llvm::StringRef a = argv[i];
    bool merge = a == "--merge" || a == "-merge", list = a == "--list" ||
                                                          a == "-list";
    if (merge || list || a == "--replay" || a == "-replay") {
      comm.reset();
      break;
    }
    if (a == "--backend=cpu" || a == "-backend=cpu" ||
        ((a == "--backend" || a == "-backend") && i + 1 < argc &&
         llvm::StringRef(argv[i + 1]) == "cpu"))
      if (!comm)
        comm = createComm(argc, argv);
  }
  cl::HideUnrelatedOptions(cat);
  cl::SetVersionPrinter([](llvm::raw_ostream &os) {
    os << "soap-profile 0.1.0 (CUDA " << (SOAP_HAVE_CUDA ? "on" : "off")
       << ")\n";
  });
  if (!cl::ParseCommandLineOptions(
          argc, argv,
          "soap-profile: measure the op tiles a strategy search asks for and "
          "write a cost database\n\n"
          "  soap-profile model.onnx... --topology T [--devices 8,16] -o "
          "profiles/<device>.json\n"
          "  soap-profile --list model.onnx... --topology T [--devices 8,16] "
          "[--profile P]\n"
          "  soap-profile --from-plans plan.json... -o profiles/<device>.json\n"
          "  soap-profile --merge a.json b.json... -o out.json\n"
          "  soap-profile --replay plan.json... [--profile P] [-o "
          "replay.json]\n",
          &llvm::errs()))
    return static_cast<int>(ExitCode::InvalidInput);
  llvm::Error err = llvm::Error::success();
  if (backendOpt != "cuda" && backendOpt != "cpu")
    err = inputError("--backend '{}': expected cuda or cpu",
                     backendOpt.getValue());
  else if (int(listMode && !replayMode) + int(mergeMode) + int(replayMode) > 1)
    err = inputError("--list, --merge and --replay exclude one another "
                     "(except --replay --list)");
  else if (mergeMode)
    err = runMerge();
  else if (replayMode)
    err = listMode ? runReplayList() : runReplay();
  else if (listMode)
    err = runList();
  else if (cpuBackend()) {
    if (!comm)
      err = inputError("--backend cpu measures with MPI: give --backend cpu "
                       "as one or two arguments");
    else
      err = runMeasureCpu(*comm);
  } else
    err = runMeasure();
  if (err) {
    int code = reportError(std::move(err), "soap-profile");
    if (comm && comm->size() > 1)
      comm->abort(code);
    return code;
  }
  if (comm)
    finalizeComm(std::move(comm));
  return 0;
}
