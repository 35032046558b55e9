// The "ft" searcher and the frontier reports behind `soapc frontier`:
// TensorOpt's modes (section 4.1) over the FT frontier, every point
// re-scored by the simulator, as JSON and as an SVG plot.
#include "soap/Search/Driver.h"
#include "soap/Search/FrontierTracking.h"

#include "soap/Support/Error.h"
#include "soap/Support/Format.h"
#include <algorithm>
#include <chrono>
#include <spdlog/spdlog.h>

namespace soap {

std::optional<FtMode> parseFtMode(llvm::StringRef s) {
  if (s == "frontier")
    return FtMode::Frontier;
  if (s == "mini-time")
    return FtMode::MiniTime;
  if (s == "mini-parallelism")
    return FtMode::MiniParallelism;
  if (s == "profile")
    return FtMode::Profile;
  return std::nullopt;
}

llvm::Expected<FtFrontierReport> frontierReport(const SearchProblem &p,
                                                const FtOptions &o,
                                                size_t maxSimulated,
                                                double memoryCap) {
  auto t0 = std::chrono::steady_clock::now();
  spdlog::info("ft: building the cost model of {} ops", p.graph.numOps());
  auto m = FtModel::build(p, o);
  if (!m)
    return m.takeError();
  if (o.isCancelled())
    return llvm::make_error<DeadlineExceeded>("ft");
  FtResult r = frontierTracking(*m, o);
  if (r.cancelled)
    return llvm::make_error<DeadlineExceeded>("ft");
  FtFrontierReport rep;
  rep.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  rep.devices = m->devices();
  rep.options = o;
  rep.stats = r.stats;
  if (!r.stats.exact())
    spdlog::info("ft: heuristic elimination ran {} time(s); the frontier "
                 "may miss points",
                 r.stats.heuristicEliminations);
  rep.points.resize(r.points.size());
  std::vector<std::optional<SimMetrics>> sims(r.points.size());
  std::vector<std::string> failures(r.points.size());
  for (size_t i = 0; i < r.points.size(); ++i) {
    rep.points[i].point = std::move(r.points[i]);
    rep.points[i].strategy =
        assignmentStrategy(*m, rep.points[i].point.assignment);
    rep.points[i].devices = rep.devices;
  }
  size_t n = rep.points.size();
  // The points to spread over: the first c, in ascending memory (all, or
  // those within memoryCap and at least the least-memory one).
  size_t c = n;
  if (memoryCap > 0) {
    c = std::min<size_t>(1, n);
    while (c < n && rep.points[c].point.costs.memory <= memoryCap)
      ++c;
  }
  std::vector<size_t> pick;
  if (maxSimulated == 0 || c <= maxSimulated) {
    for (size_t i = 0; i < c; ++i)
      pick.push_back(i);
  } else {
    for (size_t j = 0; j < maxSimulated; ++j) {
      size_t i = maxSimulated == 1 ? 0 : j * (c - 1) / (maxSimulated - 1);
      if (pick.empty() || pick.back() != i)
        pick.push_back(i);
    }
  }
  ThreadPool pool(o.threads);
  size_t limit = taskLimit(p);
  std::vector<uint8_t> tooLarge(n, 0), outOfMemory(n, 0);
  pool.parallelFor(pick.size(), [&](size_t j) {
    size_t i = pick[j];
    if (j > 0 && o.isCancelled())
      return; // left unsimulated; the first point always is
    try {
      auto s = strategyMetrics(p, rep.points[i].strategy, limit);
      if (s)
        sims[i] = *s;
      else {
        bool large;
        failures[i] = errorMessage(dropTooLarge(s.takeError(), large));
        tooLarge[i] = large;
      }
    } catch (const std::bad_alloc &) {
      // Under the limit on tasks but past this machine's memory (with the
      // other points simulated at once): the point is left out, as one
      // past the limit is.
      outOfMemory[i] = 1;
    }
  });
  size_t skipped = 0, exhausted = 0;
  for (size_t i : pick) {
    if (outOfMemory[i]) {
      rep.points[i].outOfMemory = true;
      ++exhausted;
      continue;
    }
    if (tooLarge[i]) {
      rep.points[i].tooLarge = true;
      ++skipped;
      continue;
    }
    if (!sims[i] && failures[i].empty())
      continue; // skipped past the deadline
    if (!sims[i])
      return makeError(ExitCode::Internal,
                       "ft: simulating frontier point {}: {}", i, failures[i]);
    rep.points[i].simTime = sims[i]->iterationTime;
    rep.points[i].simPeakMemory = sims[i]->peakMemory;
    rep.points[i].simFits = sims[i]->fits;
    rep.points[i].simulated = true;
  }
  if (skipped)
    spdlog::info("ft: {} frontier point(s) not simulated: their task graphs "
                 "pass {} tasks",
                 skipped, limit);
  if (exhausted)
    spdlog::warn("ft: {} frontier point(s) not simulated: out of memory",
                 exhausted);
  return rep;
}

int miniTimePoint(const FtFrontierReport &r) {
  int best = -1;
  for (size_t i = 0; i < r.points.size(); ++i)
    if (r.points[i].simulated && r.points[i].simFits &&
        (best < 0 || r.points[i].simTime < r.points[size_t(best)].simTime))
      best = int(i);
  return best;
}

FtKnee frontierKnee(const FtFrontierReport &r) {
  FtKnee k;
  size_t n = r.points.size();
  if (n < 3)
    return k;
  const FtCosts &lo = r.points.front().point.costs,
                &hi = r.points.back().point.costs;
  double dm = hi.memory - lo.memory, dt = lo.time - hi.time;
  if (!(dm > 0) || !(dt > 0))
    return k;
  double best = -1;
  for (size_t i = 1; i + 1 < n; ++i) {
    const FtCosts &c = r.points[i].point.costs;
    double below = (lo.time - c.time) / dt - (c.memory - lo.memory) / dm;
    if (below > best) {
      best = below;
      k.index = int(i);
    }
  }
  const FtCosts &c = r.points[size_t(k.index)].point.costs;
  k.slopeBefore = (lo.time - c.time) / (c.memory - lo.memory);
  k.slopeAfter = (c.time - hi.time) / (hi.memory - c.memory);
  k.timeShare = (lo.time - c.time) / dt;
  k.memoryShare = (c.memory - lo.memory) / dm;
  return k;
}

llvm::Expected<std::vector<FtFrontierReport>>
profileReports(const SearchProblem &p, const FtOptions &o,
               size_t maxSimulated) {
  std::vector<FtFrontierReport> out;
  for (size_t n = 1; n <= p.topo.numDevices(); n *= 2) {
    FtOptions on = o;
    on.devices = n;
    auto r = frontierReport(p, on, maxSimulated);
    if (!r)
      return r.takeError();
    out.push_back(std::move(*r));
  }
  return out;
}

size_t recomputedOps(const Strategy &s) {
  size_t n = 0;
  for (uint8_t r : s.recompute)
    n += r != 0;
  return n;
}

size_t zeroOps(const Strategy &s) {
  size_t n = 0;
  for (uint8_t z : s.zero)
    n += z != 0;
  return n;
}

static size_t reusedTensors(const FtPoint &p) {
  size_t n = 0;
  for (uint8_t r : p.assignment.reuse)
    n += r != 0;
  return n;
}

Json frontierJson(const FtFrontierReport &r, const Graph &g,
                  const Topology &topo, Seconds dpTime, Bytes dpMemory) {
  Json j;
  j["model"] = g.name;
  j["topology"] = topo.name();
  j["devices"] = r.devices;
  j["capacity_bytes"] = topo.deviceSpec().memoryBytes;
  j["exact"] = r.stats.exact();
  j["eliminations"] = {{"node", r.stats.nodeEliminations},
                       {"edge", r.stats.edgeEliminations},
                       {"branch", r.stats.branchEliminations},
                       {"heuristic", r.stats.heuristicEliminations}};
  j["backbone_nodes"] = r.stats.backbone;
  j["max_split_loops"] = r.options.maxSplitLoops;
  j["node_mesh"] = r.options.nodeMesh;
  j["resolution"] = r.options.resolution;
  j["tensor_reuse"] = r.options.tensorReuse;
  j["recompute"] = r.options.recompute;
  j["micro_batches"] = r.options.microBatches;
  j["zero"] = r.options.zero;
  j["ldp"] = r.options.useLdp;
  j["configurations"] = r.stats.totalConfigs;
  j["data_parallel"] = dpTime > 0 ? Json{{"sim_time_s", dpTime},
                                         {"sim_peak_memory_bytes", dpMemory}}
                                  : Json(nullptr);
  Json pts = Json::array();
  for (size_t i = 0; i < r.points.size(); ++i) {
    const FtScored &s = r.points[i];
    pts.push_back({{"index", i},
                   {"memory_bytes", s.point.costs.memory},
                   {"peak_memory_bytes", s.point.costs.peakMemory()},
                   {"time_s", s.point.costs.time},
                   {"compute_s", s.point.costs.compute},
                   {"network_s", s.point.costs.network},
                   {"reused_tensors", reusedTensors(s.point)},
                   {"recomputed_ops", recomputedOps(s.strategy)},
                   {"zero_ops", zeroOps(s.strategy)},
                   {"sim_time_s", s.simulated ? Json(s.simTime) : Json()},
                   {"sim_peak_memory_bytes",
                    s.simulated ? Json(s.simPeakMemory) : Json()},
                   {"sim_fits", s.simulated ? Json(s.simFits) : Json()}});
  }
  j["points"] = std::move(pts);
  int mt = miniTimePoint(r);
  j["mini_time"] = mt >= 0 ? Json(mt) : Json(nullptr);
  FtKnee k = frontierKnee(r);
  j["turning_point"] =
      k.index < 0
          ? Json(nullptr)
          : Json{{"index", k.index},
                 {"slope_before_s_per_gib", k.slopeBefore * kBytesPerGiB},
                 {"slope_after_s_per_gib", k.slopeAfter * kBytesPerGiB},
                 {"time_share", k.timeShare},
                 {"memory_share", k.memoryShare}};
  return j;
}

std::string frontierSvg(const FtFrontierReport &r, const Graph &g,
                        Seconds dpTime, Bytes dpMemory) {
  constexpr double W = 640, H = 420, L = 70, R = 20, T = 40, B = 50;
  double maxX = 0, maxY = 0;
  for (const FtScored &s : r.points) {
    maxX = std::max({maxX, s.point.costs.memory, double(s.simPeakMemory)});
    maxY = std::max({maxY, s.point.costs.time, s.simTime});
  }
  if (dpTime > 0) {
    maxX = std::max(maxX, double(dpMemory));
    maxY = std::max(maxY, dpTime);
  }
  maxX = maxX > 0 ? maxX * 1.05 : 1;
  maxY = maxY > 0 ? maxY * 1.05 : 1;
  auto x = [&](double bytes) { return L + (W - L - R) * bytes / maxX; };
  auto y = [&](double sec) { return H - B - (H - T - B) * sec / maxY; };
  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{}\" y=\"20\" font-size=\"14\">Cost frontier: {} on {} "
      "devices</text>\n"
      "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n"
      "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n"
      "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">memory per device "
      "(GiB)</text>\n"
      "<text x=\"15\" y=\"{}\" transform=\"rotate(-90 15 {})\" "
      "text-anchor=\"middle\">iteration time (ms)</text>\n",
      W, H, L, g.name, r.devices, L, H - B, W - R, H - B, L, T, L, H - B,
      (L + W - R) / 2, H - 12, (T + H - B) / 2, (T + H - B) / 2);
  for (int i = 0; i <= 4; ++i) {
    double bx = maxX * i / 4, sy = maxY * i / 4;
    s += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">"
                     "{:.1f}</text>\n"
                     "<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{:.0f}"
                     "</text>\n",
                     x(bx), H - B + 16, bx / kBytesPerGiB, L - 5, y(sy) + 4,
                     sy * 1e3);
  }
  std::string est, sim;
  for (const FtScored &p : r.points) {
    est += fmt::format("{:.1f},{:.1f} ", x(p.point.costs.memory),
                       y(p.point.costs.time));
    if (!p.simulated)
      continue;
    sim += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" "
                       "fill=\"{}\"/>\n",
                       x(double(p.simPeakMemory)), y(p.simTime),
                       p.simFits ? "#ff7f0e" : "gray");
  }
  s += fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"#1f77b4\" "
                   "stroke-width=\"2\"/>\n",
                   est);
  s += sim;
  FtKnee k = frontierKnee(r);
  if (k.index >= 0) {
    const FtCosts &c = r.points[size_t(k.index)].point.costs;
    s += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"6\" "
                     "fill=\"none\" stroke=\"black\"/>\n"
                     "<text x=\"{:.1f}\" y=\"{:.1f}\">turning point</text>\n",
                     x(c.memory), y(c.time), x(c.memory) + 9, y(c.time) - 9);
  }
  if (dpTime > 0)
    s += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"8\" "
                     "height=\"8\" fill=\"#d62728\"/>\n",
                     x(double(dpMemory)) - 4, y(dpTime) - 4);
  s += fmt::format(
      "<text x=\"{}\" y=\"{}\" fill=\"#1f77b4\">line: FT estimate</text>\n"
      "<text x=\"{}\" y=\"{}\" fill=\"#ff7f0e\">dots: simulator</text>\n"
      "<text x=\"{}\" y=\"{}\" fill=\"#d62728\">square: data parallel"
      "</text>\n</svg>\n",
      W - 200, T + 10, W - 200, T + 26, W - 200, T + 42);
  return s;
}

namespace {

/// Points the searcher re-scores with the simulator.
constexpr size_t kSimulatedPoints = 32;
/// The searcher simulates only points whose FT memory is at most this
/// times the device's (and the least-memory one): FT's estimate leaves out
/// workspaces, buffers and a recomputed chain's peak, and on every frontier
/// measured (LeNet, AlexNet, the small ResNet and Transformer, RNNTC, NMT,
/// the 10 GB Transformer: 12 points each; GPT-3 175B on 1,024 GPUs) the
/// simulator's peak came out at or above it (+0.5% to 8x), so a point FT
/// puts past this cannot fit; each point simulated on 1,024 devices takes
/// seconds.
constexpr double kSimulatedMemoryMargin = 1.05;
/// Points re-scored per count where a task graph would have more than
/// kLargeGraphTasks tasks (ops x devices x micro-batches x 2): GPT-3 175B
/// on 1,024 GPUs at 4 micro-batches builds 32 M, 20 s and 3 GB each.
constexpr size_t kSimulatedPointsLarge = 8;
constexpr double kLargeGraphTasks = 8e6;
/// The most micro-batches the searcher tries.
constexpr int32_t kMaxMicroBatches = 256;

/// The weight, gradient and optimizer bytes of every weight the graph
/// trains.
double weightStateBytes(const SearchProblem &p) {
  double b = 0;
  for (const Value &v : p.graph.values())
    if (v.kind == ValueKind::Weight && !v.users.empty())
      b += double(v.shape.numElements().value_or(0)) *
           double(totalWeightBytes(v, p.optimizer));
  return b;
}

class FtSearcher : public Searcher {
public:
  llvm::Expected<SearchResult> search(const SearchProblem &p,
                                      const SearchOptions &so) override {
    if (auto err = so.validate())
      return llvm::Error(std::move(err));
    FtOptions o = FtOptions::fast();
    o.nodeMesh = FtOptions::nodeMeshFor(p.topo);
    o.threads = so.threads;
    o.cancelled = [&so] { return so.pastDeadline(); };
    // Gradient accumulation, as the other searchers fit with it: m = 1,
    // then doubled while no point fits, and once one does until two counts
    // in a row are no faster (or m leaves some op no whole samples). ZeRO
    // stages only where nothing fits without them (they slow FT down).
    std::optional<FtFrontierReport> best, last;
    int bestIdx = -1;
    // A proposal budget bounds the frontier points simulated, over all
    // counts (each count simulates at most kSimulatedPoints).
    uint64_t left = so.budget.proposals ? so.budget.proposals : UINT64_MAX;
    uint64_t simulated = 0; // over every count: the proposals reported
    // Every FT configuration spreads an op over all devices, and splits
    // its weight at most (node mesh) or (devices) ways; without ZeRO a
    // device then holds at least the graph's weight state over that many.
    // Past device memory no count can fit, and the ladder goes to ZeRO at
    // once (GPT-3 175B on 1,024 GPUs: 2.8 TB over 8 is 350 GB); ZeRO
    // spreads it over every device at most.
    double state = weightStateBytes(p);
    double memory = double(p.topo.deviceSpec().memoryBytes);
    double devices = double(p.topo.numDevices());
    if (state / devices > memory)
      return makeError(ExitCode::Infeasible,
                       "{}: the weights, gradients and optimizer state ({}) "
                       "need {} per device even split over all {} devices "
                       "({} available)",
                       p.graph.sourcePath, formatBytes(state),
                       formatBytes(state / devices), p.topo.numDevices(),
                       formatBytes(memory));
    double ways = o.nodeMesh > 0 ? double(o.nodeMesh) : devices;
    bool zeroOnly = state / ways > memory;
    if (zeroOnly)
      spdlog::info("ft: without ZeRO a device holds at least {} of weights, "
                   "gradients and optimizer state ({}-way splits at most); "
                   "ZeRO from the start",
                   formatBytes(state / ways), int64_t(ways));
    for (bool zero : {false, true}) {
      if (zeroOnly && !zero)
        continue;
      o.zero = zero;
      int misses = 0;
      for (int32_t m = 1; m <= kMaxMicroBatches; m *= 2) {
        if (left < 1 && (best || last))
          break; // the budget is spent
        o.microBatches = m;
        double tasks = 2.0 * double(p.graph.numOps()) * devices * double(m);
        size_t per = tasks > kLargeGraphTasks ? kSimulatedPointsLarge
                                              : kSimulatedPoints;
        size_t sims =
            size_t(std::min<uint64_t>(per, std::max<uint64_t>(left, 1)));
        auto r = frontierReport(p, o, sims, kSimulatedMemoryMargin * memory);
        if (!r) {
          if ((m == 1 && zero == zeroOnly) ||
              (!best && r.errorIsA<DeadlineExceeded>()))
            return r.takeError();
          // No configuration at this count, or the deadline: stop here.
          llvm::consumeError(r.takeError());
          break;
        }
        for (const FtScored &pt : r->points) {
          simulated += pt.simulated;
          left -= pt.simulated && left > 0 ? 1 : 0;
        }
        int b = miniTimePoint(*r);
        spdlog::info("ft: {} micro-batch(es){}: {} frontier points, {}", m,
                     zero ? ", ZeRO" : "", r->points.size(),
                     b < 0 ? std::string("none fits")
                           : fmt::format("fastest that fits {:.3f} ms",
                                         r->points[size_t(b)].simTime * 1e3));
        if (b >= 0 && (!best || r->points[size_t(b)].simTime <
                                    best->points[size_t(bestIdx)].simTime)) {
          best = std::move(*r);
          bestIdx = b;
          misses = 0;
        } else {
          if (best && ++misses >= 2)
            break;
          if (!best)
            last = std::move(*r);
        }
        if (so.pastDeadline())
          break;
      }
      if (best || so.pastDeadline() || left < 1)
        break;
    }
    if (!best) {
      const FtFrontierReport *r = &*last;
      // The least the simulator found (FT's least-memory point need not
      // be the simulator's: it does not see a recomputed chain's peak).
      double least = 0;
      for (const FtScored &pt : r->points)
        if (pt.simulated && (least == 0 || double(pt.simPeakMemory) < least))
          least = double(pt.simPeakMemory);
      size_t tooLarge = 0, exhausted = 0;
      for (const FtScored &pt : r->points) {
        tooLarge += pt.tooLarge;
        exhausted += pt.outOfMemory;
      }
      if (tooLarge || exhausted) {
        std::string why =
            exhausted ? fmt::format("{} not simulated: this machine ran out "
                                    "of memory building their task graphs",
                                    exhausted)
                      : fmt::format("{} not simulated: their task graphs "
                                    "pass {} tasks",
                                    tooLarge, taskLimit(p));
        return makeError(ExitCode::Infeasible,
                         "{}: no simulated point of the cost frontier fits in "
                         "device memory ({} points at {} micro-batch(es); {})",
                         p.graph.sourcePath, r->points.size(),
                         r->options.microBatches, why);
      }
      return makeError(ExitCode::Infeasible,
                       "{}: no point of the cost frontier fits in device "
                       "memory ({} points at {} micro-batch(es); the least "
                       "of those simulated needs {} per device, {} "
                       "available)",
                       p.graph.sourcePath, r->points.size(),
                       r->options.microBatches, formatBytes(least),
                       formatBytes(double(p.topo.deviceSpec().memoryBytes)));
    }
    const FtFrontierReport *r = &*best;
    spdlog::info("ft: {} frontier points, {} configurations, backbone {} "
                 "nodes, {:.2f} s",
                 r->points.size(), r->stats.totalConfigs, r->stats.backbone,
                 r->seconds);
    SearchResult res;
    res.timedOut = so.pastDeadline();
    res.strategy = r->points[size_t(bestIdx)].strategy;
    res.iterationTime = r->points[size_t(bestIdx)].simTime;
    // The points simulated, as a budget counts them (not the frontier's
    // size).
    res.proposals = simulated;
    return res;
  }
};

} // namespace

void registerFtSearcher(SearcherRegistry &r) {
  r.add({"ft",
         "TensorOpt's frontier tracking: the (time, memory) Pareto frontier "
         "by eliminations and linear DP; the fastest point that fits",
         [] { return std::make_unique<FtSearcher>(); }});
}

} // namespace soap
