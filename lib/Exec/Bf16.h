// bf16 rounding for the executor's mixed-precision runs: values
// stored as bf16 are kept in fp32 arrays, rounded to the nearest bf16 with
// ties to even (as a float -> bf16 conversion on a GPU or in oneDNN does),
// so a kernel reads exactly what a bf16 tensor holds and accumulates in
// fp32 (private to lib/Exec).
#ifndef SOAP_EXEC_BF16_H
#define SOAP_EXEC_BF16_H

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace soap {
namespace exec {

/// `x` rounded to bf16 (8 bits of significand), ties to even; NaN stays a
/// (quiet) NaN, overflow gives infinity.
inline float roundBf16(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  if ((b & 0x7f800000u) == 0x7f800000u && (b & 0x007fffffu))
    b = (b | 0x00400000u) & 0xffff0000u;
  else
    b = (b + 0x7fffu + ((b >> 16) & 1u)) & 0xffff0000u;
  float y;
  std::memcpy(&y, &b, sizeof y);
  return y;
}

inline void roundBf16(float *p, size_t n) {
  for (size_t k = 0; k < n; ++k)
    p[k] = roundBf16(p[k]);
}

} // namespace exec
} // namespace soap

#endif // SOAP_EXEC_BF16_H
