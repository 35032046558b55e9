// soap-profile's runs on the CPU (see CpuRuns.h).
#include "CpuRuns.h"

#include "soap/Cost/CostModel.h"
#include "soap/Exec/TileTiming.h"
#include "soap/Support/Error.h"
#include "soap/Support/Statistics.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/raw_ostream.h"
#include <algorithm>
#include <chrono>
#include <cstring>

namespace soap {

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}


/// Rank 0's decision, known to every rank (a sum where only rank 0 adds).
bool agree(Comm &comm, bool mine) {
  float f = comm.rank() == 0 && mine ? 1.0f : 0.0f;
  if (comm.size() > 1) {
    std::vector<int> all(size_t(comm.size()));
    for (int r = 0; r < comm.size(); ++r)
      all[size_t(r)] = r;
    comm.allReduce(all, &f, 1);
  }
  return f > 0.5f;
}

std::vector<int> firstRanks(int n) {
  std::vector<int> g(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r)
    g[size_t(r)] = r;
  return g;
}

/// Bytes read plus written per second by one rank copying 256 MiB while
/// every rank copies (they share the memory system, as in soap-run).
double copyBandwidth(Comm &comm, int repeats) {
  const size_t n = size_t(64) << 20; // floats: 256 MiB
  std::vector<float> a(n, 1.0f), b(n, 0.0f);
  std::vector<double> v;
  for (int r = 0; r < 1 + std::max(repeats, 1); ++r) {
    comm.barrier();
    auto t0 = Clock::now();
    std::memcpy(b.data(), a.data(), n * sizeof(float));
    double s = since(t0);
    if (r > 0)
      v.push_back(2.0 * double(n * sizeof(float)) / s);
    std::swap(a, b);
  }
  return median(v);
}

/// Point-to-point as latency + bytes / bandwidth, least squares over the
/// send-recv curve's points. The latency is the fastest message's time (a
/// fit's intercept can come out negative); the bandwidth is the fitted
/// slope, or the largest message's rate where one slow message (a first
/// send that sets up the connection, under --warmup 0) makes the slope
/// meaningless.
void fitPointToPoint(const CollectiveCurve &curve, CpuMeasureSummary &sum) {
  double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0, tmin = 0;
  for (const auto &[bytes, rate] : curve.points) {
    double x = double(bytes), y = x / rate;
    tmin = n == 0 ? y : std::min(tmin, y);
    n += 1, sx += x, sy += y, sxx += x * x, sxy += x * y;
  }
  double slope = (n * sxy - sx * sy) / (n * sxx - sx * sx);
  const auto &hi = curve.points.back();
  sum.p2pLatencySeconds = tmin;
  sum.p2pBytesPerSec = slope > 0 ? 1 / slope : hi.second;
}

/// The collective curves of MPI among ranks 0..n-1 of one host, algorithm
/// bandwidth (the full buffer's bytes over the time) at sizes 4 .. max.
void measureCollectives(Comm &comm, CostDatabase &db, int64_t maxBytes,
                        int warmup, int repeats, CpuMeasureSummary &sum) {
  int size = comm.size();
  std::vector<float> buf(size_t(std::max<int64_t>(maxBytes / 4, 1)), 1.0f);
  for (int n = 2; n <= size; n *= 2) {
    std::vector<int> group = firstRanks(n);
    bool member = comm.rank() < n;
    for (Collective kind :
         {Collective::AllReduce, Collective::AllGather,
          Collective::ReduceScatter, Collective::SendRecv}) {
      if (kind == Collective::SendRecv && n != 2)
        continue;
      CollectiveCurve curve{kind, GroupShape{1, uint32_t(n)}, {}};
      for (int64_t bytes = 4; bytes <= maxBytes; bytes *= 2) {
        size_t count = size_t(bytes / 4);
        // Parts of ceil(count / n) (the last ones shorter), as soap-run's
        // ZeRO splits a box.
        std::vector<size_t> counts(static_cast<size_t>(n));
        size_t per = (count + size_t(n) - 1) / size_t(n), left = count;
        for (auto &c : counts) {
          c = std::min(per, left);
          left -= c;
        }
        std::vector<double> v;
        for (int r = 0; r < warmup + repeats; ++r) {
          comm.barrier();
          auto t0 = Clock::now();
          if (member) {
            switch (kind) {
            case Collective::AllReduce:
              comm.allReduce(group, buf.data(), count);
              break;
            case Collective::AllGather:
              comm.allGather(group, buf.data(), counts);
              break;
            case Collective::ReduceScatter:
              comm.reduceScatter(group, buf.data(), counts);
              break;
            default: {
              // Rank 0 to rank 1.
              std::vector<Comm::Message> s, rc;
              if (comm.rank() == 0)
                s.push_back({1, 7, buf.data(), count});
              else if (comm.rank() == 1)
                rc.push_back({0, 7, buf.data(), count});
              comm.exchange(s, rc);
              break;
            }
            }
          }
          if (r >= warmup)
            v.push_back(since(t0));
        }
        // Every rank's median; the slowest member's ends the collective.
        std::vector<float> all(size_t(size), 0.0f);
        all[size_t(comm.rank())] = float(median(v));
        comm.allReduce(firstRanks(size), all.data(), all.size());
        double t = 0;
        for (int r = 0; r < n; ++r)
          t = std::max(t, double(all[size_t(r)]));
        curve.points.push_back({Bytes(bytes), double(bytes) / t});
      }
      if (kind == Collective::SendRecv && curve.points.size() >= 2)
        fitPointToPoint(curve, sum);
      db.collectives.add(std::move(curve));
    }
  }
}

} // namespace

std::string cpuModelName() {
  auto buf = llvm::MemoryBuffer::getFileAsStream("/proc/cpuinfo");
  if (!buf)
    return "unknown";
  llvm::StringRef text = (*buf)->getBuffer();
  while (!text.empty()) {
    auto [line, rest] = text.split('\n');
    if (line.startswith("model name")) {
      auto v = line.split(':').second.trim();
      return v.str();
    }
    text = rest;
  }
  return "unknown";
}

llvm::Expected<CpuMeasureSummary> measureOnCpu(Comm &comm,
                                               const SignatureSet &set,
                                               CostDatabase &db,
                                               const CpuMeasureOptions &o) {
  CpuMeasureSummary sum;
  bool root = comm.rank() == 0;
  db.memoryBandwidthBytesPerSec = copyBandwidth(comm, o.repeats);
  if (root)
    llvm::errs() << fmt::format("{} rank(s): copy {:.1f} GB/s per rank\n",
                                comm.size(),
                                db.memoryBandwidthBytesPerSec / 1e9);
  // Most-used signatures first, so a run cut short by --time-limit covers
  // the most tiles; ties by signature.
  std::vector<const std::pair<const std::string, SignatureInfo> *> order;
  for (const auto &entry : set.signatures())
    order.push_back(&entry);
  std::stable_sort(order.begin(), order.end(), [](auto *a, auto *b) {
    return a->second.tiles > b->second.tiles;
  });
  auto begin = Clock::now(), last = begin;
  TileTimingOptions to;
  to.warmup = o.warmup;
  to.repeats = o.repeats;
  to.beforeRun = [&comm] { comm.barrier(); };
  size_t done = 0;
  for (const auto *entry : order) {
    const std::string &sig = entry->first;
    const SignatureInfo &info = entry->second;
    if (root && ++done % 50 == 0)
      llvm::errs() << fmt::format("\r{} of {} signatures", done, order.size());
    if (!o.remeasure && db.find(sig)) {
      ++sum.have;
      continue;
    }
    bool late = o.timeLimitSeconds > 0 && since(begin) > o.timeLimitSeconds;
    if (agree(comm, late)) {
      ++sum.skipped;
      continue;
    }
    const SignatureSite &site = info.site;
    const Graph &g = *site.graph;
    const Op &op = g.op(site.op);
    auto t = timeTileOnCpu(g, op, site.tile, to);
    if (!t) {
      ++sum.failed;
      std::string msg = errorMessage(t.takeError());
      if (root)
        llvm::errs() << "soap-profile: warning: " << sig << ": " << msg
                     << "\n";
      continue;
    }
    KernelEntry e;
    e.repeats = t->repeats;
    e.forward = t->forward;
    setTileWork(e, g, op, site.tile);
    // soap-run's backward kernel computes both gradients at once: the time
    // is shared between them as the IR's FLOPs (else bytes) are.
    double wd = e.flops[1], ww = e.flops[2];
    if (wd + ww <= 0) {
      wd = e.bytes[1];
      ww = e.bytes[2];
    }
    double share = wd + ww > 0 ? ww / (wd + ww) : 0;
    e.backwardWeight = t->backward * share;
    e.backwardData = t->backward - e.backwardWeight;
    db.add(sig, e);
    ++sum.measured;
    ++sum.kinds[info.kind];
    if (root && since(last) > 30) {
      if (auto err = db.save(o.output))
        return llvm::Error(std::move(err));
      last = Clock::now();
    }
  }
  if (root && done >= 50)
    llvm::errs() << "\n";
  // The achieved f32 rate of the contractions measured (the roofline's
  // peak for tiles the database lacks).
  double best = 0;
  for (const auto &[sig, e] : db.kernels()) {
    llvm::StringRef kind = llvm::StringRef(sig).split('|').first;
    if ((kind == "Gemm" || kind == "MatMul" || kind == "Conv") &&
        e.forward > 0 && e.flops[0] > 1e6)
      best = std::max(best, e.flops[0] / e.forward);
  }
  if (best > 0)
    db.gemmFlopsPerSec["f32"] = best;
  if (comm.size() > 1 && o.maxCollectiveBytes >= 4)
    measureCollectives(comm, db, o.maxCollectiveBytes, o.warmup,
                       std::max(o.repeats, 3), sum);
  if (root)
    if (auto err = db.save(o.output))
      return llvm::Error(std::move(err));
  return sum;
}

} // namespace soap
