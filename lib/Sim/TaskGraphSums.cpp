// Partial sums: tiles that differ only in split loops missing from an
// operand's map hold partial sums of one region (an output's, or an input's
// gradient), combined by an all-reduce — or by a reduce-scatter where each
// task that takes the region needs only its own device's slice of it, as
// Megatron-LM's sequence parallelism runs the row-parallel GEMM's forward
// and the column-parallel GEMM's backward (Korthikanti et al. 2022, "Reducing
// Activation Recomputation in Large Transformer Models", section 4.2.2).
#include "soap/Sim/TaskGraph.h"

#include "TaskGraphDetail.h"
#include <algorithm>
#include <map>

namespace soap {

using namespace detail;

namespace detail {

bool partsTile(const Box &whole, const std::vector<Box> &parts) {
  int64_t n = int64_t(parts.size()), volume = whole.volume();
  if (n < 1 || volume % n != 0)
    return false;
  for (const Box &b : parts)
    if (b.volume() != volume / n || !whole.contains(b))
      return false;
  TileIndex index(parts);
  for (size_t i = 0; i < parts.size(); ++i)
    for (int64_t j : index.candidates(parts[i]))
      if (size_t(j) != i && overlaps(parts[i], parts[size_t(j)]))
        return false;
  return true;
}

} // namespace detail

namespace {

/// Whether the parts of a summed region `whole` (held by `devs`, ascending)
/// that tasks take are one slice per device of `devs`: every part taken on
/// one of them, a device's parts all the same box, every device with one,
/// each of |whole| / n points and no two overlapping (so they tile it).
bool slicesTile(const Box &whole, const std::vector<DeviceId> &devs,
                const std::vector<std::pair<DeviceId, Box>> &parts) {
  size_t n = devs.size();
  if (n < 2)
    return false;
  std::vector<const Box *> slice(n, nullptr);
  for (const auto &[d, b] : parts) {
    auto it = std::lower_bound(devs.begin(), devs.end(), d);
    if (it == devs.end() || *it != d)
      return false;
    const Box *&s = slice[size_t(it - devs.begin())];
    if (!s)
      s = &b;
    else if (!(*s == b))
      return false;
  }
  std::vector<Box> boxes;
  boxes.reserve(n);
  for (const Box *s : slice) {
    if (!s)
      return false;
    boxes.push_back(*s);
  }
  return partsTile(whole, boxes);
}

} // namespace

std::vector<std::vector<int64_t>> TaskGraph::sumGroups(OpId o, bool input,
                                                       int index) const {
  const OpSemantics &sem = ctx_->graph.op(o).sem;
  const OpConfig &c = strategy_.configs[size_t(o)];
  std::vector<bool> free(sem.loops.size(), false);
  bool split = false;
  const TensorMap &map =
      input ? sem.inputs[size_t(index)] : sem.outputs[size_t(index)];
  // (A ring-attention split's K and V gradients come home with the ring,
  // TaskGraphRing.cpp: not partial sums.)
  int ring = input ? ringSplitLoop(sem, c) : -1;
  for (int l : sem.loopsMissingFrom(map))
    if (c.degree[size_t(l)] > 1 && !(l == ring && ringCarries(sem, l, index)))
      free[size_t(l)] = split = true;
  if (!split)
    return {};
  int64_t groups = 0;
  std::vector<int64_t> g = groupTiles(c, free, groups);
  std::vector<std::vector<int64_t>> members(static_cast<size_t>(groups));
  for (int64_t k = 0; k < c.numTiles(); ++k)
    members[size_t(g[size_t(k)])].push_back(k);
  return members;
}

std::vector<std::vector<bool>>
TaskGraph::sumsScatter(OpId o, bool input, int index,
                       const std::vector<std::vector<int64_t>> &members) const {
  const Graph &g = ctx_->graph;
  const Op &op = g.op(o);
  const OpConfig &c = strategy_.configs[size_t(o)];
  int32_t m = strategy_.pipeline.microBatches;
  size_t groups = members.size();
  std::vector<std::vector<bool>> out(size_t(m),
                                     std::vector<bool>(groups, false));
  ValueId v = input ? op.inputs[size_t(index)] : op.outputs[size_t(index)];
  if (v == kNoValue || groups == 0)
    return out;
  const Value &val = g.value(v);
  // The tasks that take the summed region: an output's readers (their
  // input regions), or an input's producer (its output region, which its
  // backward needs the gradient of).
  struct Taker {
    OpId op;
    int operand;
    bool reads;
  };
  std::vector<Taker> takers;
  if (input) {
    if (val.producer < 0)
      return out;
    takers.push_back({val.producer, val.producerOutput, false});
  } else {
    for (size_t e : edgesOfOp_[size_t(o)]) {
      const Edge &ed = edges_[e];
      if (ed.producer == o && ed.output == index)
        takers.push_back({ed.consumer, ed.input, true});
    }
    if (takers.empty())
      return out;
  }
  auto region = [&](OpId x, int operand, bool reads, int64_t k, int32_t mb) {
    const OpSemantics &sem = g.op(x).sem;
    Box tile = microBatchTile(strategy_.configs[size_t(x)], sem, k, mb, m);
    // A ring-split reader takes only its own block (as the edge plan has it).
    return reads ? sem.inputRegionInTensor(
                       operand, sem.ringBlock(operand, tile), val.shape.dims)
                 : sem.outputRegion(operand, tile);
  };
  std::vector<std::vector<DeviceId>> devs(groups);
  for (size_t gi = 0; gi < groups; ++gi)
    devs[gi] = devicesOf(c, members[gi]);
  std::vector<Box> whole(groups);
  std::vector<std::vector<std::pair<DeviceId, Box>>> parts(groups);
  for (int32_t mb = 0; mb < m; ++mb) {
    for (size_t gi = 0; gi < groups; ++gi) {
      whole[gi] = region(o, index, input, members[gi][0], mb);
      parts[gi].clear();
    }
    TileIndex index(whole);
    for (const Taker &t : takers) {
      const OpConfig &tc = strategy_.configs[size_t(t.op)];
      for (int64_t k = 0; k < tc.numTiles(); ++k) {
        Box r = region(t.op, t.operand, t.reads, k, mb);
        for (int64_t gi : index.candidates(r)) {
          if (!overlaps(r, whole[size_t(gi)]))
            continue;
          Box part = r.intersect(whole[size_t(gi)]);
          for (int32_t rep = 0; rep < tc.replicas; ++rep)
            parts[size_t(gi)].emplace_back(tc.device(k, rep), part);
        }
      }
    }
    for (size_t gi = 0; gi < groups; ++gi)
      out[size_t(mb)][gi] = slicesTile(whole[gi], devs[gi], parts[gi]);
  }
  return out;
}

std::vector<TaskId> TaskGraph::sumGemms(OpId o, int32_t mb,
                                        const std::vector<int64_t> &members) {
  const OpTasks &ot = opTasks_[size_t(o)];
  const OpConfig &c = strategy_.configs[size_t(o)];
  int64_t per = c.numTasks();
  std::vector<TaskId> out;
  for (int64_t k : members)
    for (int32_t r = 0; r < c.replicas; ++r)
      out.push_back(ot.fwd[size_t(mb * per + k * c.replicas + r)]);
  return out;
}

void TaskGraph::refreshSums(OpId o, bool input, std::vector<TaskId> &changed) {
  OpTasks &ot = opTasks_[size_t(o)];
  struct Groups {
    std::vector<std::vector<int64_t>> members;
    std::vector<std::vector<bool>> scatter;
  };
  std::map<int32_t, Groups> groups;
  for (const OpTasks::Sum &s : ot.sums) {
    if (s.input != input)
      continue;
    auto it = groups.find(s.index);
    if (it == groups.end()) {
      Groups gs;
      gs.members = sumGroups(o, input, s.index);
      gs.scatter = sumsScatter(o, input, s.index, gs.members);
      it = groups.emplace(s.index, std::move(gs)).first;
    }
    Collective kind = it->second.scatter[size_t(s.mb)][size_t(s.group)]
                          ? Collective::ReduceScatter
                          : Collective::AllReduce;
    Task &t = tasks_[s.task];
    if (t.comm == kind)
      continue;
    // As collective() prices it (one collective: bytes is its size), and
    // an output's after the GEMM as buildOp overlaps it.
    t.comm = kind;
    setExe(s.task, ctx_->collectives.time(kind, s.devs, t.bytes));
    if (!input)
      overlapTensorParallel(
          s.task, s.devs, o,
          sumGemms(o, s.mb, it->second.members[size_t(s.group)]));
    changed.push_back(s.task);
  }
}

} // namespace soap
