// The emit targets (include/soap/Emit/Emit.h), registered explicitly in
// the order --help lists them.
#include "soap/Emit/Emit.h"

#include "soap/Emit/DTensor.h"

namespace soap {

const std::vector<EmitTarget> &emitTargets() {
  static const std::vector<EmitTarget> targets = {
      {"megatron",
       "Megatron-LM's command-line arguments (parallel sizes, batch, "
       "recomputation, distributed optimizer, overlap, precision, model "
       "shape)",
       emitMegatron},
      {"nemo", "the same settings as a NeMo megatron_gpt_config.yaml override",
       emitNemo},
      {"torchtitan",
       "torchtitan's TOML [training], [parallelism] and "
       "[activation_checkpoint] sections",
       emitTorchtitan},
      {"dtensor",
       "a PyTorch program: the model from its ONNX file, each op's "
       "configuration as DTensor placements",
       emitDTensor},
  };
  return targets;
}

const EmitTarget *findEmitTarget(llvm::StringRef name) {
  for (const EmitTarget &t : emitTargets())
    if (t.name == name)
      return &t;
  return nullptr;
}

std::string emitTargetNames() {
  std::string names;
  for (const EmitTarget &t : emitTargets())
    names += (names.empty() ? "" : ", ") + t.name;
  return names;
}

} // namespace soap
