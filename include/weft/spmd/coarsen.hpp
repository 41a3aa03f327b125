#pragma once
// Coarsening for the O2 level (Rhino §4.3), on a StrategyProblem whose first n_ops nodes are
// the ops of a DAG (succ) and whose other nodes (leaf tensors) hang off them.
//
// Critical nodes: ops on the unit-time critical path (earliest start == latest start with unit
// op times and free edges) whose weight (FLOPs) is at least `heavy_fraction` of the heaviest op.
// Segments: the nodes sorted by order_pos, cut after every critical node. Stitching is a DP over
// the strategy of the critical node that ends each segment:
//   F_0 = 0;  F_{k+1}(t) = min over the nodes N_{k+1} of segment k+1 and the strategy s of c_k of
//             F_k(s) + cost(N_{k+1} | c_{k+1} = t, c_k = s, earlier nodes as chosen so far)
// each min an ILP (or exhaustive enumeration when tiny). Edges from N_{k+1} to earlier nodes
// other than c_k are charged against the assignment that is best so far (exact when the graph
// is a chain of segments, an approximation otherwise); edges to later segments are charged when
// those are solved. Memory rows: earlier nodes count as chosen, later nodes at their smallest
// bytes; rows that cannot bind are dropped. Identical sub-problems (same numbers: the repeated
// layers of a transformer) are solved once and reused.
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "weft/spmd/problem.hpp"

namespace weft::spmd {

struct O2Options {
  double time_limit_s = 60;  // per sub-ILP (the stop token bounds the whole of solve_o2)
  double relative_gap = 0;
  bool reuse_repeated = true;
  double heavy_fraction = 0.05;
  // After the DP: sweeps of block-coordinate descent over windows of consecutive segments (each
  // window re-solved exactly with the rest fixed); 0 = off. Cost never increases.
  int refine_sweeps = 4;
  int refine_window = 3;
  // A refinement window that elimination cannot take goes to an ILP only up to this many nodes
  // (larger ones are left as the DP chose). Default: no cap (the large windows, e.g. the
  // vocabulary projection with its backward, are few and matter for the cost).
  int refine_ilp_max_nodes = 1000000;
  // A segment that needs an ILP (binding memory rows, or elimination tables past the limit) is
  // solved once per strategy of its end node (exact DP) only when it is small; else one ILP.
  int per_end_max_strategies = 4;
  int per_end_max_nodes = 40;
  // Largest elimination table (entries) before a segment goes to the ILP instead: elimination
  // is exact, but past ~1e5 entries per table the ILP is faster.
  std::size_t max_table = 100000;
  std::function<void(double)> progress;
  // Deadline and cancellation of the whole O2 solve (every sub-ILP gets it too). A cancel throws
  // weft::Cancelled. A deadline during the DP returns no solution with status Timeout (there is
  // no complete assignment yet); during the refinement it returns the refined-so-far assignment
  // (feasible, never costlier than the DP's) with status Timeout.
  StopToken stop;
  // Non-empty (one strategy per node): no DP, the refinement starts from this assignment (the
  // search refines the plan found without shared-resharding pairs on the problem with them).
  std::vector<int> start;
};

struct O2Stats {
  int segments = 0, reused_segments = 0, ilp_solves = 0, cache_hits = 0;
  int refine_sweeps = 0, refine_moves = 0;
  double dp_seconds = 0, refine_seconds = 0;
  int max_ilp_variables = 0, max_ilp_constraints = 0;
  solver::IlpStatus worst_status = solver::IlpStatus::Optimal;
  double max_gap = 0;
  std::vector<int> critical;
};

// Critical ops (ascending) of a DAG with n_ops nodes.
std::vector<int> critical_nodes(int n_ops, const std::vector<std::vector<int>>& succ,
                                const std::vector<double>& weight, double heavy_fraction);

ProblemSolution solve_o2(const StrategyProblem& p, int n_ops, const std::vector<std::vector<int>>& succ,
                         const std::vector<double>& weight, const std::vector<int>& order_pos,
                         const O2Options& opt, O2Stats* stats = nullptr);

}  // namespace weft::spmd
