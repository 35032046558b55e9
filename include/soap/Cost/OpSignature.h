// The canonical signature of an op tile: what a kernel's time depends on
// (kind, the attributes that change the kernel, the shapes of the regions the
// tile reads and writes, the effective padding at its borders, dtypes). It
// keys the cost database, so soap-profile and the cost model must agree.
#ifndef SOAP_COST_OPSIGNATURE_H
#define SOAP_COST_OPSIGNATURE_H

#include "soap/IR/Graph.h"
#include <string>

namespace soap {

/// e.g. "Conv|f32|in=16x3x230x230,64x3x7x7,64|out=16x64x112x112|
/// pad=0:0,0:0,3:0,3:0|dilations=1,1|group=1|strides=2,2". Attributes that
/// only position a tile (pads, starts, x_time, shape, split) are left out;
/// the padding a tile really sees is in `pad` (omitted when zero).
std::string opSignature(const Graph &g, const Op &op, const Box &tile);

} // namespace soap

#endif // SOAP_COST_OPSIGNATURE_H
