// Dense boxes of tensors in global coordinates, the point iterator that
// walks a tile's loop space and gives every operand's offset, and the
// per-tile state the kernels work on (private to lib/Exec).
#ifndef SOAP_EXEC_TENSOR_H
#define SOAP_EXEC_TENSOR_H

#include "Memory.h"
#include "soap/IR/Graph.h"
#include <algorithm>
#include <cassert>
#include <cstdint>
#include <vector>

namespace soap {
namespace exec {

/// A box of a tensor held densely, row-major over the box.
struct Buf {
  Box box;
  FloatVec data;

  void reset(const Box &b, float v = 0) {
    box = b;
    data.assign(static_cast<size_t>(std::max<int64_t>(b.volume(), 0)), v);
  }
  size_t size() const { return data.size(); }
  /// Frees the data, keeping the box (kernels read boxes of operands they
  /// do not read data of).
  void drop() { release(data); }
};

/// Row-major strides of a box.
std::vector<int64_t> boxStrides(const Box &b);

enum class Combine { Sum, Max, Copy };

/// dst[p] (op)= src[p] for every point p of `region`, which both boxes
/// contain.
void combineRegion(const Box &region, const Box &srcBox, const float *src,
                   const Box &dstBox, float *dst, Combine c);
/// Packs `region` of `src` (over srcBox) contiguously, and the inverse.
void packRegion(const Box &region, const Box &srcBox, const float *src,
                float *out);

/// Calls f(flatIndexInTensor, offsetInBox) for every point of `box`.
template <class F>
void forEachIndex(const Box &box, const std::vector<int64_t> &shape, F f) {
  if (box.empty())
    return;
  size_t r = box.rank();
  std::vector<int64_t> tstr(r, 1);
  for (size_t d = r; d-- > 1;)
    tstr[d - 1] = tstr[d] * shape[d];
  std::vector<int64_t> i = box.lo;
  int64_t off = 0;
  for (;;) {
    int64_t flat = 0;
    for (size_t d = 0; d < r; ++d)
      flat += i[d] * tstr[d];
    f(flat, off++);
    size_t d = r;
    while (d > 0) {
      --d;
      if (++i[d] < box.hi[d])
        break;
      i[d] = box.lo[d];
      if (d == 0)
        return;
    }
    if (r == 0)
      return;
  }
}

/// Calls f(flatIndexInTensor, offsetInBox, n) for runs of n consecutive
/// points of `box` that are consecutive in the tensor too.
template <class F>
void forEachIndexRun(const Box &box, const std::vector<int64_t> &shape, F f) {
  if (box.empty())
    return;
  size_t r = box.rank();
  if (r == 0) {
    f(int64_t(0), int64_t(0), int64_t(1));
    return;
  }
  // Trailing dims the box covers whole merge into the run.
  size_t k = r - 1;
  int64_t run = box.hi[k] - box.lo[k];
  while (k > 0 && box.lo[k] == 0 && box.hi[k] == shape[k]) {
    --k;
    run *= box.hi[k] - box.lo[k];
  }
  std::vector<int64_t> tstr(r, 1);
  for (size_t d = r; d-- > 1;)
    tstr[d - 1] = tstr[d] * shape[d];
  std::vector<int64_t> i = box.lo;
  int64_t off = 0;
  for (;;) {
    int64_t flat = 0;
    for (size_t d = 0; d < r; ++d)
      flat += i[d] * tstr[d];
    f(flat, off, run);
    off += run;
    size_t d = k;
    for (;;) {
      if (d == 0)
        return;
      --d;
      if (++i[d] < box.hi[d])
        break;
      i[d] = box.lo[d];
    }
  }
}

/// An operand of the point iterator: a tensor map and the box its buffer
/// holds. The map's dims must be affine (no `full` dims).
struct Operand {
  const TensorMap *map;
  Box box;
};

/// A map over a subset of an op's loops: each loop in `keep` is a dim of
/// its full size, every other loop a dim of size 1 (index 0). Statistics of
/// normalisations live in it ("rows").
TensorMap loopSubsetMap(const OpSemantics &sem, const std::vector<bool> &keep);
/// The box of `tile` in loopSubsetMap(sem, keep).
Box loopSubsetBox(const Box &tile, const std::vector<bool> &keep);

/// Walks every point of `tile` (last loop fastest) and calls f(offs) where
/// offs[o] is operand o's offset in its buffer, or -1 where the point maps
/// outside the tensor (padding).
class PointIter {
public:
  PointIter(const OpSemantics &sem, const std::vector<Operand> &ops);

  template <class F> void run(const Box &tile, F f) {
    std::vector<int64_t> offs(ops_.size());
    runRows(tile, [&](const int64_t *base, const int64_t *step, int64_t n) {
      for (int64_t t = 0; t < n; ++t) {
        for (size_t o = 0; o < offs.size(); ++o)
          offs[o] = base[o] + step[o] * t;
        f(offs.data());
      }
    });
  }

  /// Walks the same points as run() a row of the last loop at a time:
  /// f(base, step, n) where operand o's offset at the row's t-th point is
  /// base[o] + step[o] * t. A row where some operand leaves its tensor
  /// (padding) comes as rows of one point, with -1 for that operand.
  template <class F> void runRows(const Box &tile, F f) {
    size_t L = tile.rank();
    if (tile.empty())
      return;
    size_t n = ops_.size();
    std::vector<int64_t> i = tile.lo;
    // vals[o][d] = sum coeff * i + offset for every operand dim.
    std::vector<std::vector<int64_t>> vals(n);
    for (size_t o = 0; o < n; ++o) {
      const Op_ &op = ops_[o];
      vals[o].resize(op.dims.size());
      for (size_t d = 0; d < op.dims.size(); ++d) {
        int64_t v = op.dims[d].offset;
        for (size_t l = 0; l < L; ++l)
          v += op.dims[d].coeff[l] * i[l];
        vals[o][d] = v;
      }
    }
    std::vector<int64_t> offs(n), zero(n, 0);
    if (L == 0) {
      for (size_t o = 0; o < n; ++o)
        offs[o] = offsetAt(ops_[o], vals[o]);
      f(offs.data(), zero.data(), int64_t(1));
      return;
    }
    // Trailing loops that every operand walks as one progression (and
    // nothing in padding) run as one row: a whole contiguous tensor for
    // element-wise ops, a channel's plane for a normalisation.
    std::vector<int64_t> mstep;
    size_t m = mergedFrom(tile, mstep);
    if (m + 1 < L) {
      int64_t extent = 1;
      for (size_t l = m; l < L; ++l)
        extent *= tile.hi[l] - tile.lo[l];
      for (;;) {
        for (size_t o = 0; o < n; ++o)
          offs[o] = offsetAt(ops_[o], vals[o]);
        f(offs.data(), mstep.data(), extent);
        if (!advance(tile, m, i, vals))
          return;
      }
    }
    // The last loop runs innermost as arithmetic progressions: per operand
    // a start offset, a step, and the range of steps that stay in bounds.
    size_t last = L - 1;
    int64_t extent = tile.hi[last] - tile.lo[last];
    std::vector<int64_t> base(n), step(n), tlo(n), thi(n);
    for (;;) {
      if (affine_) {
        bool whole = true;
        for (size_t o = 0; o < n; ++o) {
          innerRange(ops_[o], vals[o], last, extent, base[o], step[o], tlo[o],
                     thi[o]);
          whole &= tlo[o] == 0 && thi[o] == extent;
        }
        if (whole) {
          f(base.data(), step.data(), extent);
        } else {
          for (int64_t t = 0; t < extent; ++t) {
            for (size_t o = 0; o < n; ++o)
              offs[o] = t >= tlo[o] && t < thi[o] ? base[o] + step[o] * t : -1;
            f(offs.data(), zero.data(), int64_t(1));
          }
        }
      } else {
        for (int64_t t = 0; t < extent; ++t) {
          for (size_t o = 0; o < n; ++o) {
            offs[o] = offsetAt(ops_[o], vals[o]);
            for (size_t d = 0; d < ops_[o].dims.size(); ++d)
              vals[o][d] += ops_[o].dims[d].coeff[last];
          }
          f(offs.data(), zero.data(), int64_t(1));
        }
        for (size_t o = 0; o < n; ++o)
          for (size_t d = 0; d < ops_[o].dims.size(); ++d)
            vals[o][d] -= ops_[o].dims[d].coeff[last] * extent;
      }
      if (!advance(tile, last, i, vals))
        return;
    }
  }

private:
  /// Steps loops [0, outer) of `tile` like an odometer (loop outer - 1
  /// fastest), keeping every operand's dim values `vals` in step; false
  /// once every point has been visited.
  bool advance(const Box &tile, size_t outer, std::vector<int64_t> &i,
               std::vector<std::vector<int64_t>> &vals) const {
    size_t n = ops_.size();
    for (size_t l = outer; l-- > 0;) {
      if (++i[l] < tile.hi[l]) {
        for (size_t o = 0; o < n; ++o)
          for (size_t d = 0; d < ops_[o].dims.size(); ++d)
            vals[o][d] += ops_[o].dims[d].coeff[l];
        return true;
      }
      int64_t back = tile.hi[l] - 1 - tile.lo[l];
      for (size_t o = 0; o < n; ++o)
        for (size_t d = 0; d < ops_[o].dims.size(); ++d)
          vals[o][d] -= ops_[o].dims[d].coeff[l] * back;
      i[l] = tile.lo[l];
    }
    return false;
  }

  static int64_t floorDivI(int64_t a, int64_t b) {
    int64_t q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0)))
      --q;
    return q;
  }
  struct Dim_ {
    std::vector<int64_t> coeff; // per loop
    int64_t offset, divisor, size, lo, hi, stride;
  };
  struct Op_ {
    std::vector<Dim_> dims;
  };

  /// The first of the trailing loops that runRows may walk as one row
  /// (L - 1 when none merge), and each operand's step along that row: the
  /// map is affine, every point of the tile is inside every tensor, and each
  /// merged loop steps by the row's step times the extent after it.
  size_t mergedFrom(const Box &tile, std::vector<int64_t> &mstep) const {
    size_t L = tile.rank();
    if (!affine_ || L < 2)
      return L - 1;
    for (const Op_ &op : ops_)
      for (const Dim_ &dm : op.dims) {
        int64_t vmin = dm.offset, vmax = dm.offset;
        for (size_t l = 0; l < L; ++l) {
          int64_t c = dm.coeff[l];
          vmin += c * (c > 0 ? tile.lo[l] : tile.hi[l] - 1);
          vmax += c * (c > 0 ? tile.hi[l] - 1 : tile.lo[l]);
        }
        if (vmin < 0 || vmax >= dm.size)
          return L - 1;
      }
    auto stepOf = [&](const Op_ &op, size_t l) {
      int64_t s = 0;
      for (const Dim_ &dm : op.dims)
        s += dm.coeff[l] * dm.stride;
      return s;
    };
    mstep.clear();
    for (const Op_ &op : ops_)
      mstep.push_back(stepOf(op, L - 1));
    size_t m = L - 1;
    int64_t span = tile.hi[L - 1] - tile.lo[L - 1];
    while (m > 0) {
      size_t l = m - 1;
      int64_t ext = tile.hi[l] - tile.lo[l];
      bool ok = true;
      if (ext > 1)
        for (size_t o = 0; o < ops_.size() && ok; ++o)
          ok = stepOf(ops_[o], l) == mstep[o] * span;
      if (!ok)
        break;
      span *= ext;
      m = l;
    }
    return m;
  }

  /// The buffer offset of the point whose dim values are `v`, or -1.
  static int64_t offsetAt(const Op_ &op, const std::vector<int64_t> &v) {
    int64_t off = 0;
    for (size_t d = 0; d < op.dims.size(); ++d) {
      const Dim_ &dm = op.dims[d];
      int64_t idx = dm.divisor == 1 ? v[d] : floorDivI(v[d], dm.divisor);
      if (idx < 0 || idx >= dm.size)
        return -1;
      assert(idx >= dm.lo && idx < dm.hi && "point outside its buffer");
      off += (idx - dm.lo) * dm.stride;
    }
    return off;
  }

  /// For loop `l` stepping t = 0 .. extent-1 from the dim values `v`: the
  /// offset at t = 0 (as if in bounds), its step, and the t range in bounds.
  static void innerRange(const Op_ &op, const std::vector<int64_t> &v, size_t l,
                         int64_t extent, int64_t &base, int64_t &step,
                         int64_t &tlo, int64_t &thi) {
    base = step = 0;
    tlo = 0;
    thi = extent;
    for (size_t d = 0; d < op.dims.size(); ++d) {
      const Dim_ &dm = op.dims[d];
      int64_t c = dm.coeff[l];
      base += (v[d] - dm.lo) * dm.stride;
      step += c * dm.stride;
      if (c == 0) {
        if (v[d] < 0 || v[d] >= dm.size)
          thi = 0;
        continue;
      }
      // 0 <= v + c t <= size - 1
      int64_t a, b;
      if (c == 1) {
        a = -v[d];
        b = dm.size - 1 - v[d];
      } else if (c > 0) {
        a = -floorDivI(v[d], c); // ceil(-v / c)
        b = floorDivI(dm.size - 1 - v[d], c);
      } else {
        a = -floorDivI(dm.size - 1 - v[d], -c); // ceil((v - size + 1) / -c)
        b = floorDivI(v[d], -c);
      }
      tlo = std::max(tlo, a);
      thi = std::min(thi, b + 1);
    }
    if (thi < tlo)
      thi = tlo;
  }

  std::vector<Op_> ops_;
  bool affine_ = true; ///< every divisor is 1
};

/// One task of an op on this rank: tile `tile`, replica `replica`.
struct Task {
  int64_t tile = 0;
  int32_t replica = 0;
  Box loops;
  std::vector<Buf> in, out;   ///< per operand; empty box when absent
  std::vector<Buf> gin, gout; ///< gradients (gin: contributions)
  std::vector<Buf> saved;     ///< kernel-specific state kept for backward
  IndexVec arg;               ///< MaxPool's argmax offsets
  /// A byte per output element between the forward and the backward: a
  /// Relu's output kept as whether it is positive, a Dropout's mask (what
  /// each backward reads).
  std::vector<uint8_t, TrackedAllocator<uint8_t>> mask;
};

/// Combines per-task buffers of "rows" among the tiles that share them
/// (tiles differing only in `statLoops`): every rank calls it, with its
/// local tasks' buffers (over loopSubsetBox(tile, !statLoops)), in the same
/// order for an op; afterwards every buffer holds the combination over all
/// tiles of its group.
class StatsExchange {
public:
  virtual ~StatsExchange();
  /// `keep`: the op's loops that index the rows (the others are reduced).
  virtual void allReduce(const std::vector<bool> &keep,
                         std::vector<Buf *> &rows, Combine c) = 0;
  /// Like allReduce over `keep`, but loop `wide` (kept) spans its whole
  /// extent in every buffer. `partial` false: each tile gives its own range
  /// of `wide` and every buffer ends with all of them (an all-gather among
  /// the tiles that differ only in `wide`); true: each gives the whole
  /// buffer and every buffer ends with their sum (partial sums).
  virtual void allGather(const std::vector<bool> &keep, int wide,
                         std::vector<Buf *> &rows, bool partial) = 0;
};

/// What a kernel sees of its op on this rank.
struct KernelCtx {
  const Graph &graph;
  const Op &op;
  std::vector<Task> &tasks;
  StatsExchange &stats;
  uint64_t seed;
  int64_t step;
};

} // namespace exec
} // namespace soap

#endif // SOAP_EXEC_TENSOR_H
