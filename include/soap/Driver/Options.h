// Everything `soapc` was asked to do, as a plain struct (STYLE.md rule 5):
// the tool fills it from its flags, the subcommands of the driver library
// read it. Fields a plan also records are optional: a plan's value is used
// where the user gave none.
#ifndef SOAP_DRIVER_OPTIONS_H
#define SOAP_DRIVER_OPTIONS_H

#include <cstdint>
#include <optional>
#include <string>

namespace soap {

/// Auto: a table on a terminal; for compare, CSV when stdout is not one.
enum class OutputFormat { Auto, Table, Csv, Json };

struct DriverOptions {
  // Inputs.
  std::string modelPath;     ///< <model.onnx>
  std::string topologyPath;  ///< --topology
  std::string planPath;      ///< check, explain, diff: the (first) plan
  std::string otherPlanPath; ///< diff: the second plan
  std::string profilePath;   ///< --profile
  std::optional<int64_t> batch;
  std::optional<bool> noLoss, unrollRnn;
  std::optional<std::string> costModel, optimizer, precision;
  /// --kernels: "eager" or "fused" (the default).
  std::optional<std::string> kernels;
  OutputFormat format = OutputFormat::Auto;

  // simulate
  std::string strategy = "data";
  std::string tracePath;
  bool noFold = false; ///< --no-fold: every device's tasks
  /// simulate, explain: a plan used on a cluster or at a batch other than
  /// its own is refused unless these are given (then a warning).
  bool allowOtherTopology = false, allowOtherBatch = false;

  // search, compare, check --research
  std::string search = "mcmc";
  std::string budget = "20000";
  std::string timeout; ///< per searcher, e.g. "30s"; empty: none
  uint64_t seed = 0;
  std::string space = "flexflow";
  int chains = 1;
  int threads = 0; ///< 0: every core the process may run on
  double beta = 0;
  std::string outputPath; ///< -o
  int jobs = 0;           ///< compare: searchers run at once (0: all)

  // frontier
  std::string ftMode = "frontier";
  std::string ftJsonPath, ftSvgPath;
  int ftPoint = -1;
  int ftMaxSplitLoops = 1;
  std::string ftMesh = "auto"; ///< 1d, node or auto
  double ftResolution = 0.01;
  unsigned ftSimulate = 32;
  bool ftNoReuse = false, ftNoLdp = false, ftNoRecompute = false,
       ftZero = false;
  unsigned ftMicroBatches = 1;

  // check
  bool research = false;
  std::string tolerance = "2%";

  // emit
  std::string emitTarget; ///< --target: megatron, nemo, torchtitan, dtensor

  // explain
  std::string dotPath, svgPath; ///< the plan graph
  unsigned top = 10;            ///< ops listed by time (0: all)

  bool quiet = false;
};

} // namespace soap

#endif // SOAP_DRIVER_OPTIONS_H
