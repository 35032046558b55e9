// FlexFlow's MCMC search (section 6): Metropolis-Hastings over per-op
// configurations, every proposal scored by delta simulation. Proposals
// replace one random op's configuration with a random valid one, or (the
// locality-aware proposal) with a neighbour's configuration; acceptance is
// min(1, exp(beta * (cost(S) - cost(S*)))) (Eq. 1) on simulated iteration
// time; strategies that do not fit in memory are never accepted. Initial
// candidates: data parallel, expert, model parallel and a random strategy;
// each gets an equal share of the budget and stops early after no
// improvement for half of its share.
#include "soap/Parallel/BuiltinStrategies.h"
#include "soap/Parallel/Megatron.h"
#include "soap/Search/McmcMoves.h"
#include "soap/Search/Searcher.h"
#include "soap/Support/Error.h"
#include "soap/Support/Rng.h"
#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <spdlog/spdlog.h>
#include <thread>

namespace soap {

namespace {

using Clock = std::chrono::steady_clock;

/// Tasks of a start's full graph past which its chain is folded.
constexpr size_t kFoldAbove = size_t(1) << 20;

/// The configuration `from` (a neighbour's) adapted to op `o`: loops are
/// matched by class, in order (first Sample loop to first Sample loop, ...),
/// devices copied. nullopt when the result is not a valid configuration.
std::optional<OpConfig> adaptConfig(const OpConfig &from,
                                    const OpSemantics &fromSem,
                                    const OpSemantics &sem,
                                    const ConfigSpace &space, OpId o) {
  OpConfig c;
  c.degree.assign(sem.loops.size(), 1);
  c.replicas = from.replicas;
  c.devices = from.devices;
  std::vector<bool> used(sem.loops.size(), false);
  for (size_t l = 0; l < fromSem.loops.size(); ++l) {
    if (from.degree[l] == 1)
      continue;
    bool placed = false;
    for (size_t k = 0; k < sem.loops.size() && !placed; ++k)
      if (!used[k] && sem.loops[k].cls == fromSem.loops[l].cls) {
        c.degree[k] = from.degree[l];
        used[k] = placed = true;
      }
    if (!placed)
      return std::nullopt;
  }
  if (!space.contains(o, c))
    return std::nullopt;
  return c;
}

Bytes peakMemory(const TaskGraph &tg) {
  Bytes peak = 0;
  for (const auto &m : tg.memory())
    peak = std::max(peak, m.total());
  return peak;
}

struct ChainResult {
  Strategy best;
  Seconds bestTime = std::numeric_limits<double>::infinity();
  uint64_t proposals = 0, accepted = 0, rejectedEarly = 0;
  bool timedOut = false;
};

class Chain {
public:
  Chain(const SearchProblem &p, const SearchOptions &o, const ConfigSpace &s,
        std::vector<std::vector<OpId>> neighbours)
      : p_(p), o_(o), space_(s), neighbours_(std::move(neighbours)) {}

  llvm::Expected<ChainResult> run(const Strategy &initial, Rng rng,
                                  uint64_t proposalBudget,
                                  double secondsBudget) {
    SimContext ctx = p_.context();
    // A structural move that would grow the graph past taskLimit (more
    // micro-batches on 1,024 GPUs) is refused like any invalid move.
    ctx.maxTasks = taskLimit(p_);
    auto built = TaskGraph::build(ctx, initial);
    if (!built)
      return built.takeError();
    // A folded chain (Sim/Fold.h) takes only proposals that keep the fold,
    // so fold only where the full graph passes a million tasks (hundreds of
    // GPUs), where an asymmetric proposal costs seconds to simulate:
    // elsewhere the chain walks the whole space, as FlexFlow's does.
    if (built->fold().active() &&
        built->numAlive() * size_t(built->fold().factor) <= kFoldAbove) {
      ctx.fold = false;
      built = TaskGraph::build(ctx, initial);
      if (!built)
        return built.takeError();
    }
    folded_ = built->fold();
    auto tg = std::make_unique<TaskGraph>(std::move(*built));
    auto sim = std::make_unique<Simulator>(*tg);
    Seconds cur = sim->simulateFull();
    bool curFits = tg->fits();
    Bytes curPeak = peakMemory(*tg);
    groups_ = stageDeviceRanges(initial, p_.topo.numDevices());
    ChainResult r;
    if (curFits) {
      r.best = initial;
      r.bestTime = cur;
    }
    // Eq. 1's beta: by default a proposal 1% slower than the current
    // strategy is accepted with probability e^-2.
    double beta = o_.beta > 0 ? o_.beta : 200.0 / cur;
    const Graph &g = p_.graph;
    auto start = Clock::now();
    uint64_t lastImprovement = 0;
    double lastImprovementAt = 0;
    // Metropolis-Hastings on a simulated proposal `next` (time t): while
    // the current strategy does not fit, walk towards one that does
    // (accept what fits or lowers the peak memory). On acceptance the
    // chain's state follows; bestPending says the caller must record the
    // strategy as the best (it owns the graph that holds it).
    bool bestPending = false;
    auto decide = [&](Seconds t, const TaskGraph &next, uint64_t n,
                      double elapsed, double u) {
      bool fits = next.fits();
      Bytes peak = peakMemory(next);
      bool accept = curFits
                        ? fits && (t <= cur || u < std::exp(beta * (cur - t)))
                        : fits || peak < curPeak;
      if (!accept)
        return false;
      ++r.accepted;
      cur = t;
      curFits = fits;
      curPeak = peak;
      // Progress towards feasibility counts as improvement.
      if (!fits || cur < r.bestTime) {
        lastImprovement = n;
        lastImprovementAt = elapsed;
      }
      if (fits && cur < r.bestTime) {
        r.bestTime = cur;
        bestPending = true;
      }
      return true;
    };
    // Eq. 1 decided before the simulation where it can be: a proposal
    // (graph `next`, its u drawn) that cannot be accepted on memory is not
    // simulated, and one whose makespan is certain to pass the threshold
    // its u sets (t > cur - ln(u) / beta) is simulated only until that is
    // certain; nullopt then. `simulate(limit)` is a bounded simulation of
    // `next`: a delta resume or, after a structural move, a full one.
    auto simulateUnless = [&](const TaskGraph &next, double u,
                              auto simulate) -> std::optional<Seconds> {
      bool fits = next.fits();
      std::optional<Seconds> t;
      if (!o_.earlyRejection ||
          (curFits ? fits : fits || peakMemory(next) < curPeak)) {
        Seconds limit = std::numeric_limits<Seconds>::infinity();
        if (o_.earlyRejection && curFits && u > 0)
          limit = cur - std::log(u) / beta;
        t = simulate(limit);
      }
      if (!t)
        ++r.rejectedEarly;
      return t;
    };
    for (uint64_t n = 1;; ++n) {
      double elapsed =
          std::chrono::duration<double>(Clock::now() - start).count();
      if (proposalBudget && n > proposalBudget)
        break;
      if (secondsBudget > 0 && elapsed > secondsBudget)
        break;
      if (o_.pastDeadline()) {
        r.timedOut = true;
        break;
      }
      // No improvement for half of the budget: stop (FlexFlow 6.2).
      if (proposalBudget && n - lastImprovement > proposalBudget / 2)
        break;
      if (secondsBudget > 0 && elapsed - lastImprovementAt > secondsBudget / 2)
        break;
      // A pipelined strategy: one proposal in eight moves a stage boundary
      // by one op or doubles or halves the micro-batches, simulated in
      // full (the task graph's shape changes).
      const Strategy &curS = tg->strategy();
      // The structural moves this chain makes: pipeline moves under a
      // pipeline, recomputation and ZeRO switches once it uses them.
      std::optional<Strategy> (Chain::*moves[3])(const Strategy &, Rng &) const;
      size_t numMoves = 0;
      if (curS.pipeline.active())
        moves[numMoves++] = &Chain::pipelineMove;
      if (!curS.recompute.empty())
        moves[numMoves++] = &Chain::recomputeFlip;
      if (!curS.zero.empty())
        moves[numMoves++] = &Chain::zeroFlip;
      if (numMoves && rng.uniform(8) == 0) {
        // A pipeline move, or one op's recomputation or ZeRO stage
        // switched.
        auto move = moves[numMoves == 1 ? 0 : rng.uniform(numMoves)];
        std::optional<Strategy> moved = (this->*move)(curS, rng);
        if (!moved)
          continue;
        ++r.proposals;
        auto nb = TaskGraph::build(ctx, *moved);
        if (!nb) {
          // A move the pipeline's constraints refuse, or whose graph
          // passes taskLimit: not a proposal.
          llvm::consumeError(nb.takeError());
          --r.proposals;
          continue;
        }
        auto ntg = std::make_unique<TaskGraph>(std::move(*nb));
        auto nsim = std::make_unique<Simulator>(*ntg);
        double u = rng.uniformReal();
        std::optional<Seconds> t = simulateUnless(
            *ntg, u, [&](Seconds limit) { return nsim->simulateFull(limit); });
        if (t && decide(*t, *ntg, n, elapsed, u)) {
          tg = std::move(ntg);
          sim = std::move(nsim);
          groups_ = stageDeviceRanges(tg->strategy(), p_.topo.numDevices());
          if (bestPending)
            r.best = tg->strategy();
          bestPending = false;
        }
        continue;
      }
      OpId op = static_cast<OpId>(rng.uniform(g.numOps()));
      // One proposal in eight on an op whose weight gradients can wait for
      // different ops changes only when they run (WeightGradOrder), delta
      // simulated like a configuration.
      std::optional<WeightGradOrder> order;
      if (!g.op(op).sem.weightInputs.empty()) {
        std::vector<WeightGradOrder> orders = tg->weightGradOrders(op);
        if (orders.size() > 1 && rng.uniform(8) == 0) {
          // Another order than the op's (which a plan or a stage move may
          // have left outside the list: Last where it equals Next).
          WeightGradOrder now = tg->strategy().weightGradOrder(op);
          orders.erase(std::remove(orders.begin(), orders.end(), now),
                       orders.end());
          order = orders[rng.uniform(orders.size())];
        }
      }
      OpConfig next;
      bool local = !order && !neighbours_[op].empty() && rng.uniform(4) == 0;
      if (local) {
        OpId nb = neighbours_[op][rng.uniform(neighbours_[op].size())];
        auto a = adaptConfig(tg->strategy().configs[nb], g.op(nb).sem,
                             g.op(op).sem, space_, op);
        if (a)
          next = std::move(*a);
        else
          local = false;
      }
      if (order) {
        next = tg->strategy().configs[op];
      } else if (!local) {
        next = space_.sample(op, rng);
        // A folded chain draws until the configuration keeps the fold.
        for (int tries = 1; folded_.active() && tries < 32 &&
                            !configFolds(next, g.op(op).sem, folded_.block,
                                         folded_.period);
             ++tries)
          next = space_.sample(op, rng);
      }
      // Under a pipeline an op stays on its stage's device group.
      if (tg->strategy().pipeline.active() &&
          !placeInRange(groups_[size_t(tg->strategy().pipeline.stage(op))],
                        next))
        continue;
      const OpConfig &old = tg->strategy().configs[op];
      if (!order && next == old)
        continue;
      ++r.proposals;
      if (auto err = sim->stage(op, next, order)) {
        // A configuration the pipeline refuses (it would divide the
        // micro-batch unevenly): not a proposal.
        llvm::consumeError(std::move(err));
        --r.proposals;
        continue;
      }
      double u = rng.uniformReal();
      std::optional<Seconds> t = simulateUnless(
          *tg, u, [&](Seconds limit) { return sim->resume(limit); });
      if (t && decide(*t, *tg, n, elapsed, u)) {
        if (bestPending)
          r.best = tg->strategy();
        bestPending = false;
      } else if (auto err = sim->undo()) {
        return llvm::Error(std::move(err));
      }
      if (o_.progress && (r.proposals & 255) == 0)
        o_.progress({r.bestTime, r.proposals,
                     r.proposals ? double(r.accepted) / r.proposals : 0,
                     elapsed});
    }
    return r;
  }

private:
  /// One op (among those that save something) recomputed or kept.
  std::optional<Strategy> recomputeFlip(const Strategy &cur, Rng &rng) const {
    Strategy s = cur;
    const Graph &g = p_.graph;
    if (s.recompute.empty())
      s.recompute.assign(g.numOps(), 0);
    for (int tries = 0; tries < 8; ++tries) {
      OpId o = OpId(rng.uniform(g.numOps()));
      if (!savesActivations(g.op(o).sem))
        continue;
      s.recompute[size_t(o)] ^= 1;
      return s;
    }
    return std::nullopt;
  }

  /// One op with a data-parallel group given another ZeRO stage.
  std::optional<Strategy> zeroFlip(const Strategy &cur, Rng &rng) const {
    Strategy s = cur;
    const Graph &g = p_.graph;
    if (s.zero.empty())
      s.zero.assign(g.numOps(), 0);
    for (int tries = 0; tries < 8; ++tries) {
      OpId o = OpId(rng.uniform(g.numOps()));
      if (g.op(o).sem.weightInputs.empty() || !hasDataParallelGroup(g, s, o))
        continue;
      uint8_t &z = s.zero[size_t(o)];
      z = uint8_t((z + 1 + rng.uniform(3)) % 4);
      return s;
    }
    return std::nullopt;
  }

  /// A pipeline move (McmcMoves.h) within the current stages' ranges.
  std::optional<Strategy> pipelineMove(const Strategy &cur, Rng &rng) const {
    return soap::pipelineMove(cur, p_.graph, space_, groups_, rng);
  }

  const SearchProblem &p_;
  const SearchOptions &o_;
  const ConfigSpace &space_;
  std::vector<std::vector<OpId>> neighbours_;
  /// Each stage's device range, derived when the chain's structure (its
  /// stages) changes, not per proposal: an op's proposals stay inside it.
  std::vector<DeviceRange> groups_;
  /// The fold of the chain's graphs (inactive: the full graphs).
  Fold folded_;
};

class McmcSearcher : public Searcher {
public:
  llvm::Expected<SearchResult> search(const SearchProblem &p,
                                      const SearchOptions &o) override {
    if (auto err = o.validate())
      return llvm::Error(std::move(err));
    const Graph &g = p.graph;
    auto began = Clock::now();
    ConfigSpace space(g, p.topo, o.space);
    // Producers and consumers of each op, for the locality proposal.
    std::vector<std::vector<OpId>> neighbours(g.numOps());
    for (const Op &op : g.ops())
      for (ValueId v : op.inputs)
        if (v != kNoValue && g.value(v).producer >= 0) {
          OpId q = g.value(v).producer;
          neighbours[op.id].push_back(q);
          neighbours[q].push_back(op.id);
        }
    Rng root(o.seed, "mcmc");
    // The balanced start is made when its turn comes (on a 13B GPT on
    // 1,024 GPUs it costs a minute of kernel estimates, and a time budget
    // may end first).
    size_t balancedAt = 3;
    std::vector<Strategy> initial = {dataParallel(g, p.topo),
                                     expertStrategy(g, p.topo),
                                     modelParallel(g, p.topo), Strategy()};
    Strategy random;
    for (const Op &op : g.ops())
      random.configs.push_back(space.sample(op.id, root));
    initial.push_back(std::move(random));
    // Pipelined starts: data parallelism inside stages of whole
    // nodes, 4 micro-batches a stage, for the chain's stage and
    // micro-batch moves to refine; and gradient accumulation.
    size_t nodes = std::max<size_t>(1, p.topo.numNodes());
    std::vector<int32_t> stageCounts{1};
    if (nodes > 1)
      stageCounts.push_back(int32_t(nodes));
    for (int32_t stages : stageCounts) {
      auto piped = megatronStrategy(g, p.topo, {1, stages, 0});
      if (piped) {
        // Its shape only: not Megatron-LM's runtime's padded vocabulary.
        piped->vocabPadding = 0;
        initial.push_back(std::move(*piped));
      }
      else
        llvm::consumeError(piped.takeError());
    }
    // Megatron's own starts on a transformer: tensor parallelism over half
    // and over all of a node, sequence parallel, one pipeline stage per
    // node (the most stages up to the nodes that divide the layers), the
    // distributed optimizer, 1F1B over 4 micro-batches a stage (the
    // megatron baseline's shape), each also interleaved with one layer per
    // chunk, for the chain to refine. Placed right after
    // data parallelism, so that a time budget reaches them. Their
    // vocabulary is padded as Megatron-LM pads it (Strategy::vocabPadding,
    // as the megatron baseline's), so the LM head splits over the tensor
    // group at any degree; the chain keeps the padding. megatronStart: per start,
    // whether it is one of these (its memory ladder below).
    std::vector<uint8_t> megatronStart(initial.size(), 0);
    std::vector<OpId> layerStarts = transformerLayerStarts(g);
    if (!layerStarts.empty()) {
      int64_t layers = int64_t(layerStarts.size());
      int32_t perNode = int32_t(p.topo.devicesPerNode());
      int32_t stages = 1;
      while (size_t(stages) * 2 <= nodes && layers % (int64_t(stages) * 2) == 0)
        stages *= 2;
      bool sequence = hasSequence(g);
      size_t at = 1;
      for (int32_t t : {perNode / 2, perNode}) {
        if (t < 2)
          continue;
        auto built =
            megatronStrategy(g, p.topo, MegatronShape{t, stages, 0, sequence});
        if (!built) {
          llvm::consumeError(built.takeError());
          continue;
        }
        Strategy s = std::move(*built);
        MemorySaving{1, MemorySaving::None}.apply(g, s);
        if (llvm::Error err = verifyStrategy(s, g, p.topo)) {
          llvm::consumeError(std::move(err));
          continue;
        }
        spdlog::info("mcmc: Megatron's start: tensor {}{} x pipeline {}, "
                     "{} micro-batches, ZeRO-1",
                     t, sequence ? " (sequence parallel)" : "", stages,
                     s.pipeline.microBatches);
        // And interleaved, as NeMo's large runs are: one layer per model
        // chunk (v = layers / p, the bubble (p - 1) / (v m)).
        std::optional<Strategy> interleaved;
        int64_t v = layers / stages;
        if (stages > 1 && v >= 2) {
          Strategy i =
              megatronInterleaved(g, p.topo, s, t, sequence, int32_t(v));
          MemorySaving{1, MemorySaving::None}.apply(g, i);
          if (llvm::Error err = verifyStrategy(i, g, p.topo))
            llvm::consumeError(std::move(err));
          else
            interleaved = std::move(i);
        }
        megatronStart.insert(megatronStart.begin() + std::ptrdiff_t(at), 1);
        initial.insert(initial.begin() + std::ptrdiff_t(at++), std::move(s));
        ++balancedAt;
        if (interleaved) {
          spdlog::info("mcmc: Megatron's start: tensor {}{} x pipeline {} "
                       "interleaved, {} chunks per stage, {} micro-batches, "
                       "ZeRO-1",
                       t, sequence ? " (sequence parallel)" : "", stages, v,
                       interleaved->pipeline.microBatches);
          megatronStart.insert(megatronStart.begin() + std::ptrdiff_t(at), 1);
          initial.insert(initial.begin() + std::ptrdiff_t(at++),
                         std::move(*interleaved));
          ++balancedAt;
        }
      }
    }
    // Each candidate simulated once. The candidates that fit first, fastest
    // first: past the deadline only the first job runs, and it should start
    // from the best (on a model that data parallelism cannot hold, a
    // pipelined start).
    // A start whose task graph passes taskLimit (a random or balanced
    // strategy on 1,024 GPUs) is skipped: it would not fit in RAM, let
    // alone be a good start.
    std::vector<std::pair<std::pair<bool, Seconds>, size_t>> rank;
    size_t maxTasks = taskLimit(p);
    bool accumulate = false;
    // The starts end at the deadline or when a time budget is spent.
    SearchOptions startOptions = o;
    if (o.budget.seconds > 0)
      startOptions.deadline = std::min(
          o.deadline,
          began + std::chrono::duration_cast<Clock::duration>(
                      std::chrono::duration<double>(o.budget.seconds)));
    for (size_t c = 0; c < initial.size(); ++c) {
      if (c > 0 && startOptions.pastDeadline()) {
        spdlog::info("mcmc: {} of {} starts simulated within the budget", c,
                     initial.size());
        break;
      }
      if (c == balancedAt) {
        // At most a quarter of the time left to the starts' deadline: on a
        // 13B GPT on 1,024 GPUs its kernel estimates take minutes, and a
        // balanced start that took the whole budget left the chains none
        // and the starts after it (random, pipelined, gradient
        // accumulation) unsimulated.
        SearchOptions balancedOptions = startOptions;
        auto now = Clock::now();
        if (startOptions.deadline != Clock::time_point::max() &&
            startOptions.deadline > now)
          balancedOptions.deadline = now + (startOptions.deadline - now) / 4;
        auto balanced = balancedStrategy(p, space, &balancedOptions);
        if (!balanced)
          return balanced.takeError();
        if (!*balanced) {
          spdlog::info("mcmc: the balanced start passed its share of the "
                       "budget; skipped");
          continue;
        }
        initial[c] = std::move(**balanced);
      }
      auto e = evaluate(p, initial[c], maxTasks);
      if (!e) {
        bool tooLarge;
        if (llvm::Error rest = dropTooLarge(e.takeError(), tooLarge))
          return llvm::Error(std::move(rest));
        spdlog::info("mcmc: start {} skipped: its task graph has more than "
                     "{} tasks",
                     c, maxTasks);
        continue;
      }
      auto [time, fits] = *e;
      spdlog::info("mcmc: start {}: {:.3f} ms{}", c, time * 1e3,
                   fits ? "" : ", does not fit");
      rank.push_back({{!fits, time}, c});
      // Data parallelism that does not fit: also start from it with ZeRO
      // and recomputation.
      if (c == 0 && !fits) {
        // Next (before the other starts: under a time budget on a large
        // model these are the ones that may fit), ZeRO-1 (Adam's state
        // sharded), ZeRO-3 (FSDP) alone and with selective and with full
        // recomputation (FSDP with activation checkpointing, which holds
        // GPT-3 175B on 1,024 GPUs), and selective and full recomputation
        // alone.
        using R = MemorySaving::Recompute;
        size_t at = 1;
        for (MemorySaving m :
             {MemorySaving{1, R::None}, MemorySaving{3, R::None},
              MemorySaving{3, R::Selective}, MemorySaving{3, R::Full},
              MemorySaving{0, R::Selective}, MemorySaving{0, R::Full}}) {
          Strategy r = initial[0];
          m.apply(g, r);
          megatronStart.insert(megatronStart.begin() + std::ptrdiff_t(at), 0);
          initial.insert(initial.begin() + std::ptrdiff_t(at++), std::move(r));
          ++balancedAt;
        }
        accumulate = true;
      }
      // One of Megatron's starts that does not fit: next, with selective
      // and then full recomputation (its distributed optimizer kept).
      if (megatronStart[c] && !fits) {
        using R = MemorySaving::Recompute;
        size_t at = c + 1;
        for (R r : {R::Selective, R::Full}) {
          Strategy m = initial[c];
          MemorySaving{1, r, r == R::Selective}.apply(g, m);
          megatronStart.insert(megatronStart.begin() + std::ptrdiff_t(at), 0);
          initial.insert(initial.begin() + std::ptrdiff_t(at++), std::move(m));
          if (balancedAt > c)
            ++balancedAt;
        }
      }
    }
    // Last, gradient accumulation on data parallelism that does not fit:
    // the fewest micro-batches that fit (with ZeRO or recomputation if need
    // be) or the fastest beyond.
    if (accumulate && !startOptions.pastDeadline()) {
      Strategy acc = dataParallel(g, p.topo);
      acc.pipeline.microBatches = 2;
      if (llvm::Error err = verifyPipeline(acc, g)) {
        llvm::consumeError(std::move(err));
      } else {
        uint64_t n = 0;
        auto fit =
            fitMicroBatches(p, acc, memoryLadder(), n, startOptions, true);
        if (!fit)
          return fit.takeError();
        if (*fit) {
          spdlog::info("mcmc: gradient accumulation start: m={}{}: {:.3f} ms",
                       acc.pipeline.microBatches, (*fit)->second.str(),
                       (*fit)->first * 1e3);
          rank.push_back({{false, (*fit)->first}, initial.size()});
          initial.push_back(std::move(acc));
          megatronStart.push_back(0);
        }
      }
    }
    std::stable_sort(rank.begin(), rank.end());
    std::vector<Strategy> ordered;
    for (const auto &r : rank)
      ordered.push_back(std::move(initial[r.second]));
    initial = std::move(ordered);
    // Jobs: every initial candidate x chain, each with its own seed; the
    // result depends on the jobs, not on how threads run them.
    struct Job {
      size_t candidate;
      int chain;
      uint64_t seed;
    };
    std::vector<Job> jobs;
    for (size_t c = 0; c < initial.size(); ++c)
      for (int k = 0; k < o.chains; ++k)
        jobs.push_back({c, k, root.next()});
    uint64_t perJobProposals =
        o.budget.proposals
            ? std::max<uint64_t>(1, o.budget.proposals / jobs.size())
            : 0;
    // A time budget, less what the starts took, is shared by the jobs that
    // run one after another.
    double left = o.budget.seconds -
                  std::chrono::duration<double>(Clock::now() - began).count();
    double perJobSeconds = o.budget.seconds > 0
                               ? std::max(1e-3, left) *
                                     std::min<int>(o.threads, jobs.size()) /
                                     double(jobs.size())
                               : 0;
    std::vector<llvm::Expected<ChainResult>> results;
    for (size_t j = 0; j < jobs.size(); ++j)
      results.emplace_back(ChainResult());
    std::atomic<size_t> nextJob{0};
    auto worker = [&] {
      for (size_t j; (j = nextJob++) < jobs.size();) {
        // Past the deadline only the first job still runs (so there is a
        // best so far); the others are skipped.
        if (j > 0 && o.pastDeadline()) {
          ChainResult skipped;
          skipped.timedOut = true;
          results[j] = std::move(skipped);
          continue;
        }
        Chain chain(p, o, space, neighbours);
        results[j] =
            chain.run(initial[jobs[j].candidate], Rng(jobs[j].seed, "chain"),
                      perJobProposals, perJobSeconds);
      }
    };
    std::vector<std::thread> pool;
    for (int t = 1; t < std::min<int>(o.threads, jobs.size()); ++t)
      pool.emplace_back(worker);
    worker();
    for (std::thread &t : pool)
      t.join();
    SearchResult best;
    best.iterationTime = std::numeric_limits<double>::infinity();
    llvm::Error firstErr = llvm::Error::success();
    for (auto &r : results) {
      if (!r) {
        if (!firstErr)
          firstErr = r.takeError();
        else
          llvm::consumeError(r.takeError());
        continue;
      }
      best.proposals += r->proposals;
      best.accepted += r->accepted;
      best.rejectedEarly += r->rejectedEarly;
      best.timedOut |= r->timedOut;
      if (r->bestTime < best.iterationTime) {
        best.iterationTime = r->bestTime;
        best.strategy = std::move(r->best);
      }
    }
    if (firstErr)
      return llvm::Error(std::move(firstErr));
    if (!std::isfinite(best.iterationTime) && best.timedOut)
      return llvm::make_error<DeadlineExceeded>("mcmc");
    if (!std::isfinite(best.iterationTime))
      return makeError(ExitCode::Infeasible,
                       "{}: mcmc found no strategy that fits in device memory "
                       "({} proposals)",
                       g.sourcePath, best.proposals);
    return best;
  }
};

} // namespace

void registerMcmcSearcher(SearcherRegistry &r) {
  r.add({"mcmc",
         "FlexFlow's MCMC search over the SOAP space with delta simulation",
         [] { return std::make_unique<McmcSearcher>(); },
         /*readsTimeBudget=*/true});
}

} // namespace soap
