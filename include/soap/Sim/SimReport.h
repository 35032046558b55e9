// `soapc simulate`: the metrics of a simulated strategy, as JSON and as text.
#ifndef SOAP_SIM_SIMREPORT_H
#define SOAP_SIM_SIMREPORT_H

#include "soap/Sim/Simulator.h"
#include "soap/Support/Json.h"
#include "llvm/Support/raw_ostream.h"

namespace soap {

/// `samples` is the batch (for throughput); `strategyName` what was run.
Json simReport(const Simulator &sim, const SimMetrics &m,
               llvm::StringRef strategyName, int64_t samples);
void printSimReport(const Json &report, llvm::raw_ostream &os);

} // namespace soap

#endif // SOAP_SIM_SIMREPORT_H
