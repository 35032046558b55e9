// Gradient buckets and the overlap of data-parallel collectives (GradSync,
// TaskGraphBuckets.cpp): one collective per bucket, the time the overlap
// saves against what the exposed collectives cost, and delta simulation
// equal to full simulation with buckets.
#include "SimFixture.h"

#include "soap/Support/Rng.h"
#include <catch2/catch.hpp>

using namespace soap;
using namespace soap::test;

namespace {

/// Device `d`'s summed task time (compute and updates).
Seconds busy(const TaskGraph &tg, DeviceId d) {
  Seconds s = 0;
  for (const Task &t : tg.tasks())
    if (t.alive && !t.resources.empty() && t.resources[0] == d &&
        t.kind != TaskKind::Collective && t.kind != TaskKind::Transfer)
      s += t.exe;
  return s;
}

std::vector<const Task *> collectives(const TaskGraph &tg, CollectiveRole r) {
  std::vector<const Task *> out;
  for (const Task &t : tg.tasks())
    if (t.alive && t.kind == TaskKind::Collective && t.role == r)
      out.push_back(&t);
  return out;
}

/// The parameters of every weight in the order its gradient completes
/// (its lowest user, highest first; ties by weight, highest first): one
/// data-parallel sequence when every op is split by sample alike.
std::vector<int64_t> gradientOrder(const Graph &g) {
  std::vector<std::tuple<OpId, ValueId, int64_t>> ws;
  for (const Value &v : g.values())
    if (v.kind == ValueKind::Weight && !v.users.empty())
      ws.emplace_back(*std::min_element(v.users.begin(), v.users.end()), v.id,
                      v.shape.numElements().value_or(0));
  std::sort(ws.begin(), ws.end(), [](const auto &a, const auto &b) {
    return std::tie(std::get<0>(b), std::get<1>(b)) <
           std::tie(std::get<0>(a), std::get<1>(a));
  });
  std::vector<int64_t> params;
  for (const auto &w : ws)
    params.push_back(std::get<2>(w));
  return params;
}

/// The links between ZeRO-1/2's all-gathers (their chain), by key.
std::set<std::pair<TaskKey, TaskKey>> gatherLinks(const TaskGraph &tg) {
  std::set<std::pair<TaskKey, TaskKey>> out;
  auto gather = [](const Task &t) {
    return t.alive && t.kind == TaskKind::Collective &&
           t.role == CollectiveRole::WeightGather;
  };
  for (const Task &t : tg.tasks())
    if (gather(t))
      for (TaskId x : t.succs)
        if (gather(tg.tasks()[x]))
          out.emplace(t.key, tg.tasks()[x].key);
  return out;
}

} // namespace

TEST_CASE("one gradient collective per bucket", "[Sim][gradsync]") {
  Fixture f("gpt2", 16, "dgx-h100-1");
  Strategy s = f.pipelined(1, 2, PipelineSchedule::OneFOneB, 8);
  s.zero = zeroPolicy(*f.g, s, 1);
  std::vector<int64_t> params = gradientOrder(*f.g);
  int64_t total = 0;
  for (int64_t p : params)
    total += p;
  for (int64_t size : {int64_t(0), int64_t(1), int64_t(10000000),
                       int64_t(30000000), total}) {
    INFO("bucket_size " << size);
    // Megatron's filling: a bucket closes once it holds bucket_size
    // parameters or more (the default: max(40M, 1M x 8)).
    int64_t cap = size > 0 ? size : 40000000;
    size_t buckets = 0;
    int64_t held = cap;
    std::vector<int64_t> bytes;
    for (int64_t p : params) {
      if (held >= cap) {
        ++buckets;
        held = 0;
        bytes.push_back(0);
      }
      held += p;
      bytes.back() += p * 4; // fp32
    }
    s.gradSync.bucketParams = size;
    auto tg = TaskGraph::build(f.ctx, s);
    if (!tg)
      FAIL(errorMessage(tg.takeError()));
    std::vector<const Task *> rs = collectives(*tg, CollectiveRole::WeightGrad);
    CHECK(rs.size() == buckets);
    CHECK(collectives(*tg, CollectiveRole::WeightGather).size() == buckets);
    // Each reduce-scatters its members' gradients at once.
    std::vector<Bytes> got;
    for (const Task *t : rs) {
      CHECK(t->comm == Collective::ReduceScatter);
      got.push_back(t->bytes);
    }
    std::sort(got.begin(), got.end());
    std::sort(bytes.begin(), bytes.end());
    CHECK(got == bytes);
    if (size == 1)
      CHECK(buckets == params.size());
    if (size == total)
      CHECK(buckets == 1);
  }
  // Without overlapped reduction: one bucket whatever the size.
  s.gradSync.bucketParams = 1;
  s.gradSync.overlapGradReduce = false;
  auto one = TaskGraph::build(f.ctx, s);
  REQUIRE(bool(one));
  CHECK(collectives(*one, CollectiveRole::WeightGrad).size() == 1);
}

TEST_CASE("overlap saves what the exposed collectives cost",
          "[Sim][gradsync]") {
  // GPT-2 data parallel over 8 H100s with the distributed optimizer
  // (ZeRO-1), one micro-batch: every device computes alike and waits for
  // nothing else, so an iteration is its busy time (compute and updates)
  // plus what the data-parallel collectives leave exposed.
  Fixture f("gpt2", 64, "dgx-h100-1");
  Strategy on = f.pipelined(1, 1, PipelineSchedule::OneFOneB, 8);
  on.zero = zeroPolicy(*f.g, on, 1);
  on.gradSync.bucketParams = 10000000;
  Strategy off = on;
  off.gradSync.overlapGradReduce = false;
  off.gradSync.overlapParamGather = false;
  auto ton = TaskGraph::build(f.ctx, on);
  auto toff = TaskGraph::build(f.ctx, off);
  REQUIRE(bool(ton));
  REQUIRE(bool(toff));
  Seconds tOn = Simulator(*ton).simulateFull();
  Seconds tOff = Simulator(*toff).simulateFull();
  Seconds work = busy(*toff, 0);
  REQUIRE(busy(*ton, 0) == Approx(work).epsilon(1e-12));
  // Without overlap: one reduce-scatter after the backward, the updates,
  // one all-gather after them, each whole on the critical path.
  std::vector<const Task *> rs = collectives(*toff, CollectiveRole::WeightGrad);
  std::vector<const Task *> ag =
      collectives(*toff, CollectiveRole::WeightGather);
  REQUIRE(rs.size() == 1);
  REQUIRE(ag.size() == 1);
  Seconds exposedOff = tOff - work;
  Seconds collectiveTime = rs[0]->exe + ag[0]->exe;
  INFO("off " << tOff * 1e3 << " ms, on " << tOn * 1e3 << " ms, busy "
              << work * 1e3 << " ms, reduce-scatter " << rs[0]->exe * 1e3
              << " ms, all-gather " << ag[0]->exe * 1e3 << " ms");
  // (Up to rounding; the loss's scalar all-reduce is the only other wait.)
  const double eps = 1e-9;
  CHECK(exposedOff >= collectiveTime * (1 - eps));
  CHECK(exposedOff <= collectiveTime * 1.01);
  // With overlap every bucket's reduce-scatter but the last runs under the
  // backward, and every all-gather but the first (whose weights the first
  // forward reads) under the forward: the saving is the collectives' cost
  // less those two, and never more than the collectives' cost.
  std::vector<const Task *> ron = collectives(*ton, CollectiveRole::WeightGrad);
  std::vector<const Task *> aon =
      collectives(*ton, CollectiveRole::WeightGather);
  REQUIRE(ron.size() > 2);
  REQUIRE(aon.size() == ron.size());
  const Task *lastRs = ron[0], *firstAg = aon[0];
  for (const Task *t : ron)
    if (t->end > lastRs->end)
      lastRs = t;
  for (const Task *t : aon)
    if (t->start < firstAg->start)
      firstAg = t;
  CHECK(firstAg->start == 0);
  Seconds saving = tOff - tOn;
  INFO("saving " << saving * 1e3 << " ms; last reduce-scatter "
                 << lastRs->exe * 1e3 << " ms, first all-gather "
                 << firstAg->exe * 1e3 << " ms");
  // Overlapped, a collective still takes NCCL's share of the devices'
  // time (DeviceSpec::ncclComputeShareIntra), at most that share of each.
  Seconds overlapped = 0;
  for (const Task *t : ron)
    overlapped += t->exe;
  for (const Task *t : aon)
    overlapped += t->exe;
  Seconds contention = f.topo.deviceSpec().ncclComputeShareIntra * overlapped;
  CHECK(saving > 0);
  CHECK(saving <= exposedOff);
  CHECK(saving >= (collectiveTime - lastRs->exe - firstAg->exe) * (1 - eps) -
                      std::max<Seconds>(exposedOff - collectiveTime, 0) -
                      contention);
}

TEST_CASE("delta simulation equals full simulation with buckets",
          "[Sim][gradsync]") {
  // Two stages of 8 devices, 2 micro-batches; buckets of a few weights
  // each; ZeRO-1 (a reduce-scatter per bucket, an all-gather per bucket
  // overlapped with the forward or after the step) and ZeRO-2 (a
  // reduce-scatter per bucket and micro-batch), with and without
  // overlapped reduction (whose buckets wait for every task of their
  // devices). Changes move weights between device groups, so units leave
  // and join buckets.
  // The last variant interleaves 4 stages on 2 groups of 4 devices: each
  // group's all-gathers chain across its two model chunks.
  struct Variant {
    int zero;
    bool reduce, gather, interleaved;
  };
  for (Variant v :
       {Variant{1, true, true, false}, Variant{1, true, false, false},
        Variant{2, false, false, false}, Variant{0, true, true, false},
        Variant{1, true, true, true}}) {
    Fixture f("transformer_small", 32, "p100-4x4");
    int32_t per = v.interleaved ? 4 : 8;
    Strategy s = f.pipelined(v.interleaved ? 4 : 2, v.interleaved ? 4 : 2,
                             PipelineSchedule::OneFOneB, size_t(per));
    if (v.interleaved) {
      s.pipeline.chunks = 2;
      for (OpConfig &c : s.configs)
        for (DeviceId &d : c.devices)
          d = DeviceId(s.pipeline.group(int32_t(d) / 4) * 4 + d % 4);
    }
    if (v.zero)
      s.zero = zeroPolicy(*f.g, s, v.zero);
    s.gradSync.overlapGradReduce = v.reduce;
    s.gradSync.overlapParamGather = v.gather;
    s.gradSync.bucketParams = 200000;
    auto tg = TaskGraph::build(f.ctx, s);
    if (!tg)
      FAIL(errorMessage(tg.takeError()));
    REQUIRE(collectives(*tg, CollectiveRole::WeightGrad).size() > 2);
    Simulator sim(*tg);
    sim.simulateFull();
    Rng rng(29, "gradsync-delta");
    for (int step = 0; step < 20; ++step) {
      OpId o = OpId(rng.uniform(f.g->numOps()));
      OpConfig c = f.sampleSplit(
          o, DeviceId(s.pipeline.group(s.pipeline.stage(o)) * per),
          int32_t(1) << rng.uniform(v.interleaved ? 3 : 4));
      INFO("ZeRO-" << v.zero << " overlap " << v.reduce << v.gather
                   << (v.interleaved ? " interleaved" : "") << " step "
                   << step);
      f.checkDelta(sim, *tg, s, o, c, rng.uniform(3) == 0);
      // The all-gathers' order: every link of a fresh graph's chain is in
      // the changed one (which may keep a redundant one besides).
      auto fresh = TaskGraph::build(f.ctx, s);
      REQUIRE(bool(fresh));
      std::set<std::pair<TaskKey, TaskKey>> have = gatherLinks(*tg);
      for (const auto &l : gatherLinks(*fresh))
        CHECK(have.count(l));
    }
  }
}
