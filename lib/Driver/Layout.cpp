// A plan's layout in Megatron-LM's and DeepSpeed's vocabulary.
#include "soap/Driver/Layout.h"

#include "soap/Parallel/Megatron.h"

#include <algorithm>
#include <fmt/format.h>
#include <map>
#include <set>

namespace soap {

namespace {

/// The product of the degrees of `c` over loops of class `cls`.
int64_t classDegree(const OpSemantics &sem, const OpConfig &c, DimClass cls) {
  int64_t d = 1;
  for (size_t l = 0; l < c.degree.size() && l < sem.loops.size(); ++l)
    if (sem.loops[l].cls == cls)
      d *= c.degree[l];
  return d;
}

bool hasSampleLoop(const OpSemantics &sem) {
  return std::any_of(sem.loops.begin(), sem.loops.end(), [](const LoopDim &l) {
    return l.cls == DimClass::Sample;
  });
}

/// "sample×16", "sample×4 parameter×4", "whole", "parameter×2 replicated×2".
std::string splitWords(const OpSemantics &sem, const OpConfig &c) {
  static const std::pair<DimClass, const char *> kClasses[] = {
      {DimClass::Sample, "sample"},
      {DimClass::Attribute, "attribute"},
      {DimClass::Parameter, "parameter"},
      {DimClass::Reduction, "reduction"}};
  std::string s;
  for (const auto &[cls, name] : kClasses) {
    int64_t d = classDegree(sem, c, cls);
    if (d > 1)
      s += fmt::format("{}{}×{}", s.empty() ? "" : " ", name, d);
  }
  if (c.replicas > 1)
    s += fmt::format("{}replicated×{}", s.empty() ? "" : " ", c.replicas);
  return s.empty() ? "whole" : s;
}

/// How `s` cuts the sequence: the attention's query split (Megatron's
/// context parallelism; 1 without it, 0 without attention), and whether
/// some op cuts it more ways than that, i.e. along the tensor-parallel
/// group too (Megatron's sequence parallelism).
std::pair<int64_t, bool> sequenceSplits(const Graph &g, const Strategy &s) {
  std::vector<int> seq = sequenceLoops(g);
  int64_t attention = 0, most = 0;
  for (const Op &op : g.ops()) {
    int l = seq[size_t(op.id)];
    if (l < 0)
      continue;
    int64_t deg = s.configs[size_t(op.id)].degree[size_t(l)];
    if (isAttentionOp(op))
      attention = std::max(attention, deg);
    most = std::max(most, deg);
  }
  return {attention, attention > 0 && most > attention};
}

std::string scheduleWords(const Pipeline &p) {
  std::string s = p.schedule == PipelineSchedule::GPipe  ? "GPipe"
                  : p.schedule == PipelineSchedule::ZbH1 ? "zero-bubble H1"
                                                         : "1F1B";
  if (p.chunks > 1)
    s = fmt::format("interleaved {}, {} chunks per stage", s, p.chunks);
  return s;
}

/// The sample split d, the devices t of one copy (tensor parallelism), when
/// every op of every device group works on the same t x d devices and splits
/// the batch d ways; 0 otherwise.
std::pair<int64_t, int64_t> uniformShape(const Graph &g, const Strategy &s) {
  int64_t d = 0, w = 0;
  int32_t groups = s.pipeline.numGroups();
  std::vector<std::set<DeviceId>> perGroup(static_cast<size_t>(groups));
  for (const Op &op : g.ops()) {
    const OpConfig &c = s.configs[size_t(op.id)];
    std::vector<DeviceId> set = c.deviceSet();
    auto &gs = perGroup[size_t(s.pipeline.group(s.pipeline.stage(op.id)))];
    gs.insert(set.begin(), set.end());
    if (!hasSampleLoop(op.sem))
      continue;
    int64_t od = classDegree(op.sem, c, DimClass::Sample);
    int64_t ow = int64_t(set.size());
    if (d == 0) {
      d = od;
      w = ow;
    } else if (od != d || ow != w) {
      return {0, 0};
    }
  }
  if (d == 0 || w % d != 0)
    return {0, 0};
  std::set<DeviceId> all;
  for (const auto &gs : perGroup) {
    if (int64_t(gs.size()) != w)
      return {0, 0};
    for (DeviceId x : gs)
      if (!all.insert(x).second)
        return {0, 0}; // two groups share a device
  }
  return {d, w / d};
}

} // namespace

std::string deviceRanges(const std::vector<DeviceId> &ids) {
  std::string out;
  for (size_t i = 0; i < ids.size();) {
    size_t j = i;
    while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1)
      ++j;
    out += out.empty() ? "" : ", ";
    out += j == i ? fmt::format("{}", ids[i])
                  : fmt::format("{}-{}", ids[i], ids[j]);
    i = j + 1;
  }
  return (ids.size() == 1 ? "device " : "devices ") + out;
}

Layout describeLayout(const Graph &g, const Strategy &s, size_t numDevices,
                      int64_t batch) {
  Layout l;
  const Pipeline &pipe = s.pipeline;
  int32_t m = pipe.microBatches, groups = pipe.numGroups();
  auto [d, t] = uniformShape(g, s);
  std::vector<std::string> parts;
  if (d > 0) {
    std::vector<std::string> dims;
    auto [context, sequence] = sequenceSplits(g, s);
    if (context < 2 || t % context != 0)
      context = 1;
    if (t / context > 1)
      dims.push_back(fmt::format("tensor {}{}", t / context,
                                 sequence ? " (sequence parallel)" : ""));
    if (context > 1)
      dims.push_back(fmt::format("context {}", context));
    if (groups > 1) {
      int64_t per = batch / (int64_t(m) * d);
      dims.push_back(fmt::format("pipeline {} ({}, {} micro-batches of {})",
                                 groups, scheduleWords(pipe), m, per));
    }
    if (dims.empty())
      dims.push_back(d > 1 ? fmt::format("data ×{}", d)
                           : std::string("one device"));
    else if (d > 1)
      dims.push_back(fmt::format("data {}", d));
    std::string named;
    for (const std::string &x : dims)
      named += (named.empty() ? "" : " × ") + x;
    parts.push_back(named);
  } else {
    // A SOAP plan: its most common splits, by op count.
    std::map<std::string, size_t> count;
    for (const Op &op : g.ops())
      ++count[splitWords(op.sem, s.configs[size_t(op.id)])];
    std::vector<std::pair<size_t, std::string>> byCount;
    for (const auto &[words, n] : count)
      byCount.emplace_back(n, words);
    std::stable_sort(
        byCount.begin(), byCount.end(),
        [](const auto &a, const auto &b) { return a.first > b.first; });
    std::string per = "per-op: ";
    for (size_t i = 0; i < byCount.size() && i < 3; ++i)
      per += fmt::format("{}{} op{} {}", i ? ", " : "", byCount[i].first,
                         byCount[i].first == 1 ? "" : "s", byCount[i].second);
    if (byCount.size() > 3)
      per += ", …";
    parts.push_back(per);
    if (groups > 1)
      parts.push_back(
          fmt::format("{} pipeline stages ({})", groups, scheduleWords(pipe)));
  }
  if (m > 1 && (groups == 1 || d == 0))
    parts.push_back(fmt::format("{} micro-batches", m));
  std::set<int> stages;
  for (uint8_t z : s.zero)
    if (z)
      stages.insert(z);
  if (!stages.empty()) {
    std::string z = "ZeRO-";
    for (int x : stages)
      z += (z.back() == '-' ? "" : "/") + std::to_string(x);
    parts.push_back(z);
  }
  size_t recomputed = 0, saving = 0;
  for (const Op &op : g.ops()) {
    recomputed += s.recomputes(op.id);
    saving += savesActivations(op.sem);
  }
  if (recomputed > 0)
    parts.push_back(
        recomputed * 10 >= saving * 9
            ? std::string("full recomputation")
            : fmt::format("selective recomputation ({} ops)", recomputed));
  for (const std::string &p : parts)
    l.text += (l.text.empty() ? "" : ", ") + p;

  std::vector<uint8_t> used(numDevices, 0);
  for (const OpConfig &c : s.configs)
    for (DeviceId x : c.devices)
      if (size_t(x) < numDevices)
        used[size_t(x)] = 1;
  for (size_t x = 0; x < numDevices; ++x)
    if (!used[x])
      l.idle.push_back(DeviceId(x));
  if (!l.idle.empty() && d > 0 && t == 1 && groups == 1 &&
      batch % int64_t(numDevices) != 0)
    l.idleWhy = fmt::format("data parallelism splits the batch of {} "
                            "samples {} ways, the most up to {} that divide "
                            "it (a --batch that {} divides uses every device)",
                            batch, d, numDevices, numDevices);
  else if (!l.idle.empty())
    l.idleWhy = "the plan places no op on them";
  return l;
}

std::string idleWarning(const Layout &l, size_t numDevices) {
  if (l.idle.empty())
    return "";
  return fmt::format("{} of {} devices are idle ({}): {}", l.idle.size(),
                     numDevices, deviceRanges(l.idle), l.idleWhy);
}

} // namespace soap
