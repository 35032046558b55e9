// The `pipeline` searcher: Alpa's inter-operator pass over
// soapc's space. For each stage count p (a power of two dividing the
// devices, at most max(8, nodes)) the devices form p equal groups of
// consecutive ids; for each intra-stage plan of such a group (SOYBEAN's k-cuts
// tiling on log2(group) cuts, and Megatron's tensor x data split for every
// tensor degree that fits a node, with and without sequence parallelism,
// with Megatron-LM's padded vocabulary)
// the op sequence is cut into p contiguous
// stages that minimise Alpa's pipeline latency, the sum of the stage times plus
// (m - 1) times the slowest: the sum is fixed, so this is the linear partition
// that minimises the slowest stage, from each op's cost under that plan. Each
// candidate is then simulated with m micro-batches (1F1B) from m = p,
// doubled while nothing fits yet or the time still improves, each count
// tried again with ZeRO and recomputation when it does not fit
// (fitMicroBatches); the fastest that fits is kept. The two fastest
// pipelines are tried again under zb-h1 and interleaved (refineSchedule).
#include "ConfigCost.h"
#include "KCuts.h"
#include "soap/Parallel/Megatron.h"
#include "soap/Search/Searcher.h"
#include "soap/Support/Error.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <set>
#include <spdlog/spdlog.h>

namespace soap {

namespace {

struct IntraPlan {
  std::string name;
  std::vector<OpConfig> configs; ///< on devices 0 .. group - 1
  /// Megatron's sequence parallelism: its collectives overlapped with the
  /// GEMMs, as NeMo's recipes run it (GradSync::tpCommOverlap).
  bool sequence = false;
  /// Strategy::vocabPadding: Megatron's padded vocabulary, so that its LM
  /// head, embedding and loss split t ways at any t.
  int32_t vocabPadding = 0;
};

/// Cuts ops 0..n-1 into `p` contiguous, non-empty stages whose slowest is
/// as fast as can be (to 60 halvings of the bound); empty when impossible.
std::vector<int32_t> cutStages(const std::vector<double> &cost, int32_t p) {
  size_t n = cost.size();
  std::vector<double> prefix(n + 1, 0);
  for (size_t i = 0; i < n; ++i)
    prefix[i + 1] = prefix[i] + cost[i];
  auto span = [&](size_t a, size_t b) { return prefix[b] - prefix[a]; };
  // Minimising the slowest stage (a linear partition): binary search over
  // the bound with a greedy feasibility check, exact on the candidates.
  auto partition = [&](double bound) -> std::optional<std::vector<size_t>> {
    std::vector<size_t> starts{0};
    size_t a = 0;
    for (size_t i = 0; i < n; ++i)
      if (span(a, i + 1) > bound) {
        if (i == a)
          return std::nullopt; // one op alone exceeds it
        a = i;
        starts.push_back(i);
      }
    if (starts.size() > size_t(p))
      return std::nullopt;
    // Too few stages: split the largest stages further (every stage needs
    // an op; splitting never raises the slowest).
    while (starts.size() < size_t(p)) {
      size_t best = 0, bestLen = 0;
      for (size_t s = 0; s < starts.size(); ++s) {
        size_t end = s + 1 < starts.size() ? starts[s + 1] : n;
        if (end - starts[s] > bestLen) {
          bestLen = end - starts[s];
          best = s;
        }
      }
      if (bestLen < 2)
        return std::nullopt;
      size_t end = best + 1 < starts.size() ? starts[best + 1] : n;
      size_t mid = starts[best] + 1;
      while (mid + 1 < end && span(starts[best], mid + 1) < span(mid + 1, end))
        ++mid;
      starts.insert(starts.begin() + long(best) + 1, mid);
    }
    return starts;
  };
  double lo = 0, hi = prefix[n];
  for (double c : cost)
    lo = std::max(lo, c);
  std::vector<size_t> bestStarts;
  for (int it = 0; it < 60; ++it) {
    double mid = (lo + hi) / 2;
    if (auto s = partition(mid)) {
      hi = mid;
      bestStarts = *s;
    } else {
      lo = mid;
    }
  }
  if (bestStarts.empty()) {
    auto s = partition(hi);
    if (!s)
      return {};
    bestStarts = *s;
  }
  std::vector<int32_t> stageOf(n, 0);
  for (size_t s = 0; s < bestStarts.size(); ++s) {
    size_t end = s + 1 < bestStarts.size() ? bestStarts[s + 1] : n;
    for (size_t i = bestStarts[s]; i < end; ++i)
      stageOf[i] = int32_t(s);
  }
  return stageOf;
}

/// The intra-stage plans of a group of `group` devices (a power of two).
std::vector<IntraPlan> intraPlans(const SearchProblem &p, size_t group,
                                  int32_t perNode) {
  std::vector<IntraPlan> plans;
  int k = 0;
  while ((size_t(1) << k) < group)
    ++k;
  kcuts::KCutsPlan kp = kcuts::kCuts(p.graph, k);
  plans.push_back({"kcuts", kcuts::toStrategy(p.graph, kp).configs});
  bool sequenceToSplit = hasSequence(p.graph);
  for (int32_t t = 1; size_t(t) <= group && t <= perNode; t *= 2) {
    // Tensor parallelism with and without sequence parallelism, as a
    // Megatron user tunes it.
    for (bool sequence : {false, true}) {
      if (sequence && (t < 2 || !sequenceToSplit))
        continue;
      // With Megatron-LM's padded vocabulary, as the megatron baseline
      // runs it: without it, a vocabulary t does not divide (GPT's 50,257)
      // leaves the LM head replicated over the tensor group, t times its
      // work (GPT-3 175B, t 4: 4.8 s more on the last stage of 8).
      int32_t padding = t > 1 ? megatronVocabPadding(p.graph) : 0;
      IntraPlan m{fmt::format("megatron t={}{}", t, sequence ? " sp" : ""),
                  megatronGroupConfigs(p.graph, t, int64_t(group) / t,
                                       sequence, padding > 0),
                  sequence, padding};
      // k-cuts often is data parallelism, which is Megatron's t = 1.
      bool seen = false;
      for (const IntraPlan &q : plans)
        seen |= q.configs == m.configs;
      if (!seen)
        plans.push_back(std::move(m));
    }
  }
  return plans;
}

/// A pipeline that fits: its time, device group size, intra-stage plan
/// (on devices 0 .. group - 1), the ops' costs under it, and the strategy.
struct Fitted {
  Seconds time;
  size_t group;
  std::vector<OpConfig> configs;
  std::vector<double> cost;
  Strategy strategy;
};

/// The schedules beyond 1F1B, on the two fastest pipelines: zb-h1, and the
/// interleaved 1F1B with v = 2, 4, 8, 16 and (in a layer stack) every
/// divisor of the layers per stage model chunks per group (the ops cut
/// into p v stages as the p stages were, stage s on group s mod p), each
/// with its pipeline's micro-batches and memory savings, more savings where
/// it then does not fit; the fastest that fits replaces `best`.
llvm::Error refineSchedule(const SearchProblem &p, const SearchOptions &o,
                           std::vector<Fitted> &fitted, SearchResult &best,
                           uint64_t &simulated) {
  std::stable_sort(fitted.begin(), fitted.end(),
                   [](const Fitted &a, const Fitted &b) {
                     return a.time < b.time;
                   });
  for (size_t k = 0; k < fitted.size() && k < 2; ++k) {
    const Fitted &f = fitted[k];
    const Strategy &base = f.strategy;
    int32_t stages = base.pipeline.numStages();
    std::vector<Strategy> tries;
    Strategy zb = base;
    zb.pipeline.schedule = PipelineSchedule::ZbH1;
    tries.push_back(std::move(zb));
    // v = 2, 4, 8, 16, and in a layer stack every v that divides the
    // layers per stage (NeMo's GPT-3 175B: 12 on 8 stages of 12 layers).
    std::set<int32_t> chunks;
    for (int32_t v = 2; v <= 16; v *= 2)
      chunks.insert(v);
    int64_t layers = int64_t(transformerLayerStarts(p.graph).size());
    if (layers > 0 && layers % stages == 0)
      for (int64_t v = 2; v <= layers / stages; ++v)
        if ((layers / stages) % v == 0)
          chunks.insert(int32_t(v));
    for (int32_t v : chunks) {
      if (size_t(stages) * size_t(v) > p.graph.numOps() ||
          base.pipeline.microBatches % stages != 0)
        break;
      Strategy s = base;
      s.pipeline.chunks = v;
      // Whole layers per chunk where they divide, as Megatron-LM cuts them
      // (the embedding with the first, the LM head with the last): a cut by
      // cost into p v stages need not give every device group the same
      // layers, and a group's chunks add up.
      s.pipeline.stageOf = layers > 0 && layers % (int64_t(stages) * v) == 0
                               ? layerStages(p.graph, stages * v)
                               : cutStages(f.cost, stages * v);
      if (s.pipeline.stageOf.empty())
        continue;
      s.configs = f.configs;
      for (const Op &op : p.graph.ops())
        for (DeviceId &d : s.configs[size_t(op.id)].devices)
          d += DeviceId(size_t(s.pipeline.group(s.pipeline.stage(op.id))) *
                        f.group);
      // The 1F1B fit's savings, on the new configurations.
      s.zero = base.zero;
      s.recompute = base.recompute;
      tries.push_back(std::move(s));
    }
    if (auto err = keepFastestFit(
            p, o, tries, memoryLadder(),
            fmt::format("pipeline: {} stages x {},", stages, f.group), best,
            simulated))
      return err;
  }
  return llvm::Error::success();
}

class PipelineSearcher : public Searcher {
public:
  llvm::Expected<SearchResult> search(const SearchProblem &p,
                                      const SearchOptions &o) override {
    if (auto err = o.validate())
      return llvm::Error(std::move(err));
    size_t devices = p.topo.numDevices();
    size_t nodes = std::max<size_t>(1, p.topo.numNodes());
    int32_t perNode = int32_t(p.topo.devicesPerNode());
    std::optional<SearchResult> best;
    uint64_t simulated = 0;
    std::vector<Fitted> fitted;
    // Stages across nodes as Megatron places them, and up to 8 inside
    // one: more stages than that only add bubbles at these batch sizes.
    size_t maxStages = std::max<size_t>(8, nodes);
    for (int32_t stages = 1; size_t(stages) <= std::min(devices, maxStages) &&
                             size_t(stages) <= p.graph.numOps();
         stages *= 2) {
      size_t group = devices / size_t(stages);
      if (devices % size_t(stages) != 0 || (group & (group - 1)) != 0)
        continue;
      if (o.pastDeadline())
        break;
      for (IntraPlan &plan : intraPlans(p, group, perNode)) {
        // Each op's time on its group: its busiest device's forward and
        // backward work.
        std::vector<double> cost;
        for (const Op &op : p.graph.ops()) {
          auto cc = configCost(p, op, plan.configs[size_t(op.id)]);
          if (!cc)
            return cc.takeError();
          cost.push_back(cc->busiest());
        }
        if (o.pastDeadline())
          break;
        // m from the stage count up (1F1B's bubble shrinks as m grows).
        Strategy s;
        s.configs = plan.configs;
        s.gradSync.tpCommOverlap = plan.sequence;
        s.vocabPadding = plan.vocabPadding;
        s.pipeline.microBatches = stages;
        s.pipeline.schedule = PipelineSchedule::OneFOneB;
        if (stages > 1) {
          s.pipeline.stageOf = cutStages(cost, stages);
          if (s.pipeline.stageOf.empty())
            continue;
        }
        for (const Op &op : p.graph.ops())
          for (DeviceId &d : s.configs[size_t(op.id)].devices)
            d += DeviceId(size_t(s.pipeline.stage(op.id)) * group);
        if (llvm::Error err = verifyStrategy(s, p.graph, p.topo)) {
          llvm::consumeError(std::move(err)); // m does not divide
          continue;
        }
        // Micro-batches doubled while nothing fits or they still pay, each
        // count with ZeRO and recomputation when it does not fit as it is.
        auto fit = fitMicroBatches(p, s, memoryLadder(), simulated, o);
        if (!fit)
          return fit.takeError();
        if (!*fit) {
          spdlog::info("pipeline: {} stages x {} ({}): does not fit", stages,
                       group, plan.name);
          continue;
        }
        spdlog::info("pipeline: {} stages x {} ({}), m={}{}: {:.3f} ms", stages,
                     group, plan.name, s.pipeline.microBatches,
                     (*fit)->second.str(), (*fit)->first * 1e3);
        if (stages > 1)
          fitted.push_back({(*fit)->first, group, plan.configs, cost, s});
        if (!best || (*fit)->first < best->iterationTime) {
          best = SearchResult();
          best->strategy = std::move(s);
          best->iterationTime = (*fit)->first;
        }
        if (o.progress)
          o.progress({best->iterationTime, simulated, 0, 0});
      }
    }
    if (best)
      if (auto err = refineSchedule(p, o, fitted, *best, simulated))
        return llvm::Error(std::move(err));
    if (!best) {
      if (o.pastDeadline())
        return llvm::make_error<DeadlineExceeded>("pipeline");
      return makeError(ExitCode::Infeasible,
                       "{}: no pipeline of the candidates fits in device "
                       "memory",
                       p.graph.sourcePath);
    }
    best->proposals = simulated;
    best->timedOut = o.pastDeadline();
    return std::move(*best);
  }
};

} // namespace

void registerPipelineSearcher(SearcherRegistry &r) {
  r.add({"pipeline",
         "Alpa's inter-op pass: stage counts x intra-stage plans (k-cuts, "
         "Megatron tensor x data, with and without sequence parallelism), "
         "stages cut to minimise the slowest, "
         "micro-batches from p doubled while they pay, 1F1B, ZeRO and "
         "recomputation where it does not fit, then zb-h1 and interleaving "
         "on the two fastest; the fastest that fits",
         [] { return std::make_unique<PipelineSearcher>(); }});
}

} // namespace soap
