// The "kcuts" searcher: SOYBEAN's k-cuts tiling (sections 4-5) on the
// loop-space IR, translated to a Strategy and scored by the simulator like
// every other searcher. See KCuts.h for the cost model.
#include "KCuts.h"

#include "soap/Parallel/BuiltinStrategies.h"
#include "soap/Search/Searcher.h"
#include "soap/Support/Error.h"
#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>
#include <map>
#include <spdlog/spdlog.h>

namespace soap {
namespace kcuts {

namespace {

/// Half `h` of `tile` along `loop`; the whole tile for kReplicate.
Box half(const Box &tile, int loop, int h) {
  Box b = tile;
  if (loop == kReplicate)
    return b;
  int64_t e = (tile.hi[loop] - tile.lo[loop]) / 2;
  if (h == 0)
    b.hi[loop] = b.lo[loop] + e;
  else
    b.lo[loop] = b.lo[loop] + e;
  return b;
}

bool contains(const std::vector<int> &v, int x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

/// Whether choice `a` makes output `j` of `sem` a partial sum.
bool makesPartial(const OpSemantics &sem, int j, int a) {
  return a != kReplicate && contains(sem.reducedLoops(j), a);
}

/// Per-op unary cost of a cut (bytes per group).
double opBytes(const Graph &g, const CutState &s, OpId o, int a,
               const std::vector<Edge> &edges) {
  const Op &op = g.op(o);
  const OpSemantics &sem = op.sem;
  const Box &tile = s.tiles[o];
  double bytes = 0;
  // Weight-gradient sync: both halves hold the overlap of their weight
  // regions and must all-reduce its gradient (reduce-scatter + all-gather:
  // each half receives the overlap once), SOYBEAN 2.2's data-parallel cost.
  Box h0 = half(tile, a, 0), h1 = half(tile, a, 1);
  for (int i : sem.weightInputs) {
    if (!sem.inputs[i].present)
      continue;
    Box r = sem.inputRegion(i, h0).intersect(sem.inputRegion(i, h1));
    bytes += 2.0 * double(r.volume()) *
             double(dtypeBytes(g.value(op.inputs[i]).dtype));
  }
  // A partial-sum output nobody reads (a loss) still has to be reduced.
  for (size_t j = 0; j < sem.outputs.size(); ++j) {
    ValueId v = op.output(j);
    if (v == kNoValue || !sem.outputs[j].present ||
        !makesPartial(sem, int(j), a))
      continue;
    bool read = std::any_of(edges.begin(), edges.end(), [&](const Edge &e) {
      return e.producer == o && e.output == int(j);
    });
    if (!read)
      bytes += 2.0 * double(sem.outputRegion(int(j), tile).volume()) *
               double(dtypeBytes(g.value(v).dtype));
  }
  return bytes;
}

} // namespace

CutState initialState(const Graph &g) {
  CutState s;
  for (const Op &op : g.ops())
    s.tiles.push_back(op.sem.fullTile());
  return s;
}

std::vector<int> choicesOf(const Graph &g, const CutState &s, OpId o,
                           ChoiceSet set) {
  const OpSemantics &sem = g.op(o).sem;
  const Box &tile = s.tiles[o];
  std::vector<int> out;
  for (size_t l = 0; l < sem.loops.size(); ++l) {
    const LoopDim &d = sem.loops[l];
    bool sample = d.cls == DimClass::Sample;
    if (!d.splittable || (set == ChoiceSet::SampleOnly && !sample) ||
        (set == ChoiceSet::NoSample && sample))
      continue;
    int64_t e = tile.hi[l] - tile.lo[l];
    if (e < 2 || e % 2 != 0 || (e / 2) % std::max<int64_t>(1, d.granule) != 0)
      continue;
    out.push_back(int(l));
    if (set == ChoiceSet::SampleOnly)
      break; // data parallelism splits one Sample loop
  }
  if (out.empty())
    out.push_back(kReplicate);
  return out;
}

std::vector<Edge> graphEdges(const Graph &g) {
  std::vector<Edge> edges;
  for (const Op &op : g.ops())
    for (size_t i = 0; i < op.inputs.size(); ++i) {
      ValueId v = op.inputs[i];
      if (v == kNoValue || !op.sem.inputs[i].present)
        continue;
      const Value &val = g.value(v);
      if (val.kind != ValueKind::Activation || val.producer < 0)
        continue;
      edges.push_back({val.producer, val.producerOutput, op.id, int(i), v});
    }
  return edges;
}

double edgeForwardBytes(const Graph &g, const CutState &s, const Edge &e, int a,
                        int b) {
  const OpSemantics &ps = g.op(e.producer).sem;
  const OpSemantics &cs = g.op(e.consumer).sem;
  const Box &pt = s.tiles[e.producer];
  const Box &ct = s.tiles[e.consumer];
  // What the group holds: the producer's output region of the group tile.
  // Bytes the consumer needs outside it were charged at an earlier cut.
  Box held = ps.outputRegion(e.output, pt);
  bool partial = makesPartial(ps, e.output, a);
  int64_t elems = 0;
  for (int h = 0; h < 2; ++h) {
    Box need = cs.inputRegion(e.input, half(ct, b, h)).intersect(held);
    int64_t n = need.volume();
    if (partial) {
      // SOYBEAN's red -> t conversion: the half needs the other half's
      // partial sum of everything it reads.
      elems += n;
    } else {
      Box has = ps.outputRegion(e.output, half(pt, a, h));
      elems += n - need.intersect(has).volume();
    }
  }
  return double(elems) * double(dtypeBytes(g.value(e.value).dtype));
}

CutTables buildTables(const Graph &g, const CutState &s, ChoiceSet set) {
  CutTables t;
  t.edges = graphEdges(g);
  for (const Op &op : g.ops())
    t.choices.push_back(choicesOf(g, s, op.id, set));
  for (const Edge &e : t.edges) {
    const auto &ca = t.choices[e.producer], &cb = t.choices[e.consumer];
    // Backward-data moves the gradient of the same regions the other way
    // (SOYBEAN counts forward and backward tensors alike).
    double passes =
        contains(g.op(e.consumer).sem.gradInputs, e.input) ? 2.0 : 1.0;
    std::vector<double> tab(ca.size() * cb.size());
    for (size_t i = 0; i < ca.size(); ++i)
      for (size_t j = 0; j < cb.size(); ++j)
        tab[i * cb.size() + j] =
            passes * edgeForwardBytes(g, s, e, ca[i], cb[j]);
    t.edgeCost.push_back(std::move(tab));
  }
  for (const Op &op : g.ops()) {
    std::vector<double> tab;
    for (int a : t.choices[op.id])
      tab.push_back(opBytes(g, s, op.id, a, t.edges));
    t.opCost.push_back(std::move(tab));
  }
  return t;
}

double cutCost(const CutTables &t, const std::vector<int> &ci) {
  double c = 0;
  for (size_t o = 0; o < t.opCost.size(); ++o)
    c += t.opCost[o][ci[o]];
  for (size_t e = 0; e < t.edges.size(); ++e) {
    const Edge &ed = t.edges[e];
    c += t.edgeCost[e][size_t(ci[ed.producer]) * t.choices[ed.consumer].size() +
                       ci[ed.consumer]];
  }
  return c;
}

OneCut oneCutDp(const CutTables &t, size_t maxStates,
                const std::function<bool()> &cancelled) {
  size_t n = t.choices.size();
  OneCut r;
  if (n == 0)
    return r;
  // Each op leaves the frontier after its last consumer is decided.
  std::vector<size_t> lastUse(n);
  std::vector<std::vector<size_t>> inEdges(n);
  for (size_t o = 0; o < n; ++o)
    lastUse[o] = o;
  for (size_t e = 0; e < t.edges.size(); ++e) {
    const Edge &ed = t.edges[e];
    lastUse[ed.producer] = std::max(lastUse[ed.producer], size_t(ed.consumer));
    inEdges[ed.consumer].push_back(e);
  }
  struct Entry {
    double cost;
    int32_t parent; ///< index in the previous level
    int choice;     ///< index into t.choices[level op]
  };
  std::vector<std::vector<Entry>> levels;
  std::vector<size_t> frontier; // ops whose choices form the state key
  std::vector<std::vector<int>> keys{{}};
  std::vector<Entry> prev{{0.0, -1, 0}};
  for (size_t o = 0; o < n; ++o) {
    std::vector<size_t> next;
    for (size_t f : frontier)
      if (lastUse[f] > o)
        next.push_back(f);
    if (lastUse[o] > o)
      next.push_back(o);
    // Position of each producer of o in the current key.
    std::vector<std::pair<size_t, size_t>> prodPos; // (edge, key position)
    for (size_t e : inEdges[o]) {
      size_t p = size_t(t.edges[e].producer);
      size_t pos = size_t(std::find(frontier.begin(), frontier.end(), p) -
                          frontier.begin());
      assert(pos < frontier.size() && "a producer left the frontier early");
      prodPos.push_back({e, pos});
    }
    std::map<std::vector<int>, size_t> index;
    std::vector<Entry> cur;
    std::vector<std::vector<int>> curKeys;
    size_t nc = t.choices[o].size();
    for (size_t s = 0; s < prev.size(); ++s) {
      if (cancelled && s % 1024 == 0 && cancelled()) {
        r.cancelled = true;
        return r;
      }
      const std::vector<int> &key = keys[s];
      for (size_t x = 0; x < nc; ++x) {
        double c = prev[s].cost + t.opCost[o][x];
        for (auto [e, pos] : prodPos)
          c += t.edgeCost[e][size_t(key[pos]) * nc + x];
        std::vector<int> nk;
        for (size_t f : next)
          nk.push_back(
              f == o
                  ? int(x)
                  : key[size_t(std::find(frontier.begin(), frontier.end(), f) -
                               frontier.begin())]);
        auto [it, fresh] = index.try_emplace(nk, cur.size());
        if (fresh) {
          cur.push_back({c, int32_t(s), int(x)});
          curKeys.push_back(std::move(nk));
        } else if (c < cur[it->second].cost) {
          cur[it->second] = {c, int32_t(s), int(x)};
        }
      }
    }
    if (cur.size() > maxStates) {
      // Keep the cheapest states (ties by key): no longer exact.
      std::vector<size_t> order(cur.size());
      for (size_t i = 0; i < order.size(); ++i)
        order[i] = i;
      std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        return cur[a].cost != cur[b].cost ? cur[a].cost < cur[b].cost
                                          : curKeys[a] < curKeys[b];
      });
      order.resize(maxStates);
      std::sort(order.begin(), order.end());
      std::vector<Entry> kept;
      std::vector<std::vector<int>> keptKeys;
      for (size_t i : order) {
        kept.push_back(cur[i]);
        keptKeys.push_back(std::move(curKeys[i]));
      }
      cur = std::move(kept);
      curKeys = std::move(keptKeys);
      r.exact = false;
    }
    levels.push_back(cur);
    prev = std::move(cur);
    keys = std::move(curKeys);
    frontier = std::move(next);
  }
  // The last level's frontier is empty: one state (or the cheapest kept).
  size_t best = 0;
  for (size_t s = 1; s < prev.size(); ++s)
    if (prev[s].cost < prev[best].cost)
      best = s;
  r.bytes = prev[best].cost;
  r.choice.assign(n, kReplicate);
  int32_t s = int32_t(best);
  for (size_t o = n; o-- > 0;) {
    const Entry &en = levels[o][size_t(s)];
    r.choice[o] = t.choices[o][size_t(en.choice)];
    s = en.parent;
  }
  return r;
}

OneCut oneCutBruteForce(const CutTables &t) {
  size_t n = t.choices.size();
  std::vector<int> ci(n, 0), bestCi(n, 0);
  double best = std::numeric_limits<double>::infinity();
  for (;;) {
    double c = cutCost(t, ci);
    if (c < best) {
      best = c;
      bestCi = ci;
    }
    size_t o = 0;
    while (o < n && ++ci[o] == int(t.choices[o].size()))
      ci[o++] = 0;
    if (o == n)
      break;
  }
  OneCut r;
  r.bytes = n ? best : 0;
  for (size_t o = 0; o < n; ++o)
    r.choice.push_back(t.choices[o][size_t(bestCi[o])]);
  return r;
}

CutState applyCut(const Graph &g, const CutState &s,
                  const std::vector<int> &choice) {
  CutState next = s;
  for (size_t o = 0; o < g.numOps(); ++o)
    next.tiles[o] = half(s.tiles[o], choice[o], 0);
  return next;
}

KCutsPlan kCuts(const Graph &g, int k, ChoiceSet set,
                const std::function<bool()> &cancelled) {
  KCutsPlan plan;
  CutState s = initialState(g);
  for (int i = 0; i < k; ++i) {
    if (cancelled && cancelled()) {
      plan.cancelled = true;
      return plan;
    }
    CutTables t = buildTables(g, s, set);
    OneCut c = oneCutDp(t, size_t(1) << 16, cancelled);
    if (c.cancelled) {
      plan.cancelled = true;
      return plan;
    }
    plan.exact = plan.exact && c.exact;
    plan.delta.push_back(c.bytes);
    // Theorem 1: cut i runs in 2^i groups at once.
    plan.totalBytes += std::ldexp(c.bytes, i);
    s = applyCut(g, s, c.choice);
    plan.cuts.push_back(std::move(c.choice));
  }
  return plan;
}

Strategy toStrategy(const Graph &g, const KCutsPlan &plan) {
  int k = int(plan.cuts.size());
  Strategy st;
  for (const Op &op : g.ops()) {
    const OpSemantics &sem = op.sem;
    size_t nl = sem.loops.size();
    OpConfig c;
    c.degree.assign(nl, 1);
    int reps = 0;
    std::vector<int> perLoop(nl, 0);
    for (int i = 0; i < k; ++i) {
      int a = plan.cuts[size_t(i)][size_t(op.id)];
      if (a == kReplicate)
        ++reps;
      else
        ++perLoop[size_t(a)];
    }
    for (size_t l = 0; l < nl; ++l)
      c.degree[l] = int32_t(1) << perLoop[l];
    c.replicas = int32_t(1) << reps;
    int64_t tiles = c.numTiles();
    c.devices.resize(size_t(tiles * c.replicas));
    std::vector<int64_t> coord(nl);
    for (int64_t t = 0; t < tiles; ++t) {
      // Mixed radix, the last loop fastest (OpConfig::tile).
      int64_t rest = t;
      for (size_t l = nl; l-- > 0;) {
        coord[l] = rest % c.degree[l];
        rest /= c.degree[l];
      }
      for (int32_t r = 0; r < c.replicas; ++r) {
        // The first cut on a loop picks the top bit of its coordinate.
        std::vector<int> left = perLoop;
        int leftReps = reps;
        DeviceId d = 0;
        for (int i = 0; i < k; ++i) {
          int a = plan.cuts[size_t(i)][size_t(op.id)];
          int64_t bit = a == kReplicate
                            ? (r >> --leftReps) & 1
                            : (coord[size_t(a)] >> --left[size_t(a)]) & 1;
          d |= DeviceId(bit) << (k - 1 - i);
        }
        c.devices[size_t(t * c.replicas + r)] = d;
      }
    }
    st.configs.push_back(std::move(c));
  }
  return st;
}

} // namespace kcuts

namespace {

class KCutsSearcher : public Searcher {
public:
  llvm::Expected<SearchResult> search(const SearchProblem &p,
                                      const SearchOptions &o) override {
    if (auto err = o.validate())
      return llvm::Error(std::move(err));
    const Graph &g = p.graph;
    size_t n = p.topo.numDevices();
    // Device counts that are not powers of two: floor(log2 N) cuts on the
    // first 2^k devices.
    int k = 0;
    while ((size_t(2) << k) <= n)
      ++k;
    if ((size_t(1) << k) != n)
      spdlog::info("kcuts: {} devices is not a power of two; using the "
                   "first {}",
                   n, size_t(1) << k);
    kcuts::KCutsPlan plan = kcuts::kCuts(g, k, kcuts::ChoiceSet::All,
                                         [&o] { return o.pastDeadline(); });
    if (plan.cancelled)
      return llvm::make_error<DeadlineExceeded>("kcuts");
    if (!plan.exact)
      spdlog::info("kcuts: the one-cut DP dropped states; the tiling may "
                   "not be optimal");
    Strategy s = kcuts::toStrategy(g, plan);
    if (auto err = verifyStrategy(s, g, p.topo))
      return llvm::Error(std::move(err));
    auto e = evaluate(p, s);
    if (!e)
      return e.takeError();
    SearchResult r;
    r.proposals = uint64_t(k);
    r.strategy = std::move(s);
    r.iterationTime = e->first;
    if (e->second)
      return r;
    // SOYBEAN minimises communication, not memory: when its tiling does
    // not fit, the same tiling with gradient accumulation, ZeRO and
    // recomputation (fitMicroBatches: micro-batches doubled while nothing
    // fits or they still pay), else data parallelism as it is.
    uint64_t simulated = 0;
    Strategy fitted = r.strategy;
    auto fit = fitMicroBatches(p, fitted, memoryLadder(), simulated, o);
    if (!fit)
      return fit.takeError();
    r.proposals += simulated;
    if (*fit) {
      spdlog::info("kcuts: the k-cuts tiling fits with m={}{}",
                   fitted.pipeline.microBatches, (*fit)->second.str());
      r.strategy = std::move(fitted);
      r.iterationTime = (*fit)->first;
      return r;
    }
    Strategy dp = dataParallel(g, p.topo);
    auto de = evaluate(p, dp);
    if (!de)
      return de.takeError();
    if (!de->second)
      return makeError(ExitCode::Infeasible,
                       "{}: neither the k-cuts tiling (with micro-batches, "
                       "ZeRO and recomputation) nor data parallelism fits in "
                       "device memory",
                       g.sourcePath);
    spdlog::info("kcuts: the k-cuts tiling does not fit in device memory; "
                 "returning data parallelism");
    r.strategy = std::move(dp);
    r.iterationTime = de->first;
    return r;
  }
};

} // namespace

void registerKCutsSearcher(SearcherRegistry &r) {
  r.add({"kcuts",
         "SOYBEAN's k-cuts tiling: log2(N) one-cut DPs minimising bytes "
         "moved, first cut across the slowest links",
         [] { return std::make_unique<KCutsSearcher>(); }});
}

} // namespace soap
