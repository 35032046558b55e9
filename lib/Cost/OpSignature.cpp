// Canonical op-tile signatures for the cost database.
#include "soap/Cost/OpSignature.h"

#include <fmt/format.h>

namespace soap {

namespace {

std::string shapeOf(const Box &b) {
  std::string s;
  for (size_t d = 0; d < b.rank(); ++d)
    s += fmt::format("{}{}", d ? "x" : "", b.hi[d] - b.lo[d]);
  return s.empty() ? "1" : s;
}

std::string attrText(const AttrValue &v) {
  if (auto *i = std::get_if<int64_t>(&v))
    return std::to_string(*i);
  if (auto *d = std::get_if<double>(&v))
    return fmt::format("{}", *d);
  if (auto *s = std::get_if<std::string>(&v))
    return *s;
  if (auto *iv = std::get_if<std::vector<int64_t>>(&v))
    return fmt::format("{}", fmt::join(*iv, ","));
  const auto &dv = std::get<std::vector<double>>(v);
  return fmt::format("{}", fmt::join(dv, ","));
}

/// The window positions a tile's points reach outside a tensor (padding):
/// before and after, per dim, from the unclamped extremes of the map.
std::string effectivePads(const TensorMap &map, const Box &tile) {
  std::string out;
  bool any = false;
  Box r = mapRegion(map, tile);
  for (size_t d = 0; d < map.dims.size(); ++d) {
    const DimMap &m = map.dims[d];
    int64_t before = 0, after = 0;
    if (!m.full && !m.terms.empty() && m.divisor == 1) {
      int64_t mn = m.offset, mx = m.offset;
      for (const IndexTerm &t : m.terms) {
        int64_t a = t.coeff * tile.lo[t.loop], b = t.coeff * (tile.hi[t.loop] - 1);
        mn += std::min(a, b);
        mx += std::max(a, b);
      }
      if (!r.empty()) {
        before = std::max<int64_t>(r.lo[d] - mn, 0);
        after = std::max<int64_t>(mx + 1 - r.hi[d], 0);
      }
    }
    any |= before || after;
    out += fmt::format("{}{}:{}", d ? "," : "", before, after);
  }
  return any ? out : "";
}

bool positional(const std::string &attr) {
  return attr == "pads" || attr == "starts" || attr == "x_time" ||
         attr == "shape" || attr == "split" || attr == "auto_pad";
}

} // namespace

std::string opSignature(const Graph &g, const Op &op, const Box &tile) {
  std::string dtype = "f32";
  if (!op.outputs.empty() && op.outputs[0] != kNoValue)
    dtype = dtypeName(g.value(op.outputs[0]).dtype).str();
  std::string s = op.kind + "|" + dtype + "|in=";
  std::string pads;
  for (size_t i = 0; i < op.inputs.size(); ++i) {
    if (i)
      s += ",";
    if (!op.sem.inputs[i].present) {
      s += "-";
      continue;
    }
    s += shapeOf(op.sem.inputRegion(static_cast<int>(i), tile));
    if (i == 0)
      pads = effectivePads(op.sem.inputs[0], tile);
  }
  s += "|out=";
  for (size_t j = 0; j < op.outputs.size(); ++j) {
    if (j)
      s += ",";
    s += op.sem.outputs[j].present
             ? shapeOf(op.sem.outputRegion(static_cast<int>(j), tile))
             : "-";
  }
  if (!pads.empty())
    s += "|pad=" + pads;
  for (const auto &[name, value] : op.attrs) // std::map: sorted
    if (!positional(name))
      s += "|" + name + "=" + attrText(value);
  return s;
}

} // namespace soap
