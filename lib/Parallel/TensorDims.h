// How ops' index maps carry tensor dims to loops and back, for the
// hand-written plans that follow a split dim through the graph (Megatron.cpp,
// ContextParallel.cpp); private to lib/Parallel.
#ifndef SOAP_LIB_PARALLEL_TENSORDIMS_H
#define SOAP_LIB_PARALLEL_TENSORDIMS_H

#include "soap/IR/OpSemantics.h"

#include <vector>

namespace soap::detail {

/// The map dim that carries tensor dim `d` (for a view, the leading view
/// dim of the group that multiplies to it), or -1.
inline int mapDimOf(const TensorMap &m, const std::vector<int64_t> &tensor, int d) {
  if (!m.isView)
    return d < int(m.dims.size()) ? d : -1;
  size_t v = 0;
  for (size_t t = 0; t < tensor.size(); ++t) {
    size_t first = v;
    int64_t prod = 1;
    while (v < m.shape.size() && prod < tensor[t])
      prod *= m.shape[v++];
    if (int(t) == d)
      return prod == tensor[t] && v > first ? int(first) : -1;
  }
  return -1;
}

/// The tensor dim whose leading map dim is `md` (the inverse of mapDimOf),
/// or -1.
inline int tensorDimOf(const TensorMap &m, const std::vector<int64_t> &tensor,
                int md) {
  for (size_t d = 0; d < tensor.size(); ++d)
    if (mapDimOf(m, tensor, int(d)) == md)
      return int(d);
  return -1;
}

/// The loop that leads map dim `md` (the term of the largest stride, e.g.
/// the head loop of a Reshape's [heads, head dim] group): splitting it
/// splits the dim into contiguous parts. -1 when none or tied.
inline int loopOf(const TensorMap &m, int md) {
  if (md < 0 || md >= int(m.dims.size()) || m.dims[size_t(md)].full)
    return -1;
  int loop = -1;
  int64_t most = 0;
  bool tie = false;
  for (const IndexTerm &t : m.dims[size_t(md)].terms) {
    int64_t c = t.coeff < 0 ? -t.coeff : t.coeff;
    if (c > most) {
      most = c;
      loop = t.loop;
      tie = false;
    } else if (c == most && c != 0) {
      tie = true;
    }
  }
  return tie ? -1 : loop;
}

/// The map dim that loop `l` indexes, or -1.
inline int dimOfLoop(const TensorMap &m, int l) {
  for (size_t d = 0; d < m.dims.size(); ++d)
    if (loopOf(m, int(d)) == l)
      return int(d);
  return -1;
}

/// Whether loop `l` splits `parts` ways.
inline bool divides(const LoopDim &l, int64_t parts) {
  return l.splittable && l.size % parts == 0 &&
         (l.size / parts) % l.granule == 0;
}

/// Whether loop `l` splits `parts` ways into ceil-sized tiles, the last one
/// shorter but none empty (OpConfig::tile): how a padded vocabulary's loop
/// splits where its size does not divide (Strategy::vocabPadding).
inline bool splitsUnevenly(const LoopDim &l, int64_t parts) {
  return l.splittable && l.granule == 1 && parts <= l.size &&
         (l.size + parts - 1) / parts * (parts - 1) < l.size;
}

} // namespace soap::detail

#endif // SOAP_LIB_PARALLEL_TENSORDIMS_H
