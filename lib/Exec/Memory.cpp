// The executor's memory counter: current and peak bytes of this process's
// tracked tensor storage (kernels may allocate from several threads).
#include "Memory.h"

#include <atomic>

namespace soap {
namespace exec {

namespace {
std::atomic<int64_t> current{0}, peak{0};
std::atomic<size_t> floatBytes{4};
} // namespace

void noteAlloc(size_t bytes) {
  int64_t now = current.fetch_add(int64_t(bytes)) + int64_t(bytes);
  int64_t p = peak.load();
  while (now > p && !peak.compare_exchange_weak(p, now)) {
  }
}

void noteFree(size_t bytes) { current.fetch_sub(int64_t(bytes)); }

int64_t currentBytes() { return current.load(); }

int64_t peakBytes() { return peak.load(); }

void resetPeak() { peak.store(current.load()); }

size_t floatStorageBytes() { return floatBytes.load(std::memory_order_relaxed); }

void setFloatStorageBytes(size_t bytes) { floatBytes.store(bytes); }

} // namespace exec
} // namespace soap
