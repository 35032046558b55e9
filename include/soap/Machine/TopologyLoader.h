// Reads a cluster description (schemas/topology.schema.json) into a Topology.
// Errors name the file and the JSON pointer of the offending field.
#ifndef SOAP_MACHINE_TOPOLOGYLOADER_H
#define SOAP_MACHINE_TOPOLOGYLOADER_H

#include "soap/Machine/Topology.h"
#include "soap/Support/Json.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

namespace soap {

/// The most devices a topology may have: routes are stored for every
/// ordered pair.
constexpr int64_t kMaxDevices = 4096;

/// Loads and checks a topology file. Errors (exit code 2) read
/// "<path>: <json pointer>: <what is wrong>".
llvm::Expected<Topology> loadTopology(llvm::StringRef path);

/// The same from an already parsed document; `file` names it in errors.
llvm::Expected<Topology> parseTopology(const Json &doc, llvm::StringRef file);

} // namespace soap

#endif // SOAP_MACHINE_TOPOLOGYLOADER_H
