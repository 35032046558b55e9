// runTraining on 4 ranks (threads over an in-process communicator) under
// the built-in strategies gives the 1-rank losses: bit for bit when ops are
// only placed (model parallel), within float rounding when sums are split.
#include "soap/Exec/Executor.h"

#include "../TestInputs.h"
#include "ThreadComm.h"
#include "soap/IR/UnrollRnn.h"
#include "soap/Parallel/BuiltinStrategies.h"
#include <cmath>
#include <thread>

using namespace soap;
using soap::test::Hub;
using soap::test::ThreadComm;

namespace {

Topology execTopology(const std::string &name) {
  auto t = loadTopology(std::string(SOAP_SOURCE_DIR) +
                        "/test/cli/exec/Inputs/" + name + ".json");
  if (!t)
    FAIL(errorMessage(t.takeError()));
  return std::move(*t);
}

/// Rank 0's results of `ranks` threads running the same training.
std::vector<StepResult> train(const Graph &g, const Strategy &s, int ranks,
                              const ExecOptions &o) {
  Hub hub;
  std::vector<std::vector<StepResult>> out(ranks);
  std::vector<std::string> errors(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      ThreadComm comm(hub, r, ranks);
      auto res = runTraining(g, s, comm, o);
      if (res)
        out[r] = *res;
      else
        errors[r] = errorMessage(res.takeError());
    });
  for (std::thread &t : threads)
    t.join();
  for (const std::string &e : errors)
    REQUIRE(e == "");
  REQUIRE(!hub.sizeMismatch);
  return out[0];
}

} // namespace

TEST_CASE("runTraining: 4 ranks give the 1-rank losses", "[exec][executor]") {
  Topology one = execTopology("one"), four = execTopology("p100-2x2");
  ExecOptions o;
  o.steps = 3;
  o.seed = 11;
  for (const char *m : {"lenet", "transformer_small"}) {
    INFO(m);
    auto g = test::zooModel(m, 8);
    std::vector<StepResult> ref = train(*g, dataParallel(*g, one), 1, o);
    REQUIRE(ref.size() == 3);
    CHECK(ref[2].loss < ref[0].loss); // it trains
    std::vector<StepResult> dp = train(*g, dataParallel(*g, four), 4, o);
    std::vector<StepResult> mp = train(*g, modelParallel(*g, four), 4, o);
    for (size_t k = 0; k < ref.size(); ++k) {
      CHECK(std::fabs(dp[k].loss - ref[k].loss) <=
            1e-5 * std::fabs(ref[k].loss));
      CHECK(mp[k].loss == ref[k].loss);
    }
  }
}

TEST_CASE("runTraining: ZeRO and recomputation give the 1-rank losses",
          "[exec][executor]") {
  // On threads the collectives are Comm's rings of point-to-point batches
  // (what NCCL runs); each rank's peak is reported.
  Topology one = execTopology("one"), four = execTopology("p100-2x2");
  ExecOptions o;
  o.steps = 3;
  o.seed = 11;
  auto g = test::zooModel("transformer_small", 8);
  std::vector<StepResult> ref = train(*g, dataParallel(*g, one), 1, o);
  for (int stage : {1, 2, 3}) {
    INFO("ZeRO-" << stage);
    Strategy s = dataParallel(*g, four);
    s.zero = zeroPolicy(*g, s, stage);
    s.recompute = recomputePolicy(*g, stage == 3);
    std::vector<StepResult> z = train(*g, s, 4, o);
    REQUIRE(z.size() == ref.size());
    for (size_t k = 0; k < ref.size(); ++k) {
      CHECK(std::fabs(z[k].loss - ref[k].loss) <=
            1e-5 * std::fabs(ref[k].loss));
      REQUIRE(z[k].peakBytes.size() == 4);
      CHECK(z[k].peakBytes[3] > 0);
    }
  }
  o.optimizer = "adamw";
  CHECK(errorMessage(o.validate()) ==
        "optimizer 'adamw': soap-run runs sgd, momentum or adam");
}

TEST_CASE("runTraining: refuses what it cannot run", "[exec][executor]") {
  auto g = test::zooModel("rnnlm", 2);
  Topology one = execTopology("one");
  Hub hub;
  ThreadComm comm(hub, 0, 1);
  ExecOptions o;
  // Unrolled LSTM cells (soapc's LSTMCell) have no kernel.
  auto u = unrollLstms(*g);
  REQUIRE(static_cast<bool>(u));
  auto r = runTraining(**u, dataParallel(**u, one), comm, o);
  REQUIRE(!r);
  CHECK(llvm::StringRef(errorMessage(r.takeError()))
            .contains("soap-run has no kernel for LSTMCell"));
  o.steps = 0;
  CHECK(errorMessage(o.validate()) == "--steps must be at least 1, got 0");
}
