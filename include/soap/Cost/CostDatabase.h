// A cost database: kernel times of op tiles measured on one device type by
// soap-profile (profiles/<device>.json, schemas/profile.schema.json), the
// device's measured memory bandwidth and GEMM throughput, default sustained
// fractions for the analytic fallback, and measured collective curves.
#ifndef SOAP_COST_COSTDATABASE_H
#define SOAP_COST_COSTDATABASE_H

#include "soap/Machine/CollectiveProfile.h"
#include "soap/Machine/Units.h"
#include "soap/Support/Json.h"
#include "llvm/Support/Error.h"
#include <map>
#include <optional>
#include <string>

namespace soap {

/// Measured times of one op-tile signature.
struct KernelEntry {
  Seconds forward = 0, backwardData = 0, backwardWeight = 0;
  Bytes workspace = 0;
  int repeats = 0; ///< measurements behind the medians
  /// FLOPs and bytes of the tile per pass (forward, backward-data,
  /// backward-weight) as the IR counts them; they let the cost model fit
  /// its roofline to measurements. 0 when unknown.
  double flops[3] = {0, 0, 0};
  double bytes[3] = {0, 0, 0};
  /// The host's time to enqueue each pass (the libraries' calls, measured
  /// while the GPU waits): a pass issued back to back with others takes at
  /// least this long however short its kernels. 0 when unknown.
  Seconds launch[3] = {0, 0, 0};
};

/// What soap-profile recorded about the machine it ran on.
struct ProfileEnvironment {
  std::string device;  ///< catalog name, "H100-SXM"
  std::string gpuName; ///< as the driver reports it
  std::string driver, cuda, cudnn, cublas;
  /// f32 arithmetic the libraries were allowed: "fp32" or "tf32".
  std::string math;
  /// A CPU profile (soap-profile --backend cpu): the processor as the OS
  /// names it, its cores, the ranks measured at once and each rank's kernel
  /// threads (as soap-run would run them), and the kernel and MPI
  /// libraries' versions. 0 / empty for a GPU profile.
  std::string cpuName, libraries;
  int64_t cores = 0, ranks = 0, threadsPerRank = 0;
};

class CostDatabase {
public:
  ProfileEnvironment env;
  /// Measured device figures that calibrate the roofline (0 = unknown).
  double memoryBandwidthBytesPerSec = 0;
  std::map<std::string, double> gemmFlopsPerSec; ///< by dtype name ("f32")
  /// Sustained fraction of peak per op kind for the roofline where the
  /// database has no entries of that kind ("*" = every other kind).
  std::map<std::string, double> computeEfficiency;
  double memoryEfficiency = 0;
  CollectiveProfile collectives;

  const KernelEntry *find(const std::string &signature) const;
  /// Adds or replaces an entry.
  void add(const std::string &signature, KernelEntry e);
  /// Every entry, ordered by signature.
  const std::map<std::string, KernelEntry> &kernels() const {
    return kernels_;
  }
  size_t size() const { return kernels_.size(); }

  /// Merges `other` into this database: other's entries and figures win;
  /// errors if it was measured on another device type.
  llvm::Error merge(const CostDatabase &other);

  static llvm::Expected<CostDatabase> load(llvm::StringRef path);
  static llvm::Expected<CostDatabase> fromJson(const Json &doc,
                                               const JsonReader &reader);
  /// Deterministic: keys sorted, entries ordered by signature.
  Json toJson() const;
  llvm::Error save(llvm::StringRef path) const;

private:
  std::map<std::string, KernelEntry> kernels_;
};

} // namespace soap

#endif // SOAP_COST_COSTDATABASE_H
