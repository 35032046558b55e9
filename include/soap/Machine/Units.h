// Unit-carrying scalar types of the machine model and the conversions from the
// units that topology files use (Gb/s, microseconds, GiB).
#ifndef SOAP_MACHINE_UNITS_H
#define SOAP_MACHINE_UNITS_H

#include <cstdint>

namespace soap {

/// Time in seconds.
using Seconds = double;
/// A size in bytes.
using Bytes = int64_t;

/// Gigabits per second (10^9 bit/s, the unit network and topology files use)
/// to bytes per second.
constexpr double gbpsToBytesPerSec(double gbps) { return gbps * 1e9 / 8.0; }
constexpr double bytesPerSecToGbps(double bytesPerSec) {
  return bytesPerSec * 8.0 / 1e9;
}
/// Microseconds to seconds.
constexpr Seconds usToSeconds(double us) { return us * 1e-6; }
/// Binary gigabytes (2^30 bytes).
constexpr double kBytesPerGiB = 1024.0 * 1024.0 * 1024.0;

} // namespace soap

#endif // SOAP_MACHINE_UNITS_H
