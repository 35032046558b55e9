// The hand-written plan of Megatron-LM (Shoeybi et al. 2019, Narayanan et
// al. SC21), as a user writes it for soapc's graphs: tensor parallelism of
// degree t inside a node (the column split of a weight matmul whose input is
// whole, the row split of one whose input is split by the previous column
// split, ops between them split along the same tensor dim, everything else
// replicated over the t ranks), pipeline stages of about equal forward FLOPs
// on consecutive groups of nodes, data parallelism over the rest, and 1F1B
// with m = 4 x stages micro-batches (fewer where the batch does not divide;
// without stages, gradient accumulation over 4).
#ifndef SOAP_PARALLEL_MEGATRON_H
#define SOAP_PARALLEL_MEGATRON_H

#include "soap/Parallel/Strategy.h"

namespace soap {

struct MegatronShape {
  int32_t tensor = 1;   ///< t: ranks of a tensor-parallel group, in a node
  int32_t pipeline = 1; ///< p: stages
  /// m; 0: 4 x stages, halved until it divides the batch.
  int32_t microBatches = 0;
  /// Sequence parallelism (megatronGroupConfigs).
  bool sequence = false;
};

/// The Megatron strategy of `shape` for `g` on `topo`. Errors (exit 2) when
/// the shape does not fit the topology (t must divide the GPUs of a node,
/// t x p the devices) or the batch cannot be split d ways.
llvm::Expected<Strategy> megatronStrategy(const Graph &g, const Topology &topo,
                                          const MegatronShape &shape);

/// Megatron's configuration of every op on one group of t x d devices,
/// 0 .. t*d - 1: the tensor-parallel split (or replicas) over t adjacent
/// devices, the sample loop split d ways (replicas where it cannot be).
/// With `sequence` (Megatron's sequence parallelism, Korthikanti et al.
/// 2022), an op the tensor split leaves replicated over the t devices —
/// LayerNorm, bias, dropout and residual adds, and the embedding unless it
/// is vocabulary-parallel (below) — is split t ways along its sequence loop
/// (sequenceLoops) where it has one: the
/// simulator then reduce-scatters the row-parallel GEMM's partial sums and
/// the column-parallel GEMM's input gradients, and the column-parallel
/// GEMM gathers its input. With `padVocab` (a strategy whose vocabPadding
/// is set), the vocabulary's loops (vocabularyLoops) split t ways even where
/// t does not divide them, into OpConfig::tile's ceil-sized tiles, as
/// Megatron-LM splits its padded vocabulary: so the LM head, the embedding
/// and the cross-entropy stay vocabulary-parallel at any t. The token
/// embedding (a Gather of a weight table) is then split by table rows, its
/// partial sums reduced over the group, as Megatron-LM's
/// VocabParallelEmbedding runs.
std::vector<OpConfig> megatronGroupConfigs(const Graph &g, int32_t t, int64_t d,
                                           bool sequence = false,
                                           bool padVocab = false);

/// megatronGroupConfigs for every stage of `pipeline`: each op's group is
/// the t x d devices of its stage's device group (Pipeline::group), groups
/// on consecutive device ranges.
std::vector<OpConfig> megatronStagedConfigs(const Graph &g,
                                            const Pipeline &pipeline, int32_t t,
                                            int64_t d, bool sequence = false,
                                            bool padVocab = false);

/// Per op, the loop that runs along the sequence, or -1: the attention's
/// query loop (isAttentionOp: FlashAttention's "q", an eager softmax's third
/// loop), carried through the ops' index maps from operand to operand in
/// both directions (weights aside). All -1 in a graph without attention.
std::vector<int> sequenceLoops(const Graph &g);
/// Whether `g` has a sequence (some op's sequenceLoops entry), which
/// sequence parallelism can split.
bool hasSequence(const Graph &g);

/// `s`, a Megatron strategy of t-way tensor parallelism over its p stages
/// (megatronStrategy), interleaved with v model chunks per device group as
/// Megatron-LM's virtual pipeline runs it: p v stages of equal layers
/// (layerStages), stage k on group k mod p, each op configured as its
/// group's (megatronStagedConfigs); all else as in `s`.
Strategy megatronInterleaved(const Graph &g, const Topology &topo,
                             const Strategy &s, int32_t t, bool sequence,
                             int32_t v);

/// Per op, its loop of the vocabulary's size (-1: none), the vocabulary
/// being the class loop of the graph's SoftmaxCrossEntropyLoss (the one
/// its softmax reduces) where a token embedding (a Gather of a weight)
/// has that many rows; none otherwise (a classifier's classes): the token embedding's table rows, the LM head's output
/// features, the loss's classes. What Strategy::vocabPadding pads.
std::vector<int> vocabularyLoops(const Graph &g);

/// Megatron-LM's default --make-vocab-size-divisible-by.
constexpr int32_t kMegatronVocabPadding = 128;
/// Strategy::vocabPadding of Megatron-LM's plans for `g`: its default
/// where `g` has a vocabulary (vocabularyLoops), 0 otherwise.
int32_t megatronVocabPadding(const Graph &g);

/// The ops' stages for `stages` contiguous stages of about equal forward
/// FLOPs, in op (topological) order.
std::vector<int32_t> balancedStages(const Graph &g, int32_t stages);

/// Megatron's stages: equal numbers of transformer layers
/// (transformerLayerStarts), the embedding with the first layer, the final
/// norm, LM head and loss with the last; balancedStages where the graph has
/// no layer stack or `stages` does not divide its layers.
std::vector<int32_t> layerStages(const Graph &g, int32_t stages);

/// The transformer layers of `g`: per attention (FlashAttention, or a
/// Softmax or FusedSoftmax over the last axis of a [batch, heads, q, k]
/// tensor), the first op of its layer, ascending; the first is 0. Empty
/// when the graph has no attention or no layer stack.
std::vector<OpId> transformerLayerStarts(const Graph &g);
/// Whether `op` is attention in the sense above.
bool isAttentionOp(const Op &op);

} // namespace soap

#endif // SOAP_PARALLEL_MEGATRON_H
