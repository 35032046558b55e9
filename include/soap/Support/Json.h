// JSON helpers: reading a file with one-line errors, typed field access that
// names the JSON pointer of a bad field, and stable (sorted, fixed) output.
#ifndef SOAP_SUPPORT_JSON_H
#define SOAP_SUPPORT_JSON_H

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include <nlohmann/json.hpp>
#include <string>

namespace soap {

using Json = nlohmann::json;

/// Reads and parses a JSON file; errors name the file and line/column.
llvm::Expected<Json> readJsonFile(llvm::StringRef path);
/// Parses JSON text; `name` stands for the file in errors.
llvm::Expected<Json> parseJson(llvm::StringRef text, llvm::StringRef name);

/// Appends a key or an index to a JSON pointer, escaping '~' and '/'.
std::string jsonPointer(llvm::StringRef base, llvm::StringRef key);
std::string jsonPointer(llvm::StringRef base, size_t index);

/// Typed access to a field of an object. Errors read
/// "<file>: <pointer>: <what is wrong>" and map to exit code 2.
class JsonReader {
public:
  explicit JsonReader(std::string file) : file_(std::move(file)) {}
  const std::string &file() const { return file_; }

  llvm::Expected<const Json *> field(const Json &obj, llvm::StringRef ptr,
                                     llvm::StringRef key) const;
  llvm::Expected<const Json *> object(const Json &obj, llvm::StringRef ptr,
                                      llvm::StringRef key) const;
  llvm::Expected<const Json *> array(const Json &obj, llvm::StringRef ptr,
                                     llvm::StringRef key) const;
  llvm::Expected<std::string> string(const Json &obj, llvm::StringRef ptr,
                                     llvm::StringRef key) const;
  /// A finite number; `minimum` rejects smaller values (and NaN).
  llvm::Expected<double> number(const Json &obj, llvm::StringRef ptr,
                                llvm::StringRef key,
                                double minimum = -1e308) const;
  /// A positive number (> 0): bandwidths, capacities, sizes.
  llvm::Expected<double> positive(const Json &obj, llvm::StringRef ptr,
                                  llvm::StringRef key) const;
  /// A number in [lo, hi]: a physical quantity (a bandwidth, a latency, a
  /// memory size) whose range `what` names in the error, e.g.
  /// "Gbit/s (a link's bandwidth)".
  llvm::Expected<double> inRange(const Json &obj, llvm::StringRef ptr,
                                 llvm::StringRef key, double lo, double hi,
                                 llvm::StringRef what) const;
  llvm::Expected<int64_t> integer(const Json &obj, llvm::StringRef ptr,
                                  llvm::StringRef key,
                                  int64_t minimum = INT64_MIN) const;
  /// An error at `ptr` with the reader's file named.
  llvm::Error error(llvm::StringRef ptr, llvm::StringRef what) const;

private:
  std::string file_;
};

/// Serialises with sorted keys, 2-space indent and a trailing newline, so the
/// same value always gives the same bytes.
std::string dumpJson(const Json &value);

/// Writes `text` to `path` atomically (temporary file, then rename), so a
/// failed or interrupted run leaves nothing half-written (RemoveOnAbort:
/// nor the temporary file). "-" writes to stdout.
llvm::Error writeFileAtomic(llvm::StringRef path, llvm::StringRef text);

} // namespace soap

#endif // SOAP_SUPPORT_JSON_H
