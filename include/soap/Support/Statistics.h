// Small statistics shared by the cost model's fitting and the profilers'
// measurements.
#ifndef SOAP_SUPPORT_STATISTICS_H
#define SOAP_SUPPORT_STATISTICS_H

#include <algorithm>
#include <vector>

namespace soap {

/// The median of `v` (the mean of the middle two for an even count); 0 for
/// none.
inline double median(std::vector<double> v) {
  if (v.empty())
    return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

} // namespace soap

#endif // SOAP_SUPPORT_STATISTICS_H
