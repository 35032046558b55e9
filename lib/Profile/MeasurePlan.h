// How soap-profile measures an op tile, decided without a GPU: the library
// (cuDNN, cuBLAS) or the streaming kernel, and for Gemm and MatMul the exact
// cuBLAS products of each pass. --list shows it, and checks that those
// products do the FLOPs the IR counts.
#ifndef SOAP_PROFILE_MEASUREPLAN_H
#define SOAP_PROFILE_MEASUREPLAN_H

#include "soap/IR/Graph.h"
#include <optional>
#include <string>
#include <vector>

namespace soap {

/// A row-major product C[m,n] = op(A)[m,k] op(B)[k,n], `batch` times, with
/// element strides between batches (0: one matrix for the whole batch).
/// Operands name the buffers of a GemmPlan.
struct GemmShape {
  enum Operand : uint8_t { A, B, Y, DA, DB, DY };
  bool tA = false, tB = false;
  int64_t m = 0, n = 0, k = 0, batch = 1;
  int64_t strideA = 0, strideB = 0, strideC = 0;
  Operand a = A, b = B, c = Y;
  double flops() const { return 2.0 * double(m) * double(n) * double(k) * double(batch); }
};

/// Gemm / MatMul as cuBLAS products: forward Y = op(A) op(B); dA = dY op(B)^T
/// and dB = op(A)^T dY, each in backward-weight when its operand is a weight,
/// else in backward-data. A matrix shared by the batch (a weight) folds the
/// batch into M; an operand batched differently from the output (partial
/// broadcasting) counts as having the output's batch.
struct GemmPlan {
  DType dtype = DType::F32;
  int64_t m = 0, n = 0, k = 0, batch = 1, batchA = 1, batchB = 1;
  std::vector<GemmShape> passes[3];
  /// Elements of each operand buffer (A, B, Y, dA, dB, dY).
  int64_t elements(GemmShape::Operand o) const;
  double flops(Pass p) const;
};

/// The plan of a Gemm or MatMul tile in f32, f16 or bf16; nothing for other
/// ops, types or shapes.
std::optional<GemmPlan> planGemm(const Graph &g, const Op &op, const Box &tile);

/// A convolution or pooling tile as cuDNN is given it (NCHW, at least two
/// spatial dims: a 1-d window gets a trailing dim of 1). cuDNN pads both
/// sides of a dim alike, so a tile that sees `before` and `after` padding
/// at its borders (the signature's pad=) is given the same total extent
/// (region + before + after) as extent + 2 pad with pad = min(before, after).
struct WindowPlan {
  DType dtype = DType::F32; ///< Conv: f32, f16 or bf16; pooling: f32
  std::vector<int> input;  ///< N, C, spatial extents
  std::vector<int> filter; ///< Conv: OC, C/group, window; else empty
  std::vector<int> window, pad, stride, dilation; ///< per spatial dim
  int groups = 1;
  bool global = false, max = false, countIncludePad = false;
  /// The tile's output region (N, C, spatial), padded like `input`.
  std::vector<int> expectedOutput;
  /// cuDNN's output dims for this geometry (its documented formula).
  std::vector<int> output() const;
};

/// The plan of a Conv (f32, f16 or bf16) or an f32 MaxPool, AveragePool,
/// GlobalAveragePool or GlobalMaxPool tile with 1 to 3 spatial dims;
/// nothing otherwise.
std::optional<WindowPlan> planWindow(const Graph &g, const Op &op,
                                     const Box &tile,
                                     const std::string &signature);

/// An ONNX LSTM tile as cuDNN's LSTM is given it (sequence-major, one
/// layer): the tile must hold every step, gate, hidden unit and input
/// feature; it may split the samples and the directions.
struct RnnPlan {
  DType dtype = DType::F32;
  int seq = 0, batch = 0, input = 0, hidden = 0, dirs = 1;
  bool bias = true; ///< ONNX's B: cuDNN's double bias
};

/// The plan of an LSTM tile cuDNN can run (f32, f16 or bf16; default
/// activations, no clip, no coupled input-forget gate, no peepholes);
/// nothing otherwise.
std::optional<RnnPlan> planRnn(const Graph &g, const Op &op, const Box &tile);

/// "cudnn", "cublas" or "stream": what soap-profile measures the tile with
/// (a library that then refuses the tile is an error for that signature).
const char *measureMethod(const Graph &g, const Op &op, const Box &tile);

} // namespace soap

#endif // SOAP_PROFILE_MEASUREPLAN_H
