// Output shared by the subcommands: the format chosen, JSON or a table, a
// progress line on a terminal, and rows printed as they come.
#ifndef SOAP_DRIVER_OUTPUT_H
#define SOAP_DRIVER_OUTPUT_H

#include "soap/Driver/Options.h"
#include "soap/Support/Json.h"
#include "llvm/Support/raw_ostream.h"
#include <string>

namespace soap {

/// The format to print in: `f`, or for Auto a table on a terminal and
/// `notTerminal` otherwise.
OutputFormat resolveFormat(OutputFormat f, OutputFormat notTerminal);

/// JSON when asked for, else `table`'s text.
void emit(const DriverOptions &o, const Json &j,
          void (*table)(const Json &, llvm::raw_ostream &));

/// One line on stderr, rewritten in place, while a long step runs; only
/// when stderr is a terminal and -q was not given. clear() erases it.
class ProgressLine {
public:
  explicit ProgressLine(bool quiet);
  ~ProgressLine();
  bool enabled() const { return enabled_; }
  void show(const std::string &text);
  void clear();

private:
  bool enabled_;
  size_t width_ = 0;
};

} // namespace soap

#endif // SOAP_DRIVER_OUTPUT_H
