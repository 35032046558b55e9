// TensorOpt Algorithm 2 (Frontier Tracking): eliminations (Eq. 4-7) down to
// the marked linear backbone, the linear DP of Algorithm 3, and unrolling of
// both through the trace arena. Every parallel step computes one slot per
// index and joins traces afterwards in index order, so the result does not
// depend on --threads.
#include "soap/Search/FrontierTracking.h"

#include <algorithm>
#include <cassert>
#include <iterator>
#include <limits>
#include <map>
#include <spdlog/spdlog.h>

namespace soap {

FtCosts assignmentCosts(const FtModel &m, const FtAssignment &a) {
  FtCosts c;
  for (size_t o = 0; o < m.numOps(); ++o) {
    size_t k = size_t(a.config[o]);
    c.compute += m.computeTime(OpId(o), k);
    c.network += m.syncTime(OpId(o), k);
    c.memory += m.memory(OpId(o), k);
  }
  // The backward pass's peak beyond that (the simulator's workspace), as
  // the simulator counts it: at each op's backward its working set, plus
  // what the recomputed ops running again hold. A recomputed chain runs its
  // forwards again at once, at the backward of its last op (the highest
  // that reads it through recomputed ops), and each holds what it saves
  // until its own backward: a chain of every op holds all of them at once.
  const Graph &g = m.graph();
  size_t n = m.numOps();
  auto recomputed = [&](OpId o) {
    return m.configs(o)[size_t(a.config[size_t(o)])].recompute;
  };
  std::vector<OpId> until(n);
  for (size_t o = 0; o < n; ++o)
    until[o] = OpId(o);
  for (size_t u = n; u-- > 0;) {
    if (!recomputed(OpId(u)))
      continue;
    for (ValueId v : g.op(OpId(u)).inputs)
      if (v != kNoValue && g.value(v).producer >= 0 &&
          recomputed(g.value(v).producer))
        until[size_t(g.value(v).producer)] =
            std::max(until[size_t(g.value(v).producer)], until[u]);
  }
  std::vector<double> starts(n + 1, 0); // a difference array over op ids
  for (size_t o = 0; o < n; ++o) {
    double again = m.recomputedBytes(OpId(o), size_t(a.config[o]));
    starts[o] += again;
    starts[size_t(until[o]) + 1] -= again;
  }
  double running = 0;
  for (size_t o = 0; o < n; ++o) {
    running += starts[o];
    c.transient = std::max(c.transient,
                           m.transient(OpId(o), size_t(a.config[o])) + running);
  }
  for (size_t e = 0; e < m.edges().size(); ++e) {
    const FtEdge &ed = m.edges()[e];
    const FtEdgeOption &opt =
        m.edgeOptions(e, size_t(a.config[ed.producer]),
                      size_t(a.config[ed.consumer]))[a.reuse[e]];
    c.network += opt.time;
    c.memory += opt.memory;
  }
  c.time = c.compute + c.network;
  return c;
}

Strategy assignmentStrategy(const FtModel &m, const FtAssignment &a) {
  Strategy s;
  std::vector<uint8_t> recompute, zero;
  for (size_t o = 0; o < m.numOps(); ++o) {
    s.configs.push_back(m.opConfig(OpId(o), size_t(a.config[o])));
    const FtConfig &c = m.configs(OpId(o))[size_t(a.config[o])];
    recompute.push_back(c.recompute);
    zero.push_back(c.zero);
  }
  s.pipeline.microBatches = m.microBatches();
  // Empty when nothing is recomputed or sharded, as other strategies.
  auto any = [](const std::vector<uint8_t> &v) {
    return std::any_of(v.begin(), v.end(), [](uint8_t x) { return x != 0; });
  };
  if (any(recompute))
    s.recompute = std::move(recompute);
  if (any(zero))
    s.zero = std::move(zero);
  return s;
}

namespace {

using Cands = std::vector<FrontierCandidate>;
using Products = std::vector<ProductSpec>;

class Tracker {
public:
  Tracker(const FtModel &m, const FtOptions &o)
      : m_(m), o_(o), pool_(o.threads) {}

  FtResult run();

private:
  struct Node {
    bool alive = true, marked = false;
    int topo = 0;
    std::vector<Frontier> f;   ///< per (joint) configuration
    std::map<int, size_t> adj; ///< neighbour -> edge
  };
  struct Edge {
    int u = 0, v = 0; ///< u < v
    bool alive = true;
    std::vector<Frontier> f; ///< [ku * K(v) + kv]
  };

  size_t K(int n) const { return nodes_[size_t(n)].f.size(); }
  const Frontier &edgeF(size_t e, int x, size_t kx, size_t ky) const {
    const Edge &ed = edges_[e];
    return ed.u == x ? ed.f[kx * K(ed.v) + ky] : ed.f[ky * K(ed.v) + kx];
  }
  /// Slots filled in parallel, reduced, then materialised in index order.
  std::vector<Frontier>
  compute(size_t n, const std::function<void(size_t, Products &)> &gen);
  void note(const std::vector<Frontier> &fs) {
    for (const Frontier &f : fs)
      stats_.maxFrontier = std::max(stats_.maxFrontier, f.size());
  }
  void removeEdge(size_t e) {
    Edge &ed = edges_[e];
    ed.alive = false;
    nodes_[size_t(ed.u)].adj.erase(ed.v);
    nodes_[size_t(ed.v)].adj.erase(ed.u);
    ed.f.clear();
    ed.f.shrink_to_fit();
  }
  /// Adds an edge between a and b with `f` laid out [ka * K(b) + kb]; a
  /// parallel edge is merged into it (edge elimination, Eq. 5).
  void addEdge(int a, int b, std::vector<Frontier> f);
  void killNode(int i) {
    Node &n = nodes_[size_t(i)];
    n.alive = false;
    n.f.clear();
    n.f.shrink_to_fit();
  }

  void eliminateIsolated(int i);
  void eliminateLeaf(int i);
  void eliminateNode(int i);
  void mergeBranch(int i, int h);
  void eliminateHeuristic(int i);
  std::vector<int> markBackbone(std::vector<int> chain);
  Frontier linearDp(const std::vector<int> &chain);

  const FtModel &m_;
  const FtOptions &o_;
  ThreadPool pool_;
  TraceArena arena_;
  std::vector<Node> nodes_;
  std::vector<Edge> edges_;
  Frontier constant_{FrontierPoint{}};
  FtStats stats_;
};

std::vector<Frontier>
Tracker::compute(size_t n, const std::function<void(size_t, Products &)> &gen) {
  std::vector<Cands> slots(n);
  pool_.parallelFor(n, [&](size_t i) {
    if (o_.isCancelled())
      return; // run() notices and returns nothing
    Products c;
    gen(i, c);
    slots[i] = reduceProducts(c, o_.resolution);
  });
  std::vector<Frontier> out(n);
  for (size_t i = 0; i < n; ++i)
    out[i] = arena_.materialize(slots[i]);
  note(out);
  return out;
}

void Tracker::addEdge(int a, int b, std::vector<Frontier> f) {
  if (a > b) {
    // Transpose to the [ku * K(v) + kv] layout with u < v.
    std::vector<Frontier> t(f.size());
    size_t ka = K(a), kb = K(b);
    for (size_t x = 0; x < ka; ++x)
      for (size_t y = 0; y < kb; ++y)
        t[y * ka + x] = std::move(f[x * kb + y]);
    f = std::move(t);
    std::swap(a, b);
  }
  auto it = nodes_[size_t(a)].adj.find(b);
  if (it == nodes_[size_t(a)].adj.end()) {
    edges_.push_back({a, b, true, std::move(f)});
    nodes_[size_t(a)].adj[b] = edges_.size() - 1;
    nodes_[size_t(b)].adj[a] = edges_.size() - 1;
    return;
  }
  // Edge elimination (Eq. 5): the product of the parallel edges.
  Edge &old = edges_[it->second];
  std::vector<Frontier> merged = compute(f.size(), [&](size_t i, Products &c) {
    c.push_back({&old.f[i], &f[i], nullptr});
  });
  old.f = std::move(merged);
  ++stats_.edgeEliminations;
}

void Tracker::eliminateIsolated(int i) {
  Cands c;
  for (const Frontier &f : nodes_[size_t(i)].f)
    appendProduct(c, constant_, f);
  constant_ = arena_.materialize(reduceCandidates(std::move(c), o_.resolution));
  killNode(i);
}

/// A node with one neighbour: Eq. 6 where the union over its configurations
/// loses nothing, since no other edge depends on them.
void Tracker::eliminateLeaf(int i) {
  Node &ni = nodes_[size_t(i)];
  int h = ni.adj.begin()->first; // no bindings: the lambda captures them
  size_t e = ni.adj.begin()->second;
  std::vector<Frontier> nf = compute(K(h), [&](size_t kh, Products &c) {
    for (size_t ki = 0; ki < K(i); ++ki)
      c.push_back({&nodes_[size_t(h)].f[kh], &ni.f[ki], &edgeF(e, i, ki, kh)});
  });
  nodes_[size_t(h)].f = std::move(nf);
  removeEdge(e);
  killNode(i);
  ++stats_.branchEliminations;
}

/// Node elimination (Eq. 4): e_hi, o_i, e_ij become one edge e_hj.
void Tracker::eliminateNode(int i) {
  Node &ni = nodes_[size_t(i)];
  auto it = ni.adj.begin();
  int h = it->first; // no bindings: the lambda captures them
  auto eh = it->second;
  ++it;
  int j = it->first;
  auto ej = it->second;
  size_t kh = K(h), kj = K(j);
  std::vector<Frontier> f = compute(kh * kj, [&](size_t x, Products &c) {
    size_t a = x / kj, b = x % kj;
    for (size_t ki = 0; ki < K(i); ++ki)
      c.push_back({&edgeF(eh, h, a, ki), &ni.f[ki], &edgeF(ej, i, ki, b)});
  });
  removeEdge(eh);
  removeEdge(ej);
  killNode(i);
  ++stats_.nodeEliminations;
  addEdge(h, j, std::move(f));
}

/// Branch elimination (Eq. 6): o_i merges into o_h, whose configurations
/// become the pairs (s_h, s_i).
void Tracker::mergeBranch(int i, int h) {
  size_t kh = K(h), ki = K(i);
  size_t eih = nodes_[size_t(i)].adj.at(h);
  std::vector<Frontier> nf = compute(kh * ki, [&](size_t x, Products &c) {
    size_t a = x / ki, b = x % ki;
    c.push_back({&nodes_[size_t(h)].f[a], &nodes_[size_t(i)].f[b],
                 &edgeF(eih, h, a, b)});
  });
  removeEdge(eih);
  // Re-key h's and i's other edges by the joint configuration.
  std::vector<std::pair<int, std::vector<Frontier>>> moved;
  for (int src : {h, i}) {
    std::vector<std::pair<int, size_t>> adj(nodes_[size_t(src)].adj.begin(),
                                            nodes_[size_t(src)].adj.end());
    for (auto [g, e] : adj) {
      size_t kg = K(g);
      std::vector<Frontier> f(kh * ki * kg);
      for (size_t a = 0; a < kh; ++a)
        for (size_t b = 0; b < ki; ++b)
          for (size_t y = 0; y < kg; ++y)
            f[(a * ki + b) * kg + y] = edgeF(e, src, src == h ? a : b, y);
      removeEdge(e);
      moved.push_back({g, std::move(f)});
    }
  }
  Node &nh = nodes_[size_t(h)];
  nh.f = std::move(nf);
  nh.topo = std::min(nh.topo, nodes_[size_t(i)].topo);
  killNode(i);
  ++stats_.branchEliminations;
  for (auto &[g, f] : moved)
    addEdge(h, g, std::move(f));
}

/// Heuristic elimination (Eq. 7): fix o_i's configuration (least memory,
/// then least time) and fold its out-going edges into its neighbours.
void Tracker::eliminateHeuristic(int i) {
  Node &ni = nodes_[size_t(i)];
  size_t best = 0;
  for (size_t k = 1; k < ni.f.size(); ++k) {
    const FrontierPoint &x = ni.f[k].front(), &y = ni.f[best].front();
    if (x.memory < y.memory || (x.memory == y.memory && x.time < y.time))
      best = k;
  }
  Cands c;
  appendProduct(c, constant_, ni.f[best]);
  constant_ = arena_.materialize(reduceCandidates(std::move(c), o_.resolution));
  std::vector<std::pair<int, size_t>> adj(ni.adj.begin(), ni.adj.end());
  for (const auto &je : adj) {
    int j = je.first; // no bindings: the lambda captures them
    size_t e = je.second;
    std::vector<Frontier> nf = compute(K(j), [&](size_t kj, Products &cc) {
      cc.push_back({&nodes_[size_t(j)].f[kj], &edgeF(e, i, best, kj), nullptr});
    });
    nodes_[size_t(j)].f = std::move(nf);
    removeEdge(e);
  }
  killNode(i);
  ++stats_.heuristicEliminations;
}

/// Algorithm 2, line 5: extend the backbone while its last node has exactly
/// one unmarked neighbour, and that neighbour touches no other marked node.
std::vector<int> Tracker::markBackbone(std::vector<int> chain) {
  if (!o_.useLdp)
    return chain;
  for (;;) {
    const Node &last = nodes_[size_t(chain.back())];
    int next = -1, count = 0;
    for (auto [n, e] : last.adj)
      if (!nodes_[size_t(n)].marked) {
        next = n;
        ++count;
      }
    if (count != 1)
      return chain;
    for (auto [n, e] : nodes_[size_t(next)].adj)
      if (nodes_[size_t(n)].marked && n != chain.back())
        return chain;
    nodes_[size_t(next)].marked = true;
    chain.push_back(next);
  }
}

/// Algorithm 3 over the backbone, then the union at its last node.
Frontier Tracker::linearDp(const std::vector<int> &chain) {
  std::vector<Frontier> cf = nodes_[size_t(chain[0])].f;
  for (size_t t = 1; t < chain.size(); ++t) {
    int prev = chain[t - 1], cur = chain[t];
    auto it = nodes_[size_t(cur)].adj.find(prev);
    const Node &nc = nodes_[size_t(cur)];
    static const Frontier unit{FrontierPoint{}};
    cf = compute(K(cur), [&](size_t p, Products &c) {
      for (size_t k = 0; k < cf.size(); ++k)
        c.push_back(
            {it == nc.adj.end() ? &unit : &edgeF(it->second, prev, k, p),
             &cf[k], &nc.f[p]});
    });
  }
  Cands c;
  for (const Frontier &f : cf)
    appendProduct(c, f, constant_);
  return arena_.materialize(reduceCandidates(std::move(c), o_.resolution));
}

FtResult Tracker::run() {
  size_t n = m_.numOps();
  FtResult res;
  if (n == 0)
    return res;
  // Initialisation: one tuple per configuration and per edge option.
  nodes_.resize(n);
  for (size_t o = 0; o < n; ++o) {
    Node &nd = nodes_[o];
    nd.topo = int(o);
    size_t k = m_.configs(OpId(o)).size();
    stats_.totalConfigs += k;
    for (size_t c = 0; c < k; ++c)
      nd.f.push_back(
          {{m_.computeTime(OpId(o), c) + m_.syncTime(OpId(o), c),
            m_.memory(OpId(o), c),
            arena_.leaf(TraceLeaf::OpConfig, int32_t(o), int32_t(c))}});
  }
  for (size_t e = 0; e < m_.edges().size(); ++e) {
    const FtEdge &ed = m_.edges()[e];
    size_t ka = K(ed.producer), kb = K(ed.consumer);
    TraceId leaves[3] = {kNoTrace,
                         arena_.leaf(TraceLeaf::EdgeReuse, int32_t(e), 1),
                         arena_.leaf(TraceLeaf::EdgeReuse, int32_t(e), 2)};
    std::vector<Frontier> f(ka * kb);
    for (size_t x = 0; x < ka * kb; ++x) {
      const auto &opts = m_.edgeOptions(e, x / kb, x % kb);
      Cands c;
      for (size_t r = 0; r < opts.size(); ++r) {
        FrontierCandidate k;
        k.time = opts[r].time;
        k.memory = opts[r].memory;
        k.parts[0] = leaves[r];
        c.push_back(k);
      }
      f[x] = arena_.materialize(reduceCandidates(std::move(c), o_.resolution));
    }
    addEdge(ed.producer, ed.consumer, std::move(f));
  }

  // Elimination (Algorithm 2, lines 4-11).
  nodes_[0].marked = true;
  std::vector<int> chain{0};
  for (;;) {
    if (o_.isCancelled()) {
      res.cancelled = true;
      return res;
    }
    chain = markBackbone(std::move(chain));
    int pick = -1;
    bool anyUnmarked = false;
    for (size_t i = 0; i < n; ++i) {
      const Node &nd = nodes_[i];
      if (!nd.alive || nd.marked)
        continue;
      anyUnmarked = true;
      if (nd.adj.size() <= 2 &&
          (pick < 0 || nd.topo < nodes_[size_t(pick)].topo))
        pick = int(i);
    }
    if (!anyUnmarked)
      break;
    if (pick >= 0) {
      size_t deg = nodes_[size_t(pick)].adj.size();
      spdlog::debug(
          "ft: eliminate {} (degree {}, K {}), chain {}, max frontier {}", pick,
          deg, K(pick), chain.size(), stats_.maxFrontier);
      if (deg == 0)
        eliminateIsolated(pick);
      else if (deg == 1)
        eliminateLeaf(pick);
      else
        eliminateNode(pick);
      continue;
    }
    // Branch elimination: the cheapest merge of an unmarked node into a
    // neighbour within the cap.
    int bi = -1, bh = -1;
    size_t bsize = 0;
    for (size_t i = 0; i < n; ++i) {
      const Node &nd = nodes_[i];
      if (!nd.alive || nd.marked)
        continue;
      for (auto [h, e] : nd.adj) {
        size_t sz = K(int(i)) * K(h);
        if (sz <= o_.maxMergedConfigs && (bi < 0 || sz < bsize)) {
          bi = int(i);
          bh = h;
          bsize = sz;
        }
      }
    }
    if (bi >= 0) {
      spdlog::debug("ft: merge {} into {} ({} configurations)", bi, bh, bsize);
      mergeBranch(bi, bh);
      continue;
    }
    // Heuristic elimination: the unmarked node with the most neighbours.
    int hi = -1;
    for (size_t i = 0; i < n; ++i) {
      const Node &nd = nodes_[i];
      if (nd.alive && !nd.marked &&
          (hi < 0 || nd.adj.size() > nodes_[size_t(hi)].adj.size()))
        hi = int(i);
    }
    eliminateHeuristic(hi);
  }
  stats_.backbone = chain.size();
  Frontier out = linearDp(chain);
  if (o_.isCancelled()) {
    res.cancelled = true;
    return res;
  }
  stats_.maxFrontier = std::max(stats_.maxFrontier, out.size());
  stats_.traceEntries = arena_.size();

  // Unroll the DP and the eliminations.
  for (const FrontierPoint &pt : out) {
    FtPoint p;
    p.assignment.config.assign(n, -1);
    p.assignment.reuse.assign(m_.edges().size(), 0);
    arena_.unroll(pt.trace, [&](TraceLeaf kind, int32_t id, int32_t choice) {
      if (kind == TraceLeaf::OpConfig) {
        assert(p.assignment.config[size_t(id)] < 0 && "op decided twice");
        p.assignment.config[size_t(id)] = choice;
      } else {
        p.assignment.reuse[size_t(id)] = uint8_t(choice);
      }
    });
    assert(std::none_of(p.assignment.config.begin(), p.assignment.config.end(),
                        [](int32_t c) { return c < 0; }) &&
           "an op left undecided");
    p.costs = assignmentCosts(m_, p.assignment);
    res.points.push_back(std::move(p));
  }
  res.stats = stats_;
  return res;
}

} // namespace

FtResult frontierTracking(const FtModel &m, const FtOptions &o) {
  Tracker t(m, o);
  return t.run();
}

} // namespace soap
