// Baseline strategies: data parallelism, layer-wise model parallelism, and
// the expert strategies FlexFlow compares against (section 8.1.1), which
// also seed its MCMC search (section 6.2).
#include "soap/Parallel/BuiltinStrategies.h"

#include "soap/Parallel/ConfigSpace.h"
#include "soap/Support/Error.h"
#include <algorithm>
#include <cmath>
#include <map>
#include <string>

namespace soap {

namespace {

/// The largest degree <= maxDegree that splits `loop` legally (1 if none).
int32_t legalDegree(const LoopDim &loop, int64_t maxDegree) {
  if (!loop.splittable)
    return 1;
  int64_t granule = std::max<int64_t>(loop.granule, 1);
  for (int64_t d = std::min(maxDegree, loop.size); d > 1; --d)
    if (loop.size % d == 0 && (loop.size / d) % granule == 0)
      return static_cast<int32_t>(d);
  return 1;
}

/// The first Sample loop that can be split, and its largest legal degree
/// <= maxDegree; {-1, 1} when there is none.
std::pair<int, int32_t> sampleSplit(const OpSemantics &sem, int64_t maxDegree) {
  for (size_t l = 0; l < sem.loops.size(); ++l)
    if (sem.loops[l].cls == DimClass::Sample) {
      int32_t d = legalDegree(sem.loops[l], maxDegree);
      if (d > 1)
        return {static_cast<int>(l), d};
    }
  return {-1, 1};
}

/// `loop` split `devices.size()` ways, tile k on devices[k].
OpConfig splitOn(const OpSemantics &sem, int loop,
                 std::vector<DeviceId> devices) {
  OpConfig c;
  c.degree.assign(sem.loops.size(), 1);
  if (loop >= 0)
    c.degree[loop] = static_cast<int32_t>(devices.size());
  c.devices = std::move(devices);
  return c;
}

std::vector<DeviceId> firstDevices(int32_t n) {
  std::vector<DeviceId> devs(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i)
    devs[i] = static_cast<DeviceId>(i);
  return devs;
}

OpConfig dataParallelConfig(const OpSemantics &sem, int64_t numDevices) {
  auto [loop, degree] = sampleSplit(sem, numDevices);
  return splitOn(sem, loop, firstDevices(degree));
}

bool isRnnCell(const Op &op) {
  return op.kind == "LSTM" || op.kind == "LSTMCell";
}

/// The layer an LSTM op belongs to: an unrolled cell "<layer>.t<step>"
/// (UnrollRnn.h) is keyed by its layer's name, an LSTM op by its own.
std::string layerKey(const Op &op) {
  llvm::StringRef name = op.name;
  size_t dot = name.rfind(".t");
  if (op.kind == "LSTMCell" && dot != llvm::StringRef::npos &&
      dot + 2 < name.size()) {
    llvm::StringRef step = name.substr(dot + 2);
    if (std::all_of(step.begin(), step.end(),
                    [](char ch) { return ch >= '0' && ch <= '9'; }))
      return name.substr(0, dot).str();
  }
  return op.name;
}

/// Krizhevsky's "one weird trick" (arXiv:1404.5997), as FlexFlow's CNN
/// expert: data parallel for the convolutional part, whose weights are
/// small; parameter parallel for the dense layers, whose weights dominate,
/// and for everything after them.
Strategy oneWeirdTrick(const Graph &g, int64_t n) {
  Strategy s;
  bool dense = false;
  for (const Op &op : g.ops()) {
    if ((op.kind == "Gemm" || op.kind == "MatMul") &&
        !op.sem.weightInputs.empty())
      dense = true;
    OpConfig c = dataParallelConfig(op.sem, n);
    if (dense) {
      // The first Parameter loop that splits n ways and stays in the
      // FlexFlow space, so the baseline is one FlexFlow could find.
      std::vector<bool> ok = splittableLoops(op.sem, SpaceKind::FlexFlow);
      for (size_t l = 0; l < op.sem.loops.size(); ++l)
        if (ok[l] && op.sem.loops[l].cls == DimClass::Parameter &&
            legalDegree(op.sem.loops[l], n) == n) {
          c = splitOn(op.sem, static_cast<int>(l),
                      firstDevices(static_cast<int32_t>(n)));
          break;
        }
    }
    s.configs.push_back(std::move(c));
  }
  return s;
}

/// GNMT's strategy (Wu et al. 2016), as FlexFlow's RNN expert: the whole
/// graph replicated across nodes (a sample split, one device per node) and,
/// inside a node, layers of one depth on one device.
Strategy gnmt(const Graph &g, const Topology &topo) {
  // Devices of each node by local rank.
  std::vector<std::vector<std::pair<uint32_t, DeviceId>>> byNode;
  for (const DeviceInfo &d : topo.devices()) {
    if (d.node >= byNode.size())
      byNode.resize(d.node + 1);
    byNode[d.node].push_back({d.localRank, d.id});
  }
  std::vector<std::vector<DeviceId>> nodeDevs;
  for (auto &devs : byNode) {
    if (devs.empty())
      continue;
    std::sort(devs.begin(), devs.end());
    nodeDevs.emplace_back();
    for (auto &[rank, id] : devs)
      nodeDevs.back().push_back(id);
  }
  const int64_t numNodes = static_cast<int64_t>(nodeDevs.size());

  // Layer of every op: LSTM layers numbered in order of first appearance;
  // an op between the first and the last LSTM takes the deepest layer among
  // its producers (so a Squeeze follows the layer it squeezes).
  int64_t first = -1, last = -1;
  std::map<std::string, int64_t> layerOf;
  std::vector<int64_t> opLayer(g.numOps(), -1);
  for (const Op &op : g.ops()) {
    if (isRnnCell(op)) {
      if (first < 0)
        first = op.id;
      last = op.id;
      auto it = layerOf.emplace(layerKey(op), int64_t(layerOf.size())).first;
      opLayer[op.id] = it->second;
      continue;
    }
    for (ValueId v : op.inputs)
      if (v != kNoValue && g.value(v).producer >= 0)
        opLayer[op.id] = std::max(opLayer[op.id], opLayer[g.value(v).producer]);
  }

  Strategy s;
  for (const Op &op : g.ops()) {
    // Local rank within a node of `gpus` devices.
    auto rankIn = [&](int64_t gpus) -> int64_t {
      if (op.id < first)
        return 0;
      if (op.id > last)
        return gpus - 1;
      return std::max<int64_t>(opLayer[op.id], 0) % gpus;
    };
    auto [loop, degree] = sampleSplit(op.sem, numNodes);
    std::vector<DeviceId> devs;
    for (int32_t k = 0; k < degree; ++k) {
      const std::vector<DeviceId> &node = nodeDevs[k];
      devs.push_back(node[rankIn(static_cast<int64_t>(node.size()))]);
    }
    s.configs.push_back(splitOn(op.sem, loop, std::move(devs)));
  }
  return s;
}

} // namespace

Strategy dataParallel(const Graph &g, const Topology &topo) {
  Strategy s;
  int64_t n = static_cast<int64_t>(topo.numDevices());
  for (const Op &op : g.ops())
    s.configs.push_back(dataParallelConfig(op.sem, n));
  return s;
}

Strategy modelParallel(const Graph &g, const Topology &topo) {
  const int64_t n = static_cast<int64_t>(topo.numDevices());
  const int64_t m = static_cast<int64_t>(g.numOps());
  std::vector<double> flops(m);
  double total = 0;
  for (const Op &op : g.ops()) {
    flops[op.id] = op.sem.tileFlops(Pass::Forward, op.sem.fullTile());
    total += flops[op.id];
  }
  Strategy s;
  double before = 0;
  int64_t prev = 0;
  for (int64_t i = 0; i < m; ++i) {
    // The device whose share of the FLOPs holds this op's midpoint; a
    // zero-FLOP op lands at a boundary, i.e. with a neighbour.
    int64_t target =
        total > 0 ? static_cast<int64_t>(
                        std::floor(double(n) * (before + flops[i] / 2) / total))
                  : i * n / m;
    before += flops[i];
    target = std::min(target, n - 1);
    // Devices advance by at most one per op and, when there are at least n
    // ops, never fall so far behind that the remaining ops could not reach
    // device n-1: then every device gets an op.
    int64_t lo = i == 0 ? 0 : m >= n ? std::max(prev, n - (m - i)) : prev;
    int64_t hi = i == 0 ? 0 : std::min(prev + 1, n - 1);
    int64_t d = std::clamp(target, lo, hi);
    prev = d;
    s.configs.push_back(
        OpConfig::single(g.op(static_cast<OpId>(i)).sem, DeviceId(d)));
  }
  return s;
}

Strategy expertStrategy(const Graph &g, const Topology &topo) {
  bool conv = false, rnn = false;
  for (const Op &op : g.ops()) {
    conv |= op.kind == "Conv";
    rnn |= isRnnCell(op);
  }
  if (rnn)
    return gnmt(g, topo);
  if (conv)
    return oneWeirdTrick(g, static_cast<int64_t>(topo.numDevices()));
  return dataParallel(g, topo);
}

llvm::Expected<Strategy> builtinStrategy(llvm::StringRef name, const Graph &g,
                                         const Topology &topo) {
  if (name == "data")
    return dataParallel(g, topo);
  if (name == "model")
    return modelParallel(g, topo);
  if (name == "expert")
    return expertStrategy(g, topo);
  return inputError("unknown strategy '{}'; the built-in strategies are: "
                    "data, model, expert",
                    name.str());
}

} // namespace soap
