// SOYBEAN's k-cuts tiling (Wang et al., "Unifying Data, Model and Hybrid
// Parallelism in Deep Learning via Tensor Tiling", sections 4 and 5) on
// soapc's loop-space IR. Private to lib/Search; the unit tests include it to
// check the one-cut DP against brute force.
//
// A cut halves the devices of every current group: each op halves its tile
// along one loop (SOYBEAN's row/column tilings generalised to any loop,
// section 4.5; a Reduction loop is the "red" aligned tiling) or, when no
// loop can be halved, is replicated. The cost of a cut is the bytes a half
// lacks that its group holds (section 4.2.1's "ghost area"), forward and
// backward, plus partial-sum reductions and weight-gradient sync.
#ifndef SOAP_SEARCH_KCUTS_H
#define SOAP_SEARCH_KCUTS_H

#include "soap/IR/Graph.h"
#include "soap/Parallel/Strategy.h"
#include <cstdint>
#include <functional>
#include <vector>

namespace soap::kcuts {

/// The choice "no loop halved: the op's tile runs on both halves".
constexpr int kReplicate = -1;

/// Which loops a cut may halve: all (kcuts), only the first Sample loop
/// (data parallelism) or none of the Sample loops (model parallelism).
enum class ChoiceSet : uint8_t { All, SampleOnly, NoSample };

/// The tile of every op in one group (the group holding device 0); by the
/// even tiling every group's tiles are translates of it (SOYBEAN 4.1).
struct CutState {
  std::vector<Box> tiles; ///< per op
};

/// The whole loop space of every op: the state before the first cut.
CutState initialState(const Graph &g);

/// Loops op `o` may halve in state `s`, ascending (ties in the DP are thus
/// broken by loop index); {kReplicate} when none can be halved (the size is
/// odd or the half breaks the loop's granule).
std::vector<int> choicesOf(const Graph &g, const CutState &s, OpId o,
                           ChoiceSet set);

/// One producer output -> consumer input use of an activation.
struct Edge {
  OpId producer;
  int output;
  OpId consumer;
  int input;
  ValueId value;
};
/// Every such use, ordered by consumer, then input index.
std::vector<Edge> graphEdges(const Graph &g);

/// Forward bytes of one cut on edge `e` when the producer chooses `a` and
/// the consumer `b`: for each half, the consumer half's input region within
/// what the group holds, less what the producer half wrote; when `a`
/// makes the output a partial sum, all of it (the other half's partial).
double edgeForwardBytes(const Graph &g, const CutState &s, const Edge &e, int a,
                        int b);

/// The cost tables of one cut: per edge a producer x consumer table (forward
/// and, when a gradient flows back, backward-data alike), per op a table
/// (weight-gradient sync, partial sums of outputs nobody reads).
struct CutTables {
  std::vector<Edge> edges;
  std::vector<std::vector<int>> choices;     ///< per op
  std::vector<std::vector<double>> edgeCost; ///< [e][ia * nc + ib]
  std::vector<std::vector<double>> opCost;   ///< [o][i]
};
CutTables buildTables(const Graph &g, const CutState &s, ChoiceSet set);

/// The cost of one cut for a choice index per op (into tables.choices).
double cutCost(const CutTables &t, const std::vector<int> &choiceIndex);

struct OneCut {
  std::vector<int> choice; ///< per op: a loop or kReplicate
  double bytes = 0;        ///< delta of SOYBEAN's Algorithm 1
  bool exact = true;       ///< false when the DP had to drop states
  bool cancelled = false;  ///< stopped by its `cancelled` poll
};

/// SOYBEAN's one-cut DP (Eq. 4-5) with one op per level in topological
/// order: the state is the joint choice of the ops already decided that
/// still have an undecided neighbour. Exact unless a level exceeds
/// `maxStates` states, when only the cheapest are kept.
/// `cancelled`, polled as the DP goes, stops it (OneCut::cancelled).
OneCut oneCutDp(const CutTables &t, size_t maxStates = size_t(1) << 16,
                const std::function<bool()> &cancelled = {});
/// Every combination of choices; for tests on small graphs.
OneCut oneCutBruteForce(const CutTables &t);

/// The tiles after a cut: each op keeps the lower half of its chosen loop.
CutState applyCut(const Graph &g, const CutState &s,
                  const std::vector<int> &choice);

/// SOYBEAN Algorithm 1 unrolled: cut i (from 0) is applied in 2^i groups,
/// so total = sum_i 2^i * delta_i (Theorem 1, c_k = sum 2^(k-i) delta_i).
struct KCutsPlan {
  std::vector<std::vector<int>> cuts; ///< [cut][op]
  std::vector<double> delta;          ///< per cut, bytes per group
  double totalBytes = 0;
  bool cancelled = false; ///< stopped before its last cut
  bool exact = true;
};
/// `cancelled`, polled before each cut, stops it (KCutsPlan::cancelled).
KCutsPlan kCuts(const Graph &g, int k, ChoiceSet set = ChoiceSet::All,
                const std::function<bool()> &cancelled = {});

/// The plan as a Strategy on devices 0..2^k-1 (SOYBEAN 5.1): a tile's
/// halves at cut i give bit k-1-i of its device, so the first cut splits
/// the node-major device list in two, across the slowest links.
Strategy toStrategy(const Graph &g, const KCutsPlan &plan);

} // namespace soap::kcuts

#endif // SOAP_SEARCH_KCUTS_H
