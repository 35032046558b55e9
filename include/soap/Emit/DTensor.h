// soapc emit --target dtensor: a runnable PyTorch program for any plan, each
// op's configuration as DTensor placements on a DeviceMesh (docs/emit.md).
#ifndef SOAP_EMIT_DTENSOR_H
#define SOAP_EMIT_DTENSOR_H

#include "soap/Emit/Emit.h"

namespace soap {

/// The program's text, and on `notes` the ops whose split DTensor has no
/// sharding rule for (run in the nearest layout it has).
llvm::Expected<Emitted> emitDTensor(const EmitContext &c);

} // namespace soap

#endif // SOAP_EMIT_DTENSOR_H
