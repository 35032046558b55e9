// Timing one op tile with the executor's CPU kernels (see TileTiming.h).
#include "soap/Exec/TileTiming.h"

#include "ExecRules.h"
#include "Kernels.h"
#include "soap/Support/Error.h"
#include "soap/Support/Statistics.h"
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <algorithm>
#include <chrono>
#if SOAP_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>
#endif
#if SOAP_HAVE_MPI
#include <mpi.h>
#endif

namespace soap {

namespace {

/// Statistics of a split normalisation are combined among the tiles that
/// share them; a tile timed alone has no partners (the simulator charges
/// the combination as its own collective).
class Alone : public exec::StatsExchange {
public:
  void allReduce(const std::vector<bool> &, std::vector<exec::Buf *> &,
                 exec::Combine) override {}
  void allGather(const std::vector<bool> &, int,
                 std::vector<exec::Buf *> &, bool) override {}
};

bool isWeightInput(const Op &op, size_t i) {
  return std::find(op.sem.weightInputs.begin(), op.sem.weightInputs.end(),
                   int(i)) != op.sem.weightInputs.end();
}

/// Deterministic filler: floats in [-1, 1), integers 0 (a valid index and
/// label everywhere).
void fill(exec::Buf &b, const Box &box, bool floating, uint64_t &state) {
  b.reset(box);
  if (!floating)
    return;
  for (float &x : b.data) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    x = float(double(state >> 40) / double(1ull << 24)) * 2.0f - 1.0f;
  }
}


} // namespace

llvm::Expected<TileTimes> timeTileOnCpu(const Graph &g, const Op &op,
                                        const Box &tile,
                                        const TileTimingOptions &opts) {
  const exec::Kernel *k = exec::findKernel(op.kind, "cpu");
  if (!k)
    return inputError("{}: soap-run has no kernel for {}", g.where(op.id),
                      op.kind);
  if (auto err = k->check(g, op))
    return inputError("{}: {}", g.where(op.id), errorMessage(std::move(err)));
  TileTimes out;
  out.repeats = opts.repeats;
  bool alias = exec::reshapePassesBuffer(g, op, op.sem.inputRegion(0, tile),
                                         op.sem.outputRegion(0, tile));
  using Clock = std::chrono::steady_clock;
  auto since = [](Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };

  std::vector<exec::Task> ts(1);
  exec::Task &t = ts[0];
  t.tile = 0;
  t.loops = tile;
  uint64_t state = opts.seed * 0x9E3779B97F4A7C15ull + 1;
  // Inputs (weights included: soap-run lends them, nothing is copied).
  std::vector<exec::Buf> inputs(op.inputs.size());
  for (size_t i = 0; i < op.inputs.size(); ++i)
    if (op.inputs[i] != kNoValue)
      fill(inputs[i], op.sem.inputRegion(int(i), tile),
           isFloating(g.value(op.inputs[i]).dtype), state);
  // The output gradients, and the weights' gradient accumulators.
  std::vector<exec::Buf> gouts(op.outputs.size());
  for (size_t j = 0; j < op.outputs.size(); ++j)
    if (op.outputs[j] != kNoValue) {
      if (op.kind == "SoftmaxCrossEntropyLoss" && j == 0)
        gouts[j].reset(op.sem.outputRegion(int(j), tile), 1.0f);
      else
        fill(gouts[j], op.sem.outputRegion(int(j), tile), true, state);
    }
  std::vector<exec::Buf> acc(op.inputs.size());
  bool lends = op.kind != "Conv";
  Alone alone;
  exec::KernelCtx ctx{g, op, ts, alone, opts.seed, 0};

  auto runForward = [&]() {
    t.out.assign(op.outputs.size(), exec::Buf());
    t.saved.clear();
    exec::release(t.arg);
    for (size_t j = 0; j < op.outputs.size(); ++j)
      if (op.outputs[j] != kNoValue && !alias)
        t.out[j].reset(op.sem.outputRegion(int(j), tile));
    if (alias) {
      t.out[0].box = op.sem.outputRegion(0, tile);
      t.out[0].data = t.in[0].data; // (a move in soap-run: not timed)
      return;
    }
    k->forward(ctx);
  };

  std::vector<double> fwd, bwd;
  for (int r = 0; r < opts.warmup + opts.repeats; ++r) {
    // The operands as the forward finds them.
    t.in = inputs;
    if (opts.beforeRun)
      opts.beforeRun();
    auto t0 = Clock::now();
    if (alias) {
      // The input's buffer becomes the output's: nothing is computed.
      t.out.assign(op.outputs.size(), exec::Buf());
    } else {
      runForward();
    }
    double tf = alias ? 0.0 : since(t0);
    std::string e = exec::takeBackendError();
    if (!e.empty())
      return internalError("{}: cpu backend: {}", g.where(op.id), e);
    if (alias)
      runForward();
    // The backward pass on what the forward left.
    t.gout = gouts;
    t.gin.assign(op.inputs.size(), exec::Buf());
    for (size_t i = 0; i < op.inputs.size(); ++i)
      if (lends && isWeightInput(op, i) && !acc[i].data.empty()) {
        t.gin[i] = std::move(acc[i]);
        acc[i] = exec::Buf();
      }
    if (opts.beforeRun)
      opts.beforeRun();
    t0 = Clock::now();
    double tb = 0;
    if (!alias) {
      for (size_t i = 0; i < op.inputs.size(); ++i)
        if (op.inputs[i] != kNoValue &&
            isFloating(g.value(op.inputs[i]).dtype) && t.gin[i].data.empty())
          t.gin[i].reset(op.sem.inputRegion(int(i), tile));
      if (exec::rerunsForward(op, "cpu"))
        runForward();
      k->backward(ctx);
      tb = since(t0);
    }
    e = exec::takeBackendError();
    if (!e.empty())
      return internalError("{}: cpu backend: {}", g.where(op.id), e);
    for (size_t i = 0; i < op.inputs.size(); ++i)
      if (lends && isWeightInput(op, i) && i < t.gin.size())
        acc[i] = std::move(t.gin[i]);
    t.gin.clear();
    t.gout.clear();
    t.out.clear();
    t.in.clear();
    if (r >= opts.warmup) {
      fwd.push_back(tf);
      bwd.push_back(tb);
    }
  }
  out.forward = median(fwd);
  out.backward = median(bwd);
  return out;
}

std::string cpuLibraryVersions() {
  std::vector<std::string> parts;
#if SOAP_HAVE_DNNL
  const dnnl_version_t *v = dnnl_version();
  parts.push_back(fmt::format("oneDNN {}.{}.{} (OpenMP)", v->major, v->minor,
                              v->patch));
#else
  parts.push_back("no oneDNN (plain C++ kernels)");
#endif
#if SOAP_HAVE_MPI
  char lib[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(lib, &len);
  std::string s(lib, size_t(len));
  // The first line: "Open MPI v4.1.4, package: ..., ident: ..., repo rev: ..."
  s = s.substr(0, s.find_first_of(",\n"));
  parts.push_back(s);
#endif
  return fmt::format("{}", fmt::join(parts, ", "));
}

} // namespace soap
