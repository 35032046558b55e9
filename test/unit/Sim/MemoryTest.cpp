// The simulator's memory at the backward pass's peak, checked by
// hand on mlp_small at batch 64 on one device: MatMul, Relu, MatMul, Relu,
// MatMul, loss, 64 x 32 floats between ops.
#include "SimFixture.h"

#include "soap/Parallel/BuiltinStrategies.h"

#include <catch2/catch.hpp>

using namespace soap;
using namespace soap::test;

TEST_CASE("memory peaks while the loss's backward runs", "[Sim][memory]") {
  Fixture f("mlp_small", 64, "dgx-h100-1");
  Strategy s = f.pipelined(1, 1, PipelineSchedule::OneFOneB, 1);
  const Bytes act = 64 * 32 * 4;
  SimMetrics kept = f.run(s);
  // Saved: each MatMul's input and the loss's probabilities (4 B per
  // element), each Relu's 1-byte mask.
  CHECK(kept.memory[0].saved == 4 * act + 2 * act / 4);
  // While the loss's backward runs everything is still saved, and it reads
  // its scalar output's gradient and writes the logits' (the last MatMul's
  // backward, after the loss's probabilities are freed, holds 4 bytes less).
  CHECK(kept.memory[0].workspace == act + 4);
  // A recomputed Relu keeps its MatMul's whole output for the forward it
  // runs again, not its mask.
  s.recompute.assign(f.g->numOps(), 0);
  s.recompute[1] = 1;
  SimMetrics rc = f.run(s);
  CHECK(rc.memory[0].saved == kept.memory[0].saved - act / 4 + act);
  CHECK(rc.memory[0].workspace == act + 4);
}

namespace {

void checkSameMemory(const Fixture &f, const Strategy &s) {
  auto full = TaskGraph::build(f.ctx, s);
  if (!full)
    FAIL(errorMessage(full.takeError()));
  auto mem = TaskGraph::buildMemory(f.ctx, s);
  if (!mem)
    FAIL(errorMessage(mem.takeError()));
  const auto &a = full->memory(), &b = mem->memory();
  REQUIRE(a.size() == b.size());
  for (size_t d = 0; d < a.size(); ++d) {
    INFO("device " << d);
    CHECK(a[d].weights == b[d].weights);
    CHECK(a[d].gradients == b[d].gradients);
    CHECK(a[d].optimizer == b[d].optimizer);
    CHECK(a[d].saved == b[d].saved);
    CHECK(a[d].buffers == b[d].buffers);
    CHECK(a[d].workspace == b[d].workspace);
  }
  CHECK(full->fits() == mem->fits());
  // The memory-only graph has no task to simulate.
  CHECK(mem->tasks().empty());
  CHECK_FALSE(full->tasks().empty());
}

} // namespace

TEST_CASE("buildMemory gives build's memory without a task",
          "[Sim][memory]") {
  // Searchers drop a strategy that does not fit before building its task
  // graph (evaluateIfFits): the memory must be build()'s exactly, whatever
  // the strategy holds (stages, micro-batches, ZeRO, recomputation, splits
  // of weights across devices).
  Fixture f("transformer_small", 32, "p100-4x4");
  for (const char *name : {"data", "model", "expert"}) {
    INFO(name);
    auto s = builtinStrategy(name, *f.g, f.topo);
    if (!s)
      FAIL(errorMessage(s.takeError()));
    checkSameMemory(f, *s);
  }
  Strategy p = f.pipelined(4, 4, PipelineSchedule::OneFOneB, 4);
  checkSameMemory(f, p);
  Strategy g = f.pipelined(2, 4, PipelineSchedule::GPipe, 8);
  checkSameMemory(f, g);
  for (int stage : {1, 2, 3}) {
    INFO("ZeRO-" << stage);
    Strategy z = f.pipelined(1, 2, PipelineSchedule::OneFOneB, 16);
    z.zero = zeroPolicy(*f.g, z, stage);
    z.recompute = recomputePolicy(*f.g, stage == 3);
    checkSameMemory(f, z);
  }
  // One that does not fit: GPT-2 data parallel at 64 sequences per H100
  // (the activations of 1,024 tokens each).
  Fixture big("gpt2", 512, "dgx-h100-1");
  Strategy dp = big.pipelined(1, 1, PipelineSchedule::OneFOneB, 8);
  auto mem = TaskGraph::buildMemory(big.ctx, dp);
  if (!mem)
    FAIL(errorMessage(mem.takeError()));
  CHECK_FALSE(mem->fits());
  checkSameMemory(big, dp);
}

TEST_CASE("builds that share an assembly cache give the same memory",
          "[Sim][memory]") {
  // A ladder of ZeRO and recomputation over one set of configurations
  // reuses the first build's gradient-assembly bytes (AssemblyCache); every
  // build must hold exactly what a build without the cache holds, and a
  // different micro-batch count or configuration must not be served the
  // entry of another.
  Fixture f("transformer_small", 32, "p100-4x4");
  SimContext cached = f.ctx;
  cached.assembly = std::make_shared<AssemblyCache>();
  auto same = [&](const Strategy &s, bool memoryOnly) {
    auto a = TaskGraph::build(f.ctx, s);
    auto b = memoryOnly ? TaskGraph::buildMemory(cached, s)
                        : TaskGraph::build(cached, s);
    if (!a)
      FAIL(errorMessage(a.takeError()));
    if (!b)
      FAIL(errorMessage(b.takeError()));
    const auto &x = a->memory(), &y = b->memory();
    REQUIRE(x.size() == y.size());
    for (size_t d = 0; d < x.size(); ++d) {
      INFO("device " << d);
      REQUIRE(x[d].total() == y[d].total());
      REQUIRE(x[d].workspace == y[d].workspace);
    }
  };
  auto model = builtinStrategy("model", *f.g, f.topo);
  if (!model)
    FAIL(errorMessage(model.takeError()));
  same(*model, true);
  REQUIRE(cached.assembly->hits() == 0);
  same(*model, false);
  REQUIRE(cached.assembly->hits() == 1);
  Strategy p = f.pipelined(2, 2, PipelineSchedule::OneFOneB, 8);
  same(p, true); // another strategy: computed again
  REQUIRE(cached.assembly->hits() == 1);
  for (int stage : {1, 2, 3}) {
    INFO("ZeRO-" << stage);
    p.zero = zeroPolicy(*f.g, p, stage);
    p.recompute = recomputePolicy(*f.g, stage == 3);
    same(p, true);
    REQUIRE(cached.assembly->hits() == size_t(1 + stage));
  }
  // Twice the micro-batches: tiles of half the samples, not the entry's.
  p.pipeline.microBatches = 4;
  same(p, false);
  REQUIRE(cached.assembly->hits() == 4);
  same(*model, false);
  REQUIRE(cached.assembly->hits() == 4);
}
