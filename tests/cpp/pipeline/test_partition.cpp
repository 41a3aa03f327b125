// Stage partition: Alpa's DP against exhaustive enumeration (random costs), equal stages for
// identical layers; Rhino's ILP against exhaustive enumeration with and without bound tightening
// (and the paper's printed upper bound cutting off optima), U-Net by ILP vs the best linear cut.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <tuple>

#include "weft/core/error.hpp"
#include "weft/ir/autodiff.hpp"
#include "weft/models/models.hpp"
#include "weft/pipeline/partition.hpp"

using namespace weft;
using namespace weft::pipeline;

namespace {
bool sanitized() { return std::getenv("WEFT_SANITIZED") != nullptr; }
}  // namespace

// ------------------------------------------------------------------ DP

TEST_CASE("pipeline: partition_dp equals exhaustive enumeration on random costs") {
  std::mt19937_64 gen(5);
  std::vector<SubmeshShape> sub{{1, 1}, {1, 2}, {1, 4}, {2, 4}};  // 2 nodes x 4
  const int D = 8;
  const int trials = sanitized() ? 60 : 300;
  int solved = 0, thinned_checked = 0;
  for (int trial = 0; trial < trials; ++trial) {
    const int L = 1 + static_cast<int>(gen() % 6);
    const int B = 1 << (gen() % 4);
    std::map<std::tuple<int, int, int>, std::optional<StageCost>> table;
    std::uniform_real_distribution<double> u(0.1, 10);
    for (int i = 0; i < L; ++i)
      for (int j = i; j < L; ++j)
        for (int m = 0; m < 4; ++m) {
          if (gen() % 10 == 0) {
            table[{i, j, m}] = std::nullopt;
          } else {
            StageCost c;
            c.time_s = std::round(u(gen) * 4) / 4;  // repeated values on purpose
            c.fits_memory = gen() % 12 != 0;
            table[{i, j, m}] = c;
          }
        }
    std::map<std::tuple<int, int, int>, int> calls;
    StageCostFn fn = [&](int i, int j, int m) {
      ++calls[{i, j, m}];
      return table.at({i, j, m});
    };
    DpOptions o;
    o.num_microbatches = B;
    std::optional<DpPartition> ex;
    try {
      ex = partition_dp_exhaustive(L, sub, D, fn, o);
    } catch (const Error&) {
    }
    calls.clear();
    if (!ex) {
      CHECK_THROWS_AS(partition_dp(L, sub, D, fn, o), Error);
      continue;
    }
    DpPartition dp = partition_dp(L, sub, D, fn, o);
    ++solved;
    CAPTURE(trial);
    CHECK(dp.latency_s == doctest::Approx(ex->latency_s).epsilon(1e-12));
    // Each (i, j, m) asked once.
    CHECK(static_cast<int>(calls.size()) == dp.cost_calls);
    CHECK(dp.cost_calls == L * (L + 1) / 2 * 4);
    for (const auto& [k, n] : calls) CHECK(n == 1);
    // The returned stages are consistent: cover the chain, use exactly D devices, latency formula.
    int next = 0, devices = 0;
    double sum = 0, mx = 0;
    for (const auto& st : dp.stages) {
      CHECK(st.first_block == next);
      next = st.last_block + 1;
      devices += sub[st.submesh_index].num_devices();
      const auto& c = table.at({st.first_block, st.last_block, st.submesh_index});
      REQUIRE(c.has_value());
      CHECK(c->fits_memory);
      sum += c->time_s;
      mx = std::max(mx, c->time_s);
    }
    CHECK(next == L);
    CHECK(devices == D);
    CHECK(dp.latency_s == doctest::Approx(sum + (B - 1) * mx));
    // Thinned t_max grid: within (1 + r) of the optimum.
    DpOptions ot = o;
    ot.t_max_relative_step = 0.25;
    DpPartition th = partition_dp(L, sub, D, fn, ot);
    CHECK(th.latency_s >= dp.latency_s * (1 - 1e-12));
    CHECK(th.latency_s <= dp.latency_s * 1.25 * (1 + 1e-12));
    ++thinned_checked;
  }
  CHECK(solved > trials / 3);
  CHECK(thinned_checked == solved);
}

TEST_CASE("pipeline: partition_dp equals exhaustive enumeration on longer chains (branch and bound)") {
  // Longer chains, two submesh sizes, many distinct costs: exercises the interval search.
  std::mt19937_64 gen(23);
  std::vector<SubmeshShape> sub{{1, 2}, {1, 4}};
  const int trials = sanitized() ? 15 : 60;
  int solved = 0;
  for (int trial = 0; trial < trials; ++trial) {
    const int L = 6 + static_cast<int>(gen() % 5);
    const int B = 1 + static_cast<int>(gen() % 32);
    std::uniform_real_distribution<double> u(0.5, 1.5);
    std::vector<double> w(L);
    for (auto& x : w) x = u(gen);
    // Stage time: work / devices^0.8 + noise, so neither the largest mesh nor one stage always wins.
    std::map<std::tuple<int, int, int>, double> noise;
    StageCostFn fn = [&](int i, int j, int m) {
      double work = 0;
      for (int k = i; k <= j; ++k) work += w[k];
      auto key = std::make_tuple(i, j, m);
      if (!noise.count(key)) noise[key] = u(gen) * 0.1;
      return StageCost{work / std::pow(sub[m].num_devices(), 0.8) + noise[key], 0, true};
    };
    DpOptions o;
    o.num_microbatches = B;
    auto ex = partition_dp_exhaustive(L, sub, 8, fn, o);
    auto dp = partition_dp(L, sub, 8, fn, o);
    CAPTURE(trial);
    CHECK(dp.latency_s == doctest::Approx(ex.latency_s).epsilon(1e-12));
    DpOptions scan = o;
    scan.branch_and_bound = false;
    auto sc = partition_dp(L, sub, 8, fn, scan);
    CHECK(sc.latency_s == doctest::Approx(ex.latency_s).epsilon(1e-12));
    CHECK(dp.t_max_evaluated <= sc.t_max_evaluated + 2);
    ++solved;
  }
  CHECK(solved == trials);
}

TEST_CASE("pipeline: partition_dp splits identical layers into equal stages on equal meshes") {
  for (auto [L, S] : std::vector<std::pair<int, int>>{{8, 4}, {12, 4}, {6, 2}, {9, 3}}) {
    std::vector<SubmeshShape> sub{{1, 2}};  // S equal meshes of 2 devices
    StageCostFn fn = [](int i, int j, int) { return StageCost{1.0 * (j - i + 1), 0, true}; };
    DpOptions o;
    o.num_microbatches = 8;
    DpPartition p = partition_dp(L, sub, 2 * S, fn, o);
    REQUIRE(static_cast<int>(p.stages.size()) == S);
    for (const auto& st : p.stages) CHECK(st.last_block - st.first_block + 1 == L / S);
    CHECK(p.latency_s == doctest::Approx(L + (o.num_microbatches - 1) * (L / S)));
  }
  // With every submesh of a 2 x 8 cluster and perfect scaling plus a fixed per-stage overhead,
  // identical layers still get equal stages on equal submeshes.
  std::vector<SubmeshShape> sub{{1, 1}, {1, 2}, {1, 4}, {1, 8}, {2, 8}};
  StageCostFn fn = [&](int i, int j, int m) {
    return StageCost{(j - i + 1) * 8.0 / sub[m].num_devices() + 0.5, 0, sub[m].num_devices() >= 4};
  };
  DpOptions o;
  o.num_microbatches = 32;
  DpPartition p = partition_dp(8, sub, 16, fn, o);
  std::set<int> sizes, lens;
  for (const auto& st : p.stages) {
    sizes.insert(sub[st.submesh_index].num_devices());
    lens.insert(st.last_block - st.first_block + 1);
  }
  CHECK(sizes.size() == 1);
  CHECK(lens.size() == 1);
  CHECK(!p.to_string().empty());
}

TEST_CASE("pipeline: partition_dp rejects bad input") {
  std::vector<SubmeshShape> sub{{1, 2}};
  StageCostFn ok = [](int, int, int) { return StageCost{1, 0, true}; };
  CHECK_THROWS_AS(partition_dp(0, sub, 2, ok), Error);
  CHECK_THROWS_AS(partition_dp(2, {}, 2, ok), Error);
  DpOptions bad;
  bad.num_microbatches = 0;
  CHECK_THROWS_AS(partition_dp(2, sub, 2, ok, bad), Error);
  CHECK_THROWS_AS(partition_dp(2, sub, 3, ok), Error);  // 3 devices cannot be covered by 2-device meshes
  StageCostFn neg = [](int, int, int) { return StageCost{-1, 0, true}; };
  CHECK_THROWS_AS(partition_dp(2, sub, 2, neg), Error);
  StageCostFn none = [](int, int, int) { return std::optional<StageCost>{}; };
  CHECK_THROWS_AS(partition_dp(2, sub, 2, none), Error);
  CHECK_THROWS_AS(partition_dp_exhaustive(13, sub, 2, ok), Error);
}

// ------------------------------------------------------------------ ILP

namespace {

PartitionDag random_dag(std::mt19937_64& gen, int n) {
  PartitionDag d;
  std::uniform_int_distribution<int> comp(1, 10);
  for (int v = 0; v < n; ++v) d.compute.push_back(comp(gen));
  // Each node v > 0 makes a value read by 1..3 later nodes (a DAG with skips, not a chain).
  for (int v = 0; v + 1 < n; ++v) {
    PartitionDag::Value val;
    val.producer = v;
    val.bytes = 1 + static_cast<std::int64_t>(gen() % 100);
    std::set<int> cons{v + 1 + static_cast<int>(gen() % std::min(3, n - v - 1))};
    if (gen() % 2) cons.insert(v + 1 + static_cast<int>(gen() % (n - v - 1)));
    val.consumers.assign(cons.begin(), cons.end());
    d.values.push_back(val);
  }
  return d;
}

// Independent checks of an assignment (no library code).
bool monotone(const PartitionDag& d, const std::vector<int>& st) {
  for (const auto& v : d.values)
    for (int c : v.consumers)
      if (st[c] < st[v.producer]) return false;
  return true;
}
bool balanced(const PartitionDag& d, const std::vector<int>& st, int S, double eps) {
  std::vector<double> c(S, 0);
  double tot = 0;
  for (int v = 0; v < d.num_nodes(); ++v) {
    c[st[v]] += d.compute[v];
    tot += d.compute[v];
  }
  for (double x : c)
    if (x > (1 + eps) * tot / S + 1e-9 || x < (1 - eps) * tot / S - 1e-9) return false;
  return true;
}
std::int64_t cut(const PartitionDag& d, const std::vector<int>& st) {
  std::int64_t t = 0;
  for (const auto& v : d.values) {
    std::set<int> dest;
    for (int c : v.consumers)
      if (st[c] != st[v.producer]) dest.insert(st[c]);
    t += v.bytes * static_cast<std::int64_t>(dest.size());
  }
  return t;
}

}  // namespace

TEST_CASE("pipeline: stage ILP equals exhaustive enumeration, bounds never exclude a feasible point") {
  std::mt19937_64 gen(17);
  const int trials = sanitized() ? 25 : 80;
  int feasible_cases = 0, paper_cuts_optimum = 0, paper_cuts_feasible = 0;
  for (int trial = 0; trial < trials; ++trial) {
    const int n = 5 + static_cast<int>(gen() % 5);
    const int S = 2 + static_cast<int>(gen() % 2);
    const double eps = (gen() % 2) ? 0.25 : 0.5;
    PartitionDag d = random_dag(gen, n);
    CAPTURE(trial);
    // Enumerate all S^n assignments independently.
    std::vector<std::vector<int>> feas;
    std::int64_t best = std::numeric_limits<std::int64_t>::max();
    std::vector<int> st(n, 0);
    std::function<void(int)> rec = [&](int v) {
      if (v == n) {
        if (monotone(d, st) && balanced(d, st, S, eps)) {
          feas.push_back(st);
          best = std::min(best, cut(d, st));
        }
        return;
      }
      for (int s = 0; s < S; ++s) {
        st[v] = s;
        rec(v + 1);
      }
    };
    rec(0);
    auto ex = partition_dag_exhaustive(d, S, eps);
    CHECK(ex.has_solution() == !feas.empty());
    if (feas.empty()) {
      IlpPartitionOptions o;
      o.num_stages = S;
      o.epsilon = eps;
      bool no_solution = false;
      try {
        no_solution = !partition_dag_ilp(d, o).has_solution();
      } catch (const Error&) {
        no_solution = true;  // the bounds already prove it
      }
      CHECK(no_solution);
      continue;
    }
    ++feasible_cases;
    CHECK(ex.cut_bytes == best);
    // Corrected bounds contain every feasible assignment.
    StageBounds b = stage_bounds(d, S, eps);
    for (const auto& f : feas)
      for (int v = 0; v < n; ++v) {
        CHECK(f[v] >= b.lower[v]);
        CHECK(f[v] <= b.upper[v]);
      }
    // The paper's printed upper bound: count cases where it excludes feasible points / the optimum.
    StageBounds pb = stage_bounds(d, S, eps, true);
    bool cuts_opt = true, cuts_any = false;
    for (const auto& f : feas) {
      bool inside = true;
      for (int v = 0; v < n; ++v) inside = inside && f[v] <= pb.upper[v] && f[v] >= pb.lower[v];
      cuts_any = cuts_any || !inside;
      if (inside && cut(d, f) == best) cuts_opt = false;
    }
    paper_cuts_optimum += cuts_opt;
    paper_cuts_feasible += cuts_any;
    for (bool tight : {true, false}) {
      IlpPartitionOptions o;
      o.num_stages = S;
      o.epsilon = eps;
      o.bound_tightening = tight;
      o.time_limit_s = 10;
      auto r = partition_dag_ilp(d, o);
      REQUIRE(r.has_solution());
      CHECK(r.status == solver::IlpStatus::Optimal);
      CHECK(r.cut_bytes == best);
      CHECK(cut(d, r.stage_of_node) == best);
      CHECK(monotone(d, r.stage_of_node));
      CHECK(balanced(d, r.stage_of_node, S, eps));
    }
  }
  CHECK(feasible_cases > trials / 4);
  // The printed bound is not merely loose: it removes feasible partitions, and sometimes every
  // optimal one.
  CHECK(paper_cuts_feasible > 0);
  CHECK(paper_cuts_optimum > 0);
  MESSAGE("paper's upper bound removed feasible points in " << paper_cuts_feasible << " and every optimum in "
                                                            << paper_cuts_optimum << " of " << feasible_cases
                                                            << " feasible random DAGs");
}

TEST_CASE("pipeline: the corrected upper bound on a chain with a late op (hand case)") {
  // Chain of 4 unit nodes, 2 stages, ε = 0: the only balanced split is {0,1} | {2,3}.
  PartitionDag d;
  d.compute = {1, 1, 1, 1};
  for (int v = 0; v < 3; ++v) d.values.push_back({v, {v + 1}, 10});
  StageBounds b = stage_bounds(d, 2, 0.0);
  CHECK(b.lower == std::vector<int>{0, 0, 1, 1});
  CHECK(b.upper == std::vector<int>{0, 0, 1, 1});
  CHECK(b.num_fixed() == 4);
  // The printed bound ⌈(c + Σ desc)/τ + ε⌉: node 0 → ⌈4/2⌉ = 2 → 1, node 3 → ⌈1/2⌉ = 1: harmless
  // here; with 3 stages of a 6-chain the last node gets ⌈1/2⌉ = 1 < 2, forcing it early.
  PartitionDag e;
  e.compute = {1, 1, 1, 1, 1, 1};
  for (int v = 0; v < 5; ++v) e.values.push_back({v, {v + 1}, 10});
  StageBounds pb = stage_bounds(e, 3, 0.0, true);
  CHECK(pb.upper[5] == 1);  // the paper's: last op forced into stage <= 1
  StageBounds cb = stage_bounds(e, 3, 0.0);
  CHECK(cb.lower[5] == 2);
  CHECK(cb.upper[5] == 2);
  IlpPartitionOptions o;
  o.num_stages = 3;
  o.epsilon = 0;
  auto r = partition_dag_ilp(e, o);
  REQUIRE(r.has_solution());
  CHECK(r.stage_of_node == std::vector<int>{0, 0, 1, 1, 2, 2});
  CHECK(r.cut_bytes == 20);
  o.paper_upper_bound = true;
  CHECK_THROWS_AS(partition_dag_ilp(e, o), Error);  // the printed bound leaves node 5 no stage
}

namespace {
// Best contiguous split of a topological order under the same balance rows, by an O(S·n²) DP
// written independently of the library (cut = Σ over (value, destination stage)).
std::int64_t best_linear_cut(const PartitionDag& d, int S, double eps) {
  const int n = d.num_nodes();  // dag_from_graph numbers nodes in a topological order
  double tot = 0;
  for (double c : d.compute) tot += c;
  const double hi = (1 + eps) * tot / S * (1 + 1e-12), lo = (1 - eps) * tot / S * (1 - 1e-12);
  constexpr std::int64_t kInf = std::numeric_limits<std::int64_t>::max() / 4;
  std::vector<std::vector<std::int64_t>> F(S + 1, std::vector<std::int64_t>(n + 1, kInf));
  F[0][0] = 0;
  for (int b = 0; b < n; ++b)
    for (int e = b + 1; e <= n; ++e) {
      double w = 0;
      for (int v = b; v < e; ++v) w += d.compute[v];
      if (w > hi || w < lo) continue;
      std::int64_t in = 0;
      for (const auto& val : d.values) {
        if (val.producer >= b) continue;
        bool read = false;
        for (int c : val.consumers) read = read || (c >= b && c < e);
        if (read) in += val.bytes;
      }
      for (int k = 1; k <= S; ++k)
        if (F[k - 1][b] < kInf) F[k][e] = std::min(F[k][e], F[k - 1][b] + in);
    }
  return F[S][n];
}
}  // namespace

TEST_CASE("pipeline: U-Net partitions by ILP without linearising, cut <= best linear cut") {
  models::UNetConfig c;
  c.base_channels = 4, c.depth = 3, c.in_channels = 1, c.classes = 2, c.image = 16, c.batch = 1;
  ir::Graph g = ir::build_training_graph(models::unet(c));
  PartitionDag d = dag_from_graph(g);
  // Topological numbering (the linear baseline relies on it).
  for (const auto& v : d.values)
    for (int cons : v.consumers) REQUIRE(cons > v.producer);
  // There are skip connections: some value crosses more than one layer's worth of nodes.
  int longest = 0;
  for (const auto& v : d.values)
    for (int cons : v.consumers) longest = std::max(longest, cons - v.producer);
  CHECK(longest > d.num_nodes() / 3);
  MESSAGE("U-Net DAG: " << d.num_nodes() << " nodes, " << d.values.size() << " values");
  for (int S : {2, 3, 4}) {
    const double eps = 0.25;
    IlpPartitionOptions o;
    o.num_stages = S;
    o.epsilon = eps;
    o.time_limit_s = 20;
    auto r = partition_ilp(g, o);
    CAPTURE(S);
    REQUIRE(r.has_solution());
    CHECK(monotone(d, r.stage_of_node));
    CHECK(balanced(d, r.stage_of_node, S, eps));
    CHECK(r.cut_bytes == cut(d, r.stage_of_node));
    const std::int64_t lin = best_linear_cut(d, S, eps);
    CHECK(r.cut_bytes <= lin);
    // Every op of the training graph has the stage of its owner.
    for (int s : r.stage_of_op) CHECK((s >= 0 && s < S));
    MESSAGE("U-Net S=" << S << ": " << d.num_nodes() << " nodes, ILP " << r.num_variables << " vars / "
                       << r.num_constraints << " rows, " << r.num_fixed_nodes << " fixed, cut " << r.cut_bytes
                       << " B vs linear " << lin << " B, " << r.wall_s << " s, "
                       << solver::ilp_status_name(r.status));
  }
}
