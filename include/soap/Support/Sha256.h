// SHA-256 (FIPS 180-4), used to pin the model and topology a plan was made for.
#ifndef SOAP_SUPPORT_SHA256_H
#define SOAP_SUPPORT_SHA256_H

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include <array>
#include <cstdint>
#include <string>

namespace soap {

class Sha256 {
public:
  Sha256();
  void update(const uint8_t *data, size_t size);
  void update(llvm::StringRef data) {
    update(reinterpret_cast<const uint8_t *>(data.data()), data.size());
  }
  std::array<uint8_t, 32> finish();
  /// Lower-case hex of finish().
  std::string finishHex();

private:
  void block(const uint8_t *p);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t bufLen_ = 0;
  uint64_t totalBytes_ = 0;
};

std::string sha256Hex(llvm::StringRef data);
/// SHA-256 of a file's bytes, streamed; errors name the file.
llvm::Expected<std::string> sha256File(llvm::StringRef path);

} // namespace soap

#endif // SOAP_SUPPORT_SHA256_H
