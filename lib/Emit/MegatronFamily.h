// What Megatron-LM and NeMo (which runs Megatron-Core) share: the checks of
// a plan's layout against what their settings can say, and the model shape
// they both take.
#ifndef SOAP_EMIT_MEGATRONFAMILY_H
#define SOAP_EMIT_MEGATRONFAMILY_H

#include "soap/Emit/EngineLayout.h"

namespace soap {

/// Errors (exit 2) for what neither engine runs: the earliest op of the
/// layout's findings and of ZeRO-2/3 (their distributed optimizer shards
/// the optimizer state only); then a pipeline schedule other than 1F1B
/// (interleaved with virtual stages), an overlapped parameter all-gather
/// without overlapped gradient reduction, and tensor-parallel
/// communication overlap without sequence parallelism.
llvm::Error checkMegatronFamily(const EmitContext &c, const EngineLayout &l,
                                llvm::StringRef engine);

/// The notes both engines' outputs carry: the model settings the graph does
/// not give, and ops whose weight-gradient order no setting chooses.
std::vector<std::string> megatronFamilyNotes(const EmitContext &c,
                                             const EngineLayout &l,
                                             llvm::StringRef engine);

} // namespace soap

#endif // SOAP_EMIT_MEGATRONFAMILY_H
