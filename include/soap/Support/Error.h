// Errors that user input can cause, carried as llvm::Error up to the tool, which
// prints one line naming the file and the place and exits with the error's code.
#ifndef SOAP_SUPPORT_ERROR_H
#define SOAP_SUPPORT_ERROR_H

#include "llvm/Support/Error.h"
#include <fmt/format.h>
#include <string>

namespace soap {

/// Process exit codes shared by every soapc tool (STYLE.md rule 7).
enum class ExitCode : int {
  Ok = 0,
  Internal = 1,     ///< a bug: an invariant broke
  InvalidInput = 2, ///< bad input file or usage
  Infeasible = 3,   ///< no feasible plan (e.g. nothing fits in memory)
  Stale = 4,        ///< a plan no longer fits its model or topology
  /// Ctrl-C or SIGTERM before there was anything to give (the shell's
  /// 128 + SIGINT; Interrupt.h).
  Interrupted = 130,
};

/// An error with a one-line message and the exit code it maps to.
class SoapError : public llvm::ErrorInfo<SoapError> {
public:
  static char ID;
  /// A bad-input message is one line: control characters in it (a newline
  /// in a tensor name read from a file) are escaped ("\n", "\x01"). Other
  /// codes may list findings on several lines (`soapc check`'s exit 4).
  SoapError(ExitCode code, std::string message)
      : code_(code),
        message_(code == ExitCode::InvalidInput ? oneLine(std::move(message))
                                                : std::move(message)) {}
  static std::string oneLine(std::string message);
  void log(llvm::raw_ostream &os) const override;
  std::error_code convertToErrorCode() const override;
  ExitCode code() const { return code_; }
  const std::string &text() const { return message_; }

private:
  ExitCode code_;
  std::string message_;
};

/// Bad input: exit code 2. The message should name the file and the place.
template <typename... Args>
llvm::Error inputError(fmt::format_string<Args...> f, Args &&...args) {
  return llvm::make_error<SoapError>(
      ExitCode::InvalidInput, fmt::format(f, std::forward<Args>(args)...));
}

/// A broken invariant that still should not abort: exit code 1.
template <typename... Args>
llvm::Error internalError(fmt::format_string<Args...> f, Args &&...args) {
  return llvm::make_error<SoapError>(
      ExitCode::Internal, fmt::format(f, std::forward<Args>(args)...));
}

template <typename... Args>
llvm::Error makeError(ExitCode code, fmt::format_string<Args...> f,
                      Args &&...args) {
  return llvm::make_error<SoapError>(code,
                                     fmt::format(f, std::forward<Args>(args)...));
}

/// Prefixes every message in `err` with `context` ("file.onnx: ").
llvm::Error withContext(llvm::Error err, llvm::StringRef context);

/// Consumes `err`, prints "<tool>: error: <message>" on stderr (one line per
/// joined error) and returns the exit code to return from main().
int reportError(llvm::Error err, llvm::StringRef tool);

/// Message of an error without consuming the code mapping (for tests).
std::string errorMessage(llvm::Error err);

} // namespace soap

#endif // SOAP_SUPPORT_ERROR_H
