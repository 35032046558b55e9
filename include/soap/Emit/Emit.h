// soapc emit (docs/emit.md): a plan taken to the engines people train
// with. Each target writes the plan in its engine's own terms: Megatron-LM's
// command-line arguments, a NeMo YAML override block, torchtitan's TOML
// sections, or a PyTorch DTensor program. Targets are registered here by
// name, so `--target` is parsed from this list and `--help` shows it.
#ifndef SOAP_EMIT_EMIT_H
#define SOAP_EMIT_EMIT_H

#include "soap/IR/Graph.h"
#include "soap/Machine/Topology.h"
#include "soap/Parallel/Strategy.h"
#include "soap/Plan/Plan.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include <string>
#include <vector>

namespace soap {

/// What every target reads: a plan, the model it was made for (imported as
/// the plan records: batch, loss, kernels, precision) and its strategy on
/// that model (planStrategy), which is the truth a target reads the layout
/// from.
struct EmitContext {
  const Plan &plan;
  const Graph &graph;
  const Topology &topo;
  const Strategy &strategy;
  std::string planPath;  ///< as given, for messages
  std::string modelPath; ///< the ONNX file the plan was made for
};

/// A target's output: the text `-o` writes (stdout without it), and notes
/// for stderr, one line each (what the output leaves to the user).
struct Emitted {
  std::string text;
  std::vector<std::string> notes;
};

/// A target that cannot express a plan returns an input error (exit 2)
/// naming the plan file, the JSON pointer of the first op (or plan field)
/// it cannot express, and why.
using EmitFunction = llvm::Expected<Emitted> (*)(const EmitContext &);

struct EmitTarget {
  std::string name;
  std::string description; ///< one line, for --help
  EmitFunction emit;
};

/// The targets, in the order --help lists them.
const std::vector<EmitTarget> &emitTargets();
/// The target of that name, or nullptr.
const EmitTarget *findEmitTarget(llvm::StringRef name);
/// "megatron, nemo, torchtitan, dtensor".
std::string emitTargetNames();

/// Megatron-LM's command-line arguments, one per line, continued with " \".
llvm::Expected<Emitted> emitMegatron(const EmitContext &c);
/// A NeMo (megatron_gpt_config.yaml) override block.
llvm::Expected<Emitted> emitNemo(const EmitContext &c);
/// torchtitan's TOML sections [training], [parallelism] and
/// [activation_checkpoint].
llvm::Expected<Emitted> emitTorchtitan(const EmitContext &c);

} // namespace soap

#endif // SOAP_EMIT_EMIT_H
