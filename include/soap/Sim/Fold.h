// Folding a symmetric strategy: when the devices split into f
// groups of whole nodes that are each other's image (Topology::foldBlock:
// the j-th block of every period of devices, so that a data-parallel
// replica of Megatron's pipeline-major layout is a group) and every op
// treats the groups alike — its tiles on group j are group 0's moved j
// blocks on, with the sample loop moved j f-ths of the batch on (the groups
// split the batch) or not moved (every group has the same tiles) — every
// group runs the same timeline. The task graph then holds group 0's tasks
// and the collectives that span groups (whose device sets the move maps
// onto themselves, on the real routes of all their devices), and gives
// exactly the full graph's iteration time, every group-0 task's start and
// end, and every device's memory (each group's device the copy of group
// 0's), at 1/f of the tasks: data parallelism on 1,024 GPUs costs what it
// does on one node.
//
// Why it is exact: a group's own tasks use only its devices and the
// contended links only its routes use (foldBlock checks that no two
// groups' routes share one), with the same times as group 0's; a spanning
// collective waits for its devices' predecessors, whose ends are group 0's
// by symmetry, and for its devices and links to be free — and on every
// group's own resource it also uses group 0's copy, busy at least as long
// in the folded graph as the copy is in the full one. A transfer between
// groups, or a collective spanning groups whose devices the move does not
// map onto themselves, breaks the symmetry: TaskGraph::build then builds
// the full graph.
#ifndef SOAP_SIM_FOLD_H
#define SOAP_SIM_FOLD_H

#include "soap/Parallel/Strategy.h"

namespace soap {

struct Fold {
  int32_t factor = 1;  ///< f: groups; 1 = not folded
  uint32_t block = 0;  ///< devices per block
  uint32_t period = 0; ///< devices per period (f blocks)
  const Topology::FoldBlock *machine = nullptr;
  bool active() const { return factor > 1; }
  /// Whether device `d` is in group 0 (every device when not folded).
  bool first(DeviceId d) const { return factor <= 1 || d % period < block; }
  /// `d` moved one block on within its period.
  DeviceId next(DeviceId d) const {
    return d - d % period + (d % period + block) % period;
  }
  /// The group-0 device `d` is the image of.
  DeviceId home(DeviceId d) const { return d - d % period + d % block; }
};

/// Whether configuration `c` of an op with semantics `sem` maps onto itself
/// when every device moves one `block` on within its `period`, each tile's
/// sample range moving one (period / block)-th of the batch on, or every
/// tile staying.
bool configFolds(const OpConfig &c, const OpSemantics &sem, uint32_t block,
                 uint32_t period);

/// The fold of `s` with the most groups that `topo` allows
/// (Topology::foldCandidates, foldBlock), or no fold.
Fold strategyFold(const Graph &g, const Topology &topo, const Strategy &s);

} // namespace soap

#endif // SOAP_SIM_FOLD_H
