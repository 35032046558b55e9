// Output shared by the subcommands.
#include "soap/Driver/Output.h"

#include "llvm/Support/Process.h"

namespace soap {

OutputFormat resolveFormat(OutputFormat f, OutputFormat notTerminal) {
  if (f != OutputFormat::Auto)
    return f;
  return llvm::sys::Process::StandardOutIsDisplayed() ? OutputFormat::Table
                                                      : notTerminal;
}

void emit(const DriverOptions &o, const Json &j,
          void (*table)(const Json &, llvm::raw_ostream &)) {
  if (o.format == OutputFormat::Json)
    llvm::outs() << dumpJson(j);
  else
    table(j, llvm::outs());
}

ProgressLine::ProgressLine(bool quiet)
    : enabled_(!quiet && llvm::sys::Process::StandardErrIsDisplayed()) {}

ProgressLine::~ProgressLine() { clear(); }

void ProgressLine::show(const std::string &text) {
  if (!enabled_)
    return;
  std::string line = text;
  if (line.size() < width_)
    line += std::string(width_ - line.size(), ' ');
  width_ = text.size();
  llvm::errs() << "\r" << line;
  llvm::errs().flush();
}

void ProgressLine::clear() {
  if (!enabled_ || width_ == 0)
    return;
  llvm::errs() << "\r" << std::string(width_, ' ') << "\r";
  llvm::errs().flush();
  width_ = 0;
}

} // namespace soap
