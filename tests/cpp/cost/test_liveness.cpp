// Liveness and peak memory: the interval sweep against a per-position brute force on random DAGs.
#include <doctest/doctest.h>

#include <random>

#include "weft/cost/memory.hpp"
#include "weft/ir/graph.hpp"

using namespace weft;

namespace {
// A random DAG of elementwise adds over parameters and earlier results, one loss at the end.
ir::Graph random_graph(std::mt19937& rng) {
  ir::Graph g("rnd");
  std::vector<ir::TensorId> pool;
  const int leaves = 2 + static_cast<int>(rng() % 4);
  for (int i = 0; i < leaves; ++i) pool.push_back(g.parameter("p" + std::to_string(i), {4, 8}));
  const int ops = 3 + static_cast<int>(rng() % 12);
  for (int i = 0; i < ops; ++i) {
    const auto a = pool[rng() % pool.size()], b = pool[rng() % pool.size()];
    pool.push_back(g.add(a, b));
  }
  g.mark_output(pool[rng() % pool.size()]);
  return g;
}

// The definition: at every position, the bytes of every tensor whose live interval holds it.
std::pair<double, int> brute_peak(const cost::Liveness& l, const std::vector<double>& bytes) {
  double best = 0;
  int at = -1;
  for (int p = 0; p < static_cast<int>(l.order.size()); ++p) {
    double s = 0;
    for (int t = 0; t < static_cast<int>(l.begin.size()); ++t)
      if (l.begin[t] >= 0 && l.begin[t] <= p && p <= l.end[t]) s += bytes[t];
    if (at < 0 || s > best) best = s, at = p;
  }
  return {best, at};
}
}  // namespace

TEST_CASE("liveness: peak memory from the intervals = brute force, with and without the sets") {
  std::mt19937 rng(31);
  for (int it = 0; it < 300; ++it) {
    const auto g = random_graph(rng);
    const auto with = cost::liveness(g);
    auto without = cost::liveness(g, false);
    CHECK(without.sets.empty());
    CHECK(without.begin == with.begin);
    CHECK(without.end == with.end);
    // Whole bytes (the sweep), then fractional bytes (the per-set sum).
    std::vector<double> whole(g.tensors().size()), frac(g.tensors().size());
    for (std::size_t t = 0; t < whole.size(); ++t) {
      whole[t] = static_cast<double>(1 + rng() % 4096);
      frac[t] = whole[t] / 3.0;
    }
    for (const auto* bytes : {&whole, &frac}) {
      const auto truth = brute_peak(with, *bytes);
      const auto a = cost::peak_memory(with, *bytes);
      const auto b = cost::peak_memory(without, *bytes);
      CHECK(a.first == doctest::Approx(truth.first).epsilon(1e-12));
      CHECK(b.first == doctest::Approx(truth.first).epsilon(1e-12));
      if (bytes == &whole) {  // exact sums: the same position as the definition
        CHECK(a.second == truth.second);
        CHECK(b.second == truth.second);
        const auto per = cost::live_bytes(without, *bytes);
        REQUIRE(per.size() == with.order.size());
        for (std::size_t p = 0; p < per.size(); ++p) {
          double s = 0;
          for (ir::TensorId t : with.sets[p]) s += (*bytes)[t];
          CHECK(per[p] == s);
        }
      }
    }
    cost::build_live_sets(without);
    CHECK(without.sets == with.sets);
    CHECK(cost::maximal_positions(without) == cost::maximal_positions(with));
  }
}
