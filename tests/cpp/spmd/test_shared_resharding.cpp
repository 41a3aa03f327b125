// Shared resharding (SearchOptions::shared_resharding, issue 17): a tensor several readers need in
// one layout is resharded to it once. By hand on a partial sum read by two ops, against the same
// search charging every reader (the readers' layouts are the same in both plans, so the costs
// differ by exactly one resharding), the evaluator's collective counts, and O2 = O3.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <map>
#include <string>

#include "weft/cluster/cluster.hpp"
#include "weft/ir/graph.hpp"
#include "weft/sharding/reshard.hpp"
#include "weft/spmd/search.hpp"
#include "weft/spmd/strategy.hpp"

using namespace weft;
using namespace weft::spmd;

namespace {
int count(const std::map<std::string, int>& c) {
  int n = 0;
  for (const auto& [k, v] : c) n += v;
  return n;
}
}  // namespace

TEST_CASE("shared resharding: a partial sum read by two ops is reduced once") {
  // x = a·b with the contraction split over 8 devices (a and b stored split along it): x is a
  // partial sum. Two elementwise ops read it; each needs it reduced (reduce-scattered: the
  // cheapest whole-sum layout, the op then runs on an eighth).
  ir::Graph g;
  auto a = g.input("a", {512, 4096});
  auto b = g.parameter("b", {4096, 1024});
  auto x = g.matmul(a, b, "x");
  g.unary(ir::UnaryFn::Relu, x, "y1");
  g.unary(ir::UnaryFn::Neg, x, "y2");
  const auto c = cluster::Cluster::preset("M8", 1);
  const auto mesh = cluster::DeviceMesh::iota({8});
  SearchOptions o;
  o.level = Level::O3;
  o.memory_limit = -1;
  o.fixed_specs = {{"a", "S(1)"}, {"b", "S(0)"}};
  auto each = o;
  each.shared_resharding = false;
  const SpmdPlan shared = spmd_search(g, c, mesh, o), apart = spmd_search(g, c, mesh, each);
  const auto xs = *g.find_tensor("x");
  REQUIRE(shared.shared_specs.at(xs).has_value());
  for (const auto& sp : apart.shared_specs) CHECK(!sp.has_value());
  const auto& layout = *shared.shared_specs[xs];
  CHECK(shared.tensor_specs[xs]->has_partial());
  CHECK(!layout.has_partial());
  // Both readers read the shared layout; apart, each pays its own reduction (an equal one: the
  // two sharded dimensions of x have the same bytes). Sharing saves exactly one.
  const auto links = cluster::axis_links(c, mesh);
  for (int op : {1, 2}) {
    CHECK(shared.op_strategies[op].inputs[0] == layout);
    CHECK(sharding::reshard_on_mesh(*apart.tensor_specs[xs], apart.op_strategies[op].inputs[0], links, 4)
              .time ==
          doctest::Approx(sharding::reshard_on_mesh(*shared.tensor_specs[xs], layout, links, 4).time));
  }
  const double once = sharding::reshard_on_mesh(*shared.tensor_specs[xs], layout, links, 4).time;
  CHECK(once > 0);
  CHECK(apart.cost - shared.cost == doctest::Approx(once).epsilon(1e-9));
  // The evaluator (the report's collective counts) sees one reduction of x, not two.
  const auto es = evaluate_plan(g, c, mesh, shared), ea = evaluate_plan(g, c, mesh, apart);
  CHECK(es.cost == doctest::Approx(shared.cost).epsilon(1e-9));
  CHECK(ea.cost == doctest::Approx(apart.cost).epsilon(1e-9));
  const int steps =
      static_cast<int>(sharding::reshard_on_mesh(*shared.tensor_specs[xs], layout, links, 4).steps.size());
  CHECK(count(ea.collectives) - count(es.collectives) == steps);
  int x_edges = 0;
  for (const auto& e : es.edges) x_edges += e.rfind("x -> ", 0) == 0;
  CHECK(x_edges == 1);
  // O2 searches the same problem.
  auto o2 = o;
  o2.level = Level::O2;
  CHECK(spmd_search(g, c, mesh, o2).cost == doctest::Approx(shared.cost).epsilon(1e-9));
}

namespace {
// The exact optimum by brute force: every op strategy and leaf spec (default strides, as the search
// with strided candidates off), and for each tensor read by two or more ops every choice of one
// shared layout (none, or one its readers need) — all priced by the independent evaluator.
double brute_force(const ir::Graph& g, const cluster::Cluster& c, const cluster::DeviceMesh& mesh,
                   bool shared, double limit) {
  std::vector<std::vector<OpStrategy>> ops;
  for (const auto& op : g.ops()) ops.push_back(enumerate_strategies(g, op, mesh.shape()));
  std::vector<ir::TensorId> leaves;
  std::vector<std::vector<sharding::ShardingSpec>> leaf_specs;
  sharding::EnumerateOptions eo;
  eo.strided = false;
  eo.partial = false;
  for (ir::TensorId t = 0; t < static_cast<ir::TensorId>(g.tensors().size()); ++t)
    if (g.tensor(t).producer == ir::kNoOp)
      leaves.push_back(t),
          leaf_specs.push_back(sharding::enumerate_specs(g.tensor(t).shape, mesh.shape(), eo));
  std::map<ir::TensorId, std::vector<std::pair<int, int>>> readers;  // tensor -> (op, operand)
  for (int o = 0; o < static_cast<int>(g.ops().size()); ++o)
    for (int i = 0; i < static_cast<int>(g.op(o).inputs.size()); ++i)
      readers[g.op(o).inputs[i]].push_back({o, i});
  std::erase_if(readers, [](const auto& kv) { return kv.second.size() < 2; });
  std::vector<std::size_t> pick(ops.size() + leaves.size(), 0);
  double best = 1e300;
  for (;;) {
    std::vector<std::vector<AxisAssign>> axes;
    for (std::size_t o = 0; o < ops.size(); ++o) axes.push_back(ops[o][pick[o]].axes);
    std::map<ir::TensorId, sharding::ShardingSpec> ls;
    for (std::size_t l = 0; l < leaves.size(); ++l)
      ls.emplace(leaves[l], leaf_specs[l][pick[ops.size() + l]]);
    // Shared layouts: per multi-reader tensor, none or one of the layouts its readers take here.
    std::vector<std::pair<ir::TensorId, std::vector<sharding::ShardingSpec>>> options;
    for (const auto& [t, rs] : readers) {
      std::vector<sharding::ShardingSpec> opts;
      if (shared)
        for (const auto& [o, i] : rs) opts.push_back(ops[o][pick[o]].inputs[i]);
      options.push_back({t, opts});
    }
    std::vector<std::size_t> sp(options.size(), 0);  // 0 = none, k = options[k - 1]
    for (;;) {
      std::map<ir::TensorId, sharding::ShardingSpec> sh;
      for (std::size_t k = 0; k < options.size(); ++k)
        if (sp[k] > 0) sh.emplace(options[k].first, options[k].second[sp[k] - 1]);
      const auto ev = evaluate_plan(g, c, mesh, axes, ls, sh);
      if (limit <= 0 || ev.peak_memory <= limit) best = std::min(best, ev.cost);
      std::size_t k = 0;
      while (k < sp.size() && ++sp[k] > options[k].second.size()) sp[k++] = 0;
      if (k == sp.size()) break;
    }
    std::size_t k = 0;
    const auto size = [&](std::size_t j) {
      return j < ops.size() ? ops[j].size() : leaf_specs[j - ops.size()].size();
    };
    while (k < pick.size() && ++pick[k] == size(k)) pick[k++] = 0;
    if (k == pick.size()) break;
  }
  return best;
}
}  // namespace

TEST_CASE("shared resharding: the search's optimum equals brute force over strategies and shared layouts") {
  // Small graphs on a mesh of 2: a weight read by two matmuls (a leaf shared), and a partial sum
  // (the long contraction split) read by two elementwise ops that need it reduced and a matmul
  // (an op result shared: reduced once).
  const auto c = cluster::Cluster::preset("M8", 1);
  const auto mesh = cluster::DeviceMesh::iota({2});
  std::vector<ir::Graph> graphs(2);
  std::vector<double> limits{35e6, -1};
  {
    // Too little memory to store w whole beside the batch-split activations (memory rows in the
    // ILP; the brute force drops assignments over the limit).
    auto& g = graphs[0];
    auto w = g.parameter("w", {1024, 1024});
    g.unary(ir::UnaryFn::Relu, g.matmul(g.input("x1", {4096, 1024}), w, "y1"), "z1");
    g.unary(ir::UnaryFn::Relu, g.matmul(g.input("x2", {4096, 1024}), w, "y2"), "z2");
  }
  {
    auto& g = graphs[1];
    auto x = g.matmul(g.input("a", {64, 65536}), g.parameter("b", {65536, 64}), "x");
    g.unary(ir::UnaryFn::Relu, x, "y1");
    g.unary(ir::UnaryFn::Exp, x, "y2");
    g.matmul(x, g.parameter("w", {64, 8}), "y3");
  }
  for (std::size_t k = 0; k < graphs.size(); ++k) {
    const auto& g = graphs[k];
    SearchOptions o;
    o.level = Level::O3;
    o.memory_limit = limits[k];
    o.strided_candidates = false;
    o.shared_layouts_per_tensor = 16;  // every candidate: the exact model
    auto each = o;
    each.shared_resharding = false;
    const double shared = spmd_search(g, c, mesh, o).cost, apart = spmd_search(g, c, mesh, each).cost;
    CHECK(shared == doctest::Approx(brute_force(g, c, mesh, true, limits[k])).epsilon(1e-9));
    CHECK(apart == doctest::Approx(brute_force(g, c, mesh, false, limits[k])).epsilon(1e-9));
    CHECK(shared <= apart * (1 + 1e-12));
    if (k == 1) CHECK(shared < apart * (1 - 1e-3));  // x reduced once
    auto o2 = o;
    o2.level = Level::O2;
    CHECK(spmd_search(g, c, mesh, o2).cost == doctest::Approx(shared).epsilon(1e-9));
    MESSAGE(
        fmt::format("{} ops: shared {:.6g} us, apart {:.6g} us", g.ops().size(), shared * 1e6, apart * 1e6));
  }
}
