// Folded task graphs (Sim/Fold.h): a symmetric strategy simulated
// on one block of devices gives the full graph's timeline — every block-0
// task's start and end, the iteration time, every device's memory — and a
// strategy that is not symmetric gets the full graph.
#include "SimFixture.h"

#include "soap/Parallel/BuiltinStrategies.h"
#include "soap/Parallel/Megatron.h"
#include "soap/Sim/Fold.h"
#include <map>

using namespace soap;
using namespace soap::test;

namespace {

/// The valid (block, period) pairs of `t` with period = all devices.
std::vector<uint32_t> blockSizes(const Topology &t) {
  std::vector<uint32_t> b;
  for (auto [block, period] : t.foldCandidates())
    if (period == t.numDevices() && t.foldBlock(block, period))
      b.push_back(block);
  std::sort(b.begin(), b.end());
  return b;
}

/// Builds `s` folded and in full and requires the same timeline: the
/// iteration time, every folded task's start and end (found by its key in
/// the full graph), every device's memory and the summed metrics.
int32_t requireSameTimeline(Fixture &f, const Strategy &s) {
  SimContext full = f.ctx, folded = f.ctx;
  folded.fold = true;
  auto a = TaskGraph::build(full, s);
  auto b = TaskGraph::build(folded, s);
  if (!a)
    FAIL(errorMessage(a.takeError()));
  if (!b)
    FAIL(errorMessage(b.takeError()));
  REQUIRE(a->fold().factor == 1);
  Simulator sa(*a), sb(*b);
  Seconds ta = sa.simulateFull(), tb = sb.simulateFull();
  INFO("fold " << b->fold().factor << ": " << b->numAlive() << " of "
               << a->numAlive() << " tasks");
  REQUIRE(ta == tb);
  std::map<TaskKey, const Task *> byKey;
  for (const Task &t : a->tasks())
    if (t.alive)
      byKey[t.key] = &t;
  for (const Task &t : b->tasks()) {
    if (!t.alive)
      continue;
    auto it = byKey.find(t.key);
    REQUIRE(it != byKey.end());
    REQUIRE(it->second->start == t.start);
    REQUIRE(it->second->end == t.end);
  }
  for (DeviceId d = 0; d < f.topo.numDevices(); ++d) {
    const TaskGraph::DeviceMemory &x = a->memory()[d], &y = b->memory()[d];
    REQUIRE(x.weights == y.weights);
    REQUIRE(x.gradients == y.gradients);
    REQUIRE(x.optimizer == y.optimizer);
    REQUIRE(x.saved == y.saved);
    REQUIRE(x.workspace == y.workspace);
  }
  REQUIRE(a->fits() == b->fits());
  SimMetrics ma = sa.metrics(), mb = sb.metrics();
  REQUIRE(ma.transferBytes == mb.transferBytes);
  REQUIRE(ma.collectiveBytes == mb.collectiveBytes);
  REQUIRE(ma.computeTime == Approx(mb.computeTime).epsilon(1e-9));
  REQUIRE(ma.peakMemory == mb.peakMemory);
  if (b->fold().active())
    REQUIRE(b->numAlive() < a->numAlive());
  return b->fold().factor;
}

} // namespace

TEST_CASE("the machines' fold blocks are whole nodes whose routes match",
          "[Sim][fold]") {
  REQUIRE(blockSizes(exampleTopology("p100-4x4")) ==
          std::vector<uint32_t>{4, 8});
  REQUIRE(blockSizes(exampleTopology("dgx-h100-8")) ==
          std::vector<uint32_t>{8, 16, 32});
  REQUIRE(blockSizes(exampleTopology("dgx-h100-1")).empty());
  // Racks of 32 nodes: a block of 16 nodes is half a rack, and a block's
  // routes stay on its own nodes' links (the spine is not contended).
  std::vector<uint32_t> big = blockSizes(exampleTopology("dgx-h100-128"));
  REQUIRE(big == std::vector<uint32_t>{8, 16, 32, 64, 128, 256, 512});
}

TEST_CASE("configFolds: sample blocks move with the devices, or stay",
          "[Sim][fold]") {
  Fixture f("mlp", 64, "p100-4x4");
  const Op &op = f.g->op(0);
  // Sample split 16 ways over the 16 devices: folds over 4 and 8.
  OpConfig dp = f.sampleSplit(0, 0, 16);
  REQUIRE(configFolds(dp, op.sem, 4, 16));
  REQUIRE(configFolds(dp, op.sem, 8, 16));
  // Within periods of 8 (two blocks of 4) a move does not map it on itself.
  REQUIRE(!configFolds(dp, op.sem, 4, 8));
  // On the first 8 devices only: not over 8 (block 1 has nothing).
  OpConfig half = f.sampleSplit(0, 0, 8);
  REQUIRE(!configFolds(half, op.sem, 8, 16));
  // The whole tile on every device (replicas): folds, nothing moves.
  OpConfig rep = OpConfig::single(op.sem, 0);
  rep.replicas = 16;
  rep.devices.clear();
  for (DeviceId d = 0; d < 16; ++d)
    rep.devices.push_back(d);
  REQUIRE(configFolds(rep, op.sem, 4, 16));
  // Devices out of order across blocks: not symmetric.
  OpConfig odd = dp;
  std::swap(odd.devices[0], odd.devices[5]);
  REQUIRE(!configFolds(odd, op.sem, 4, 16));
}

TEST_CASE("a folded graph gives the full graph's timeline", "[Sim][fold]") {
  SECTION("data parallelism, ZeRO and recomputation on p100-4x4") {
    for (const char *model : {"lenet", "mlp", "transformer_small"}) {
      Fixture f(model, 64, "p100-4x4");
      Strategy s = dataParallel(*f.g, f.topo);
      INFO(model);
      REQUIRE(requireSameTimeline(f, s) == 4);
      for (int zs : {1, 2, 3}) {
        s.zero = zeroPolicy(*f.g, s, zs);
        s.recompute = recomputePolicy(*f.g, zs == 3);
        INFO("ZeRO-" << zs);
        REQUIRE(requireSameTimeline(f, s) == 4);
      }
    }
  }
  SECTION("Megatron's tensor, pipeline and data parallelism on dgx-h100-8") {
    Fixture f("transformer_small", 64, "dgx-h100-8");
    // Pipeline-major layout: stage s on devices [16 s ...), its d
    // data-parallel replicas t devices apart; a group holds whole nodes.
    struct Case {
      int32_t t, p, folds;
    };
    for (auto [t, p, expected] :
         {Case{8, 2, 4}, Case{4, 4, 2}, Case{8, 4, 2}, Case{2, 1, 8}})
      for (bool sp : {false, true}) {
        // (With sequence parallelism: reduce-scatters and all-gathers.)
        auto s = megatronStrategy(*f.g, f.topo, MegatronShape{t, p, 0, sp});
        if (!s)
          FAIL(errorMessage(s.takeError()));
        INFO("t=" << t << " p=" << p << " sp=" << sp);
        REQUIRE(requireSameTimeline(f, *s) == expected);
      }
  }
  SECTION("a CNN with split statistics on dgx-h100-2") {
    Fixture f("resnet_small", 32, "dgx-h100-2");
    REQUIRE(requireSameTimeline(f, dataParallel(*f.g, f.topo)) == 2);
  }
}

TEST_CASE("a strategy that crosses blocks gets the full graph",
          "[Sim][fold]") {
  Fixture f("mlp", 64, "p100-4x4");
  Strategy s = dataParallel(*f.g, f.topo);
  // The last op replicated whole on every device: each block's copy needs
  // every block's samples.
  OpId last = OpId(f.g->numOps() - 1);
  OpConfig rep = OpConfig::single(f.g->op(last).sem, 0);
  rep.replicas = 16;
  rep.devices.clear();
  for (DeviceId d = 0; d < 16; ++d)
    rep.devices.push_back(d);
  s.configs[size_t(last)] = rep;
  REQUIRE(strategyFold(*f.g, f.topo, s).active());
  REQUIRE(requireSameTimeline(f, s) == 1);
}

TEST_CASE("delta simulation on a folded graph", "[Sim][fold]") {
  Fixture f("transformer_small", 64, "p100-4x4");
  SimContext folded = f.ctx;
  folded.fold = true;
  Strategy s = dataParallel(*f.g, f.topo);
  // Every weight its own all-reduce, whose start the order below moves.
  s.gradSync.bucketParams = 1;
  auto tg = TaskGraph::build(folded, s);
  if (!tg)
    FAIL(errorMessage(tg.takeError()));
  REQUIRE(tg->fold().factor == 4);
  Simulator sim(*tg);
  Seconds before = sim.simulateFull();
  // A symmetric change (half the sample split, two copies of each tile):
  // delta on the folded graph equals a full simulation of the full graph.
  OpId o = 3;
  OpConfig c = f.sampleSplit(o, 0, 8);
  c.replicas = 2;
  c.devices.clear();
  for (DeviceId d = 0; d < 16; ++d)
    c.devices.push_back(d);
  REQUIRE(configFolds(c, f.g->op(o).sem, 4, 16));
  auto t = sim.apply(o, c);
  if (!t)
    FAIL(errorMessage(t.takeError()));
  Strategy s2 = s;
  s2.configs[size_t(o)] = c;
  auto full = TaskGraph::build(f.ctx, s2);
  Simulator fs(*full);
  REQUIRE(*t == fs.simulateFull());
  REQUIRE(!sim.undo());
  REQUIRE(sim.iterationTime() == before);
  // A weight-gradient order changes no device's share: the folded graph
  // takes it, and its delta equals a full simulation of the full graph.
  OpId w = -1;
  for (const Op &op : f.g->ops())
    if (tg->weightGradOrders(op.id).size() == 3)
      w = op.id;
  REQUIRE(w >= 0);
  auto tl = sim.apply(w, s.configs[size_t(w)], WeightGradOrder::Last);
  if (!tl)
    FAIL(errorMessage(tl.takeError()));
  Strategy s3 = s;
  s3.weightGrad.assign(f.g->numOps(), 0);
  s3.weightGrad[size_t(w)] = uint8_t(WeightGradOrder::Last);
  auto fullLast = TaskGraph::build(f.ctx, s3);
  Simulator fl(*fullLast);
  REQUIRE(*tl == fl.simulateFull());
  REQUIRE(*tl != before);
  REQUIRE(!sim.undo());
  REQUIRE(sim.iterationTime() == before);
  REQUIRE(tg->strategy() == s);
  // An asymmetric change is refused and the graph keeps its strategy.
  OpConfig odd = f.sampleSplit(o, 0, 8);
  llvm::Error err = sim.stage(o, odd);
  bool failed = static_cast<bool>(err);
  REQUIRE(failed);
  bool broken = false;
  llvm::handleAllErrors(std::move(err),
                        [&](const FoldBroken &) { broken = true; });
  REQUIRE(broken);
  REQUIRE(tg->strategy() == s);
  REQUIRE(sim.resume().value() == before);
}
