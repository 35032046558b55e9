// soapc frontier: TensorOpt's cost frontier of iteration time against
// memory per device (frontier tracking) and its modes (section 4.1), every
// point re-scored by the simulator.
#include "soap/Driver/Commands.h"
#include "soap/Driver/Session.h"

#include "soap/Parallel/BuiltinStrategies.h"
#include "soap/Search/Driver.h"
#include "soap/Search/FrontierTracking.h"
#include "soap/Support/Cores.h"
#include "soap/Support/Error.h"
#include "soap/Support/Format.h"
#include "soap/Support/Interrupt.h"

#include <chrono>

namespace soap {

static void printFrontier(const FtFrontierReport &r, const SimMetrics &dp,
                          int chosen) {
  llvm::outs() << fmt::format(
      "frontier on {} devices{}: {} points, {} (eliminations: node {}, "
      "edge {}, branch {}, heuristic {}; backbone {} nodes; {} "
      "configurations; {:.2f} s)\n",
      r.devices,
      r.options.nodeMesh ? fmt::format(" (node mesh: tensor parallel up to {})",
                                       r.options.nodeMesh)
                         : std::string(),
      r.points.size(),
      !r.stats.exact() ? std::string("heuristic elimination used, may miss "
                                     "points")
      : r.options.resolution > 0
          ? fmt::format("exact eliminations, {:g}% resolution",
                        r.options.resolution * 100)
          : std::string("exact"),
      r.stats.nodeEliminations, r.stats.edgeEliminations,
      r.stats.branchEliminations, r.stats.heuristicEliminations,
      r.stats.backbone, r.stats.totalConfigs, r.seconds);
  llvm::outs() << fmt::format("{:>5} {:>12} {:>12} {:>11} {:>11} {:>11} "
                              "{:>6} {:>6} {:>5} {:>11} {:>12} {:>4}\n",
                              "point", "memory(FT)", "peak(FT)", "time(FT)",
                              "compute",
                              "network", "reuse", "recomp", "zero", "time(sim)",
                              "memory(sim)", "fits");
  for (size_t i = 0; i < r.points.size(); ++i) {
    const FtScored &p = r.points[i];
    size_t reused = 0;
    for (uint8_t x : p.point.assignment.reuse)
      reused += x != 0;
    llvm::outs() << fmt::format(
        "{:>5} {:>12} {:>12} {:>8.3f} ms {:>8.3f} ms {:>8.3f} ms {:>6} {:>6} "
        "{:>5} {:>11} {:>12} {:>4}{}\n",
        i, formatBytes(p.point.costs.memory),
        formatBytes(p.point.costs.peakMemory()), p.point.costs.time * 1e3,
        p.point.costs.compute * 1e3, p.point.costs.network * 1e3, reused,
        recomputedOps(p.strategy), zeroOps(p.strategy),
        p.simulated ? fmt::format("{:.3f} ms", p.simTime * 1e3) : "-",
        p.simulated ? formatBytes(double(p.simPeakMemory)) : "-",
        !p.simulated ? "-"
        : p.simFits  ? "yes"
                     : "no",
        int(i) == chosen ? "  <- chosen" : "");
  }
  FtKnee k = frontierKnee(r);
  if (k.index >= 0)
    llvm::outs() << fmt::format(
        "turning point: point {} ({}, {:.3f} ms): {:.0f}% of the time gained "
        "from the least-memory to the fastest point within the first {:.0f}% "
        "of the memory range; {:.3f} ms per GiB before, {:.3f} after\n",
        k.index, formatBytes(r.points[size_t(k.index)].point.costs.memory),
        r.points[size_t(k.index)].point.costs.time * 1e3, k.timeShare * 100,
        k.memoryShare * 100, k.slopeBefore * kBytesPerGiB * 1e3,
        k.slopeAfter * kBytesPerGiB * 1e3);
  llvm::outs() << fmt::format(
      "data parallel (simulator): {:.3f} ms, {} per device{}\n",
      dp.iterationTime * 1e3, formatBytes(double(dp.peakMemory)),
      dp.fits ? "" : " (does not fit)");
}

/// soapc frontier: TensorOpt's cost frontier and its modes (section 4.1).
llvm::Error runFrontier(const DriverOptions &d) {
  for (auto [flag, path] :
       {std::pair<const char *, const std::string *>{"-o", &d.outputPath},
        {"--write-json", &d.ftJsonPath},
        {"--svg", &d.ftSvgPath}})
    if (auto err = checkOutputPath(flag, *path))
      return err;
  auto su = Session::open(d);
  if (!su)
    return su.takeError();
  Session &s = **su;
  auto mode = parseFtMode(d.ftMode);
  if (!mode)
    return inputError("--mode must be frontier, mini-time, mini-parallelism "
                      "or profile, got '{}'",
                      d.ftMode);
  FtOptions o;
  o.threads = d.threads == 0 ? std::min(256, availableCores()) : d.threads;
  o.maxSplitLoops = d.ftMaxSplitLoops;
  if (d.ftMesh == "auto") {
    o.nodeMesh = FtOptions::nodeMeshFor(*s.topo);
  } else if (d.ftMesh == "node") {
    o.nodeMesh = FtOptions::nodeMeshOf(*s.topo);
    if (o.nodeMesh == 0)
      return inputError("--mesh node: {} devices in {} nodes is not a power "
                        "of two per node",
                        s.topo->numDevices(), s.topo->numNodes());
  } else if (d.ftMesh != "1d") {
    return inputError("--mesh must be 1d, node or auto, got '{}'", d.ftMesh);
  }
  o.resolution = d.ftResolution;
  o.tensorReuse = !d.ftNoReuse;
  o.useLdp = !d.ftNoLdp;
  o.recompute = !d.ftNoRecompute;
  o.zero = d.ftZero;
  if (d.ftMicroBatches < 1)
    return inputError("--micro-batches must be at least 1, got {}",
                      d.ftMicroBatches);
  if (s.batch % int64_t(d.ftMicroBatches) != 0)
    return inputError("--micro-batches {} does not divide the batch {}",
                      d.ftMicroBatches, s.batch);
  o.microBatches = int32_t(d.ftMicroBatches);
  if (auto err = o.validate())
    return err;
  auto end = std::chrono::steady_clock::time_point::max();
  if (!d.timeout.empty()) {
    auto t = parseDuration(d.timeout, "--timeout");
    if (!t)
      return t.takeError();
    end = secondsAfter(std::chrono::steady_clock::now(), *t);
  }
  // From here to the files written, Ctrl-C or SIGTERM stops FT as
  // --timeout does (pastDeadline); a second one exits at once (130).
  InterruptScope interrupts;
  o.cancelled = [end] { return pastDeadline(end); };
  // Past --timeout, or interrupted, before FT ended the frontier is
  // incomplete: no point is given. (Interrupted while its points are
  // simulated, those left show "-".)
  auto timedOut = [&](llvm::Error err) {
    return llvm::handleErrors(
        std::move(err), [&](const DeadlineExceeded &) -> llvm::Error {
          if (interruptRequested())
            return makeError(ExitCode::Interrupted,
                             "{}: interrupted before the frontier was "
                             "complete; nothing written",
                             s.graph->sourcePath);
          return makeError(ExitCode::Infeasible,
                           "{}: --timeout {} ended before the frontier was "
                           "complete",
                           s.graph->sourcePath, d.timeout);
        });
  };
  SearchProblem prob = s.problem();
  auto dp = strategyMetrics(prob, dataParallel(*s.graph, *s.topo));
  if (!dp)
    return dp.takeError();
  Seconds dpTime = dp->fits ? dp->iterationTime : 0;
  std::vector<FtFrontierReport> reports;
  size_t chosenReport = 0;
  int chosen = -1;
  if (*mode == FtMode::Frontier || *mode == FtMode::MiniTime) {
    auto r = frontierReport(prob, o, d.ftSimulate);
    if (!r)
      return timedOut(r.takeError());
    reports.push_back(std::move(*r));
    chosen = miniTimePoint(reports[0]);
  } else {
    auto rs = profileReports(prob, o, d.ftSimulate);
    if (!rs)
      return timedOut(rs.takeError());
    reports = std::move(*rs);
    llvm::outs() << fmt::format("{:>7} {:>7} {:>14} {:>16} {:>6}\n", "devices",
                                "points", "least memory", "fastest fitting",
                                "point");
    for (size_t i = 0; i < reports.size(); ++i) {
      int b = miniTimePoint(reports[i]);
      const FtFrontierReport &r = reports[i];
      llvm::outs() << fmt::format(
          "{:>7} {:>7} {:>14} {:>16} {:>6}\n", r.devices, r.points.size(),
          r.points.empty() ? std::string("-")
                           : formatBytes(double(r.points[0].simPeakMemory)),
          b < 0 ? std::string("does not fit")
                : fmt::format("{:.3f} ms", r.points[size_t(b)].simTime * 1e3),
          b < 0 ? std::string("-") : std::to_string(b));
      if (b >= 0 && chosen < 0 && *mode == FtMode::MiniParallelism) {
        chosen = b;
        chosenReport = i;
      }
    }
    if (*mode == FtMode::Profile) {
      // The fastest over all device counts.
      for (size_t i = 0; i < reports.size(); ++i) {
        int b = miniTimePoint(reports[i]);
        if (b >= 0 &&
            (chosen < 0 ||
             reports[i].points[size_t(b)].simTime <
                 reports[chosenReport].points[size_t(chosen)].simTime)) {
          chosen = b;
          chosenReport = i;
        }
      }
    }
  }
  FtFrontierReport &rep = reports[chosenReport];
  // A point that does not exist is refused before anything is printed.
  if (d.ftPoint >= 0 && size_t(d.ftPoint) >= rep.points.size())
    return inputError("--point {}: the frontier has {} points (0 to {})",
                      d.ftPoint, rep.points.size(),
                      int64_t(rep.points.size()) - 1);
  if (*mode == FtMode::Frontier || *mode == FtMode::MiniTime)
    printFrontier(rep, *dp, chosen);
  // Interrupted while the points were simulated: the frontier is whole,
  // but the points chosen from are those simulated by then.
  bool interrupted = interruptRequested();
  if (interrupted)
    llvm::outs() << "interrupted: only the points simulated by then "
                    "(not \"-\") were chosen from\n";
  if (!d.ftJsonPath.empty()) {
    Json j;
    if (reports.size() == 1) {
      j = frontierJson(rep, *s.graph, *s.topo, dpTime, dp->peakMemory);
    } else {
      j["profile"] = Json::array();
      for (const FtFrontierReport &r : reports)
        j["profile"].push_back(
            frontierJson(r, *s.graph, *s.topo, dpTime, dp->peakMemory));
    }
    if (auto err = writeFileAtomic(d.ftJsonPath, dumpJson(j)))
      return err;
  }
  if (!d.ftSvgPath.empty())
    if (auto err = writeFileAtomic(
            d.ftSvgPath, frontierSvg(rep, *s.graph, dpTime, dp->peakMemory)))
      return err;
  if (d.ftPoint >= 0)
    chosen = d.ftPoint;
  if (chosen < 0) {
    if (*mode == FtMode::Frontier && d.outputPath.empty())
      return llvm::Error::success();
    return makeError(
        ExitCode::Infeasible,
        "{}: no point of the cost frontier fits in device "
        "memory on {} ({} per device){}",
        d.modelPath, s.topo->name(),
        formatBytes(double(s.topo->deviceSpec().memoryBytes)),
        rep.points.empty()
            ? std::string()
            : fmt::format("; the least memory point needs {}",
                          formatBytes(double(rep.points[0].simPeakMemory))));
  }
  FtScored &pt = rep.points[size_t(chosen)];
  if (!pt.simulated) {
    auto sm = strategyMetrics(prob, pt.strategy);
    if (!sm)
      return sm.takeError();
    pt.simTime = sm->iterationTime;
    pt.simPeakMemory = sm->peakMemory;
    pt.simFits = sm->fits;
    pt.simulated = true;
  }
  if (*mode != FtMode::Frontier)
    llvm::outs() << fmt::format("{}: {} devices, point {}: {:.3f} ms, {} per "
                                "device (simulator)\n",
                                d.ftMode, rep.devices, chosen, pt.simTime * 1e3,
                                formatBytes(double(pt.simPeakMemory)));
  if (d.outputPath.empty())
    return llvm::Error::success();
  if (!pt.simFits)
    return makeError(ExitCode::Infeasible,
                     "point {} does not fit in device memory under the "
                     "simulator ({} per device); no plan written",
                     chosen, formatBytes(double(pt.simPeakMemory)));
  auto m = strategyMetrics(prob, pt.strategy);
  if (!m)
    return m.takeError();
  SearchOutcome how;
  how.interrupted = interrupted;
  return writeSearchPlan(s, pt.strategy, *m, dpTime, "ft", d.seed, d.outputPath,
                         &how);
}

} // namespace soap
