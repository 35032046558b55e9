// FT's options: the node mesh a topology allows, and their validation.
#include "soap/Search/FrontierTracking.h"

#include "soap/Support/Error.h"
#include <algorithm>

namespace soap {

int32_t FtOptions::nodeMeshOf(const Topology &topo) {
  size_t per = topo.devicesPerNode();
  return per * std::max<size_t>(1, topo.numNodes()) == topo.numDevices() &&
                 (per & (per - 1)) == 0
             ? int32_t(per)
             : 0;
}

int32_t FtOptions::nodeMeshFor(const Topology &topo) {
  return topo.numDevices() > 64 && topo.numNodes() > 1 ? nodeMeshOf(topo) : 0;
}

llvm::Error FtOptions::validate() const {
  if (devices != 0 && (devices & (devices - 1)) != 0)
    return inputError("ft: the device count must be a power of two, got {}",
                      devices);
  if (maxSplitLoops < 1 || maxSplitLoops > 4)
    return inputError("ft: --max-split-loops must be 1 to 4, got {}",
                      maxSplitLoops);
  if (nodeMesh < 0 || (nodeMesh & (nodeMesh - 1)) != 0)
    return inputError("ft: the node mesh must be a power of two, got {}",
                      nodeMesh);
  if (threads < 1 || threads > 256)
    return inputError(
        "--threads must be between 0 (every core) and 256, got {}", threads);
  if (!(resolution >= 0 && resolution < 0.5))
    return inputError("ft: --resolution must be in [0, 0.5), got {}",
                      resolution);
  if (maxMergedConfigs < 1)
    return inputError("ft: the merged-configuration cap must be positive");
  if (microBatches < 1)
    return inputError("ft: --micro-batches must be at least 1, got {}",
                      microBatches);
  return llvm::Error::success();
}

} // namespace soap
