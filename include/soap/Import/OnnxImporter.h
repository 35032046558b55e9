// ONNX → IR: loads a model file, fixes the batch size, runs ONNX shape
// inference, folds shape arithmetic and builds a verified soap::Graph.
#ifndef SOAP_IMPORT_ONNXIMPORTER_H
#define SOAP_IMPORT_ONNXIMPORTER_H

#include "soap/IR/Fusion.h"
#include "soap/IR/Graph.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include <cstdint>
#include <memory>

namespace soap {

struct ImportOptions {
  /// Value for every symbolic (or unset) dim of the graph inputs: the sample
  /// dim. Those dims get DimClass::Sample, every other input dim Attribute.
  int64_t batch = 64;
  /// When the model has no SoftmaxCrossEntropyLoss / NegativeLogLikelihoodLoss,
  /// append `SoftmaxCrossEntropyLoss` (op name "soapc.loss", attributes
  /// `class_axis` and `reduction`="mean") on the first graph output, which
  /// must be floating with rank >= 2. The class axis is the last axis (axis 1
  /// for rank 2). It adds a graph input `labels` (I64, the logits' shape
  /// without the class axis, same dim classes) and an output `loss` (F32,
  /// shape []) that becomes the only graph output.
  bool appendLoss = true;
  /// Unroll every LSTM into per-step cells (IR/UnrollRnn.h) after import,
  /// as soapc's --unroll-rnn and a plan that records it ask.
  bool unrollRnn = false;
  /// The element type to train at (Graph::setPrecision) after import:
  /// soapc's --precision and a plan's /search/precision.
  Precision precision = Precision::FP32;
  /// The kernels the graph is priced and run as (IR/Fusion.h): soapc's
  /// --kernels and a plan's /search/kernels. Fused runs the rewrite after
  /// import (and unrolling), before the precision is set.
  KernelMode kernels = KernelMode::Eager;
  /// Refuse initializers whose external data file is missing or shorter
  /// than the bytes they say they use (soap-run, which trains, asks for
  /// this). Otherwise absent external data is fine: only dims are needed.
  bool requireExternalData = false;
  /// Keep the values of every constant the graph computes with (soap-run,
  /// which computes, asks for this: GPT-2's 1024 x 1024 causal mask, Swin's
  /// shifted-window masks). Otherwise constants past kMaxKeptConstData
  /// elements keep their dims only, which is all the searchers need.
  bool keepConstantData = false;

  /// Errors unless batch >= 1.
  llvm::Error validate() const;
};

/// Limits on what importOnnx accepts (README, "Limits"); one past any of
/// them is an inputError.
/// The largest model file: protobuf's own limit on one message (INT_MAX
/// bytes); larger weights belong in external data, which is never read.
constexpr uint64_t kMaxModelBytes = 2147483647;
/// The most nodes in the main graph: the IR, the searchers' per-op tables and
/// the simulator's task graph grow linearly with it; the zoo's largest model
/// has a few thousand.
constexpr int64_t kMaxOnnxNodes = 100000;
/// The default-domain opsets the importer accepts.
constexpr int64_t kMinOpset = 7, kMaxOpset = 17;
/// The most elements of a constant whose values the IR keeps unless
/// ImportOptions::keepConstantData is set.
constexpr int64_t kMaxKeptConstData = 4096;
/// The deepest nesting of subgraphs (If/Loop/Scan bodies) that is parsed;
/// deeper files are refused before anything recurses into them.
constexpr int kMaxSubgraphNesting = 100;

/// Imports the ONNX model at `path`. Every error that the file can cause is
/// an inputError (exit code 2) whose message starts with `path` and names the
/// node or tensor concerned. External data is never read (only dims are
/// needed); its paths are checked to stay inside the model's directory, and
/// its files to exist when `opts.requireExternalData` is set.
///
/// Operand conventions of the IR (constant operands become attributes):
/// Reshape `shape` (the resolved output dims), Slice `starts`/`steps` (one per
/// data dim), Squeeze/Unsqueeze `axes`, Split `split`/`axis`, Reduce* `axes`/
/// `keepdims`, Dropout `ratio`/`training_mode`; Expand keeps only its data
/// input. Axis attributes (`axis`, `perm`, `axes`) are non-negative.
llvm::Expected<std::unique_ptr<Graph>> importOnnx(llvm::StringRef path,
                                                  const ImportOptions &opts);

/// The same from the bytes of a model file (the fuzz target's entry point);
/// `name` stands for the path in errors and external data resolves against
/// its directory.
llvm::Expected<std::unique_ptr<Graph>>
importOnnxBuffer(llvm::StringRef bytes, llvm::StringRef name,
                 const ImportOptions &opts);

} // namespace soap

#endif // SOAP_IMPORT_ONNXIMPORTER_H
