// The op registry: each op kind registers a name, a one-line description and
// the builder of its semantics. Registered explicitly by registerAllOps().
#ifndef SOAP_IR_OPREGISTRY_H
#define SOAP_IR_OPREGISTRY_H

#include "soap/IR/OpSemantics.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include <functional>
#include <map>
#include <string>

namespace soap {

class Graph;
struct Op;

/// Builds an op's semantics from its operands' shapes and attributes.
/// Errors describe the problem only; the caller prefixes file and node.
using SemanticsBuilder =
    std::function<llvm::Expected<OpSemantics>(const Op &, const Graph &)>;

struct OpKindInfo {
  std::string name;
  std::string description;
  SemanticsBuilder build;
  /// Inputs that, when fed by an initializer, hold trainable weights
  /// (Conv's W and B; Gemm's B and C; an embedding's table).
  std::vector<int> weightSlots;
  /// True when any floating initializer operand with more than one element
  /// is a weight (a bias added by Add, a MatMul with a weight matrix).
  bool anyOperandIsWeight = false;
  /// Inputs that hold non-trainable state (BatchNorm's running statistics).
  std::vector<int> stateSlots;
};

class OpRegistry {
public:
  static OpRegistry &instance();
  void add(OpKindInfo info);
  const OpKindInfo *lookup(llvm::StringRef kind) const;
  const std::map<std::string, OpKindInfo> &kinds() const { return kinds_; }

private:
  std::map<std::string, OpKindInfo> kinds_;
};

/// Registers every op kind soapc understands; idempotent.
void registerAllOps();

} // namespace soap

#endif // SOAP_IR_OPREGISTRY_H
