// A plan's op configurations as DTensor placements (DTensorLayout.h).
#include "DTensorLayout.h"

#include "soap/Emit/EngineLayout.h"
#include <fmt/format.h>
#include <numeric>
#include <set>

namespace soap {

namespace {

/// Ordered factorizations of n into at most three factors > 1; {n} first,
/// then two factors (the first ascending), then three.
std::vector<std::vector<int64_t>> meshShapes(int64_t n) {
  std::vector<std::vector<int64_t>> out = {{n}};
  for (int64_t a = 2; a < n; ++a)
    if (n % a == 0)
      out.push_back({a, n / a});
  for (int64_t a = 2; a < n; ++a)
    for (int64_t b = 2; a * b < n; ++b)
      if (n % (a * b) == 0)
        out.push_back({a, b, n / (a * b)});
  return out;
}

/// The mesh coordinates of position p (row-major).
std::vector<int64_t> coords(const std::vector<int64_t> &mesh, int64_t p) {
  std::vector<int64_t> c(mesh.size());
  for (size_t j = mesh.size(); j-- > 0;) {
    c[j] = p % mesh[j];
    p /= mesh[j];
  }
  return c;
}

/// The tile (loop box) that position `coord` computes when mesh dimension j
/// splits loop loopOfDim[j]: dims of one loop nest in mesh order.
Box tileOf(const OpSemantics &sem, const std::vector<int64_t> &mesh,
           const std::vector<int> &loopOfDim,
           const std::vector<int64_t> &coord) {
  Box t = sem.fullTile();
  for (size_t j = 0; j < mesh.size(); ++j) {
    int l = loopOfDim[j];
    if (l < 0)
      continue;
    int64_t len = (t.hi[size_t(l)] - t.lo[size_t(l)]) / mesh[j];
    t.lo[size_t(l)] += coord[j] * len;
    t.hi[size_t(l)] = t.lo[size_t(l)] + len;
  }
  return t;
}

/// The box of a tensor of `shape` that position `coord` holds under `pl`
/// (DTensor's even chunks, mesh dimensions in order); nullopt where a dim
/// does not divide.
std::optional<Box> localBox(const std::vector<int64_t> &shape,
                            const std::vector<int64_t> &mesh,
                            const Placements &pl,
                            const std::vector<int64_t> &coord) {
  Box b = Box::full(shape);
  for (size_t j = 0; j < mesh.size(); ++j) {
    if (pl[j][0] != 'S')
      continue;
    size_t d = size_t(std::stoi(pl[j].substr(1)));
    int64_t size = b.hi[d] - b.lo[d];
    if (size % mesh[j] != 0)
      return std::nullopt;
    int64_t len = size / mesh[j];
    b.lo[d] += coord[j] * len;
    b.hi[d] = b.lo[d] + len;
  }
  return b;
}

/// The placements of an operand with map `m` (output: a loop it lacks is a
/// partial sum), or the first loop that indexes several of its dims.
struct OperandPlacement {
  Placements pl;
  int badLoop = -1;
};

OperandPlacement operandPlacement(const TensorMap &m,
                                  const std::vector<int> &loopOfDim,
                                  bool output) {
  OperandPlacement r;
  for (int l : loopOfDim) {
    if (l < 0) {
      r.pl.push_back("R");
      continue;
    }
    int dim = -1, hits = 0;
    for (size_t d = 0; d < m.dims.size(); ++d)
      for (const IndexTerm &t : m.dims[d].terms)
        if (t.loop == l && t.coeff != 0) {
          dim = int(d);
          ++hits;
        }
    if (hits > 1 && r.badLoop < 0)
      r.badLoop = l;
    r.pl.push_back(hits == 0 ? (output ? "P" : "R") : fmt::format("S{}", dim));
  }
  return r;
}

/// Whether loop `l` of `op` is the rows of an embedding table: a Gather of
/// a [rows, width] table along axis 0 by a tensor of ids. Split, it is
/// Megatron-LM's vocabulary-parallel embedding, which the runtime computes
/// as a masked lookup into the local rows whose output is a partial sum
/// (dtensor_runtime.py, vocab_parallel_embedding).
bool isTableRowLoop(const Op &op, int l) {
  if (op.kind != "Gather" || op.sem.inputs.size() < 2 ||
      op.sem.inputs[1].dims.empty() || op.sem.inputs[0].dims.size() != 2)
    return false;
  for (const IndexTerm &t : op.sem.inputs[0].dims[0].terms)
    if (t.loop == l && t.coeff != 0)
      return true;
  return false;
}

/// Why DTensor has no sharding rule that computes `op` split along loop
/// `l` as the plan does; empty where it has one.
std::string unsupportedSplit(const Op &op, int l) {
  const LoopDim &loop = op.sem.loops[size_t(l)];
  bool loss = op.kind == "SoftmaxCrossEntropyLoss";
  if (loop.exchangeSteps > 0)
    return fmt::format("no DTensor rule splits a recurrence's state (loop "
                       "'{}')",
                       loop.name);
  if (loop.ring >= 0)
    return fmt::format("no DTensor rule runs ring attention (its query "
                       "sequence, loop '{}', split)",
                       loop.name);
  // The loss combines its statistics itself (a vocabulary-parallel loss).
  if (loop.statReduced && op.kind != "BatchNormalization" && !loss)
    return fmt::format("DTensor has no sharding rule for {} split along the "
                       "axis it normalises (loop '{}')",
                       op.kind, loop.name);
  if (op.kind == "Conv" && loop.cls != DimClass::Sample)
    return fmt::format("DTensor's convolution rule propagates only a split "
                       "batch (loop '{}')",
                       loop.name);
  // The first output is the op's result (the others, statistics).
  bool reduced = false;
  for (int r : op.sem.reducedLoops(0))
    reduced |= r == l;
  bool contraction = op.kind == "MatMul" || op.kind == "Gemm";
  if (reduced && !contraction && !loss && !isTableRowLoop(op, l))
    return fmt::format("DTensor has no rule that leaves {}'s output as "
                       "partial sums (loop '{}' reduced)",
                       op.kind, loop.name);
  return "";
}

std::string assignmentStr(const Op &op, const std::vector<int> &loopOfDim) {
  std::string s;
  for (int l : loopOfDim)
    s += (s.empty() ? "" : ", ") +
         (l < 0 ? std::string("-") : op.sem.loops[size_t(l)].name);
  return "[" + s + "]";
}

/// Every assignment of mesh dimensions to loops (or -1) whose products are
/// `c`'s degrees and replicas, in a fixed order.
std::vector<std::vector<int>> assignments(const OpConfig &c,
                                          const std::vector<int64_t> &mesh) {
  std::vector<std::vector<int>> out;
  size_t loops = c.degree.size();
  std::vector<int> a(mesh.size(), -1);
  size_t total = 1;
  for (size_t j = 0; j < mesh.size(); ++j)
    total *= loops + 1;
  for (size_t code = 0; code < total; ++code) {
    size_t x = code;
    for (size_t j = 0; j < mesh.size(); ++j) {
      a[j] = int(x % (loops + 1)) - 1;
      x /= loops + 1;
    }
    std::vector<int64_t> prod(loops, 1);
    int64_t reps = 1;
    for (size_t j = 0; j < mesh.size(); ++j)
      (a[j] < 0 ? reps : prod[size_t(a[j])]) *= mesh[j];
    bool ok = reps == c.replicas;
    for (size_t l = 0; l < loops && ok; ++l)
      ok = prod[l] == c.degree[l];
    if (ok)
      out.push_back(a);
  }
  return out;
}

/// Whether assignment `a` puts every tile on the device the plan gives it.
bool devicesMatch(const OpConfig &c, const std::vector<int64_t> &mesh,
                  const std::vector<int> &a,
                  const std::vector<DeviceId> &group) {
  int64_t n = std::accumulate(mesh.begin(), mesh.end(), int64_t(1),
                              std::multiplies<>());
  for (int64_t p = 0; p < n; ++p) {
    std::vector<int64_t> co = coords(mesh, p);
    std::vector<int64_t> tc(c.degree.size(), 0);
    int64_t rep = 0;
    for (size_t j = 0; j < mesh.size(); ++j) {
      if (a[j] < 0)
        rep = rep * mesh[j] + co[j];
      else
        tc[size_t(a[j])] = tc[size_t(a[j])] * mesh[j] + co[j];
    }
    int64_t k = 0;
    for (size_t l = 0; l < c.degree.size(); ++l)
      k = k * c.degree[l] + tc[l];
    if (c.device(k, int32_t(rep)) != group[size_t(p)])
      return false;
  }
  return true;
}

/// The placements of `op` under assignment `a`, dropping (to replicated)
/// each loop DTensor cannot compute as split; `why` gets the first reason.
OpPlacement placeOp(const Op &op, const std::vector<int64_t> &mesh,
                    std::vector<int> a, std::string &why) {
  auto drop = [&](int l, const std::string &reason) {
    for (int &x : a)
      if (x == l)
        x = -1;
    if (why.empty())
      why = reason;
  };
  for (size_t j = 0; j < a.size(); ++j)
    if (a[j] >= 0) {
      std::string r = unsupportedSplit(op, a[j]);
      if (!r.empty())
        drop(a[j], r);
    }
  // soapc splits a padded vocabulary (plans.md, vocab_padding) into
  // ceil-sized tiles, the last shorter; the layout here, and the
  // collectives it predicts, take DTensor's shards to be equal.
  for (size_t j = 0; j < a.size(); ++j) {
    int l = a[j];
    if (l < 0)
      continue;
    int64_t ways = 1;
    for (size_t k = 0; k < a.size(); ++k)
      if (a[k] == l)
        ways *= mesh[k];
    int64_t size = op.sem.loops[size_t(l)].size;
    if (size % ways == 0)
      continue;
    drop(l, isTableRowLoop(op, l)
                ? fmt::format("its table's {} rows split {} ways leave a "
                              "shorter last shard (a padded vocabulary); the "
                              "DTensor target splits a vocabulary-parallel "
                              "embedding only evenly",
                              size, ways)
                : fmt::format("loop '{}' ({}) splits {} ways with a shorter "
                              "last tile (a padded vocabulary); the DTensor "
                              "target splits only evenly",
                              op.sem.loops[size_t(l)].name, size, ways));
  }
  int64_t n = std::accumulate(mesh.begin(), mesh.end(), int64_t(1),
                              std::multiplies<>());
  for (;;) {
    OpPlacement p;
    p.loopOfDim = a;
    int bad = -1;
    auto check = [&](const TensorMap &m, bool output, int index) {
      if (!m.present)
        return Placements{};
      OperandPlacement o = operandPlacement(m, a, output);
      if (o.badLoop >= 0 && bad < 0)
        bad = o.badLoop;
      for (int64_t q = 0; q < n && bad < 0; ++q) {
        std::vector<int64_t> co = coords(mesh, q);
        Box tile = tileOf(op.sem, mesh, a, co);
        Box want = output ? op.sem.outputRegion(index, tile)
                          : op.sem.inputRegion(index, tile);
        // A rank holds what its tile reads: exactly along a dim its
        // placement shards, whole along the others (a strided window may
        // read less of them).
        auto have = localBox(m.shape, mesh, o.pl, co);
        bool holds = have && have->contains(want);
        for (size_t j = 0; holds && j < o.pl.size(); ++j)
          if (o.pl[j][0] == 'S') {
            size_t d = size_t(std::stoi(o.pl[j].substr(1)));
            holds = have->lo[d] == want.lo[d] && have->hi[d] == want.hi[d];
          }
        if (!holds)
          for (int l : a)
            if (l >= 0 && bad < 0)
              bad = l;
      }
      return o.pl;
    };
    for (size_t i = 0; i < op.sem.inputs.size(); ++i)
      p.inputs.push_back(check(op.sem.inputs[i], false, int(i)));
    for (size_t j = 0; j < op.sem.outputs.size(); ++j)
      p.outputs.push_back(check(op.sem.outputs[j], true, int(j)));
    if (bad < 0)
      return p;
    drop(bad, fmt::format("its tiles along loop '{}' read regions no DTensor "
                          "placement holds (a halo, or a dim the loop "
                          "indexes twice)",
                          op.sem.loops[size_t(bad)].name));
  }
}

/// The placements of `op` on `mesh` over `group`, and whether they are the
/// plan's exactly.
OpPlacement mapOp(const Op &op, const OpConfig &c,
                  const std::vector<int64_t> &mesh,
                  const std::vector<DeviceId> &group, bool &exact) {
  std::vector<std::vector<int>> cands = assignments(c, mesh);
  std::string why;
  std::vector<int> a(mesh.size(), -1);
  exact = false;
  for (const auto &x : cands)
    if (devicesMatch(c, mesh, x, group)) {
      a = x;
      exact = true;
      break;
    }
  if (!exact && !cands.empty()) {
    a = cands.front();
    why = fmt::format("its devices ({}) are not the mesh's order for that "
                      "split",
                      c.str(op.sem));
  } else if (!exact) {
    why = fmt::format("its configuration ({}) is no split of the mesh "
                      "[{}]; DTensor runs every op on the whole mesh",
                      c.str(op.sem), fmt::join(mesh, ", "));
  }
  OpPlacement p = placeOp(op, mesh, a, why);
  if (!why.empty()) {
    exact = false;
    p.fallback =
        fmt::format("{}; runs as {}", why, assignmentStr(op, p.loopOfDim));
  }
  return p;
}

} // namespace

std::string placementsStr(const Placements &p) {
  std::string s;
  for (const std::string &x : p)
    s += (s.empty() ? "" : ", ") +
         (x == "R"   ? std::string("Replicate()")
          : x == "P" ? std::string("Partial()")
                     : fmt::format("Shard({})", x.substr(1)));
  return s;
}

llvm::Expected<DTensorLayout> dtensorLayout(const EmitContext &c) {
  const Graph &g = c.graph;
  const Strategy &s = c.strategy;
  DTensorLayout out;
  int32_t groups = s.pipeline.numGroups();
  if (s.pipeline.numStages() <= 1) {
    std::vector<DeviceId> all;
    for (size_t d = 0; d < c.topo.numDevices(); ++d)
      all.push_back(DeviceId(d));
    out.groups.push_back(all);
  } else {
    std::vector<std::set<DeviceId>> sets(static_cast<size_t>(groups));
    for (const Op &op : g.ops())
      for (DeviceId d : s.configs[size_t(op.id)].devices)
        sets[size_t(s.pipeline.group(s.pipeline.stage(op.id)))].insert(d);
    for (const auto &set : sets)
      out.groups.emplace_back(set.begin(), set.end());
    for (const auto &grp : out.groups)
      if (grp.size() != out.groups.front().size())
        return planError(c, "/pipeline/stages",
                         fmt::format("device groups of {} and {} devices; "
                                     "a DTensor program runs every stage on "
                                     "a mesh of one shape",
                                     out.groups.front().size(), grp.size()));
  }
  int64_t size = int64_t(out.groups.front().size());
  // The mesh shape that runs the most ops as the plan has them; the first
  // such (fewest dimensions) among equals.
  int64_t best = -1;
  for (const auto &mesh : meshShapes(size)) {
    DTensorLayout l;
    l.mesh = mesh;
    int64_t exactOps = 0;
    for (const Op &op : g.ops()) {
      bool exact = false;
      const auto &grp =
          out.groups[size_t(s.pipeline.group(s.pipeline.stage(op.id)))];
      l.ops.push_back(mapOp(op, s.configs[size_t(op.id)], mesh, grp, exact));
      exactOps += exact;
    }
    if (exactOps > best) {
      best = exactOps;
      out.mesh = l.mesh;
      out.ops = std::move(l.ops);
    }
  }
  return out;
}

} // namespace soap
