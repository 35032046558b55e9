// What soap-run writes so that a run can be checked elsewhere: the final
// weights (--dump-weights), and step 1's forward (--dump-forward) — the
// inputs it drew, the weights it read and the model's outputs — so that
// another runtime (onnxruntime) computes the same forward from the same
// numbers.
#include "Runner.h"

#include "soap/Support/Error.h"
#include "soap/Support/Json.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include <fmt/format.h>

namespace soap {
namespace exec {

namespace {

std::string fileNameOf(llvm::StringRef name) {
  std::string s;
  for (char c : name)
    s += std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-'
             ? c
             : '_';
  return s;
}

/// Writes `whole` (all of value `v`) to DIR/<id>-<name>.f32, raw
/// little-endian float32; its manifest entry.
llvm::Expected<Json> writeTensor(const std::string &dir, const Value &v,
                                 const Buf &whole) {
  std::string file = fmt::format("{}-{}.f32", v.id, fileNameOf(v.name));
  std::string bytes(reinterpret_cast<const char *>(whole.data.data()),
                    whole.data.size() * sizeof(float));
  llvm::SmallString<256> path(dir);
  llvm::sys::path::append(path, file);
  if (auto err = writeFileAtomic(path, bytes))
    return llvm::Error(std::move(err));
  return Json{{"name", v.name}, {"file", file}, {"shape", v.shape.dims}};
}

llvm::Error makeDirectory(const std::string &dir) {
  if (std::error_code ec = llvm::sys::fs::create_directories(dir))
    return inputError("{}: cannot create: {}", dir, ec.message());
  return llvm::Error::success();
}

} // namespace

llvm::Expected<Json> Runner::writeWeights(const std::string &dir) {
  Json manifest = Json::array();
  for (const Value &w : g_.values()) {
    auto it = boxesOfWeight_.find(w.id);
    if (w.kind != ValueKind::Weight || it == boxesOfWeight_.end())
      continue;
    const std::vector<size_t> &idxs = it->second;
    std::vector<Src> srcs;
    std::vector<Buf> tmp(idxs.size());
    for (size_t a = 0; a < idxs.size(); ++a) {
      WeightBox &wb = boxes_[idxs[a]];
      const Buf *local = wb.member >= 0 ? &wholeMaster(wb, tmp[a]) : nullptr;
      srcs.push_back({wb.box, wb.group, local});
    }
    Buf whole;
    assemble(srcs,
             {{Box::full(weightShape(g_, w)), 0, me_ == 0 ? &whole : nullptr}},
             Combine::Copy);
    if (me_ != 0)
      continue;
    auto entry = writeTensor(dir, w, whole);
    if (!entry)
      return entry.takeError();
    manifest.push_back(std::move(*entry));
  }
  return manifest;
}

llvm::Error Runner::dumpWeights() {
  if (me_ == 0)
    if (auto err = makeDirectory(opts_.dumpWeightsDir))
      return err;
  auto manifest = writeWeights(opts_.dumpWeightsDir);
  if (!manifest)
    return manifest.takeError();
  if (me_ != 0)
    return llvm::Error::success();
  llvm::SmallString<256> path(opts_.dumpWeightsDir);
  llvm::sys::path::append(path, "weights.json");
  return writeFileAtomic(path, dumpJson(Json{{"weights", *manifest}}));
}

void Runner::setUpForwardDump() {
  forwardOutputs_.clear();
  if (opts_.dumpForwardDir.empty())
    return;
  auto add = [&](ValueId v) {
    if (v != kNoValue && g_.value(v).producer >= 0 &&
        std::find(forwardOutputs_.begin(), forwardOutputs_.end(), v) ==
            forwardOutputs_.end())
      forwardOutputs_.push_back(v);
  };
  // The model's outputs: what each loss scores (the logits a loss soapc
  // appended reads), then the graph's other outputs.
  for (const Op &op : g_.ops())
    if (op.kind == "SoftmaxCrossEntropyLoss")
      add(op.input(0));
  for (ValueId v : g_.outputs) {
    OpId p = g_.value(v).producer;
    if (p >= 0 && g_.op(p).kind != "SoftmaxCrossEntropyLoss")
      add(v);
  }
}

void Runner::captureOutputs(OpId o) {
  const Op &op = g_.op(o);
  for (size_t j = 0; j < op.outputs.size(); ++j) {
    if (std::find(forwardOutputs_.begin(), forwardOutputs_.end(),
                  op.outputs[j]) == forwardOutputs_.end())
      continue;
    for (const Task &t : tasks(o))
      captured_[{mb_, o, j, t.tile}].assign(t.out[j].data.begin(),
                                            t.out[j].data.end());
  }
}

llvm::Error Runner::dumpForward(const Json &weights) {
  const std::string &dir = opts_.dumpForwardDir;
  Json outputs = Json::array();
  for (ValueId vid : forwardOutputs_) {
    const Value &v = g_.value(vid);
    OpId prod = v.producer;
    size_t j = size_t(v.producerOutput);
    // Every tile of every micro-batch, summed where a split reduction left
    // partial sums (as a reader of the value gathers it).
    std::vector<Src> srcs;
    std::vector<Buf> held;
    held.reserve(plans_.size() * plans_[0][size_t(prod)].tiles.size());
    for (size_t mb = 0; mb < plans_.size(); ++mb) {
      const OpPlan &p = plans_[mb][size_t(prod)];
      for (size_t k = 0; k < p.tiles.size(); ++k) {
        auto it = captured_.find({int32_t(mb), prod, j, int64_t(k)});
        const Buf *local = nullptr;
        if (it != captured_.end()) {
          held.emplace_back();
          held.back().box = p.outReg[j][k];
          held.back().data.assign(it->second.begin(), it->second.end());
          local = &held.back();
        }
        srcs.push_back({p.outReg[j][k], ranksOf(prod, int64_t(k)), local});
      }
    }
    Buf whole;
    assemble(srcs, {{Box::full(v.shape.dims), 0, me_ == 0 ? &whole : nullptr}},
             Combine::Sum);
    if (me_ != 0)
      continue;
    auto entry = writeTensor(dir, v, whole);
    if (!entry)
      return entry.takeError();
    outputs.push_back(std::move(*entry));
  }
  captured_.clear();
  if (me_ != 0)
    return llvm::Error::success();
  // The inputs are functions of the seed and the element's index: rank 0
  // draws them whole, as every tile drew its part.
  Json inputs = Json::array();
  for (ValueId vid : g_.inputs) {
    const Value &v = g_.value(vid);
    Buf whole;
    fillLocal(v, Box::full(v.shape.dims), whole);
    auto entry = writeTensor(dir, v, whole);
    if (!entry)
      return entry.takeError();
    (*entry)["dtype"] = dtypeName(v.dtype).str();
    inputs.push_back(std::move(*entry));
  }
  llvm::SmallString<256> path(dir);
  llvm::sys::path::append(path, "forward.json");
  return writeFileAtomic(
      path, dumpJson(Json{{"inputs", inputs},
                          {"weights", weights},
                          {"outputs", outputs}}));
}

llvm::Expected<Json> Runner::startForwardDump() {
  if (me_ == 0)
    if (auto err = makeDirectory(opts_.dumpForwardDir))
      return llvm::Error(std::move(err));
  return writeWeights(opts_.dumpForwardDir);
}

} // namespace exec
} // namespace soap
