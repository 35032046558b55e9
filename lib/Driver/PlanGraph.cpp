// The plan graph in DOT, and as SVG drawn directly.
#include "soap/Driver/PlanGraph.h"

#include "soap/Support/Error.h"
#include <algorithm>
#include <fmt/format.h>
#include <map>

namespace soap {

std::string configShape(const OpSemantics &sem, const OpConfig &c) {
  static const char letter[] = {'S', 'A', 'P', 'R'};
  std::map<int, int64_t> byClass; // class -> product of degrees
  for (size_t l = 0; l < c.degree.size() && l < sem.loops.size(); ++l)
    if (c.degree[l] > 1) {
      auto &d = byClass.try_emplace(int(sem.loops[l].cls), 1).first->second;
      d *= c.degree[l];
    }
  std::string s;
  for (const auto &[cls, d] : byClass)
    s += fmt::format("{}{}{}", s.empty() ? "" : " ", letter[cls], d);
  if (c.replicas > 1)
    s += fmt::format("{}x{}", s.empty() ? "" : " ", c.replicas);
  if (s.empty())
    s = "whole";
  if (c.deviceSet().size() == 1)
    s += fmt::format(" @{}", c.devices.empty() ? 0 : c.devices[0]);
  return s;
}

/// Colours by first appearance of a shape (ColorBrewer's Set3, 12 hues).
static const char *kPalette[] = {"#8dd3c7", "#ffffb3", "#bebada", "#fb8072",
                                 "#80b1d3", "#fdb462", "#b3de69", "#fccde5",
                                 "#d9d9d9", "#bc80bd", "#ccebc5", "#ffed6f"};

static std::string dotEscape(const std::string &s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\')
      out += '\\';
    out += c == '\n' ? ' ' : c;
  }
  return out;
}

std::string planGraphDot(const Graph &g, const Strategy &s,
                         const Json &explanation) {
  std::map<std::string, size_t> colour;
  std::vector<std::string> shapes(g.numOps());
  for (const Op &op : g.ops()) {
    shapes[size_t(op.id)] = configShape(op.sem, s.configs[size_t(op.id)]);
    colour.try_emplace(shapes[size_t(op.id)], colour.size());
  }
  std::string out = "digraph plan {\n  rankdir=TB;\n  node [shape=box, "
                    "style=\"rounded,filled\", fontname=\"Helvetica\", "
                    "fontsize=10];\n";
  const Json *ops = explanation.contains("ops") ? &explanation["ops"] : nullptr;
  for (const Op &op : g.ops()) {
    const OpConfig &c = s.configs[size_t(op.id)];
    std::string label =
        fmt::format("{}\\n{}\\n{}", dotEscape(op.name), dotEscape(op.kind),
                    dotEscape(c.str(op.sem)));
    if (ops && size_t(op.id) < ops->size()) {
      double crit = (*ops)[size_t(op.id)]["critical_s"].get<double>();
      if (crit > 0)
        label += fmt::format("\\ncritical {:.3f} ms", crit * 1e3);
    }
    out +=
        fmt::format("  op{} [label=\"{}\", fillcolor=\"{}\"];\n", op.id, label,
                    kPalette[colour[shapes[size_t(op.id)]] %
                             (sizeof kPalette / sizeof *kPalette)]);
  }
  for (const Op &op : g.ops())
    for (ValueId v : op.inputs)
      if (v != kNoValue && g.value(v).producer >= 0)
        out += fmt::format("  op{} -> op{};\n", g.value(v).producer, op.id);
  // The legend: one entry per configuration shape, in order of appearance.
  std::vector<std::string> byIndex(colour.size());
  for (const auto &[shape, i] : colour)
    byIndex[i] = shape;
  out += "  subgraph cluster_legend {\n    label=\"configurations (S sample, "
         "A attribute, P parameter, R reduction, x replicas)\";\n"
         "    fontsize=10;\n";
  for (size_t i = 0; i < byIndex.size(); ++i)
    out += fmt::format("    legend{} [label=\"{}\", fillcolor=\"{}\"];\n", i,
                       dotEscape(byIndex[i]),
                       kPalette[i % (sizeof kPalette / sizeof *kPalette)]);
  out += "  }\n}\n";
  return out;
}

static std::string xmlEscape(const std::string &s) {
  std::string out;
  for (char c : s) {
    switch (c) {
    case '&':
      out += "&amp;";
      break;
    case '<':
      out += "&lt;";
      break;
    case '>':
      out += "&gt;";
      break;
    case '"':
      out += "&quot;";
      break;
    default:
      out += c;
    }
  }
  return out;
}

/// At most `n` characters (UTF-8 aware enough for names: whole bytes past
/// the cut are dropped), "…" marking a cut.
static std::string clip(const std::string &s, size_t n) {
  if (s.size() <= n)
    return s;
  size_t cut = n - 1;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80)
    --cut;
  return s.substr(0, cut) + "…";
}

std::string planGraphSvg(const Graph &g, const Strategy &s,
                         const Json &explanation) {
  // Layers by longest path from the graph's inputs (op ids are a
  // topological order), ops in id order within a layer; edges are straight
  // lines from a producer's bottom to a consumer's top. Drawn here, as the
  // frontier's plot is, so that no Graphviz is needed.
  const double boxW = 230, boxH = 58, gapX = 20, gapY = 36, margin = 20;
  size_t n = g.numOps();
  std::vector<size_t> layer(n, 0), slot(n, 0);
  std::vector<std::vector<OpId>> layers;
  for (const Op &op : g.ops()) {
    size_t l = 0;
    for (ValueId v : op.inputs)
      if (v != kNoValue && g.value(v).producer >= 0)
        l = std::max(l, layer[size_t(g.value(v).producer)] + 1);
    layer[size_t(op.id)] = l;
    if (layers.size() <= l)
      layers.resize(l + 1);
    slot[size_t(op.id)] = layers[l].size();
    layers[l].push_back(op.id);
  }
  std::map<std::string, size_t> colour;
  std::vector<std::string> shapes(n);
  for (const Op &op : g.ops()) {
    shapes[size_t(op.id)] = configShape(op.sem, s.configs[size_t(op.id)]);
    colour.try_emplace(shapes[size_t(op.id)], colour.size());
  }
  size_t widest = 1;
  for (const auto &l : layers)
    widest = std::max(widest, l.size());
  const size_t legendPerRow = 4;
  size_t legendRows = (colour.size() + legendPerRow - 1) / legendPerRow;
  double legendH = 24 + 22 * double(legendRows);
  double width = std::max(2 * margin + double(widest) * (boxW + gapX) - gapX,
                          2 * margin + double(legendPerRow) * (boxW + gapX));
  double height =
      2 * margin + legendH + double(layers.size()) * (boxH + gapY) - gapY;
  auto x = [&](OpId o) {
    // Each layer centred.
    double row = double(layers[layer[size_t(o)]].size()) * (boxW + gapX) - gapX;
    return (width - row) / 2 + double(slot[size_t(o)]) * (boxW + gapX);
  };
  auto y = [&](OpId o) {
    return margin + legendH + double(layer[size_t(o)]) * (boxH + gapY);
  };
  const size_t kColours = sizeof kPalette / sizeof *kPalette;
  std::string out = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" "
      "height=\"{:.0f}\" font-family=\"Helvetica, Arial, sans-serif\" "
      "font-size=\"10\">\n<rect width=\"100%\" height=\"100%\" "
      "fill=\"white\"/>\n",
      width, height);
  // The legend: one entry per configuration shape, in order of appearance.
  std::vector<std::string> byIndex(colour.size());
  for (const auto &[shape, i] : colour)
    byIndex[i] = shape;
  out += fmt::format("<text x=\"{:.0f}\" y=\"{:.0f}\">configurations (S "
                     "sample, A attribute, P parameter, R reduction, x "
                     "replicas)</text>\n",
                     margin, margin + 10);
  for (size_t i = 0; i < byIndex.size(); ++i) {
    double lx = margin + double(i % legendPerRow) * (boxW + gapX);
    double ly = margin + 18 + 22 * double(i / legendPerRow);
    out += fmt::format("<rect x=\"{:.0f}\" y=\"{:.0f}\" width=\"18\" "
                       "height=\"14\" rx=\"3\" fill=\"{}\" stroke=\"#555\"/>"
                       "<text x=\"{:.0f}\" y=\"{:.0f}\">{}</text>\n",
                       lx, ly, kPalette[i % kColours], lx + 24, ly + 11,
                       xmlEscape(clip(byIndex[i], 36)));
  }
  out += "<g stroke=\"#888\" stroke-width=\"1\">\n";
  for (const Op &op : g.ops())
    for (ValueId v : op.inputs)
      if (v != kNoValue && g.value(v).producer >= 0) {
        OpId p = g.value(v).producer;
        out += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" "
                           "y2=\"{:.1f}\"/>\n",
                           x(p) + boxW / 2, y(p) + boxH, x(op.id) + boxW / 2,
                           y(op.id));
      }
  out += "</g>\n";
  const Json *ops = explanation.contains("ops") ? &explanation["ops"] : nullptr;
  for (const Op &op : g.ops()) {
    const OpConfig &c = s.configs[size_t(op.id)];
    std::string last = c.str(op.sem);
    if (ops && size_t(op.id) < ops->size()) {
      double crit = (*ops)[size_t(op.id)]["critical_s"].get<double>();
      if (crit > 0)
        last += fmt::format(", critical {:.3f} ms", crit * 1e3);
    }
    double bx = x(op.id), by = y(op.id);
    out += fmt::format(
        "<g><title>{}</title><rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.0f}\" "
        "height=\"{:.0f}\" rx=\"8\" fill=\"{}\" stroke=\"#333\"/>\n",
        xmlEscape(op.name), bx, by, boxW, boxH,
        kPalette[colour[shapes[size_t(op.id)]] % kColours]);
    const std::string lines[] = {clip(op.name, 40), clip(op.kind, 40),
                                 clip(last, 40)};
    for (size_t k = 0; k < 3; ++k)
      out += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" "
                         "text-anchor=\"middle\">{}</text>\n",
                         bx + boxW / 2, by + 16 + 15 * double(k),
                         xmlEscape(lines[k]));
    out += "</g>\n";
  }
  out += "</svg>\n";
  return out;
}

} // namespace soap
