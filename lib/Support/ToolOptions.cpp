// Command-line set-up shared by the tools.
#include "soap/Support/ToolOptions.h"

#include "llvm/Support/CommandLine.h"

namespace soap {

void removeLlvmThreadsOption() {
  namespace cl = llvm::cl;
  if (cl::Option *llvmThreads =
          cl::getRegisteredOptions(*cl::TopLevelSubCommand).lookup("threads"))
    llvmThreads->removeArgument();
}

} // namespace soap
