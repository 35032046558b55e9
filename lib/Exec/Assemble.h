// The executor's one data-movement primitive (private to lib/Exec): a
// destination box receives the combination (sum, max, or copy) of every
// source box that intersects it, in source order. Every rank calls it with
// the same global lists, so the point-to-point messages it posts match.
#ifndef SOAP_EXEC_ASSEMBLE_H
#define SOAP_EXEC_ASSEMBLE_H

#include "Tensor.h"
#include "soap/Exec/Comm.h"

namespace soap {
namespace exec {

/// A box held identically by every rank in `ranks`; `buf` (laid out over
/// `box`) is set on those ranks. A destination on one of them reads it
/// there; any other gets it from ranks[0].
struct Src {
  Box box;
  std::vector<int> ranks;
  const Buf *buf;
};

/// Rank `rank` receives `box` into `out` (set on that rank only).
struct Dst {
  Box box;
  int rank;
  Buf *out;
};

/// Fills every destination of this rank: zeros (or -inf for Max), then each
/// intersecting source combined in list order, so every rank that receives
/// an element computes it bit for bit alike. A `out` may alias a `buf`.
void assemble(Comm &comm, const std::vector<Src> &srcs,
              const std::vector<Dst> &dsts, Combine c);

} // namespace exec
} // namespace soap

#endif // SOAP_EXEC_ASSEMBLE_H
