// The brute-force oracle of the frontier-tracking tests: the frontier of
// every assignment of a small FtModel, against which FT's is compared.
#ifndef SOAP_TEST_SEARCH_FRONTIERORACLE_H
#define SOAP_TEST_SEARCH_FRONTIERORACLE_H

#include "soap/Search/FrontierTracking.h"
#include <cstdint>
#include <vector>

namespace soap {

/// The frontier of every assignment (configurations and edge options), for
/// tests on small graphs; an empty result beyond `limit` assignments.
std::vector<FtCosts> bruteForceFrontier(const FtModel &m, uint64_t limit);

} // namespace soap

#endif // SOAP_TEST_SEARCH_FRONTIERORACLE_H
