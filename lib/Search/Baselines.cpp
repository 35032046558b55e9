// The built-in strategies as searchers: data, model and expert parallelism,
// and the balanced strategy. They search nothing; they are the baselines
// every searcher is compared to.
#include "ConfigCost.h"
#include "soap/Parallel/BuiltinStrategies.h"
#include "soap/Parallel/Megatron.h"
#include "soap/Search/Searcher.h"
#include "soap/Support/Error.h"
#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <spdlog/spdlog.h>

namespace soap {

namespace {

/// What each device holds of input `i` of `op` under its producer's chosen
/// configuration (linear in the tiles: on 1,024 devices a consumer task
/// meets only its own device's boxes); nullopt where nothing produced it
/// (a weight, a graph input).
using HeldBoxes = std::map<DeviceId, std::vector<Box>>;
std::optional<HeldBoxes> heldInput(const Graph &g, const Op &op, int i,
                                   const Strategy &chosen) {
  ValueId v = op.inputs[size_t(i)];
  if (v == kNoValue || g.value(v).producer < 0)
    return std::nullopt;
  const Value &val = g.value(v);
  const Op &q = g.op(val.producer);
  if (size_t(q.id) >= chosen.configs.size())
    return std::nullopt;
  const OpConfig &pc = chosen.configs[size_t(q.id)];
  HeldBoxes held;
  for (int64_t t = 0; t < pc.numTiles(); ++t) {
    Box out = q.sem.outputRegion(val.producerOutput, pc.tile(q.sem, t));
    for (int32_t r = 0; r < pc.replicas; ++r)
      held[pc.device(t, r)].push_back(out);
  }
  return held;
}

/// Bytes of `op`'s input `i` (under `c`) that its tasks need from other
/// devices: each task's input region less what `held` (heldInput) has of
/// it on the task's device.
double remoteInputBytes(const Graph &g, const Op &op, int i, const OpConfig &c,
                        const HeldBoxes &held) {
  const Value &val = g.value(op.inputs[size_t(i)]);
  double remote = 0;
  for (int64_t k = 0; k < c.numTiles(); ++k) {
    Box need =
        op.sem.inputRegionInTensor(i, c.tile(op.sem, k), val.shape.dims);
    for (int32_t r = 0; r < c.replicas; ++r) {
      int64_t local = 0;
      auto it = held.find(c.device(k, r));
      if (it != held.end())
        for (const Box &box : it->second)
          local += need.intersect(box).volume();
      remote += double(need.volume() - std::min(local, need.volume()));
    }
  }
  return remote * double(dtypeBytes(val.dtype));
}

} // namespace

llvm::Expected<std::optional<Strategy>>
balancedStrategy(const SearchProblem &p, const ConfigSpace &space,
                 const SearchOptions *o) {
  Strategy s;
  int64_t n = static_cast<int64_t>(p.topo.numDevices());
  double slowest = std::numeric_limits<double>::infinity();
  for (DeviceId d = 1; d < DeviceId(n); ++d)
    slowest = std::min(slowest, p.topo.pathBandwidth(0, d));
  if (!std::isfinite(slowest))
    slowest = 1e12; // one device: nothing moves
  for (const Op &op : p.graph.ops()) {
    if (o && o->pastDeadline())
      return std::optional<Strategy>();
    int64_t most = 0;
    for (const auto &[degree, replicas] : space.shapes(op.id)) {
      OpConfig c{degree, replicas, {}};
      if (c.numTasks() <= n)
        most = std::max(most, c.numTasks());
    }
    // Where its inputs' producers left them: the same for every candidate.
    std::vector<std::optional<HeldBoxes>> held;
    for (size_t i = 0; i < op.inputs.size(); ++i)
      held.push_back(heldInput(p.graph, op, int(i), s));
    std::optional<OpConfig> best;
    Seconds bestScore = 0;
    for (const auto &[degree, replicas] : space.shapes(op.id)) {
      OpConfig c{degree, replicas, {}};
      if (c.numTasks() != most)
        continue;
      c.devices = space.placements(most).front();
      auto cc = configCost(p, op, c);
      if (!cc)
        return cc.takeError();
      // Plus moving its inputs from where their producers left them
      // (forward, and their gradients back), spread over its devices' links
      // at the cluster's slowest path: splits chosen op by op that ignore
      // this reshuffle whole activations between every pair of ops.
      double remote = 0;
      for (size_t i = 0; i < op.inputs.size(); ++i)
        if (held[i])
          remote += remoteInputBytes(p.graph, op, int(i), c, *held[i]);
      Seconds score = cc->busiest() + cc->tail +
                      2 * remote / (double(most) * slowest);
      if (!best || score < bestScore) {
        best = std::move(c);
        bestScore = score;
      }
    }
    s.configs.push_back(std::move(*best));
  }
  return std::optional<Strategy>(std::move(s));
}

namespace {
class BuiltinSearcher : public Searcher {
public:
  explicit BuiltinSearcher(std::string name) : name_(std::move(name)) {}
  llvm::Expected<SearchResult> search(const SearchProblem &p,
                                      const SearchOptions &o) override {
    llvm::Expected<Strategy> s = Strategy();
    if (name_ == "balanced") {
      auto b = balancedStrategy(p, ConfigSpace(p.graph, p.topo, o.space), &o);
      if (!b)
        return b.takeError();
      if (!*b)
        return makeError(ExitCode::Infeasible,
                         "{}: balanced passed its timeout before choosing "
                         "every op's split",
                         p.graph.sourcePath);
      s = std::move(**b);
    } else {
      s = builtinStrategy(name_, p.graph, p.topo);
    }
    if (!s)
      return s.takeError();
    // A strategy that splits consecutive ops differently over many devices
    // moves data between every pair of their tiles: on 1,024 GPUs its task
    // graph outgrows the machine's memory (balanced on GPT-2 did).
    auto e = evaluateIfFits(p, *s, taskLimit(p));
    if (!e) {
      bool tooLarge;
      if (llvm::Error rest = dropTooLarge(e.takeError(), tooLarge))
        return llvm::Error(std::move(rest));
      return makeError(ExitCode::Infeasible,
                       "{}: the {} strategy's task graph has more than {} "
                       "tasks on {} devices, too many to simulate; data, "
                       "megatron and pipeline plan this scale",
                       p.graph.sourcePath, name_, taskLimit(p),
                       p.topo.numDevices());
    }
    if (!*e)
      return makeError(ExitCode::Infeasible,
                       "{}: the {} strategy does not fit in device memory",
                       p.graph.sourcePath, name_);
    SearchResult r;
    r.strategy = std::move(*s);
    r.iterationTime = **e;
    return r;
  }

private:
  std::string name_;
};

/// Megatron-LM's hand-written plan, tuned as its users tune it: the
/// what-if builder's pieces (Parallel/Megatron.h and WhatIf.h: column/row
/// splits with the vocabulary-parallel LM head, stages of equal layers,
/// Megatron's selective recomputation) over its keys: every
/// tensor-parallel degree t that divides a node's GPUs (powers of two) and
/// every stage count p that divides the nodes (and the layers, as
/// Megatron-LM requires), without and (t > 1, a graph with attention) with
/// sequence parallelism, each with 1F1B from m = 4p,
/// the distributed optimizer and recomputation as needed, more
/// micro-batches while they pay; the fastest that fits.
class MegatronSearcher : public Searcher {
public:
  llvm::Expected<SearchResult> search(const SearchProblem &p,
                                      const SearchOptions &given) override {
    // A simulation started just before --timeout ends past it (by seconds
    // on a large model, more when compare runs searchers at once): the
    // deadline the shapes see is moved earlier by the slowest simulation so
    // far, so that the last one ends about when the timeout does.
    SearchOptions o = given;
    double slowest = 0; // seconds per simulation, the most of any shape
    const auto kNoDeadline = std::chrono::steady_clock::time_point::max();
    size_t nodes = std::max<size_t>(1, p.topo.numNodes());
    int32_t perNode = int32_t(p.topo.devicesPerNode());
    std::optional<SearchResult> best;
    std::string lastError;
    std::vector<Shaped> pipelined;
    // Sequence parallelism where the graph has a sequence to split.
    bool sequenceToSplit = hasSequence(p.graph);
    // Megatron-LM needs the layers to divide into the stages: a stage
    // count that does not is not one its users can run (and past the layer
    // count a stage would hold a fraction of one).
    int64_t layers = int64_t(transformerLayerStarts(p.graph).size());
    std::vector<MegatronShape> shapes;
    for (int32_t t = 1; t <= perNode; t *= 2)
      for (int32_t stages = 1; size_t(stages) <= nodes; stages *= 2)
        for (bool sp : {false, true})
          if (perNode % t == 0 && nodes % size_t(stages) == 0 &&
              (layers == 0 || layers % stages == 0) &&
              (!sp || (t > 1 && sequenceToSplit)))
            // Without stages from one micro-batch: the plain data (and
            // tensor) parallelism the baseline generalises.
            shapes.push_back({t, stages, stages == 1 ? 1 : 0, sp});
    for (const MegatronShape &shape : shapes) {
      if (o.pastDeadline())
        break;
      int32_t t = shape.tensor, stages = shape.pipeline;
      bool sp = shape.sequence;
      auto s = megatronStrategy(p.graph, p.topo, shape);
      if (!s) {
        lastError = errorMessage(s.takeError());
        continue;
      }
      // As a user tunes Megatron-LM: its distributed optimizer (ZeRO-1),
      // then selective and full recomputation when the shape does not
      // fit, and more micro-batches (a smaller --micro-batch-size) while
      // nothing fits or they still pay.
      uint64_t n = 0;
      auto shapeStart = std::chrono::steady_clock::now();
      // Lighter rungs at more micro-batches are tried too: Megatron-LM
      // users run a micro-batch of 1 without recomputation where it fits
      // (NeMo's GPT-3 175B) rather than recompute at a larger one.
      auto fit = fitMicroBatches(p, *s, memoryLadder(true), n, o,
                                 /*whileLighter=*/true);
      if (!fit)
        return fit.takeError();
      tried_ += n;
      if (n > 0 && given.deadline != kNoDeadline) {
        using namespace std::chrono;
        double each =
            duration<double>(steady_clock::now() - shapeStart).count() /
            double(n);
        slowest = std::max(slowest, each);
        o.deadline = given.deadline - duration_cast<steady_clock::duration>(
                                          duration<double>(slowest));
      }
      if (!*fit) {
        spdlog::info("megatron: t={} p={}{}: does not fit", t, stages,
                     sp ? " sp" : "");
        continue;
      }
      spdlog::info("megatron: t={} p={}{} m={}{}: {:.3f} ms", t, stages,
                   sp ? " sp" : "", s->pipeline.microBatches,
                   (*fit)->second.str(), (*fit)->first * 1e3);
      if (stages > 1)
        pipelined.push_back({(*fit)->first, t, sp, *s});
      if (!best || (*fit)->first < best->iterationTime) {
        best = SearchResult();
        best->strategy = std::move(*s);
        best->iterationTime = (*fit)->first;
      }
    }
    if (best)
      if (auto err = refineSchedule(p, o, pipelined, *best))
        return llvm::Error(std::move(err));
    if (!best) {
      if (o.pastDeadline())
        return llvm::make_error<DeadlineExceeded>("megatron");
      return makeError(ExitCode::Infeasible,
                       "{}: no Megatron shape (tensor x pipeline) fits in "
                       "device memory{}",
                       p.graph.sourcePath,
                       lastError.empty() ? "" : "; last: " + lastError);
    }
    best->proposals = tried_;
    best->timedOut = o.pastDeadline();
    return std::move(*best);
  }

private:
  /// A fitted pipelined shape: its time, tensor degree, whether it has
  /// sequence parallelism, and its strategy.
  struct Shaped {
    Seconds time;
    int32_t tensor;
    bool sequence; ///< sequence parallelism
    Strategy strategy;
  };

  /// The schedules a Megatron user tries on a pipeline that fits: zb-h1,
  /// and the interleaved 1F1B with every virtual-stage count v that divides
  /// the layers per stage, the largest first (stages of layers / (p v)
  /// layers, stage s on rank s mod p), on the two fastest pipelined shapes, each with
  /// the micro-batches and memory savings its 1F1B fit chose, and more
  /// savings (Megatron's ladder) where it then does not fit: interleaving
  /// holds more micro-batches' activations. The fastest that fits replaces
  /// `best`.
  llvm::Error refineSchedule(const SearchProblem &p, const SearchOptions &o,
                             std::vector<Shaped> &shapes, SearchResult &best) {
    std::stable_sort(shapes.begin(), shapes.end(),
                     [](const Shaped &a, const Shaped &b) {
                       return a.time < b.time;
                     });
    int64_t layers = int64_t(transformerLayerStarts(p.graph).size());
    for (size_t k = 0; k < shapes.size() && k < 2; ++k) {
      const Strategy &base = shapes[k].strategy;
      int32_t stages = base.pipeline.numStages();
      std::vector<Strategy> tries;
      Strategy zb = base;
      zb.pipeline.schedule = PipelineSchedule::ZbH1;
      tries.push_back(std::move(zb));
      // The most chunks first: they cut the bubble most ((p - 1) / (v m)),
      // and under --timeout they are what a user would not want cut.
      for (int64_t v = layers > 0 && layers % stages == 0 ? layers / stages : 0;
           v >= 2; --v) {
        if ((layers / stages) % v != 0 ||
            base.pipeline.microBatches % stages != 0)
          continue;
        tries.push_back(megatronInterleaved(p.graph, p.topo, base,
                                            shapes[k].tensor,
                                            shapes[k].sequence, int32_t(v)));
      }
      // As it is, then with Megatron's savings (the distributed optimizer,
      // selective and full recomputation) if it does not fit.
      if (auto err = keepFastestFit(
              p, o, tries, memoryLadder(true),
              fmt::format("megatron: t={} p={}{}", shapes[k].tensor, stages,
                          shapes[k].sequence ? " sp" : ""),
              best, tried_))
        return err;
    }
    return llvm::Error::success();
  }

  uint64_t tried_ = 0;
};
} // namespace

void registerBaselineSearchers(SearcherRegistry &r) {
  r.add({"data", "data parallelism: every op split by sample over all devices",
         [] { return std::make_unique<BuiltinSearcher>("data"); }});
  r.add({"model",
         "model parallelism: ops whole, consecutive ops on devices 0..N-1 "
         "with equal forward FLOPs",
         [] { return std::make_unique<BuiltinSearcher>("model"); }});
  r.add({"balanced",
         "every op split over all devices, each at the split whose busiest "
         "device works least (with its weight all-reduce)",
         [] { return std::make_unique<BuiltinSearcher>("balanced"); }});
  r.add({"megatron",
         "Megatron-LM by hand: tensor parallel in a node (column/row "
         "splits), pipeline stages across nodes, data parallel over the "
         "rest, 1F1B from 4 micro-batches per stage (more, its distributed "
         "optimizer and recomputation until it fits); the best t x p",
         [] { return std::make_unique<MegatronSearcher>(); }});
  r.add({"expert",
         "expert-designed: Krizhevsky's one weird trick for CNNs, GNMT's "
         "layer-per-GPU for RNNs, else data parallel",
         [] { return std::make_unique<BuiltinSearcher>("expert"); }});
}

} // namespace soap
