// Human and JSON descriptions of a topology (`soapc topo`) and of the device
// catalog.
#ifndef SOAP_MACHINE_TOPOLOGYPRINTER_H
#define SOAP_MACHINE_TOPOLOGYPRINTER_H

#include "soap/Machine/Topology.h"
#include "soap/Support/Json.h"
#include "llvm/Support/raw_ostream.h"

namespace soap {

/// Name, device with its catalog figures, counts, levels, bandwidth and
/// latency between devices by lowest common level, and links by class.
void printTopology(const Topology &topo, llvm::raw_ostream &os);
/// The same content as JSON (sorted keys; SI units: bytes, bytes/s, s).
Json topologyToJson(const Topology &topo);

/// The catalog as a table, one GPU per row, then each row's sources.
void printDeviceCatalog(llvm::raw_ostream &os);
Json deviceCatalogToJson();
Json deviceSpecToJson(const DeviceSpec &spec);

} // namespace soap

#endif // SOAP_MACHINE_TOPOLOGYPRINTER_H
