// The folding interpreter on hand-computed cases: indexing ops, broadcasting
// arithmetic, integer semantics (truncating Div, Python-style Mod), Slice
// clamping, the size cap, and TensorProto decoding.
//
// ConstTensor.h is private to lib/Import; the interpreter has no public API,
// so this test reaches into the library's directory.
#include "../../../lib/Import/ConstTensor.h"

#include "soap/Support/Error.h"
#include <catch2/catch.hpp>
#include <climits>

using namespace soap;
using namespace soap::import;

namespace {

using TP = onnx::TensorProto;

ConstTensor ints(std::vector<int64_t> dims, std::vector<int64_t> v,
                 int32_t type = TP::INT64) {
  ConstTensor c;
  c.elemType = type;
  c.dims = std::move(dims);
  c.hasData = true;
  c.ints = std::move(v);
  return c;
}

ConstTensor floats(std::vector<int64_t> dims, std::vector<double> v) {
  ConstTensor c;
  c.elemType = TP::FLOAT;
  c.dims = std::move(dims);
  c.hasData = true;
  c.floats = std::move(v);
  return c;
}

onnx::NodeProto node(const std::string &op) {
  onnx::NodeProto n;
  n.set_op_type(op);
  n.add_output("out");
  return n;
}

void attr(onnx::NodeProto &n, const std::string &name, int64_t v) {
  auto *a = n.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(v);
}

/// Folds and requires success.
ConstTensor fold(const onnx::NodeProto &n, std::vector<const ConstTensor *> ins,
                 int64_t cap = kMaxFoldElements) {
  std::vector<ConstTensor> outs;
  auto st = foldNode(n, ins, outs, cap);
  if (!st)
    FAIL(errorMessage(st.takeError()));
  REQUIRE(*st == FoldStatus::Folded);
  REQUIRE(outs.size() == 1);
  return outs[0];
}

} // namespace

TEST_CASE("fold: Gather with negative indices", "[import][fold]") {
  auto data = ints({2, 3}, {0, 1, 2, 3, 4, 5});
  auto idx = ints({2}, {-1, 0});
  auto n = node("Gather");
  attr(n, "axis", 1);
  auto out = fold(n, {&data, &idx});
  CHECK(out.dims == std::vector<int64_t>{2, 2});
  CHECK(out.ints == std::vector<int64_t>{2, 0, 5, 3});
  auto bad = ints({}, {3});
  std::vector<ConstTensor> outs;
  auto st = foldNode(n, {&data, &bad}, outs, kMaxFoldElements);
  REQUIRE(!st);
  CHECK_THAT(errorMessage(st.takeError()), Catch::Contains("out of range"));
}

TEST_CASE("fold: Slice clamps and steps backwards", "[import][fold]") {
  auto data = ints({10}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  auto starts = ints({1}, {-1}), ends = ints({1}, {INT64_MIN});
  auto axes = ints({1}, {0}), steps = ints({1}, {-2});
  auto out = fold(node("Slice"), {&data, &starts, &ends, &axes, &steps});
  CHECK(out.ints == std::vector<int64_t>{9, 7, 5, 3, 1});
  auto s2 = ints({1}, {2}), e2 = ints({1}, {INT64_MAX});
  out = fold(node("Slice"), {&data, &s2, &e2, nullptr, nullptr});
  CHECK(out.dims == std::vector<int64_t>{8});
  auto spec = normaliseSlice({4, 10}, {-3}, {100}, {1}, {3});
  REQUIRE(static_cast<bool>(spec));
  CHECK(spec->starts == std::vector<int64_t>{0, 7});
  CHECK(spec->steps == std::vector<int64_t>{1, 3});
  CHECK(spec->counts == std::vector<int64_t>{4, 1});
}

TEST_CASE("fold: Concat, Unsqueeze, Squeeze, Reshape", "[import][fold]") {
  auto a = ints({2, 1}, {1, 2}), b = ints({2, 2}, {3, 4, 5, 6});
  auto cat = node("Concat");
  attr(cat, "axis", -1);
  auto out = fold(cat, {&a, &b});
  CHECK(out.dims == std::vector<int64_t>{2, 3});
  CHECK(out.ints == std::vector<int64_t>{1, 3, 4, 2, 5, 6});

  auto v = ints({3}, {7, 8, 9}), axes = ints({2}, {0, -1});
  out = fold(node("Unsqueeze"), {&v, &axes});
  CHECK(out.dims == std::vector<int64_t>{1, 3, 1});
  out = fold(node("Squeeze"), {&out});
  CHECK(out.dims == std::vector<int64_t>{3});

  auto m = ints({2, 3, 4}, std::vector<int64_t>(24, 1));
  auto shape = ints({2}, {0, -1});
  out = fold(node("Reshape"), {&m, &shape});
  CHECK(out.dims == std::vector<int64_t>{2, 12});
}

TEST_CASE("fold: broadcasting arithmetic and integer semantics",
          "[import][fold]") {
  auto a = ints({2, 1}, {-7, 7}), b = ints({2}, {2, -2});
  auto div = fold(node("Div"), {&a, &b});
  CHECK(div.dims == std::vector<int64_t>{2, 2});
  CHECK(div.ints == std::vector<int64_t>{-3, 3, 3, -3});
  auto mod = fold(node("Mod"), {&a, &b});
  CHECK(mod.ints == std::vector<int64_t>{1, -1, 1, -1});
  auto fm = node("Mod");
  attr(fm, "fmod", 1);
  CHECK(fold(fm, {&a, &b}).ints == std::vector<int64_t>{-1, -1, 1, 1});
  auto zero = ints({}, {0});
  std::vector<ConstTensor> outs;
  auto st = foldNode(node("Div"), {&a, &zero}, outs, kMaxFoldElements);
  REQUIRE(!st);
  CHECK_THAT(errorMessage(st.takeError()), Catch::Contains("by zero"));

  auto eq = fold(node("Equal"), {&a, &b});
  CHECK(eq.elemType == TP::BOOL);
  CHECK(eq.ints == std::vector<int64_t>{0, 0, 0, 0});
  auto f = floats({2}, {1.5, -2.5});
  auto cast = node("Cast");
  attr(cast, "to", TP::INT64);
  CHECK(fold(cast, {&f}).ints == std::vector<int64_t>{1, -2});
  auto big = ints({2}, {200, -129});
  auto toI8 = node("Cast");
  attr(toI8, "to", TP::INT8);
  CHECK(fold(toI8, {&big}).ints == std::vector<int64_t>{-56, 127});
  auto sq = fold(node("Sqrt"), {&(f = floats({1}, {16.0}))});
  CHECK(sq.floats == std::vector<double>{4.0});
  auto i32 = ints({1}, {INT32_MAX}, TP::INT32), one = ints({1}, {1}, TP::INT32);
  CHECK(fold(node("Add"), {&i32, &one}).ints ==
        std::vector<int64_t>{INT32_MIN});
}

TEST_CASE("fold: Where, Expand, Range, Trilu, Transpose", "[import][fold]") {
  auto cond = ints({2}, {1, 0}, TP::BOOL);
  auto x = ints({2, 1}, {10, 20}), y = ints({}, {-1});
  auto w = fold(node("Where"), {&cond, &x, &y});
  CHECK(w.dims == std::vector<int64_t>{2, 2});
  CHECK(w.ints == std::vector<int64_t>{10, -1, 20, -1});

  auto shape = ints({3}, {2, 1, 3});
  auto e = fold(node("Expand"), {&x, &shape});
  CHECK(e.dims == std::vector<int64_t>{2, 2, 3});

  auto s = ints({}, {5}), l = ints({}, {-1}), d = ints({}, {-2});
  CHECK(fold(node("Range"), {&s, &l, &d}).ints ==
        std::vector<int64_t>{5, 3, 1});

  auto m = ints({3, 3}, std::vector<int64_t>(9, 1));
  auto tril = node("Trilu");
  attr(tril, "upper", 0);
  auto k = ints({}, {-1});
  CHECK(fold(tril, {&m, &k}).ints ==
        std::vector<int64_t>{0, 0, 0, 1, 0, 0, 1, 1, 0});

  auto t = ints({2, 3}, {0, 1, 2, 3, 4, 5});
  auto tr = fold(node("Transpose"), {&t});
  CHECK(tr.dims == std::vector<int64_t>{3, 2});
  CHECK(tr.ints == std::vector<int64_t>{0, 3, 1, 4, 2, 5});
}

TEST_CASE("fold: Shape, ConstantOfShape and the size cap", "[import][fold]") {
  ConstTensor shaped;
  shaped.dims = {4, 5, 6};
  auto sh = node("Shape");
  attr(sh, "start", 1);
  CHECK(fold(sh, {&shaped}).ints == std::vector<int64_t>{5, 6});

  auto cos = node("ConstantOfShape");
  auto *a = cos.add_attribute();
  a->set_name("value");
  a->set_type(onnx::AttributeProto::TENSOR);
  a->mutable_t()->set_data_type(TP::INT64);
  a->mutable_t()->add_dims(1);
  a->mutable_t()->add_int64_data(7);
  auto dims = ints({2}, {2, 3});
  auto out = fold(cos, {&dims});
  CHECK(out.ints == std::vector<int64_t>(6, 7));
  std::vector<ConstTensor> outs;
  auto st = foldNode(cos, {&dims}, outs, 5);
  REQUIRE(static_cast<bool>(st));
  CHECK(*st == FoldStatus::TooLarge);
  auto huge = ints({3}, {INT64_MAX, 4, 4});
  st = foldNode(cos, {&huge}, outs, kMaxFoldElements);
  REQUIRE(static_cast<bool>(st));
  CHECK(*st == FoldStatus::TooLarge);
}

TEST_CASE("fold: TensorProto decoding", "[import][fold]") {
  TP t;
  t.set_data_type(TP::INT32);
  t.add_dims(2);
  int32_t raw[2] = {-5, 9};
  t.set_raw_data(std::string(reinterpret_cast<char *>(raw), sizeof raw));
  auto c = constFromProto(t, 100);
  REQUIRE(static_cast<bool>(c));
  CHECK(c->ints == std::vector<int64_t>{-5, 9});

  TP h;
  h.set_data_type(TP::FLOAT16);
  h.add_dims(2);
  h.add_int32_data(0x3c00); // 1.0
  h.add_int32_data(0xc000); // -2.0
  auto hc = constFromProto(h, 100);
  REQUIRE(static_cast<bool>(hc));
  CHECK(hc->floats == std::vector<double>{1.0, -2.0});
  TP back;
  constToProto(*hc, "h", back);
  CHECK(back.int32_data(0) == 0x3c00);
  CHECK(back.int32_data(1) == 0xc000);

  TP bad;
  bad.set_data_type(TP::INT64);
  bad.add_dims(3);
  bad.add_int64_data(1);
  auto bc = constFromProto(bad, 100);
  REQUIRE(!bc);
  CHECK_THAT(errorMessage(bc.takeError()), Catch::Contains("holds 1 values"));

  TP stripped;
  stripped.set_data_type(TP::FLOAT);
  stripped.add_dims(64);
  CHECK(!protoHasData(stripped));
  auto sc = constFromProto(stripped, 100);
  REQUIRE(static_cast<bool>(sc));
  CHECK(!sc->hasData);
}

TEST_CASE("fold: ScatterND writes slices, adds with reduction",
          "[import][fold]") {
  // Swin's mask: rows of a zero image labelled by region.
  auto data = floats({3, 2}, {0, 0, 0, 0, 0, 0});
  auto idx = ints({2, 1}, {2, -3});
  auto upd = floats({2, 2}, {1, 2, 3, 4});
  auto n = node("ScatterND");
  auto out = fold(n, {&data, &idx, &upd});
  CHECK(out.dims == std::vector<int64_t>{3, 2});
  CHECK(out.floats == std::vector<double>{3, 4, 0, 0, 1, 2});
  // Element indices (k = rank) and reduction "add" on integers.
  auto base = ints({2, 2}, {1, 1, 1, 1});
  auto at = ints({2, 2}, {0, 1, 0, 1});
  auto add = ints({2}, {5, 6});
  auto *r = n.add_attribute();
  r->set_name("reduction");
  r->set_type(onnx::AttributeProto::STRING);
  r->set_s("add");
  out = fold(n, {&base, &at, &add});
  CHECK(out.ints == std::vector<int64_t>{1, 12, 1, 1});
  std::vector<ConstTensor> outs;
  auto far = ints({1, 1}, {3});
  auto row = floats({1, 2}, {1, 2});
  auto st =
      foldNode(node("ScatterND"), {&data, &far, &row}, outs, kMaxFoldElements);
  REQUIRE(!st);
  CHECK_THAT(errorMessage(st.takeError()), Catch::Contains("out of range"));
}

TEST_CASE("fold: MatMul of constants, numpy's shapes", "[import][fold]") {
  // transformers' rotary tables: inverse frequencies [1, 2, 1] times
  // positions [1, 1, 3], an outer product.
  auto inv = floats({1, 2, 1}, {1.0, 0.5});
  auto pos = floats({1, 1, 3}, {0, 1, 2});
  auto outer = fold(node("MatMul"), {&inv, &pos});
  CHECK(outer.dims == std::vector<int64_t>{1, 2, 3});
  CHECK(outer.floats == std::vector<double>{0, 1, 2, 0, 0.5, 1});
  // Batch dims broadcast; a rank-1 operand is a row on the left and a
  // column on the right, and its dim leaves the result.
  auto a = ints({2, 1, 2}, {1, 2, 3, 4});
  auto b = ints({2, 2}, {1, 0, 1, 1});
  auto ab = fold(node("MatMul"), {&a, &b});
  CHECK(ab.dims == std::vector<int64_t>{2, 1, 2});
  CHECK(ab.ints == std::vector<int64_t>{3, 2, 7, 4});
  auto v = ints({2}, {1, -1});
  auto vb = fold(node("MatMul"), {&v, &b});
  CHECK(vb.dims == std::vector<int64_t>{2});
  CHECK(vb.ints == std::vector<int64_t>{0, -1});
  auto bv = fold(node("MatMul"), {&b, &v});
  CHECK(bv.dims == std::vector<int64_t>{2});
  CHECK(bv.ints == std::vector<int64_t>{1, 0});
  // Float sums run in double and round to float32 once.
  auto tenth = floats({1, 1}, {0.1});
  CHECK(fold(node("MatMul"), {&tenth, &tenth}).floats[0] ==
        double(float(0.1 * 0.1)));
  std::vector<ConstTensor> outs;
  auto c = ints({3}, {1, 2, 3});
  auto st = foldNode(node("MatMul"), {&b, &c}, outs, kMaxFoldElements);
  REQUIRE(!st);
  CHECK_THAT(errorMessage(st.takeError()), Catch::Contains("inner dims"));
}
