// The SPMD cost model against hand-derived figures: a None-optimizer graph's gradients end
// reduced, views cost no compute.
#include <doctest/doctest.h>

#include <map>
#include <set>
#include <string>

#include "gpt_block.hpp"
#include "weft/cluster/alpha_beta.hpp"
#include "weft/cluster/cluster.hpp"
#include "weft/cost/op_cost.hpp"
#include "weft/cost/view_ops.hpp"
#include "weft/ir/autodiff.hpp"
#include "weft/spmd/search.hpp"

using namespace weft;
using namespace weft::spmd;

namespace {
const cluster::Cluster& m8() {
  static const auto c = cluster::Cluster::preset("M8", 1);
  return c;
}
double op_time(const ir::Graph& g, const SpmdPlan& p, int o, const cluster::DeviceSpec& d) {
  return cost::op_cost(g, g.op(o), d, p.op_strategies[o].factor_shards).time;
}
}  // namespace

TEST_CASE("spmd cost: a None-optimizer graph pays the all-reduce of every gradient") {
  // A tiny MLP, data parallel on 4 devices (batch split, weights replicated): each weight
  // gradient is a partial sum over the batch and must end reduced, as an update would need it.
  ir::TrainOptions t;
  t.optimizer = ir::Optimizer::None;
  auto g = ir::build_training_graph(testing::mlp_chain(4096, {1024, 1024, 1024}), t);
  const auto mesh = cluster::DeviceMesh::iota({4});
  SearchOptions o;
  o.memory_limit = -1;
  o.fixed_specs = {{"x", "S(0)"},   {"w0", "R"},       {"w1", "R"},
                   {"mm0", "S(0)"}, {"relu0", "S(0)"}, {"mm1", "S(0)"}};
  const auto plan = spmd_search(g, m8(), mesh, o);
  const auto ev = evaluate_plan(g, m8(), mesh, plan);
  CHECK(ev.cost == doctest::Approx(plan.cost).epsilon(1e-12));
  // Both gradients reduced (all-reduce, or reduce-scatter + all-gather: the same α-β time).
  std::set<std::string> reduced;
  for (ir::TensorId r : ev.partial_reductions) reduced.insert(g.tensor(r).name);
  CHECK(reduced.count(g.tensor(*g.grad(*g.find_tensor("w0"))).name) == 1);
  CHECK(reduced.count(g.tensor(*g.grad(*g.find_tensor("w1"))).name) == 1);
  // By hand: a ring all-reduce per gradient, 2(n−1)/n·B·β + 2(n−1)α, and nothing else.
  const auto link = cluster::axis_links(m8(), mesh)[0];
  auto ar = [&](double bytes) { return 2 * 3.0 / 4.0 * bytes * link.beta + 2 * 3 * link.alpha; };
  const double wbytes = 1024.0 * 1024 * 4;
  const double expected = 2 * ar(wbytes);
  CHECK(expected == doctest::Approx(2 * cluster::all_reduce_time(link, wbytes)).epsilon(1e-12));
  CHECK(plan.comm_time == doctest::Approx(expected).epsilon(1e-9));
  // Without the fix the same layouts were free: the gradients left as unreduced partial sums.
  CHECK(plan.comm_time > 0);
}

TEST_CASE("spmd cost: views (reshape, transpose read by an einsum, contiguous slice) cost no compute") {
  ir::Graph g("views");
  auto x = g.input("x", {64, 256});
  auto w = g.parameter("w", {16, 32});
  auto r = g.reshape(x, {64, 16, 16}, "split");
  auto tr = g.transpose(r, {0, 2, 1}, "swap");      // read by an einsum: a view
  auto y = g.einsum("bij,jo->bio", {tr, w}, "mm");  // [64, 16, 32]
  auto t2 = g.transpose(y, {0, 2, 1}, "swap2");     // read by a unary op: materialised
  auto u = g.unary(ir::UnaryFn::Relu, t2, "act");   // [64, 32, 16]
  auto s0 = g.slice(u, 0, 0, 32, "rows");           // axis 0: contiguous, a view
  g.slice(u, 1, 0, 16, "cols");                     // axis 1 of [64, ...]: strided, a copy
  g.reshape(s0, {32, 512}, "flat0");
  const auto views = cost::view_ops(g);
  std::map<std::string, bool> is_view;
  for (int o = 0; o < static_cast<int>(g.ops().size()); ++o) is_view[g.op(o).name] = views[o] != 0;
  CHECK(is_view["split"]);
  CHECK(is_view["swap"]);
  CHECK_FALSE(is_view["swap2"]);
  CHECK(is_view["rows"]);
  CHECK_FALSE(is_view["cols"]);
  CHECK(is_view["flat0"]);
  CHECK_FALSE(is_view["mm"]);
  CHECK_FALSE(is_view["act"]);
  // One device: the compute part of the objective is the roofline time of the non-view ops only.
  const auto mesh = cluster::DeviceMesh::iota({1});
  SearchOptions o;
  o.memory_limit = -1;
  const auto plan = spmd_search(g, m8(), mesh, o);
  const auto dev = m8().device(0).spec;
  double compute = 0, view_time = 0;
  for (int op = 0; op < static_cast<int>(g.ops().size()); ++op)
    (views[op] ? view_time : compute) += op_time(g, plan, op, dev);
  REQUIRE(view_time > 0);  // what the views were charged before
  CHECK(plan.compute_time == doctest::Approx(compute).epsilon(1e-12));
  CHECK(evaluate_plan(g, m8(), mesh, plan).compute_time == doctest::Approx(compute).epsilon(1e-12));
}
