// Loading an ONNX file: protobuf parsing, external-data path checks, graph
// structure (dangling tensors, cycles, topological order) and the batch fix.
#include "ImportState.h"

#include "soap/Support/Error.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstring>
#include <fcntl.h>
#include <fmt/ranges.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl.h>
#include <queue>
#include <unistd.h>

namespace soap {
namespace import {

std::string ImportState::describe(const std::string &tensor) const {
  auto it = producer.find(tensor);
  if (it != producer.end())
    return fmt::format("tensor '{}' (output of node '{}')", tensor,
                       nodeNames[it->second]);
  if (initializers.count(tensor))
    return fmt::format("tensor '{}' (initializer)", tensor);
  return fmt::format("tensor '{}' (graph input)", tensor);
}

namespace {

/// Protobuf's recursion limit: deep enough for kMaxSubgraphNesting + 1
/// levels of graph > node > attribute > graph (3 messages a level) and the
/// tensor types under the deepest graph, so that one level too many is
/// reported as such by checkNesting rather than as a corrupt file.
constexpr int kRecursionLimit = 3 * (kMaxSubgraphNesting + 1) + 16;

llvm::Error notOnnx(const ImportState &s) {
  return inputError("{}: not an ONNX model (the protobuf does not parse: "
                    "truncated or corrupt file)",
                    s.path);
}

bool parseStream(ImportState &s, google::protobuf::io::CodedInputStream &cis) {
  // The default limit has been 64 MiB in some protobuf releases; models
  // without external data may be much larger.
  cis.SetTotalBytesLimit(static_cast<int>(kMaxModelBytes));
  cis.SetRecursionLimit(kRecursionLimit);
  return s.model.ParseFromCodedStream(&cis) && cis.ConsumedEntireMessage();
}

llvm::Error parseBytes(ImportState &s) {
  llvm::StringRef bytes = *s.buffer;
  if (bytes.empty())
    return inputError("{}: empty file, not an ONNX model", s.path);
  if (bytes.size() > kMaxModelBytes)
    return inputError("{}: the file has {} bytes; protobuf parses at most "
                      "{} (2 GiB - 1; store the weights as external data)",
                      s.path, bytes.size(), kMaxModelBytes);
  google::protobuf::io::CodedInputStream cis(
      reinterpret_cast<const uint8_t *>(bytes.data()),
      static_cast<int>(bytes.size()));
  if (!parseStream(s, cis))
    return notOnnx(s);
  return llvm::Error::success();
}

llvm::Error parseFile(ImportState &s) {
  llvm::sys::fs::file_status st;
  if (std::error_code ec = llvm::sys::fs::status(s.path, st))
    return inputError("{}: cannot read the model: {}", s.path, ec.message());
  if (st.type() == llvm::sys::fs::file_type::directory_file)
    return inputError("{}: is a directory, not an ONNX model", s.path);
  if (st.type() != llvm::sys::fs::file_type::regular_file)
    return inputError("{}: not a regular file", s.path);
  if (st.getSize() == 0)
    return inputError("{}: empty file, not an ONNX model", s.path);
  if (st.getSize() > kMaxModelBytes)
    return inputError("{}: the file has {} bytes; protobuf parses at most "
                      "{} (2 GiB - 1; store the weights as external data)",
                      s.path, st.getSize(), kMaxModelBytes);
  int fd = ::open(s.path.c_str(), O_RDONLY);
  if (fd < 0)
    return inputError("{}: cannot open the model: {}", s.path,
                      std::strerror(errno));
  bool ok;
  int readErrno;
  {
    google::protobuf::io::FileInputStream fis(fd);
    fis.SetCloseOnDelete(true);
    google::protobuf::io::CodedInputStream cis(&fis);
    ok = parseStream(s, cis);
    readErrno = fis.GetErrno();
  }
  if (readErrno)
    return inputError("{}: cannot read the model: {}", s.path,
                      std::strerror(readErrno));
  if (!ok)
    return notOnnx(s);
  return llvm::Error::success();
}

/// The subgraphs of one node's attributes (If branches, Loop/Scan bodies).
std::vector<const onnx::GraphProto *> subgraphs(const onnx::NodeProto &n) {
  std::vector<const onnx::GraphProto *> subs;
  for (const onnx::AttributeProto &a : n.attribute()) {
    if (a.has_g())
      subs.push_back(&a.g());
    for (const auto &sg : a.graphs())
      subs.push_back(&sg);
  }
  return subs;
}

/// Refuses subgraphs nested deeper than kMaxSubgraphNesting; `g` is at
/// nesting level `depth` below the main graph's node `outer`.
llvm::Error checkNesting(const ImportState &s, const onnx::GraphProto &g,
                         int depth, const std::string &outer) {
  if (depth > kMaxSubgraphNesting)
    return inputError("{}: node '{}': its subgraphs nest {} levels deep; "
                      "soapc accepts at most {}",
                      s.path, outer, depth, kMaxSubgraphNesting);
  for (const onnx::NodeProto &n : g.node())
    for (const onnx::GraphProto *sub : subgraphs(n))
      if (auto err = checkNesting(s, *sub, depth + 1, outer))
        return err;
  return llvm::Error::success();
}

llvm::Error parseModel(ImportState &s) {
  if (auto err = s.buffer ? parseBytes(s) : parseFile(s))
    return err;
  if (!s.model.has_graph())
    return inputError("{}: not an ONNX model (it has no graph)", s.path);
  bool found = false;
  for (const auto &o : s.model.opset_import())
    if (o.domain().empty() || o.domain() == "ai.onnx") {
      s.opset = o.version();
      found = true;
    }
  if (!found)
    return inputError("{}: the model imports no opset of the default ONNX "
                      "domain",
                      s.path);
  // Opset 7 (ONNX 1.2) brought the current broadcasting; 17 is the newest that
  // ONNX 1.12's shape inference knows.
  if (s.opset < kMinOpset || s.opset > kMaxOpset)
    return inputError("{}: opset_import: default-domain opset {} is outside "
                      "the supported {}..{}",
                      s.path, s.opset, kMinOpset, kMaxOpset);
  const onnx::GraphProto &g = s.model.graph();
  if (g.node_size() > kMaxOnnxNodes)
    return inputError("{}: the graph has {} nodes; soapc accepts at most {}",
                      s.path, g.node_size(), kMaxOnnxNodes);
  for (int i = 0; i < g.node_size(); ++i) {
    const onnx::NodeProto &n = g.node(i);
    std::string name =
        n.name().empty() ? fmt::format("{}_{}", n.op_type(), i) : n.name();
    for (const onnx::GraphProto *sub : subgraphs(n))
      if (auto err = checkNesting(s, *sub, 1, name))
        return err;
  }
  return llvm::Error::success();
}

/// The bytes a tensor's external data needs of its file: offset + length
/// (length defaulting to the dims' bytes); an error for an offset or
/// length that is not a non-negative integer.
llvm::Expected<uint64_t> externalEnd(const onnx::TensorProto &t) {
  uint64_t offset = 0, length = 0;
  bool hasLength = false;
  for (const auto &kv : t.external_data()) {
    if (kv.key() != "offset" && kv.key() != "length")
      continue;
    uint64_t v;
    if (llvm::StringRef(kv.value()).getAsInteger(10, v) ||
        v > static_cast<uint64_t>(INT64_MAX))
      return inputError("external data {} '{}' is not a byte count", kv.key(),
                        kv.value());
    (kv.key() == "offset" ? offset : length) = v;
    hasLength |= kv.key() == "length";
  }
  if (!hasLength) {
    auto n =
        elementCount({t.dims().data(), static_cast<size_t>(t.dims_size())});
    length = n ? static_cast<uint64_t>(*n) * elemBytes(t.data_type()) : 0;
  }
  if (length > static_cast<uint64_t>(INT64_MAX) - offset)
    return inputError("external data offset {} + length {} overflows", offset,
                      length);
  return offset + length;
}

/// External data is never read, but its path must not point outside the
/// model's directory (a model file must not make us touch arbitrary files).
/// `subject` names the tensor in "... stores its data in" (soap-run's
/// refusal of absent weights).
llvm::Error checkExternal(const ImportState &s, const onnx::TensorProto &t,
                          const std::string &what, const std::string &subject) {
  if (!protoIsExternal(t))
    return llvm::Error::success();
  std::string location;
  for (const auto &kv : t.external_data())
    if (kv.key() == "location")
      location = kv.value();
  if (location.empty())
    return inputError("{}: {}: external data has no location", s.path, what);
  bool bad =
      llvm::sys::path::is_absolute(location) ||
      llvm::sys::path::is_absolute(location, llvm::sys::path::Style::windows) ||
      location[0] == '/' || location[0] == '\\';
  for (auto it = llvm::sys::path::begin(location),
            e = llvm::sys::path::end(location);
       it != e; ++it)
    if (*it == "..")
      bad = true;
  if (location.find("..\\") != std::string::npos ||
      location.find("\\..") != std::string::npos)
    bad = true;
  if (bad)
    return inputError("{}: {}: external data location '{}' must be a relative "
                      "path inside the model's directory",
                      s.path, what, location);
  llvm::SmallString<256> dir(s.path);
  llvm::sys::path::remove_filename(dir);
  if (dir.empty())
    dir = ".";
  llvm::SmallString<256> file(dir);
  llvm::sys::path::append(file, location);
  // A missing file is fine when only dims are needed (the zoo's GPT-3
  // models have none). An existing one must not escape the directory
  // through a symlink.
  if (!llvm::sys::fs::exists(file)) {
    if (s.opts.requireExternalData)
      return inputError("{}: {} stores its data in '{}', which does not exist",
                        s.path, subject, location);
    return llvm::Error::success();
  }
  llvm::SmallString<256> realDir, realFile;
  if (llvm::sys::fs::real_path(dir, realDir) ||
      llvm::sys::fs::real_path(file, realFile))
    return llvm::Error::success();
  std::string prefix = std::string(realDir.str()) + "/";
  if (!llvm::StringRef(realFile).startswith(prefix))
    return inputError("{}: {}: external data location '{}' resolves to '{}', "
                      "outside the model's directory",
                      s.path, what, location, realFile.str().str());
  if (!s.opts.requireExternalData)
    return llvm::Error::success();
  auto end = externalEnd(t);
  if (!end)
    return inputError("{}: {}: {}", s.path, what,
                      errorMessage(end.takeError()));
  uint64_t size = 0;
  if (std::error_code ec = llvm::sys::fs::file_size(file, size))
    return inputError("{}: {}: cannot read external data '{}': {}", s.path,
                      what, location, ec.message());
  if (size < *end)
    return inputError("{}: {} stores its data in the first {} bytes of '{}', "
                      "which has {}",
                      s.path, subject, *end, location, size);
  return llvm::Error::success();
}

llvm::Error checkAllExternal(const ImportState &s) {
  const onnx::GraphProto &g = s.graph();
  for (const auto &t : g.initializer()) {
    std::string what = fmt::format("tensor '{}' (initializer)", t.name());
    if (auto err = checkExternal(s, t, what,
                                 fmt::format("initializer '{}'", t.name())))
      return err;
    if (auto err = checkStoredSize(t))
      return inputError("{}: {}: {}", s.path, what,
                        errorMessage(std::move(err)));
  }
  for (int i = 0; i < g.node_size(); ++i)
    for (const auto &a : g.node(i).attribute())
      if (a.has_t())
        if (auto err = checkExternal(s, a.t(),
                                     fmt::format("node '{}'", s.nodeNames[i]),
                                     fmt::format("node '{}': attribute '{}'",
                                                 s.nodeNames[i], a.name())))
          return err;
  return llvm::Error::success();
}

void nameNodes(ImportState &s) {
  const onnx::GraphProto &g = s.graph();
  std::set<std::string> used;
  for (const auto &n : g.node())
    if (!n.name().empty())
      used.insert(n.name());
  std::set<std::string> taken;
  s.nodeNames.clear();
  for (int i = 0; i < g.node_size(); ++i) {
    std::string name = g.node(i).name();
    if (name.empty() || taken.count(name)) {
      std::string base =
          name.empty() ? fmt::format("{}_{}", g.node(i).op_type(), i) : name;
      name = base;
      for (int k = 1;
           taken.count(name) || (name != g.node(i).name() && used.count(name));
           ++k)
        name = fmt::format("{}_{}", base, k);
    }
    taken.insert(name);
    s.nodeNames.push_back(name);
  }
}

/// Checks producers and sorts the nodes (Kahn's algorithm, ties broken by
/// file order so that sorted files keep their order).
llvm::Error sortGraph(ImportState &s) {
  onnx::GraphProto *g = s.model.mutable_graph();
  nameNodes(s);
  std::map<std::string, int> producer; // -1: graph input or initializer
  for (const auto &t : g->initializer())
    producer[t.name()] = -1;
  for (const auto &vi : g->input())
    producer[vi.name()] = -1;
  for (int i = 0; i < g->node_size(); ++i)
    for (const std::string &out : g->node(i).output()) {
      if (out.empty())
        continue;
      auto [it, fresh] = producer.emplace(out, i);
      if (!fresh)
        return inputError(
            "{}: output '{}' is already produced by {}", s.where(i), out,
            it->second < 0 ? std::string("a graph input or initializer")
                           : fmt::format("node '{}'", s.nodeNames[it->second]));
    }
  int n = g->node_size();
  std::vector<std::vector<int>> users(n);
  std::vector<int> pending(n, 0);
  for (int i = 0; i < n; ++i)
    for (const std::string &in : g->node(i).input()) {
      if (in.empty())
        continue;
      auto it = producer.find(in);
      if (it == producer.end())
        return inputError("{}: input '{}' is not produced by any node, "
                          "initializer or graph input",
                          s.where(i), in);
      if (it->second >= 0) {
        users[it->second].push_back(i);
        ++pending[i];
      }
    }
  for (const auto &vi : g->output())
    if (!producer.count(vi.name()))
      return inputError("{}: graph output '{}' is not produced by any node, "
                        "initializer or graph input",
                        s.path, vi.name());
  std::priority_queue<int, std::vector<int>, std::greater<int>> ready;
  for (int i = 0; i < n; ++i)
    if (!pending[i])
      ready.push(i);
  std::vector<int> order;
  while (!ready.empty()) {
    int i = ready.top();
    ready.pop();
    order.push_back(i);
    for (int u : users[i])
      if (--pending[u] == 0)
        ready.push(u);
  }
  if (static_cast<int>(order.size()) != n) {
    // Walk back through unsorted producers from the first unsorted node;
    // the first node seen twice lies on a cycle.
    int cur = 0;
    while (!pending[cur])
      ++cur;
    std::vector<bool> seen(n, false);
    while (!seen[cur]) {
      seen[cur] = true;
      for (const std::string &in : g->node(cur).input()) {
        auto it = producer.find(in);
        if (!in.empty() && it->second >= 0 && pending[it->second]) {
          cur = it->second;
          break;
        }
      }
    }
    return inputError("{}: the graph has a cycle through this node",
                      s.where(cur));
  }
  google::protobuf::RepeatedPtrField<onnx::NodeProto> sorted;
  std::vector<std::string> names;
  for (int i : order) {
    *sorted.Add() = std::move(*g->mutable_node(i));
    names.push_back(s.nodeNames[i]);
  }
  g->mutable_node()->Swap(&sorted);
  s.nodeNames = std::move(names);
  for (int i = 0; i < n; ++i)
    for (const std::string &out : g->node(i).output())
      if (!out.empty())
        s.producer[out] = i;
  return llvm::Error::success();
}

/// Symbolic (or unset) dims of the graph inputs become the batch.
llvm::Error fixInputs(ImportState &s) {
  onnx::GraphProto *g = s.model.mutable_graph();
  // An element type onnx does not define (0 is UNDEFINED) reaches its shape
  // inference as a typed input and crashes it (found by fuzz-onnx).
  auto knownType = [](int32_t t) {
    return t != onnx::TensorProto::UNDEFINED &&
           onnx::TensorProto::DataType_IsValid(t);
  };
  for (int i = 0; i < g->initializer_size(); ++i) {
    const onnx::TensorProto &t = g->initializer(i);
    if (!knownType(t.data_type()))
      return inputError("{}: tensor '{}' (initializer): element type {} is "
                        "not an ONNX tensor type",
                        s.path, t.name(), t.data_type());
    s.initializers[t.name()] = i;
  }
  for (onnx::ValueInfoProto &vi : *g->mutable_input()) {
    if (s.initializers.count(vi.name()))
      continue;
    std::string what = fmt::format("tensor '{}' (graph input)", vi.name());
    if (!vi.type().has_tensor_type())
      return inputError("{}: {}: not a tensor", s.path, what);
    if (!knownType(vi.type().tensor_type().elem_type()))
      return inputError("{}: {}: element type {} is not an ONNX tensor type",
                        s.path, what, vi.type().tensor_type().elem_type());
    onnx::TypeProto_Tensor *tt = vi.mutable_type()->mutable_tensor_type();
    if (!tt->has_shape())
      return inputError("{}: {}: the file gives no shape (not even a rank)",
                        s.path, what);
    std::vector<bool> symbolic;
    std::vector<int64_t> dims;
    for (int d = 0; d < tt->shape().dim_size(); ++d) {
      auto *dim = tt->mutable_shape()->mutable_dim(d);
      if (dim->has_dim_value()) {
        if (dim->dim_value() <= 0)
          return inputError("{}: {}: dim {} is {}; dims must be positive",
                            s.path, what, d, dim->dim_value());
        symbolic.push_back(false);
      } else {
        dim->set_dim_value(s.opts.batch); // clears dim_param (a oneof)
        symbolic.push_back(true);
      }
      dims.push_back(dim->dim_value());
    }
    if (!elementCount(dims))
      return inputError("{}: {}: the element count of shape [{}] overflows "
                        "int64",
                        s.path, what, fmt::join(dims, ", "));
    s.inputNames.push_back(vi.name());
    s.symbolicDims[vi.name()] = std::move(symbolic);
  }
  return llvm::Error::success();
}

} // namespace

llvm::Error loadModel(ImportState &s) {
  if (auto err = parseModel(s))
    return err;
  if (auto err = sortGraph(s))
    return err;
  if (auto err = checkAllExternal(s))
    return err;
  return fixInputs(s);
}

} // namespace import
} // namespace soap
