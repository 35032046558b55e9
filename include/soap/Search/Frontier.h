// Cost frontiers (TensorOpt section 3.1): sets of (time, memory) tuples of
// partial strategies, reduced to the Pareto frontier by Algorithm 1, with a
// back-pointer per tuple into a trace arena so that the strategies behind
// every point can be unrolled.
#ifndef SOAP_SEARCH_FRONTIER_H
#define SOAP_SEARCH_FRONTIER_H

#include "soap/Machine/Units.h"
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace soap {

/// A trace id: an entry of a TraceArena, or kNoTrace (nothing decided).
using TraceId = int32_t;
constexpr TraceId kNoTrace = -1;

/// One strategy tuple: iteration time, memory per device, and how it was
/// made. Memory is a double: edge tuples of tensor reuse carry negative
/// deltas (TensorOpt section 4.2).
struct FrontierPoint {
  Seconds time = 0;
  double memory = 0;
  TraceId trace = kNoTrace;
};

/// Points in ascending memory and strictly descending time.
using Frontier = std::vector<FrontierPoint>;

/// A candidate of a product before reduce: its traces are joined only if it
/// survives, so that dominated candidates cost no arena entries.
struct FrontierCandidate {
  Seconds time = 0;
  double memory = 0;
  TraceId parts[3] = {kNoTrace, kNoTrace, kNoTrace};
};

/// TensorOpt Algorithm 1: sort by memory (then time, then input order) and
/// keep each tuple faster than every tuple before it. Stable and total, so
/// the result does not depend on how the candidates were produced in
/// parallel as long as their order is fixed. With `resolution` > 0 a tuple
/// is kept only when it is faster by more than that fraction (an
/// epsilon-frontier: each dropped tuple is within the fraction of a kept
/// one that needs no more memory); the fastest tuple is always kept, so
/// the min-time point stays exact through every product and union.
std::vector<FrontierCandidate>
reduceCandidates(std::vector<FrontierCandidate> c, double resolution = 0);

/// Product (Cartesian, costs added) of up to three frontiers appended to
/// `out` as candidates (the union of several products is several calls).
void appendProduct(std::vector<FrontierCandidate> &out, const Frontier &a,
                   const Frontier &b, const Frontier *c = nullptr);

/// A product of up to three frontiers (costs added; `c` null is the unit).
struct ProductSpec {
  const Frontier *a = nullptr, *b = nullptr, *c = nullptr;
};

/// reduceCandidates over the union of the products, in the same order
/// (the products in turn, each as appendProduct lays it out), without
/// listing them: each product is merged as sorted runs along its largest
/// factor, and a run skips ahead past the tuples the frontier so far
/// already dominates. The result equals
/// reduceCandidates(appendProduct of each, resolution).
std::vector<FrontierCandidate>
reduceProducts(const std::vector<ProductSpec> &products, double resolution = 0);

/// Which decision a trace leaf records.
enum class TraceLeaf : uint8_t { Join, OpConfig, EdgeReuse };

/// Back-pointers: a leaf says "op o takes configuration k" (or "edge e takes
/// tensor-reuse option k"); a join unites up to three traces. Entries are
/// appended in a deterministic order by one thread.
class TraceArena {
public:
  TraceId leaf(TraceLeaf kind, int32_t id, int32_t choice);
  /// A join of the candidate's parts; one part is returned as is.
  TraceId join(const FrontierCandidate &c);
  /// Reduced candidates as a frontier, joining their traces.
  Frontier materialize(const std::vector<FrontierCandidate> &reduced);
  /// Every leaf under `t`: `onLeaf(kind, id, choice)`.
  void unroll(TraceId t,
              const std::function<void(TraceLeaf, int32_t, int32_t)> &onLeaf)
      const;
  size_t size() const { return entries_.size(); }

private:
  struct Entry {
    TraceId parts[3];
    TraceLeaf kind;
    int32_t id, choice;
  };
  std::vector<Entry> entries_;
};

/// A fixed pool of worker threads running index ranges (`--threads`). Each
/// index writes only its own slot, so results do not depend on the count.
class ThreadPool {
public:
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool &) = delete;
  ThreadPool &operator=(const ThreadPool &) = delete;
  int threads() const { return threads_; }
  /// fn(i) for every i in [0, n); returns when all are done.
  void parallelFor(size_t n, const std::function<void(size_t)> &fn);

private:
  struct State;
  int threads_;
  std::unique_ptr<State> state_;
};

} // namespace soap

#endif // SOAP_SEARCH_FRONTIER_H
