// What `soapc explain` reports of a simulated strategy: the critical path
// and each op's share of it, per op its configuration, time, memory and
// bytes, and the communication by kind and link level.
#ifndef SOAP_DRIVER_EXPLAIN_H
#define SOAP_DRIVER_EXPLAIN_H

#include "soap/Sim/Simulator.h"
#include "soap/Support/Json.h"
#include "llvm/Support/raw_ostream.h"

namespace soap {

/// The explanation of `sim`'s timeline (simulated), whose metrics are `m`.
Json explainStrategy(const Simulator &sim, const SimMetrics &m);
/// The text form; `top` ops listed (0: all).
void printExplain(const Json &explanation, size_t top, llvm::raw_ostream &os);

} // namespace soap

#endif // SOAP_DRIVER_EXPLAIN_H
