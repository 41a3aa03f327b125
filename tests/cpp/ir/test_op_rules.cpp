#include <doctest/doctest.h>

#include "weft/core/error.hpp"
#include "weft/ir/graph.hpp"

using namespace weft::ir;

TEST_CASE("matmul index map: parallel b,s,f and summed h; 2 FLOPs per point") {
  Graph g("mm");
  auto x = g.input("x", {2, 3, 4});
  auto w = g.parameter("w", {4, 5});
  auto y = g.einsum("bsh,hf->bsf", {x, w});
  const Op& op = g.op(g.tensor(y).producer);
  CHECK(g.tensor(y).shape == Shape{2, 3, 5});
  REQUIRE(op.index_map.factors.size() == 4);
  CHECK(op.index_map.factors[2].name == "h");
  CHECK(op.index_map.factors[2].kind == FactorKind::Reduction);
  CHECK(op.index_map.factors[2].reduce == ReduceKind::Sum);
  CHECK(op.index_map.factors[3].kind == FactorKind::Parallel);
  CHECK(op.flops() == doctest::Approx(2.0 * 2 * 3 * 4 * 5));
  auto w2 = g.parameter("w2", {5, 5});
  CHECK_THROWS_WITH_AS(g.einsum("bsh,hf->bsf", {x, w2}), doctest::Contains("index 'h' has size 4"), weft::Error);
  CHECK_THROWS_WITH_AS(g.einsum("bs,hf->bsf", {x, w}), doctest::Contains("has 2 letters"), weft::Error);
  CHECK_THROWS_WITH_AS(g.einsum("bsh,hf->bsz", {x, w}), doctest::Contains("in no operand"), weft::Error);
}

TEST_CASE("reshape factors: the common refinement, Rhino's [4,2] -> [8] and split heads") {
  std::vector<std::vector<std::int64_t>> in, out;
  REQUIRE(reshape_factors({4, 2}, {8}, in, out));
  CHECK(in == std::vector<std::vector<std::int64_t>>{{4}, {2}});
  CHECK(out == std::vector<std::vector<std::int64_t>>{{4, 2}});
  REQUIRE(reshape_factors({2, 3, 12}, {2, 3, 4, 3}, in, out));
  CHECK(in[2] == std::vector<std::int64_t>{4, 3});
  CHECK(out[2] == std::vector<std::int64_t>{4});
  CHECK(out[3] == std::vector<std::int64_t>{3});
  REQUIRE(reshape_factors({6, 1, 4}, {24}, in, out));
  CHECK(in[1].empty());
  CHECK(!reshape_factors({6, 4}, {4, 6}, in, out));
  Graph g;
  auto x = g.input("x", {6, 4});
  auto y = g.reshape(x, {4, 6});  // still allowed: factors need replication
  const auto& m = g.op(g.tensor(y).producer).index_map;
  for (const auto& f : m.factors) CHECK(f.kind == FactorKind::NeedReplication);
  CHECK_THROWS_AS(g.reshape(x, {5, 5}), weft::Error);
}

TEST_CASE("broadcasting binary ops leave broadcast dims without factors") {
  Graph g;
  auto a = g.input("a", {3, 1, 5});
  auto b = g.input("b", {4, 1});
  auto c = g.add(a, b);
  CHECK(g.tensor(c).shape == Shape{3, 4, 5});
  const auto& m = g.op(g.tensor(c).producer).index_map;
  CHECK(m.inputs[0][1].empty());
  CHECK(m.inputs[1][1].empty());
  CHECK_THROWS_AS(g.add(a, g.input("z", {2, 4})), weft::Error);
}

TEST_CASE("conv and pool: spatial factors need replication, FLOPs are 2·n·o·c·r·t·P·Q") {
  Graph g;
  auto x = g.input("x", {2, 3, 8, 8});
  auto w = g.parameter("w", {4, 3, 3, 3});
  auto y = g.conv2d(x, w, 1, 1);
  CHECK(g.tensor(y).shape == Shape{2, 4, 8, 8});
  const auto& op = g.op(g.tensor(y).producer);
  CHECK(op.flops() == doctest::Approx(2.0 * 2 * 4 * 3 * 3 * 3 * 8 * 8));
  auto p = g.pool2d(ReduceFn::Max, y, 2, 2);
  CHECK(g.tensor(p).shape == Shape{2, 4, 4, 4});
}

TEST_CASE("validation catches cycles, shape lies and dangling tensors") {
  Graph g("v");
  auto x = g.input("x", {2, 2});
  auto y = g.unary(UnaryFn::Relu, x);
  g.validate();
  Graph bad = g;
  Op op = bad.op(0);
  op.inputs = {99};
  Graph b2("b2");
  b2.input("x", {2, 2});
  b2.add_op_unchecked(op);
  CHECK_THROWS_WITH_AS(b2.validate(), doctest::Contains("does not exist"), weft::Error);
  (void)y;
}
