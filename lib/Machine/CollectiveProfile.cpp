// Measured collective curves and TensorOpt's 2^i bandwidth interpolation.
#include "soap/Machine/CollectiveProfile.h"

#include "soap/Support/Error.h"
#include <algorithm>
#include <cassert>
#include <fmt/format.h>

namespace soap {

static const char *const kCollectiveNames[kNumCollectives] = {
    "all-reduce", "all-gather", "reduce-scatter", "broadcast", "send-recv"};

llvm::StringRef collectiveName(Collective c) {
  return kCollectiveNames[static_cast<int>(c)];
}

std::optional<Collective> parseCollective(llvm::StringRef name) {
  for (int i = 0; i < kNumCollectives; ++i)
    if (name == kCollectiveNames[i])
      return static_cast<Collective>(i);
  return std::nullopt;
}

Seconds CollectiveCurve::predict(Bytes size) const {
  assert(!points.empty());
  const auto &first = points.front(), &last = points.back();
  if (size <= first.first)
    return double(first.first) / first.second;
  if (size >= last.first)
    return double(size) / last.second;
  // The first point above `size`; its predecessor is at or below it.
  auto hi = std::upper_bound(
      points.begin(), points.end(), size,
      [](Bytes s, const std::pair<Bytes, double> &p) { return s < p.first; });
  auto lo = hi - 1;
  double frac = double(size - lo->first) / double(hi->first - lo->first);
  double bw = lo->second + (hi->second - lo->second) * frac;
  return double(size) / bw;
}

void CollectiveProfile::add(CollectiveCurve curve) {
  auto key = std::make_tuple(curve.kind, curve.shape);
  curves_.insert_or_assign(key, std::move(curve));
}

const CollectiveCurve *CollectiveProfile::find(Collective kind,
                                               GroupShape shape) const {
  auto it = curves_.find(std::make_tuple(kind, shape));
  return it == curves_.end() ? nullptr : &it->second;
}

std::optional<Seconds> CollectiveProfile::predict(Collective kind,
                                                  GroupShape shape,
                                                  Bytes size) const {
  if (const CollectiveCurve *c = find(kind, shape))
    return c->predict(size);
  return std::nullopt;
}

llvm::Expected<CollectiveProfile>
CollectiveProfile::fromJson(const Json &value, const JsonReader &r,
                            llvm::StringRef ptr) {
  if (!value.is_array())
    return r.error(ptr, "expected an array of collective curves");
  CollectiveProfile out;
  std::map<std::tuple<Collective, GroupShape>, size_t> seen;
  for (size_t i = 0; i < value.size(); ++i) {
    const Json &c = value[i];
    std::string p = jsonPointer(ptr, i);
    auto name = r.string(c, p, "collective");
    if (!name)
      return name.takeError();
    auto kind = parseCollective(*name);
    if (!kind)
      return r.error(jsonPointer(p, "collective"),
                     fmt::format("unknown collective '{}'; known: all-reduce, "
                                 "all-gather, reduce-scatter, broadcast, "
                                 "send-recv",
                                 *name));
    auto nodes = r.integer(c, p, "nodes", 1);
    if (!nodes)
      return nodes.takeError();
    auto per = r.integer(c, p, "gpus_per_node", 1);
    if (!per)
      return per.takeError();
    CollectiveCurve curve{*kind, {uint32_t(*nodes), uint32_t(*per)}, {}};
    auto [it, fresh] = seen.emplace(std::make_tuple(*kind, curve.shape), i);
    if (!fresh)
      return r.error(p, fmt::format("duplicate curve for {} on {} x {} (first "
                                    "at {})",
                                    *name, *nodes, *per,
                                    jsonPointer(ptr, it->second)));
    auto points = r.array(c, p, "points");
    if (!points)
      return points.takeError();
    std::string pp = jsonPointer(p, "points");
    if ((*points)->empty())
      return r.error(pp, "a curve needs at least one point");
    for (size_t k = 0; k < (*points)->size(); ++k) {
      const Json &pt = (**points)[k];
      std::string ptp = jsonPointer(pp, k);
      auto bytes = r.integer(pt, ptp, "bytes", 1);
      if (!bytes)
        return bytes.takeError();
      auto bw = r.positive(pt, ptp, "bytes_per_sec");
      if (!bw)
        return bw.takeError();
      if (!curve.points.empty() && *bytes <= curve.points.back().first)
        return r.error(jsonPointer(ptp, "bytes"),
                       fmt::format("sizes must increase: {} after {}", *bytes,
                                   curve.points.back().first));
      curve.points.push_back({*bytes, *bw});
    }
    out.add(std::move(curve));
  }
  return out;
}

Json CollectiveProfile::toJson() const {
  Json out = Json::array();
  for (const auto &[key, c] : curves_) {
    Json points = Json::array();
    for (const auto &[bytes, bw] : c.points)
      points.push_back({{"bytes", bytes}, {"bytes_per_sec", bw}});
    out.push_back({{"collective", collectiveName(c.kind).str()},
                   {"nodes", c.shape.nodes},
                   {"gpus_per_node", c.shape.devicesPerNode},
                   {"points", points}});
  }
  return out;
}

} // namespace soap
