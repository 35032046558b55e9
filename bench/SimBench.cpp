// bench-sim: task-graph size, full-simulation time and delta-simulation time
// per proposal for Inception-v3, NMT and ResNet-101 on 4-64 devices, beside
// FlexFlow Table 5's observation that delta simulation was 2.2-6.9x faster
// than full simulation. Targets: delta >= 10x faster than full at
// 16 devices and >= 30x at 64; >= 10,000 delta-simulated proposals per
// second for Inception-v3 on 16 devices. Asserts nothing.
//   build/bin/bench-sim [--proposals N] [--models inception_v3,nmt,resnet101]
//                       [--devices 4,8,16,32,64] [--out bench/results/sim.json]
//
// Set-up: the model at 64 samples per device, data parallel over the first
// D devices of dgx-h100-8 (64 H100), analytic cost model. A proposal changes
// one random op to a random legal configuration on those D devices (a few
// loops split by divisors, a random contiguous device run), as MCMC does;
// the walk accepts every proposal, so the strategies drift like a search.
// Each proposal is also timed as MCMC makes it (the `mcmc` columns): the
// acceptance threshold of Eq. 1 drawn first (soapc's default beta), the
// delta simulation stopped once the makespan is certain to pass it, and a
// rejected proposal undone; `resim before` is how many tasks an early
// rejection re-simulated first. `shifted tail`: of the tasks every 10th
// delta re-simulated, the share at the end of the timeline that repeats the
// old timeline shifted by the makespan's change, which is the most that
// detecting convergence to the old timeline could save.
#include "BenchArgs.h"
#include "soap/Import/OnnxImporter.h"
#include "soap/Machine/TopologyLoader.h"
#include "soap/Sim/Simulator.h"
#include "soap/Support/Error.h"
#include "soap/Support/Format.h"
#include "soap/Support/Rng.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fmt/format.h>
#include <limits>

using namespace soap;
using Clock = std::chrono::steady_clock;

static double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

static OpConfig randomConfig(const OpSemantics &sem, size_t devices, Rng &rng) {
  OpConfig c;
  c.degree.assign(sem.loops.size(), 1);
  int64_t tiles = 1;
  for (int tries = 0; tries < 3; ++tries) {
    size_t l = rng.uniform(sem.loops.size());
    const LoopDim &loop = sem.loops[l];
    if (!loop.splittable || c.degree[l] > 1 ||
        loop.cls == DimClass::Reduction)
      continue;
    std::vector<int32_t> ok;
    for (int32_t d = 2; tiles * d <= int64_t(devices); d *= 2)
      if (loop.size % d == 0 && (loop.size / d) % loop.granule == 0)
        ok.push_back(d);
    if (ok.empty())
      continue;
    c.degree[l] = ok[rng.uniform(ok.size())];
    tiles *= c.degree[l];
  }
  uint64_t start = rng.uniform(devices - tiles + 1);
  for (int64_t i = 0; i < tiles; ++i)
    c.devices.push_back(static_cast<DeviceId>(start + i));
  return c;
}

/// A timeline's tasks by key: their start and end.
struct KeyedTiming {
  TaskKey key;
  Seconds start, end;
  bool operator<(const KeyedTiming &o) const { return key < o.key; }
};

static std::vector<KeyedTiming> timingsByKey(const TaskGraph &tg) {
  std::vector<KeyedTiming> v;
  for (const Task &t : tg.tasks())
    if (t.alive)
      v.push_back({t.key, t.start, t.end});
  std::sort(v.begin(), v.end());
  return v;
}

/// How many tasks at the end of the new timeline repeat the old timeline
/// shifted by the makespan's change (within a picosecond): the most a delta
/// simulation that noticed it had converged to the old timeline could skip.
static size_t shiftedTail(const TaskGraph &tg,
                          const std::vector<KeyedTiming> &old, Seconds shift) {
  std::vector<const Task *> order;
  for (const Task &t : tg.tasks())
    if (t.alive)
      order.push_back(&t);
  std::sort(order.begin(), order.end(),
            [](const Task *a, const Task *b) { return a->seq < b->seq; });
  size_t tail = 0;
  for (auto it = order.rbegin(); it != order.rend(); ++it, ++tail) {
    const Task &t = **it;
    auto o = std::lower_bound(old.begin(), old.end(),
                              KeyedTiming{t.key, 0, 0});
    if (o == old.end() || !(o->key == t.key) ||
        std::abs(t.start - o->start - shift) > 1e-12 ||
        std::abs(t.end - o->end - shift) > 1e-12)
      break;
  }
  return tail;
}

static OpConfig dataParallelConfig(const OpSemantics &sem, size_t devices) {
  OpConfig c = OpConfig::single(sem, 0);
  for (size_t l = 0; l < sem.loops.size(); ++l)
    if (sem.loops[l].cls == DimClass::Sample && sem.loops[l].splittable &&
        sem.loops[l].size % int64_t(devices) == 0) {
      c.degree[l] = static_cast<int32_t>(devices);
      c.devices.clear();
      for (size_t d = 0; d < devices; ++d)
        c.devices.push_back(static_cast<DeviceId>(d));
      break;
    }
  return c;
}

int main(int argc, char **argv) {
  int proposals = 300;
  std::string out = "bench/results/sim.json";
  // ",a,b," lists (empty: all).
  std::string onlyModels, onlyDevices;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--proposals") && i + 1 < argc)
      proposals = std::max(1, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--out") && i + 1 < argc)
      out = argv[++i];
    else if (!std::strcmp(argv[i], "--models") && i + 1 < argc)
      onlyModels = "," + std::string(argv[++i]) + ",";
    else if (!std::strcmp(argv[i], "--devices") && i + 1 < argc)
      onlyDevices = "," + std::string(argv[++i]) + ",";
    else
      benchUsage("bench-sim [--proposals N] [--models inception_v3,nmt,"
                 "resnet101] [--devices 4,8,16,32,64] [--out FILE]",
                 argv[i]);
  }
  auto excluded = [](const std::string &only, const std::string &name) {
    return !only.empty() && only.find("," + name + ",") == std::string::npos;
  };
  auto topo = loadTopology(std::string(SOAP_SOURCE_DIR) +
                           "/examples/topologies/dgx-h100-8.json");
  if (!topo)
    return reportError(topo.takeError(), "bench-sim");
  CostModel cost(topo->deviceSpec(), nullptr, CostMode::Analytic);
  CollectiveModel coll(*topo);
  Table t({"model", "devices", "tasks", "full ms", "delta ms", "resim tasks",
           "speedup", "proposals/s", "undo ms", "mcmc ms", "rejected early",
           "resim before", "mcmc proposals/s", "shifted tail"},
          {false, true, true, true, true, true, true, true, true, true, true,
           true, true, true});
  Json rows = Json::array();
  for (const char *model : {"inception_v3", "nmt", "resnet101"}) {
    for (size_t devices : {4, 8, 16, 32, 64}) {
      if (excluded(onlyModels, model) ||
          excluded(onlyDevices, std::to_string(devices)))
        continue;
      ImportOptions opts;
      opts.batch = 64 * static_cast<int64_t>(devices);
      auto g = importOnnx(std::string(SOAP_SOURCE_DIR) + "/examples/models/" +
                              model + ".onnx",
                          opts);
      if (!g)
        return reportError(g.takeError(), "bench-sim");
      SimContext ctx{**g, *topo, cost, coll, Optimizer::Sgd};
      Strategy s;
      for (const Op &o : (*g)->ops())
        s.configs.push_back(dataParallelConfig(o.sem, devices));
      auto tg = TaskGraph::build(ctx, s);
      if (!tg)
        return reportError(tg.takeError(), "bench-sim");
      Simulator sim(*tg);
      sim.simulateFull();
      // Walk: every proposal is delta-simulated; every 10th, the same new
      // strategy is also built and simulated from scratch, so full and delta
      // are timed on the same strategies.
      Rng rng(42, model), mcmcRng(7, model);
      size_t resim = 0, tasks = 0;
      double deltaTotal = 0, fullTotal = 0, undoTotal = 0, mcmcTotal = 0;
      int fulls = 0, undos = 0, early = 0;
      size_t earlyResim = 0, shifted = 0, sampledResim = 0;
      for (int p = 0; p < proposals; ++p) {
        OpId o = static_cast<OpId>(rng.uniform((*g)->numOps()));
        OpConfig c = randomConfig((*g)->op(o).sem, devices, rng);
        // First as MCMC decides it (Eq. 1 with soapc's default beta, the
        // threshold drawn first, the simulation stopped once the makespan
        // is certain to pass it, a rejection taken back), then taken back
        // untimed, so the walk below goes on the same.
        Seconds cur = sim.iterationTime();
        double beta = 200.0 / cur, u = mcmcRng.uniformReal();
        Seconds limit = u > 0 ? cur - std::log(u) / beta
                              : std::numeric_limits<Seconds>::infinity();
        auto tm = Clock::now();
        if (auto err = sim.stage(o, c))
          return reportError(std::move(err), "bench-sim");
        std::optional<Seconds> bt = sim.resume(limit);
        if (!bt)
          earlyResim += sim.lastResimulated();
        bool accept = bt && (*bt <= cur || u < std::exp(beta * (cur - *bt)));
        if (!accept)
          if (auto err = sim.undo())
            return reportError(std::move(err), "bench-sim");
        mcmcTotal += since(tm);
        early += !bt;
        if (accept)
          if (auto err = sim.undo())
            return reportError(std::move(err), "bench-sim");
        // Every 10th delta is also compared with the timeline before it.
        std::vector<KeyedTiming> before;
        Seconds beforeTime = sim.iterationTime();
        if (p % 10 == 0)
          before = timingsByKey(*tg);
        auto t0 = Clock::now();
        auto r = sim.apply(o, c);
        deltaTotal += since(t0);
        if (!r)
          return reportError(r.takeError(), "bench-sim");
        resim += sim.lastResimulated();
        if (p % 10 == 0) {
          shifted += std::min(sim.lastResimulated(),
                              shiftedTail(*tg, before, *r - beforeTime));
          sampledResim += sim.lastResimulated();
        }
        tasks += tg->numAlive();
        // A rejected MCMC proposal is taken back: time undo(), then make
        // the change again (untimed) so the walk goes on the same.
        if (p % 2 == 1) {
          auto tu = Clock::now();
          if (auto err = sim.undo())
            return reportError(std::move(err), "bench-sim");
          undoTotal += since(tu);
          ++undos;
          auto again = sim.apply(o, c);
          if (!again)
            return reportError(again.takeError(), "bench-sim");
        }
        s.configs[o] = c;
        if (p % 10 == 0) {
          auto t1 = Clock::now();
          auto fresh = TaskGraph::build(ctx, s);
          if (!fresh)
            return reportError(fresh.takeError(), "bench-sim");
          Simulator fs(*fresh);
          fs.simulateFull();
          fullTotal += since(t1);
          ++fulls;
        }
      }
      double delta = deltaTotal / proposals, full = fullTotal / fulls;
      double undo = undoTotal / std::max(1, undos);
      double mcmc = mcmcTotal / proposals;
      tasks /= proposals;
      t.addRow({model, std::to_string(devices), withCommas(int64_t(tasks)),
                fmt::format("{:.2f}", full * 1e3),
                fmt::format("{:.3f}", delta * 1e3),
                withCommas(int64_t(resim / proposals)),
                fmt::format("{:.1f}x", full / delta),
                withCommas(int64_t(1.0 / delta)),
                fmt::format("{:.3f}", undo * 1e3),
                fmt::format("{:.3f}", mcmc * 1e3),
                fmt::format("{:.0f}%", 100.0 * early / proposals),
                withCommas(int64_t(early ? earlyResim / size_t(early) : 0)),
                withCommas(int64_t(1.0 / mcmc)),
                fmt::format("{:.0f}%", 100.0 * double(shifted) /
                                           double(std::max<size_t>(
                                               1, sampledResim)))});
      rows.push_back({{"model", model},
                      {"devices", devices},
                      {"tasks", tasks},
                      {"full_seconds", full},
                      {"delta_seconds_per_proposal", delta},
                      {"resimulated_tasks_per_proposal", resim / proposals},
                      {"speedup", full / delta},
                      {"undo_seconds", undo},
                      {"mcmc_seconds_per_proposal", mcmc},
                      {"rejected_early", double(early) / proposals},
                      {"resimulated_before_early_rejection",
                       early ? earlyResim / size_t(early) : 0},
                      {"resimulated_share_repeating_old_shifted",
                       double(shifted) /
                           double(std::max<size_t>(1, sampledResim))}});
    }
  }
  t.print(llvm::outs());
  llvm::outs() << "FlexFlow Table 5: delta simulation 2.2-6.9x faster than "
                  "full simulation.\n";
  Json doc = {{"bench", "sim"}, {"proposals", proposals}, {"results", rows}};
  llvm::sys::fs::create_directories(llvm::sys::path::parent_path(out));
  if (auto err = writeFileAtomic(out, dumpJson(doc)))
    return reportError(std::move(err), "bench-sim");
  llvm::outs() << "wrote " << out << "\n";
  return 0;
}
