// The default collectives of Comm (rings of exchange() batches, what the
// NCCL communicator uses): reduce-scatter, all-gather and all-reduce over a
// group of ranks, with uneven and empty parts, on threads as ranks.
#include "soap/Exec/Comm.h"

#include "ThreadComm.h"
#include <algorithm>
#include <catch2/catch.hpp>
#include <thread>

using namespace soap;
using soap::test::Hub;
using soap::test::ThreadComm;

namespace {

/// Runs f(comm) on `ranks` threads.
template <class F> void onRanks(int ranks, F f) {
  Hub hub;
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      ThreadComm comm(hub, r, ranks);
      f(comm);
    });
  for (std::thread &t : threads)
    t.join();
  REQUIRE(!hub.sizeMismatch);
}

} // namespace

TEST_CASE("Comm: ring reduce-scatter, all-gather and all-reduce",
          "[exec][comm]") {
  // Ranks 1, 2 and 4 of 5 form the group; parts of 3, 3 and 1 floats, and
  // a group with an empty part.
  for (std::vector<size_t> counts :
       {std::vector<size_t>{3, 3, 1}, std::vector<size_t>{2, 0, 2}}) {
    std::vector<int> group{1, 2, 4};
    size_t n = counts[0] + counts[1] + counts[2];
    std::vector<std::vector<float>> rs(5), ag(5), ar(5);
    onRanks(5, [&](Comm &c) {
      int r = c.rank();
      auto it = std::find(group.begin(), group.end(), r);
      if (it == group.end())
        return;
      size_t m = size_t(it - group.begin());
      std::vector<float> v(n);
      for (size_t k = 0; k < n; ++k)
        v[k] = float(100 * r + k);
      c.reduceScatter(group, v.data(), counts);
      rs[r] = v;
      std::vector<float> g(n, -1);
      size_t off = 0;
      for (size_t k = 0; k < m; ++k)
        off += counts[k];
      for (size_t k = 0; k < counts[m]; ++k)
        g[off + k] = float(10 * m + k);
      c.allGather(group, g.data(), counts);
      ag[r] = g;
      std::vector<float> a(n, float(r));
      c.allReduce(group, a.data(), n);
      ar[r] = a;
    });
    size_t off = 0;
    for (size_t m = 0; m < group.size(); ++m) {
      int r = group[m];
      for (size_t k = 0; k < counts[m]; ++k) {
        // Sum over the members of 100 * rank + index.
        CHECK(rs[r][off + k] == float(100 * (1 + 2 + 4) + 3 * (off + k)));
      }
      size_t o2 = 0;
      for (size_t q = 0; q < group.size(); ++q)
        for (size_t k = 0; k < counts[q]; ++k, ++o2)
          CHECK(ag[r][o2] == float(10 * q + k));
      for (size_t k = 0; k < n; ++k)
        CHECK(ar[r][k] == 7.0f);
      off += counts[m];
    }
  }
}
