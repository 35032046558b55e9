// The task graph's communication: routes and ring resources, collectives,
// the transfers of each producer-consumer edge and the synchronisation of
// each weight's gradients (FlexFlow section 5.1).
#include "TaskGraphDetail.h"
#include "soap/Sim/TaskGraph.h"

#include <algorithm>
#include <map>
#include <optional>

namespace soap {

using namespace detail;

Seconds TaskGraph::transferTime(DeviceId a, DeviceId b, Bytes bytes) const {
  return ctx_->topo.pathLatency(a, b) +
         static_cast<double>(bytes) / ctx_->topo.pathBandwidth(a, b);
}

std::vector<uint32_t> TaskGraph::routeResources(DeviceId a, DeviceId b) const {
  std::vector<uint32_t> r;
  uint32_t n = static_cast<uint32_t>(ctx_->topo.numDevices());
  // CPU ranks copy their messages themselves: both ends are busy too.
  if (ctx_->topo.deviceSpec().commOccupiesCompute && a != b)
    r = {std::min(a, b), std::max(a, b)};
  for (LinkId l : ctx_->topo.route(a, b))
    r.push_back(n + l);
  return r;
}

const std::vector<uint32_t> &
TaskGraph::ringResources(const std::vector<DeviceId> &g) {
  auto it = ringCache_.find(g);
  if (it != ringCache_.end())
    return it->second;
  std::vector<DeviceId> ring = ctx_->collectives.ringOrder(g);
  std::vector<uint32_t> r;
  for (size_t i = 0; i < ring.size(); ++i) {
    std::vector<uint32_t> hop =
        routeResources(ring[i], ring[(i + 1) % ring.size()]);
    r.insert(r.end(), hop.begin(), hop.end());
  }
  if (ctx_->topo.deviceSpec().commOccupiesCompute)
    r.insert(r.end(), g.begin(), g.end());
  std::sort(r.begin(), r.end());
  r.erase(std::unique(r.begin(), r.end()), r.end());
  return ringCache_.emplace(g, std::move(r)).first->second;
}

TaskId TaskGraph::collective(CollectiveRole role, TaskKey k, OpId op,
                             const std::vector<DeviceId> &devs, Bytes bytes,
                             Collective kind, int64_t count) {
  Task t;
  t.kind = TaskKind::Collective;
  t.key = k;
  t.role = role;
  t.op = op;
  t.bytes = bytes * count;
  t.comm = kind;
  t.exe =
      static_cast<double>(count) * ctx_->collectives.time(kind, devs, bytes);
  t.groupSize = static_cast<uint32_t>(devs.size());
  const std::vector<uint32_t> &ring = ringResources(devs);
  t.resources.assign(ring.begin(), ring.end());
  if (fold_.active() && !std::all_of(devs.begin(), devs.end(),
                                     [&](DeviceId d) { return mine(d); })) {
    // Spanning blocks (foldKeeps): on every block's own device or link it
    // uses, it must use block 0's copy too (Fold.h).
    t.spans = true;
    uint32_t n = static_cast<uint32_t>(ctx_->topo.numDevices());
    auto uses = [&](uint32_t r) {
      return std::binary_search(t.resources.begin(), t.resources.end(), r);
    };
    for (uint32_t r : t.resources) {
      if (r < n) {
        if (!uses(fold_.home(r)))
          foldBroken_ = true;
        continue;
      }
      LinkId l = r - n;
      if (fold_.machine->linkGroup[l] > 0 &&
          !uses(n + fold_.machine->linkInFirst[l]))
        foldBroken_ = true;
    }
  }
  return newTask(std::move(t));
}

void TaskGraph::setExe(TaskId id, Seconds exe) {
  Task &t = tasks_[id];
  for (uint32_t r : t.resources)
    work_[r] += toPicoseconds(exe) - toPicoseconds(t.exe);
  t.exe = exe;
}

void TaskGraph::overlapTensorParallel(TaskId id,
                                      const std::vector<DeviceId> &devs,
                                      OpId gemmOp,
                                      llvm::ArrayRef<TaskId> gemms) {
  const Task &t = tasks_[id];
  if (!strategy_.gradSync.tpCommOverlap || devs.size() < 2 ||
      (t.comm != Collective::AllGather &&
       t.comm != Collective::ReduceScatter) ||
      !isGemmKind(ctx_->graph.op(gemmOp).kind))
    return;
  const Topology &topo = ctx_->topo;
  for (DeviceId d : devs)
    if (topo.device(d).node != topo.device(devs[0]).node)
      return;
  Seconds gemm = 0;
  for (TaskId g : gemms)
    if (g != kNoTask)
      gemm = std::max(gemm, tasks_[g].exe);
  // n chunks: the first (all-gather) or last (reduce-scatter) computes
  // with no transfer beside it; each of the other n - 1 steps takes the
  // longer of a chunk's GEMM and a ring step of the collective. The GEMM
  // is what it would be anyway; the rest is the collective's, and so is
  // the GEMM's slowdown by NCCL's share of the GPU while they overlap.
  double n = double(devs.size());
  Seconds chunk = gemm / n, step = t.exe / (n - 1);
  Seconds total = chunk + (n - 1) * std::max(chunk, step);
  Seconds hidden = (n - 1) * std::min(chunk, step);
  setExe(id, std::max<Seconds>(0, total - gemm) +
                 topo.deviceSpec().ncclComputeShareIntra * hidden);
}

namespace {

/// At most this many bytes of plans and keys (a key holds both
/// configurations' devices: 8 KB for two 1,024-way splits) are kept in
/// TaskGraph::edgePlans_; past it the cache starts again, so a long mcmc
/// chain's new configurations do not pile up.
constexpr size_t kEdgePlanBytes = size_t(64) << 20;

void put(std::string &s, int64_t v) {
  s.append(reinterpret_cast<const char *>(&v), sizeof v);
}

void putLoops(std::string &s, const OpSemantics &sem) {
  put(s, int64_t(sem.loops.size()));
  for (const LoopDim &l : sem.loops) {
    put(s, int64_t(l.cls));
    put(s, l.size);
    put(s, int64_t(l.ring));
  }
}

void putMap(std::string &s, const TensorMap &m) {
  put(s, m.present);
  put(s, m.isView);
  put(s, int64_t(m.shape.size()));
  for (int64_t d : m.shape)
    put(s, d);
  put(s, int64_t(m.dims.size()));
  for (const DimMap &d : m.dims) {
    put(s, d.full);
    put(s, d.offset);
    put(s, d.divisor);
    put(s, int64_t(d.terms.size()));
    for (const IndexTerm &t : d.terms) {
      put(s, t.loop);
      put(s, t.coeff);
    }
  }
}

/// `c` with its devices counted from `base`.
void putConfig(std::string &s, const OpConfig &c, DeviceId base) {
  put(s, int64_t(c.degree.size()));
  for (int32_t d : c.degree)
    put(s, d);
  put(s, c.replicas);
  put(s, int64_t(c.devices.size()));
  for (DeviceId d : c.devices) {
    DeviceId rel = d - base;
    s.append(reinterpret_cast<const char *>(&rel), sizeof rel);
  }
}

} // namespace

/// What an edge's transfers are depends only on the inputs in the key
/// below (the tiles' boxes come from the loops and the configurations, the
/// regions from the two maps, the devices from the configurations, which
/// of them are built from the fold), so edges that agree on all of them —
/// the same op pair in each of a GPT's layers — share one plan, and
/// building a 96-layer model derives each kind of edge once instead of once
/// per layer. Devices are keyed relative to the lowest device of the two
/// configurations (`base`), with base's place in the fold's period (which
/// of the devices are block 0's), so the layers of every pipeline stage
/// share too; steps hold devices relative to base, and the routes and
/// times are the replay's, on the real devices.
std::shared_ptr<const TaskGraph::EdgePlan> TaskGraph::edgePlan(size_t e,
                                                               DeviceId base) {
  const Edge &ed = edges_[e];
  const Op &p = ctx_->graph.op(ed.producer);
  const Op &c = ctx_->graph.op(ed.consumer);
  const OpConfig &pc = strategy_.configs[ed.producer];
  const OpConfig &cc = strategy_.configs[ed.consumer];
  const Value &v = ctx_->graph.value(p.outputs[ed.output]);
  int32_t m = strategy_.pipeline.microBatches;
  int64_t eb = dtypeBytes(v.dtype);
  bool grad = std::find(c.sem.gradInputs.begin(), c.sem.gradInputs.end(),
                        ed.input) != c.sem.gradInputs.end();
  // A value that several ops of a later pipeline stage read sends its
  // gradient back once: autograd sums the readers' gradients on their
  // stage, and the first reader in op order (whose backward runs last)
  // sends the sum; the others send nothing across the stages.
  const Pipeline &pipe = strategy_.pipeline;
  if (grad && pipe.stage(ed.producer) != pipe.stage(ed.consumer))
    for (OpId u : v.users) {
      if (u >= ed.consumer || pipe.stage(u) != pipe.stage(ed.consumer))
        continue;
      const Op &uo = ctx_->graph.op(u);
      for (int i : uo.sem.gradInputs)
        if (uo.inputs[size_t(i)] == p.outputs[ed.output])
          grad = false;
    }
  std::string k;
  k.reserve(512 + 4 * (pc.devices.size() + cc.devices.size()));
  put(k, m);
  put(k, eb);
  put(k, grad);
  put(k, fold_.factor);
  put(k, fold_.block);
  put(k, fold_.period);
  put(k, fold_.active() ? base % fold_.period : 0);
  putLoops(k, p.sem);
  putMap(k, p.sem.outputs[size_t(ed.output)]);
  putLoops(k, c.sem);
  putMap(k, c.sem.inputs[size_t(ed.input)]);
  put(k, int64_t(v.shape.dims.size()));
  for (int64_t d : v.shape.dims)
    put(k, d);
  putConfig(k, pc, base);
  putConfig(k, cc, base);
  if (ctx_->shareEdgePlans) {
    auto it = edgePlans_.find(k);
    if (it != edgePlans_.end())
      return it->second;
  }
  ++edgePlansDerived_;

  auto plan = std::make_shared<EdgePlan>();
  int64_t ptiles = pc.numTiles(), ctiles = cc.numTiles();
  int32_t prep = pc.replicas, crep = cc.replicas;
  std::vector<Box> pbox(ptiles), cbox(ctiles);
  int32_t mb = 0;
  auto step = [&](int64_t from, int64_t to, DeviceId a, DeviceId b, Bytes bytes,
                  uint8_t dir, int64_t kp, int64_t kc, int32_t r) {
    if (fold_.active()) {
      // Block 0's own transfers only; one between blocks breaks the fold.
      if (mine(a) != mine(b))
        plan->broken = true;
      if (!mine(a) || !mine(b))
        return;
    }
    plan->steps.push_back(
        {from, to, kp, kc, bytes, a - base, b - base, mb, r, dir});
  };
  for (mb = 0; mb < m; ++mb) {
    for (int64_t t = 0; t < ptiles; ++t)
      pbox[t] =
          p.sem.outputRegion(ed.output, microBatchTile(pc, p.sem, t, mb, m));
    for (int64_t t = 0; t < ctiles; ++t)
      // A ring-split tile receives only its own block of what the ring
      // carries (OpSemantics::ringBlock; TaskGraph::buildRing).
      cbox[t] = c.sem.inputRegionInTensor(
          ed.input, c.sem.ringBlock(ed.input, microBatchTile(cc, c.sem, t, mb, m)),
          v.shape.dims);
    // Producer tiles writing the same region (partial sums) are one
    // source; send from the copy on the receiving device when there is one.
    std::map<std::vector<int64_t>, std::vector<int64_t>> sources;
    for (int64_t t = 0; t < ptiles; ++t) {
      std::vector<int64_t> b = pbox[t].lo;
      b.insert(b.end(), pbox[t].hi.begin(), pbox[t].hi.end());
      sources[b].push_back(t);
    }
    TileIndex index(cbox);
    // Consumer tiles reading one region (they differ only in loops the
    // input's map lacks) hold its gradient summed by their all-reduce
    // (TaskGraph::buildOp): a producer task takes it from one of them, the
    // one on its own device when there is one.
    std::map<std::vector<int64_t>, std::vector<int64_t>> readers;
    std::vector<const std::vector<int64_t> *> readersOf(static_cast<size_t>(ctiles));
    if (grad) {
      for (int64_t t = 0; t < ctiles; ++t) {
        std::vector<int64_t> b = cbox[t].lo;
        b.insert(b.end(), cbox[t].hi.begin(), cbox[t].hi.end());
        auto &same = readers[b];
        same.push_back(t);
        readersOf[size_t(t)] = &same; // std::map keeps its nodes in place
      }
    }
    std::vector<const std::vector<int64_t> *> srcMembers;
    std::vector<Box> srcBox;
    for (const auto &[boxKey, members] : sources) {
      srcMembers.push_back(&members);
      srcBox.push_back(pbox[members[0]]);
    }
    // All-gathers instead of transfers (EdgeGather): forward, the consumer
    // tasks that read one region, each on its own device, where the
    // producer holds it in one slice on each of those devices; backward, a
    // source whose tasks each need the gradient of its whole region, held
    // in one slice on each of their devices by single readers. A ring
    // all-gather moves what the pairwise transfers do in n - 1 steps, where
    // the transfers queued on the links take about twice as long.
    std::vector<bool> fwdGathered(size_t(ctiles), false);
    std::vector<bool> bwdGathered(srcMembers.size(), false);
    using Holder = std::pair<DeviceId, int64_t>; // device, task index
    // Whether `from` and `to` are on the same distinct devices; if so (and
    // the group is block 0's), adds their all-gather of `bytes`.
    auto gather = [&](std::vector<Holder> &from, std::vector<Holder> &to,
                      Bytes bytes, uint8_t dir) {
      std::sort(from.begin(), from.end());
      std::sort(to.begin(), to.end());
      if (from.size() != to.size() || to.size() < 2)
        return false;
      for (size_t i = 0; i < to.size(); ++i)
        if (from[i].first != to[i].first ||
            (i > 0 && to[i].first == to[i - 1].first))
          return false;
      size_t inFirst = 0;
      for (const Holder &h : to)
        inFirst += !fold_.active() || mine(h.first);
      if (inFirst != 0 && inFirst != to.size())
        return false; // crossing blocks: the transfers say so
      if (inFirst == 0)
        return true;
      EdgeGather ga;
      for (size_t i = 0; i < to.size(); ++i) {
        ga.from.push_back(from[i].second);
        ga.to.push_back(to[i].second);
        ga.devs.push_back(to[i].first - base);
      }
      ga.bytes = bytes;
      ga.mb = mb;
      ga.dir = dir;
      plan->gathers.push_back(std::move(ga));
      return true;
    };
    {
      std::map<std::vector<int64_t>, std::vector<int64_t>> byRegion;
      for (int64_t t = 0; t < ctiles; ++t) {
        std::vector<int64_t> b = cbox[t].lo;
        b.insert(b.end(), cbox[t].hi.begin(), cbox[t].hi.end());
        byRegion[b].push_back(t);
      }
      TileIndex srcIndex(srcBox);
      for (const auto &[regionKey, tiles] : byRegion) {
        const Box &q = cbox[tiles[0]];
        std::vector<Holder> from, to;
        for (int64_t kc : tiles)
          for (int32_t rc = 0; rc < crep; ++rc)
            to.emplace_back(cc.device(kc, rc), kc * crep + rc);
        if (to.size() < 2 || prep != 1)
          continue;
        std::vector<Box> parts;
        bool single = true;
        for (int64_t si : srcIndex.candidates(q)) {
          if (!overlaps(srcBox[size_t(si)], q))
            continue;
          const std::vector<int64_t> &mem = *srcMembers[size_t(si)];
          single = single && mem.size() == 1;
          from.emplace_back(pc.device(mem[0], 0), mem[0]);
          parts.push_back(srcBox[size_t(si)].intersect(q));
        }
        if (single && from.size() == to.size() && partsTile(q, parts) &&
            gather(from, to, q.volume() * eb, 0))
          for (int64_t kc : tiles)
            fwdGathered[size_t(kc)] = true;
      }
    }
    for (size_t si = 0; grad && crep == 1 && si < srcMembers.size(); ++si) {
      const Box &pb = srcBox[si];
      std::vector<Holder> from, to;
      for (int64_t kp : *srcMembers[si])
        for (int32_t rp = 0; rp < prep; ++rp)
          to.emplace_back(pc.device(kp, rp), kp * prep + rp);
      if (to.size() < 2)
        continue;
      std::vector<Box> parts;
      bool single = true;
      for (int64_t kc : index.candidates(pb)) {
        if (!overlaps(pb, cbox[kc]))
          continue;
        single = single && readersOf[size_t(kc)]->size() == 1;
        from.emplace_back(cc.device(kc, 0), kc);
        parts.push_back(pb.intersect(cbox[kc]));
      }
      if (single && from.size() == to.size() && partsTile(pb, parts) &&
          gather(from, to, pb.volume() * eb, 1))
        bwdGathered[si] = true;
    }
    size_t si = 0;
    for (const auto &[boxKey, members] : sources) {
      const Box &pb = pbox[members[0]];
      bool bwdGather = bwdGathered[si++];
      for (int64_t kc : index.candidates(pb)) {
        if (!overlaps(pb, cbox[kc]))
          continue;
        Box inter = pb.intersect(cbox[kc]);
        Bytes bytes = inter.volume() * eb;
        // Forward: every replica of the consumer tile needs the region.
        for (int32_t rc = 0; rc < crep && !fwdGathered[size_t(kc)]; ++rc) {
          DeviceId dst = cc.device(kc, rc);
          int64_t src = members[0];
          int32_t srcRep = 0;
          for (int64_t kp : members)
            for (int32_t rp = 0; rp < prep; ++rp)
              if (pc.device(kp, rp) == dst && pc.device(src, srcRep) != dst) {
                src = kp;
                srcRep = rp;
              }
          step(src, kc * crep + rc, pc.device(src, srcRep), dst, bytes, 0, src,
               kc, rc);
        }
        if (!grad || bwdGather)
          continue;
        // Backward: every producer task needs the gradient of its region,
        // from one reader of each summed region.
        const std::vector<int64_t> &same = *readersOf[size_t(kc)];
        bool summed = same.size() > 1;
        for (int64_t kp : members)
          for (int32_t rp = 0; rp < prep; ++rp) {
            DeviceId dst = pc.device(kp, rp);
            int64_t from = kc;
            int32_t srcRep = 0;
            if (summed) {
              // The reader on dst, else the group's first; only that
              // reader sends.
              from = same[0];
              for (int64_t t : same)
                for (int32_t rc = 0; rc < crep; ++rc)
                  if (cc.device(t, rc) == dst && cc.device(from, srcRep) != dst) {
                    from = t;
                    srcRep = rc;
                  }
              if (from != kc)
                continue;
            } else {
              for (int32_t rc = 0; rc < crep; ++rc)
                if (cc.device(kc, rc) == dst)
                  srcRep = rc;
            }
            step(kc * crep + srcRep, kp * prep + rp, cc.device(kc, srcRep), dst,
                 bytes, 1, kp * prep + rp, kc, srcRep);
          }
      }
    }
  }
  plan->steps.shrink_to_fit();
  if (!ctx_->shareEdgePlans)
    return plan;
  size_t bytes =
      plan->steps.size() * sizeof(EdgeStep) + k.size() + sizeof(EdgePlan) + 64;
  for (const EdgeGather &ga : plan->gathers)
    bytes += sizeof(EdgeGather) + ga.devs.size() * (sizeof(DeviceId) + 16);
  if (edgePlanBytes_ + bytes > kEdgePlanBytes) {
    edgePlans_.clear();
    edgePlanBytes_ = 0;
  }
  edgePlanBytes_ += bytes;
  return edgePlans_.emplace(std::move(k), std::move(plan)).first->second;
}

size_t TaskGraph::sharedForward(size_t e) const {
  const Edge &ed = edges_[e];
  const Pipeline &pipe = strategy_.pipeline;
  int32_t st = pipe.stage(ed.consumer);
  if (pipe.stage(ed.producer) == st)
    return e;
  const Graph &g = ctx_->graph;
  const Op &c = g.op(ed.consumer);
  std::string mine;
  putLoops(mine, c.sem);
  putMap(mine, c.sem.inputs[size_t(ed.input)]);
  size_t first = e;
  for (size_t f : edgesOfOp_[ed.producer]) {
    if (f >= first)
      continue;
    const Edge &o = edges_[f];
    if (o.producer != ed.producer || o.output != ed.output ||
        o.consumer == ed.consumer || pipe.stage(o.consumer) != st ||
        strategy_.configs[o.consumer] != strategy_.configs[ed.consumer])
      continue;
    const Op &u = g.op(o.consumer);
    std::string theirs;
    putLoops(theirs, u.sem);
    putMap(theirs, u.sem.inputs[size_t(o.input)]);
    if (theirs == mine)
      first = f;
  }
  return first;
}

void TaskGraph::buildEdge(size_t e, std::vector<TaskId> &owned, size_t *count) {
  const Edge &ed = edges_[e];
  const Op &p = ctx_->graph.op(ed.producer);
  const OpConfig &pc = strategy_.configs[ed.producer];
  const OpConfig &cc = strategy_.configs[ed.consumer];
  DeviceId base =
      std::min(*std::min_element(pc.devices.begin(), pc.devices.end()),
               *std::min_element(cc.devices.begin(), cc.devices.end()));
  std::shared_ptr<const EdgePlan> plan = edgePlan(e, base);
  if (plan->broken)
    foldBroken_ = true;
  const OpTasks &pt = opTasks_[ed.producer];
  const OpTasks &ct = opTasks_[ed.consumer];
  int64_t ptiles = pc.numTiles();
  int64_t pper = ptiles * pc.replicas, cper = cc.numTasks();
  size_t outs = p.outputs.size();
  const Pipeline &pipe = strategy_.pipeline;
  // The consumer's stage holds the receive buffers of its micro-batches in
  // flight.
  int32_t buffered = pipe.inFlight(pipe.stage(ed.consumer));
  // A later stage receives an activation once however many of its ops
  // read it (Megatron's p2p send of the hidden state, read by a layer's
  // norm and its residual add): an edge whose consumer is configured as an
  // earlier reader's, with the same region map, takes that reader's
  // forward transfers instead of its own.
  size_t owner = count ? e : sharedForward(e);
  std::map<TaskKey, TaskId> received;
  if (owner != e)
    for (TaskId t : edgeTasks_[owner])
      if (tasks_[t].alive && tasks_[t].kind == TaskKind::Transfer)
        received.emplace(tasks_[t].key, t);
  for (const EdgeStep &st : plan->steps) {
    if (count) {
      *count += st.a != st.b;
      continue;
    }
    size_t mb = size_t(st.mb);
    TaskId from, to;
    if (st.dir == 0) {
      from = pt.fwdOut[(mb * outs + size_t(ed.output)) * size_t(ptiles) +
                       size_t(st.from)];
      to = ct.fwd[mb * size_t(cper) + size_t(st.to)];
    } else {
      from = ct.bwdOut[mb * size_t(cper) + size_t(st.from)];
      to = pt.bwd[mb * size_t(pper) + size_t(st.to)];
    }
    if (st.a == st.b) {
      link(from, to);
      continue;
    }
    auto stepKey = [&](size_t edge) {
      return key(TaskKind::Transfer, static_cast<uint32_t>(edge),
                 (uint32_t(st.mb) << 17) | (uint32_t(st.dir) << 16) |
                     static_cast<uint32_t>(st.r),
                 (static_cast<uint64_t>(st.kp) << 32) |
                     static_cast<uint64_t>(st.kc));
    };
    if (owner != e && st.dir == 0) {
      auto it = received.find(stepKey(owner));
      if (it != received.end()) {
        link(it->second, to);
        continue;
      }
    }
    DeviceId a = base + st.a, b = base + st.b;
    Task t;
    t.kind = TaskKind::Transfer;
    t.key = stepKey(e);
    t.bytes = st.bytes;
    t.exe = transferTime(a, b, st.bytes);
    std::vector<uint32_t> route = routeResources(a, b);
    t.resources.assign(route.begin(), route.end());
    t.op = ed.consumer;
    t.microBatch = st.mb;
    if (st.dir == 0 && st.mb < buffered)
      t.bufferDevice = static_cast<int32_t>(b);
    TaskId id = newTask(std::move(t));
    owned.push_back(id);
    link(from, id);
    link(id, to);
  }
  // Keyed by the first task it gives the region to: a task takes one
  // all-gather of an edge, in a folded graph as in the full one.
  for (const EdgeGather &ga : plan->gathers) {
    if (count) {
      ++*count;
      continue;
    }
    size_t mb = size_t(ga.mb);
    std::vector<DeviceId> devs;
    for (DeviceId d : ga.devs)
      devs.push_back(base + d);
    TaskId id = collective(
        ga.dir == 0 ? CollectiveRole::ActivationGather
                    : CollectiveRole::GradientGather,
        key(TaskKind::Collective, 0xC0000000u | static_cast<uint32_t>(e),
            (uint32_t(ga.mb) << 1) | ga.dir, uint64_t(ga.to[0])),
        ed.consumer, devs, ga.bytes, Collective::AllGather);
    tasks_[id].microBatch = ga.mb;
    owned.push_back(id);
    llvm::SmallVector<TaskId, 8> gemms;
    for (size_t j = 0; j < ga.from.size(); ++j) {
      if (ga.dir == 0) {
        link(pt.fwdOut[(mb * outs + size_t(ed.output)) * size_t(ptiles) +
                       size_t(ga.from[j])],
             id);
        gemms.push_back(ct.fwd[mb * size_t(cper) + size_t(ga.to[j])]);
      } else {
        link(ct.bwdOut[mb * size_t(cper) + size_t(ga.from[j])], id);
        gemms.push_back(pt.bwd[mb * size_t(pper) + size_t(ga.to[j])]);
      }
      link(id, gemms.back());
    }
    // The column-parallel GEMM's forward after it, or the row-parallel
    // one's backward-data.
    overlapTensorParallel(id, devs, ga.dir == 0 ? ed.consumer : ed.producer,
                          gemms);
  }
}

OpId TaskGraph::prefetchAnchor(OpId o, int dir) const {
  int32_t pos = weightedPos_[size_t(o)];
  int32_t a = pos + 2 * dir;
  if (pos < 0 || a < 0 || a >= int32_t(weighted_.size()))
    return -1;
  OpId anchor = weighted_[size_t(a)];
  const Pipeline &p = strategy_.pipeline;
  return p.stage(anchor) == p.stage(o) ? anchor : -1;
}

std::set<ValueId> TaskGraph::weightsTouching(OpId o) const {
  std::set<ValueId> ws;
  auto add = [&](OpId u) {
    if (u < 0)
      return;
    const Op &op = ctx_->graph.op(u);
    for (int i : op.sem.weightInputs)
      ws.insert(op.inputs[size_t(i)]);
  };
  add(o);
  // The ops two weighted ops later (forward) and earlier (backward) wait on
  // o's tasks when their weights are gathered (ZeRO-3).
  if (!strategy_.zero.empty())
    for (int dir : {-1, +1}) {
      int32_t pos = weightedPos_[size_t(o)];
      int32_t u = pos - 2 * dir;
      if (pos >= 0 && u >= 0 && u < int32_t(weighted_.size()) &&
          prefetchAnchor(weighted_[size_t(u)], dir) == o)
        add(weighted_[size_t(u)]);
    }
  return ws;
}

void TaskGraph::removeWeight(ValueId w, std::vector<TaskId> &touched,
                             std::vector<Seconds> &removedReady) {
  for (TaskId t : weightTasks_[w])
    removeTask(t, touched, removedReady);
  weightTasks_[w].clear();
  weightUnits_.erase(w);
  auto it = weightMem_.find(w);
  if (it == weightMem_.end())
    return;
  for (const auto &[d, dm] : it->second) {
    DeviceMemory &m = mem_[d];
    m.weights -= dm.weights;
    m.gradients -= dm.gradients;
    m.optimizer -= dm.optimizer;
  }
  weightMem_.erase(it);
}

/// A weight's synchronisation, update and memory. Each shard group held by
/// several devices is a SyncUnit whose gradients its bucket's collective
/// combines (TaskGraphBuckets.cpp): without ZeRO an all-reduce after the
/// last micro-batch's backward, and every device updates its whole shard.
/// With ZeRO over a group of D devices: the gradients reduce-scattered
/// (once, stage 1; after every micro-batch, stages 2 and 3), each device
/// updates 1/D, and the updated shards all-gathered (stages 1 and 2, by the
/// bucket) or kept sharded and all-gathered here before every micro-batch's
/// forward and backward (stage 3). A group of one device updates its shard
/// after its gradients.
void TaskGraph::buildWeight(ValueId w, std::vector<TaskId> &owned) {
  const Value &wv = ctx_->graph.value(w);
  Bytes eb = dtypeBytes(wv.dtype);
  int zs = weightZeroStage(ctx_->graph, strategy_, w);
  // Every shard (op, input, tile, replica) of the weight with its box.
  struct Shard {
    Box box;
    DeviceId device;
    OpId op;
    /// Every micro-batch's forward, backward (data) and weight-gradient
    /// task (TaskKind::WeightGrad).
    std::vector<TaskId> fwd, bwd, wgrad;
  };
  int32_t m = strategy_.pipeline.microBatches;
  std::vector<Shard> shards;
  for (OpId o : wv.users) {
    const Op &op = ctx_->graph.op(o);
    const OpConfig &c = strategy_.configs[o];
    // Which of the op's weight gradients is this input's.
    size_t ws = opTasks_[o].weightsPer;
    for (size_t i = 0; i < op.inputs.size(); ++i) {
      if (op.inputs[i] != w)
        continue;
      size_t j = ws == 1 ? 0
                         : size_t(std::find(op.sem.weightInputs.begin(),
                                            op.sem.weightInputs.end(), int(i)) -
                                  op.sem.weightInputs.begin());
      for (int64_t k = 0; k < c.numTiles(); ++k) {
        Box b = op.sem.inputRegion(static_cast<int>(i), c.tile(op.sem, k));
        for (int32_t r = 0; r < c.replicas; ++r) {
          Shard sh{b, c.device(k, r), o, {}, {}, {}};
          for (int32_t mb = 0; mb < m && !memoryOnly_; ++mb) {
            size_t t = size_t(mb * c.numTasks() + k * c.replicas + r);
            sh.fwd.push_back(opTasks_[o].fwd[t]);
            sh.bwd.push_back(opTasks_[o].bwd[t]);
            sh.wgrad.push_back(opTasks_[o].wgrad[t * ws + j]);
          }
          shards.push_back(std::move(sh));
        }
      }
    }
  }
  // Shards that overlap hold copies of the same elements (two ops splitting
  // a shared weight differently): their gradients are summed over every
  // device that holds one.
  std::vector<Box> boxes;
  for (const Shard &sh : shards)
    boxes.push_back(sh.box);
  std::vector<size_t> groupOf = overlapGroups(boxes);
  std::vector<std::vector<size_t>> groups;
  for (size_t i = 0; i < shards.size(); ++i) {
    if (groupOf[i] >= groups.size())
      groups.resize(groupOf[i] + 1);
    groups[groupOf[i]].push_back(i);
  }
  uint32_t gi = 0;
  double bw = ctx_->cost.memoryBandwidth();
  WeightBytes per = weightBytes(wv, ctx_->optimizer);
  std::vector<std::pair<DeviceId, DeviceMemory>> &memory = weightMem_[w];
  uint32_t uw = 0x80000000u | uint32_t(w);
  auto subKey = [](uint64_t sub, int32_t mb, uint64_t pass, OpId u = 0) {
    return weightSubKey(sub, mb, pass, u);
  };
  for (const std::vector<size_t> &members : groups) {
    std::vector<DeviceId> devs;
    Bytes bytes = 0;
    // The distinct boxes each device of this graph holds (two ops reading
    // the same shard on one device share it).
    std::map<DeviceId, std::set<std::vector<int64_t>>> held;
    for (size_t i : members) {
      const Shard &sh = shards[i];
      devs.push_back(sh.device);
      bytes = std::max(bytes, sh.box.volume() * eb);
      if (!mine(sh.device))
        continue;
      std::vector<int64_t> bk = sh.box.lo;
      bk.insert(bk.end(), sh.box.hi.begin(), sh.box.hi.end());
      held[sh.device].insert(std::move(bk));
    }
    std::sort(devs.begin(), devs.end());
    devs.erase(std::unique(devs.begin(), devs.end()), devs.end());
    int64_t D = int64_t(devs.size());
    bool sharded = zs > 0 && D > 1;
    auto part = [&](Bytes b, int stage) {
      return sharded && zs >= stage ? (b + D - 1) / D : b;
    };
    for (const auto &[d, bks] : held) {
      int64_t elems = 0;
      for (const std::vector<int64_t> &bk : bks) {
        int64_t v = 1;
        for (size_t l = 0; l < bk.size() / 2; ++l)
          v *= bk[bk.size() / 2 + l] - bk[l];
        elems += v;
      }
      DeviceMemory dm;
      dm.weights = part(elems * per.weight, 3);
      dm.gradients = part(elems * per.gradient, 2);
      dm.optimizer = part(elems * per.optimizer, 1);
      DeviceMemory &mm = mem_[d];
      mm.weights += dm.weights;
      mm.gradients += dm.gradients;
      mm.optimizer += dm.optimizer;
      memory.emplace_back(d, dm);
    }
    if (memoryOnly_ || !foldKeeps(devs)) {
      ++gi;
      continue;
    }
    auto newCollective = [&](CollectiveRole role, uint64_t c, Collective kind,
                             int32_t mb) {
      TaskId id = collective(role, key(TaskKind::Collective, uw, gi, c), -1,
                             devs, bytes, kind);
      tasks_[id].weight = w;
      tasks_[id].microBatch = mb;
      owned.push_back(id);
      return id;
    };
    auto gate = [&](uint64_t sub, int32_t mb) {
      Task t;
      t.kind = TaskKind::Gate;
      t.key = key(TaskKind::Gate, uw, gi, subKey(sub, mb, 0));
      t.weight = w;
      t.microBatch = mb;
      TaskId id = newTask(std::move(t));
      owned.push_back(id);
      return id;
    };
    // Shared by two devices or more: the gradients are combined by the
    // collectives of the unit's bucket (TaskGraphBuckets.cpp), which wait
    // for its gates: gradients ready (after the last micro-batch's, or
    // ZeRO-2/3 after each one's), reduced (the updates wait), and ZeRO-1/2's
    // updated (the all-gather after the step) or gathered (the all-gather
    // overlapped with the next forward, before micro-batch 0's).
    std::optional<SyncUnit> unit;
    if (D > 1) {
      unit.emplace();
      SyncUnit &u = *unit;
      u.group = gi;
      u.devs = devs;
      u.bytes = bytes;
      u.params = bytes / eb;
      u.zero = zs;
      u.firstUser = shards[members[0]].op;
      for (size_t i : members)
        u.firstUser = std::min(u.firstUser, shards[i].op);
      u.stage = strategy_.pipeline.stage(u.firstUser);
      int32_t slots = zs >= 2 ? m : 1;
      for (int32_t mb = 0; mb < slots; ++mb) {
        TaskId g = gate(1, mb);
        for (size_t i : members) {
          if (zs >= 2)
            link(shards[i].wgrad[size_t(mb)], g);
          else
            for (TaskId b : shards[i].wgrad)
              link(b, g);
        }
        u.ready.push_back(g);
      }
      u.reduced = gate(2, 0);
      if (zs == 1 || zs == 2) {
        if (strategy_.gradSync.overlapParamGather) {
          u.gathered = gate(4, 0);
          for (size_t i : members)
            link(u.gathered, shards[i].fwd[0]);
        } else {
          u.updated = gate(3, 0);
        }
      }
    }
    if (sharded && zs == 3) {
      // The whole weight gathered before each of its users' forward and
      // backward of every micro-batch, issued when the op two weighted ops
      // before the user (in that pass's order) has run: it overlaps the op
      // in between.
      std::set<OpId> users;
      for (size_t i : members)
        users.insert(shards[i].op);
      for (OpId u : users)
        for (int32_t mb = 0; mb < m; ++mb)
          for (int pass = 0; pass < 2; ++pass) {
            TaskId ag = newCollective(CollectiveRole::WeightGather,
                                      subKey(3, mb, uint64_t(pass), u),
                                      Collective::AllGather, mb);
            OpId a = prefetchAnchor(u, pass == 0 ? -1 : +1);
            if (a >= 0) {
              const OpTasks &at = opTasks_[size_t(a)];
              int64_t per = strategy_.configs[size_t(a)].numTasks();
              const std::vector<TaskId> &src = pass == 0 ? at.fwd : at.bwd;
              for (int64_t t = 0; t < per; ++t)
                link(src[size_t(mb * per + t)], ag);
            }
            for (size_t i : members)
              if (shards[i].op == u)
                link(ag, pass == 0 ? shards[i].fwd[size_t(mb)]
                                   : shards[i].bwd[size_t(mb)]);
          }
    }
    // The optimizer step: read the gradient, state and weight; write state
    // and weight — of the whole shard, or of 1/D of it under ZeRO.
    Seconds upd = static_cast<double>(part(bytes / eb, 1) * per.update()) / bw +
                  ctx_->cost.device().launchOverhead;
    for (DeviceId d : devs) {
      if (!mine(d))
        continue;
      Task u;
      u.kind = TaskKind::Update;
      u.key = key(TaskKind::Update, uint32_t(w), gi, d);
      u.exe = upd;
      u.resources = {d};
      u.weight = w;
      TaskId id = newTask(std::move(u));
      owned.push_back(id);
      if (unit) {
        link(unit->reduced, id);
        if (unit->updated != kNoTask)
          link(id, unit->updated);
      } else {
        for (size_t i : members)
          if (shards[i].device == d)
            for (TaskId b : shards[i].wgrad)
              link(b, id);
      }
    }
    if (unit)
      weightUnits_[w].push_back(std::move(*unit));
    ++gi;
  }
}

} // namespace soap
