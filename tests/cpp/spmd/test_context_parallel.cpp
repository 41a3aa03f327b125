// Context parallelism on the fused attention ops: the backward's query sequence is a sum reduction
// that dq carries, so splitting it leaves dq split and dk, dv partial sums (reduce-scattered), and
// the busiest tile of a causal split prices the op. Figures by hand.
#include <doctest/doctest.h>

#include "weft/cluster/cluster.hpp"
#include "weft/cost/op_cost.hpp"
#include "weft/ir/autodiff.hpp"
#include "weft/ir/op_rules.hpp"
#include "weft/spmd/search.hpp"
#include "weft/spmd/strategy.hpp"

using namespace weft;
using sharding::Placement;

namespace {

// Σ out over causal (or not) attention of parameters q, k, v [b=2, h=2, s=8, d=4]; its training graph.
ir::Graph training(bool causal) {
  ir::Graph g("cp");
  auto q = g.parameter("q", {2, 2, 8, 4}), k = g.parameter("k", {2, 2, 8, 4}),
       v = g.parameter("v", {2, 2, 8, 4});
  auto out = g.attention(q, k, v, {}, causal, "attn").first;
  g.set_loss(g.reduce(ir::ReduceFn::Sum, out, {0, 1, 2, 3}));
  ir::TrainOptions o;
  o.optimizer = ir::Optimizer::None;
  return ir::build_training_graph(g, o);
}

const ir::Op& op_of(const ir::Graph& g, ir::OpKind kind) {
  for (const auto& op : g.ops())
    if (op.kind == kind) return op;
  FAIL("no such op");
  return g.ops().front();
}

int factor_named(const ir::Op& op, const char* name) {
  for (std::size_t f = 0; f < op.index_map.factors.size(); ++f)
    if (op.index_map.factors[f].name == name) return static_cast<int>(f);
  return -1;
}

}  // namespace

TEST_CASE("context parallel: the backward's split queries leave dq split and dk, dv partial sums") {
  const auto g = training(true);
  const auto& grad = op_of(g, ir::OpKind::AttentionGrad);
  const int s = factor_named(grad, "s");
  REQUIRE(s >= 0);
  CHECK(grad.index_map.factors[s].kind == ir::FactorKind::Reduction);
  CHECK(grad.index_map.factors[s].reduce == ir::ReduceKind::Sum);
  auto st = spmd::make_strategy(g, grad, {4}, {spmd::AxisAssign{s, 0}});
  REQUIRE(st);
  // q, out, lse, dout split by the queries (dim 2, 2 of 8 rows each); k, v whole (gathered).
  for (int i : {0, 3, 5}) CHECK(st->inputs[i].per_axis()[0] == Placement::shard(2, 2));
  CHECK(st->inputs[4].per_axis()[0] == Placement::shard(2, 2));
  CHECK(st->inputs[1].per_axis()[0] == Placement::replicate());
  CHECK(st->inputs[2].per_axis()[0] == Placement::replicate());
  CHECK(st->outputs[0].per_axis()[0] == Placement::shard(2, 2));  // dq: its own queries' rows
  CHECK(st->outputs[1].per_axis()[0] == Placement::partial());    // dk: sums over the local queries
  CHECK(st->outputs[2].per_axis()[0] == Placement::partial());    // dv
  // The key/value sequence still needs replication (no log-sum-exp combine of partial softmaxes).
  const int t = factor_named(grad, "t");
  CHECK_FALSE(spmd::make_strategy(g, grad, {4}, {spmd::AxisAssign{t, 0}}));
  CHECK_FALSE(spmd::make_strategy(g, op_of(g, ir::OpKind::Attention), {4}, {spmd::AxisAssign{t, 0}}));
}

TEST_CASE("context parallel: a causal split is priced at its busiest tile") {
  const auto dev = cluster::Cluster::preset("M8", 1).device(0).spec;
  for (bool causal : {false, true}) {
    const auto g = training(causal);
    for (auto kind : {ir::OpKind::Attention, ir::OpKind::AttentionGrad}) {
      const auto& op = op_of(g, kind);
      std::vector<std::int64_t> by_heads(op.index_map.factors.size(), 1), by_queries = by_heads;
      by_heads[static_cast<std::size_t>(factor_named(op, "b1"))] = 4;
      by_queries[static_cast<std::size_t>(factor_named(op, "s"))] = 4;
      const double even = cost::op_cost(g, op, dev, by_heads).flops;
      const double split = cost::op_cost(g, op, dev, by_queries).flops;
      // s = t = 8 in 4 tiles of 2 queries: causal keeps 1+2+…+8 = 36 pairs, the last tile (queries
      // 6, 7) 7 + 8 = 15 of them against an even 9: 15/9. Without the mask every tile is even.
      CHECK(split / even == doctest::Approx(causal ? 15.0 / 9.0 : 1.0));
      CHECK(ir::attention_tile_imbalance(op, 4) == doctest::Approx(causal ? 15.0 / 9.0 : 1.0));
      CHECK(ir::attention_tile_imbalance(op, 1) == 1.0);
      // Dealt one query at a time (stride 1) the busiest tile holds queries 3 and 7: 4 + 8 = 12
      // pairs; in runs of 2 over 2 tiles (queries 2, 3, 6, 7): 3 + 4 + 7 + 8 = 22 of an even 18.
      CHECK(ir::attention_tile_imbalance(op, 4, 1) == doctest::Approx(causal ? 12.0 / 9.0 : 1.0));
      CHECK(ir::attention_tile_imbalance(op, 2, 2) == doctest::Approx(causal ? 22.0 / 18.0 : 1.0));
      CHECK(ir::attention_tile_imbalance(op, 4, 2) ==
            ir::attention_tile_imbalance(op, 4));  // the block split
      std::vector<std::int64_t> cyclic(op.index_map.factors.size(), 0);
      cyclic[static_cast<std::size_t>(factor_named(op, "s"))] = 1;
      CHECK(cost::op_cost(g, op, dev, by_queries, cyclic).flops / even ==
            doctest::Approx(causal ? 12.0 / 9.0 : 1.0));
      // A causal op offers the cyclic split of its queries beside the block one; no other op does.
      int cyclic_strategies = 0;
      for (const auto& st : spmd::enumerate_strategies(g, op, {4}))
        cyclic_strategies += st.axes[0].factor == factor_named(op, "s") && st.axes[0].inner_stride == 1;
      CHECK(cyclic_strategies == (causal ? 1 : 0));
    }
  }
}
