// soapc emit --target dtensor (include/soap/Emit/DTensor.h).
#include "soap/Emit/DTensor.h"

#include "soap/Support/Error.h"

namespace soap {

llvm::Expected<Emitted> emitDTensor(const EmitContext &c) {
  return inputError("{}: target dtensor: not built yet", c.planPath);
}

} // namespace soap
