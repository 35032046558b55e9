// The per-op configuration space of FlexFlow section 4 (and its superset with
// partial sums and replicas): shapes precomputed per op, placements cached per
// task count, so that MCMC's proposals (section 6.2) cost a few draws.
#include "soap/Parallel/ConfigSpace.h"

#include "soap/Support/Error.h"
#include <algorithm>
#include <cassert>

namespace soap {

llvm::StringRef spaceKindName(SpaceKind k) {
  switch (k) {
  case SpaceKind::FlexFlow:
    return "flexflow";
  case SpaceKind::Full:
    return "full";
  }
  return "?";
}

std::optional<SpaceKind> parseSpaceKind(llvm::StringRef name) {
  if (name == "flexflow")
    return SpaceKind::FlexFlow;
  if (name == "full")
    return SpaceKind::Full;
  return std::nullopt;
}

llvm::Error SpaceOptions::validate() const {
  if (maxReplicas < 1)
    return inputError("--max-replicas must be at least 1, got {}", maxReplicas);
  return llvm::Error::success();
}

ConfigSpace::ConfigSpace(const Graph &g, const Topology &topo,
                         SpaceOptions opts)
    : opts_(opts), numDevices_(topo.numDevices()) {
  assert(numDevices_ >= 1 && "a topology has at least one device");
  // FlexFlow computes every tile once; a bad maxReplicas (validate() not
  // called) still leaves the unsplit shape in the space.
  maxReplicas_ = opts_.kind == SpaceKind::FlexFlow
                     ? 1
                     : std::max<int32_t>(opts_.maxReplicas, 1);
  shapes_.resize(g.numOps());
  sizes_.assign(g.numOps(), 0);
  starts_.resize(numDevices_ + 1);
  std::vector<bool> cached(numDevices_ + 1, false);
  for (const Op &op : g.ops()) {
    buildShapes(op.id, op.sem);
    uint64_t total = 0;
    for (const SplitShape &s : shapes_[op.id]) {
      int64_t tasks = s.second;
      for (int32_t d : s.first)
        tasks *= d;
      if (!cached[tasks]) {
        starts_[tasks] =
            computeStarts(numDevices_, tasks, opts_.arbitraryOffsets);
        cached[tasks] = true;
      }
      total += starts_[tasks].size();
    }
    sizes_[op.id] = total;
  }
}

std::vector<bool> splittableLoops(const OpSemantics &sem, SpaceKind kind) {
  std::vector<bool> allowed(sem.loops.size());
  for (size_t l = 0; l < sem.loops.size(); ++l)
    allowed[l] = sem.loops[l].splittable;
  if (kind == SpaceKind::Full)
    return allowed;
  // FlexFlow splits only dims of an op's output (section 4): a split that
  // leaves partial sums is out. A loop that some output does not index is a
  // partial-sum split too, except a Sample loop (FlexFlow splits the loss by
  // sample; the scalar is all-reduced) and a statistics loop (BatchNorm's
  // spatial dims, the loss's class axis), which the semantics complete with
  // a small all-reduce rather than a partial sum.
  for (size_t l = 0; l < sem.loops.size(); ++l)
    if (sem.loops[l].cls == DimClass::Reduction)
      allowed[l] = false;
  for (size_t j = 0; j < sem.outputs.size(); ++j) {
    if (!sem.outputs[j].present)
      continue;
    for (int l : sem.reducedLoops(static_cast<int>(j))) {
      const LoopDim &loop = sem.loops[l];
      if (loop.cls != DimClass::Sample && !loop.statReduced)
        allowed[l] = false;
    }
  }
  return allowed;
}

void ConfigSpace::buildShapes(OpId o, const OpSemantics &sem) {
  const int64_t n = static_cast<int64_t>(numDevices_);
  std::vector<bool> allowed = splittableLoops(sem, opts_.kind);
  // Legal degrees per loop, ascending, so that the depth-first walk below
  // emits degree vectors in lexicographic order.
  std::vector<std::vector<int32_t>> choices(sem.loops.size());
  for (size_t l = 0; l < sem.loops.size(); ++l) {
    const LoopDim &loop = sem.loops[l];
    choices[l].push_back(1);
    if (!allowed[l])
      continue;
    int64_t granule = std::max<int64_t>(loop.granule, 1);
    for (int64_t d = 2; d <= std::min(loop.size, n); ++d)
      if (loop.size % d == 0 && (loop.size / d) % granule == 0)
        choices[l].push_back(static_cast<int32_t>(d));
  }
  std::vector<SplitShape> &out = shapes_[o];
  std::vector<int32_t> degree(sem.loops.size(), 1);
  // Iterative depth-first walk over loops (no recursion: ops have up to 63
  // loops); idx[l] is the position in choices[l], prod[l] the product of the
  // degrees before loop l.
  size_t numLoops = sem.loops.size();
  std::vector<size_t> idx(numLoops + 1, 0);
  std::vector<int64_t> prod(numLoops + 1, 1);
  auto emit = [&](int64_t tiles) {
    for (int64_t r = 1; r <= maxReplicas_ && tiles * r <= n; ++r)
      out.emplace_back(degree, static_cast<int32_t>(r));
  };
  if (numLoops == 0) {
    emit(1);
    return;
  }
  size_t l = 0;
  idx[0] = 0;
  while (true) {
    if (idx[l] < choices[l].size() && prod[l] * choices[l][idx[l]] <= n) {
      degree[l] = choices[l][idx[l]];
      prod[l + 1] = prod[l] * degree[l];
      if (l + 1 == numLoops) {
        emit(prod[l + 1]);
        ++idx[l];
      } else {
        ++l;
        idx[l] = 0;
      }
      continue;
    }
    // Choices are ascending, so once one overflows the rest do too.
    degree[l] = 1;
    if (l == 0)
      break;
    --l;
    ++idx[l];
  }
}

std::vector<DeviceId> ConfigSpace::computeStarts(size_t numDevices,
                                                 int64_t tasks,
                                                 bool arbitraryOffsets) {
  std::vector<DeviceId> starts;
  int64_t n = static_cast<int64_t>(numDevices);
  if (tasks < 1 || tasks > n)
    return starts;
  for (int64_t s = 0; s + tasks <= n; s += tasks)
    starts.push_back(static_cast<DeviceId>(s));
  if (arbitraryOffsets)
    for (int64_t s = 0; s + tasks <= n; ++s)
      if (s % tasks != 0)
        starts.push_back(static_cast<DeviceId>(s));
  return starts;
}

const std::vector<DeviceId> &
ConfigSpace::startsFor(int64_t tasks, std::vector<DeviceId> &scratch) const {
  if (tasks >= 1 && static_cast<size_t>(tasks) <= numDevices_ &&
      !starts_[tasks].empty())
    return starts_[tasks];
  scratch = computeStarts(numDevices_, tasks, opts_.arbitraryOffsets);
  return scratch;
}

std::vector<std::vector<DeviceId>>
ConfigSpace::placements(int64_t tasks) const {
  std::vector<DeviceId> scratch;
  const std::vector<DeviceId> &starts = startsFor(tasks, scratch);
  std::vector<std::vector<DeviceId>> out;
  out.reserve(starts.size());
  for (DeviceId s : starts) {
    std::vector<DeviceId> devs(static_cast<size_t>(tasks));
    for (int64_t i = 0; i < tasks; ++i)
      devs[i] = s + static_cast<DeviceId>(i);
    out.push_back(std::move(devs));
  }
  return out;
}

std::vector<OpConfig> ConfigSpace::enumerate(OpId o) const {
  std::vector<OpConfig> out;
  out.reserve(sizes_[o]);
  std::vector<DeviceId> scratch;
  for (const SplitShape &s : shapes_[o]) {
    OpConfig c;
    c.degree = s.first;
    c.replicas = s.second;
    int64_t tasks = c.numTasks();
    c.devices.resize(static_cast<size_t>(tasks));
    for (DeviceId start : startsFor(tasks, scratch)) {
      for (int64_t i = 0; i < tasks; ++i)
        c.devices[i] = start + static_cast<DeviceId>(i);
      out.push_back(c);
    }
  }
  return out;
}

OpConfig ConfigSpace::sample(OpId o, Rng &rng) const {
  const std::vector<SplitShape> &shapes = shapes_[o];
  const SplitShape &s = shapes[rng.uniform(shapes.size())];
  OpConfig c;
  c.degree = s.first;
  c.replicas = s.second;
  int64_t tasks = c.numTasks();
  std::vector<DeviceId> scratch;
  const std::vector<DeviceId> &starts = startsFor(tasks, scratch);
  DeviceId start = starts[rng.uniform(starts.size())];
  c.devices.resize(static_cast<size_t>(tasks));
  for (int64_t i = 0; i < tasks; ++i)
    c.devices[i] = start + static_cast<DeviceId>(i);
  return c;
}

bool ConfigSpace::contains(OpId o, const OpConfig &c) const {
  const std::vector<SplitShape> &shapes = shapes_[o];
  SplitShape key(c.degree, c.replicas);
  auto it = std::lower_bound(shapes.begin(), shapes.end(), key);
  if (it == shapes.end() || *it != key)
    return false;
  int64_t tasks = c.numTasks();
  if (c.devices.size() != static_cast<size_t>(tasks))
    return false;
  DeviceId start = c.devices[0];
  if (start + static_cast<uint64_t>(tasks) > numDevices_)
    return false;
  if (!opts_.arbitraryOffsets && start % tasks != 0)
    return false;
  for (int64_t i = 0; i < tasks; ++i)
    if (c.devices[i] != start + static_cast<DeviceId>(i))
      return false;
  return true;
}

} // namespace soap
