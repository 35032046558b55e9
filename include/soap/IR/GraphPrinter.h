// Human and JSON descriptions of an IR graph (`soapc dump`).
#ifndef SOAP_IR_GRAPHPRINTER_H
#define SOAP_IR_GRAPHPRINTER_H

#include "soap/IR/Graph.h"
#include "soap/Support/Json.h"
#include "llvm/Support/raw_ostream.h"

namespace soap {

/// "n:64S oc:64P ic:3R oh:112A" with '*' after unsplittable loops.
std::string formatLoops(const OpSemantics &sem);
/// A summary and one row per op: kind, output shapes, loops, FLOPs, params.
void printGraphTable(const Graph &g, int64_t batch, llvm::raw_ostream &os);
/// The same as JSON, with every loop's class, size and split constraints.
Json graphToJson(const Graph &g, int64_t batch);

} // namespace soap

#endif // SOAP_IR_GRAPHPRINTER_H
