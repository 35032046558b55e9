// LSTM unrolling keeps what is computed (parameters, FLOPs, the output) and
// links step t of layer 2 to step t of layer 1 only.
#include "TestGraphs.h"

#include "soap/IR/UnrollRnn.h"
#include <catch2/catch.hpp>

using namespace soap;
using namespace soap::test;

namespace {
/// PyTorch's export of a 2-layer nn.LSTM: LSTM -> Squeeze -> LSTM -> Squeeze
/// -> a linear layer on every step.
Graph twoLayerLstm(int64_t T, int64_t N, int64_t I, int64_t H) {
  GraphBuilder b;
  auto x = b.input({T, N, I});
  b.g.value(x).dimClasses = {DimClass::Attribute, DimClass::Sample,
                             DimClass::Attribute};
  auto l1 = b.op("LSTM",
                 {x, b.weight({1, 4 * H, I}), b.weight({1, 4 * H, H}),
                  b.weight({1, 8 * H})},
                 {{T, 1, N, H}, {1, N, H}, {1, N, H}},
                 {{"hidden_size", H}});
  auto s1 = b.op("Squeeze", {l1[0]}, {{T, N, H}}, {{"axes", Ints{1}}});
  auto l2 = b.op("LSTM",
                 {s1[0], b.weight({1, 4 * H, H}), b.weight({1, 4 * H, H}),
                  b.weight({1, 8 * H})},
                 {{T, 1, N, H}, {1, N, H}, {1, N, H}},
                 {{"hidden_size", H}});
  auto s2 = b.op("Squeeze", {l2[0]}, {{T, N, H}}, {{"axes", Ints{1}}});
  auto y = b.op("MatMul", {s2[0], b.weight({H, 5})}, {{T, N, 5}});
  b.g.outputs = {y[0]};
  requireOk(b.g.computeSemantics());
  return std::move(b.g);
}
} // namespace

TEST_CASE("unrolling LSTMs keeps parameters and FLOPs", "[IR][rnn]") {
  Graph g = twoLayerLstm(4, 3, 6, 5);
  auto u = unrollLstms(g);
  if (!u)
    FAIL(errorMessage(u.takeError()));
  const Graph &ug = **u;
  CHECK(ug.parameterCount() == g.parameterCount());
  CHECK(ug.forwardFlops() == Approx(g.forwardFlops()));
  int cells = 0, stacks = 0, lstms = 0;
  for (const Op &o : ug.ops()) {
    cells += o.kind == "LSTMCell";
    stacks += o.kind == "Stack";
    lstms += o.kind == "LSTM";
  }
  CHECK(cells == 8);
  CHECK(lstms == 0);
  // Layer 1's full output is no longer needed; layer 2's feeds the MatMul.
  CHECK(stacks == 1);
  // Step t of layer 2 reads step t of layer 1's hidden state.
  for (const Op &o : ug.ops()) {
    if (o.kind != "LSTMCell" || o.name.rfind("LSTM_2", 0) != 0)
      continue;
    const Value &x = ug.value(o.inputs[0]);
    REQUIRE(x.producer >= 0);
    const Op &p = ug.op(x.producer);
    CHECK(p.kind == "LSTMCell");
    CHECK(p.name.substr(p.name.find(".t")) == o.name.substr(o.name.find(".t")));
  }
  REQUIRE(ug.outputs.size() == 1);
  CHECK(ug.value(ug.outputs[0]).shape == TensorShape({4, 3, 5}));
}
