// The task graph's weights: each weight's gradient synchronisation, update
// and memory (TaskGraph::buildWeight), and ZeRO-3's gathers before the ops
// that read it.
#include "soap/Sim/TaskGraph.h"

#include "TaskGraphDetail.h"
#include <algorithm>
#include <map>
#include <optional>

namespace soap {

using namespace detail;

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
    std::map<DeviceId, std::set<Box>> held;
    for (size_t i : members) {
      const Shard &sh = shards[i];
      devs.push_back(sh.device);
      bytes = std::max(bytes, sh.box.volume() * eb);
      if (!mine(sh.device))
        continue;
      held[sh.device].insert(sh.box);
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
      for (const Box &b : bks)
        elems += b.volume();
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
