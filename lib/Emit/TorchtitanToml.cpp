// soapc emit --target torchtitan: a plan as torchtitan's TOML job-config
// sections (torchtitan/config/job_config.py of its TOML releases, 0.2):
// [training] for the batch, [parallelism] and [activation_checkpoint]. Its
// data parallelism is FSDP2 (ZeRO-3) over the data-parallel and
// context-parallel ranks, or DDP when nothing else is parallel; its tensor
// parallelism is always sequence parallel; its loss is vocabulary-parallel.
#include "soap/Emit/Emit.h"

#include "soap/Emit/EngineLayout.h"
#include "soap/Parallel/Megatron.h"
#include <fmt/format.h>
#include <optional>

namespace soap {

namespace {

const char *kEngine = "torchtitan";

/// torchtitan's tensor parallelism splits the norms along the sequence:
/// the first op the plan's layout does not split that way.
std::optional<OpFinding> notSequenceParallel(const EmitContext &c,
                                             const EngineLayout &l) {
  MegatronConfig k;
  k.tp = l.tp;
  k.pp = l.pp;
  k.vp = l.vp;
  k.cp = l.cp;
  k.mbs = l.microBatchSize;
  k.sp = true;
  auto sp = megatronConfigStrategy(c.graph, c.topo, k);
  if (!sp) {
    llvm::consumeError(sp.takeError());
    return OpFinding{0, "",
                     fmt::format("is in a plan of tensor parallelism {} "
                                 "without a sequence to split; torchtitan's "
                                 "tensor parallelism is always sequence "
                                 "parallel",
                                 l.tp)};
  }
  for (const Op &op : c.graph.ops())
    if (c.strategy.configs[size_t(op.id)] != sp->configs[size_t(op.id)])
      return OpFinding{
          op.id, "",
          fmt::format("runs as {}, where torchtitan's tensor parallelism, "
                      "always sequence parallel, runs it as {}",
                      c.strategy.configs[size_t(op.id)].str(op.sem),
                      sp->configs[size_t(op.id)].str(op.sem))};
  return std::nullopt;
}

/// The first op that the plan recomputes.
OpId firstRecomputed(const EmitContext &c) {
  for (const Op &op : c.graph.ops())
    if (c.strategy.recomputes(op.id))
      return op.id;
  return 0;
}

/// The ops torchtitan cannot express, added to the layout's: ZeRO-1/2,
/// whole weights beside other parallelism, Megatron's selective
/// recomputation, tensor parallelism without sequence parallelism.
void addFindings(const EmitContext &c, const EngineLayout &l,
                 std::vector<OpFinding> &findings) {
  bool otherParallel = l.tp > 1 || l.pp > 1 || l.cp > 1;
  // The ranks torchtitan shards over (FSDP's mesh: data and context
  // parallel); a plan's ZeRO stage may also cover copies that the tensor
  // split leaves (sequence-parallel norms), which torchtitan never shards.
  int64_t dataRanks = l.dp * l.cp;
  if (l.zeroOp >= 0 && (l.zero == 1 || l.zero == 2))
    findings.push_back({OpId(l.zeroOp), "zero",
                        fmt::format("has ZeRO-{}; torchtitan shards weights, "
                                    "gradients and optimizer state together "
                                    "(FSDP, ZeRO-3) or none of them (DDP)",
                                    l.zero)});
  if (l.zeroOp >= 0 && l.zero == 3 && dataRanks == 1 && l.matches)
    findings.push_back({OpId(l.zeroOp), "zero",
                        "has ZeRO-3 over the copies of its weights within "
                        "the tensor-parallel group; torchtitan shards only "
                        "over data-parallel and context-parallel ranks, and "
                        "the plan has none"});
  if (l.zeroOp >= 0 && l.zero == 0 && dataRanks > 1 && otherParallel &&
      l.matches)
    findings.push_back(
        {OpId(l.zeroOp), "zero",
         fmt::format("keeps its weights whole on each of {} data-parallel "
                     "ranks; torchtitan replicates weights (DDP) only without "
                     "tensor, pipeline and context parallelism, and otherwise "
                     "shards them (FSDP, ZeRO-3)",
                     dataRanks)});
  if (l.recompute == RecomputeMode::Selective)
    findings.push_back({firstRecomputed(c), "recompute",
                        "is recomputed as the core attention (Megatron's "
                        "selective recomputation); torchtitan's selective "
                        "checkpointing keeps matmul outputs ('op') or "
                        "checkpoints every n-th layer whole, and has no "
                        "core-attention mode"});
  if (l.tp > 1 && !l.sp && l.matches)
    if (std::optional<OpFinding> f = notSequenceParallel(c, l))
      findings.push_back(*f);
}

} // namespace

llvm::Expected<Emitted> emitTorchtitan(const EmitContext &c) {
  auto layout = readEngineLayout(c, kEngine);
  if (!layout)
    return layout.takeError();
  const EngineLayout &l = *layout;
  std::vector<OpFinding> findings = l.findings;
  addFindings(c, l, findings);
  if (auto err = firstOpError(c, findings))
    return llvm::Error(std::move(err));
  const std::string &optimizer = c.plan.inputs.optimizer;
  if (optimizer != "adam")
    return planError(
        c, "/search/optimizer",
        fmt::format("{}: torchtitan builds Adam and AdamW only", optimizer));
  if (l.pp > 1 && l.schedule == PipelineSchedule::ZbH1)
    return planError(c, "/pipeline/schedule",
                     "zb-h1: torchtitan's zero-bubble schedules "
                     "(InterleavedZeroBubble, ZBVZeroBubble) run several "
                     "stages per rank, not zb-h1's one");
  GradSync defaults;
  if (l.gradSync.overlapGradReduce != defaults.overlapGradReduce ||
      l.gradSync.bucketParams != defaults.bucketParams)
    return planError(c, "/grad_sync",
                     "torchtitan always overlaps the gradient reduction with "
                     "the backward pass and sizes its buckets itself");
  // Data parallelism: FSDP over dp x cp (ZeRO-3), or DDP alone.
  int64_t replicate = 1, shard = 1;
  if (l.zero == 3)
    shard = l.dp;
  else
    replicate = l.dp;
  bool fsdp = shard > 1 || l.cp > 1;
  if (c.plan.inputs.precision == "fp8")
    return planError(c, "/search/precision",
                     "fp8: the plan is Transformer Engine's delayed-scaling "
                     "recipe; torchtitan's float8 linears (torchao) scale "
                     "each tensor or row from its current amax, another "
                     "recipe");
  bool bf16 = c.plan.inputs.precision == "bf16";
  if (bf16 && (l.tp > 1 || l.pp > 1) && !fsdp)
    return planError(c, "/search/precision",
                     "bf16: torchtitan runs mixed precision with tensor or "
                     "pipeline parallelism only through FSDP, and the plan "
                     "has no data-parallel ranks to shard over");

  const ModelShape &m = l.shape;
  std::string t;
  t += fmt::format("# torchtitan job config (TOML) for {}\n", c.planPath);
  t += "[training]\n";
  // torchtitan's batch is per data-parallel rank; the pipeline cuts it into
  // micro-batches, gradient accumulation without one.
  t += fmt::format("local_batch_size = {}\n",
                   l.pp > 1 ? l.batch / l.dp : l.microBatchSize);
  t += fmt::format("global_batch_size = {}\n", l.batch);
  if (m.seqLength > 0)
    t += fmt::format("seq_len = {}\n", m.seqLength);
  t += fmt::format("mixed_precision_param = \"{}\"\n",
                   bf16 ? "bfloat16" : "float32");
  t += "\n[parallelism]\n";
  t += fmt::format("data_parallel_replicate_degree = {}\n", replicate);
  t += fmt::format("data_parallel_shard_degree = {}\n", shard);
  t += fmt::format("tensor_parallel_degree = {}\n", l.tp);
  // Its async tensor parallelism pipelines the sequence-parallel
  // all-gathers and reduce-scatters with their matmuls, under compile.
  if (l.gradSync.tpCommOverlap)
    t += "enable_async_tensor_parallel = true\n";
  t += fmt::format("context_parallel_degree = {}\n", l.cp);
  t += fmt::format("pipeline_parallel_degree = {}\n", l.pp);
  if (l.pp > 1) {
    const char *schedule = l.schedule == PipelineSchedule::GPipe ? "GPipe"
                           : l.vp > 1 ? "Interleaved1F1B"
                                      : "1F1B";
    t += fmt::format("pipeline_parallel_schedule = \"{}\"\n", schedule);
    // Stages of equal layers, the embedding with the first and the norm and
    // output with the last, as the plan has them.
    t += fmt::format("pipeline_parallel_layers_per_stage = {}\n",
                     m.layers / (int64_t(l.pp) * l.vp));
    t += "pipeline_parallel_first_stage_less_layers = 0\n";
    t += "pipeline_parallel_last_stage_less_layers = 0\n";
    t += fmt::format("pipeline_parallel_microbatch_size = {}\n",
                     l.microBatchSize);
  }
  if (l.gradSync.tpCommOverlap)
    t += "\n[compile]\nenable = true\n";
  t += "\n[activation_checkpoint]\n";
  t += fmt::format("mode = \"{}\"\n",
                   l.recompute == RecomputeMode::Full ? "full" : "none");
  t += "\n[optimizer]\n";
  t += "name = \"Adam\"\n";

  Emitted out;
  out.text = std::move(t);
  if (m.layers == 0)
    out.notes.push_back(fmt::format("{}: no transformer layer stack: "
                                    "torchtitan trains its own model "
                                    "definitions, and the sequence length is "
                                    "left to you",
                                    c.modelPath));
  if (l.ownWeightGradOrder > 0)
    out.notes.push_back(fmt::format("{}: {} ops run their weight gradients in "
                                    "an order of their own (\"weight_grad\"); "
                                    "torchtitan runs them in autograd's order",
                                    c.planPath, l.ownWeightGradOrder));
  return out;
}

} // namespace soap
