// OpConfig: tiles, device placement, printing, and the check of one op's
// configuration.
#include "soap/Parallel/Strategy.h"

#include "TensorDims.h"
#include "soap/Support/Error.h"
#include <algorithm>
#include <fmt/format.h>
#include <map>
#include <set>

namespace soap {

int64_t OpConfig::numTiles() const {
  int64_t n = 1;
  for (int32_t d : degree)
    n *= d;
  return n;
}

Box OpConfig::tile(const OpSemantics &sem, int64_t k) const {
  Box b;
  size_t n = sem.loops.size();
  b.lo.assign(n, 0);
  b.hi.assign(n, 0);
  for (size_t l = n; l-- > 0;) {
    int64_t d = degree[l];
    int64_t c = k % d;
    k /= d;
    int64_t size = sem.loops[l].size;
    int64_t chunk = (size + d - 1) / d;
    b.lo[l] = std::min(c * chunk, size);
    b.hi[l] = std::min((c + 1) * chunk, size);
  }
  return b;
}

int64_t OpConfig::coordinate(int64_t k, size_t l) const {
  for (size_t m = degree.size(); --m > l;)
    k /= degree[m];
  return k % degree[l];
}

std::vector<DeviceId> OpConfig::deviceSet() const {
  std::vector<DeviceId> s = devices;
  std::sort(s.begin(), s.end());
  s.erase(std::unique(s.begin(), s.end()), s.end());
  return s;
}

bool OpConfig::operator<(const OpConfig &o) const {
  if (degree != o.degree)
    return degree < o.degree;
  if (replicas != o.replicas)
    return replicas < o.replicas;
  return devices < o.devices;
}

static std::string deviceRanges(const std::vector<DeviceId> &devs) {
  std::string s;
  for (size_t i = 0; i < devs.size();) {
    size_t j = i;
    while (j + 1 < devs.size() && devs[j + 1] == devs[j] + 1)
      ++j;
    if (!s.empty())
      s += ",";
    s += j > i ? fmt::format("{}-{}", devs[i], devs[j])
               : std::to_string(devs[i]);
    i = j + 1;
  }
  return s;
}

std::string OpConfig::str(const OpSemantics &sem) const {
  std::string s;
  for (size_t l = 0; l < degree.size(); ++l)
    if (degree[l] > 1)
      s += fmt::format("{}{}={}", s.empty() ? "" : " ", sem.loops[l].name,
                       degree[l]);
  if (s.empty())
    s = "unsplit";
  if (replicas > 1)
    s += fmt::format(" x{}", replicas);
  return s + " @" + deviceRanges(devices);
}

OpConfig OpConfig::single(const OpSemantics &sem, DeviceId d) {
  OpConfig c;
  c.degree.assign(sem.loops.size(), 1);
  c.devices = {d};
  return c;
}

llvm::Error verifyConfig(const OpConfig &c, const OpSemantics &sem,
                         size_t numDevices, llvm::StringRef where,
                         int unevenLoop) {
  if (c.degree.size() != sem.loops.size())
    return inputError("{}: {} degrees for {} loop dimensions", where.str(),
                      c.degree.size(), sem.loops.size());
  for (size_t l = 0; l < sem.loops.size(); ++l) {
    const LoopDim &loop = sem.loops[l];
    int64_t d = c.degree[l];
    if (d < 1)
      return inputError("{}: degree {} of loop '{}' is not positive",
                        where.str(), d, loop.name);
    if (d == 1)
      continue;
    if (!loop.splittable)
      return inputError("{}: loop '{}' cannot be split (degree {})",
                        where.str(), loop.name, d);
    if (int(l) == unevenLoop && loop.granule == 1) {
      // A padded vocabulary: ceil-sized tiles, none of them empty.
      if (!detail::splitsUnevenly(loop, d))
        return inputError("{}: degree {} leaves a tile of vocabulary loop "
                          "'{}' of size {} empty",
                          where.str(), d, loop.name, loop.size);
      continue;
    }
    if (loop.size % d != 0)
      return inputError("{}: degree {} does not divide loop '{}' of size {}",
                        where.str(), d, loop.name, loop.size);
    if ((loop.size / d) % loop.granule != 0)
      return inputError("{}: degree {} of loop '{}' makes tiles of {} that "
                        "are not multiples of {}",
                        where.str(), d, loop.name, loop.size / d, loop.granule);
  }
  if (c.replicas < 1)
    return inputError("{}: replicas must be at least 1, got {}", where.str(),
                      c.replicas);
  if (static_cast<int64_t>(c.devices.size()) != c.numTasks())
    return inputError("{}: {} tiles x {} replicas need {} devices, the "
                      "configuration lists {}",
                      where.str(), c.numTiles(), c.replicas, c.numTasks(),
                      c.devices.size());
  for (DeviceId d : c.devices)
    if (d >= numDevices)
      return inputError("{}: device {} is not in the topology ({} devices)",
                        where.str(), d, numDevices);
  // Each task of an op on its own device: the space never puts two tiles
  // (or two replicas of one) on one device, and the executor and the
  // simulator's memory accounting assume it.
  std::map<DeviceId, size_t> first;
  for (size_t i = 0; i < c.devices.size(); ++i) {
    auto [it, fresh] = first.emplace(c.devices[i], i);
    if (!fresh)
      return inputError("{}: device {} is listed twice (tasks {} and {}); "
                        "each task of an op runs on its own device",
                        where.str(), c.devices[i], it->second, i);
  }
  return llvm::Error::success();
}

} // namespace soap
