// What-if strategies (DESIGN.md, "What-if strategies"): the configuration a
// user already runs, written as Megatron-LM's or FSDP's settings, built into
// a Strategy without a search:
//   megatron:tp=T,pp=P,vp=V,cp=C,mbs=M,sp=0|1,recompute=none|selective|full,
//            distopt=0|1,schedule=1f1b|zb-h1|gpipe,overlap_grad_reduce=0|1,
//            overlap_param_gather=0|1,bucket_size=N
//   fsdp:zero=1|2|3,mbs=M,recompute=none|selective|full,
//        overlap_grad_reduce=0|1,overlap_param_gather=0|1,bucket_size=N
// dp is the rest of the devices, the model's batch is the global batch, and
// the micro-batches per iteration are batch / (dp x mbs). A key the space
// cannot honour, or an impossible combination, is an input error naming it.
#ifndef SOAP_PARALLEL_WHATIF_H
#define SOAP_PARALLEL_WHATIF_H

#include "soap/Parallel/Strategy.h"
#include "llvm/ADT/StringRef.h"
#include <optional>

namespace soap {

enum class RecomputeMode : uint8_t { None, Selective, Full };
llvm::StringRef recomputeModeName(RecomputeMode r);

/// The keys every what-if takes (Megatron-LM's argument names in
/// comments; Megatron-Core's DistributedDataParallelConfig for the
/// gradient synchronisation).
struct WhatIfCommon {
  RecomputeMode recompute = RecomputeMode::None; ///< --recompute-granularity
  /// --overlap-grad-reduce (default on, as NeMo's published runs).
  bool overlapGradReduce = true;
  /// --overlap-param-gather: given, or by default on where the optimizer
  /// state is sharded and the gradient reduction overlapped.
  std::optional<bool> overlapParamGather;
  /// --ddp-bucket-size in parameters; 0: Megatron's default.
  int64_t bucketSize = 0;
};

/// Megatron-LM's settings (its argument names in comments).
struct MegatronConfig : WhatIfCommon {
  int32_t tp = 1;         ///< --tensor-model-parallel-size
  int32_t pp = 1;         ///< --pipeline-model-parallel-size
  int32_t vp = 1;         ///< --virtual-pipeline-model-parallel-size:
                          ///< model chunks per pipeline rank
  int32_t cp = 1;         ///< --context-parallel-size
  int64_t mbs = 1;        ///< --micro-batch-size
  /// --sequence-parallel: given, or by default on where tp > 1 and the
  /// model has a sequence to split (sequenceParallel). NeMo's recipes set
  /// it with tensor parallelism (gpt3_175b_hydra.yaml, the Llama 3.1
  /// recipes); Megatron-LM's own flag defaults off, which sp=0 asks for.
  std::optional<bool> sp;
  bool distopt = false;   ///< --use-distributed-optimizer (ZeRO-1)
  /// --tp-comm-overlap: given, or by default on with sequence parallelism
  /// (NeMo's published recipes; GradSync::tpCommOverlap).
  std::optional<bool> tpCommOverlap;
  /// 1f1b (interleaved when vp > 1), zb-h1 or gpipe.
  PipelineSchedule schedule = PipelineSchedule::OneFOneB;
  /// Whether these settings run sequence parallelism on `g`: sp as given,
  /// else tp > 1 and `g` has a sequence (an attention to find it by).
  bool sequenceParallel(const Graph &g) const;
  /// These settings with sp resolved on `g` (sequenceParallel).
  MegatronConfig resolved(const Graph &g) const;
  /// The gradient synchronisation these settings give (sp unset counts as
  /// off: call it on resolved settings).
  GradSync gradSync() const;
  /// "tp=4,pp=8,vp=1,cp=1,mbs=1,sp=0,recompute=selective,distopt=1" (sp
  /// left out while unresolved), and
  /// ",schedule=S" when not 1f1b, and the gradient synchronisation's and
  /// tp_comm_overlap's keys when given.
  std::string str() const;
};

/// FSDP / ZeRO data parallelism over every device; overlap_param_gather
/// only for zero=1|2 (ZeRO-3 gathers the weights before every use,
/// prefetched).
struct FsdpConfig : WhatIfCommon {
  int zero = 3;
  int64_t mbs = 0; ///< 0: the whole per-device batch at once
};

/// Parses the keys after "megatron:" ("tp=4,pp=8,..."); unknown keys and
/// bad values are input errors naming the key.
llvm::Expected<MegatronConfig> parseMegatronConfig(llvm::StringRef keys);
llvm::Expected<FsdpConfig> parseFsdpConfig(llvm::StringRef keys);

/// Whether `spec` is a what-if ("megatron:..." or "fsdp:...").
bool isWhatIf(llvm::StringRef spec);
/// The strategy of a what-if spec for `g` (whose sample loops hold the
/// global batch) on `topo`.
llvm::Expected<Strategy> whatIfStrategy(llvm::StringRef spec, const Graph &g,
                                        const Topology &topo);

/// Megatron-LM's selective recomputation: the core attention (the
/// FlashAttention ops of a fused graph; in a graph without them, every op
/// without weights that saves something, recomputePolicy's selective).
std::vector<uint8_t> megatronSelectiveRecompute(const Graph &g);

/// Megatron-LM's plan for `c`: tensor parallel (column/row splits, the
/// vocabulary-parallel LM head and cross-entropy) over tp adjacent devices,
/// pp x vp stages of equal transformer layers (the embedding on the first,
/// the LM head and loss on the last; stage s on pipeline rank s % pp), 1F1B
/// (interleaved when vp > 1) or the schedule given over batch / (dp x mbs)
/// micro-batches, the distributed optimizer as ZeRO-1, sequence parallelism
/// (sp: what the tensor split replicates split along the sequence,
/// megatronGroupConfigs), and Megatron's recomputation: selective = the
/// core attention (FlashAttention, or in an eager graph every op without
/// weights that saves something); full = each layer from its input.
llvm::Expected<Strategy> megatronConfigStrategy(const Graph &g,
                                                const Topology &topo,
                                                const MegatronConfig &c);

} // namespace soap

#endif // SOAP_PARALLEL_WHATIF_H
