// Megatron-LM pads the vocabulary to a multiple of 128 x the tensor-parallel
// degree (Strategy::vocabPadding): the LM head, the embedding and the loss
// run on the padded columns, which keeps the LM head's GEMM aligned.
#include "SimFixture.h"

#include "soap/Parallel/Megatron.h"
#include "soap/Parallel/WhatIf.h"

using namespace soap;
using namespace soap::test;

TEST_CASE("a padded vocabulary prices the vocabulary ops on V' columns",
          "[Sim][vocab]") {
  // GPT-2's 50,257 tokens; Megatron-LM pads them to 50,304 at tp = 1.
  Fixture f("gpt2", 8, "dgx-h100-1");
  const Graph &g = *f.g;
  std::vector<int> loops = vocabularyLoops(g);
  size_t found = 0;
  for (const Op &op : g.ops())
    if (loops[size_t(op.id)] >= 0) {
      CHECK(op.sem.loops[size_t(loops[size_t(op.id)])].size == 50257);
      ++found;
    }
  // The embedding, the LM head, the logits' reshape and the loss at least.
  CHECK(found >= 3);
  auto s = whatIfStrategy("megatron:tp=1", g, f.topo);
  if (!s)
    FAIL(errorMessage(s.takeError()));
  CHECK(s->vocabPadding == kMegatronVocabPadding);
  // A classifier's classes are no vocabulary: nothing is padded.
  CHECK(megatronVocabPadding(*zooModel("alexnet", 8)) == 0);
  Strategy plain = *s;
  plain.vocabPadding = 0;
  auto padded = TaskGraph::build(f.ctx, *s), whole = TaskGraph::build(f.ctx, plain);
  if (!padded || !whole)
    FAIL("build");
  // Each vocabulary op's forward: the kernel of its tile widened to
  // 50,304 columns (only those ops change).
  size_t checked = 0;
  for (size_t i = 0; i < padded->tasks().size(); ++i) {
    const Task &a = padded->tasks()[i], &b = whole->tasks()[i];
    if (!a.alive || a.kind != TaskKind::Forward)
      continue;
    int l = loops[size_t(a.op)];
    if (l < 0) {
      CHECK(a.exe == b.exe);
      continue;
    }
    const Op &op = g.op(a.op);
    Box tile = microBatchTile(s->configs[size_t(a.op)], op.sem, a.tile, 0,
                              s->pipeline.microBatches);
    REQUIRE(tile.hi[size_t(l)] - tile.lo[size_t(l)] == 50257);
    tile.hi[size_t(l)] = tile.lo[size_t(l)] + 50304;
    auto kt = f.cost.kernel(g, op, tile);
    REQUIRE(bool(kt));
    CHECK(a.exe == kt->forward);
    if (isGemmKind(op.kind))
      CHECK(a.exe > b.exe);
    ++checked;
  }
  CHECK(checked >= 3);
}
