// The layout that Megatron-LM, NeMo and torchtitan describe with a handful
// of settings (tensor, context, data and pipeline ranks in Megatron-Core's
// order; stages of equal transformer layers; micro-batches; recomputation;
// sharded optimizer state), read back from a plan's per-op configurations.
// A plan is in that space when rebuilding the layout from the settings read
// (the what-if builder, Parallel/WhatIf.h) gives its configurations op for
// op; the first op that differs is the one an engine cannot express.
#ifndef SOAP_EMIT_ENGINELAYOUT_H
#define SOAP_EMIT_ENGINELAYOUT_H

#include "soap/Emit/Emit.h"
#include "soap/Parallel/WhatIf.h"
#include <string>

namespace soap {

/// A transformer's shape as the engines' model settings name it; 0 where the
/// graph does not give it.
struct ModelShape {
  int64_t layers = 0;    ///< transformer layers (transformerLayerStarts)
  int64_t hidden = 0;    ///< width of the residual stream
  int64_t ffnHidden = 0; ///< inner width of the MLP
  int64_t heads = 0;     ///< query heads
  int64_t kvHeads = 0;   ///< key and value heads (fewer with GQA)
  int64_t seqLength = 0; ///< the attention's sequence
};

/// The shape of `g`: layers from its layer stack, heads and sequence from
/// its first attention op, and hidden and MLP widths from the last weight
/// matmul of its first layer (the MLP's down projection: it reduces over
/// the MLP's width and writes the residual stream); the widths need two
/// layers or more, so that the first layer ends before the LM head.
ModelShape modelShape(const Graph &g);

/// One op a target cannot express: the field of its plan entry ("loops/h",
/// "stage", "zero"; empty for the whole entry) and why.
struct OpFinding {
  OpId op = 0;
  std::string field;
  std::string what;
};

/// The settings that rebuild a plan's layout.
struct EngineLayout {
  int32_t tp = 1, pp = 1, vp = 1, cp = 1;
  bool sp = false;            ///< sequence parallelism
  int64_t dp = 1;             ///< data-parallel ranks
  int64_t batch = 0;          ///< global batch
  int32_t microBatches = 1;   ///< per iteration, per data-parallel rank
  int64_t microBatchSize = 0; ///< batch / (dp x microBatches)
  PipelineSchedule schedule = PipelineSchedule::OneFOneB;
  RecomputeMode recompute = RecomputeMode::None;
  /// The ZeRO stage of every op whose weights a data-parallel group holds
  /// (all alike), and the first such op; -1 when no op has one.
  int zero = 0;
  int64_t zeroOp = -1;
  GradSync gradSync;
  ModelShape shape;
  /// Ops whose weight gradients run in an order of their own
  /// ("weight_grad"), which no engine setting chooses.
  int64_t ownWeightGradOrder = 0;
  /// Whether the settings rebuild every op's configuration and stage; when
  /// not, tp, cp, sp, dp and the micro-batch size are those of the nearest
  /// layout, and `findings` holds the first op that differs.
  bool matches = false;
  /// What no Megatron-style setting expresses, at most one per kind (the
  /// layout, recomputation, ZeRO stages); a target adds its own and
  /// reports the earliest (firstOpError).
  std::vector<OpFinding> findings;

  /// "tp=4,pp=8,vp=12,cp=1,sp=1,dp=4,mbs=1,recompute=selective,zero=1".
  std::string str() const;
};

/// Reads `c`'s plan as an `engine` layout ("Megatron-LM", "NeMo",
/// "torchtitan": the name used in messages). What the layout cannot give op
/// by op goes to `findings`; an input error (exit 2) is returned where the
/// plan as a whole has no such layout (devices left idle, stages without a
/// layer stack, no tensor and context degrees that build), naming the plan
/// file and the JSON pointer. A plan without findings that records the
/// what-if it was built from ("simulate megatron:KEYS", "simulate
/// fsdp:KEYS") is checked against those keys too.
llvm::Expected<EngineLayout> readEngineLayout(const EmitContext &c,
                                              llvm::StringRef engine);

/// The earliest of `findings` (in op order; the first offered among equals)
/// as opError, or success when there are none.
llvm::Error firstOpError(const EmitContext &c,
                         const std::vector<OpFinding> &findings);

/// "PLAN: /ops/N/FIELD: op 'NAME' (KIND) WHAT" as an input error; FIELD may
/// be empty.
llvm::Error opError(const EmitContext &c, OpId op, llvm::StringRef field,
                    const std::string &what);
/// "PLAN: POINTER: WHAT" as an input error.
llvm::Error planError(const EmitContext &c, llvm::StringRef pointer,
                      const std::string &what);

} // namespace soap

#endif // SOAP_EMIT_ENGINELAYOUT_H
