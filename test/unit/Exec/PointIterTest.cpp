// lib/Exec PointIter: runRows (rows of the last loop, merged trailing loops
// where every operand walks them as one progression) visits exactly the
// points of the tile in order, each operand at the offset its map gives
// (-1 in padding), on random tiles of ops with and without padding.
#include "../IR/TestGraphs.h"
#include "Exec/Tensor.h"
#include "soap/Support/Rng.h"
#include <catch2/catch.hpp>

using namespace soap;
using namespace soap::exec;

namespace {

/// Operand offsets of every point of `tile` (last loop fastest), by
/// evaluating the maps point by point.
std::vector<std::vector<int64_t>> bruteForce(const std::vector<Operand> &ops,
                                             const Box &tile) {
  std::vector<std::vector<int64_t>> out;
  std::vector<int64_t> i = tile.lo;
  size_t L = tile.rank();
  for (;;) {
    std::vector<int64_t> offs;
    for (const Operand &o : ops) {
      std::vector<int64_t> st = boxStrides(o.box);
      int64_t off = 0;
      for (size_t d = 0; d < o.map->dims.size() && off >= 0; ++d) {
        const DimMap &m = o.map->dims[d];
        int64_t v = m.offset;
        for (const IndexTerm &t : m.terms)
          v += t.coeff * i[size_t(t.loop)];
        if (v < 0 || v >= o.map->shape[d])
          off = -1;
        else
          off += (v - o.box.lo[d]) * st[d];
      }
      offs.push_back(off);
    }
    out.push_back(offs);
    size_t l = L;
    for (;;) {
      if (l == 0)
        return out;
      --l;
      if (++i[l] < tile.hi[l])
        break;
      i[l] = tile.lo[l];
    }
  }
}

} // namespace

TEST_CASE("PointIter: runRows visits every point at its offsets",
          "[exec][pointiter]") {
  using test::Ints;
  test::GraphBuilder b;
  ValueId x = b.input({2, 3, 6, 5}), y = b.input({1, 3, 1, 5});
  b.op("Conv", {x, b.weight({4, 3, 3, 3})}, {{2, 4, 6, 5}},
       {{"pads", Ints{1, 1, 1, 1}}});
  b.op("Add", {x, y}, {{2, 3, 6, 5}}); // broadcast: steps of 0
  b.op("BatchNormalization",
       {x, b.weight({3}), b.weight({3}), b.weight({3}), b.weight({3})},
       {{2, 3, 6, 5}});
  b.op("Transpose", {x}, {{2, 6, 5, 3}}, {{"perm", Ints{0, 2, 3, 1}}});
  test::requireOk(b.g.computeSemantics());
  Rng rng(31);
  for (const Op &op : b.g.ops()) {
    const OpSemantics &sem = op.sem;
    for (int k = 0; k < 20; ++k) {
      Box tile = sem.fullTile();
      if (k > 0)
        for (size_t l = 0; l < tile.rank(); ++l) {
          int64_t n = tile.hi[l];
          int64_t a = int64_t(rng.uniform(uint64_t(n)));
          int64_t c = int64_t(rng.uniform(uint64_t(n)));
          tile.lo[l] = std::min(a, c);
          tile.hi[l] = std::max(a, c) + 1;
        }
      INFO(op.kind << " tile " << tile.str());
      std::vector<Operand> ops{{&sem.outputs[0], sem.outputRegion(0, tile)}};
      for (size_t i = 0; i < op.inputs.size(); ++i)
        ops.push_back(
            {&sem.inputs[i], sem.inputRegion(static_cast<int>(i), tile)});
      std::vector<std::vector<int64_t>> got;
      PointIter it(sem, ops);
      it.runRows(tile, [&](const int64_t *o, const int64_t *st, int64_t n) {
        for (int64_t t = 0; t < n; ++t) {
          std::vector<int64_t> offs;
          for (size_t q = 0; q < ops.size(); ++q)
            offs.push_back(o[q] < 0 ? -1 : o[q] + st[q] * t);
          got.push_back(offs);
        }
      });
      REQUIRE(got == bruteForce(ops, tile));
    }
  }
}
