// The subcommands of `soapc`, one file each in lib/Driver: the tool parses
// its flags into DriverOptions and calls one of these. Each returns an
// error carrying its exit code (STYLE.md rule 7).
#ifndef SOAP_DRIVER_COMMANDS_H
#define SOAP_DRIVER_COMMANDS_H

#include "soap/Driver/Options.h"
#include "llvm/Support/Error.h"

namespace soap {

llvm::Error runDump(const DriverOptions &o);
llvm::Error runTopo(const DriverOptions &o);
llvm::Error runCost(const DriverOptions &o);
llvm::Error runSimulate(const DriverOptions &o);
/// `soapc model.onnx --topology T --search S [-o plan.json]`.
llvm::Error runSearchCommand(const DriverOptions &o);
llvm::Error runCheck(const DriverOptions &o);
llvm::Error runCompare(const DriverOptions &o);
llvm::Error runFrontier(const DriverOptions &o);
llvm::Error runExplain(const DriverOptions &o);
llvm::Error runDiff(const DriverOptions &o);
/// `soapc emit plan.json [model.onnx] --target T [-o PATH]`.
llvm::Error runEmit(const DriverOptions &o);

} // namespace soap

#endif // SOAP_DRIVER_COMMANDS_H
