// Frontier operations (TensorOpt Algorithm 1, product, union), the trace
// arena behind unrolling, and the thread pool FT runs its steps on.
#include "soap/Search/Frontier.h"

#include <algorithm>
#include <atomic>
#include <cassert>
#include <condition_variable>
#include <limits>
#include <mutex>
#include <thread>

namespace soap {

std::vector<FrontierCandidate>
reduceCandidates(std::vector<FrontierCandidate> c, double resolution) {
  // Sort an index by (memory, time, input position): a total order, so the
  // result is the same as a stable sort's, without moving the candidates.
  std::vector<uint32_t> idx(c.size());
  for (size_t i = 0; i < idx.size(); ++i)
    idx[i] = uint32_t(i);
  std::sort(idx.begin(), idx.end(), [&](uint32_t a, uint32_t b) {
    if (c[a].memory != c[b].memory)
      return c[a].memory < c[b].memory;
    if (c[a].time != c[b].time)
      return c[a].time < c[b].time;
    return a < b;
  });
  std::vector<FrontierCandidate> out;
  double v = std::numeric_limits<double>::infinity();
  double exact = v, keep = 1 - resolution;
  uint32_t fastest = 0;
  bool fastestKept = true;
  for (uint32_t i : idx) {
    if (c[i].time >= exact)
      continue; // dominated
    exact = c[i].time;
    fastest = i;
    fastestKept = false;
    if (c[i].time < v * keep || out.empty()) {
      out.push_back(c[i]);
      v = c[i].time;
      fastestKept = true;
    }
  }
  // The fastest point stays even within the resolution of the one before:
  // then the min-time point of every product and union is exact too.
  if (!fastestKept)
    out.push_back(c[fastest]);
  return out;
}

void appendProduct(std::vector<FrontierCandidate> &out, const Frontier &a,
                   const Frontier &b, const Frontier *c) {
  static const Frontier unit{FrontierPoint{}};
  const Frontier &cc = c ? *c : unit;
  out.reserve(out.size() + a.size() * b.size() * cc.size());
  for (const FrontierPoint &x : a)
    for (const FrontierPoint &y : b)
      for (const FrontierPoint &z : cc) {
        FrontierCandidate k;
        k.time = x.time + y.time + z.time;
        k.memory = x.memory + y.memory + z.memory;
        k.parts[0] = x.trace;
        k.parts[1] = y.trace;
        k.parts[2] = z.trace;
        out.push_back(k);
      }
}

TraceId TraceArena::leaf(TraceLeaf kind, int32_t id, int32_t choice) {
  entries_.push_back({{kNoTrace, kNoTrace, kNoTrace}, kind, id, choice});
  return TraceId(entries_.size() - 1);
}

TraceId TraceArena::join(const FrontierCandidate &c) {
  int n = 0;
  TraceId only = kNoTrace;
  for (TraceId t : c.parts)
    if (t != kNoTrace) {
      ++n;
      only = t;
    }
  if (n <= 1)
    return only;
  entries_.push_back(
      {{c.parts[0], c.parts[1], c.parts[2]}, TraceLeaf::Join, -1, -1});
  return TraceId(entries_.size() - 1);
}

Frontier TraceArena::materialize(const std::vector<FrontierCandidate> &r) {
  Frontier f;
  f.reserve(r.size());
  for (const FrontierCandidate &c : r)
    f.push_back({c.time, c.memory, join(c)});
  return f;
}

void TraceArena::unroll(
    TraceId t,
    const std::function<void(TraceLeaf, int32_t, int32_t)> &onLeaf) const {
  std::vector<TraceId> stack;
  if (t != kNoTrace)
    stack.push_back(t);
  while (!stack.empty()) {
    const Entry &e = entries_[size_t(stack.back())];
    stack.pop_back();
    if (e.kind != TraceLeaf::Join) {
      onLeaf(e.kind, e.id, e.choice);
      continue;
    }
    for (TraceId p : e.parts)
      if (p != kNoTrace)
        stack.push_back(p);
  }
}

struct ThreadPool::State {
  std::mutex m;
  std::condition_variable wake, done;
  std::vector<std::thread> workers;
  const std::function<void(size_t)> *fn = nullptr;
  size_t n = 0;
  std::atomic<size_t> next{0};
  int busy = 0;
  uint64_t generation = 0;
  bool stop = false;

  /// `f` and `count` are copied under the lock; `next` is reset only
  /// while no worker is busy, so a late worker finds no index left.
  void work(const std::function<void(size_t)> *f, size_t count) {
    for (size_t i; (i = next.fetch_add(1)) < count;)
      (*f)(i);
  }
};

ThreadPool::ThreadPool(int threads)
    : threads_(std::max(1, threads)), state_(std::make_unique<State>()) {
  State *s = state_.get();
  for (int t = 1; t < threads_; ++t)
    s->workers.emplace_back([s] {
      uint64_t seen = 0;
      for (;;) {
        std::unique_lock<std::mutex> lock(s->m);
        s->wake.wait(lock, [&] { return s->stop || s->generation != seen; });
        if (s->stop)
          return;
        seen = s->generation;
        ++s->busy;
        const std::function<void(size_t)> *f = s->fn;
        size_t count = s->n;
        lock.unlock();
        s->work(f, count);
        lock.lock();
        if (--s->busy == 0)
          s->done.notify_all();
      }
    });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(state_->m);
    state_->stop = true;
  }
  state_->wake.notify_all();
  for (std::thread &t : state_->workers)
    t.join();
}

void ThreadPool::parallelFor(size_t n, const std::function<void(size_t)> &fn) {
  State &s = *state_;
  if (threads_ == 1 || n < 2) {
    for (size_t i = 0; i < n; ++i)
      fn(i);
    return;
  }
  {
    std::unique_lock<std::mutex> lock(s.m);
    s.done.wait(lock, [&] { return s.busy == 0; });
    s.fn = &fn;
    s.n = n;
    s.next = 0;
    ++s.generation;
  }
  s.wake.notify_all();
  s.work(&fn, n);
  std::unique_lock<std::mutex> lock(s.m);
  s.done.wait(lock, [&] { return s.busy == 0 && s.next >= n; });
}

} // namespace soap
