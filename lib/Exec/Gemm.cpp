// Contractions as batched matrix products: loop roles from the index maps,
// operands used in place where their buffers are strided matrices, packed
// through the point iterator where they are not, and oneDNN's sgemm (or,
// built without oneDNN, a plain loop) for the products.
#include "Gemm.h"

#include "Kernels.h"
#include <algorithm>
#include <cassert>
#ifdef SOAP_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>
// oneDNN runs on libgomp's OpenMP pool (Debian's libdnnl2); its size is
// the one knob of its threads. Declared here rather than through <omp.h>
// so that no OpenMP compiler flag (and no second OpenMP runtime) is needed.
extern "C" void omp_set_num_threads(int);
#endif

namespace soap {
namespace exec {

bool haveLibraryGemm() {
#ifdef SOAP_HAVE_DNNL
  return true;
#else
  return false;
#endif
}

void setKernelThreads(int n) {
#ifdef SOAP_HAVE_DNNL
  omp_set_num_threads(std::max(n, 1));
#else
  (void)n;
#endif
}

namespace {

/// The leading dimension of `v` as a row-major matrix, or 0 if it is not
/// one (no unit column stride). Strides of extent-1 dims do not matter.
int64_t rowMajorLd(const MatView &v) {
  if (v.cols > 1 && v.cs != 1)
    return 0;
  int64_t ld = v.rows > 1 ? v.rs : std::max<int64_t>(v.cols, 1);
  return ld >= std::max<int64_t>(v.cols, 1) ? ld : 0;
}

/// A contiguous row-major copy of `v`.
std::vector<float> copyOf(const MatView &v) {
  std::vector<float> out(static_cast<size_t>(v.rows * v.cols));
  for (int64_t r = 0; r < v.rows; ++r)
    for (int64_t c = 0; c < v.cols; ++c)
      out[static_cast<size_t>(r * v.cols + c)] = v.p[r * v.rs + c * v.cs];
  return out;
}

/// An operand of the BLAS call: its transpose flag, pointer and leading
/// dimension; `keep` holds a copy when the view has no unit stride.
const float *blasOperand(const MatView &v, char &trans, int64_t &ld,
                         std::vector<float> &keep) {
  if ((ld = rowMajorLd(v))) {
    trans = 'N';
    return v.p;
  }
  if ((ld = rowMajorLd(v.t()))) {
    trans = 'T';
    return v.p;
  }
  keep = copyOf(v);
  trans = 'N';
  ld = std::max<int64_t>(v.cols, 1);
  return keep.data();
}

void sgemm(char ta, char tb, int64_t m, int64_t n, int64_t k, float alpha,
           const float *a, int64_t lda, const float *b, int64_t ldb, float *c,
           int64_t ldc) {
#ifdef SOAP_HAVE_DNNL
  dnnl_status_t st =
      dnnl_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, 1.0f, c, ldc);
  assert(st == dnnl_success && "dnnl_sgemm rejected a well-formed call");
  (void)st;
#else
  // Built without oneDNN: the same product as a plain loop nest.
  for (int64_t i = 0; i < m; ++i)
    for (int64_t p = 0; p < k; ++p) {
      float av = alpha * (ta == 'N' ? a[i * lda + p] : a[p * lda + i]);
      for (int64_t j = 0; j < n; ++j)
        c[i * ldc + j] += av * (tb == 'N' ? b[p * ldb + j] : b[j * ldb + p]);
    }
#endif
}

} // namespace

void matmulAcc(const MatView &c, const MatView &a, const MatView &b,
               float alpha) {
  assert(a.rows == c.rows && b.cols == c.cols && a.cols == b.rows &&
         "matrix shapes do not chain");
  int64_t m = c.rows, n = c.cols, k = a.cols;
  if (m <= 0 || n <= 0 || k <= 0)
    return;
  int64_t ldc = rowMajorLd(c);
  if (!ldc) {
    if (rowMajorLd(c.t()))
      return matmulAcc(c.t(), b.t(), a.t(), alpha); // C' += B' A'
    std::vector<float> tmp(static_cast<size_t>(m * n), 0.0f);
    matmulAcc({tmp.data(), m, n, n, 1}, a, b, alpha);
    float *cp = const_cast<float *>(c.p);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t q = 0; q < n; ++q)
        cp[r * c.rs + q * c.cs] += tmp[static_cast<size_t>(r * n + q)];
    return;
  }
  char ta, tb;
  int64_t lda, ldb;
  std::vector<float> ka, kb;
  const float *pa = blasOperand(a, ta, lda, ka);
  const float *pb = blasOperand(b, tb, ldb, kb);
  sgemm(ta, tb, m, n, k, alpha, pa, lda, pb, ldb, const_cast<float *>(c.p),
        ldc);
}

namespace {

enum class Role { None, Batch, Row, Col, Red };

bool uses(const TensorMap &m, int l) {
  for (const DimMap &d : m.dims)
    for (const IndexTerm &t : d.terms)
      if (t.loop == l && t.coeff != 0)
        return true;
  return false;
}

/// An operand's buffer seen as strides over the op's loops: either the
/// buffer itself (plain) or a packed copy laid out batch, then the
/// matrix's row loops, then its column loops.
struct Layout {
  std::vector<int64_t> stride; ///< per op loop (0 where unused)
  int64_t base = 0;
  bool packed = false;
  TensorMap packMap; ///< the packed copy's map over the op's loops
  Box packBox;
  std::vector<float> tmp;
};

/// The roles of the tile's loops: false when a loop of extent > 1 is in
/// none of the four (a reduction of one operand alone, say).
bool classify(const OpSemantics &sem, const Box &tile, std::vector<Role> &r) {
  const TensorMap &y = sem.outputs[0], &a = sem.inputs[0], &b = sem.inputs[1];
  r.assign(sem.loops.size(), Role::None);
  for (size_t l = 0; l < sem.loops.size(); ++l) {
    int li = static_cast<int>(l);
    bool iy = uses(y, li), ia = uses(a, li), ib = uses(b, li);
    if (iy && ia && ib)
      r[l] = Role::Batch;
    else if (iy && ia)
      r[l] = Role::Row;
    else if (iy && ib)
      r[l] = Role::Col;
    else if (ia && ib)
      r[l] = Role::Red;
    else if (tile.hi[l] - tile.lo[l] > 1)
      return false;
  }
  return true;
}

/// The buffer as strides over the loops, when every dim is one loop (or a
/// constant) with no divisor and every point of the tile is inside it.
bool plainStrides(const TensorMap &m, const Box &buf, const Box &tile,
                  Layout &out) {
  out.stride.assign(tile.rank(), 0);
  out.base = 0;
  std::vector<int64_t> bs = boxStrides(buf);
  for (size_t d = 0; d < m.dims.size(); ++d) {
    const DimMap &dm = m.dims[d];
    if (dm.full || dm.divisor != 1 || dm.terms.size() > 1)
      return false;
    int64_t first = dm.offset, last = dm.offset;
    if (!dm.terms.empty()) {
      const IndexTerm &t = dm.terms[0];
      first += t.coeff * tile.lo[t.loop];
      last += t.coeff * (tile.hi[t.loop] - 1);
      out.stride[t.loop] += t.coeff * bs[d];
    }
    if (std::min(first, last) < buf.lo[d] || std::max(first, last) >= buf.hi[d])
      return false;
    out.base += (first - buf.lo[d]) * bs[d];
  }
  return true;
}

/// The loops of `tile` of a role with extent > 1, in loop order.
std::vector<int> loopsOf(const std::vector<Role> &roles, const Box &tile,
                         Role r) {
  std::vector<int> v;
  for (size_t l = 0; l < roles.size(); ++l)
    if (roles[l] == r && tile.hi[l] - tile.lo[l] > 1)
      v.push_back(static_cast<int>(l));
  return v;
}

int64_t extentOf(const std::vector<int> &loops, const Box &tile) {
  int64_t e = 1;
  for (int l : loops)
    e *= tile.hi[l] - tile.lo[l];
  return e;
}

/// The stride of `loops` merged into one index, or 0 when they do not merge.
int64_t mergedStride(const std::vector<int> &loops, const Layout &lay,
                     const Box &tile) {
  if (loops.empty())
    return 1;
  for (size_t i = 0; i + 1 < loops.size(); ++i) {
    int a = loops[i], b = loops[i + 1];
    if (lay.stride[a] != lay.stride[b] * (tile.hi[b] - tile.lo[b]))
      return 0;
  }
  return lay.stride[loops.back()];
}

/// The contraction of one task: its loop groups and operand layouts.
struct Contraction {
  const OpSemantics &sem;
  const Box &tile;
  std::vector<Role> roles;
  std::vector<int> batch, rows, cols, red;

  Contraction(const OpSemantics &s, const Box &t) : sem(s), tile(t) {}

  bool init() {
    if (!classify(sem, tile, roles))
      return false;
    batch = loopsOf(roles, tile, Role::Batch);
    rows = loopsOf(roles, tile, Role::Row);
    cols = loopsOf(roles, tile, Role::Col);
    red = loopsOf(roles, tile, Role::Red);
    return true;
  }

  /// The layout of an operand (map `m`, buffer box `buf`) whose matrix is
  /// `g1` x `g2`: in place when plain and mergeable, else packed.
  Layout layout(const TensorMap &m, const Box &buf, const std::vector<int> &g1,
                const std::vector<int> &g2) const {
    Layout lay;
    if (plainStrides(m, buf, tile, lay) && mergedStride(g1, lay, tile) &&
        mergedStride(g2, lay, tile))
      return lay;
    lay.packed = true;
    lay.base = 0;
    lay.stride.assign(tile.rank(), 0);
    std::vector<int> order = batch;
    order.insert(order.end(), g1.begin(), g1.end());
    order.insert(order.end(), g2.begin(), g2.end());
    int64_t s = 1;
    for (size_t i = order.size(); i-- > 0;) {
      lay.stride[order[i]] = s;
      s *= tile.hi[order[i]] - tile.lo[order[i]];
    }
    for (int l : order) {
      lay.packMap.dims.push_back(DimMap::loop(l));
      lay.packMap.shape.push_back(sem.loops[l].size);
      lay.packBox.lo.push_back(tile.lo[l]);
      lay.packBox.hi.push_back(tile.hi[l]);
    }
    lay.tmp.assign(static_cast<size_t>(s), 0.0f);
    return lay;
  }

  /// The tile with every loop that `m` does not use fixed at its first
  /// index: the points a pack or a scatter of `m` walks.
  Box walkBox(const TensorMap &m) const {
    std::vector<bool> unused(tile.rank());
    for (size_t l = 0; l < tile.rank(); ++l)
      unused[l] = !uses(m, static_cast<int>(l));
    return collapse(tile, unused);
  }

  /// Fills a packed layout from the buffer (padding reads zero).
  void pack(Layout &lay, const TensorMap &m, const Buf &src) const {
    PointIter it(sem, {{&lay.packMap, lay.packBox}, {&m, src.box}});
    float *p = lay.tmp.data();
    const float *x = src.data.data();
    it.run(walkBox(m),
           [&](const int64_t *o) { p[o[0]] = o[1] >= 0 ? x[o[1]] : 0.0f; });
  }

  /// Adds a packed layout into the buffer (padding receives nothing).
  void scatter(const Layout &lay, const TensorMap &m, Buf &dst) const {
    PointIter it(sem, {{&lay.packMap, lay.packBox}, {&m, dst.box}});
    const float *p = lay.tmp.data();
    float *x = dst.data.data();
    it.run(walkBox(m), [&](const int64_t *o) {
      if (o[1] >= 0)
        x[o[1]] += p[o[0]];
    });
  }

  /// The matrix of layout `lay` over groups g1 x g2 at batch offset `off`.
  MatView view(const Layout &lay, const float *data, int64_t off,
               const std::vector<int> &g1, const std::vector<int> &g2) const {
    return {data + lay.base + off, extentOf(g1, tile), extentOf(g2, tile),
            mergedStride(g1, lay, tile), mergedStride(g2, lay, tile)};
  }

  /// Calls f(offsets) for each batch point: offsets[i] is the batch
  /// offset in layout i.
  template <class F>
  void forEachBatch(const std::vector<const Layout *> &lays, F f) const {
    std::vector<int64_t> idx(batch.size(), 0), off(lays.size(), 0);
    for (;;) {
      f(off);
      size_t d = batch.size();
      for (;;) {
        if (d == 0)
          return;
        --d;
        int l = batch[d];
        int64_t ext = tile.hi[l] - tile.lo[l];
        if (++idx[d] < ext) {
          for (size_t i = 0; i < lays.size(); ++i)
            off[i] += lays[i]->stride[l];
          break;
        }
        for (size_t i = 0; i < lays.size(); ++i)
          off[i] -= lays[i]->stride[l] * (ext - 1);
        idx[d] = 0;
      }
    }
  }
};

const float *dataOf(const Layout &lay, const Buf &b) {
  return lay.packed ? lay.tmp.data() : b.data.data();
}

} // namespace

bool gemmForward(const OpSemantics &sem, Task &t, float alpha) {
  Contraction c(sem, t.loops);
  if (!c.init())
    return false;
  const TensorMap &ym = sem.outputs[0], &am = sem.inputs[0],
                  &bm = sem.inputs[1];
  Layout ly = c.layout(ym, t.out[0].box, c.rows, c.cols);
  Layout la = c.layout(am, t.in[0].box, c.rows, c.red);
  Layout lb = c.layout(bm, t.in[1].box, c.red, c.cols);
  if (la.packed)
    c.pack(la, am, t.in[0]);
  if (lb.packed)
    c.pack(lb, bm, t.in[1]);
  const float *y = ly.packed ? ly.tmp.data() : t.out[0].data.data();
  const float *a = dataOf(la, t.in[0]), *b = dataOf(lb, t.in[1]);
  c.forEachBatch({&ly, &la, &lb}, [&](const std::vector<int64_t> &o) {
    matmulAcc(c.view(ly, y, o[0], c.rows, c.cols),
              c.view(la, a, o[1], c.rows, c.red),
              c.view(lb, b, o[2], c.red, c.cols), alpha);
  });
  if (ly.packed)
    c.scatter(ly, ym, t.out[0]);
  return true;
}

bool gemmBackward(const OpSemantics &sem, Task &t, float alpha) {
  Contraction c(sem, t.loops);
  if (!c.init())
    return false;
  const TensorMap &ym = sem.outputs[0], &am = sem.inputs[0],
                  &bm = sem.inputs[1];
  bool wantA = t.gin[0].size() > 0, wantB = t.gin[1].size() > 0;
  Layout ly = c.layout(ym, t.gout[0].box, c.rows, c.cols);
  Layout la = c.layout(am, t.in[0].box, c.rows, c.red);
  Layout lb = c.layout(bm, t.in[1].box, c.red, c.cols);
  if (ly.packed)
    c.pack(ly, ym, t.gout[0]);
  // dA = dY B' needs B; dB = A' dY needs A. The gradient buffers share
  // their operands' boxes, so they share their layouts too (packed ones
  // get their own zeroed copies).
  if (wantB && la.packed)
    c.pack(la, am, t.in[0]);
  if (wantA && lb.packed)
    c.pack(lb, bm, t.in[1]);
  Layout lda = la, ldb = lb;
  if (lda.packed)
    std::fill(lda.tmp.begin(), lda.tmp.end(), 0.0f);
  if (ldb.packed)
    std::fill(ldb.tmp.begin(), ldb.tmp.end(), 0.0f);
  const float *dy = dataOf(ly, t.gout[0]);
  const float *a = dataOf(la, t.in[0]), *b = dataOf(lb, t.in[1]);
  const float *da = lda.packed ? lda.tmp.data() : t.gin[0].data.data();
  const float *db = ldb.packed ? ldb.tmp.data() : t.gin[1].data.data();
  c.forEachBatch({&ly, &la, &lb}, [&](const std::vector<int64_t> &o) {
    MatView vdy = c.view(ly, dy, o[0], c.rows, c.cols);
    if (wantA)
      matmulAcc(c.view(lda, da, o[1], c.rows, c.red), vdy,
                c.view(lb, b, o[2], c.red, c.cols).t(), alpha);
    if (wantB)
      matmulAcc(c.view(ldb, db, o[2], c.red, c.cols),
                c.view(la, a, o[1], c.rows, c.red).t(), vdy, alpha);
  });
  if (wantA && lda.packed)
    c.scatter(lda, am, t.gin[0]);
  if (wantB && ldb.packed)
    c.scatter(ldb, bm, t.gin[1]);
  return true;
}

} // namespace exec
} // namespace soap
