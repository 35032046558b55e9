// Gradient buckets (Megatron-Core's DistributedDataParallel, GradSync): the
// weight gradients of consecutive shard groups, in the order their backward
// completes them, combined by one collective per bucket, and ZeRO-1/2's
// updated weights all-gathered per bucket, after the step or overlapped
// with the next iteration's forward.
#include "soap/Sim/TaskGraph.h"

#include "TaskGraphDetail.h"
#include <algorithm>
#include <limits>
#include <map>
#include <tuple>

namespace soap {

using namespace detail;

const TaskGraph::SyncUnit &TaskGraph::syncUnit(UnitId id) const {
  const std::vector<SyncUnit> &units = weightUnits_.at(id.first);
  for (const SyncUnit &u : units)
    if (u.group == id.second)
      return u;
  assert(false && "a bucket member without its unit");
  return units.front();
}

/// Megatron-Core's bucketing (ParamAndGradBuffer): per data-parallel group
/// and model chunk, parameters in reverse order (the order backward
/// completes their gradients) fill a bucket until it holds at least
/// bucket_size of them; the next starts a new one. Here a sequence is the
/// units of one pipeline stage, ZeRO stage and device group, ordered by
/// their lowest user, highest first (an op's backward completes the
/// gradients of the weights whose last use it is), ties by weight and group.
/// Without overlapGradReduce Megatron sets bucket_size to None: one bucket;
/// and it buckets only the first pipeline stage's first model chunk.
std::vector<std::vector<std::vector<TaskGraph::UnitId>>>
TaskGraph::assignBuckets() const {
  using SeqKey = std::tuple<int32_t, int, std::vector<DeviceId>>;
  struct Entry {
    OpId firstUser;
    UnitId id;
    int64_t params;
  };
  std::map<SeqKey, std::vector<Entry>> seqs;
  for (const auto &[w, units] : weightUnits_)
    for (const SyncUnit &u : units)
      seqs[SeqKey(u.stage, u.zero, u.devs)].push_back(
          {u.firstUser, {w, u.group}, u.params});
  const GradSync &gs = strategy_.gradSync;
  std::vector<std::vector<std::vector<UnitId>>> out;
  for (auto &[k, entries] : seqs) {
    std::sort(entries.begin(), entries.end(),
              [](const Entry &a, const Entry &b) {
                if (a.firstUser != b.firstUser)
                  return a.firstUser > b.firstUser;
                if (a.id.first != b.id.first)
                  return a.id.first > b.id.first;
                return a.id.second < b.id.second;
              });
    int32_t stage = std::get<0>(k);
    const std::vector<DeviceId> &devs = std::get<2>(k);
    int64_t cap = gs.overlapGradReduce && stage == 0
                      ? gs.bucketParamsFor(int64_t(devs.size()))
                      : std::numeric_limits<int64_t>::max();
    std::vector<std::vector<UnitId>> seq;
    int64_t held = 0;
    for (const Entry &e : entries) {
      if (seq.empty() || held >= cap) {
        seq.emplace_back();
        held = 0;
      }
      seq.back().push_back(e.id);
      held += e.params;
    }
    out.push_back(std::move(seq));
  }
  return out;
}

std::vector<std::vector<TaskId>> TaskGraph::rankTasks(int32_t mb) const {
  std::vector<std::vector<TaskId>> on(ctx_->topo.numDevices());
  for (size_t o = 0; o < opTasks_.size(); ++o) {
    const OpTasks &ot = opTasks_[o];
    int64_t per = strategy_.configs[o].numTasks();
    auto add = [&](const std::vector<TaskId> &v, int64_t n) {
      for (int64_t i = mb * n; i < (mb + 1) * n && size_t(i) < v.size(); ++i)
        if (v[size_t(i)] != kNoTask)
          on[tasks_[v[size_t(i)]].resources[0]].push_back(v[size_t(i)]);
    };
    add(ot.bwd, per);
    if (ot.splitWeight)
      add(ot.wgrad, per * int64_t(ot.weightsPer));
  }
  return on;
}

void TaskGraph::buildBucket(const std::vector<UnitId> &members,
                            const RankTasks &rank) {
  const SyncUnit &first = syncUnit(members[0]);
  Bytes bytes = 0;
  for (UnitId id : members)
    bytes += syncUnit(id).bytes;
  const std::vector<DeviceId> &devs = first.devs;
  int zs = first.zero;
  int32_t m = strategy_.pipeline.microBatches;
  Bucket &bk = buckets_[members[0]];
  bk.members = members;
  bk.devs = devs;
  bk.tasks.clear();
  bk.gather = kNoTask;
  // Keyed by its first member as that unit's own collectives were: a
  // bucket of one unit is the per-weight collective it replaces.
  uint32_t a = 0x80000000u | uint32_t(members[0].first), b = members[0].second;
  auto newCollective = [&](CollectiveRole role, uint64_t c, Collective kind,
                           int32_t mb) {
    TaskId id = collective(role, key(TaskKind::Collective, a, b, c), -1, devs,
                           bytes, kind);
    tasks_[id].weight = members[0].first;
    tasks_[id].microBatch = mb;
    bk.tasks.push_back(id);
    return id;
  };
  bool overlap = strategy_.gradSync.overlapGradReduce;
  int32_t slots = zs >= 2 ? m : 1;
  for (int32_t slot = 0; slot < slots; ++slot) {
    TaskId sync =
        zs == 0 ? newCollective(CollectiveRole::WeightGrad, 0,
                                Collective::AllReduce, 0)
                : newCollective(CollectiveRole::WeightGrad,
                                weightSubKey(1, slot, 0),
                                Collective::ReduceScatter, slot);
    for (UnitId id : members) {
      const SyncUnit &u = syncUnit(id);
      link(u.ready[size_t(slot)], sync);
      link(sync, u.reduced);
    }
    if (!overlap) {
      // After the device's backward pass (of the last micro-batch, or under
      // ZeRO-2/3 of this one) has ended on every device of the group.
      const std::vector<std::vector<TaskId>> &on =
          rank(zs >= 2 ? slot : m - 1);
      for (DeviceId d : devs)
        for (TaskId t : on[d])
          link(t, sync);
    }
  }
  if (zs == 1 || zs == 2) {
    bk.gather = newCollective(CollectiveRole::WeightGather,
                              weightSubKey(2, 0, 0), Collective::AllGather, 0);
    for (UnitId id : members) {
      const SyncUnit &u = syncUnit(id);
      if (u.gathered != kNoTask)
        link(bk.gather, u.gathered);
      else
        link(u.updated, bk.gather);
    }
  }
}

/// With overlapParamGather the all-gathers of a device group run one after
/// another in forward order from the start of the iteration, each before
/// the first forward that reads its weights; the previous iteration's
/// update is taken as done. That is the steady state exactly: iterations
/// are alike and Megatron's optimizer step ends one before the next
/// begins, so the iteration time is from the first all-gather (at the
/// start) to the last update, the all-gathers overlapping the forward up
/// to their first use. Megatron dispatches bucket k + 1's all-gather when
/// the forward reaches bucket k, which on one stream is after all-gather k
/// ends: the same start whenever an all-gather takes longer than its
/// bucket's forward (when the overlap is short of hiding it); otherwise an
/// all-gather here runs ahead of its dispatch, and nothing waits for it
/// either way. (With model chunks, Megatron dispatches chunk c + 1's when
/// chunk c's first forward starts; here it follows chunk c's all-gathers.)
void TaskGraph::buildBuckets(const std::set<ValueId> *ws,
                             const std::vector<DeviceId> &devs,
                             std::vector<TaskId> &touched,
                             std::vector<Seconds> &removedReady,
                             std::vector<TaskId> *changed) {
  std::vector<std::vector<std::vector<UnitId>>> seqs = assignBuckets();
  std::map<UnitId, const std::vector<UnitId> *> fresh;
  for (const auto &seq : seqs)
    for (const auto &bucket : seq)
      fresh.emplace(bucket[0], &bucket);
  bool overlap = strategy_.gradSync.overlapGradReduce;
  auto affected = [&](const Bucket &bk) {
    if (!ws)
      return true;
    for (UnitId id : bk.members)
      if (ws->count(id.first))
        return true;
    // Without overlap a bucket waits for every task of its devices.
    if (!overlap)
      for (DeviceId d : devs)
        if (std::binary_search(bk.devs.begin(), bk.devs.end(), d))
          return true;
    return false;
  };
  std::vector<UnitId> gone;
  for (const auto &[k, bk] : buckets_) {
    auto it = fresh.find(k);
    if (it != fresh.end() && *it->second == bk.members && !affected(bk))
      continue;
    for (TaskId t : bk.tasks)
      removeTask(t, touched, removedReady);
    gone.push_back(k);
  }
  for (UnitId k : gone)
    buckets_.erase(k);
  std::map<int32_t, std::vector<std::vector<TaskId>>> rankCache;
  RankTasks rank = [&](int32_t mb) -> const std::vector<std::vector<TaskId>> & {
    auto it = rankCache.find(mb);
    if (it == rankCache.end())
      it = rankCache.emplace(mb, rankTasks(mb)).first;
    return it->second;
  };
  // The all-gathers of one device group and ZeRO stage, in forward order:
  // stage by stage (seqs are in stage order), each stage's buckets in the
  // reverse of their gradient order.
  std::map<std::pair<int, std::vector<DeviceId>>, std::vector<TaskId>> chains;
  for (const auto &seq : seqs) {
    for (const auto &bucket : seq) {
      if (buckets_.count(bucket[0]))
        continue;
      buildBucket(bucket, rank);
      if (changed) {
        const std::vector<TaskId> &ts = buckets_[bucket[0]].tasks;
        changed->insert(changed->end(), ts.begin(), ts.end());
      }
    }
    const SyncUnit &u = syncUnit(seq[0][0]);
    std::vector<TaskId> &chain = chains[{u.zero, u.devs}];
    for (size_t i = seq.size(); i-- > 0;)
      if (TaskId g = buckets_[seq[i][0]].gather; g != kNoTask)
        chain.push_back(g);
  }
  if (!strategy_.gradSync.overlapParamGather)
    return;
  // One after another, as on one communication stream. A link already made
  // stays; one to an all-gather no longer next is redundant (the chain
  // between them orders the two the same way: the order of kept buckets
  // never changes).
  for (const auto &[k, chain] : chains)
    for (size_t i = 1; i < chain.size(); ++i) {
      const TaskList &succs = tasks_[chain[i - 1]].succs;
      if (std::find(succs.begin(), succs.end(), chain[i]) == succs.end())
        link(chain[i - 1], chain[i]);
    }
}

} // namespace soap
