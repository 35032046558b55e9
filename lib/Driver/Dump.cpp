// soapc dump: a model's ops, shapes, loops and their classes, FLOPs and
// parameters.
#include "soap/Driver/Commands.h"
#include "soap/Driver/Session.h"

#include "soap/IR/GraphPrinter.h"

namespace soap {

llvm::Error runDump(const DriverOptions &o) {
  auto g = loadModel(o, 1);
  if (!g)
    return g.takeError();
  int64_t batch = effectiveBatch(o, 1);
  if (o.format == OutputFormat::Json)
    llvm::outs() << dumpJson(graphToJson(**g, batch));
  else
    printGraphTable(**g, batch, llvm::outs());
  return llvm::Error::success();
}

} // namespace soap
