// soapc cost: what the cost model predicts for each op run whole on one
// device of the topology (at the cluster's batch).
#include "soap/Driver/Commands.h"
#include "soap/Driver/Output.h"
#include "soap/Driver/Session.h"

#include "soap/Cost/CostPrinter.h"

namespace soap {

llvm::Error runCost(const DriverOptions &o) {
  auto s = Session::open(o);
  if (!s)
    return s.takeError();
  auto report = costReport(*(*s)->graph, *(*s)->cost, (*s)->optimizer);
  if (!report)
    return report.takeError();
  emit(o, *report, printCostReport);
  return llvm::Error::success();
}

} // namespace soap
