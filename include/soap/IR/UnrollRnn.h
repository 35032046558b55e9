// Unrolling LSTM layers into per-time-step cells, as FlexFlow does for its
// RNNs, so that parallelism across layers and time steps is in the space.
#ifndef SOAP_IR_UNROLLRNN_H
#define SOAP_IR_UNROLLRNN_H

#include "soap/IR/Graph.h"
#include "llvm/Support/Error.h"
#include <memory>

namespace soap {

/// Returns a graph in which every single-direction LSTM without
/// sequence_lens becomes T LSTMCell ops. A layer whose input is the
/// previous unrolled layer's output (through PyTorch's Squeeze of the
/// direction axis) reads that layer's step outputs directly, so step t of
/// layer l+1 depends only on step t of layer l. Full outputs that are still
/// used are rebuilt by Stack. Ops left without users are removed. The
/// result has computed semantics; weights, parameters and FLOPs are
/// unchanged.
llvm::Expected<std::unique_ptr<Graph>> unrollLstms(const Graph &g);

} // namespace soap

#endif // SOAP_IR_UNROLLRNN_H
