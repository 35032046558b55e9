// The plan graph: ops as nodes coloured by the shape of their configuration
// (which loop classes are split, over how many devices), in DOT, and as SVG
// drawn directly.
#ifndef SOAP_DRIVER_PLANGRAPH_H
#define SOAP_DRIVER_PLANGRAPH_H

#include "soap/IR/Graph.h"
#include "soap/Parallel/Strategy.h"
#include "soap/Support/Json.h"
#include <string>

namespace soap {

/// "S16" (samples over 16 devices), "S4 P4", "R2 x2" (replicas), "whole":
/// the split loop classes with their degrees, replicas last.
std::string configShape(const OpSemantics &sem, const OpConfig &c);

/// DOT text of the plan; `explanation` (explainStrategy's) adds each op's
/// time on the critical path to its label.
std::string planGraphDot(const Graph &g, const Strategy &s,
                         const Json &explanation);

/// The same graph as SVG, laid out here (layers by longest path from the
/// graph's inputs), so that no Graphviz is needed.
std::string planGraphSvg(const Graph &g, const Strategy &s,
                         const Json &explanation);

} // namespace soap

#endif // SOAP_DRIVER_PLANGRAPH_H
