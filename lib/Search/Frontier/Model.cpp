// FT initialisation (TensorOpt section 3.2, "Initialization"): the
// configurations of every op with their Eq. 1 costs, and every edge's Eq. 2
// re-scheduling time as the cheapest sequence of collectives between two
// splits of the tensor (TensorOpt 4.2, a shortest path over the collective
// model), with the three tensor-reuse options of 4.2.
#include "Splits.h"
#include "soap/Search/FrontierTracking.h"

#include "soap/Support/Error.h"
#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <queue>
#include <unordered_map>

namespace soap {

namespace {

bool indexes(const TensorMap &m, int loop) {
  for (const DimMap &d : m.dims)
    if (!d.full)
      for (const IndexTerm &t : d.terms)
        if (t.loop == loop && t.coeff != 0)
          return true;
  return false;
}

/// The tensor dim of `m` that `loop` indexes, or -1.
int dimOf(const TensorMap &m, int loop) {
  for (size_t d = 0; d < m.dims.size(); ++d)
    if (!m.dims[d].full)
      for (const IndexTerm &t : m.dims[d].terms)
        if (t.loop == loop && t.coeff != 0)
          return int(d);
  return -1;
}

int log2Of(int64_t x) {
  int q = 0;
  while ((int64_t(1) << q) < x)
    ++q;
  return q;
}

} // namespace

/// Builds an FtModel; the shortest-path cache lives here while building and
/// in the model for reschedule() afterwards.
struct FtModelBuilder : FtPaths {
  FtModelBuilder(const SearchProblem &p, FtModel &m, int bits)
      : FtPaths(p, m, bits) {}

  std::vector<FtConfig> enumerate(const OpSemantics &sem) const {
    std::vector<std::vector<int>> qs(sem.loops.size()); // allowed log2s
    for (size_t l = 0; l < sem.loops.size(); ++l) {
      const LoopDim &d = sem.loops[l];
      if (!d.splittable)
        continue;
      for (int q = 1; q <= bits; ++q) {
        int64_t deg = int64_t(1) << q;
        if (d.size % deg == 0 &&
            (d.size / deg) % std::max<int64_t>(1, d.granule) == 0)
          qs[l].push_back(q);
      }
    }
    std::vector<FtConfig> out;
    if (m.nodeMesh_ > 0)
      nodeMesh(sem, qs, bits, out);
    else
      oneMesh(sem, qs, bits, out);
    // Recomputed variants after all kept ones, in the same order.
    if (m.recompute_ && savesActivations(sem)) {
      size_t kept = out.size();
      for (size_t k = 0; k < kept; ++k) {
        out.push_back(out[k]);
        out.back().recompute = true;
      }
    }
    return out;
  }

  /// At most maxSplitLoops loops split, the rest of the devices replicas.
  void oneMesh(const OpSemantics &sem, const std::vector<std::vector<int>> &qs,
               int bits, std::vector<FtConfig> &out) const {
    FtConfig c;
    c.degree.assign(sem.loops.size(), 1);
    // Depth-first over loops in order, so configs come in a fixed order.
    std::function<void(size_t, int, int)> rec = [&](size_t l, int used,
                                                    int split) {
      if (l == sem.loops.size()) {
        c.replicas = int32_t(1) << (bits - used);
        if (microBatchesDivide(sem, c.degree, m.microBatches_))
          out.push_back(c);
        return;
      }
      rec(l + 1, used, split);
      if (split >= m.maxSplitLoops_)
        return;
      for (int q : qs[l]) {
        if (used + q > bits)
          break;
        c.degree[l] = int32_t(1) << q;
        rec(l + 1, used + q, split + 1);
        c.degree[l] = 1;
      }
    };
    rec(0, 0, 0);
  }

  /// FtOptions::nodeMesh: no other loop split, or one loop (not the sample
  /// loop) split 2 .. nodeMesh ways in loop order; the sample loop then
  /// takes the largest degree of the devices left that it allows and that
  /// leaves each micro-batch whole samples, the rest are replicas.
  void nodeMesh(const OpSemantics &sem, const std::vector<std::vector<int>> &qs,
                int bits, std::vector<FtConfig> &out) const {
    int sl = sampleLoop(sem);
    FtConfig c;
    c.degree.assign(sem.loops.size(), 1);
    // The sample loop over the largest share of `rest` (log2) devices that
    // leaves every micro-batch whole samples; the rest replicas.
    auto add = [&](int rest) {
      std::vector<int> cands{0};
      if (sl >= 0)
        for (int q : qs[size_t(sl)])
          if (q <= rest)
            cands.push_back(q);
      for (size_t i = cands.size(); i-- > 0;) {
        if (sl >= 0)
          c.degree[size_t(sl)] = int32_t(1) << cands[i];
        c.replicas = int32_t(1) << (rest - cands[i]);
        bool ok = microBatchesDivide(sem, c.degree, m.microBatches_);
        if (ok)
          out.push_back(c);
        if (sl >= 0)
          c.degree[size_t(sl)] = 1;
        if (ok)
          break;
      }
    };
    add(bits);
    int most = log2Of(m.nodeMesh_);
    for (size_t l = 0; l < sem.loops.size(); ++l) {
      if (int(l) == sl)
        continue;
      for (int q : qs[l]) {
        if (q > most)
          break;
        c.degree[l] = int32_t(1) << q;
        add(bits - q);
        c.degree[l] = 1;
      }
    }
  }

  /// log2 of a config's degree per loop.
  static std::vector<int> loopBits(const FtConfig &c) {
    std::vector<int> b;
    for (int32_t d : c.degree)
      b.push_back(log2Of(d));
    return b;
  }

  /// The split of a tensor indexed by `tm` under config `c`: each split
  /// loop's bits on the dim it indexes, or, where it indexes none, in slot r
  /// (a partial sum, with `partialSums`) or r + 1 (a replica); true
  /// replicas in slot r + 1.
  Split splitOf(const TensorMap &tm, const FtConfig &c,
                bool partialSums) const {
    size_t r = tm.dims.size();
    size_t unindexed = partialSums ? r : r + 1;
    Split s(r + 2, 0);
    std::vector<int> b = loopBits(c);
    for (size_t l = 0; l < b.size(); ++l) {
      if (!b[l])
        continue;
      int d = dimOf(tm, int(l));
      size_t slot = d >= 0 ? size_t(d) : unindexed;
      s[slot] = uint8_t(s[slot] + b[l]);
    }
    s[r + 1] = uint8_t(s[r + 1] + log2Of(c.replicas));
    return s;
  }

  /// The split a producer's output `j` has under config `c` (a loop that
  /// does not index it leaves partial sums).
  Split outputSplit(const OpSemantics &sem, int j, const FtConfig &c) const {
    return splitOf(sem.outputs[j], c, true);
  }

  /// The split input `i` is needed in under `c`; with `gradient`, the split
  /// its gradient comes out in (loops that do not index the input make it a
  /// partial sum, true replicas stay replicas).
  Split inputSplit(const OpSemantics &sem, int i, const FtConfig &c,
                   bool gradient) const {
    return splitOf(sem.inputs[i], c, gradient);
  }

  /// Devices that differ from device 0 only in `loops` (and replicas when
  /// `withReplicas`): the group that reduces together.
  std::vector<DeviceId> groupOf(const FtConfig &c,
                                const std::vector<bool> &loops,
                                bool withReplicas) const {
    std::vector<DeviceId> g;
    size_t nl = c.degree.size();
    for (size_t dev = 0; dev < m.devices_; ++dev) {
      int64_t t = int64_t(dev) / c.replicas;
      int64_t rep = int64_t(dev) % c.replicas;
      if (rep != 0 && !withReplicas)
        continue;
      bool ok = true;
      for (size_t l = nl; l-- > 0;) {
        int64_t coord = t % c.degree[l];
        t /= c.degree[l];
        if (coord != 0 && !loops[l])
          ok = false;
      }
      if (ok)
        g.push_back(DeviceId(dev));
    }
    return g;
  }

  /// The devices that hold the same shard of weight input `wi` as device 0
  /// under `c` (its data-parallel group).
  std::vector<DeviceId> weightGroup(const OpSemantics &sem, int wi,
                                    const FtConfig &c) const {
    std::vector<bool> loops(c.degree.size());
    for (size_t l = 0; l < loops.size(); ++l)
      loops[l] = !indexes(sem.inputs[wi], int(l));
    return groupOf(c, loops, true);
  }

  /// FtOptions::zero: ZeRO stages 1-3 of each configuration whose weights
  /// (none shared with another op) are replicated, after all the others.
  void addZeroVariants(const Op &op, std::vector<FtConfig> &cs) const {
    if (!m.zero_ || op.sem.weightInputs.empty())
      return;
    for (int wi : op.sem.weightInputs)
      if (op.input(size_t(wi)) != kNoValue && shared(op.inputs[size_t(wi)]))
        return;
    std::vector<size_t> replicated;
    for (size_t k = 0; k < cs.size(); ++k)
      for (int wi : op.sem.weightInputs)
        if (op.sem.inputs[wi].present && op.input(size_t(wi)) != kNoValue &&
            weightGroup(op.sem, wi, cs[k]).size() > 1) {
          replicated.push_back(k);
          break;
        }
    for (uint8_t z = 1; z <= 3; ++z)
      for (size_t k : replicated) {
        cs.push_back(cs[k]);
        cs.back().zero = z;
      }
  }

  /// A weight more than one op reads (tied embeddings, unrolled RNN steps).
  bool shared(ValueId w) const {
    const Value &v = p.graph.value(w);
    return v.kind == ValueKind::Weight && !v.users.empty() &&
           v.users.front() != v.users.back();
  }

  /// The distinct users of shared weight `w` in topological order.
  std::vector<OpId> usersOf(ValueId w) const {
    std::vector<OpId> u = p.graph.value(w).users;
    u.erase(std::unique(u.begin(), u.end()), u.end());
    return u;
  }

  /// Weight edge `e`: what the simulator does with a shared weight when its
  /// two users take configs `a` and `b`. Shards (box, device) of equal or
  /// overlapping boxes join one group that all-reduces its largest shard
  /// over every holder; charged are device 0's groups beyond what `window`
  /// (the backward before the earlier user) hides, and device 0's distinct
  /// shards as weight, gradient and optimizer state.
  FtEdgeOption weightPair(const FtEdge &ed, size_t a, size_t b, Seconds window,
                          double share) const {
    const Graph &g = p.graph;
    const Value &wv = g.value(ed.value);
    Bytes eb = dtypeBytes(wv.dtype);
    struct Shard {
      Box box;
      DeviceId device;
    };
    std::vector<Shard> shards;
    for (auto [o, k] : {std::pair<OpId, size_t>{ed.producer, a},
                        std::pair<OpId, size_t>{ed.consumer, b}}) {
      const Op &op = g.op(o);
      OpConfig c = m.opConfig(o, k);
      for (size_t i = 0; i < op.inputs.size(); ++i) {
        if (op.inputs[i] != ed.value)
          continue;
        for (int64_t t = 0; t < c.numTiles(); ++t) {
          Box bx = op.sem.inputRegion(int(i), c.tile(op.sem, t));
          for (int32_t r = 0; r < c.replicas; ++r)
            shards.push_back({bx, c.device(t, r)});
        }
      }
    }
    std::vector<Box> boxes;
    for (const Shard &sh : shards)
      boxes.push_back(sh.box);
    std::vector<size_t> groupOf = overlapGroups(boxes);
    std::map<size_t, std::pair<std::vector<DeviceId>, Bytes>> groups;
    std::vector<Box> mine;
    for (size_t i = 0; i < shards.size(); ++i) {
      auto &gr = groups[groupOf[i]];
      gr.first.push_back(shards[i].device);
      gr.second = std::max(gr.second, shards[i].box.volume() * eb);
      if (shards[i].device == 0 &&
          std::find(mine.begin(), mine.end(), shards[i].box) == mine.end())
        mine.push_back(shards[i].box);
    }
    Seconds sync = 0;
    for (auto &gr : groups) {
      std::vector<DeviceId> &devs = gr.second.first;
      std::sort(devs.begin(), devs.end());
      devs.erase(std::unique(devs.begin(), devs.end()), devs.end());
      if (devs.size() > 1 && devs.front() == 0)
        sync += collectiveOn(Collective::AllReduce, devs, gr.second.second);
    }
    double mem = 0;
    double perElement = double(totalWeightBytes(wv, p.optimizer));
    for (const Box &bx : mine)
      mem += double(bx.volume()) * perElement;
    return {share * std::max(0.0, sync - window), share * mem};
  }

  std::vector<std::vector<Seconds>> bwd, wsync;
  llvm::Error opCosts(OpId o) {
    const Graph &g = p.graph;
    const Op &op = g.op(o);
    const OpSemantics &sem = op.sem;
    const auto &cs = m.configs_[o];
    for (size_t k = 0; k < cs.size(); ++k) {
      const FtConfig &c = cs[k];
      OpConfig oc = m.opConfig(o, k);
      Box tile = oc.tile(sem, 0);
      // One micro-batch's tile: its kernels run m times, its activations
      // are what one micro-batch holds; the weights are the whole tile's.
      const int32_t mb = m.microBatches_;
      Box mbTile = microBatchTile(oc, sem, 0, 0, mb);
      auto kt = p.cost.kernel(g, op, mbTile);
      if (!kt)
        return kt.takeError();
      m.compute_[o][k] = mb * (kt->forward + kt->backward());
      bwd[o][k] = mb * kt->backward();
      TileMemory tm = p.cost.memory(g, op, tile, p.optimizer);
      Bytes saved = p.cost.memory(g, op, mbTile, p.optimizer).saved;
      m.memory_[o][k] =
          double(tm.weights + tm.gradients + tm.optimizer + saved);
      // While its backward runs (as the simulator counts it): the kernel's
      // workspace, the output gradients it reads and the input gradients it
      // writes.
      double during =
          double(p.cost.memory(g, op, mbTile, p.optimizer).workspace);
      for (size_t j = 0; j < op.outputs.size(); ++j)
        if (op.outputs[j] != kNoValue && isFloating(g.value(op.outputs[j]).dtype))
          during += double(sem.outputRegion(int(j), mbTile).volume()) *
                    double(dtypeBytes(g.value(op.outputs[j]).dtype));
      for (int i : sem.gradInputs) {
        ValueId v = op.inputs[size_t(i)];
        if (v == kNoValue || !isFloating(g.value(v).dtype) ||
            g.value(v).kind != ValueKind::Activation)
          continue;
        during += double(sem.inputRegion(i, sem.ringBlock(i, mbTile)).volume()) *
                  double(dtypeBytes(g.value(v).dtype));
      }
      m.transient_[o][k] = during;
      m.again_[o][k] = c.recompute ? double(saved) : 0;
      if (c.recompute) {
        // Its forward again in backward; nothing saved, but the graph
        // inputs it reads are held (kept producers' outputs: edgeCosts).
        m.compute_[o][k] += mb * kt->forward;
        m.memory_[o][k] -= double(saved);
        for (size_t i = 0; i < op.inputs.size(); ++i) {
          ValueId v = op.inputs[i];
          if (v != kNoValue && sem.inputs[i].present &&
              g.value(v).isActivationLike() && g.value(v).producer < 0)
            m.memory_[o][k] +=
                double(sem.inputRegion(int(i), mbTile).volume()) *
                double(dtypeBytes(g.value(v).dtype));
        }
      }
      Seconds sync = 0;
      // Weight-gradient all-reduce among the tiles holding the same shard.
      for (int wi : sem.weightInputs) {
        if (!sem.inputs[wi].present || op.input(size_t(wi)) == kNoValue)
          continue;
        if (shared(op.inputs[size_t(wi)])) {
          // Its all-reduce and memory are on the weight edges.
          m.memory_[o][k] -= double(sem.inputRegion(wi, tile).volume()) *
                             double(totalWeightBytes(
                                 g.value(op.inputs[size_t(wi)]), p.optimizer));
          continue;
        }
        std::vector<DeviceId> grp = weightGroup(sem, wi, c);
        DType wt = g.value(op.inputs[size_t(wi)]).dtype;
        int64_t elems = sem.inputRegion(wi, tile).volume();
        if (grp.size() > 1)
          wsync[o][k] +=
              collectiveOn(Collective::AllReduce, grp, elems * dtypeBytes(wt));
        if (c.zero && grp.size() > 1) {
          // Held 1/R: the state, then the gradient, then the weight.
          WeightBytes wb =
              weightBytes(g.value(op.inputs[size_t(wi)]), p.optimizer);
          double off = double(elems) * (1 - 1.0 / double(grp.size()));
          m.memory_[o][k] -= off * double(wb.optimizer);
          if (c.zero >= 2)
            m.memory_[o][k] -= off * double(wb.gradient);
          if (c.zero == 3) {
            m.memory_[o][k] -= off * double(wb.weight);
            Seconds ag = collectiveOn(Collective::AllGather, grp,
                                      elems * Bytes(wb.weight));
            sync +=
                double(m.microBatches_) * (std::max(0.0, ag - kt->forward) +
                                           std::max(0.0, ag - kt->backward()));
          }
        }
      }
      // What follows runs once per micro-batch, on its tile.
      Seconds perMb = 0;
      for (size_t j = 0; j < sem.outputs.size(); ++j) {
        ValueId v = op.output(j);
        if (v == kNoValue || !sem.outputs[j].present)
          continue;
        Bytes outBytes = sem.outputRegion(int(j), mbTile).volume() *
                         dtypeBytes(g.value(v).dtype);
        // A partial-sum output nobody reads (the loss) is reduced here.
        std::vector<bool> red(c.degree.size(), false);
        bool any = false;
        for (int l : sem.reducedLoops(int(j)))
          if (c.degree[size_t(l)] > 1)
            red[size_t(l)] = any = true;
        if (any && g.value(v).users.empty())
          perMb += collectiveOn(Collective::AllReduce, groupOf(c, red, false),
                                outBytes);
        // Split statistics (Softmax's axis, LayerNorm's hidden axis): an
        // all-reduce of one value per row, forward and backward.
        for (size_t l = 0; l < sem.loops.size(); ++l) {
          if (!sem.loops[l].statReduced || c.degree[l] <= 1)
            continue;
          std::vector<bool> one(c.degree.size(), false);
          one[l] = true;
          int64_t ext = std::max<int64_t>(1, mbTile.hi[l] - mbTile.lo[l]);
          perMb +=
              2 * collectiveOn(Collective::AllReduce, groupOf(c, one, false),
                               std::max<Bytes>(4, outBytes / ext));
        }
      }
      // A recurrence over a split loop (LSTM hidden units): per step an
      // all-gather of the state forward and an all-reduce of its gradient
      // backward, among the tiles that differ only in that loop.
      for (size_t l = 0; l < sem.loops.size(); ++l) {
        int64_t steps = sem.loops[l].exchangeSteps;
        if (steps <= 0 || c.degree[l] <= 1)
          continue;
        std::vector<bool> one(c.degree.size(), false);
        one[l] = true;
        std::vector<DeviceId> grp = groupOf(c, one, false);
        int64_t rows = sem.exchangeElements(int(l), mbTile);
        Bytes eb = op.outputs.empty() || op.outputs[0] == kNoValue
                       ? 4
                       : dtypeBytes(g.value(op.outputs[0]).dtype);
        perMb += double(steps) *
                 (collectiveOn(Collective::AllGather, grp, rows * eb) +
                  collectiveOn(Collective::AllReduce, grp, rows * eb));
      }
      // TensorOpt 4.2, data loading: graph inputs arrive split by sample
      // and are re-scheduled to the split this config needs.
      for (size_t i = 0; i < op.inputs.size(); ++i) {
        ValueId v = op.inputs[i];
        if (v == kNoValue || !sem.inputs[i].present ||
            g.value(v).kind != ValueKind::Input)
          continue;
        const Value &val = g.value(v);
        Split to = inputSplit(sem, int(i), c, false);
        Split from(to.size(), 0);
        if (val.shape.rank() > 0 &&
            (val.shape[0] / mb) % int64_t(m.devices_) == 0 && to.size() > 2)
          from[0] = uint8_t(bits);
        else
          from[to.size() - 1] = uint8_t(bits);
        perMb += reschedule(double(val.bytes()) / mb, from, to);
      }
      m.sync_[o][k] = sync + mb * perMb;
    }
    return llvm::Error::success();
  }

  void edgeCosts(size_t e, bool reuse) {
    const Graph &g = p.graph;
    const FtEdge &ed = m.edges_[e];
    const Op &pop = g.op(ed.producer), &cop = g.op(ed.consumer);
    const Value &val = g.value(ed.value);
    // Per micro-batch: its share of the tensor, re-scheduled m times.
    const int32_t mb = m.microBatches_;
    double total = double(val.bytes()) / mb;
    auto mbTile = [&](OpId o, size_t k) {
      return microBatchTile(m.opConfig(o, k), g.op(o).sem, 0, 0, mb);
    };
    const auto &ca = m.configs_[ed.producer], &cb = m.configs_[ed.consumer];
    bool grad = std::find(cop.sem.gradInputs.begin(), cop.sem.gradInputs.end(),
                          ed.input) != cop.sem.gradInputs.end();
    double prodSavedPerElem = 0, consSavedPerElem = 0;
    for (const SavedOperand &s : pop.sem.saved)
      if (s.isOutput && s.index == ed.output)
        prodSavedPerElem += s.bytesPerElement;
    for (const SavedOperand &s : cop.sem.saved)
      if (!s.isOutput && s.index == ed.input)
        consSavedPerElem += s.bytesPerElement;
    bool canReuse = reuse && prodSavedPerElem > 0 && consSavedPerElem > 0 &&
                    val.users.size() == 1;
    std::vector<Split> A, Asaved, Ag, B, Bg;
    std::vector<double> prodSaved, consSaved;
    for (size_t a = 0; a < ca.size(); ++a) {
      Split s = outputSplit(pop.sem, ed.output, ca[a]);
      A.push_back(s);
      size_t r = s.size() - 2;
      s[r + 1] = uint8_t(s[r + 1] + s[r]); // the reduced value
      s[r] = 0;
      Asaved.push_back(s);
      Ag.push_back(s);
      Box t = mbTile(ed.producer, a);
      prodSaved.push_back(prodSavedPerElem *
                          double(pop.sem.outputRegion(ed.output, t).volume()));
    }
    for (size_t b = 0; b < cb.size(); ++b) {
      B.push_back(inputSplit(cop.sem, ed.input, cb[b], false));
      Bg.push_back(inputSplit(cop.sem, ed.input, cb[b], true));
      Box t = mbTile(ed.consumer, b);
      consSaved.push_back(consSavedPerElem *
                          double(cop.sem.inputRegion(ed.input, t).volume()));
    }
    auto &tab = m.edgeOpts_[e];
    tab.assign(ca.size() * cb.size(), {});
    // The shortest paths from each source split, looked up once.
    std::vector<const Paths *> fromA, fromB, fromBg;
    for (const Split &s : A)
      fromA.push_back(&pathsFrom(total, s));
    for (size_t b = 0; b < cb.size(); ++b) {
      fromBg.push_back(grad ? &pathsFrom(total, Bg[b]) : nullptr);
      fromB.push_back(canReuse ? &pathsFrom(total, B[b]) : nullptr);
    }
    // A recomputed consumer holds its input from a kept producer (a
    // recomputed one makes it again).
    std::vector<double> consIn;
    for (size_t b = 0; b < cb.size(); ++b) {
      Box t = mbTile(ed.consumer, b);
      consIn.push_back(double(cop.sem.inputRegion(ed.input, t).volume()) *
                       double(dtypeBytes(val.dtype)));
    }
    for (size_t a = 0; a < ca.size(); ++a)
      for (size_t b = 0; b < cb.size(); ++b) {
        Seconds fwd = mb * lookup(*fromA[a], A[a], B[b]);
        Seconds bwd = grad ? mb * lookup(*fromBg[b], Bg[b], Ag[a]) : 0;
        auto &opts = tab[a * cb.size() + b];
        double held = cb[b].recompute && !ca[a].recompute ? consIn[b] : 0;
        opts.push_back({fwd + bwd, held});
        if (canReuse && fwd > 0 && !ca[a].recompute && !cb[b].recompute) {
          // Keep the copy before: the consumer re-schedules it again for
          // its backward pass instead of saving its own.
          opts.push_back({fwd + bwd + fwd, -consSaved[b]});
          // Keep the copy after: the producer gets its copy back.
          opts.push_back({fwd + bwd + mb * lookup(*fromB[b], B[b], Asaved[a]),
                          -prodSaved[a]});
        }
      }
  }
};

llvm::Expected<FtModel> FtModel::build(const SearchProblem &p,
                                       const FtOptions &o) {
  if (auto err = o.validate())
    return llvm::Error(std::move(err));
  FtModel m;
  size_t have = p.topo.numDevices();
  size_t n = o.devices;
  if (n == 0) {
    n = 1;
    while (n * 2 <= have)
      n *= 2;
  }
  if (n > have)
    return inputError("ft: {} devices asked for, the topology has {}", n, have);
  m.devices_ = n;
  m.problem_ = &p;
  m.maxSplitLoops_ = o.maxSplitLoops;
  m.nodeMesh_ = o.nodeMesh;
  m.recompute_ = o.recompute;
  m.zero_ = o.zero;
  m.microBatches_ = o.microBatches;
  FtModelBuilder b(p, m, log2Of(int64_t(n)));
  const Graph &g = p.graph;
  for (const Op &op : g.ops()) {
    m.configs_.push_back(b.enumerate(op.sem));
    b.addZeroVariants(op, m.configs_.back());
    size_t k = m.configs_.back().size();
    if (k == 0)
      return inputError(
          "{}: ft: no configuration on {} devices leaves each of {} "
          "micro-batches whole samples{}",
          g.where(op.id), n, o.microBatches,
          sampleLoop(op.sem) < 0 ? " (it has no sample loop)" : "");
    m.compute_.emplace_back(k);
    m.sync_.emplace_back(k);
    m.memory_.emplace_back(k);
    m.transient_.emplace_back(k);
    m.again_.emplace_back(k);
  }
  b.bwd.resize(g.numOps());
  b.wsync.resize(g.numOps());
  for (const Op &op : g.ops()) {
    b.bwd[op.id].assign(m.configs_[op.id].size(), 0);
    b.wsync[op.id].assign(m.configs_[op.id].size(), 0);
  }
  // Ops in parallel, each writing its own slots. An op that fails (a
  // strict cost model without its kernel) is run again alone, the first in
  // op order, for its error.
  ThreadPool pool(o.threads);
  std::vector<uint8_t> failed(g.numOps(), 0);
  pool.parallelFor(g.numOps(), [&](size_t i) {
    if (auto err = b.opCosts(OpId(i))) {
      llvm::consumeError(std::move(err));
      failed[i] = 1;
    }
  });
  for (size_t i = 0; i < g.numOps(); ++i)
    if (failed[i])
      if (auto err = b.opCosts(OpId(i)))
        return llvm::Error(std::move(err));
  // A weight gradient's all-reduce overlaps the backward pass of the ops
  // before it: only what the least such backward cannot hide is exposed.
  Seconds window = 0;
  std::vector<Seconds> windowBefore(g.numOps());
  for (const Op &op : g.ops()) {
    windowBefore[op.id] = window;
    Seconds least = std::numeric_limits<double>::infinity();
    for (size_t k = 0; k < m.configs_[op.id].size(); ++k) {
      m.sync_[op.id][k] += std::max(0.0, b.wsync[op.id][k] - window);
      least = std::min(least, b.bwd[op.id][k]);
    }
    window += least;
  }
  for (const Op &op : g.ops())
    for (size_t i = 0; i < op.inputs.size(); ++i) {
      ValueId v = op.inputs[i];
      if (v == kNoValue || !op.sem.inputs[i].present)
        continue;
      const Value &val = g.value(v);
      if (val.kind != ValueKind::Activation || val.producer < 0)
        continue;
      m.edges_.push_back({val.producer, val.producerOutput, op.id, int(i), v});
    }
  // A shared weight joins its consecutive users by weight edges; with more
  // than two users each of the k-1 edges carries 1/(k-1) of its pair's cost
  // (exact for two users, and when all users split the weight alike).
  size_t activationEdges = m.edges_.size();
  std::vector<double> shareOf;
  for (const Value &v : g.values()) {
    if (!b.shared(v.id))
      continue;
    std::vector<OpId> users = b.usersOf(v.id);
    for (size_t u = 0; u + 1 < users.size(); ++u) {
      const Op &later = g.op(users[u + 1]);
      int in = 0;
      while (later.inputs[size_t(in)] != v.id)
        ++in;
      m.edges_.push_back({users[u], -1, users[u + 1], in, v.id, true});
      shareOf.push_back(1.0 / double(users.size() - 1));
    }
  }
  m.edgeOpts_.resize(m.edges_.size());
  pool.parallelFor(m.edges_.size(), [&](size_t e) {
    if (e < activationEdges) {
      b.edgeCosts(e, o.tensorReuse);
      return;
    }
    const FtEdge &ed = m.edges_[e];
    size_t ka = m.configs_[ed.producer].size(),
           kb = m.configs_[ed.consumer].size();
    // The all-reduce waits for the earliest user's backward, the last to
    // run: only the backward of the ops before the first user hides it.
    Seconds win = windowBefore[b.usersOf(ed.value).front()];
    auto &tab = m.edgeOpts_[e];
    tab.assign(ka * kb, {});
    for (size_t x = 0; x < ka; ++x)
      for (size_t y = 0; y < kb; ++y)
        tab[x * kb + y].push_back(
            b.weightPair(ed, x, y, win, shareOf[e - activationEdges]));
  });
  return llvm::Expected<FtModel>(std::move(m));
}

Seconds FtModel::reschedule(const std::vector<int64_t> &shape, Bytes elemBytes,
                            const std::vector<uint8_t> &from,
                            const std::vector<uint8_t> &to) const {
  double total = double(elemBytes);
  for (int64_t d : shape)
    total *= double(d);
  FtModelBuilder b(*problem_, const_cast<FtModel &>(*this),
                   log2Of(int64_t(devices_)));
  return b.reschedule(total, from, to);
}

OpConfig FtModel::opConfig(OpId o, size_t k) const {
  const FtConfig &c = configs_[o][k];
  OpConfig oc;
  oc.degree = c.degree;
  oc.replicas = c.replicas;
  for (size_t d = 0; d < devices_; ++d)
    oc.devices.push_back(DeviceId(d));
  return oc;
}

} // namespace soap
