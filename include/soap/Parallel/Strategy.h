// Parallel configurations (DESIGN.md, "Parallel configurations"): how one op
// is split (a degree per loop dimension, S/A/P/R alike), how many copies of
// each tile run (replicas), and on which devices; a Strategy gives one to
// every op of a graph.
#ifndef SOAP_PARALLEL_STRATEGY_H
#define SOAP_PARALLEL_STRATEGY_H

#include "soap/IR/Graph.h"
#include "soap/Machine/Topology.h"
#include "llvm/Support/Error.h"
#include <string>
#include <vector>

namespace soap {

/// One op's configuration. Tiles are numbered in mixed radix over the loops,
/// the last loop fastest; tile k's replica r runs on devices[k * replicas + r].
/// Every loop is split evenly: tile coordinate c of loop l covers
/// [c * size/degree, (c+1) * size/degree).
struct OpConfig {
  std::vector<int32_t> degree; ///< one per loop of the op; 1 = not split
  int32_t replicas = 1;        ///< copies of every tile (TensorOpt)
  std::vector<DeviceId> devices;

  int64_t numTiles() const;
  int64_t numTasks() const { return numTiles() * replicas; }
  /// The box of tile k (0 <= k < numTiles()).
  Box tile(const OpSemantics &sem, int64_t k) const;
  DeviceId device(int64_t tileIndex, int32_t replica = 0) const {
    return devices[size_t(tileIndex) * replicas + replica];
  }
  /// Distinct devices, ascending.
  std::vector<DeviceId> deviceSet() const;

  bool operator==(const OpConfig &o) const {
    return degree == o.degree && replicas == o.replicas &&
           devices == o.devices;
  }
  bool operator!=(const OpConfig &o) const { return !(*this == o); }
  bool operator<(const OpConfig &o) const;

  /// "n=4 oc=2 @0-7" (split loops, replicas if > 1, devices as ranges).
  std::string str(const OpSemantics &sem) const;
  /// The single-device configuration: nothing split, on `d`.
  static OpConfig single(const OpSemantics &sem, DeviceId d);
};

/// Checks `c` for an op: one degree per loop, each >= 1 and dividing the
/// loop's size into tiles that respect its granule, unsplittable loops at 1,
/// replicas >= 1, devices.size() == numTasks(), every device in the
/// topology, no device twice among one tile's replicas. Errors name `where`.
llvm::Error verifyConfig(const OpConfig &c, const OpSemantics &sem,
                         size_t numDevices, llvm::StringRef where);

/// A configuration for every op of a graph, indexed by OpId.
struct Strategy {
  std::vector<OpConfig> configs;
  bool operator==(const Strategy &o) const { return configs == o.configs; }
};

/// Every op configured and every configuration valid on `topo`.
llvm::Error verifyStrategy(const Strategy &s, const Graph &g,
                           const Topology &topo);

} // namespace soap

#endif // SOAP_PARALLEL_STRATEGY_H
