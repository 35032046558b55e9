// Importer tests on tiny ModelProtos written to temporary files: batch
// override, shape folding, topological sort, value kinds, operand
// conventions, the appended loss, and the errors bad files must give.
#include "soap/Import/OnnxImporter.h"

#include "soap/Support/Error.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include <catch2/catch.hpp>
#include <climits>
#include <fstream>
#include <onnx/onnx_pb.h>

using namespace soap;

namespace {

using TP = onnx::TensorProto;

/// A temporary directory removed with everything in it.
struct TempDir {
  llvm::SmallString<128> path;
  TempDir() {
    std::error_code ec =
        llvm::sys::fs::createUniqueDirectory("soap-import", path);
    REQUIRE(!ec);
  }
  ~TempDir() { llvm::sys::fs::remove_directories(path); }
  std::string file(llvm::StringRef name) const {
    llvm::SmallString<128> p(path);
    llvm::sys::path::append(p, name);
    return std::string(p.str());
  }
};

/// Builds a model; dims given as strings are symbolic.
struct Model {
  onnx::ModelProto m;
  onnx::GraphProto *g;

  Model() {
    m.set_ir_version(8);
    auto *o = m.add_opset_import();
    o->set_domain("");
    o->set_version(17);
    g = m.mutable_graph();
    g->set_name("test");
  }
  void input(const std::string &name, std::vector<std::string> dims,
             int elem = TP::FLOAT) {
    auto *vi = g->add_input();
    vi->set_name(name);
    auto *tt = vi->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(elem);
    auto *shape = tt->mutable_shape();
    for (const std::string &d : dims) {
      auto *dim = shape->add_dim();
      if (!d.empty() && (std::isdigit(d[0]) || d[0] == '-'))
        dim->set_dim_value(std::stoll(d));
      else
        dim->set_dim_param(d);
    }
  }
  void output(const std::string &name, int elem = TP::FLOAT) {
    auto *vi = g->add_output();
    vi->set_name(name);
    vi->mutable_type()->mutable_tensor_type()->set_elem_type(elem);
  }
  onnx::NodeProto &node(const std::string &op, std::vector<std::string> ins,
                        std::vector<std::string> outs,
                        const std::string &name = "") {
    auto *n = g->add_node();
    n->set_op_type(op);
    n->set_name(name);
    for (auto &i : ins)
      n->add_input(i);
    for (auto &o : outs)
      n->add_output(o);
    return *n;
  }
  /// A float initializer; without values it is stripped (dims only).
  TP &weight(const std::string &name, std::vector<int64_t> dims,
             std::vector<float> values = {}) {
    TP *t = g->add_initializer();
    t->set_name(name);
    t->set_data_type(TP::FLOAT);
    for (int64_t d : dims)
      t->add_dims(d);
    for (float v : values)
      t->add_float_data(v);
    return *t;
  }
  void ints(const std::string &name, std::vector<int64_t> dims,
            std::vector<int64_t> values) {
    TP *t = g->add_initializer();
    t->set_name(name);
    t->set_data_type(TP::INT64);
    for (int64_t d : dims)
      t->add_dims(d);
    for (int64_t v : values)
      t->add_int64_data(v);
  }
  /// A Constant node producing an int64 tensor.
  void constInts(const std::string &name, std::vector<int64_t> values,
                 bool scalar = false) {
    auto &n = node("Constant", {}, {name}, name + "_node");
    auto *a = n.add_attribute();
    a->set_name("value");
    a->set_type(onnx::AttributeProto::TENSOR);
    TP *t = a->mutable_t();
    t->set_data_type(TP::INT64);
    if (!scalar)
      t->add_dims(static_cast<int64_t>(values.size()));
    for (int64_t v : values)
      t->add_int64_data(v);
  }
  std::string save(const TempDir &dir, const std::string &name = "m.onnx") {
    std::string path = dir.file(name);
    std::ofstream f(path, std::ios::binary);
    REQUIRE(m.SerializeToOstream(&f));
    return path;
  }
};

void setInt(onnx::NodeProto &n, const std::string &name, int64_t v) {
  auto *a = n.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(v);
}

void setInts(onnx::NodeProto &n, const std::string &name,
             std::vector<int64_t> v) {
  auto *a = n.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INTS);
  for (int64_t x : v)
    a->add_ints(x);
}

std::unique_ptr<Graph> importOk(const std::string &path,
                                ImportOptions opts = {}) {
  auto g = importOnnx(path, opts);
  if (!g)
    FAIL(errorMessage(g.takeError()));
  return std::move(*g);
}

std::string importError(const std::string &path, ImportOptions opts = {}) {
  auto g = importOnnx(path, opts);
  REQUIRE(!g);
  llvm::Error err = g.takeError();
  bool isInput = false;
  std::string msg;
  llvm::handleAllErrors(std::move(err), [&](const SoapError &e) {
    isInput = e.code() == ExitCode::InvalidInput;
    msg = e.message();
  });
  CHECK(isInput);
  CHECK(llvm::StringRef(msg).startswith(path));
  return msg;
}

/// x[N, 8] -> MatMul(w[8, 4]) -> Relu -> y
Model mlp() {
  Model m;
  m.input("x", {"N", "8"});
  m.weight("w", {8, 4});
  m.node("MatMul", {"x", "w"}, {"h"}, "mm");
  m.node("Relu", {"h"}, {"y"}, "relu");
  m.output("y");
  return m;
}

const Op &opNamed(const Graph &g, const std::string &name) {
  OpId id = g.findOp(name);
  REQUIRE(id >= 0);
  return g.op(id);
}

} // namespace

TEST_CASE("import: batch override and sample dims", "[import]") {
  TempDir dir;
  std::string path = mlp().save(dir);
  ImportOptions opts;
  opts.batch = 5;
  auto g = importOk(path, opts);
  const Value &x = g->value(g->findValue("x"));
  CHECK(x.kind == ValueKind::Input);
  CHECK(x.shape.dims == std::vector<int64_t>{5, 8});
  CHECK(x.dimClasses ==
        std::vector<DimClass>{DimClass::Sample, DimClass::Attribute});
  CHECK(g->value(g->findValue("y")).shape.dims == std::vector<int64_t>{5, 4});
  CHECK(g->parameterCount() == 32);
}

TEST_CASE("import: options are validated", "[import]") {
  TempDir dir;
  std::string path = mlp().save(dir);
  ImportOptions opts;
  opts.batch = 0;
  auto g = importOnnx(path, opts);
  REQUIRE(!g);
  CHECK_THAT(errorMessage(g.takeError()), Catch::Contains("batch"));
}

TEST_CASE("import: PyTorch flatten chain folds to a Reshape", "[import]") {
  // Shape -> Gather(0) -> Unsqueeze -> Concat(-1) -> Reshape, as
  // x.view(x.size(0), -1) exports.
  TempDir dir;
  Model m;
  m.input("x", {"N", "3", "4", "4"});
  m.node("Relu", {"x"}, {"r"}, "relu");
  m.node("Shape", {"r"}, {"s"}, "shape");
  m.constInts("zero", {0}, /*scalar=*/true);
  setInt(m.node("Gather", {"s", "zero"}, {"n"}, "gather"), "axis", 0);
  m.constInts("axes0", {0});
  m.node("Unsqueeze", {"n", "axes0"}, {"n1"}, "unsqueeze");
  m.constInts("minus1", {-1});
  setInt(m.node("Concat", {"n1", "minus1"}, {"target"}, "concat"), "axis", 0);
  m.node("Reshape", {"r", "target"}, {"flat"}, "reshape");
  m.weight("w", {48, 10});
  m.node("MatMul", {"flat", "w"}, {"logits"}, "fc");
  m.output("logits");
  ImportOptions opts;
  opts.batch = 7;
  auto g = importOk(m.save(dir), opts);
  std::vector<std::string> kinds;
  for (const Op &o : g->ops())
    kinds.push_back(o.kind);
  CHECK(kinds == std::vector<std::string>{"Relu", "Reshape", "MatMul",
                                          "SoftmaxCrossEntropyLoss"});
  const Op &reshape = opNamed(*g, "reshape");
  CHECK(reshape.inputs.size() == 1);
  CHECK(reshape.getInts("shape") == std::vector<int64_t>{7, 48});
  CHECK(g->value(g->findValue("logits")).shape.dims ==
        std::vector<int64_t>{7, 10});
}

TEST_CASE("import: arithmetic on constants folds", "[import]") {
  // A Reshape target computed with Range, Mul, Sub, Equal, Where and Cast.
  TempDir dir;
  Model m;
  m.input("x", {"N", "6", "4"});
  m.constInts("start", {0}, true);
  m.constInts("limit", {3}, true);
  m.constInts("delta", {1}, true);
  m.node("Range", {"start", "limit", "delta"}, {"r"}, "range"); // [0 1 2]
  m.constInts("two", {2}, true);
  m.node("Mul", {"r", "two"}, {"r2"}, "mul"); // [0 2 4]
  m.constInts("four", {4}, true);
  m.node("Equal", {"r2", "four"}, {"eq"}, "eq"); // [F F T]
  m.constInts("dims", {-1, 2, 12});
  m.constInts("last", {1, 1, 12});
  m.node("Where", {"eq", "last", "dims"}, {"t"}, "where"); // [-1 2 12]
  auto &cast = m.node("Cast", {"t"}, {"t64"}, "cast");
  setInt(cast, "to", TP::INT64);
  m.node("Reshape", {"x", "t64"}, {"y"}, "reshape");
  m.output("y");
  ImportOptions opts;
  opts.batch = 2;
  opts.appendLoss = false;
  auto g = importOk(m.save(dir), opts);
  REQUIRE(g->numOps() == 1);
  CHECK(g->op(0).getInts("shape") == std::vector<int64_t>{2, 2, 12});
}

TEST_CASE("import: unsorted nodes are sorted stably", "[import]") {
  TempDir dir;
  Model m = mlp();
  m.g->mutable_node()->SwapElements(0, 1);
  auto g = importOk(m.save(dir));
  REQUIRE(g->numOps() == 3);
  CHECK(g->op(0).name == "mm");
  CHECK(g->op(1).name == "relu");
  CHECK(g->op(2).name == "soapc.loss");
}

TEST_CASE("import: empty node names get unique generated names", "[import]") {
  TempDir dir;
  Model m;
  m.input("x", {"N", "8"});
  m.node("Relu", {"x"}, {"a"});
  m.node("Relu", {"a"}, {"b"}, "Relu_1"); // collides with a generated name
  m.node("Relu", {"b"}, {"y"});
  m.output("y");
  ImportOptions opts;
  opts.appendLoss = false;
  auto g = importOk(m.save(dir), opts);
  REQUIRE(g->numOps() == 3);
  CHECK(g->op(0).name == "Relu_0");
  CHECK(g->op(1).name == "Relu_1");
  CHECK(g->op(2).name == "Relu_2");
}

TEST_CASE("import: weights, state and constants", "[import]") {
  TempDir dir;
  Model m;
  m.input("x", {"N", "3", "8", "8"});
  m.weight("W", {4, 3, 3, 3});
  m.weight("B", {4}, {0, 0, 0, 0}); // kept data
  m.node("Conv", {"x", "W", "B"}, {"c"}, "conv");
  m.weight("scale", {4});
  m.weight("bias", {4});
  m.weight("mean", {4});
  m.weight("var", {4});
  auto &bn = m.node("BatchNormalization", {"c", "scale", "bias", "mean", "var"},
                    {"bn", "mean_out", "var_out"}, "bn");
  setInt(bn, "training_mode", 1);
  m.weight("half", {}, {0.5f});
  m.node("Mul", {"bn", "half"}, {"scaled"}, "mul");
  m.weight("table", {10, 6});
  m.ints("idx", {2}, {1, 3});
  setInt(m.node("Gather", {"table", "idx"}, {"rows"}, "gather"), "axis", 0);
  m.output("scaled");
  m.output("rows");
  ImportOptions opts;
  opts.appendLoss = false;
  auto g = importOk(m.save(dir), opts);
  auto kindOf = [&](const char *name) {
    ValueId id = g->findValue(name);
    REQUIRE(id != kNoValue);
    return g->value(id).kind;
  };
  CHECK(kindOf("W") == ValueKind::Weight);
  CHECK(kindOf("B") == ValueKind::Weight);
  CHECK(kindOf("scale") == ValueKind::Weight);
  CHECK(kindOf("bias") == ValueKind::Weight);
  CHECK(kindOf("mean") == ValueKind::State);
  CHECK(kindOf("var") == ValueKind::State);
  CHECK(kindOf("half") == ValueKind::Constant);
  CHECK(kindOf("table") == ValueKind::Weight);
  CHECK(kindOf("idx") == ValueKind::Constant);
  CHECK(g->value(g->findValue("W")).hasData == false);
  CHECK(g->value(g->findValue("B")).hasData == true);
  const Value &idx = g->value(g->findValue("idx"));
  CHECK(idx.hasData);
  CHECK(idx.data == std::vector<double>{1, 3});
  CHECK(g->value(g->findValue("half")).data == std::vector<double>{0.5});
  CHECK(g->parameterCount() == 108 + 4 + 4 + 4 + 60);
  const Op &bnOp = opNamed(*g, "bn");
  CHECK(bnOp.outputs.size() == 3);
  CHECK(g->value(bnOp.outputs[1]).shape.dims == std::vector<int64_t>{4});
}

TEST_CASE("import: a weight is a weight wherever it flows", "[import]") {
  // ViT's class token: Expand to the batch, Concat with the patches; a
  // position table added; a weight transposed before its MatMul; a scalar
  // expanded (a constant, as before). Each weight counts once.
  TempDir dir;
  Model m;
  m.input("x", {"N", "4", "8"});
  m.weight("cls", {1, 1, 8});
  m.node("Shape", {"x"}, {"x_shape"}, "shape");
  m.ints("zero", {1}, {0});
  setInt(m.node("Gather", {"x_shape", "zero"}, {"n"}, "batch"), "axis", 0);
  m.ints("rest", {2}, {1, 8});
  setInt(m.node("Concat", {"n", "rest"}, {"cls_shape"}, "cls_shape"), "axis",
         0);
  m.node("Expand", {"cls", "cls_shape"}, {"cls_n"}, "expand");
  setInt(m.node("Concat", {"cls_n", "x"}, {"tokens"}, "concat"), "axis", 1);
  m.weight("pos", {5, 8});
  m.node("Add", {"tokens", "pos"}, {"h"}, "add");
  m.weight("w", {6, 8});
  setInts(m.node("Transpose", {"w"}, {"wt"}, "transpose"), "perm", {1, 0});
  m.node("MatMul", {"h", "wt"}, {"y0"}, "matmul");
  m.weight("two", {}, {2.0f});
  m.ints("one_shape", {1}, {1});
  m.node("Expand", {"two", "one_shape"}, {"two_1"}, "expand_scalar");
  m.node("Mul", {"y0", "two_1"}, {"y"}, "mul");
  m.output("y");
  auto g = importOk(m.save(dir));
  auto kindOf = [&](const char *name) {
    return g->value(g->findValue(name)).kind;
  };
  CHECK(kindOf("cls") == ValueKind::Weight);
  CHECK(kindOf("pos") == ValueKind::Weight);
  CHECK(kindOf("w") == ValueKind::Weight);
  CHECK(kindOf("two") == ValueKind::Constant);
  CHECK(g->parameterCount() == 8 + 40 + 48);
  // The transposed weight's dims index parameters, and so does the MatMul's
  // n loop that reads it.
  const Op &mm = opNamed(*g, "matmul");
  bool nIsParameter = false;
  for (const LoopDim &l : mm.sem.loops)
    if (l.name == "n")
      nIsParameter = l.cls == DimClass::Parameter;
  CHECK(nIsParameter);
}

TEST_CASE("import: rows that merge sequence and batch are unmerged",
          "[import]") {
  // PyTorch's attention output projection: [T, N, E] -> [T*N, E] -> Gemm
  // -> [T, N, E']. Sequence first, the merged rows would lose the sample
  // dim; soapc computes MatMul(x, W^T) + b on [T, N, E] instead.
  TempDir dir;
  Model m;
  m.input("x", {"N", "3", "8"});
  setInts(m.node("Transpose", {"x"}, {"t"}, "to_seq_first"), "perm", {1, 0, 2});
  m.ints("rows", {2}, {-1, 8});
  m.node("Reshape", {"t", "rows"}, {"r"}, "merge");
  m.weight("w", {5, 8});
  m.weight("b", {5});
  setInt(m.node("Gemm", {"r", "w", "b"}, {"y"}, "proj"), "transB", 1);
  m.ints("unrows", {3}, {3, -1, 5});
  m.node("Reshape", {"y", "unrows"}, {"z"}, "split");
  setInts(m.node("Transpose", {"z"}, {"out"}, "to_batch_first"), "perm",
          {1, 0, 2});
  m.output("out");
  ImportOptions opts;
  opts.batch = 4;
  auto g = importOk(m.save(dir), opts);
  CHECK(g->parameterCount() == 45);
  const Op &proj = opNamed(*g, "proj");
  CHECK(proj.kind == "MatMul");
  CHECK(g->value(proj.outputs[0]).shape.dims == std::vector<int64_t>{3, 4, 5});
  CHECK(opNamed(*g, "proj/soapc.transB").kind == "Transpose");
  CHECK(opNamed(*g, "proj/soapc.bias").kind == "Add");
  // Every op from the input to the loss keeps a splittable sample loop.
  for (const Op &o : g->ops()) {
    if (o.kind == "Transpose" && o.name == "proj/soapc.transB")
      continue;
    bool sample = false;
    for (const LoopDim &l : o.sem.loops)
      sample |= l.cls == DimClass::Sample && l.splittable && l.size == 4;
    INFO(o.name);
    CHECK(sample);
  }
  // Sample first (as GPT's LM head) the Gemm stays: nothing is lost.
  Model k;
  k.input("x", {"N", "3", "8"});
  k.ints("rows", {2}, {-1, 8});
  k.node("Reshape", {"x", "rows"}, {"r"}, "merge");
  k.weight("w", {5, 8});
  setInt(k.node("Gemm", {"r", "w"}, {"y"}, "proj"), "transB", 1);
  k.ints("unrows", {3}, {-1, 3, 5});
  k.node("Reshape", {"y", "unrows"}, {"out"}, "split");
  k.output("out");
  auto h = importOk(k.save(dir, "k.onnx"), opts);
  CHECK(opNamed(*h, "proj").kind == "Gemm");
}

TEST_CASE("import: a Cast to its input's own type is no op", "[import]") {
  // transformers' RMSNorm and softmax cast float32 to float32.
  TempDir dir;
  Model m;
  m.input("x", {"N", "8"});
  setInt(m.node("Cast", {"x"}, {"c1"}, "same"), "to", TP::FLOAT);
  setInt(m.node("Cast", {"c1"}, {"c2"}, "same_again"), "to", TP::FLOAT);
  m.weight("w", {8, 4});
  m.node("MatMul", {"c2", "w"}, {"h"}, "mm");
  setInt(m.node("Cast", {"h"}, {"d"}, "wider"), "to", TP::DOUBLE);
  setInt(m.node("Cast", {"d"}, {"y"}, "back"), "to", TP::FLOAT);
  m.output("y");
  ImportOptions opts;
  opts.batch = 2;
  opts.appendLoss = false;
  auto g = importOk(m.save(dir), opts);
  std::vector<std::string> kinds;
  for (const Op &o : g->ops())
    kinds.push_back(o.kind);
  CHECK(kinds == std::vector<std::string>{"MatMul", "Cast", "Cast"});
  const Op &mm = opNamed(*g, "mm");
  CHECK(g->value(mm.inputs[0]).name == "x");
}

TEST_CASE("import: operand conventions", "[import]") {
  TempDir dir;
  Model m;
  m.input("x", {"N", "10", "6"});
  m.constInts("starts", {1});
  m.constInts("ends", {INT64_MAX});
  m.constInts("axes", {-1});
  m.constInts("steps", {2});
  m.node("Slice", {"x", "starts", "ends", "axes", "steps"}, {"s"}, "slice");
  m.constInts("uaxes", {-1});
  m.node("Unsqueeze", {"s", "uaxes"}, {"u"}, "unsqueeze"); // [N, 10, 3, 1]
  m.constInts("saxes", {3});
  m.node("Squeeze", {"u", "saxes"}, {"q"}, "squeeze");
  auto &ratio = m.node("Constant", {}, {"ratio"}, "ratio_node");
  auto *a = ratio.add_attribute();
  a->set_name("value_float");
  a->set_type(onnx::AttributeProto::FLOAT);
  a->set_f(0.25f);
  auto &tm = m.node("Constant", {}, {"tmode"}, "tmode_node");
  auto *ta = tm.add_attribute();
  ta->set_name("value");
  ta->set_type(onnx::AttributeProto::TENSOR);
  ta->mutable_t()->set_data_type(TP::BOOL);
  ta->mutable_t()->add_int32_data(1);
  m.node("Dropout", {"q", "ratio", "tmode"}, {"d", "mask"}, "dropout");
  setInt(m.node("Softmax", {"d"}, {"sm"}, "softmax"), "axis", -1);
  m.node("Transpose", {"sm"}, {"t"}, "transpose");
  m.output("t");
  ImportOptions opts;
  opts.batch = 2;
  opts.appendLoss = false;
  auto g = importOk(m.save(dir), opts);
  const Op &slice = opNamed(*g, "slice");
  CHECK(slice.inputs.size() == 1);
  CHECK(slice.getInts("starts") == std::vector<int64_t>{0, 0, 1});
  CHECK(slice.getInts("steps") == std::vector<int64_t>{1, 1, 2});
  CHECK(g->value(slice.outputs[0]).shape.dims ==
        std::vector<int64_t>{2, 10, 3});
  CHECK(opNamed(*g, "unsqueeze").getInts("axes") == std::vector<int64_t>{3});
  CHECK(opNamed(*g, "unsqueeze").inputs.size() == 1);
  CHECK(opNamed(*g, "squeeze").getInts("axes") == std::vector<int64_t>{3});
  const Op &drop = opNamed(*g, "dropout");
  CHECK(drop.inputs.size() == 1);
  CHECK(drop.getFloat("ratio", 0) == Approx(0.25));
  CHECK(drop.getInt("training_mode", 0) == 1);
  CHECK(opNamed(*g, "softmax").getInt("axis", -1) == 2);
  CHECK(opNamed(*g, "transpose").getInts("perm") ==
        std::vector<int64_t>{2, 1, 0});
}

TEST_CASE("import: Identity of an initializer is an alias", "[import]") {
  TempDir dir;
  Model m;
  m.input("x", {"N", "8"});
  m.weight("w", {8, 4});
  m.node("Identity", {"w"}, {"w_tied"}, "tie");
  m.node("MatMul", {"x", "w_tied"}, {"y"}, "mm");
  m.output("y");
  auto g = importOk(m.save(dir));
  CHECK(g->findOp("tie") < 0);
  const Op &mm = opNamed(*g, "mm");
  CHECK(g->value(mm.inputs[1]).name == "w");
  CHECK(g->value(mm.inputs[1]).kind == ValueKind::Weight);
}

TEST_CASE("import: a large folded mask is a constant without data",
          "[import]") {
  // ones(2048, 1024).tril() as in a causal mask: above the folding cap.
  TempDir dir;
  Model m;
  m.input("x", {"N", "2048", "1024"});
  m.constInts("mshape", {2048, 1024});
  auto &ones = m.node("ConstantOfShape", {"mshape"}, {"ones"}, "ones");
  auto *a = ones.add_attribute();
  a->set_name("value");
  a->set_type(onnx::AttributeProto::TENSOR);
  a->mutable_t()->set_data_type(TP::BOOL);
  a->mutable_t()->add_dims(1);
  a->mutable_t()->add_int32_data(1);
  setInt(m.node("Trilu", {"ones"}, {"mask"}, "tril"), "upper", 0);
  m.weight("neg", {}, {-1e9f});
  m.node("Where", {"mask", "x", "neg"}, {"y"}, "where");
  m.output("y");
  ImportOptions opts;
  opts.batch = 1;
  auto g = importOk(m.save(dir), opts);
  REQUIRE(g->findOp("tril") < 0);
  const Value &mask = g->value(opNamed(*g, "where").inputs[0]);
  CHECK(mask.kind == ValueKind::Constant);
  CHECK(mask.dtype == DType::Bool);
  CHECK(mask.shape.dims == std::vector<int64_t>{2048, 1024});
  CHECK(!mask.hasData);
}

TEST_CASE("import: keepConstantData keeps a mask past 4,096 elements",
          "[import]") {
  // gpt2's causal mask as soap-run imports it: 128 x 128 = 16,384 values.
  TempDir dir;
  Model m;
  m.input("x", {"N", "128", "128"});
  m.constInts("mshape", {128, 128});
  auto &ones = m.node("ConstantOfShape", {"mshape"}, {"ones"}, "ones");
  auto *a = ones.add_attribute();
  a->set_name("value");
  a->set_type(onnx::AttributeProto::TENSOR);
  a->mutable_t()->set_data_type(TP::BOOL);
  a->mutable_t()->add_dims(1);
  a->mutable_t()->add_int32_data(1);
  setInt(m.node("Trilu", {"ones"}, {"mask"}, "tril"), "upper", 0);
  m.weight("neg", {}, {-1e9f});
  m.node("Where", {"mask", "x", "neg"}, {"y"}, "where");
  m.output("y");
  ImportOptions opts;
  opts.batch = 1;
  std::string path = m.save(dir);
  auto searching = importOk(path, opts);
  const Value &sized = searching->value(opNamed(*searching, "where").inputs[0]);
  CHECK(sized.hasData);
  CHECK(sized.data.empty()); // dims only: the searchers need no more
  opts.keepConstantData = true;
  auto running = importOk(path, opts);
  const Value &kept = running->value(opNamed(*running, "where").inputs[0]);
  REQUIRE(kept.data.size() == 128u * 128u);
  CHECK(kept.data[0] == 1);
  CHECK(kept.data[1] == 0); // row 0 sees only token 0
  CHECK(kept.data[128 + 1] == 1);
}

TEST_CASE("import: Pad merges into AveragePool", "[import]") {
  TempDir dir;
  Model m;
  m.input("x", {"N", "2", "5", "5"});
  m.ints("pads", {8}, {0, 0, 1, 1, 0, 0, 1, 1});
  m.node("Pad", {"x", "pads"}, {"p"}, "pad");
  auto &pool = m.node("AveragePool", {"p"}, {"y"}, "pool");
  setInts(pool, "kernel_shape", {3, 3});
  setInts(pool, "pads", {0, 0, 0, 0});
  m.output("y");
  ImportOptions opts;
  opts.appendLoss = false;
  auto g = importOk(m.save(dir), opts);
  REQUIRE(g->numOps() == 1);
  const Op &p = g->op(0);
  CHECK(p.kind == "AveragePool");
  CHECK(p.getInts("pads") == std::vector<int64_t>{1, 1, 1, 1});
  CHECK(p.getInt("count_include_pad", 0) == 1);
  CHECK(g->value(p.outputs[0]).shape.dims == std::vector<int64_t>{64, 2, 5, 5});
}

TEST_CASE("import: the appended loss", "[import]") {
  TempDir dir;
  SECTION("rank 2 logits") {
    auto g = importOk(mlp().save(dir));
    const Op &loss = opNamed(*g, "soapc.loss");
    CHECK(loss.kind == "SoftmaxCrossEntropyLoss");
    CHECK(loss.getInt("class_axis", -1) == 1);
    CHECK(loss.getString("reduction", "") == "mean");
    const Value &labels = g->value(loss.inputs[1]);
    CHECK(labels.name == "labels");
    CHECK(labels.kind == ValueKind::Input);
    CHECK(labels.dtype == DType::I64);
    CHECK(labels.shape.dims == std::vector<int64_t>{64});
    CHECK(labels.dimClasses == std::vector<DimClass>{DimClass::Sample});
    REQUIRE(g->outputs.size() == 1);
    const Value &out = g->value(g->outputs[0]);
    CHECK(out.name == "loss");
    CHECK(out.dtype == DType::F32);
    CHECK(out.shape.rank() == 0);
    CHECK(g->inputs.back() == loss.inputs[1]);
  }
  SECTION("rank 3 logits: the class axis is the last") {
    Model m;
    m.input("x", {"N", "5", "8"});
    m.weight("w", {8, 11});
    m.node("MatMul", {"x", "w"}, {"logits"}, "mm");
    m.output("logits");
    auto g = importOk(m.save(dir));
    const Op &loss = opNamed(*g, "soapc.loss");
    CHECK(loss.getInt("class_axis", -1) == 2);
    CHECK(g->value(loss.inputs[1]).shape.dims == std::vector<int64_t>{64, 5});
  }
  SECTION("not appended when asked not to") {
    ImportOptions opts;
    opts.appendLoss = false;
    auto g = importOk(mlp().save(dir), opts);
    CHECK(g->findOp("soapc.loss") < 0);
    CHECK(g->value(g->outputs[0]).name == "y");
  }
}

TEST_CASE("import: errors name the file and the place", "[import]") {
  TempDir dir;
  SECTION("missing file") {
    CHECK_THAT(importError(dir.file("nope.onnx")),
               Catch::Contains("cannot read the model"));
  }
  SECTION("a directory") {
    CHECK_THAT(importError(std::string(dir.path.str())),
               Catch::Contains("is a directory"));
  }
  SECTION("empty and garbage files") {
    std::string empty = dir.file("empty.onnx"), junk = dir.file("junk.onnx");
    std::ofstream(empty).flush();
    std::ofstream(junk) << "\xff\xff\xff\xff garbage";
    CHECK_THAT(importError(empty), Catch::Contains("empty file"));
    CHECK_THAT(importError(junk), Catch::Contains("not an ONNX model"));
  }
  SECTION("cycle") {
    Model m;
    m.input("x", {"N", "8"});
    m.node("Add", {"x", "b"}, {"a"}, "add");
    m.node("Relu", {"a"}, {"b"}, "relu");
    m.node("Relu", {"x"}, {"y"}, "out");
    m.output("y");
    std::string msg = importError(m.save(dir));
    CHECK_THAT(msg, Catch::Contains("cycle"));
    CHECK((msg.find("'add'") != std::string::npos ||
           msg.find("'relu'") != std::string::npos));
  }
  SECTION("dangling input") {
    Model m;
    m.input("x", {"N", "8"});
    m.node("Add", {"x", "ghost"}, {"y"}, "add");
    m.output("y");
    CHECK_THAT(importError(m.save(dir)),
               Catch::Contains("node 'add': input 'ghost' is not produced"));
  }
  SECTION("tensor produced twice") {
    Model m;
    m.input("x", {"N", "8"});
    m.node("Relu", {"x"}, {"y"}, "a");
    m.node("Relu", {"x"}, {"y"}, "b");
    m.output("y");
    CHECK_THAT(importError(m.save(dir)),
               Catch::Contains("node 'b': output 'y' is already produced"));
  }
  SECTION("unsupported operators") {
    Model m;
    m.input("x", {"N", "8"});
    m.node("Foo", {"x"}, {"y"}, "foo").set_domain("com.example");
    m.output("y");
    CHECK_THAT(importError(m.save(dir)),
               Catch::Contains("node 'foo': unsupported operator 'Foo' "
                               "(domain 'com.example')"));
    Model m2;
    m2.input("x", {"N", "8"});
    m2.node("Hardmax", {"x"}, {"y"}, "hm");
    m2.output("y");
    CHECK_THAT(importError(m2.save(dir, "m2.onnx")),
               Catch::Contains("unsupported operator 'Hardmax' (domain '')"));
  }
  SECTION("data-dependent operators say why; the others are listed") {
    Model m;
    m.input("x", {"N", "8"});
    m.constInts("k", {2});
    m.node("TopK", {"x", "k"}, {"v", "i"}, "router");
    m.node("NonZero", {"i"}, {"nz"}, "nz");
    m.node("Hardmax", {"v"}, {"h"}, "hm");
    m.node("NonZero", {"h"}, {"nz2"}, "nz2");
    m.output("nz", TP::INT64);
    m.output("nz2", TP::INT64);
    CHECK_THAT(importError(m.save(dir)),
               Catch::EndsWith("node 'router': unsupported operator 'TopK' "
                               "(domain ''): it selects elements by their "
                               "values (as a mixture of experts' top-k router "
                               "does), and soapc's ops read regions that "
                               "shapes alone decide; the model also needs "
                               "NonZero, Hardmax"));
  }
  SECTION("a Shape that cannot fold") {
    Model m;
    m.input("x", {"N", "8"});
    m.input("shape", {"2"}, TP::INT64);
    m.node("Reshape", {"x", "shape"}, {"r"}, "reshape");
    m.node("Shape", {"r"}, {"y"}, "shape_of");
    m.output("y", TP::INT64);
    CHECK_THAT(importError(m.save(dir)),
               Catch::Contains("node 'shape_of': unsupported operator "
                               "'Shape'"));
  }
  SECTION("shape unknown after inference") {
    Model m;
    m.input("x", {"N", "8"});
    m.input("shape", {"2"}, TP::INT64);
    m.node("Reshape", {"x", "shape"}, {"y"}, "reshape");
    m.output("y");
    CHECK_THAT(importError(m.save(dir)),
               Catch::Contains("tensor 'y' (output of node 'reshape'): shape "
                               "unknown after shape inference"));
  }
  SECTION("dims that are not positive, or overflow") {
    Model m;
    m.input("x", {"N", "0"});
    m.node("Relu", {"x"}, {"y"}, "relu");
    m.output("y");
    CHECK_THAT(importError(m.save(dir)),
               Catch::Contains("tensor 'x' (graph input): dim 1 is 0"));
    m.g->mutable_input(0)
        ->mutable_type()
        ->mutable_tensor_type()
        ->mutable_shape()
        ->mutable_dim(1)
        ->set_dim_value(-3);
    CHECK_THAT(importError(m.save(dir)), Catch::Contains("dim 1 is -3"));
    auto *shape = m.g->mutable_input(0)
                      ->mutable_type()
                      ->mutable_tensor_type()
                      ->mutable_shape();
    shape->mutable_dim(1)->set_dim_value(int64_t(1) << 32);
    shape->add_dim()->set_dim_value(int64_t(1) << 32);
    CHECK_THAT(importError(m.save(dir)), Catch::Contains("overflows int64"));
  }
  SECTION("a weight with a zero dim") {
    Model m = mlp();
    m.g->mutable_initializer(0)->set_dims(1, 0);
    CHECK_THAT(importError(m.save(dir)),
               Catch::Contains("tensor 'w' (initializer): dim 1 is 0"));
  }
  SECTION("strict shape inference") {
    Model m;
    m.input("x", {"N", "8"});
    m.input("z", {"N", "5"});
    m.node("Add", {"x", "z"}, {"y"}, "add");
    m.output("y");
    CHECK_THAT(importError(m.save(dir)),
               Catch::Contains("node 'add': shape inference failed"));
  }
}

TEST_CASE("import: external data", "[import]") {
  TempDir dir;
  auto external = [&](const std::string &location) {
    Model m = mlp();
    TP *w = m.g->mutable_initializer(0);
    w->set_data_location(TP::EXTERNAL);
    auto *kv = w->add_external_data();
    kv->set_key("location");
    kv->set_value(location);
    return m;
  };
  SECTION("a missing file is fine: only dims are needed") {
    auto g = importOk(external("w.bin").save(dir));
    CHECK(g->value(g->findValue("w")).hasData);
    CHECK(g->parameterCount() == 32);
  }
  SECTION("an existing file inside the directory is fine") {
    std::ofstream(dir.file("w.bin")) << "0123";
    importOk(external("w.bin").save(dir));
  }
  SECTION("paths that leave the directory are rejected") {
    CHECK_THAT(importError(external("../w.bin").save(dir)),
               Catch::Contains("tensor 'w' (initializer): external data "
                               "location '../w.bin'"));
    CHECK_THAT(importError(external("/etc/passwd").save(dir)),
               Catch::Contains("must be a relative path"));
    CHECK_THAT(importError(external("a/../../w.bin").save(dir)),
               Catch::Contains("must be a relative path"));
  }
  SECTION("requireExternalData: the file must hold offset + length bytes") {
    ImportOptions need;
    need.requireExternalData = true;
    Model m = external("w.bin");
    std::string path = m.save(dir);
    CHECK(importError(path, need) ==
          path + ": initializer 'w' stores its data in 'w.bin', which does "
                 "not exist");
    // No length: the dims' 8 x 4 floats, 128 bytes.
    std::ofstream(dir.file("w.bin")) << std::string(127, '\0');
    CHECK(importError(path, need) ==
          path + ": initializer 'w' stores its data in the first 128 bytes of "
                 "'w.bin', which has 127");
    std::ofstream(dir.file("w.bin")) << std::string(128, '\0');
    importOk(path, need);
    // offset 64 + length 128 runs past a 128-byte file; a bad count is named.
    TP *w = m.g->mutable_initializer(0);
    for (auto [key, value] :
         {std::pair<const char *, const char *>{"offset", "64"},
          {"length", "128"}}) {
      auto *kv = w->add_external_data();
      kv->set_key(key);
      kv->set_value(value);
    }
    path = m.save(dir);
    CHECK_THAT(importError(path, need),
               Catch::Contains("first 192 bytes of 'w.bin', which has 128"));
    w->mutable_external_data(1)->set_value("-1");
    path = m.save(dir);
    CHECK_THAT(importError(path, need),
               Catch::Contains("tensor 'w' (initializer): external data "
                               "offset '-1' is not a byte count"));
    // Without the option a short file is fine: only dims are needed.
    importOk(path);
  }
  SECTION("a symlink out of the directory is rejected") {
    TempDir other;
    std::ofstream(other.file("w.bin")) << "0123";
    REQUIRE(
        !llvm::sys::fs::create_link(other.file("w.bin"), dir.file("link.bin")));
    CHECK_THAT(importError(external("link.bin").save(dir)),
               Catch::Contains("outside the model's directory"));
  }
}
