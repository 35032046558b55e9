// The baseline strategies searchers are compared with and start from
// (FlexFlow sections 6.2 and 8.1.1): data parallelism, layer-wise model
// parallelism, and the expert-designed strategies of FlexFlow's evaluation.
#ifndef SOAP_PARALLEL_BUILTINSTRATEGIES_H
#define SOAP_PARALLEL_BUILTINSTRATEGIES_H

#include "soap/IR/Graph.h"
#include "soap/Machine/Topology.h"
#include "soap/Parallel/Strategy.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

namespace soap {

/// Every op split on its (first splittable) Sample loop over devices
/// 0..d-1, d the largest legal degree <= numDevices; an op without one runs
/// unsplit on device 0.
Strategy dataParallel(const Graph &g, const Topology &topo);

/// Layer-wise placement: ops unsplit, consecutive ops (topological order)
/// on devices 0..N-1 in contiguous ranges of about equal forward FLOPs;
/// every device gets an op when there are at least N ops.
Strategy modelParallel(const Graph &g, const Topology &topo);

/// FlexFlow's expert baselines (section 8.1.1). CNNs (Conv, no LSTM):
/// Krizhevsky's "one weird trick", data parallel up to the first Gemm or
/// MatMul with a weight, parameter parallel from there on. RNNs (LSTM or
/// LSTMCell): GNMT's, the graph replicated across nodes (sample split, one
/// device per node) and, inside a node, LSTM layer i on local rank
/// i mod gpusPerNode, what precedes the first LSTM on rank 0 and what
/// follows the last on the last rank. Anything else: data parallel.
Strategy expertStrategy(const Graph &g, const Topology &topo);

/// "data", "model" or "expert"; any other name is an input error listing
/// them.
llvm::Expected<Strategy> builtinStrategy(llvm::StringRef name, const Graph &g,
                                         const Topology &topo);

} // namespace soap

#endif // SOAP_PARALLEL_BUILTINSTRATEGIES_H
