// The simulator's memory at the backward pass's peak (issue 17), checked by
// hand on mlp_small at batch 64 on one device: MatMul, Relu, MatMul, Relu,
// MatMul, loss, 64 x 32 floats between ops.
#include "SimFixture.h"

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
