// Plans (DESIGN.md, "Plans"): the strategy a searcher chose, written as JSON
// with the model and topology it was made for (path and SHA-256), the
// searcher's settings and the predicted figures, so CI can regenerate a plan
// and diff it and `soapc check` can tell whether it still fits. A plan holds
// nothing time-dependent: the same inputs and seed give the same bytes.
// Format: schemas/plan.schema.json.
#ifndef SOAP_PLAN_PLAN_H
#define SOAP_PLAN_PLAN_H

#include "soap/IR/Graph.h"
#include "soap/Machine/Topology.h"
#include "soap/Parallel/Strategy.h"
#include "soap/Sim/Simulator.h"
#include "soap/Support/Json.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace soap {

/// What the plan was made from and how: given by the tool as the user wrote
/// it (paths as given, budget as given: "20000" proposals or "30s").
struct PlanInputs {
  std::string modelPath, modelSha256;
  int64_t batch = 0;
  /// How the model was imported: LSTMs unrolled, a loss appended.
  bool unrollRnn = false;
  bool appendLoss = true;
  std::string topologyPath, topologySha256;
  std::string searcher;
  uint64_t seed = 0;
  std::string budget;
  std::string space;              ///< "flexflow" or "full"
  std::string costModel;          ///< "profile", "roofline", ...
  std::string optimizer;          ///< "sgd", "adam", ...
  std::string precision = "fp32"; ///< "fp32" or "bf16" (version 2)
  /// "eager" or "fused" (IR/Fusion.h); a plan without it is eager.
  std::string kernels = "eager";
  /// Ctrl-C or SIGTERM stopped the search: the plan is its best so far, not
  /// what the budget and seed give (written only when set).
  bool interrupted = false;
  /// --timeout stopped the search: the plan is its best so far after
  /// `proposalsRun` proposals, not what the budget gives (written only when
  /// set).
  bool timedOut = false;
  uint64_t proposalsRun = 0;

  bool operator==(const PlanInputs &o) const;
};

/// The simulator's predictions for the plan's strategy. Every number must be
/// finite (writePlan refuses NaN and infinities, which JSON cannot hold).
struct PlanFigures {
  Seconds iterationSeconds = 0;
  double samplesPerSecond = 0;
  std::vector<Bytes> memoryPerDevice; ///< one per topology device
  Bytes peakMemory = 0;
  bool fits = true;
  Bytes transferBytes = 0;   ///< point-to-point (region conversions)
  Bytes collectiveBytes = 0; ///< all-reduces
  /// 0 when data parallelism does not fit (written as null).
  double speedupOverDataParallel = 1;

  bool operator==(const PlanFigures &o) const;
};

/// The figures of a simulated strategy: samples/s = batch / iteration time,
/// speedup = data parallel's iteration time / this one's.
PlanFigures planFigures(const SimMetrics &m, int64_t batch,
                        Seconds dataParallelSeconds);

/// One op's configuration by names, so a plan survives re-import (op ids are
/// positions and could shift) and reads well.
/// The plan format this soapc writes; it reads 1 (no pipeline) to this.
constexpr int64_t kPlanVersion = 3;

struct PlanOp {
  std::string name;
  std::string kind;
  /// Degree of each split loop, by loop name; loops at degree 1 are absent.
  std::map<std::string, int32_t> loops;
  int32_t replicas = 1;
  std::vector<DeviceId> devices;
  int32_t stage = 0;      ///< its pipeline stage (version 2)
  bool recompute = false; ///< forward run again in backward (version 2)
  int32_t zero = 0;       ///< ZeRO stage of its weights, 0-3 (version 2)
  /// When its weight gradients run (version 2; written when not "next").
  WeightGradOrder weightGrad = WeightGradOrder::Next;

  bool operator==(const PlanOp &o) const;
};

struct Plan {
  PlanInputs inputs;
  /// Recorded from the graph and topology by makePlan, for readers of the
  /// file; checkPlan relies on the SHA-256s, not on these.
  int64_t numOps = 0;
  std::string topologyName;
  int64_t numDevices = 0;
  std::string deviceType;
  PlanFigures figures;
  /// The pipeline (version 2; a version 1 plan reads as 1 and 1f1b).
  int32_t microBatches = 1;
  PipelineSchedule schedule = PipelineSchedule::OneFOneB;
  /// Model chunks per device group (version 3; 1 before).
  int32_t chunks = 1;
  /// How weight gradients are bucketed and overlapped ("grad_sync", written
  /// when not the default; a plan without it has the default).
  GradSync gradSync;
  int32_t vocabPadding = 0; ///< Strategy::vocabPadding
  std::vector<PlanOp> ops; ///< in the graph's op order

  bool operator==(const Plan &o) const;
};

/// The plan of `s` (which must verify on g/topo) for `g` on `topo`.
Plan makePlan(const Graph &g, const Topology &topo, const Strategy &s,
              PlanInputs inputs, PlanFigures figures);

/// The JSON form (schemas/plan.schema.json).
Json planToJson(const Plan &p);
/// Writes dumpJson(planToJson(p)) atomically; "-" writes to stdout. A
/// non-finite figure is an internal error (nothing is written).
llvm::Error writePlan(const Plan &p, llvm::StringRef path);

/// Parses and checks a plan on its own (without model or topology): every
/// error reads "<file>: <JSON pointer>: what" (exit code 2). Unknown fields
/// are errors, so a misspelt hand edit does not go unnoticed.
llvm::Expected<Plan> planFromJson(const Json &j, llvm::StringRef file);
llvm::Expected<Plan> readPlan(llvm::StringRef path);

/// The strategy a plan describes for this graph and topology. Errors (exit
/// code 2) name `planPath` and the JSON pointer of the op: an op of the plan
/// not in the graph ("a plan for another model?"), a graph op missing from
/// the plan, a kind mismatch, an unknown loop name, a device outside the
/// topology, and whatever verifyConfig rejects (a degree that does not
/// divide its loop, too few devices, ...).
llvm::Expected<Strategy> planStrategy(const Plan &p, const Graph &g,
                                      const Topology &topo,
                                      llvm::StringRef planPath);

/// Why a plan no longer fits its model or topology: one line each.
struct CheckFinding {
  std::string what;
};

/// `soapc check`: compares the plan with the model and topology as they are
/// now. Findings, in a fixed order: model SHA-256, topology SHA-256, batch;
/// then per plan op (in plan order) one finding if it is not in the graph,
/// changed kind, names a loop the op no longer has, or no longer verifies
/// (degree does not divide, device out of range, ...); then graph ops the
/// plan lacks (graph order); then, when `resimulated` is given (the metrics
/// of planStrategy's strategy simulated now), memory that no longer fits.
/// Empty = the plan is fresh; the tool maps a non-empty list to exit code 4.
/// `given` names the files and batch the user gave in place of the plan's
/// own (empty, false: the plan's), so that a finding says which file was
/// given and which one the plan was made for rather than that it changed.
struct CheckGiven {
  std::string modelPath, topologyPath;
  bool batch = false;
};
std::vector<CheckFinding> checkPlan(const Plan &p, llvm::StringRef modelSha256,
                                    llvm::StringRef topologySha256,
                                    int64_t batch, const Graph &g,
                                    const Topology &topo,
                                    const SimMetrics *resimulated = nullptr,
                                    const CheckGiven &given = CheckGiven());

} // namespace soap

#endif // SOAP_PLAN_PLAN_H
