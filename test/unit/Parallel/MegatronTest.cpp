// Megatron-LM's hand-written plan: the column and row splits found through
// the index maps, replicas elsewhere, stages of equal FLOPs, 1F1B.
#include "../TestInputs.h"

#include "soap/Parallel/Megatron.h"
#include <catch2/catch.hpp>

using namespace soap;
using namespace soap::test;

namespace {
std::string configOf(const Graph &g, const Strategy &s, const char *name) {
  OpId o = g.findOp(name);
  REQUIRE(o >= 0);
  return s.configs[size_t(o)].str(g.op(o).sem);
}
} // namespace

TEST_CASE("megatron splits attention and MLP by columns then rows",
          "[Parallel][megatron]") {
  auto g = zooModel("transformer_small", 64);
  Topology topo = exampleTopology("dgx-h100-1");
  auto s = megatronStrategy(*g, topo, {2, 1, 0});
  if (!s)
    FAIL(errorMessage(s.takeError()));
  // Attention: Q, K and V by columns (heads), the heads' ops on their
  // head loop, the output projection by rows; the MLP likewise.
  CHECK(configOf(*g, *s, "/layers.0/attn/query/MatMul") == "b0=4 n=2 @0-7");
  CHECK(configOf(*g, *s, "/layers.0/attn/Reshape") == "d0=4 d2=2 @0-7");
  CHECK(configOf(*g, *s, "/layers.0/attn/Softmax") == "d0=4 d1=2 @0-7");
  CHECK(configOf(*g, *s, "/layers.0/attn/proj/MatMul") == "b0=4 k=2 @0-7");
  CHECK(configOf(*g, *s, "/layers.0/ffn_in/MatMul") == "b0=4 n=2 @0-7");
  CHECK(configOf(*g, *s, "/layers.0/Erf") == "d0=4 d2=2 @0-7");
  CHECK(configOf(*g, *s, "/layers.0/ffn_out/MatMul") == "b0=4 k=2 @0-7");
  // Between the blocks: replicated over the tensor-parallel pair.
  CHECK(configOf(*g, *s, "/layers.0/ln1/LayerNormalization") == "d0=4 x2 @0-7");
  CHECK(s->pipeline.microBatches == 4); // gradient accumulation
  CHECK(s->pipeline.numStages() == 1);
  // Two heads cannot be split four ways: the attention stays replicated.
  auto s4 = megatronStrategy(*g, topo, {4, 1, 0});
  REQUIRE(bool(s4));
  CHECK(configOf(*g, *s4, "/layers.0/attn/Softmax") == "d0=2 x4 @0-7");
  CHECK(configOf(*g, *s4, "/layers.0/ffn_out/MatMul") == "b0=2 k=4 @0-7");
}

TEST_CASE("megatron's sequence parallelism splits the replicated ops along "
          "the sequence",
          "[Parallel][megatron]") {
  auto g = zooModel("transformer_small", 64);
  Topology topo = exampleTopology("dgx-h100-1");
  // The sequence is what the attention's query loop indexes, followed
  // through the index maps: the second loop of the [batch, sequence,
  // hidden] ops, the GEMMs' m, the eager softmax's third.
  std::vector<int> seq = sequenceLoops(*g);
  auto loopName = [&](const char *name) {
    OpId o = g->findOp(name);
    REQUIRE(o >= 0);
    int l = seq[size_t(o)];
    return l < 0 ? std::string("-") : g->op(o).sem.loops[size_t(l)].name;
  };
  CHECK(loopName("/tok/Gather") == "i1");
  CHECK(loopName("/layers.0/ln1/LayerNormalization") == "d1");
  CHECK(loopName("/layers.0/attn/query/MatMul") == "m");
  CHECK(loopName("/layers.0/attn/Softmax") == "d2");
  CHECK(loopName("/layers.0/attn/Transpose") == "d2");
  auto s = megatronStrategy(*g, topo, {2, 1, 0, true});
  if (!s)
    FAIL(errorMessage(s.takeError()));
  // What the tensor split replicates is split along the sequence over the
  // same pair; the tensor split itself is unchanged.
  CHECK(configOf(*g, *s, "/layers.0/ln1/LayerNormalization") ==
        "d0=4 d1=2 @0-7");
  CHECK(configOf(*g, *s, "/layers.0/attn/resid_drop/Dropout") ==
        "d0=4 d1=2 @0-7");
  // The token embedding is vocabulary-parallel (its table split by rows,
  // VocabParallelEmbedding), not split along the sequence.
  CHECK(configOf(*g, *s, "/tok/Gather") == "i0=4 v=2 @0-7");
  CHECK(configOf(*g, *s, "/layers.0/attn/query/MatMul") == "b0=4 n=2 @0-7");
  CHECK(configOf(*g, *s, "/layers.0/attn/Softmax") == "d0=4 d1=2 @0-7");
  CHECK(configOf(*g, *s, "/layers.0/attn/proj/MatMul") == "b0=4 k=2 @0-7");
  // Without attention there is no sequence: nothing changes.
  auto mlp = zooModel("mlp", 64);
  std::vector<int> none = sequenceLoops(*mlp);
  CHECK(std::all_of(none.begin(), none.end(), [](int l) { return l < 0; }));
}

TEST_CASE("megatron's stages hold equal layers, on consecutive nodes",
          "[Parallel][megatron]") {
  auto g = zooModel("transformer", 64);
  Topology topo = exampleTopology("dgx-h100-8");
  auto s = megatronStrategy(*g, topo, {8, 4, 0});
  if (!s)
    FAIL(errorMessage(s.takeError()));
  CHECK(s->pipeline.numStages() == 4);
  CHECK(s->pipeline.microBatches == 16);
  CHECK(s->pipeline.schedule == PipelineSchedule::OneFOneB);
  // Megatron's stages: equal numbers of transformer layers (attentions),
  // whatever the embedding and the LM head add to the first and last.
  std::vector<int> attention(4, 0);
  for (const Op &op : g->ops()) {
    int32_t st = s->pipeline.stage(op.id);
    attention[size_t(st)] += isAttentionOp(op);
    // Stage st on nodes 2st and 2st + 1: devices 16 st .. 16 st + 15.
    for (DeviceId d : s->configs[size_t(op.id)].devices) {
      CHECK(d >= DeviceId(16 * st));
      CHECK(d < DeviceId(16 * st + 16));
    }
  }
  CHECK(transformerLayerStarts(*g).size() == 24);
  for (int a : attention)
    CHECK(a == 6);
  // Without a layer stack (or when the stages do not divide it): equal
  // forward FLOPs.
  auto cnn = zooModel("resnet101", 64);
  auto sc = megatronStrategy(*cnn, topo, {8, 4, 0});
  if (!sc)
    FAIL(errorMessage(sc.takeError()));
  std::vector<double> flops(4, 0);
  for (const Op &op : cnn->ops())
    flops[size_t(sc->pipeline.stage(op.id))] +=
        op.sem.tileFlops(Pass::Forward, op.sem.fullTile());
  double total = flops[0] + flops[1] + flops[2] + flops[3];
  for (double f : flops)
    CHECK(f == Approx(total / 4).epsilon(0.1));
  // A shape the topology cannot hold.
  auto bad = megatronStrategy(*g, topo, {16, 1, 0});
  REQUIRE(!bad);
  CHECK(errorMessage(bad.takeError()) ==
        "megatron: tensor parallel 16 x pipeline 1 does not fit 64 devices "
        "of 8 per node");
}
