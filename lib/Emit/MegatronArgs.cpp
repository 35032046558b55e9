// soapc emit --target megatron: a plan as Megatron-LM's command-line
// arguments (megatron/training/arguments.py), one per line, continued with
// " \" so that they paste after `pretrain_gpt.py`.
#include "soap/Emit/Emit.h"

#include "MegatronFamily.h"
#include "soap/Emit/EngineLayout.h"
#include <fmt/format.h>

namespace soap {

llvm::Expected<Emitted> emitMegatron(const EmitContext &c) {
  const char *engine = "Megatron-LM";
  auto layout = readEngineLayout(c, engine);
  if (!layout)
    return layout.takeError();
  const EngineLayout &l = *layout;
  if (auto err = checkMegatronFamily(c, l, engine))
    return llvm::Error(std::move(err));

  std::vector<std::string> args;
  auto add = [&](std::string a) { args.push_back(std::move(a)); };
  add(fmt::format("--tensor-model-parallel-size {}", l.tp));
  add(fmt::format("--pipeline-model-parallel-size {}", l.pp));
  // vp > 1 needs a layer stack (megatronConfigStrategy), so layers > 0.
  if (l.vp > 1)
    add(fmt::format("--num-layers-per-virtual-pipeline-stage {}",
                    l.shape.layers / (int64_t(l.pp) * l.vp)));
  add(fmt::format("--context-parallel-size {}", l.cp));
  if (l.sp)
    add("--sequence-parallel");
  if (l.gradSync.tpCommOverlap)
    add("--tp-comm-overlap");
  add(fmt::format("--micro-batch-size {}", l.microBatchSize));
  add(fmt::format("--global-batch-size {}", l.batch));
  if (l.recompute == RecomputeMode::Selective) {
    add("--recompute-granularity selective");
  } else if (l.recompute == RecomputeMode::Full) {
    add("--recompute-granularity full");
    add("--recompute-method uniform");
    add("--recompute-num-layers 1");
  }
  if (l.zero == 1)
    add("--use-distributed-optimizer");
  if (l.gradSync.overlapGradReduce)
    add("--overlap-grad-reduce");
  if (l.zero == 1 && l.gradSync.overlapParamGather)
    add("--overlap-param-gather");
  if (l.gradSync.bucketParams > 0)
    add(fmt::format("--ddp-bucket-size {}", l.gradSync.bucketParams));
  const std::string &precision = c.plan.inputs.precision;
  if (precision == "bf16" || precision == "fp8")
    add("--bf16");
  if (precision == "fp8") {
    // Transformer Engine's delayed scaling as NVIDIA's recipes set it:
    // E4M3 forward, E5M2 gradients, the maximum over 1,024 steps' amaxes.
    add("--transformer-impl transformer_engine");
    add("--fp8-format hybrid");
    add(fmt::format("--fp8-amax-history-len {}", kFp8AmaxHistory));
    add("--fp8-amax-compute-algo max");
  }
  const std::string &optimizer = c.plan.inputs.optimizer;
  if (optimizer == "adam") {
    add("--optimizer adam");
  } else {
    add("--optimizer sgd");
    add(fmt::format("--sgd-momentum {}",
                    optimizer == "momentum" ? "0.9" : "0"));
  }
  const ModelShape &m = l.shape;
  if (m.layers > 0)
    add(fmt::format("--num-layers {}", m.layers));
  if (m.hidden > 0) {
    add(fmt::format("--hidden-size {}", m.hidden));
    add(fmt::format("--ffn-hidden-size {}", m.ffnHidden));
  }
  if (m.heads > 0)
    add(fmt::format("--num-attention-heads {}", m.heads));
  if (m.kvHeads > 0 && m.kvHeads < m.heads) {
    add("--group-query-attention");
    add(fmt::format("--num-query-groups {}", m.kvHeads));
  }
  if (m.seqLength > 0)
    add(fmt::format("--seq-length {}", m.seqLength));

  Emitted out;
  for (size_t i = 0; i < args.size(); ++i)
    out.text += args[i] + (i + 1 < args.size() ? " \\\n" : "\n");
  out.notes = megatronFamilyNotes(c, l, engine);
  return out;
}

} // namespace soap
