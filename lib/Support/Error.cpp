// Error helpers: the one-line error convention and exit codes.
#include "soap/Support/Error.h"

#include "llvm/Support/raw_ostream.h"

namespace soap {

char SoapError::ID = 0;

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
