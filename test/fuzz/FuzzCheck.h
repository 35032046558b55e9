// What every fuzz target asserts about an input it rejects: the error is a
// bad-input error (exit code 2, never 1) on one line that names the file.
// A violation traps, so libFuzzer (or the replay test) reports it.
#ifndef SOAP_TEST_FUZZ_FUZZCHECK_H
#define SOAP_TEST_FUZZ_FUZZCHECK_H

#include "soap/Support/Error.h"
#include "llvm/Support/Error.h"
#include <cstdio>
#include <cstdlib>
#include <string>

namespace soap {
namespace fuzz {

/// The name the targets give their input in error messages.
inline const char *inputName() { return "fuzz-input"; }

[[noreturn]] inline void fail(const std::string &why, const std::string &msg) {
  std::fprintf(stderr, "fuzz: %s: %s\n", why.c_str(), msg.c_str());
  std::abort();
}

/// Consumes `err` (which may be success) and checks it as above.
inline void checkRejection(llvm::Error err) {
  llvm::handleAllErrors(
      std::move(err),
      [](const SoapError &e) {
        const std::string &m = e.text();
        if (e.code() != ExitCode::InvalidInput)
          fail("not a bad-input error (exit code " +
                   std::to_string(static_cast<int>(e.code())) + ")",
               m);
        if (m.find('\n') != std::string::npos)
          fail("a message of more than one line", m);
        if (m.rfind(inputName(), 0) != 0)
          fail("a message that does not start with the file name", m);
      },
      [](const llvm::ErrorInfoBase &e) {
        fail("an error that is not a SoapError", e.message());
      });
}

template <typename T> bool accepted(llvm::Expected<T> &v) {
  if (v)
    return true;
  checkRejection(v.takeError());
  return false;
}

} // namespace fuzz
} // namespace soap

#endif // SOAP_TEST_FUZZ_FUZZCHECK_H
