// The plan graph in DOT (and SVG through Graphviz).
#include "soap/Driver/PlanGraph.h"

#include "soap/Support/Error.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Program.h"
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

llvm::Expected<std::string> findGraphviz() {
  auto p = llvm::sys::findProgramByName("dot");
  if (!p)
    return inputError("--svg needs Graphviz's 'dot' on PATH (Debian: "
                      "apt-get install graphviz); --dot writes the graph "
                      "without it");
  return *p;
}

llvm::Error renderSvg(const std::string &dotProgram, const std::string &dot,
                      const std::string &path) {
  llvm::SmallString<128> in, out;
  if (auto ec = llvm::sys::fs::createTemporaryFile("soapc-plan", "dot", in))
    return internalError("a temporary file for dot: {}", ec.message());
  if (auto ec = llvm::sys::fs::createTemporaryFile("soapc-plan", "svg", out))
    return internalError("a temporary file for dot: {}", ec.message());
  auto cleanup = [&] {
    llvm::sys::fs::remove(in);
    llvm::sys::fs::remove(out);
  };
  if (auto err = writeFileAtomic(in, dot)) {
    cleanup();
    return err;
  }
  std::string msg;
  std::vector<llvm::StringRef> args = {dotProgram, "-Tsvg", in, "-o", out};
  int rc =
      llvm::sys::ExecuteAndWait(dotProgram, args, llvm::None, {}, 0, 0, &msg);
  if (rc != 0) {
    cleanup();
    return internalError("dot -Tsvg failed (exit {}){}", rc,
                         msg.empty() ? "" : ": " + msg);
  }
  auto svg = llvm::MemoryBuffer::getFile(out);
  if (!svg) {
    cleanup();
    return internalError("reading dot's output: {}", svg.getError().message());
  }
  llvm::Error err = writeFileAtomic(path, (*svg)->getBuffer());
  cleanup();
  return err;
}

} // namespace soap
