// The executor's memory counter: every byte of tensor storage a
// rank holds (weights, gradients, optimizer state, activations, transfer
// buffers) is allocated through TrackedAllocator, which keeps the process's
// current and peak bytes, so soap-run can report its measured peak beside
// the simulator's prediction (private to lib/Exec). Under a bf16 plan the
// compute-dtype tensors (FloatVec) hold bf16 values in fp32 arrays and are
// counted at bf16's 2 bytes an element, the bytes a bf16 array of them
// takes; the fp32 master weights and optimizer state (Fp32Vec) at 4.
#ifndef SOAP_EXEC_MEMORY_H
#define SOAP_EXEC_MEMORY_H

#include <cstddef>
#include <cstdint>
#include <new>
#include <type_traits>
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

/// The bytes a FloatVec element is counted at: 4, or 2 while a bf16 plan
/// runs (its tensors hold bf16 values). Set only while no FloatVec is
/// allocated, so every allocation is freed at the size it was counted at.
size_t floatStorageBytes();
void setFloatStorageBytes(size_t bytes);

/// Counts a bf16 run's storage as bf16 for its lifetime (does nothing for
/// fp32): the first member of what owns the run's buffers, so it ends last.
class Bf16Storage {
public:
  explicit Bf16Storage(bool bf16) : on_(bf16) {
    if (on_)
      setFloatStorageBytes(2);
  }
  ~Bf16Storage() {
    if (on_)
      setFloatStorageBytes(4);
  }
  Bf16Storage(const Bf16Storage &) = delete;
  Bf16Storage &operator=(const Bf16Storage &) = delete;

private:
  bool on_;
};

/// `Full`: always sizeof(T) an element (fp32 master weights and optimizer
/// state); else a float counts floatStorageBytes().
template <class T, bool Full = false> struct TrackedAllocator {
  using value_type = T;
  template <class U> struct rebind {
    using other = TrackedAllocator<U, Full>;
  };
  TrackedAllocator() = default;
  template <class U> TrackedAllocator(const TrackedAllocator<U, Full> &) {}
  static size_t counted(size_t n) {
    if constexpr (std::is_same_v<T, float> && !Full)
      return n * floatStorageBytes();
    else
      return n * sizeof(T);
  }
  T *allocate(size_t n) {
    noteAlloc(counted(n));
    return static_cast<T *>(::operator new(n * sizeof(T)));
  }
  void deallocate(T *p, size_t n) {
    noteFree(counted(n));
    ::operator delete(p);
  }
  template <class U> bool operator==(const TrackedAllocator<U, Full> &) const {
    return true;
  }
  template <class U> bool operator!=(const TrackedAllocator<U, Full> &) const {
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
/// fp32 storage whatever the plan's precision: a bf16 plan's master weights
/// and optimizer state.
using Fp32Vec = std::vector<float, TrackedAllocator<float, true>>;

/// Frees a vector's storage (clear() keeps the capacity).
template <class V> void release(V &v) { V().swap(v); }

} // namespace exec
} // namespace soap

#endif // SOAP_EXEC_MEMORY_H
