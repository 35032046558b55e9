// Frontier operations (TensorOpt Algorithm 1, product, union), the trace
// arena behind unrolling, and the thread pool FT runs its steps on.
#include "soap/Search/Frontier.h"

#include <algorithm>
#include <atomic>
#include <cassert>
#include <condition_variable>
#include <exception>
#include <limits>
#include <mutex>
#include <thread>
#include <utility>

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

std::vector<FrontierCandidate>
reduceProducts(const std::vector<ProductSpec> &products, double resolution) {
  static const Frontier unit{FrontierPoint{}};
  // A run: product `s` with two factors fixed and the largest one (`vary`)
  // walking its points in memory order.
  struct Run {
    const Frontier *f[3];
    uint32_t s;
    uint32_t idx[3];
    int vary;
  };
  struct Head {
    double memory, time;
    uint32_t s, x, y, z; ///< the position appendProduct would give it
    uint32_t run;
  };
  auto later = [](const Head &p, const Head &q) {
    if (p.memory != q.memory)
      return p.memory > q.memory;
    if (p.time != q.time)
      return p.time > q.time;
    if (p.s != q.s)
      return p.s > q.s;
    if (p.x != q.x)
      return p.x > q.x;
    if (p.y != q.y)
      return p.y > q.y;
    return p.z > q.z;
  };
  std::vector<Run> runs;
  for (size_t s = 0; s < products.size(); ++s) {
    const Frontier *f[3] = {products[s].a, products[s].b,
                            products[s].c ? products[s].c : &unit};
    if (f[0]->empty() || f[1]->empty() || f[2]->empty())
      continue;
    int vary = 0;
    for (int i = 1; i < 3; ++i)
      if (f[i]->size() > f[vary]->size())
        vary = i;
    int o1 = vary == 0 ? 1 : 0, o2 = vary == 2 ? 1 : 2;
    for (uint32_t i = 0; i < f[o1]->size(); ++i)
      for (uint32_t j = 0; j < f[o2]->size(); ++j) {
        Run r{{f[0], f[1], f[2]}, uint32_t(s), {0, 0, 0}, vary};
        r.idx[o1] = i;
        r.idx[o2] = j;
        runs.push_back(r);
      }
  }
  auto cost = [&](const Run &r, uint32_t v, double &memory, double &time) {
    uint32_t id[3] = {r.idx[0], r.idx[1], r.idx[2]};
    id[r.vary] = v;
    const FrontierPoint &x = (*r.f[0])[id[0]], &y = (*r.f[1])[id[1]],
                        &z = (*r.f[2])[id[2]];
    time = x.time + y.time + z.time;
    memory = x.memory + y.memory + z.memory;
  };
  std::vector<Head> heap;
  double exact = std::numeric_limits<double>::infinity();
  // The run's first point at or after `v` not dominated by `exact` (times
  // fall along a run, so the dominated ones form a prefix).
  auto push = [&](uint32_t ri, uint32_t v) {
    const Run &r = runs[ri];
    uint32_t n = uint32_t(r.f[r.vary]->size());
    double m, t;
    if (v < n) {
      cost(r, v, m, t);
      if (t >= exact) {
        uint32_t lo = v + 1, hi = n;
        while (lo < hi) {
          uint32_t mid = lo + (hi - lo) / 2;
          cost(r, mid, m, t);
          if (t >= exact)
            lo = mid + 1;
          else
            hi = mid;
        }
        v = lo;
      }
    }
    if (v >= n)
      return;
    cost(r, v, m, t);
    uint32_t id[3] = {r.idx[0], r.idx[1], r.idx[2]};
    id[r.vary] = v;
    heap.push_back({m, t, r.s, id[0], id[1], id[2], ri});
    std::push_heap(heap.begin(), heap.end(), later);
  };
  for (uint32_t ri = 0; ri < runs.size(); ++ri)
    push(ri, 0);
  std::vector<FrontierCandidate> out;
  double v = std::numeric_limits<double>::infinity();
  double keep = 1 - resolution;
  FrontierCandidate fastest;
  bool fastestKept = true;
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    Head h = heap.back();
    heap.pop_back();
    const Run &r = runs[h.run];
    if (h.time < exact) {
      exact = h.time;
      FrontierCandidate k;
      k.time = h.time;
      k.memory = h.memory;
      k.parts[0] = (*r.f[0])[h.x].trace;
      k.parts[1] = (*r.f[1])[h.y].trace;
      k.parts[2] = (*r.f[2])[h.z].trace;
      fastest = k;
      fastestKept = false;
      if (h.time < v * keep || out.empty()) {
        out.push_back(k);
        v = h.time;
        fastestKept = true;
      }
    }
    uint32_t id[3] = {h.x, h.y, h.z};
    push(h.run, id[r.vary] + 1);
  }
  if (!fastestKept)
    out.push_back(fastest);
  return out;
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

  /// The first exception an index threw (std::bad_alloc on a task graph
  /// too large for RAM): no index starts after it, and parallelFor
  /// rethrows it in its caller's thread (a worker's would abort).
  std::mutex errorLock;
  std::exception_ptr error;

  /// `f` and `count` are copied under the lock; `next` is reset only
  /// while no worker is busy, so a late worker finds no index left.
  void work(const std::function<void(size_t)> *f, size_t count) {
    for (size_t i; (i = next.fetch_add(1)) < count;) {
      try {
        (*f)(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(errorLock);
        if (!error)
          error = std::current_exception();
        next = count;
      }
    }
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
  std::lock_guard<std::mutex> errorLock(s.errorLock);
  if (std::exception_ptr e = std::exchange(s.error, nullptr))
    std::rethrow_exception(e);
}

} // namespace soap
