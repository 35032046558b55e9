// Checks and notes shared by the Megatron-LM and NeMo targets
// (lib/Emit/MegatronFamily.h).
#include "MegatronFamily.h"

#include <fmt/format.h>

namespace soap {

llvm::Error checkMegatronFamily(const EmitContext &c, const EngineLayout &l,
                                llvm::StringRef engine) {
  std::vector<OpFinding> findings = l.findings;
  if (l.zero > 1)
    findings.push_back({OpId(l.zeroOp), "zero",
                        fmt::format("has ZeRO-{}; {}'s distributed optimizer "
                                    "shards the optimizer state only (ZeRO-1)",
                                    l.zero, engine.str())});
  if (auto err = firstOpError(c, findings))
    return err;
  if (l.pp > 1 && l.schedule != PipelineSchedule::OneFOneB)
    return planError(c, "/pipeline/schedule",
                     fmt::format("{}: {} runs 1F1B (interleaved with virtual "
                                 "stages) and has no {} schedule",
                                 scheduleName(l.schedule).str(), engine.str(),
                                 l.schedule == PipelineSchedule::GPipe
                                     ? "GPipe"
                                     : "zero-bubble"));
  if (l.zero == 1 && l.gradSync.overlapParamGather &&
      !l.gradSync.overlapGradReduce)
    return planError(c, "/grad_sync/overlap_param_gather",
                     fmt::format("the parameter all-gather is overlapped but "
                                 "the gradient reduction is not; {} overlaps "
                                 "the one only with the other",
                                 engine.str()));
  if (l.gradSync.tpCommOverlap && !l.sp)
    return planError(c, "/grad_sync/tp_comm_overlap",
                     fmt::format("tensor-parallel communication overlapped "
                                 "with GEMMs needs sequence parallelism, and "
                                 "{} overlaps only its all-gathers and "
                                 "reduce-scatters",
                                 engine.str()));
  return llvm::Error::success();
}

std::vector<std::string> megatronFamilyNotes(const EmitContext &c,
                                             const EngineLayout &l,
                                             llvm::StringRef engine) {
  std::vector<std::string> notes;
  const ModelShape &m = l.shape;
  if (m.layers == 0)
    notes.push_back(fmt::format("{}: no transformer layer stack, so the "
                                "model's size settings (layers, hidden size, "
                                "heads, sequence) are left to you",
                                c.modelPath));
  else if (m.hidden == 0)
    notes.push_back(fmt::format("{}: the hidden and MLP sizes are not read "
                                "from a model of one layer; they are left to "
                                "you",
                                c.modelPath));
  if (l.ownWeightGradOrder > 0)
    notes.push_back(fmt::format("{}: {} ops run their weight gradients in an "
                                "order of their own (\"weight_grad\"); {} "
                                "runs them in its own order",
                                c.planPath, l.ownWeightGradOrder,
                                engine.str()));
  return notes;
}

} // namespace soap
