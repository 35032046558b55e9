// lib/Exec's assemble(): three ranks as threads over an in-process
// communicator; every destination holds, element by element, the sum (or
// max) of the sources that cover it, whichever rank sent them.
#include "Exec/Assemble.h"
#include "ThreadComm.h"
#include <catch2/catch.hpp>
#include <thread>

using namespace soap;
using namespace soap::exec;
using soap::test::Hub;
using soap::test::ThreadComm;

namespace {

Box box(std::vector<int64_t> lo, std::vector<int64_t> hi) {
  Box b;
  b.lo = std::move(lo);
  b.hi = std::move(hi);
  return b;
}

/// The value source `s` holds at (i, j).
float value(size_t s, int64_t i, int64_t j) {
  return static_cast<float>(100 * s + 10 * i + j) * 0.5f - 7;
}

} // namespace

TEST_CASE("assemble: sums and maxima of the covering sources, across ranks",
          "[exec][assemble]") {
  const int n = 3;
  // A [6, 4] tensor: two partial sums of rows 0-2 on ranks 0 and 1, rows
  // 2-6 replicated on ranks 2 and 0, and a column strip on rank 1.
  std::vector<Src> srcs = {{box({0, 0}, {2, 4}), {0}, nullptr},
                           {box({0, 0}, {2, 4}), {1}, nullptr},
                           {box({2, 0}, {6, 4}), {2, 0}, nullptr},
                           {box({0, 3}, {6, 4}), {1}, nullptr}};
  std::vector<Box> want = {box({0, 0}, {6, 4}), box({1, 1}, {4, 3}),
                           box({0, 0}, {6, 2})};
  for (Combine c : {Combine::Sum, Combine::Max}) {
    Hub hub;
    std::vector<std::vector<Buf>> got(n, std::vector<Buf>(want.size()));
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r)
      threads.emplace_back([&, r] {
        ThreadComm comm(hub, r, n);
        std::vector<Buf> held(srcs.size());
        std::vector<Src> mine = srcs;
        for (size_t s = 0; s < srcs.size(); ++s) {
          const std::vector<int> &rs = srcs[s].ranks;
          if (std::find(rs.begin(), rs.end(), r) == rs.end())
            continue;
          held[s].reset(srcs[s].box);
          forEachIndex(srcs[s].box, {6, 4}, [&](int64_t flat, int64_t off) {
            held[s].data[off] = value(s, flat / 4, flat % 4);
          });
          mine[s].buf = &held[s];
        }
        // Every rank asks for every wanted box.
        std::vector<Dst> dsts;
        for (size_t d = 0; d < want.size(); ++d)
          for (int q = 0; q < n; ++q)
            dsts.push_back({want[d], q, q == r ? &got[r][d] : nullptr});
        assemble(comm, mine, dsts, c);
      });
    for (std::thread &t : threads)
      t.join();
    REQUIRE(!hub.sizeMismatch);
    for (int r = 0; r < n; ++r)
      for (size_t d = 0; d < want.size(); ++d) {
        const Buf &b = got[r][d];
        REQUIRE(b.box == want[d]);
        forEachIndex(b.box, {6, 4}, [&](int64_t flat, int64_t off) {
          int64_t i = flat / 4, j = flat % 4;
          float e = c == Combine::Sum ? 0.0f : -1e30f;
          for (size_t s = 0; s < srcs.size(); ++s) {
            const Box &sb = srcs[s].box;
            if (i >= sb.lo[0] && i < sb.hi[0] && j >= sb.lo[1] && j < sb.hi[1])
              e = c == Combine::Sum ? e + value(s, i, j)
                                    : std::max(e, value(s, i, j));
          }
          CHECK(b.data[off] == e);
        });
      }
  }
}
