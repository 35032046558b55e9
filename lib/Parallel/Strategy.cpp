// The check of a whole strategy: every op configured and valid, the
// pipeline, and the memory dimensions' vectors.
#include "soap/Parallel/Strategy.h"

#include "soap/Parallel/Megatron.h"
#include "soap/Support/Error.h"
#include <algorithm>
#include <fmt/format.h>
#include <map>
#include <set>

namespace soap {

llvm::Error verifyStrategy(const Strategy &s, const Graph &g,
                           const Topology &topo) {
  if (!s.recompute.empty()) {
    if (s.recompute.size() != g.numOps())
      return inputError("{}: the strategy marks {} ops for recomputation, "
                        "the graph has {}",
                        g.sourcePath, s.recompute.size(), g.numOps());
    for (const Op &o : g.ops())
      if (s.recomputes(o.id) && !recomputeMatters(g, s, o.id))
        return inputError("{}: recomputed, but it saves nothing for "
                          "backward and no recomputed op reads its output",
                          g.where(o.id));
  }
  if (!s.zero.empty()) {
    if (s.zero.size() != g.numOps())
      return inputError("{}: the strategy gives {} ops a ZeRO stage, the "
                        "graph has {}",
                        g.sourcePath, s.zero.size(), g.numOps());
    for (const Op &o : g.ops()) {
      if (s.zeroStage(o.id) > 3)
        return inputError("{}: ZeRO stage {}; the stages are 0 to 3",
                          g.where(o.id), s.zeroStage(o.id));
      if (s.zeroStage(o.id) && o.sem.weightInputs.empty())
        return inputError("{}: ZeRO stage {}, but the op has no weights",
                          g.where(o.id), s.zeroStage(o.id));
    }
  }
  if (!s.weightGrad.empty()) {
    if (s.weightGrad.size() != g.numOps())
      return inputError("{}: the strategy orders the weight gradients of {} "
                        "ops, the graph has {}",
                        g.sourcePath, s.weightGrad.size(), g.numOps());
    for (const Op &o : g.ops()) {
      if (s.weightGrad[size_t(o.id)] > uint8_t(WeightGradOrder::Now))
        return inputError("{}: weight-gradient order {}; the orders are 0 "
                          "(next), 1 (last) and 2 (now)",
                          g.where(o.id), s.weightGrad[size_t(o.id)]);
      if (s.weightGradOrder(o.id) != WeightGradOrder::Next &&
          o.sem.weightInputs.empty())
        return inputError("{}: weight gradients '{}', but the op has no "
                          "weights",
                          g.where(o.id),
                          weightGradOrderName(s.weightGradOrder(o.id)));
    }
  }
  if (s.gradSync.bucketParams < 0)
    return inputError("{}: a gradient bucket of {} parameters", g.sourcePath,
                      s.gradSync.bucketParams);
  if (s.configs.size() != g.numOps())
    return inputError("{}: the strategy configures {} ops, the graph has {}",
                      g.sourcePath, s.configs.size(), g.numOps());
  // A padded vocabulary's loops may split unevenly (OpConfig::tile).
  std::vector<int> vocab;
  if (s.vocabPadding > 0)
    vocab = vocabularyLoops(g);
  for (const Op &o : g.ops())
    if (auto err = verifyConfig(s.configs[o.id], o.sem, topo.numDevices(),
                                g.where(o.id),
                                vocab.empty() ? -1 : vocab[size_t(o.id)]))
      return err;
  return verifyPipeline(s, g);
}

} // namespace soap
