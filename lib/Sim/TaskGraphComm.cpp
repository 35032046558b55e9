// The task graph's communication tasks (FlexFlow section 5.1): the routes
// and ring resources a transfer or collective occupies, collective tasks, and
// a tensor-parallel collective overlapped with its GEMM.
#include "soap/Sim/TaskGraph.h"

#include "TaskGraphDetail.h"
#include <algorithm>

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

} // namespace soap
