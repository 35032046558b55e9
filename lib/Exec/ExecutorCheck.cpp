// What soap-run checks and sets up before a run: the backends this build
// has, the options, whether every op of the graph has a kernel, and the
// kernels' threads and allocator.
#include "soap/Exec/Executor.h"

#include "ElementwiseFn.h"
#include "ExecRules.h"
#include "Gemm.h"
#include "Runner.h"
#include "soap/Support/Cores.h"
#include "soap/Support/Error.h"
#include "soap/Support/Json.h"
#include "soap/Support/Rng.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include <chrono>
#include <cmath>
#include <cstring>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <limits>
#include <malloc.h>
#include <map>
#include <optional>
#include <set>
#include <thread>

namespace soap {

std::vector<std::string> builtKernelBackends() {
  std::vector<std::string> b{"cpu"};
#ifdef SOAP_HAVE_CUDA
  b.push_back("cuda");
#endif
  return b;
}

llvm::Error ExecOptions::validate() const {
  std::vector<std::string> built = builtKernelBackends();
  if (std::find(built.begin(), built.end(), backend) == built.end())
    return inputError("--backend '{}': not built in (built: {})", backend,
                      fmt::format("{}", fmt::join(built, ", ")));
  if (steps < 1)
    return inputError("--steps must be at least 1, got {}", steps);
  if (threads < 0)
    return inputError("--threads must be at least 1, got {}", threads);
  if (optimizer != "sgd" && optimizer != "momentum" && optimizer != "adam")
    return inputError("optimizer '{}': soap-run runs sgd, momentum or adam",
                      optimizer);
  if (precision == "fp8")
    return inputError("precision 'fp8': soap-run has no FP8 kernels "
                      "(Transformer Engine's recipe); it runs fp32 or bf16 "
                      "plans");
  if (precision != "fp32" && precision != "bf16")
    return inputError("precision '{}': soap-run runs fp32 or bf16 plans",
                      precision);
  if (precision == "bf16" && backend != "cpu")
    return inputError("--backend {}: soap-run runs bf16 plans on the cpu "
                      "backend only",
                      backend);
  if (!(learningRate > 0) || !std::isfinite(learningRate))
    return inputError("--lr must be a positive number, got {}", learningRate);
  return llvm::Error::success();
}

const std::vector<int64_t> &exec::weightShape(const Graph &g, const Value &w) {
  for (OpId u : w.users) {
    const Op &op = g.op(u);
    for (size_t i = 0; i < op.inputs.size(); ++i)
      if (op.inputs[i] == w.id && op.sem.inputs[i].isView)
        return op.sem.inputs[i].shape;
  }
  return w.shape.dims;
}

llvm::Error checkExecutable(const Graph &g) {
  for (const Op &op : g.ops()) {
    const exec::Kernel *k = exec::findKernel(op.kind);
    if (!k)
      return inputError("{}: soap-run has no kernel for {}", g.where(op.id),
                        op.kind);
    for (size_t i = 0; i < op.inputs.size(); ++i) {
      if (op.inputs[i] == kNoValue)
        continue;
      const Value &v = g.value(op.inputs[i]);
      // A weight is filled and updated locally, so any exact re-factoring
      // (LSTM's [D, 4H, I] as [D, 4, H, I]) works if all its users share
      // it; activations move between ops in their own shape.
      if (op.sem.inputs[i].isView &&
          (v.kind != ValueKind::Weight ||
           exec::weightShape(g, v) != op.sem.inputs[i].shape))
        return inputError("{}: operand {} is addressed through a view; "
                          "soap-run does not run it",
                          g.where(op.id), i);
      auto n = v.shape.numElements();
      if (v.kind == ValueKind::Constant && v.data.size() != 1 &&
          (!n || static_cast<int64_t>(v.data.size()) != *n))
        return inputError("{}: constant '{}' has no known data", g.where(op.id),
                          v.name);
    }
    if (auto err = k->check(g, op))
      return inputError("{}: {}", g.where(op.id), toString(std::move(err)));
  }
  bool loss = false;
  for (const Op &op : g.ops())
    loss |= op.kind == "SoftmaxCrossEntropyLoss";
  if (!loss)
    return inputError("{}: the model has no loss to train (was it imported "
                      "with --no-loss?)",
                      g.sourcePath);
  return llvm::Error::success();
}

int kernelThreads(const ExecOptions &opts, const Comm &comm) {
  if (opts.threads > 0)
    return opts.threads;
  return std::max(1, availableCores() / std::max(1, comm.localSize()));
}

llvm::Error prepareBackend(const ExecOptions &opts, const Comm &comm) {
  exec::setKernelThreads(kernelThreads(opts, comm));
  // Every op's buffers are allocated and freed at every step: keep freed
  // memory in the heap for the next op rather than handing it back to the
  // kernel, whose fresh pages would each cost a fault and a clear.
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
#ifdef SOAP_HAVE_CUDA
  if (opts.backend == "cuda")
    return exec::initCudaBackend(comm.rank());
#endif
  return llvm::Error::success();
}

} // namespace soap
