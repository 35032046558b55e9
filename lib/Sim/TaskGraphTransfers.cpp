// The task graph's transfers: for each producer-consumer edge, what each
// consumer tile needs from the producer's tiles on other devices, in both
// passes, or one all-gather of sequence-parallel slices (TaskGraph::buildEdge),
// derived once per kind of edge (TaskGraph::edgePlan).
#include "soap/Sim/TaskGraph.h"

#include "TaskGraphDetail.h"
#include <algorithm>
#include <map>

namespace soap {

using namespace detail;

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
    std::map<Box, std::vector<int64_t>> sources;
    for (int64_t t = 0; t < ptiles; ++t)
      sources[pbox[t]].push_back(t);
    TileIndex index(cbox);
    // Consumer tiles reading one region (they differ only in loops the
    // input's map lacks). Backward, they hold its gradient summed by their
    // all-reduce (TaskGraph::buildOp): a producer task takes it from one of
    // them, the one on its own device when there is one.
    std::map<Box, std::vector<int64_t>> readers;
    std::vector<const std::vector<int64_t> *> readersOf(static_cast<size_t>(ctiles));
    for (int64_t t = 0; t < ctiles; ++t) {
      auto &same = readers[cbox[t]];
      same.push_back(t);
      readersOf[size_t(t)] = &same; // std::map keeps its nodes in place
    }
    std::vector<const std::vector<int64_t> *> srcMembers;
    std::vector<Box> srcBox;
    for (const auto &[box, members] : sources) {
      srcMembers.push_back(&members);
      srcBox.push_back(box);
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
      TileIndex srcIndex(srcBox);
      for (const auto &[q, tiles] : readers) {
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
    for (const auto &[pb, members] : sources) {
      bool bwdGather = bwdGathered[si++];
      for (int64_t kc : index.candidates(pb)) {
        if (!overlaps(pb, cbox[kc]))
          continue;
        Box inter = pb.intersect(cbox[kc]);
        Bytes bytes = inter.volume() * eb;
        // Forward: every replica of the consumer tile needs the region,
        // from the copy on its own device when there is one, else from the
        // holder its replica index picks, so that replica i of a group
        // receives from replica i of the other (Megatron's pipeline sends
        // pair tensor-parallel rank i with rank i, each on its own NIC)
        // rather than every replica from the first.
        int64_t holders = int64_t(members.size()) * prep;
        for (int32_t rc = 0; rc < crep && !fwdGathered[size_t(kc)]; ++rc) {
          DeviceId dst = cc.device(kc, rc);
          int64_t h = (kc * crep + rc) % holders;
          int64_t src = members[size_t(h / prep)];
          int32_t srcRep = int32_t(h % prep);
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
              // The reader on dst, else the one the producer task's index
              // picks (as forward, so the sends spread over the group's
              // devices); only that reader sends.
              int64_t h = (kp * prep + rp) % (int64_t(same.size()) * crep);
              from = same[size_t(h / crep)];
              srcRep = int32_t(h % crep);
              for (int64_t t : same)
                for (int32_t rc = 0; rc < crep; ++rc)
                  if (cc.device(t, rc) == dst && cc.device(from, srcRep) != dst) {
                    from = t;
                    srcRep = rc;
                  }
              if (from != kc)
                continue;
            } else {
              srcRep = int32_t((kp * prep + rp) % crep);
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

} // namespace soap
