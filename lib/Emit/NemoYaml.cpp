// soapc emit --target nemo: a plan as an override block for NeMo's
// megatron_gpt_config.yaml (trainer and model keys of NeMo's Megatron GPT
// training; its distributed optimizer is Megatron-Core's,
// optim.name mcore_distributed_optim, whose DDP keys are the plan's
// gradient synchronisation).
#include "soap/Emit/Emit.h"

#include "MegatronFamily.h"
#include "soap/Emit/EngineLayout.h"
#include <algorithm>
#include <fmt/format.h>

namespace soap {

llvm::Expected<Emitted> emitNemo(const EmitContext &c) {
  const char *engine = "NeMo";
  auto layout = readEngineLayout(c, engine);
  if (!layout)
    return layout.takeError();
  const EngineLayout &l = *layout;
  if (auto err = checkMegatronFamily(c, l, engine))
    return llvm::Error(std::move(err));
  const std::string &optimizer = c.plan.inputs.optimizer;
  if (l.zero == 1 && optimizer != "adam")
    return planError(c, "/search/optimizer",
                     fmt::format("{}: NeMo's distributed optimizer "
                                 "(mcore_distributed_optim) is Adam",
                                 optimizer));
  GradSync defaults;
  if (l.zero != 1 &&
      (l.gradSync.overlapGradReduce != defaults.overlapGradReduce ||
       l.gradSync.bucketParams != defaults.bucketParams))
    return planError(c, "/grad_sync",
                     "NeMo takes the gradient overlap and bucket size "
                     "(optim.overlap_grad_sync, optim.ddp_bucket_size) only "
                     "with its distributed optimizer, and the plan has no "
                     "ZeRO-1");

  const ModelShape &m = l.shape;
  bool fp8 = c.plan.inputs.precision == "fp8";
  bool bf16 = c.plan.inputs.precision == "bf16" || fp8;
  int64_t perNode = int64_t(c.topo.devicesPerNode());
  auto yesNo = [](bool b) { return b ? "true" : "false"; };
  std::string y;
  y += fmt::format("# NeMo overrides (megatron_gpt_config.yaml) for {}\n",
                   c.planPath);
  y += "trainer:\n";
  y += fmt::format("  devices: {}\n", perNode);
  y += fmt::format("  num_nodes: {}\n", std::max<size_t>(1, c.topo.numNodes()));
  y += fmt::format("  precision: {}\n", bf16 ? "bf16-mixed" : "32");
  y += "model:\n";
  y += fmt::format("  micro_batch_size: {}\n", l.microBatchSize);
  y += fmt::format("  global_batch_size: {}\n", l.batch);
  y += fmt::format("  tensor_model_parallel_size: {}\n", l.tp);
  y += fmt::format("  pipeline_model_parallel_size: {}\n", l.pp);
  y += l.vp > 1
           ? fmt::format("  virtual_pipeline_model_parallel_size: {}\n", l.vp)
           : "  virtual_pipeline_model_parallel_size: null\n";
  y += fmt::format("  context_parallel_size: {}\n", l.cp);
  y += fmt::format("  sequence_parallel: {}\n", yesNo(l.sp));
  y += fmt::format("  ub_tp_comm_overlap: {}\n",
                   yesNo(l.gradSync.tpCommOverlap));
  y += fmt::format("  megatron_amp_O2: {}\n", yesNo(bf16));
  if (fp8) {
    // Transformer Engine's delayed scaling, as NeMo's GPT-3 recipe sets it.
    y += "  transformer_engine: true\n"
         "  fp8: true\n"
         "  fp8_e4m3: false\n"
         "  fp8_hybrid: true\n"
         "  fp8_margin: 0\n"
         "  fp8_interval: 1\n";
    y += fmt::format("  fp8_amax_history_len: {}\n", kFp8AmaxHistory);
    y += "  fp8_amax_compute_algo: max\n";
  }
  switch (l.recompute) {
  case RecomputeMode::None:
    y += "  activations_checkpoint_granularity: null\n"
         "  activations_checkpoint_method: null\n"
         "  activations_checkpoint_num_layers: null\n";
    break;
  case RecomputeMode::Selective:
    y += "  activations_checkpoint_granularity: selective\n"
         "  activations_checkpoint_method: null\n"
         "  activations_checkpoint_num_layers: null\n";
    break;
  case RecomputeMode::Full:
    y += "  activations_checkpoint_granularity: full\n"
         "  activations_checkpoint_method: uniform\n"
         "  activations_checkpoint_num_layers: 1\n";
    break;
  }
  if (m.layers > 0)
    y += fmt::format("  num_layers: {}\n", m.layers);
  if (m.hidden > 0) {
    y += fmt::format("  hidden_size: {}\n", m.hidden);
    y += fmt::format("  ffn_hidden_size: {}\n", m.ffnHidden);
  }
  if (m.heads > 0)
    y += fmt::format("  num_attention_heads: {}\n", m.heads);
  if (m.kvHeads > 0 && m.kvHeads < m.heads)
    y += fmt::format("  num_query_groups: {}\n", m.kvHeads);
  if (m.seqLength > 0)
    y += fmt::format("  encoder_seq_length: {}\n", m.seqLength);
  y += "  optim:\n";
  if (l.zero == 1) {
    y += "    name: mcore_distributed_optim\n";
    y += fmt::format("    overlap_grad_sync: {}\n",
                     yesNo(l.gradSync.overlapGradReduce));
    y += fmt::format("    overlap_param_sync: {}\n",
                     yesNo(l.gradSync.overlapParamGather));
    if (l.gradSync.bucketParams > 0)
      y += fmt::format("    ddp_bucket_size: {}\n", l.gradSync.bucketParams);
  } else if (optimizer == "adam") {
    y += "    name: fused_adam\n";
  } else {
    y += "    name: sgd\n";
    y += fmt::format("    momentum: {}\n",
                     optimizer == "momentum" ? "0.9" : "0.0");
  }
  Emitted out;
  out.text = std::move(y);
  out.notes = megatronFamilyNotes(c, l, engine);
  return out;
}

} // namespace soap
