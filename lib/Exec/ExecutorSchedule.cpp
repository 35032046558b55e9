// One training step in the pipeline schedule's order: each device group's
// forward, backward and weight-gradient items, activations sent between
// stages.
#include "soap/Exec/Executor.h"

#include "ElementwiseFn.h"
#include "ExecRules.h"
#include "Gemm.h"
#include "Runner.h"
#include "soap/Support/Cores.h"
#include "soap/Support/Error.h"
#include "soap/Support/Json.h"
#include "soap/Support/Rng.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include <chrono>
#include <cmath>
#include <cstring>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <limits>
#include <malloc.h>
#include <map>
#include <optional>
#include <set>
#include <thread>

namespace soap {
namespace exec {

void Runner::sendForward(int32_t stage) {
  const Pipeline &pipe = s_.pipeline;
  if (pipe.numStages() < 2)
    return;
  for (const Op &c : g_.ops()) {
    if (pipe.stage(c.id) == stage)
      continue;
    for (size_t i = 0; i < c.inputs.size(); ++i) {
      ValueId v = c.inputs[i];
      if (v == kNoValue || g_.value(v).kind != ValueKind::Activation ||
          pipe.stage(g_.value(v).producer) != stage)
        continue;
      for (Task &t : tasks(c.id))
        t.in.resize(c.inputs.size());
      gatherInput(c.id, i);
      sent_[size_t(mb_)][size_t(c.id)][i] = 1;
      OpId prod = g_.value(v).producer;
      size_t j = size_t(g_.value(v).producerOutput);
      if (--pending_[size_t(mb_)][size_t(prod)][j] == 0)
        outputRead(prod, j);
    }
  }
}

llvm::Error Runner::runItem(int32_t stage, PipePass pass) {
  const Pipeline &pipe = s_.pipeline;
  auto one = [&](OpId o) -> llvm::Error {
    if (pipe.stage(o) != stage)
      return llvm::Error::success();
    if (pass == PipePass::Forward)
      forward(o);
    else if (pass == PipePass::Backward)
      backward(o);
    else
      accumulateGradients(o);
    return backendError(o);
  };
  if (pass == PipePass::Forward) {
    for (const Op &op : g_.ops())
      if (auto err = one(op.id))
        return err;
    sendForward(stage);
  } else {
    for (size_t o = g_.numOps(); o-- > 0;)
      if (auto err = one(static_cast<OpId>(o)))
        return err;
  }
  return llvm::Error::success();
}

llvm::Error Runner::runStep() {
  const Pipeline &pipe = s_.pipeline;
  int32_t S = pipe.numStages(), m = pipe.microBatches;
  pending_.assign(size_t(m), std::vector<std::vector<int>>(g_.numOps()));
  rereads_.assign(size_t(m), {});
  sent_.assign(size_t(m), std::vector<std::vector<uint8_t>>(g_.numOps()));
  for (int32_t mb = 0; mb < m; ++mb) {
    for (const Op &op : g_.ops()) {
      pending_[size_t(mb)][size_t(op.id)].assign(op.outputs.size(), 0);
      sent_[size_t(mb)][size_t(op.id)].assign(op.inputs.size(), 0);
    }
    for (const Op &op : g_.ops())
      for (ValueId v : op.inputs)
        if (v != kNoValue && g_.value(v).kind == ValueKind::Activation)
          ++pending_[size_t(mb)][size_t(g_.value(v).producer)]
                    [size_t(g_.value(v).producerOutput)];
    rereads_[size_t(mb)] = pending_[size_t(mb)];
    for (auto &per : rereads_[size_t(mb)])
      std::fill(per.begin(), per.end(), 0);
    for (const Op &op : g_.ops())
      if (s_.recomputes(op.id))
        for (ValueId v : op.inputs)
          if (v != kNoValue && g_.value(v).kind == ValueKind::Activation &&
              s_.recomputes(g_.value(v).producer))
            ++rereads_[size_t(mb)][size_t(g_.value(v).producer)]
                      [size_t(g_.value(v).producerOutput)];
    std::fill(recomputed_[size_t(mb)].begin(), recomputed_[size_t(mb)].end(),
              0);
  }
  // Each device group's items in its schedule's order (all forwards then
  // all backwards under GPipe; 1F1B's warm-up, steady state and drain,
  // interleaved over the group's stages; zb-h1's delayed weight
  // gradients), each run as soon as the previous stage's forward (the next
  // stage's backward, the stage's own backward) of the micro-batch has run:
  // every group holds the micro-batches its schedule holds, and every rank
  // walks the same sequence.
  int32_t G = pipe.numGroups();
  std::vector<std::vector<PipeItem>> order(static_cast<size_t>(G));
  for (int32_t grp = 0; grp < G; ++grp)
    order[size_t(grp)] = pipe.order(grp);
  std::vector<size_t> next(size_t(G), 0);
  std::vector<std::vector<uint8_t>> fwd(size_t(S),
                                        std::vector<uint8_t>(size_t(m), 0));
  std::vector<std::vector<uint8_t>> bwd = fwd;
  size_t left = 0;
  for (const auto &o : order)
    left += o.size();
  while (left > 0) {
    bool progress = false;
    for (int32_t grp = 0; grp < G; ++grp) {
      while (next[size_t(grp)] < order[size_t(grp)].size()) {
        const PipeItem &it = order[size_t(grp)][next[size_t(grp)]];
        size_t s = size_t(it.stage), mb = size_t(it.microBatch);
        bool ready = false;
        switch (it.pass) {
        case PipePass::Forward:
          ready = s == 0 || fwd[s - 1][mb];
          break;
        case PipePass::Backward:
          ready = fwd[s][mb] && (s + 1 == size_t(S) || bwd[s + 1][mb]);
          break;
        case PipePass::Weight:
          ready = bwd[s][mb];
          break;
        }
        if (!ready)
          break;
        mb_ = it.microBatch;
        if (auto err = runItem(it.stage, it.pass))
          return err;
        if (it.pass != PipePass::Weight)
          (it.pass == PipePass::Backward ? bwd : fwd)[s][mb] = 1;
        ++next[size_t(grp)];
        --left;
        progress = true;
      }
    }
    if (!progress)
      return internalError("the pipeline's schedule is stuck");
  }
  mb_ = 0;
  return llvm::Error::success();
}

} // namespace exec
} // namespace soap
