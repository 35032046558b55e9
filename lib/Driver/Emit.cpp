// soapc emit: a plan written for a training engine (lib/Emit): the plan
// and the model it was made for are loaded as `explain` loads them (a plan
// for another model is refused), the target writes its text, and -o writes
// it atomically (stdout without -o); the target's notes go to stderr.
#include "soap/Driver/Commands.h"
#include "soap/Driver/Session.h"

#include "soap/Emit/Emit.h"
#include "soap/Support/Error.h"
#include "soap/Support/Json.h"
#include <spdlog/spdlog.h>

namespace soap {

llvm::Error runEmit(const DriverOptions &o) {
  if (o.emitTarget.empty())
    return inputError("emit: --target is required: {}", emitTargetNames());
  const EmitTarget *target = findEmitTarget(o.emitTarget);
  if (!target)
    return inputError("--target {}: no such target (the targets: {})",
                      o.emitTarget, emitTargetNames());
  if (auto err = checkOutputPath("-o", o.outputPath))
    return err;
  auto ps = openPlan(o, o.planPath);
  if (!ps)
    return ps.takeError();
  const Session &s = *ps->session;
  EmitContext c{ps->plan,     *s.graph,   *s.topo,
                ps->strategy, o.planPath, s.options.modelPath};
  auto out = target->emit(c);
  if (!out)
    return out.takeError();
  for (const std::string &note : out->notes)
    spdlog::warn("{}", note);
  if (o.outputPath.empty() || o.outputPath == "-") {
    llvm::outs() << out->text;
    return llvm::Error::success();
  }
  return writeFileAtomic(o.outputPath, out->text);
}

} // namespace soap
