#pragma once
// The SPMD strategy problem as plain numbers (the XLA auto-sharding solver request): nodes with
// strategy costs, edges with pairwise cost matrices, memory rows, a memory budget. Solved as an
// ILP (Rhino §4.2 / Alpa), re-scored by an independent evaluator, and by exhaustive enumeration
// in tests.
//
//   minimise   Σ_v Σ_s c_v(s) x_vs + Σ_(u,v) Σ_{s,t} M_uv(s,t) e_uv,st
//   s.t.       Σ_s x_vs = 1                          one strategy per node
//              Σ_t e_uv,st = x_us,  Σ_s e_uv,st = x_vt   (Alpa's tight linearisation of x_us·x_vt;
//                                                      with binary x these force e = x_us x_vt,
//                                                      so e can stay continuous in [0, 1])
//              k_r + Σ_v Σ_s m_rv(s) x_vs <= limit   one row per live set (peak memory per device)
//              x ∈ {0,1}, e ∈ [0,1]; e_uv,st = 0 where M_uv(s,t) = ∞
// Preprocessing (exact): strategies with infinite node cost are dropped, parallel edges merged,
// separable matrices M(s,t) = a(s) + b(t) folded into node costs, all-zero edges dropped.
#include <cstddef>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "weft/solver/ilp.hpp"

namespace weft::spmd {

inline constexpr double kInfCost = std::numeric_limits<double>::infinity();

struct EdgeCost {
  int u = 0, v = 0;
  std::vector<double> cost;  // row-major [strategy of u][strategy of v]
};

struct MemoryTerm {
  int node = 0;
  std::vector<double> bytes;  // per strategy of node
};

struct MemoryRow {
  std::string label;
  double constant = 0;
  std::vector<MemoryTerm> terms;
};

struct StrategyProblem {
  std::vector<std::string> names;              // per node (optional, for messages)
  std::vector<std::vector<double>> node_cost;  // [node][strategy], kInfCost = forbidden
  std::vector<EdgeCost> edges;
  std::vector<MemoryRow> memory_rows;
  double memory_limit = kInfCost;
  int num_nodes() const { return static_cast<int>(node_cost.size()); }
  void validate() const;  // throws weft::Error naming the bad node/edge/row
};

struct Evaluation {
  double cost = 0;  // node + edge
  double node_cost = 0;
  double edge_cost = 0;
  double peak_memory = 0;  // max over rows
  int peak_row = -1;
  std::vector<std::string> violations;  // memory rows over the limit, forbidden choices
  bool feasible() const { return violations.empty(); }
};

// Independent re-scoring of a choice (one strategy index per node).
Evaluation evaluate(const StrategyProblem& p, const std::vector<int>& choice);

struct SolveOptions {
  double time_limit_s = 60;
  double relative_gap = 0;
  std::vector<int> warm_start;  // a choice per node (optional)
  // Dominated-strategy elimination before the ILP (exact) is skipped above this many
  // (strategy pair x neighbour strategy) comparisons.
  double dominance_max_work = 2e8;
  // CBC presolve and integer preprocessing; O2 turns both off on sub-problems without memory
  // rows, where they find little (one-hot rows and their linearisation) and cost more than the
  // solve (GPT h512 on 2x4: 96-layer O2 3.1 -> 2.5 s, the same plans).
  bool presolve = true;
  bool preprocess = true;
  // The caller's deadline and cancellation, on top of time_limit_s: a cancel throws
  // weft::Cancelled; a deadline gives status Timeout with the best choice found (at worst the
  // greedy warm start), which is also what a call made after the deadline returns at once.
  StopToken stop;
};

struct ProblemSolution {
  std::vector<int> choice;  // empty when no feasible solution was found
  double cost = 0;
  solver::IlpStatus status = solver::IlpStatus::Error;
  double gap = 0;
  int ilp_variables = 0, ilp_constraints = 0;
  double wall_s = 0;
  bool has_solution() const { return !choice.empty(); }
};

ProblemSolution solve_ilp(const StrategyProblem& p, const SolveOptions& opt = {});
// Exhaustive enumeration (tests); throws weft::Error past max_combinations.
ProblemSolution solve_exhaustive(const StrategyProblem& p, std::size_t max_combinations = 1000000);

}  // namespace weft::spmd

namespace weft::spmd {

// Exact min-sum variable elimination (bucket elimination) for problems without memory rows:
// eliminate nodes in greedy min-fill-size order, each step replacing the factors that touch a
// node v by  f(N) = min_{s_v} Σ factors(v, N);  back-substitute in reverse. Cost is exponential
// only in the induced width; gives up (returns false) when a table would exceed max_table
// entries. `keep` (optional, -1 = none): a node left uneliminated; then `kept_cost[t]` = the
// optimum with keep = t and `choice_for(t)` its assignment.
class Elimination {
 public:
  Elimination(const StrategyProblem& p, int keep = -1, std::size_t max_table = 4000000);
  bool ok() const { return ok_; }
  const std::vector<double>& kept_cost() const { return kept_; }  // size 1 when keep < 0
  std::vector<int> choice_for(int keep_value) const;

 private:
  struct Factor {
    std::vector<int> vars;  // ascending node ids
    std::vector<double> table;
  };
  double eval(const Factor& f, const std::vector<int>& x) const;
  const StrategyProblem& p_;
  int keep_;
  bool ok_ = false;
  std::vector<int> order_;                 // eliminated nodes
  std::vector<std::vector<Factor>> used_;  // per eliminated node: the factors combined
  std::vector<double> kept_;
};

// Elimination after solve_ilp's exact reductions (dominated strategies dropped, parallel edges
// merged, separable matrices folded into node costs): the reduced tables are far smaller, so it
// takes problems whose raw tables are too large. No memory rows. Optimal (or Infeasible), or
// nullopt when a table would still exceed max_table.
std::optional<ProblemSolution> solve_reduced_elimination(const StrategyProblem& p,
                                                         std::size_t max_table = 4000000,
                                                         double dominance_max_work = 2e8);

// Solve by elimination when there are no memory rows and it fits; else by ILP.
ProblemSolution solve_auto(const StrategyProblem& p, const SolveOptions& opt = {});

}  // namespace weft::spmd
