// What soap-run's CPU backend does around a kernel, shared by the executor
// (Executor.cpp) and the tile timer soap-profile --backend cpu uses
// (TileTiming.cpp), so that a timed tile does what a run does (private to
// lib/Exec).
#ifndef SOAP_EXEC_EXECRULES_H
#define SOAP_EXEC_EXECRULES_H

#include "soap/IR/Graph.h"
#include <optional>
#include <string>

namespace soap {
namespace exec {

/// Element-wise ops that save their inputs only (Mul, Div, Erf, Gelu...):
/// on the CPU backend their backward kernel reads the output too, which
/// they compute again from the kept inputs just before it.
bool rerunsForward(const Op &op, const std::string &backend);

/// Whether `b` is one row-major run of a tensor of shape `shape` (leading
/// dims of extent 1, then one partial dim, then whole dims): its first
/// element's flat index.
std::optional<int64_t> runStart(const Box &b,
                                const std::vector<int64_t> &shape);

/// Whether a reshape-like op's tile (input region `x`, output region `y`)
/// holds the same elements in the same order, so that the CPU backend
/// passes the input's buffer on as the output; only an activation's (a
/// weight reaching the reshape is lent and stays where it is).
bool reshapePassesBuffer(const Graph &g, const Op &op, const Box &x,
                         const Box &y);

} // namespace exec
} // namespace soap

#endif // SOAP_EXEC_EXECRULES_H
