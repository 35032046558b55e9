// A SoapError is one line whatever the file put in a name (found by fuzzing:
// an external-data location with a newline gave a two-line message).
#include "soap/Support/Error.h"
#include <catch2/catch.hpp>

using namespace soap;

TEST_CASE("SoapError escapes control characters", "[support][error]") {
  std::string msg =
      errorMessage(inputError("m.onnx: tensor '{}': bad", "a\nb\r\x01"));
  CHECK(msg == "m.onnx: tensor 'a\\nb\\r\\x01': bad");
  CHECK(errorMessage(inputError("plain: {}", "text")) == "plain: text");
  llvm::Error ctx = withContext(inputError("x\ny"), "f.json: ");
  CHECK(errorMessage(std::move(ctx)) == "f.json: x\\ny");
}
