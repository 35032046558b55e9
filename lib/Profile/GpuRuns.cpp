// soap-profile's runs on the GPU (see GpuRuns.h).
#include "GpuRuns.h"

#include "soap/Support/Error.h"
#include "llvm/Support/raw_ostream.h"
#include <algorithm>
#include <chrono>

namespace soap {

llvm::Expected<MeasureRunSummary> measureSignatures(GpuSession &s,
                                                    const SignatureSet &set,
                                                    CostDatabase &db,
                                                    const MeasureRunOptions &o) {
  auto bw = s.measureBandwidth();
  if (!bw)
    return bw.takeError();
  db.memoryBandwidthBytesPerSec = *bw;
  auto rates = s.measureGemmRates(8192);
  if (!rates)
    return rates.takeError();
  db.gemmFlopsPerSec = *rates;
  llvm::errs() << fmt::format("{}: copy {:.0f} GB/s; GEMM f32 {:.1f}, f16 "
                              "{:.1f}, bf16 {:.1f} TFLOP/s\n",
                              s.gpuName(), *bw / 1e9, (*rates)["f32"] / 1e12,
                              (*rates)["f16"] / 1e12, (*rates)["bf16"] / 1e12);
  auto begin = std::chrono::steady_clock::now();
  auto last = begin;
  MeasureRunSummary sum;
  // Most-used signatures first, so a run cut short by --time-limit covers
  // the most tiles; ties by signature.
  std::vector<const std::pair<const std::string, SignatureInfo> *> order;
  for (const auto &entry : set.signatures())
    order.push_back(&entry);
  std::stable_sort(order.begin(), order.end(), [](auto *a, auto *b) {
    return a->second.tiles > b->second.tiles;
  });
  size_t done = 0;
  for (const auto *entry : order) {
    const std::string &sig = entry->first;
    const SignatureInfo &info = entry->second;
    if (++done % 100 == 0)
      llvm::errs() << fmt::format("\r{} of {} signatures", done,
                                  order.size());
    if (!o.remeasure && db.find(sig)) {
      ++sum.have;
      continue;
    }
    auto now = std::chrono::steady_clock::now();
    if (o.timeLimitSeconds > 0 &&
        std::chrono::duration<double>(now - begin).count() > o.timeLimitSeconds) {
      ++sum.skipped;
      continue;
    }
    const SignatureSite &site = info.site;
    const Op &op = site.graph->op(site.op);
    std::string method;
    auto e = s.measure(*site.graph, op, site.tile, sig, &method);
    if (!e) {
      ++sum.failed;
      llvm::errs() << "soap-profile: warning: " << sig << ": "
                   << errorMessage(e.takeError()) << "\n";
      continue;
    }
    db.add(sig, *e);
    ++sum.measured;
    ++sum.methods[info.kind + " by " + method];
    // Keep what is measured should the run be cut off.
    if (std::chrono::duration<double>(now - last).count() > 30) {
      if (auto err = db.save(o.output))
        return llvm::Error(std::move(err));
      last = now;
    }
  }
  if (done >= 100)
    llvm::errs() << "\n";
  if (auto err = db.save(o.output))
    return llvm::Error(std::move(err));
  return sum;
}

llvm::Error replayOnGpu(GpuSession &s, std::vector<ReplayPlan> &plans) {

  for (ReplayPlan &p : plans) {
    p.sequence.assign(p.devices, 0); // a device without tasks: nothing
    // One device at a time, its tasks in simulated order.
    size_t i = 0;
    while (i < p.tasks.size()) {
      size_t end = i;
      while (end < p.tasks.size() && p.tasks[end].device == p.tasks[i].device)
        ++end;
      auto median = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        size_t n = v.size();
        return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
      };
      int warmup = s.options().warmup, repeats = s.options().repeats;
      std::map<std::string, std::unique_ptr<TileBench>> benches;
      bool together = true;
      for (size_t k = i; k < end && together; ++k) {
        ReplayTask &rt = p.tasks[k];
        if (benches.count(rt.signature))
          continue;
        auto b = s.prepare(*p.graph, p.graph->op(rt.op), rt.box, rt.signature);
        if (!b) {
          // The device's tiles do not fit on this GPU at once (the replay
          // keeps inputs and gradients of every tile): time each task on
          // its own instead.
          llvm::errs() << fmt::format(
              "soap-profile: {}: device {}: {}; timing its tasks one at a "
              "time\n",
              p.path, rt.device, errorMessage(b.takeError()));
          benches.clear();
          together = false;
          break;
        }
        benches[rt.signature] = std::move(*b);
      }
      if (together) {
        // The whole sequence back to back, as an executor would issue it:
        // the GPU's time plus the gaps where it waits for the host. Its
        // warm-up runs are the task timings' too: they load every kernel
        // before a held run (a lazily loaded module would wait for the
        // holding kernel).
        auto sequence = [&]() -> llvm::Error {
          for (size_t k = i; k < end; ++k) {
            ReplayTask &rt = p.tasks[k];
            TileBench &b = *benches[rt.signature];
            if (auto err =
                    s.enqueue(b, rt.passes.data(), int(rt.passes.size())))
              return err;
          }
          return llvm::Error::success();
        };
        std::vector<double> whole;
        for (int r = 0; r < std::max(warmup, 1) + repeats; ++r) {
          auto t = s.timeSequence(sequence);
          if (!t)
            return t.takeError();
          if (r >= std::max(warmup, 1))
            whole.push_back(*t);
        }
        p.sequence[p.tasks[i].device] = median(whole);
        // Then each task timed on its own, held.
        std::vector<std::vector<double>> times(end - i);
        for (int r = 0; r < repeats; ++r)
          for (size_t k = i; k < end; ++k) {
            ReplayTask &rt = p.tasks[k];
            TileBench &b = *benches[rt.signature];
            // A task that runs no kernel (its op needs no backward) takes
            // no time.
            auto t = rt.passes.empty() ? llvm::Expected<double>(0.0)
                                       : s.timeOnce(b, rt.passes.data(),
                                                    int(rt.passes.size()));
            if (!t)
              return t.takeError();
            times[k - i].push_back(*t);
          }
        for (size_t k = i; k < end; ++k)
          p.tasks[k].measured = median(times[k - i]);
      } else {
        p.sequence[p.tasks[i].device] = -1; // not run back to back
        for (size_t k = i; k < end; ++k) {
          ReplayTask &rt = p.tasks[k];
          auto b =
              s.prepare(*p.graph, p.graph->op(rt.op), rt.box, rt.signature);
          if (!b)
            return makeError(ExitCode::Internal, "{}: device {}: {}: {}",
                             p.path, rt.device, rt.signature,
                             errorMessage(b.takeError()));
          std::vector<double> v;
          for (int r = 0; r < std::max(warmup, 1) + repeats; ++r) {
            // The warm-up runs unheld (as above: they load the kernels).
            auto t = r < std::max(warmup, 1) ? s.timeSequence([&] {
              return s.enqueue(**b, rt.passes.data(), int(rt.passes.size()));
            })
                     : rt.passes.empty()     ? llvm::Expected<double>(0.0)
                                             : s.timeOnce(**b, rt.passes.data(),
                                                          int(rt.passes.size()));
            if (!t)
              return t.takeError();
            if (r >= std::max(warmup, 1))
              v.push_back(*t);
          }
          rt.measured = median(v);
        }
      }
      i = end;
    }
  }
  return llvm::Error::success();
}

} // namespace soap
