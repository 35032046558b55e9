// Error helpers: the one-line error convention and exit codes.
#include "soap/Support/Error.h"

#include "llvm/Support/raw_ostream.h"

namespace soap {

char SoapError::ID = 0;

std::string SoapError::oneLine(std::string message) {
  bool clean = true;
  for (char c : message)
    clean = clean && !(static_cast<unsigned char>(c) < 0x20 || c == 0x7f);
  if (clean)
    return message;
  std::string out;
  for (char c : message) {
    auto u = static_cast<unsigned char>(c);
    if (c == '\n')
      out += "\\n";
    else if (c == '\r')
      out += "\\r";
    else if (c == '\t')
      out += "\\t";
    else if (u < 0x20 || u == 0x7f)
      out += fmt::format("\\x{:02x}", u);
    else
      out += c;
  }
  return out;
}

void SoapError::log(llvm::raw_ostream &os) const { os << message_; }

std::error_code SoapError::convertToErrorCode() const {
  return llvm::inconvertibleErrorCode();
}

llvm::Error withContext(llvm::Error err, llvm::StringRef context) {
  if (!err)
    return err;
  llvm::Error out = llvm::Error::success();
  llvm::handleAllErrors(
      std::move(err),
      [&](const SoapError &e) {
        out = llvm::joinErrors(
            std::move(out),
            llvm::make_error<SoapError>(e.code(),
                                        context.str() + e.text()));
      },
      [&](const llvm::ErrorInfoBase &e) {
        out = llvm::joinErrors(
            std::move(out),
            llvm::make_error<SoapError>(ExitCode::Internal,
                                        context.str() + e.message()));
      });
  return out;
}

int reportError(llvm::Error err, llvm::StringRef tool) {
  int code = 0;
  llvm::handleAllErrors(
      std::move(err),
      [&](const SoapError &e) {
        llvm::errs() << tool << ": error: " << e.text() << "\n";
        code = std::max(code, static_cast<int>(e.code()));
      },
      [&](const llvm::ErrorInfoBase &e) {
        llvm::errs() << tool << ": error: " << e.message() << "\n";
        code = std::max(code, static_cast<int>(ExitCode::Internal));
      });
  return code;
}

std::string errorMessage(llvm::Error err) {
  std::string msg;
  llvm::handleAllErrors(std::move(err), [&](const llvm::ErrorInfoBase &e) {
    if (!msg.empty())
      msg += "\n";
    msg += e.message();
  });
  return msg;
}

} // namespace soap
