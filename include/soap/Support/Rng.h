// The seeded RNG: one per run (--seed), salted by a name (the searcher's), with
// its own integer and real distributions so results are identical on every
// platform and standard library (std:: distributions are not).
#ifndef SOAP_SUPPORT_RNG_H
#define SOAP_SUPPORT_RNG_H

#include "llvm/ADT/StringRef.h"
#include <cstdint>

namespace soap {

/// xoshiro256** seeded through splitmix64 from (seed, salt).
class Rng {
public:
  explicit Rng(uint64_t seed, llvm::StringRef salt = "");
  uint64_t next();
  /// Uniform in [0, n); n > 0. Unbiased (Lemire's multiply-shift with rejection).
  uint64_t uniform(uint64_t n);
  /// Uniform in [lo, hi]; lo <= hi.
  int64_t uniformInt(int64_t lo, int64_t hi);
  /// Uniform double in [0, 1) with 53 random bits.
  double uniformReal();
  bool bernoulli(double p) { return uniformReal() < p; }
  /// A child stream, independent of this one's future draws.
  Rng fork(llvm::StringRef salt);

private:
  Rng() = default;
  uint64_t s_[4];
};

/// Stateless counter-based draw: a pure function of (seed, stream, index), so
/// any partition of a tensor draws the same value for the same global element.
uint64_t hashDraw(uint64_t seed, uint64_t stream, uint64_t index);
/// hashDraw mapped to [0, 1).
double hashUniform(uint64_t seed, uint64_t stream, uint64_t index);

/// 64-bit FNV-1a of a string, for salts.
uint64_t fnv1a(llvm::StringRef s);

} // namespace soap

#endif // SOAP_SUPPORT_RNG_H
