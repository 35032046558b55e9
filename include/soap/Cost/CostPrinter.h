// `soapc cost`: what the cost model answers for every op of a model run whole
// on one device: kernel times per pass with their source, and memory.
#ifndef SOAP_COST_COSTPRINTER_H
#define SOAP_COST_COSTPRINTER_H

#include "soap/Cost/CostModel.h"
#include "soap/Support/Json.h"
#include "llvm/Support/raw_ostream.h"

namespace soap {

/// Errors only in strict mode (a missing signature).
llvm::Expected<Json> costReport(const Graph &g, const CostModel &cm,
                                Optimizer opt);
void printCostReport(const Json &report, llvm::raw_ostream &os);

} // namespace soap

#endif // SOAP_COST_COSTPRINTER_H
