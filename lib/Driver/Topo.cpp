// soapc topo: a cluster's devices, hierarchy levels, bandwidths, latencies.
#include "soap/Driver/Commands.h"
#include "soap/Driver/Output.h"
#include "soap/Driver/Session.h"

#include "soap/Machine/TopologyLoader.h"
#include "soap/Machine/TopologyPrinter.h"

namespace soap {

llvm::Error runTopo(const DriverOptions &o) {
  auto t = loadTopologyArg(o.topologyPath);
  if (!t)
    return t.takeError();
  if (o.format == OutputFormat::Json)
    llvm::outs() << dumpJson(topologyToJson(*t));
  else
    printTopology(*t, llvm::outs());
  return llvm::Error::success();
}

} // namespace soap
