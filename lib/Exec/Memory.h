// The executor's memory counter (issue 17): every byte of tensor storage a
// rank holds (weights, gradients, optimizer state, activations, transfer
// buffers) is allocated through TrackedAllocator, which keeps the process's
// current and peak bytes, so soap-run can report its measured peak beside
// the simulator's prediction (private to lib/Exec).
#ifndef SOAP_EXEC_MEMORY_H
#define SOAP_EXEC_MEMORY_H

#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

namespace soap {
namespace exec {

/// The bytes held now and the most held since the last resetPeak(). One
/// rank per process: the counter is the rank's.
void noteAlloc(size_t bytes);
void noteFree(size_t bytes);
int64_t currentBytes();
int64_t peakBytes();
/// Starts a new peak from the bytes held now.
void resetPeak();

template <class T> struct TrackedAllocator {
  using value_type = T;
  TrackedAllocator() = default;
  template <class U> TrackedAllocator(const TrackedAllocator<U> &) {}
  T *allocate(size_t n) {
    noteAlloc(n * sizeof(T));
    return static_cast<T *>(::operator new(n * sizeof(T)));
  }
  void deallocate(T *p, size_t n) {
    noteFree(n * sizeof(T));
    ::operator delete(p);
  }
  template <class U> bool operator==(const TrackedAllocator<U> &) const {
    return true;
  }
  template <class U> bool operator!=(const TrackedAllocator<U> &) const {
    return false;
  }
};

/// Tensor storage that the counter sees; converts to and from a plain
/// std::vector<float> (by copy) for code that builds or checks data.
class FloatVec : public std::vector<float, TrackedAllocator<float>> {
  using Base = std::vector<float, TrackedAllocator<float>>;

public:
  using Base::Base;
  FloatVec() = default;
  FloatVec(const std::vector<float> &v) : Base(v.begin(), v.end()) {}
  FloatVec &operator=(const std::vector<float> &v) {
    assign(v.begin(), v.end());
    return *this;
  }
  operator std::vector<float>() const { return {begin(), end()}; }
};
using IndexVec = std::vector<int64_t, TrackedAllocator<int64_t>>;

/// Frees a vector's storage (clear() keeps the capacity).
template <class V> void release(V &v) { V().swap(v); }

} // namespace exec
} // namespace soap

#endif // SOAP_EXEC_MEMORY_H
