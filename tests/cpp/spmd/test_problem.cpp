// StrategyProblem: ILP optimum == exhaustive enumeration on random small problems.
#include <doctest/doctest.h>

#include <cstdlib>
#include <random>

#include "weft/core/error.hpp"
#include "weft/spmd/problem.hpp"

using namespace weft::spmd;

namespace {
StrategyProblem random_problem(std::mt19937& rng, bool memory) {
  StrategyProblem p;
  const int n = 2 + static_cast<int>(rng() % 7);  // 2..8 ops
  std::uniform_real_distribution<double> c(0, 10);
  for (int v = 0; v < n; ++v) {
    const int s = 1 + static_cast<int>(rng() % 4);  // 1..4 strategies
    std::vector<double> cost(s);
    for (auto& x : cost) x = (rng() % 10 == 0) ? kInfCost : std::round(c(rng) * 8) / 8;
    if (std::all_of(cost.begin(), cost.end(), [](double x) { return std::isinf(x); })) cost[0] = 1;
    p.node_cost.push_back(cost);
  }
  // A random DAG (edges i<j with probability ~0.4), parallel edges allowed.
  for (int i = 0; i < n; ++i)
    for (int j = i + 1; j < n; ++j)
      if (rng() % 5 < 2 || (j == i + 1 && rng() % 2)) {
        EdgeCost e{i, j, {}};
        const std::size_t k = p.node_cost[i].size() * p.node_cost[j].size();
        for (std::size_t t = 0; t < k; ++t)
          e.cost.push_back(rng() % 15 == 0 ? kInfCost : std::round(c(rng) * 8) / 8);
        if (rng() % 2)
          std::swap(e.u, e.v), e.cost = [&] {
            std::vector<double> tr(k);
            const std::size_t si = p.node_cost[i].size(), sj = p.node_cost[j].size();
            for (std::size_t a = 0; a < si; ++a)
              for (std::size_t b = 0; b < sj; ++b) tr[b * si + a] = e.cost[a * sj + b];
            return tr;
          }();
        p.edges.push_back(std::move(e));
      }
  if (memory) {
    for (int r = 0; r < 3; ++r) {
      MemoryRow row{"row" + std::to_string(r), std::round(c(rng)), {}};
      for (int v = 0; v < n; ++v)
        if (rng() % 2) {
          MemoryTerm t{v, {}};
          for (std::size_t s = 0; s < p.node_cost[v].size(); ++s) t.bytes.push_back(std::round(c(rng)));
          row.terms.push_back(t);
        }
      p.memory_rows.push_back(row);
    }
    p.memory_limit = 15 + static_cast<double>(rng() % 20);
  }
  return p;
}
}  // namespace

TEST_CASE("spmd problem: ILP equals exhaustive enumeration on 300 random problems") {
  std::mt19937 rng(2024);
  int with_memory = 0, infeasible = 0;
  for (int it = 0; it < 300; ++it) {
    const bool memory = it % 3 == 0;
    const auto p = random_problem(rng, memory);
    const auto truth = solve_exhaustive(p);
    const auto got = solve_ilp(p);
    if (!truth.has_solution()) {
      CHECK_FALSE(got.has_solution());
      CHECK(got.status == weft::solver::IlpStatus::Infeasible);
      ++infeasible;
      continue;
    }
    with_memory += memory;
    REQUIRE(got.has_solution());
    CHECK(got.status == weft::solver::IlpStatus::Optimal);
    CHECK(got.cost == doctest::Approx(truth.cost).epsilon(1e-9));
    const auto ev = evaluate(p, got.choice);
    CHECK(ev.feasible());
    CHECK(ev.cost == doctest::Approx(got.cost));
  }
  CHECK(with_memory > 50);
  CHECK(infeasible > 0);
}

namespace {
// Give node v a new strategy that copies strategy s with costs and bytes that are never lower
// (node cost + d, every edge entry + an amount >= 0, bytes + 0 or 1): s dominates it.
void add_dominated_copy(StrategyProblem& p, int v, int s, std::mt19937& rng) {
  const std::size_t old = p.node_cost[v].size();
  p.node_cost[v].push_back(p.node_cost[v][s] + 0.5 * static_cast<double>(rng() % 2));
  for (auto& e : p.edges) {
    if (e.u != v && e.v != v) continue;
    const std::size_t su = e.u == v ? old : p.node_cost[e.u].size();
    const std::size_t sv = e.v == v ? old : p.node_cost[e.v].size();
    const std::size_t nu = e.u == v ? old + 1 : su, nv = e.v == v ? old + 1 : sv;
    std::vector<double> m(nu * nv);
    for (std::size_t a = 0; a < nu; ++a)
      for (std::size_t b = 0; b < nv; ++b) {
        const std::size_t ia = a == old && e.u == v ? static_cast<std::size_t>(s) : a;
        const std::size_t ib = b == old && e.v == v ? static_cast<std::size_t>(s) : b;
        const bool copy = (e.u == v && a == old) || (e.v == v && b == old);
        m[a * nv + b] = e.cost[ia * sv + ib] + (copy ? 0.25 * static_cast<double>(rng() % 3) : 0.0);
      }
    e.cost = std::move(m);
  }
  for (auto& r : p.memory_rows)
    for (auto& t : r.terms)
      if (t.node == v) t.bytes.push_back(t.bytes[s] + static_cast<double>(rng() % 2));
}
}  // namespace

TEST_CASE("spmd problem: dominated strategies are dropped exactly (ILP = exhaustive, 200 problems)") {
  std::mt19937 rng(77);
  int smaller = 0;
  for (int it = 0; it < 200; ++it) {
    auto p = random_problem(rng, it % 2 == 0);
    for (int v = 0; v < p.num_nodes(); ++v)
      if (rng() % 2) add_dominated_copy(p, v, static_cast<int>(rng() % p.node_cost[v].size()), rng);
    const auto truth = solve_exhaustive(p);
    // Warm start on the dominated copies where there are any (mapped onto their dominators).
    // CBC presolve off: on a few of these models CoinUtils' implied_free_action::presolve leaks
    // 4 KB (LeakSanitizer in CI); the solve is exact either way.
    SolveOptions o;
    o.presolve = false;
    for (int v = 0; v < p.num_nodes(); ++v)
      o.warm_start.push_back(static_cast<int>(p.node_cost[v].size()) - 1);
    const auto got = solve_ilp(p, o);
    SolveOptions plain;
    plain.presolve = false;
    plain.dominance_max_work = 0;  // off
    const auto ref = solve_ilp(p, plain);
    if (!truth.has_solution()) {
      CHECK_FALSE(got.has_solution());
      continue;
    }
    REQUIRE(got.has_solution());
    CHECK(got.status == weft::solver::IlpStatus::Optimal);
    CHECK(got.cost == doctest::Approx(truth.cost).epsilon(1e-9));
    CHECK(evaluate(p, got.choice).feasible());
    REQUIRE(ref.has_solution());
    CHECK(ref.cost == doctest::Approx(truth.cost).epsilon(1e-9));
    smaller += got.ilp_variables < ref.ilp_variables;
  }
  CHECK(smaller > 50);  // the elimination does fire
}

TEST_CASE("spmd problem: evaluation by hand and warm start") {
  StrategyProblem p;
  p.names = {"a", "b"};
  p.node_cost = {{1, 2}, {3, 0.5}};
  p.edges = {{0, 1, {0, 10, 10, 0}}};
  // choices: (0,0)=4, (0,1)=11.5, (1,0)=15, (1,1)=2.5
  auto ev = evaluate(p, {1, 1});
  CHECK(ev.cost == 2.5);
  CHECK(ev.node_cost == 2.5);
  SolveOptions o;
  o.warm_start = {0, 0};
  auto s = solve_ilp(p, o);
  CHECK(s.choice == std::vector<int>{1, 1});
  CHECK(s.cost == 2.5);
  p.memory_rows = {{"peak", 1, {{1, {1, 5}}}}};
  p.memory_limit = 4;
  s = solve_ilp(p);
  CHECK(s.choice == std::vector<int>{0, 0});
  CHECK(evaluate(p, {1, 1}).violations.size() == 1);
  p.memory_limit = 1.5;
  CHECK_FALSE(solve_ilp(p).has_solution());
  p.edges[0].cost.pop_back();
  CHECK_THROWS_AS(solve_ilp(p), weft::Error);
}

#include "weft/spmd/coarsen.hpp"

TEST_CASE("spmd problem: variable elimination equals exhaustive enumeration (200 random problems)") {
  std::mt19937 rng(99);
  for (int it = 0; it < 200; ++it) {
    auto p = random_problem(rng, false);
    const auto truth = solve_exhaustive(p);
    Elimination el(p);
    REQUIRE(el.ok());
    if (!truth.has_solution()) {
      CHECK(std::isinf(el.kept_cost()[0]));
      continue;
    }
    CHECK(el.kept_cost()[0] == doctest::Approx(truth.cost).epsilon(1e-9));
    CHECK(evaluate(p, el.choice_for(0)).cost == doctest::Approx(truth.cost).epsilon(1e-9));
    // Keeping one node: its table is the optimum per strategy.
    const int keep = static_cast<int>(rng() % p.num_nodes());
    Elimination ek(p, keep);
    for (int t = 0; t < static_cast<int>(p.node_cost[keep].size()); ++t) {
      StrategyProblem q = p;
      for (int s = 0; s < static_cast<int>(q.node_cost[keep].size()); ++s)
        if (s != t) q.node_cost[keep][s] = kInfCost;
      const auto tq = solve_exhaustive(q);
      if (!tq.has_solution()) {
        CHECK(std::isinf(ek.kept_cost()[t]));
      } else {
        CHECK(ek.kept_cost()[t] == doctest::Approx(tq.cost).epsilon(1e-9));
        CHECK(evaluate(p, ek.choice_for(t)).cost == doctest::Approx(tq.cost).epsilon(1e-9));
      }
    }
  }
}

TEST_CASE("spmd problem: O2 segment DP equals exhaustive on random chains (120 cases)") {
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> c(0, 10);
  for (int it = 0; it < 120; ++it) {
    // A chain of ops 0 -> 1 -> ... -> n-1, each with 0..1 leaf nodes hanging off it, random
    // weights (some heavy = critical); with and without memory rows.
    StrategyProblem p;
    const int n = 3 + static_cast<int>(rng() % 5);
    std::vector<std::vector<int>> succ(n);
    std::vector<double> weight;
    std::vector<int> pos;
    for (int v = 0; v < n; ++v) {
      p.node_cost.push_back({});
      const int s = 1 + static_cast<int>(rng() % 4);
      for (int k = 0; k < s; ++k) p.node_cost.back().push_back(std::round(c(rng) * 4) / 4);
      weight.push_back(rng() % 2 ? 100.0 : 1.0);
      pos.push_back(v);
      if (v + 1 < n) succ[v].push_back(v + 1);
    }
    auto edge = [&](int u, int v) {
      EdgeCost e{u, v, {}};
      for (std::size_t k = 0; k < p.node_cost[u].size() * p.node_cost[v].size(); ++k)
        e.cost.push_back(std::round(c(rng) * 4) / 4);
      p.edges.push_back(std::move(e));
    };
    for (int v = 0; v + 1 < n; ++v) edge(v, v + 1);
    for (int v = 0; v < n; ++v)
      if (rng() % 2) {  // a leaf read by op v
        const int l = p.num_nodes();
        p.node_cost.push_back({0, 0.5, 1});
        weight.push_back(0);
        pos.push_back(v);
        edge(l, v);
      }
    O2Options o;
    O2Stats st;
    const auto got = solve_o2(p, n, succ, weight, pos, o, &st);
    const auto truth = solve_exhaustive(p);
    REQUIRE(got.has_solution());
    CHECK(got.cost == doctest::Approx(truth.cost).epsilon(1e-9));
    CHECK(st.segments >= 1);
  }
}

TEST_CASE("spmd problem: elimination after the exact reductions = exhaustive (300 problems)") {
  // Separable edges (folded into node costs, which can turn them negative) and dominated copies
  // are mixed in so every reduction fires; the solve must still equal brute force.
  std::mt19937 rng(4242);
  int separable = 0;
  for (int it = 0; it < 300; ++it) {
    auto p = random_problem(rng, false);
    for (int v = 0; v < p.num_nodes(); ++v)
      if (rng() % 3 == 0) add_dominated_copy(p, v, static_cast<int>(rng() % p.node_cost[v].size()), rng);
    if (p.num_nodes() >= 2 && rng() % 2) {  // a separable matrix a(s) + b(t) with a(s) < 0
      const int u = 0, v = p.num_nodes() - 1;
      EdgeCost e{u, v, {}};
      for (std::size_t s = 0; s < p.node_cost[u].size(); ++s)
        for (std::size_t t = 0; t < p.node_cost[v].size(); ++t)
          e.cost.push_back(5.0 - static_cast<double>(s) + 0.25 * static_cast<double>(t));
      p.edges.push_back(std::move(e));
      ++separable;
    }
    const auto truth = solve_exhaustive(p);
    const auto got = solve_reduced_elimination(p);
    REQUIRE(got.has_value());  // tiny problems always fit
    if (!truth.has_solution()) {
      CHECK(got->status == weft::solver::IlpStatus::Infeasible);
      CHECK_FALSE(got->has_solution());
      continue;
    }
    REQUIRE(got->has_solution());
    CHECK(got->status == weft::solver::IlpStatus::Optimal);
    CHECK(got->cost == doctest::Approx(truth.cost).epsilon(1e-12));
    CHECK(evaluate(p, got->choice).cost == doctest::Approx(truth.cost).epsilon(1e-12));
  }
  CHECK(separable > 100);
  // Too wide for the table limit: refused (nullopt), not a wrong answer.
  std::mt19937 r2(9);
  StrategyProblem wide;
  for (int v = 0; v < 6; ++v) wide.node_cost.push_back(std::vector<double>(8, 1.0));
  for (int a = 0; a < 6; ++a)
    for (int b = a + 1; b < 6; ++b) {
      EdgeCost e{a, b, {}};
      for (int k = 0; k < 64; ++k) e.cost.push_back(static_cast<double>(r2() % 7));
      wide.edges.push_back(std::move(e));
    }
  CHECK_FALSE(solve_reduced_elimination(wide, 100).has_value());
  CHECK(solve_reduced_elimination(wide, 1000000).has_value());
  wide.memory_rows.push_back({"r", 0, {{0, std::vector<double>(8, 1.0)}}});
  wide.memory_limit = 10;
  CHECK_THROWS_AS(solve_reduced_elimination(wide), weft::Error);
}

TEST_CASE("spmd problem: following folds chains and leaves exactly (ILP size, optimum kept)") {
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> c(0, 10);
  auto random_node = [&](int s) {
    std::vector<double> v(s);
    for (auto& x : v) x = std::round(c(rng) * 8) / 8;
    return v;
  };
  auto random_edge = [&](const StrategyProblem& p, int a, int b) {
    EdgeCost e{a, b, {}};
    for (std::size_t k = 0; k < p.node_cost[a].size() * p.node_cost[b].size(); ++k)
      e.cost.push_back(rng() % 12 == 0 ? kInfCost : std::round(c(rng) * 8) / 8);
    return e;
  };
  for (int it = 0; it < 50; ++it) {
    // A chain of 7 nodes (an elementwise chain): every node has at most two neighbours, so all
    // fold away and the ILP is empty.
    StrategyProblem chain;
    for (int v = 0; v < 7; ++v) chain.node_cost.push_back(random_node(2 + static_cast<int>(rng() % 3)));
    for (int v = 0; v + 1 < 7; ++v) chain.edges.push_back(random_edge(chain, v, v + 1));
    const auto truth = solve_exhaustive(chain);
    const auto got = solve_ilp(chain);
    CHECK(got.has_solution() == truth.has_solution());
    if (truth.has_solution()) {
      CHECK(got.ilp_variables == 0);
      CHECK(got.cost == doctest::Approx(truth.cost).epsilon(1e-12));
      CHECK(evaluate(chain, got.choice).cost == doctest::Approx(truth.cost).epsilon(1e-12));
    }
    // A 4-clique (every node has three neighbours) with a pendant leaf on each clique node: the
    // leaves fold, the clique stays an ILP.
    StrategyProblem k4;
    for (int v = 0; v < 8; ++v) k4.node_cost.push_back(random_node(3));
    for (int a = 0; a < 4; ++a)
      for (int b = a + 1; b < 4; ++b) k4.edges.push_back(random_edge(k4, a, b));
    for (int v = 0; v < 4; ++v) k4.edges.push_back(random_edge(k4, v, v + 4));
    const auto t2 = solve_exhaustive(k4);
    SolveOptions no_dominance;
    no_dominance.dominance_max_work = 0;  // keep all 3 strategies of the clique nodes
    const auto g2 = solve_ilp(k4, no_dominance);
    CHECK(g2.has_solution() == t2.has_solution());
    if (t2.has_solution()) {
      CHECK(g2.cost == doctest::Approx(t2.cost).epsilon(1e-12));
      CHECK(g2.ilp_variables > 0);
      CHECK(g2.ilp_variables <= 4 * 3 + 6 * 9);  // the clique's binaries and edge variables only
    }
  }
}
