// mcmc's structural moves (McmcMoves.h): a stage's device count
// moved to its neighbour keeps every stage on its own contiguous range with
// every op re-mapped inside it, the strategy still verifies, and a boundary
// or micro-batch move changes only what it says.
#include "soap/Search/McmcMoves.h"

#include "../Sim/SimFixture.h"

#include "soap/Parallel/ConfigSpace.h"
#include "soap/Support/Rng.h"
#include <catch2/catch.hpp>
#include <set>

using namespace soap;
using namespace soap::test;

namespace {

/// Every op of stage `st` uses devices inside `r` only.
bool insideRange(const Strategy &s, int32_t st, DeviceRange r) {
  for (size_t o = 0; o < s.configs.size(); ++o)
    if (s.pipeline.stage(OpId(o)) == st)
      for (DeviceId d : s.configs[o].devices)
        if (d < r.first || d > r.second)
          return false;
  return true;
}

} // namespace

TEST_CASE("stage device ranges and placement inside a range",
          "[Search][mcmc]") {
  Fixture f("transformer_small", 32, "p100-4x4");
  Strategy s = f.pipelined(4, 4, PipelineSchedule::OneFOneB, 4);
  auto r = stageDeviceRanges(s, 16);
  REQUIRE(r.size() == 4);
  for (int32_t st = 0; st < 4; ++st)
    CHECK(r[size_t(st)] == DeviceRange(DeviceId(st * 4), DeviceId(st * 4 + 3)));
  // Two tasks placed on devices 5, 6 move into [8, 11] at the same offset
  // within a 4-device window; five tasks do not fit.
  OpConfig c = f.sampleSplit(0, 5, 2);
  REQUIRE(placeInRange({8, 11}, c));
  CHECK(c.devices == std::vector<DeviceId>{9, 10});
  OpConfig wide = f.sampleSplit(0, 0, 8);
  CHECK_FALSE(placeInRange({8, 11}, wide));
}

TEST_CASE("moving devices between stages keeps every op in its stage",
          "[Search][mcmc]") {
  Fixture f("transformer_small", 32, "p100-4x4");
  ConfigSpace space(*f.g, f.topo, SpaceOptions());
  Strategy s = f.pipelined(2, 2, PipelineSchedule::OneFOneB, 8);
  REQUIRE(f.verifyError(s).empty());
  Rng rng(3, "stage-devices");
  int moved = 0;
  std::set<DeviceId> cuts;
  for (int k = 0; k < 40; ++k) {
    auto ranges = stageDeviceRanges(s, 16);
    auto next = moveStageDevices(s, *f.g, space, ranges, rng);
    if (!next)
      continue;
    ++moved;
    INFO("move " << k);
    CHECK(f.verifyError(*next).empty());
    auto nr = stageDeviceRanges(*next, 16);
    REQUIRE(nr.size() == 2);
    // The two stages keep their combined range [0, 15], cut elsewhere.
    CHECK(nr[0].first == 0);
    CHECK(nr[1].second == 15);
    CHECK(nr[0].second + 1 == nr[1].first);
    CHECK(nr[1].first != ranges[1].first);
    CHECK(insideRange(*next, 0, nr[0]));
    CHECK(insideRange(*next, 1, nr[1]));
    // Stages, micro-batches and schedule are unchanged.
    CHECK(next->pipeline.stageOf == s.pipeline.stageOf);
    CHECK(next->pipeline.microBatches == s.pipeline.microBatches);
    // An op that used its whole stage uses the whole new one, where a
    // valid degree allows (the sample loop of 32 / 2 micro-batches divides
    // by 1, 2, 4, 8 and 16).
    int64_t size1 = int64_t(nr[1].second) - int64_t(nr[1].first) + 1;
    if ((size1 & (size1 - 1)) == 0)
      for (size_t o = 0; o < s.configs.size(); ++o)
        if (next->pipeline.stage(OpId(o)) == 1) {
          CHECK(next->configs[o].numTasks() == size1);
          break;
        }
    cuts.insert(nr[1].first);
    s = *next;
  }
  CHECK(moved > 5);
  CHECK(cuts.size() > 1);
}

TEST_CASE("a stage boundary move and a micro-batch move", "[Search][mcmc]") {
  Fixture f("transformer_small", 32, "p100-4x4");
  ConfigSpace space(*f.g, f.topo, SpaceOptions());
  Strategy s = f.pipelined(2, 2, PipelineSchedule::OneFOneB, 8);
  auto ranges = stageDeviceRanges(s, 16);
  Rng rng(5, "pipeline-move");
  bool boundary = false, micro = false, schedule = false;
  for (int k = 0; k < 80 && !(boundary && micro && schedule); ++k) {
    auto next = pipelineMove(s, *f.g, space, ranges, rng);
    if (!next)
      continue;
    if (next->pipeline.schedule != s.pipeline.schedule) {
      schedule = true;
      CHECK(next->pipeline.schedule == PipelineSchedule::ZbH1);
      CHECK(next->configs == s.configs);
      CHECK(next->pipeline.stageOf == s.pipeline.stageOf);
      continue;
    }
    size_t changedStages = 0;
    for (size_t o = 0; o < s.configs.size(); ++o)
      changedStages += next->pipeline.stageOf[o] != s.pipeline.stageOf[o];
    if (changedStages == 1) {
      boundary = true;
      CHECK(next->pipeline.microBatches == s.pipeline.microBatches);
      CHECK(insideRange(*next, 0, ranges[0]));
      CHECK(insideRange(*next, 1, ranges[1]));
    } else if (next->pipeline.microBatches != s.pipeline.microBatches) {
      micro = true;
      CHECK(changedStages == 0);
      CHECK((next->pipeline.microBatches == 4 ||
             next->pipeline.microBatches == 1));
      CHECK(next->configs == s.configs);
    }
  }
  CHECK(boundary);
  CHECK(micro);
  CHECK(schedule);
}

TEST_CASE("interleaved stages share their device group's range",
          "[Search][mcmc]") {
  Fixture f("transformer_small", 32, "p100-4x4");
  Strategy s = f.pipelined(4, 4, PipelineSchedule::OneFOneB, 8);
  s.pipeline.chunks = 2;
  for (size_t o = 0; o < s.configs.size(); ++o)
    for (DeviceId &d : s.configs[o].devices)
      d = DeviceId(s.pipeline.group(s.pipeline.stage(OpId(o))) * 8 + d % 8);
  auto ranges = stageDeviceRanges(s, 16);
  REQUIRE(ranges.size() == 4);
  CHECK(ranges[0] == DeviceRange{0, 7});
  CHECK(ranges[1] == DeviceRange{8, 15});
  CHECK(ranges[2] == ranges[0]);
  CHECK(ranges[3] == ranges[1]);
  // Device moves would split a group's chunks; the rest keep them whole.
  ConfigSpace space(*f.g, f.topo, SpaceOptions());
  Rng rng(3, "interleaved-move");
  for (int k = 0; k < 40; ++k) {
    auto next = pipelineMove(s, *f.g, space, ranges, rng);
    if (next)
      CHECK(f.verifyError(*next).find("groups") == std::string::npos);
  }
}
