// JSON helpers: one-line errors naming file and JSON pointer; stable output.
#include "soap/Support/Json.h"

#include "soap/Support/Error.h"
#include "soap/Support/Interrupt.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/raw_ostream.h"
#include <cmath>

namespace soap {

llvm::Expected<Json> parseJson(llvm::StringRef text, llvm::StringRef name) {
  Json value = Json::parse(text.begin(), text.end(), nullptr,
                           /*allow_exceptions=*/false);
  if (!value.is_discarded())
    return llvm::Expected<Json>(std::move(value));
  // Re-parse with exceptions to learn what is wrong and where. Besides
  // syntax errors, nlohmann throws out_of_range for a number that overflows
  // a double (1e400), which must not escape as an uncaught exception.
  try {
    Json again = Json::parse(text.begin(), text.end());
    (void)again;
  } catch (const Json::parse_error &e) {
    return inputError("{}: invalid JSON at byte {}", name.str(), e.byte);
  } catch (const Json::exception &e) {
    std::string what = e.what();
    // "[json.exception.out_of_range.406] number overflow parsing '1e400'"
    auto close = what.find("] ");
    if (close != std::string::npos)
      what = what.substr(close + 2);
    return inputError("{}: invalid JSON: {}", name.str(), what);
  }
  return inputError("{}: invalid JSON", name.str());
}

llvm::Expected<Json> readJsonFile(llvm::StringRef path) {
  auto buf = llvm::MemoryBuffer::getFile(path, /*IsText=*/true);
  if (!buf)
    return inputError("{}: cannot read: {}", path.str(),
                      buf.getError().message());
  return parseJson((*buf)->getBuffer(), path);
}

static std::string escapePointerToken(llvm::StringRef key) {
  std::string out;
  for (char c : key) {
    if (c == '~')
      out += "~0";
    else if (c == '/')
      out += "~1";
    else
      out += c;
  }
  return out;
}

std::string jsonPointer(llvm::StringRef base, llvm::StringRef key) {
  return base.str() + "/" + escapePointerToken(key);
}

std::string jsonPointer(llvm::StringRef base, size_t index) {
  return base.str() + "/" + std::to_string(index);
}

static const char *typeName(const Json &v) {
  switch (v.type()) {
  case Json::value_t::null:
    return "null";
  case Json::value_t::object:
    return "an object";
  case Json::value_t::array:
    return "an array";
  case Json::value_t::string:
    return "a string";
  case Json::value_t::boolean:
    return "a boolean";
  case Json::value_t::number_integer:
  case Json::value_t::number_unsigned:
  case Json::value_t::number_float:
    return "a number";
  default:
    return "a value";
  }
}

llvm::Error JsonReader::error(llvm::StringRef ptr, llvm::StringRef what) const {
  return inputError("{}: {}: {}", file_, ptr.empty() ? "/" : ptr.str(),
                    what.str());
}

llvm::Expected<const Json *> JsonReader::field(const Json &obj,
                                               llvm::StringRef ptr,
                                               llvm::StringRef key) const {
  if (!obj.is_object())
    return error(ptr, std::string("expected an object, got ") + typeName(obj));
  auto it = obj.find(key.str());
  if (it == obj.end())
    return error(jsonPointer(ptr, key), "missing required field");
  return &*it;
}

#define SOAP_JSON_FIELD(var)                                                   \
  auto var##OrErr = field(obj, ptr, key);                                      \
  if (!var##OrErr)                                                             \
    return var##OrErr.takeError();                                             \
  const Json &var = **var##OrErr;

llvm::Expected<const Json *> JsonReader::object(const Json &obj,
                                                llvm::StringRef ptr,
                                                llvm::StringRef key) const {
  SOAP_JSON_FIELD(v);
  if (!v.is_object())
    return error(jsonPointer(ptr, key),
                 std::string("expected an object, got ") + typeName(v));
  return &v;
}

llvm::Expected<const Json *> JsonReader::array(const Json &obj,
                                               llvm::StringRef ptr,
                                               llvm::StringRef key) const {
  SOAP_JSON_FIELD(v);
  if (!v.is_array())
    return error(jsonPointer(ptr, key),
                 std::string("expected an array, got ") + typeName(v));
  return &v;
}

llvm::Expected<std::string> JsonReader::string(const Json &obj,
                                               llvm::StringRef ptr,
                                               llvm::StringRef key) const {
  SOAP_JSON_FIELD(v);
  if (!v.is_string())
    return error(jsonPointer(ptr, key),
                 std::string("expected a string, got ") + typeName(v));
  return v.get<std::string>();
}

llvm::Expected<double> JsonReader::number(const Json &obj, llvm::StringRef ptr,
                                          llvm::StringRef key,
                                          double minimum) const {
  SOAP_JSON_FIELD(v);
  if (!v.is_number())
    return error(jsonPointer(ptr, key),
                 std::string("expected a number, got ") + typeName(v));
  double d = v.get<double>();
  if (!std::isfinite(d))
    return error(jsonPointer(ptr, key), "expected a finite number");
  if (d < minimum)
    return error(jsonPointer(ptr, key),
                 fmt::format("must be at least {}, got {}", minimum, d));
  return d;
}

llvm::Expected<double> JsonReader::positive(const Json &obj,
                                            llvm::StringRef ptr,
                                            llvm::StringRef key) const {
  auto d = number(obj, ptr, key);
  if (!d)
    return d.takeError();
  if (!(*d > 0))
    return error(jsonPointer(ptr, key),
                 fmt::format("must be positive, got {}", *d));
  return *d;
}

llvm::Expected<double> JsonReader::inRange(const Json &obj, llvm::StringRef ptr,
                                           llvm::StringRef key, double lo,
                                           double hi,
                                           llvm::StringRef what) const {
  auto d = number(obj, ptr, key);
  if (!d)
    return d.takeError();
  if (!(*d >= lo && *d <= hi))
    return error(
        jsonPointer(ptr, key),
        fmt::format("{:g} is outside {:g}..{:g} {}", *d, lo, hi, what.str()));
  return *d;
}

llvm::Expected<int64_t> JsonReader::integer(const Json &obj,
                                            llvm::StringRef ptr,
                                            llvm::StringRef key,
                                            int64_t minimum) const {
  SOAP_JSON_FIELD(v);
  if (!v.is_number_integer())
    return error(jsonPointer(ptr, key),
                 std::string("expected an integer, got ") + typeName(v));
  if (v.is_number_unsigned() &&
      v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    return error(jsonPointer(ptr, key), "integer out of range");
  int64_t i = v.get<int64_t>();
  if (i < minimum)
    return error(jsonPointer(ptr, key),
                 fmt::format("must be at least {}, got {}", minimum, i));
  return i;
}

#undef SOAP_JSON_FIELD

std::string dumpJson(const Json &value) {
  // nlohmann::json objects are std::map-backed: keys come out sorted.
  return value.dump(2) + "\n";
}

llvm::Error writeFileAtomic(llvm::StringRef path, llvm::StringRef text) {
  if (path == "-") {
    llvm::outs() << text;
    llvm::outs().flush();
    return llvm::Error::success();
  }
  std::string tmp = path.str() + ".tmp";
  // A second Ctrl-C while it is written leaves no temporary behind.
  RemoveOnAbort removeOnAbort(tmp);
  {
    std::error_code ec;
    llvm::raw_fd_ostream os(tmp, ec);
    if (ec)
      return inputError("{}: cannot write: {}", path.str(), ec.message());
    os << text;
    os.close();
    if (os.has_error()) {
      os.clear_error();
      llvm::sys::fs::remove(tmp);
      return inputError("{}: write failed", path.str());
    }
  }
  if (std::error_code ec = llvm::sys::fs::rename(tmp, path)) {
    llvm::sys::fs::remove(tmp);
    return inputError("{}: cannot write: {}", path.str(), ec.message());
  }
  return llvm::Error::success();
}

} // namespace soap
