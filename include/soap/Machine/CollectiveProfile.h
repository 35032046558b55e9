// Measured collective bandwidth curves (TensorOpt section 3.2): for a
// collective kind and a device-group shape (nodes x devices per node), the
// achieved bandwidth at sizes 2^i; a size k with 2^i <= k < 2^(i+1) is
// predicted by linear interpolation of the bandwidths at 2^i and 2^(i+1).
#ifndef SOAP_MACHINE_COLLECTIVEPROFILE_H
#define SOAP_MACHINE_COLLECTIVEPROFILE_H

#include "soap/Machine/Units.h"
#include "soap/Support/Json.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include <map>
#include <optional>
#include <tuple>
#include <vector>

namespace soap {

enum class Collective : uint8_t {
  AllReduce,
  AllGather,
  ReduceScatter,
  Broadcast,
  SendRecv,
};
constexpr int kNumCollectives = 5;
/// "all-reduce", "all-gather", "reduce-scatter", "broadcast", "send-recv".
llvm::StringRef collectiveName(Collective c);
std::optional<Collective> parseCollective(llvm::StringRef name);

/// Which devices a collective runs on, as far as measurements care: how many
/// nodes, and how many devices in each (the same in every node).
struct GroupShape {
  uint32_t nodes = 0;
  uint32_t devicesPerNode = 0;
  bool operator<(const GroupShape &o) const {
    return std::tie(nodes, devicesPerNode) <
           std::tie(o.nodes, o.devicesPerNode);
  }
  bool operator==(const GroupShape &o) const {
    return nodes == o.nodes && devicesPerNode == o.devicesPerNode;
  }
};

/// One measured curve. Bandwidth is "algorithm bandwidth": size / time, where
/// size is the collective's full buffer (as in CollectiveModel).
struct CollectiveCurve {
  Collective kind;
  GroupShape shape;
  /// (size, bytes per second), sizes strictly increasing.
  std::vector<std::pair<Bytes, double>> points;

  /// Time for `size` bytes: the bandwidth interpolated linearly between the
  /// two measured sizes around `size`. Below the smallest size the time of
  /// the smallest size (latency-bound: sending less is not faster); above
  /// the largest, the largest size's bandwidth.
  Seconds predict(Bytes size) const;
};

class CollectiveProfile {
public:
  /// Adds a curve, replacing one of the same kind and shape.
  void add(CollectiveCurve curve);
  const CollectiveCurve *find(Collective kind, GroupShape shape) const;
  std::optional<Seconds> predict(Collective kind, GroupShape shape,
                                 Bytes size) const;
  using Key = std::tuple<Collective, GroupShape>;
  /// Every curve, ordered by (kind, nodes, devices per node).
  const std::map<Key, CollectiveCurve> &curves() const { return curves_; }
  bool empty() const { return curves_.empty(); }
  size_t size() const { return curves_.size(); }

  /// Reads an array of curves:
  ///   [{"collective": "all-reduce", "nodes": 2, "gpus_per_node": 8,
  ///     "points": [{"bytes": 1024, "bytes_per_sec": 1.1e9}, ...]}, ...]
  /// `value` is the array, `ptr` its JSON pointer; errors name both.
  static llvm::Expected<CollectiveProfile>
  fromJson(const Json &value, const JsonReader &reader, llvm::StringRef ptr);
  /// The same array, curves ordered by (kind, nodes, gpus per node).
  Json toJson() const;

private:
  std::map<Key, CollectiveCurve> curves_;
};

} // namespace soap

#endif // SOAP_MACHINE_COLLECTIVEPROFILE_H
