// Op semantics as a loop nest (DESIGN.md, "The IR and op semantics"): loop
// dimensions with classes, and for every operand an index map from loop
// indices to tensor indices. From a tile (a box in the loop space) the maps
// give the exact region of every tensor the tile reads or writes.
#ifndef SOAP_IR_OPSEMANTICS_H
#define SOAP_IR_OPSEMANTICS_H

#include "soap/IR/Types.h"
#include <cstdint>
#include <string>
#include <vector>

namespace soap {

/// A loop dimension of an op.
struct LoopDim {
  std::string name; ///< "n", "oc", "oh", "kh", "k", ...
  DimClass cls = DimClass::Attribute;
  int64_t size = 1;
  /// False where a split would change what is computed or break a region
  /// into non-boxes (a recurrence over time, a pooling window, a dim merged
  /// by Reshape beyond its leading position).
  bool splittable = true;
  /// A split's tile boundaries must be multiples of this (Reshape merges).
  int64_t granule = 1;
  /// Indexed in the output and also reduced for statistics (Softmax's axis,
  /// LayerNorm's hidden axis, BatchNorm's sample and spatial axes): a split
  /// costs an all-reduce of the statistics among the tiles that share them.
  bool statReduced = false;
  /// A recurrence inside the op reads the whole of this loop's output at
  /// each of this many steps (an LSTM layer's hidden units, every time
  /// step): a split costs, per step, an all-gather of the tiles' slices of
  /// the state in the forward pass and an all-reduce of its gradient in
  /// the backward pass. 0: no recurrence over this loop.
  int64_t exchangeSteps = 0;
  /// Ring attention (Liu et al. 2023; Megatron-Core's context parallelism):
  /// when this loop (FlashAttention's query loop) is split, the inputs it
  /// does not index but loop `ring` does (K and V, over the key loop) are
  /// not gathered whole to every tile: each tile holds the block of them
  /// its own range of this loop covers (ringBlock) and the blocks travel
  /// round the tiles that differ only in this loop, one step per block,
  /// overlapped with the blocks' compute (TaskGraph::buildOp). -1: none.
  int ring = -1;
};

/// One term of an index map: coeff * i[loop].
struct IndexTerm {
  int loop;
  int64_t coeff;
};

/// How one tensor dimension is indexed: floor((sum coeff*i + offset) / divisor),
/// clamped to the tensor (padding reads nothing), or the whole dimension.
struct DimMap {
  std::vector<IndexTerm> terms;
  int64_t offset = 0;
  int64_t divisor = 1;
  /// The whole dimension, whatever the tile (the trailing dims of a Reshape
  /// merge, when the tile respects the loop's granule).
  bool full = false;

  static DimMap loop(int l, int64_t coeff = 1, int64_t offset = 0) {
    DimMap m;
    m.terms.push_back({l, coeff});
    m.offset = offset;
    return m;
  }
  static DimMap constant(int64_t index) {
    DimMap m;
    m.offset = index;
    return m;
  }
  static DimMap whole() {
    DimMap m;
    m.full = true;
    return m;
  }
};

/// A half-open box: [lo[d], hi[d]) for each dimension. Empty if any lo >= hi.
struct Box {
  std::vector<int64_t> lo, hi;

  size_t rank() const { return lo.size(); }
  bool empty() const;
  /// Number of points; 0 if empty. Saturates at INT64_MAX.
  int64_t volume() const;
  Box intersect(const Box &o) const;
  bool contains(const Box &o) const;
  bool operator==(const Box &o) const { return lo == o.lo && hi == o.hi; }
  /// Lexicographic on (lo, hi): boxes as keys of ordered maps and sets.
  bool operator<(const Box &o) const {
    return lo != o.lo ? lo < o.lo : hi < o.hi;
  }
  std::string str() const;
  static Box full(const std::vector<int64_t> &dims);
};

/// Groups of boxes that hold copies of common elements: equal or
/// overlapping boxes (transitively) share a group. Returns a group index per
/// box, numbered in order of first appearance. Shards of a weight in one
/// group have their gradients summed by one all-reduce (the simulator, and
/// FT's cost of a shared weight).
std::vector<size_t> overlapGroups(const std::vector<Box> &boxes);

/// The map of one operand. `shape` is the tensor's shape as addressed here;
/// `view` is set when the op addresses the tensor through an exact
/// re-factoring of its dims (LSTM's [D, 4H, I] weights as [D, 4, H, I]), and
/// then regions are boxes in the view.
struct TensorMap {
  std::vector<DimMap> dims;
  std::vector<int64_t> shape;
  bool present = true; ///< false for an absent optional operand
  bool isView = false;
};

/// A cost term: coeff * product of the extents of the loops in `loopMask`.
struct CostTerm {
  double coeff;
  uint64_t loopMask;
};

enum class Pass : uint8_t { Forward, BackwardData, BackwardWeight };
llvm::StringRef passName(Pass p);

/// An operand kept for the backward pass.
struct SavedOperand {
  bool isOutput;
  int index;
  /// Bytes per element kept (a Relu keeps a 1-byte mask of its output).
  double bytesPerElement;
};

/// Everything the searchers, the simulator and the executor ask of an op.
struct OpSemantics {
  std::vector<LoopDim> loops;
  std::vector<TensorMap> inputs;
  std::vector<TensorMap> outputs;
  /// FLOPs of a tile per pass, as sums of terms over loop extents.
  std::vector<CostTerm> flops[3];
  /// Operands saved for backward, and extra per-point state (LSTM gates).
  std::vector<SavedOperand> saved;
  std::vector<CostTerm> savedExtraBytes;
  /// Inputs that are trainable weights (their gradients are synchronised).
  std::vector<int> weightInputs;
  /// Inputs that receive a gradient in the backward-data pass.
  std::vector<int> gradInputs;
  /// Whether any of gradInputs is a value some weight's gradient flows
  /// through (Graph::computeSemantics): a convolution that reads only the
  /// model's input runs no backward-data kernel, as no framework computes
  /// the gradient of a tensor nothing trainable depends on.
  bool backwardDataNeeded = true;

  /// The whole loop space.
  Box fullTile() const;
  /// Region of input `i` (or output `j`) that `tile` reads (writes), halo
  /// included, clamped to the tensor; empty for an absent operand.
  Box inputRegion(int i, const Box &tile) const;
  Box outputRegion(int j, const Box &tile) const;
  /// inputRegion in the tensor's own coordinates (`tensorShape`), where the
  /// op addresses input `i` through a view of it (TensorMap::isView):
  /// what a producer's outputRegion of the same tensor is comparable with.
  Box inputRegionInTensor(int i, const Box &tile,
                          const std::vector<int64_t> &tensorShape) const;
  /// Loops that do not index output `j`: splitting one makes the output a
  /// partial sum (a Reduction dim, or a loss's sample dim).
  std::vector<int> reducedLoops(int j) const;
  /// Loops missing from `map`: tiles that differ only in them address the
  /// same region of its tensor (for an input, their gradients of it are
  /// partial sums).
  std::vector<int> loopsMissingFrom(const TensorMap &map) const;
  /// Elements of the state a recurrence over loop `l` (exchangeSteps > 0)
  /// reads at one step for `tile`: all of `l` times the tile's extent in
  /// every other splittable loop.
  int64_t exchangeElements(int l, const Box &tile) const;
  /// The tile whose regions of input `i` a ring-split tile holds itself
  /// (LoopDim::ring): for each loop l with a ring loop r, split in `tile`
  /// (a proper part of l) where input i's map lacks l and indexes r, r is
  /// cut to the same fraction of its size as l's part (the key block
  /// matching the query block). `tile` itself where no ring applies.
  Box ringBlock(int i, const Box &tile) const;

  double tileFlops(Pass p, const Box &tile) const;
  /// Bytes a tile touches in a pass, from its regions: forward reads inputs
  /// and writes outputs; backward-data reads output gradients, saved
  /// operands and weights and writes input gradients; backward-weight reads
  /// output gradients and activations and writes weight gradients.
  int64_t tileBytes(Pass p, const Box &tile, const std::vector<DType> &inTypes,
                    const std::vector<DType> &outTypes) const;
  /// Bytes saved for the backward pass by a tile.
  int64_t savedBytes(const Box &tile, const std::vector<DType> &inTypes,
                     const std::vector<DType> &outTypes) const;

  /// Is every loop's extent in `tile` a legal tile of a split (granules)?
  bool tileRespectsGranules(const Box &tile) const;
};

/// Region of a tensor for a map and a tile: the hull of every index the
/// tile's points reach, clamped to [0, shape).
Box mapRegion(const TensorMap &map, const Box &tile);

uint64_t loopMaskOf(std::initializer_list<int> loops);

} // namespace soap

#endif // SOAP_IR_OPSEMANTICS_H
