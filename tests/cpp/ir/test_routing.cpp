// The routing ops (Gather, ScatterAdd, TopK): rules (shapes, index maps, errors), kernels against
// brute-force loops, gradients against central differences, JSON round trip.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <random>

#include "weft/core/error.hpp"
#include "weft/ir/autodiff.hpp"
#include "weft/ir/interpreter.hpp"
#include "weft/ir/json.hpp"

using namespace weft::ir;

namespace {

HostTensor uniform(const Shape& s, std::mt19937& gen) {
  std::uniform_real_distribution<double> u(-1, 1);
  HostTensor t{s, {}};
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data.push_back(u(gen));
  return t;
}

HostTensor ints(const Shape& s, std::int64_t n, std::mt19937& gen) {
  std::uniform_int_distribution<std::int64_t> u(0, n - 1);
  HostTensor t{s, {}};
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data.push_back(static_cast<double>(u(gen)));
  return t;
}

const Factor& factor_of(const Op& op, bool output, int tensor, int dim) {
  const auto& dims = output ? op.index_map.outputs : op.index_map.inputs;
  return op.index_map.factors[static_cast<std::size_t>(dims[tensor][dim].at(0))];
}

// Parameter gradients of the training graph against central differences of the loss.
void check_fd(const Graph& g, std::map<TensorId, HostTensor> feeds) {
  TrainOptions o;
  o.optimizer = Optimizer::None;
  Graph tg = build_training_graph(g, o);
  tg.validate();
  auto vals = interpret(tg, feeds);
  int checked = 0;
  for (const auto& feed : feeds) {
    const TensorId id = feed.first;  // (INFO's lambda cannot capture a structured binding)
    const HostTensor& value = feed.second;
    if (g.tensor(id).role != Role::Parameter) continue;
    auto gid = tg.grad(id);
    REQUIRE(gid.has_value());
    for (std::int64_t i = 0; i < value.numel(); ++i) {
      auto f = feeds;
      const double h = 1e-6;
      f[id].data[i] = value.data[i] + h;
      double up = interpret(g, f)[*g.loss()].data[0];
      f[id].data[i] = value.data[i] - h;
      double down = interpret(g, f)[*g.loss()].data[0];
      INFO(g.tensor(id).name << " element " << i);
      CHECK(vals[*gid].data[i] == doctest::Approx((up - down) / (2 * h)).epsilon(1e-6).scale(1.0));
      ++checked;
    }
  }
  CHECK(checked > 0);
}

}  // namespace

TEST_CASE("routing rules: the routed axis needs replication, every other dim is parallel") {
  Graph g("r");
  auto x = g.input("x", {4, 6, 3});
  auto idx = g.input("idx", {4, 2, 3}, weft::DType::I64);
  auto y = g.gather(x, idx, 1);
  const Op& ga = g.op(g.tensor(y).producer);
  CHECK(g.tensor(y).shape == Shape{4, 2, 3});
  CHECK(g.tensor(y).dtype == weft::DType::F32);
  CHECK(factor_of(ga, false, 0, 1).kind == FactorKind::NeedReplication);
  CHECK(factor_of(ga, false, 0, 1).size == 6);
  CHECK(factor_of(ga, false, 1, 0).kind == FactorKind::Parallel);
  CHECK(ga.index_map.inputs[0][0] == ga.index_map.outputs[0][0]);  // x, index and out share the batch
  CHECK(ga.index_map.inputs[1][2] == ga.index_map.outputs[0][2]);
  CHECK(ga.flops() == 0);

  auto base = g.input("base", {4, 6, 3});
  auto s = g.scatter_add(base, idx, y, 1);
  const Op& sa = g.op(g.tensor(s).producer);
  CHECK(g.tensor(s).shape == Shape{4, 6, 3});
  CHECK(factor_of(sa, false, 0, 1).kind == FactorKind::NeedReplication);  // base's axis
  CHECK(factor_of(sa, false, 2, 1).kind == FactorKind::NeedReplication);  // src's axis: no partial sums
  CHECK(factor_of(sa, true, 0, 2).kind == FactorKind::Parallel);
  CHECK(sa.flops() == doctest::Approx(4 * 2 * 3));

  auto [v, i] = g.topk(x, 2, -2);
  const Op& tk = g.op(g.tensor(v).producer);
  CHECK(g.tensor(v).shape == Shape{4, 2, 3});
  CHECK(g.tensor(i).dtype == weft::DType::I64);
  CHECK(tk.attrs.axes == std::vector<int>{1});
  CHECK(factor_of(tk, false, 0, 1).kind == FactorKind::NeedReplication);
  CHECK(factor_of(tk, true, 1, 1).kind == FactorKind::NeedReplication);
  CHECK(factor_of(tk, true, 0, 0).kind == FactorKind::Parallel);

  // Errors name the op and the problem.
  auto fidx = g.input("fidx", {4, 2, 3});
  CHECK_THROWS_WITH_AS(g.gather(x, fidx, 1, "g1"), doctest::Contains("gather index must be i32 or i64"),
                       weft::Error);
  auto short_idx = g.input("short", {4, 2, 2}, weft::DType::I64);
  CHECK_THROWS_WITH_AS(g.gather(x, short_idx, 1, "g2"), doctest::Contains("differ in dim 2"), weft::Error);
  CHECK_THROWS_WITH_AS(g.gather(x, idx, 3, "g3"), doctest::Contains("axis 3 out of range"), weft::Error);
  CHECK_THROWS_WITH_AS(g.scatter_add(base, idx, x, 1, "s1"), doctest::Contains("must have one shape"),
                       weft::Error);
  CHECK_THROWS_WITH_AS(g.topk(x, 7, 1, true, "t1"), doctest::Contains("k = 7 is not in [1, 6]"), weft::Error);
  OpAttrs zero;
  zero.axes = {1};
  CHECK_THROWS_WITH_AS(g.add_op(OpKind::ScatterAdd, {idx, y}, zero, "s2"),
                       doctest::Contains("zero base needs attrs.ints"), weft::Error);
  zero.ints = {6};
  auto z = g.add_op(OpKind::ScatterAdd, {idx, y}, zero, "s3")[0];
  CHECK(g.tensor(z).shape == Shape{4, 6, 3});
  g.validate();
  // Exact JSON round trip with the new kinds.
  CHECK(graph_from_json(graph_to_json(g)) == g);
}

TEST_CASE("routing kernels against brute-force loops; an index out of range is an error") {
  std::mt19937 gen(3);
  Graph g("k");
  auto x = g.input("x", {3, 5, 2});
  auto idx = g.input("idx", {3, 4, 2}, weft::DType::I64);
  auto src = g.input("src", {3, 4, 2});
  auto base = g.input("base", {3, 5, 2});
  auto y = g.gather(x, idx, 1);
  auto s = g.scatter_add(base, idx, src, 1);
  auto [v, i] = g.topk(x, 3, 1);
  auto [lv, li] = g.topk(x, 2, 1, false);
  HostTensor X = uniform({3, 5, 2}, gen), I = ints({3, 4, 2}, 5, gen), S = uniform({3, 4, 2}, gen),
             B = uniform({3, 5, 2}, gen);
  X.data[0 * 10 + 1 * 2 + 0] = X.data[0 * 10 + 3 * 2 + 0] = 5.0;  // a tie for the max of row (0, :, 0)
  auto val = interpret(g, {{x, X}, {idx, I}, {src, S}, {base, B}});
  auto at = [](std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t n) {
    return (a * n + b) * 2 + c;
  };
  HostTensor want = B;
  for (int a = 0; a < 3; ++a)
    for (int k = 0; k < 4; ++k)
      for (int c = 0; c < 2; ++c) {
        auto r = static_cast<std::int64_t>(I.data[at(a, k, c, 4)]);
        CHECK(val[y].data[at(a, k, c, 4)] == X.data[at(a, r, c, 5)]);
        want.data[at(a, r, c, 5)] += S.data[at(a, k, c, 4)];
      }
  for (std::size_t e = 0; e < want.data.size(); ++e) CHECK(val[s].data[e] == doctest::Approx(want.data[e]));
  for (int a = 0; a < 3; ++a)
    for (int c = 0; c < 2; ++c) {
      for (int k = 0; k < 3; ++k) {  // best first, each the value at its index
        auto r = static_cast<std::int64_t>(val[i].data[at(a, k, c, 3)]);
        CHECK(val[v].data[at(a, k, c, 3)] == X.data[at(a, r, c, 5)]);
        if (k > 0) CHECK(val[v].data[at(a, k, c, 3)] <= val[v].data[at(a, k - 1, c, 3)]);
      }
      int larger = 0;  // the k-th value is the 3rd largest: 2 elements of the row are larger
      for (int n = 0; n < 5; ++n) larger += X.data[at(a, n, c, 5)] > val[v].data[at(a, 2, c, 3)];
      CHECK(larger <= 2);
      CHECK(val[lv].data[at(a, 0, c, 2)] <= val[lv].data[at(a, 1, c, 2)]);  // smallest first
    }
  // The tie: the lower index first (torch.argmax's first maximum).
  CHECK(val[i].data[at(0, 0, 0, 3)] == 1);
  CHECK(val[i].data[at(0, 1, 0, 3)] == 3);
  // NaN counts as the largest value, as in torch.
  X.data[at(1, 4, 1, 5)] = std::numeric_limits<double>::quiet_NaN();
  auto nan = interpret(g, {{x, X}, {idx, I}, {src, S}, {base, B}});
  CHECK(nan[i].data[at(1, 0, 1, 3)] == 4);
  CHECK(nan[li].data[at(1, 0, 1, 2)] != 4);
  I.data[5] = 5;
  CHECK_THROWS_WITH_AS(interpret(g, {{x, X}, {idx, I}, {src, S}, {base, B}}),
                       doctest::Contains("index 5 is not an integer in [0, 5)"), weft::Error);
}

TEST_CASE("routing gradients: gather and top-k scatter dy back, scatter_add gathers it") {
  std::mt19937 gen(5);
  Graph g("router");
  auto w = g.parameter("w", {4, 6});     // expert logits per token
  auto e = g.parameter("e", {4, 6, 3});  // expert outputs per token
  auto base = g.parameter("base", {4, 6});
  auto probs = g.softmax(w, 1);
  auto [top, idx] = g.topk(probs, 2, 1);
  // The gathered experts' outputs: idx [4, 2] broadcast to [4, 2, 3] by a reshape + an int add.
  auto idx3 = g.reshape(idx, {4, 2, 1});
  auto zeros = g.input("zeros", {4, 2, 3}, weft::DType::I64);
  auto picked = g.gather(e, g.binary(BinaryFn::Add, idx3, zeros), 1);       // [4, 2, 3]
  auto combined = g.einsum("tk,tkh->th", {top, picked});                    // Σ_k p_k · e_k
  auto gates = g.scatter_add(base, idx, g.unary(UnaryFn::Square, top), 1);  // [4, 6]
  auto r1 = g.input("r1", {4, 3}), r2 = g.input("r2", {4, 6});
  auto l1 = g.einsum("th,th->", {combined, r1});
  auto l2 = g.einsum("te,te->", {gates, r2});
  g.set_loss(g.binary(BinaryFn::Add, l1, l2, "loss"));
  std::map<TensorId, HostTensor> feeds{
      {w, uniform({4, 6}, gen)},    {e, uniform({4, 6, 3}, gen)},
      {base, uniform({4, 6}, gen)}, {zeros, HostTensor{{4, 2, 3}, std::vector<double>(24, 0.0)}},
      {r1, uniform({4, 3}, gen)},   {r2, uniform({4, 6}, gen)}};
  check_fd(g, feeds);  // random logits: no ties, and a step of 1e-6 does not change the selection
  TrainOptions o;
  o.optimizer = Optimizer::None;
  Graph tg = build_training_graph(g, o);
  int scatters = 0;
  for (const auto& op : tg.ops()) scatters += op.kind == OpKind::ScatterAdd && op.inputs.size() == 2;
  CHECK(scatters == 2);  // the adjoints of the gather and of the top-k values
}
