// Seeded, platform-independent random numbers (xoshiro256**, splitmix64).
#include "soap/Support/Rng.h"

namespace soap {

static inline uint64_t splitmix64(uint64_t &x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

static inline uint64_t rotl(uint64_t x, int k) {
  return (x << k) | (x >> (64 - k));
}

uint64_t fnv1a(llvm::StringRef s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

Rng::Rng(uint64_t seed, llvm::StringRef salt) {
  uint64_t x = seed ^ fnv1a(salt);
  for (uint64_t &w : s_)
    w = splitmix64(x);
}

uint64_t Rng::next() {
  uint64_t result = rotl(s_[1] * 5, 7) * 9;
  uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

uint64_t Rng::uniform(uint64_t n) {
  // Lemire, "Fast Random Integer Generation in an Interval" (2019).
  unsigned __int128 m = (unsigned __int128)next() * n;
  uint64_t low = uint64_t(m);
  if (low < n) {
    uint64_t threshold = (0 - n) % n;
    while (low < threshold) {
      m = (unsigned __int128)next() * n;
      low = uint64_t(m);
    }
  }
  return uint64_t(m >> 64);
}

int64_t Rng::uniformInt(int64_t lo, int64_t hi) {
  uint64_t span = uint64_t(hi) - uint64_t(lo) + 1;
  if (span == 0) // the full 64-bit range
    return int64_t(next());
  return int64_t(uint64_t(lo) + uniform(span));
}

double Rng::uniformReal() { return double(next() >> 11) * 0x1.0p-53; }

Rng Rng::fork(llvm::StringRef salt) {
  Rng child;
  uint64_t x = next() ^ fnv1a(salt);
  for (uint64_t &w : child.s_)
    w = splitmix64(x);
  return child;
}

uint64_t hashDraw(uint64_t seed, uint64_t stream, uint64_t index) {
  uint64_t x = seed * 0xd1342543de82ef95ULL + stream;
  uint64_t a = splitmix64(x);
  x = a ^ index;
  return splitmix64(x);
}

double hashUniform(uint64_t seed, uint64_t stream, uint64_t index) {
  return double(hashDraw(seed, stream, index) >> 11) * 0x1.0p-53;
}

} // namespace soap
