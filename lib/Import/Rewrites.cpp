// Exact rewrites of the folded ONNX graph before IR construction: a zero
// constant Pad merges into the pads of the Conv / AveragePool reading it.
#include "ImportState.h"

#include <algorithm>

namespace soap {
namespace import {
namespace {

/// The spatial pads ([begins..., ends...]) of a zero constant Pad of a
/// rank-r tensor that leaves batch and channel alone, or nullopt.
std::optional<std::vector<int64_t>> spatialPads(const ImportState &s, int i) {
  const onnx::NodeProto &n = s.graph().node(i);
  const onnx::AttributeProto *mode = findAttr(n, "mode");
  if (mode && mode->s() != "constant")
    return std::nullopt;
  if (n.input_size() > 3 && !n.input(3).empty())
    return std::nullopt; // axes (opset 18)
  std::vector<int64_t> pads;
  if (n.input_size() > 1 && !n.input(1).empty()) {
    auto c = s.consts.find(n.input(1));
    if (c == s.consts.end() || !c->second.hasData)
      return std::nullopt;
    pads = c->second.asInts();
  } else if (const onnx::AttributeProto *a = findAttr(n, "pads")) {
    pads.assign(a->ints().begin(), a->ints().end());
  }
  if (n.input_size() > 2 && !n.input(2).empty()) {
    auto c = s.consts.find(n.input(2));
    if (c == s.consts.end() || !c->second.hasData ||
        c->second.numElements() != 1 || c->second.getDouble(0) != 0.0)
      return std::nullopt;
  }
  if (const onnx::AttributeProto *v = findAttr(n, "value"))
    if (v->f() != 0.0f)
      return std::nullopt;
  auto info = s.infos.find(n.input(0));
  if (info == s.infos.end() || !info->second.hasShape)
    return std::nullopt;
  size_t r = info->second.dims.size();
  if (r < 3 || pads.size() != 2 * r || pads[0] || pads[1] || pads[r] ||
      pads[r + 1] ||
      std::any_of(pads.begin(), pads.end(), [](int64_t p) { return p < 0; }))
    return std::nullopt;
  std::vector<int64_t> spatial(pads.begin() + 2, pads.begin() + r);
  spatial.insert(spatial.end(), pads.begin() + r + 2, pads.end());
  return spatial;
}

bool canAbsorb(const onnx::NodeProto &c, const std::string &padded,
               size_t spatialRank) {
  if (!(c.domain().empty() || c.domain() == "ai.onnx") ||
      (c.op_type() != "Conv" && c.op_type() != "AveragePool"))
    return false;
  for (int k = 1; k < c.input_size(); ++k)
    if (c.input(k) == padded)
      return false;
  const onnx::AttributeProto *autoPad = findAttr(c, "auto_pad");
  if (autoPad && autoPad->s() != "NOTSET")
    return false;
  const onnx::AttributeProto *pads = findAttr(c, "pads");
  if (pads && static_cast<size_t>(pads->ints_size()) != 2 * spatialRank)
    return false;
  // An average over padding must count the zeros, as the Pad made them.
  if (c.op_type() == "AveragePool" && !intAttr(c, "count_include_pad", 0) &&
      pads &&
      std::any_of(pads->ints().begin(), pads->ints().end(),
                  [](int64_t p) { return p != 0; }))
    return false;
  return true;
}

} // namespace

void fusePads(ImportState &s) {
  onnx::GraphProto *g = s.model.mutable_graph();
  std::set<std::string> graphOutputs;
  for (const auto &vi : g->output())
    graphOutputs.insert(vi.name());
  for (int i = 0; i < g->node_size(); ++i) {
    const onnx::NodeProto &pad = g->node(i);
    if (s.folded[i] || pad.op_type() != "Pad" ||
        !(pad.domain().empty() || pad.domain() == "ai.onnx") ||
        pad.output_size() != 1 || graphOutputs.count(pad.output(0)))
      continue;
    auto spatial = spatialPads(s, i);
    if (!spatial)
      continue;
    size_t rank = spatial->size() / 2;
    std::vector<int> consumers;
    bool ok = true;
    for (int j = 0; j < g->node_size() && ok; ++j) {
      if (s.folded[j])
        continue;
      const onnx::NodeProto &c = g->node(j);
      if (std::find(c.input().begin(), c.input().end(), pad.output(0)) ==
          c.input().end())
        continue;
      ok = canAbsorb(c, pad.output(0), rank);
      consumers.push_back(j);
    }
    if (!ok || consumers.empty())
      continue;
    for (int j : consumers) {
      onnx::NodeProto *c = g->mutable_node(j);
      onnx::AttributeProto *pads = nullptr;
      for (auto &a : *c->mutable_attribute())
        if (a.name() == "pads")
          pads = &a;
      if (!pads) {
        pads = c->add_attribute();
        pads->set_name("pads");
        pads->set_type(onnx::AttributeProto::INTS);
        for (size_t k = 0; k < 2 * rank; ++k)
          pads->add_ints(0);
      }
      for (size_t k = 0; k < 2 * rank; ++k)
        pads->set_ints(static_cast<int>(k), pads->ints(k) + (*spatial)[k]);
      if (c->op_type() == "AveragePool") {
        onnx::AttributeProto *cip = nullptr;
        for (auto &a : *c->mutable_attribute())
          if (a.name() == "count_include_pad")
            cip = &a;
        if (!cip) {
          cip = c->add_attribute();
          cip->set_name("count_include_pad");
          cip->set_type(onnx::AttributeProto::INT);
        }
        cip->set_i(1);
      }
      c->set_input(0, pad.input(0));
    }
    // The Pad now has no reader; drop it as if folded.
    s.folded[i] = true;
  }
}

} // namespace import
} // namespace soap
