// JSON parsing shared by the JSON loaders' fuzz targets: the loaders' own
// parser (parseJson, behind readJsonFile), whose rejections are checked like
// the loaders'; the targets go on with a document.
#ifndef SOAP_TEST_FUZZ_FUZZJSON_H
#define SOAP_TEST_FUZZ_FUZZJSON_H

#include "FuzzCheck.h"
#include "soap/Support/Json.h"
#include "spdlog/spdlog.h"
#include <cstddef>
#include <cstdint>
#include <optional>

namespace soap {
namespace fuzz {

inline std::optional<Json> document(const uint8_t *data, size_t size) {
  static bool quiet = (spdlog::set_level(spdlog::level::off), true);
  (void)quiet;
  auto doc = soap::parseJson(
      llvm::StringRef(reinterpret_cast<const char *>(data), size),
      inputName());
  if (!accepted(doc))
    return std::nullopt;
  return std::move(*doc);
}

} // namespace fuzz
} // namespace soap

#endif // SOAP_TEST_FUZZ_FUZZJSON_H
