// The op-tile signatures the searchers will ask the cost model for: every
// tile of every split shape of every op in the configuration space
// (Parallel/ConfigSpace.h), keyed by the cost model's own signature function
// (Cost/OpSignature.h), for some models, device counts and a space.
#ifndef SOAP_PROFILE_SIGNATURESET_H
#define SOAP_PROFILE_SIGNATURESET_H

#include "soap/IR/Fusion.h"
#include "soap/IR/Graph.h"
#include "soap/Machine/Topology.h"
#include "soap/Parallel/ConfigSpace.h"
#include "llvm/Support/Error.h"
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace soap {

struct EnumerateOptions {
  std::vector<std::string> models;
  /// Device counts to cover; empty: the topology's.
  std::vector<int64_t> deviceCounts;
  /// Samples per iteration; 0: 64 per device, as soapc does.
  int64_t batch = 0;
  /// Micro-batch counts m whose tiles (of batch / m samples, where m
  /// divides the batch) to cover too: a pipelined or gradient-accumulating
  /// plan's. {1}: the whole batch only.
  std::vector<int64_t> microBatches{1};
  SpaceKind space = SpaceKind::FlexFlow;
  bool unrollRnn = false;
  bool appendLoss = true;
  /// The element type, as soapc's --precision (bf16 tiles are bf16 kernels).
  Precision precision = Precision::FP32;
  /// The graph, as soapc's --kernels (fused ops are other kernels).
  KernelMode kernels = KernelMode::Eager;
  /// At least one model, device counts and batch >= 1.
  llvm::Error validate() const;
};

/// One op tile that has a signature: enough to build its kernels.
struct SignatureSite {
  const Graph *graph = nullptr;
  OpId op = 0;
  Box tile;
};

struct SignatureInfo {
  std::string kind;
  SignatureSite site; ///< the first tile met with this signature
  std::set<int64_t> deviceCounts;
  std::set<std::string> models;
  uint64_t tiles = 0; ///< tiles met with this signature
};

/// What one (model, device count) contributes.
struct CoverageRow {
  std::string model;
  int64_t devices = 0, batch = 0;
  size_t ops = 0;
  uint64_t shapes = 0;     ///< split shapes over all ops
  size_t signatures = 0;   ///< distinct within this row
};

/// N devices of one type under one switch: the configuration space depends
/// on the device count alone, so this stands for any cluster of N devices.
llvm::Expected<Topology> deviceCountTopology(const DeviceSpec &spec,
                                             int64_t devices);

class SignatureSet {
public:
  /// Imports every model at each device count's batch and enumerates its
  /// configuration space on `spec` devices. Errors are the importer's
  /// (exit code 2).
  static llvm::Expected<SignatureSet> enumerate(const EnumerateOptions &opts,
                                                const DeviceSpec &spec,
                                                int64_t topologyDevices);

  /// Adds the space of `g` on `devices` devices (takes ownership).
  void add(std::unique_ptr<Graph> g, const std::string &model,
           int64_t devices, int64_t batch, SpaceKind space,
           const Topology &topo);

  /// Adds one tile met elsewhere (a plan's task); `site.graph` must outlive
  /// the set.
  void addTile(const std::string &signature, const std::string &kind,
               const SignatureSite &site, const std::string &model,
               int64_t devices);

  /// Ordered by signature.
  const std::map<std::string, SignatureInfo> &signatures() const {
    return sigs_;
  }
  const std::vector<CoverageRow> &coverage() const { return coverage_; }
  /// Distinct signatures per op kind.
  std::map<std::string, size_t> kindCounts() const;

private:
  std::vector<std::unique_ptr<Graph>> graphs_;
  std::map<std::string, SignatureInfo> sigs_;
  std::vector<CoverageRow> coverage_;
};

/// "8,16" -> {8, 16}: positive, no repeats, at most kMaxDevices each.
llvm::Expected<std::vector<int64_t>> parseDeviceCounts(llvm::StringRef text);
/// "1,2,4" -> {1, 2, 4}: positive, no repeats (--micro-batches).
llvm::Expected<std::vector<int64_t>> parseMicroBatches(llvm::StringRef text);

} // namespace soap

#endif // SOAP_PROFILE_SIGNATURESET_H
