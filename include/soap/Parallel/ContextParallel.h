// Megatron-Core's context parallelism (--context-parallel-size C): every
// activation split C ways along the sequence, the ranks of a cp group
// between the tensor-parallel and the data-parallel ones, weights
// replicated over the group (their gradients all-reduced over dp x cp), and
// the fused attention split on its query loop, which soapc simulates as
// ring attention (OpSemantics::ringBlock, TaskGraph::buildRing).
#ifndef SOAP_PARALLEL_CONTEXTPARALLEL_H
#define SOAP_PARALLEL_CONTEXTPARALLEL_H

#include "soap/Parallel/Strategy.h"

namespace soap {

/// The sequence length of `g`'s attention: FlashAttention's query loop, or
/// the query dim of an eager [batch, heads, q, k] softmax; 0 when it has
/// none.
int64_t attentionSequence(const Graph &g);

/// Whether any attention of `g` is causal (a FlashAttention with causal=1).
bool hasCausalAttention(const Graph &g);

/// Megatron's configurations with context parallelism: `configs`, as
/// megatronGroupConfigs(g, t, d) builds them on t x d devices (device
/// si * t + ti), each op's sequence loop additionally split `cp` ways (ops
/// without one replicated over the cp group), on t x cp x d devices in
/// Megatron's rank order (tp fastest, then cp, then dp): device
/// ti + t * (ci + cp * si). The sequence loop is found by following the
/// sequence dim of the graph's inputs ([batch, sequence, ...] of the
/// attention's length) through the ops' index maps; a [batch x sequence]
/// dim (the LM head behind a Reshape) splits dp x cp ways where each of
/// `microBatches` still divides into whole granules. Errors (exit 2) name
/// an op whose sequence loop does not divide into cp parts, or a graph
/// without attention. With `sequenceParallel` (`configs` built with
/// sequence parallelism), an op the tensor-parallel group splits along the
/// sequence is split t x cp ways along it: cp rank ci's part of the
/// sequence, cut t ways over its tensor-parallel ranks, as Megatron-Core
/// runs sequence parallelism inside a context-parallel group.
llvm::Expected<std::vector<OpConfig>>
contextParallelConfigs(const Graph &g, const std::vector<OpConfig> &configs,
                       int32_t t, int32_t cp, int32_t microBatches,
                       bool sequenceParallel = false);

} // namespace soap

#endif // SOAP_PARALLEL_CONTEXTPARALLEL_H
