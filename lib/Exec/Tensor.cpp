// Box arithmetic on dense buffers and the point iterator's set-up.
#include "Tensor.h"

namespace soap {
namespace exec {

std::vector<int64_t> boxStrides(const Box &b) {
  std::vector<int64_t> s(b.rank(), 1);
  for (size_t d = b.rank(); d-- > 1;)
    s[d - 1] = s[d] * (b.hi[d] - b.lo[d]);
  return s;
}

namespace {
/// Calls f(srcOffset, dstOffset, run) for each contiguous run of `region`
/// (along its last dim) in two boxes that contain it.
template <class F>
void forEachRun(const Box &region, const Box &a, const Box &b, F f) {
  if (region.empty())
    return;
  size_t r = region.rank();
  if (r == 0) {
    f(0, 0, 1);
    return;
  }
  std::vector<int64_t> sa = boxStrides(a), sb = boxStrides(b);
  std::vector<int64_t> i = region.lo;
  // Trailing dims that the region and both boxes hold whole merge into
  // one run.
  size_t k = r - 1;
  int64_t run = region.hi[k] - region.lo[k];
  auto whole = [&](size_t d) {
    return region.lo[d] == a.lo[d] && region.hi[d] == a.hi[d] &&
           region.lo[d] == b.lo[d] && region.hi[d] == b.hi[d];
  };
  while (k > 0 && whole(k)) {
    --k;
    run *= region.hi[k] - region.lo[k];
  }
  for (;;) {
    int64_t oa = 0, ob = 0;
    for (size_t d = 0; d < r; ++d) {
      oa += (i[d] - a.lo[d]) * sa[d];
      ob += (i[d] - b.lo[d]) * sb[d];
    }
    f(oa, ob, run);
    size_t d = k;
    for (;;) {
      if (d == 0)
        return;
      --d;
      if (++i[d] < region.hi[d])
        break;
      i[d] = region.lo[d];
    }
  }
}
} // namespace

void combineRegion(const Box &region, const Box &srcBox, const float *src,
                   const Box &dstBox, float *dst, Combine c) {
  forEachRun(region, srcBox, dstBox, [&](int64_t so, int64_t dof, int64_t n) {
    const float *s = src + so;
    float *d = dst + dof;
    switch (c) {
    case Combine::Sum:
      for (int64_t k = 0; k < n; ++k)
        d[k] += s[k];
      break;
    case Combine::Max:
      for (int64_t k = 0; k < n; ++k)
        d[k] = std::max(d[k], s[k]);
      break;
    case Combine::Copy:
      std::copy(s, s + n, d);
      break;
    }
  });
}

void packRegion(const Box &region, const Box &srcBox, const float *src,
                float *out) {
  Box packed = region;
  int64_t pos = 0;
  forEachRun(region, srcBox, packed, [&](int64_t so, int64_t, int64_t n) {
    std::copy(src + so, src + so + n, out + pos);
    pos += n;
  });
}

TensorMap loopSubsetMap(const OpSemantics &sem, const std::vector<bool> &keep) {
  TensorMap m;
  for (size_t l = 0; l < sem.loops.size(); ++l) {
    m.dims.push_back(keep[l] ? DimMap::loop(static_cast<int>(l))
                             : DimMap::constant(0));
    m.shape.push_back(keep[l] ? sem.loops[l].size : 1);
  }
  return m;
}

Box loopSubsetBox(const Box &tile, const std::vector<bool> &keep) {
  Box b = tile;
  for (size_t l = 0; l < keep.size(); ++l)
    if (!keep[l]) {
      b.lo[l] = 0;
      b.hi[l] = 1;
    }
  return b;
}

PointIter::PointIter(const OpSemantics &sem, const std::vector<Operand> &ops) {
  size_t L = sem.loops.size();
  for (const Operand &o : ops) {
    Op_ op;
    std::vector<int64_t> str = boxStrides(o.box);
    for (size_t d = 0; d < o.map->dims.size(); ++d) {
      const DimMap &m = o.map->dims[d];
      assert(!m.full && "full dims are not affine");
      Dim_ dm;
      dm.coeff.assign(L, 0);
      for (const IndexTerm &t : m.terms)
        dm.coeff[t.loop] += t.coeff;
      dm.offset = m.offset;
      dm.divisor = m.divisor;
      affine_ &= m.divisor == 1;
      dm.size = o.map->shape[d];
      dm.lo = o.box.lo[d];
      dm.hi = o.box.hi[d];
      dm.stride = str[d];
      op.dims.push_back(std::move(dm));
    }
    ops_.push_back(std::move(op));
  }
}

StatsExchange::~StatsExchange() = default;

} // namespace exec
} // namespace soap
