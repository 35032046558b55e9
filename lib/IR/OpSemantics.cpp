// Region algebra: from a tile of an op's loop space to the boxes of tensor
// elements it reads and writes, and the FLOPs and bytes of that tile.
#include "soap/IR/OpSemantics.h"

#include <algorithm>
#include <fmt/format.h>
#include <map>

namespace soap {

llvm::StringRef passName(Pass p) {
  static const char *names[] = {"forward", "backward-data", "backward-weight"};
  return names[static_cast<int>(p)];
}

bool Box::empty() const {
  for (size_t d = 0; d < lo.size(); ++d)
    if (lo[d] >= hi[d])
      return true;
  return false;
}

int64_t Box::volume() const {
  int64_t v = 1;
  for (size_t d = 0; d < lo.size(); ++d) {
    if (lo[d] >= hi[d])
      return 0;
    if (__builtin_mul_overflow(v, hi[d] - lo[d], &v))
      return INT64_MAX;
  }
  return v;
}

Box Box::intersect(const Box &o) const {
  Box r;
  for (size_t d = 0; d < lo.size(); ++d) {
    r.lo.push_back(std::max(lo[d], o.lo[d]));
    r.hi.push_back(std::min(hi[d], o.hi[d]));
  }
  return r;
}

bool Box::contains(const Box &o) const {
  if (o.empty())
    return true;
  for (size_t d = 0; d < lo.size(); ++d)
    if (o.lo[d] < lo[d] || o.hi[d] > hi[d])
      return false;
  return true;
}

std::string Box::str() const {
  std::string s = "[";
  for (size_t d = 0; d < lo.size(); ++d)
    s += fmt::format("{}{}:{}", d ? ", " : "", lo[d], hi[d]);
  return s + "]";
}

std::vector<size_t> overlapGroups(const std::vector<Box> &boxes) {
  std::vector<size_t> parent(boxes.size());
  for (size_t i = 0; i < parent.size(); ++i)
    parent[i] = i;
  auto find = [&](size_t i) {
    while (parent[i] != i)
      i = parent[i] = parent[parent[i]];
    return i;
  };
  // Equal boxes first (cheap), then overlaps among the distinct ones.
  std::map<std::pair<std::vector<int64_t>, std::vector<int64_t>>, size_t>
      first;
  std::vector<size_t> reps;
  for (size_t i = 0; i < boxes.size(); ++i) {
    auto [it, fresh] = first.emplace(std::make_pair(boxes[i].lo, boxes[i].hi), i);
    if (fresh)
      reps.push_back(i);
    else
      parent[find(i)] = find(it->second);
  }
  for (size_t x = 0; x < reps.size(); ++x)
    for (size_t y = x + 1; y < reps.size(); ++y)
      if (find(reps[x]) != find(reps[y]) &&
          !boxes[reps[x]].intersect(boxes[reps[y]]).empty())
        parent[find(reps[x])] = find(reps[y]);
  std::vector<size_t> group(boxes.size());
  std::map<size_t, size_t> number;
  for (size_t i = 0; i < boxes.size(); ++i)
    group[i] = number.emplace(find(i), number.size()).first->second;
  return group;
}

Box Box::full(const std::vector<int64_t> &dims) {
  Box b;
  b.lo.assign(dims.size(), 0);
  b.hi = dims;
  return b;
}

static int64_t floorDiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0)))
    --q;
  return q;
}

static int64_t ceilDiv(int64_t a, int64_t b) { return -floorDiv(-a, b); }

namespace {
/// Smallest and largest value of coeff*i + offset over i in [lo, hi) that
/// lies in [vmin, vmax]; false if none does.
bool progressionBounds(int64_t coeff, int64_t offset, int64_t lo, int64_t hi,
                       int64_t vmin, int64_t vmax, int64_t &mn, int64_t &mx) {
  if (coeff == 0) {
    if (offset < vmin || offset > vmax)
      return false;
    mn = mx = offset;
    return true;
  }
  // The i range whose values are inside [vmin, vmax].
  int64_t a, b;
  if (coeff > 0) {
    a = ceilDiv(vmin - offset, coeff);
    b = floorDiv(vmax - offset, coeff);
  } else {
    a = ceilDiv(vmax - offset, coeff);
    b = floorDiv(vmin - offset, coeff);
  }
  a = std::max(a, lo);
  b = std::min(b, hi - 1);
  if (a > b)
    return false;
  int64_t va = coeff * a + offset, vb = coeff * b + offset;
  mn = std::min(va, vb);
  mx = std::max(va, vb);
  return true;
}
} // namespace

Box mapRegion(const TensorMap &map, const Box &tile) {
  Box r;
  size_t rank = map.shape.size();
  r.lo.assign(rank, 0);
  r.hi.assign(rank, 0);
  if (!map.present || tile.empty())
    return r; // every dim [0, 0): empty
  Box none = r;
  for (size_t d = 0; d < rank; ++d) {
    const DimMap &m = map.dims[d];
    if (m.full) {
      r.lo[d] = 0;
      r.hi[d] = map.shape[d];
      continue;
    }
    // Values v = sum coeff*i + offset whose index floor(v / divisor) is in
    // the tensor. Padding and strides can leave the hull's ends unread, so
    // maps of one or two terms (all of conv and pool) are bounded exactly.
    int64_t vmin = 0, vmax = map.shape[d] * m.divisor - 1;
    int64_t mn = INT64_MAX, mx = INT64_MIN;
    bool any = false;
    if (m.terms.size() <= 1) {
      int64_t c = m.terms.empty() ? 0 : m.terms[0].coeff;
      int64_t lo = m.terms.empty() ? 0 : tile.lo[m.terms[0].loop];
      int64_t hi = m.terms.empty() ? 1 : tile.hi[m.terms[0].loop];
      any = progressionBounds(c, m.offset, lo, hi, vmin, vmax, mn, mx);
    } else if (m.terms.size() == 2) {
      // Walk the term with the shorter extent; bound the other exactly.
      const IndexTerm *outer = &m.terms[0], *inner = &m.terms[1];
      auto extent = [&](const IndexTerm *t) {
        return tile.hi[t->loop] - tile.lo[t->loop];
      };
      if (extent(outer) > extent(inner))
        std::swap(outer, inner);
      for (int64_t i = tile.lo[outer->loop]; i < tile.hi[outer->loop]; ++i) {
        int64_t a, b;
        if (progressionBounds(inner->coeff, m.offset + outer->coeff * i,
                              tile.lo[inner->loop], tile.hi[inner->loop], vmin,
                              vmax, a, b)) {
          mn = std::min(mn, a);
          mx = std::max(mx, b);
          any = true;
        }
      }
    } else {
      // Hull, then clamp: exact for the in-bounds affine maps of reshapes.
      mn = mx = m.offset;
      for (const IndexTerm &t : m.terms) {
        int64_t a = t.coeff * tile.lo[t.loop];
        int64_t b = t.coeff * (tile.hi[t.loop] - 1);
        mn += std::min(a, b);
        mx += std::max(a, b);
      }
      mn = std::max(mn, vmin);
      mx = std::min(mx, vmax);
      any = mn <= mx;
    }
    if (!any)
      return none;
    r.lo[d] = floorDiv(mn, m.divisor);
    r.hi[d] = floorDiv(mx, m.divisor) + 1;
  }
  return r;
}

uint64_t loopMaskOf(std::initializer_list<int> loops) {
  uint64_t m = 0;
  for (int l : loops)
    m |= uint64_t(1) << l;
  return m;
}

Box OpSemantics::fullTile() const {
  Box b;
  for (const LoopDim &l : loops) {
    b.lo.push_back(0);
    b.hi.push_back(l.size);
  }
  return b;
}

Box OpSemantics::inputRegion(int i, const Box &tile) const {
  return mapRegion(inputs[i], tile);
}

Box OpSemantics::outputRegion(int j, const Box &tile) const {
  return mapRegion(outputs[j], tile);
}

/// Converts a box in a view of a tensor (an exact re-factoring of its dims,
/// e.g. Stack's [1, S...] of an [S...] input) to the tensor's coordinates.
/// Within each group of view dims that multiply to a tensor dim, only the
/// group's leading dim may be partial (the semantics' granules ensure it).
static Box viewToTensor(const Box &b, const std::vector<int64_t> &view,
                 const std::vector<int64_t> &tensor) {
  Box r;
  size_t v = 0;
  for (size_t t = 0; t < tensor.size(); ++t) {
    size_t first = v;
    int64_t prod = 1;
    while (v < view.size() && prod < tensor[t])
      prod *= view[v++];
    if (tensor[t] == 1 && v < view.size() && view[v] == 1)
      ++v;
    int64_t lo = 0, hi = 0, stride = 1;
    bool empty = false;
    for (size_t k = v; k-- > first;) {
      lo += b.lo[k] * stride;
      hi += (b.hi[k] - 1) * stride;
      stride *= view[k];
      empty |= b.lo[k] >= b.hi[k];
    }
    r.lo.push_back(empty ? 0 : lo);
    r.hi.push_back(empty ? 0 : hi + 1);
  }
  return r;
}

Box OpSemantics::inputRegionInTensor(
    int i, const Box &tile, const std::vector<int64_t> &tensorShape) const {
  Box r = inputRegion(i, tile);
  if (inputs[size_t(i)].isView)
    return viewToTensor(r, inputs[size_t(i)].shape, tensorShape);
  return r;
}

int64_t OpSemantics::exchangeElements(int l, const Box &tile) const {
  int64_t n = loops[size_t(l)].size;
  for (size_t m = 0; m < loops.size(); ++m)
    if (int(m) != l && loops[m].splittable)
      n *= tile.hi[m] - tile.lo[m];
  return n;
}

Box OpSemantics::ringBlock(int i, const Box &tile) const {
  Box b = tile;
  if (i < 0 || size_t(i) >= inputs.size())
    return b;
  std::vector<int> missing;
  for (size_t l = 0; l < loops.size(); ++l) {
    int r = loops[l].ring;
    if (r < 0 || (tile.lo[l] == 0 && tile.hi[l] == loops[l].size))
      continue;
    if (missing.empty())
      missing = loopsMissingFrom(inputs[size_t(i)]);
    auto lacks = [&](int x) {
      return std::find(missing.begin(), missing.end(), x) != missing.end();
    };
    if (!lacks(int(l)) || lacks(r))
      continue;
    int64_t n = loops[l].size, rn = loops[size_t(r)].size;
    b.lo[size_t(r)] = tile.lo[l] * rn / n;
    b.hi[size_t(r)] = tile.hi[l] * rn / n;
  }
  return b;
}

std::vector<int> OpSemantics::reducedLoops(int j) const {
  return loopsMissingFrom(outputs[j]);
}

std::vector<int> OpSemantics::loopsMissingFrom(const TensorMap &map) const {
  std::vector<bool> used(loops.size(), false);
  for (const DimMap &m : map.dims)
    for (const IndexTerm &t : m.terms)
      used[t.loop] = true;
  std::vector<int> out;
  for (size_t l = 0; l < loops.size(); ++l)
    if (!used[l])
      out.push_back(static_cast<int>(l));
  return out;
}

static double termsValue(const std::vector<CostTerm> &terms, const Box &tile) {
  double total = 0;
  for (const CostTerm &t : terms) {
    double v = t.coeff;
    for (size_t l = 0; l < tile.lo.size(); ++l)
      if (t.loopMask >> l & 1)
        v *= static_cast<double>(std::max<int64_t>(tile.hi[l] - tile.lo[l], 0));
    total += v;
  }
  return total;
}

double OpSemantics::tileFlops(Pass p, const Box &tile) const {
  return termsValue(flops[static_cast<int>(p)], tile);
}

static bool contains(const std::vector<int> &v, int x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

int64_t OpSemantics::tileBytes(Pass p, const Box &tile,
                               const std::vector<DType> &inTypes,
                               const std::vector<DType> &outTypes) const {
  int64_t bytes = 0;
  auto in = [&](int i) {
    return inputRegion(i, tile).volume() * dtypeBytes(inTypes[i]);
  };
  auto out = [&](int j) {
    return outputRegion(j, tile).volume() * dtypeBytes(outTypes[j]);
  };
  // Every pass but forward reads the output gradients.
  for (size_t j = 0; j < outputs.size(); ++j)
    if (outputs[j].present)
      bytes += out(static_cast<int>(j));
  for (size_t k = 0; k < inputs.size(); ++k) {
    int i = static_cast<int>(k);
    if (!inputs[i].present)
      continue;
    bool weight = contains(weightInputs, i);
    switch (p) {
    case Pass::Forward:
      bytes += in(i);
      break;
    case Pass::BackwardData:
      // Reads weights, writes gradients of activations.
      if (weight || contains(gradInputs, i))
        bytes += in(i);
      break;
    case Pass::BackwardWeight:
      // Reads activations, writes weight gradients; nothing without weights.
      if (!weightInputs.empty())
        bytes += in(i);
      break;
    }
  }
  if (p == Pass::BackwardData)
    bytes += savedBytes(tile, inTypes, outTypes);
  if (p == Pass::BackwardWeight && weightInputs.empty())
    return 0;
  return bytes;
}

int64_t OpSemantics::savedBytes(const Box &tile,
                                const std::vector<DType> &inTypes,
                                const std::vector<DType> &outTypes) const {
  double bytes = termsValue(savedExtraBytes, tile);
  for (const SavedOperand &s : saved) {
    // A ring-split tile keeps only its own block of what the ring brings
    // (backward passes the blocks round again).
    Box r = s.isOutput ? outputRegion(s.index, tile)
                       : inputRegion(s.index, ringBlock(s.index, tile));
    bytes += static_cast<double>(r.volume()) * s.bytesPerElement;
  }
  return static_cast<int64_t>(bytes);
}

bool OpSemantics::tileRespectsGranules(const Box &tile) const {
  for (size_t l = 0; l < loops.size(); ++l) {
    int64_t g = loops[l].granule;
    if (g > 1 && ((tile.lo[l] % g) != 0 ||
                  (tile.hi[l] % g != 0 && tile.hi[l] != loops[l].size)))
      return false;
  }
  return true;
}

} // namespace soap
