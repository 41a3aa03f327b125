#pragma once
// Stage partition, two methods:
//
// 1. partition_dp — Alpa's stage construction (§5.2) over a chain of L blocks. A stage is a run
//    of blocks [i, j] on a submesh m (index into a list of submesh shapes); its cost t(i, j, m)
//    (time of one micro-batch, forward + backward) comes from a callback, called exactly once per
//    (i, j, m). With B micro-batches the pipeline latency is
//        T = Σ_s t_s + (B − 1) · max_s t_s,
//    and the devices of the stages must add up to the cluster's exactly. For each bound t_max
//    over the distinct costs (ascending), a DP gives the least Σ t_s with every t_s <= t_max:
//        G(k, d) = min_{j >= k, m: size(m) <= d, t(k, j, m) <= t_max} t(k, j, m) + G(j + 1, d − size(m)),
//        G(L, 0) = 0,
//    T* = min over t_max of G(0, D) + (B − 1)·t_max; bounds with B·t_max >= best are dropped (no
//    solution whose max is t_max or more can beat it), and the rest are searched by branch and
//    bound on intervals of bounds (G is non-increasing in t_max), which is exact.
//
// 2. partition_ilp — Rhino §5 on the non-linear graph: integer stage per forward op, producers
//    not after consumers, cut bytes per (tensor, destination stage), every stage's compute within
//    (1 ± ε) of total / S, with bound tightening from ancestors' and descendants' compute (see
//    stage_bounds for the derivation, which corrects the paper's upper bound).
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "weft/ir/graph.hpp"
#include "weft/pipeline/grouping.hpp"
#include "weft/pipeline/submesh.hpp"
#include "weft/solver/ilp.hpp"

namespace weft::pipeline {

// ---------------------------------------------------------------- DP on a chain of blocks

struct StageCost {
  double time_s = 0;        // one micro-batch, forward + backward, on that submesh
  double memory_bytes = 0;  // peak per device (informative)
  bool fits_memory = true;  // false: the pair is infeasible (like returning nullopt)
  bool operator==(const StageCost&) const = default;
};

// (first_block, last_block, submesh_index) -> cost, nullopt when the stage cannot run there.
using StageCostFn =
    std::function<std::optional<StageCost>(int first_block, int last_block, int submesh_index)>;

struct DpOptions {
  int num_microbatches = 1;  // B >= 1
  // 0 = exact (every distinct cost is a candidate t_max). r > 0: candidates are thinned to a
  // geometric grid of ratio (1 + r) — T is then within a factor (1 + r) of the optimum.
  double t_max_relative_step = 0;
  int max_stages = 0;  // 0 = no limit; else at most this many stages
  // true: branch and bound over the t_max candidates; false: Alpa's ascending scan of every
  // candidate (same answer, kept for comparison).
  bool branch_and_bound = true;
  double time_limit_s = 60;  // weft::Error when exceeded (no silent partial answer)
};

struct DpStage {
  int first_block = 0, last_block = 0;
  int submesh_index = 0;
  StageCost cost;
  bool operator==(const DpStage&) const = default;
};

struct DpPartition {
  std::vector<DpStage> stages;  // in pipeline order, blocks 0..L-1 covered
  double latency_s = 0;         // Σ t + (B − 1) max t
  double max_stage_s = 0;
  double sum_stage_s = 0;
  int cost_calls = 0;       // callback calls (L(L+1)/2 · #submeshes)
  int t_max_evaluated = 0;  // DP runs
  double wall_s = 0;
  std::string to_string() const;
};

// weft::Error when num_blocks < 1, no submesh, B < 1, a negative/non-finite cost, or when no
// partition uses exactly total_devices (message names L, the sizes and total_devices).
DpPartition partition_dp(int num_blocks, const std::vector<SubmeshShape>& submeshes, int total_devices,
                         const StageCostFn& cost, const DpOptions& options = {});

// Exhaustive oracle for tests: every composition of the chain × every submesh per stage.
// Exponential; weft::Error when num_blocks > 12.
DpPartition partition_dp_exhaustive(int num_blocks, const std::vector<SubmeshShape>& submeshes,
                                    int total_devices, const StageCostFn& cost,
                                    const DpOptions& options = {});

// ---------------------------------------------------------------- ILP on a DAG

// A plain DAG for the stage ILP: nodes with compute, values (tensors) with one producer node,
// consumer nodes and bytes.
struct PartitionDag {
  struct Value {
    int producer = 0;
    std::vector<int> consumers;
    std::int64_t bytes = 0;
    bool operator==(const Value&) const = default;
  };
  std::vector<double> compute;  // per node, >= 0
  std::vector<Value> values;
  std::vector<ir::OpId> op_of_node;  // when built from a graph: the forward op of each node
  int num_nodes() const { return static_cast<int>(compute.size()); }
  void validate() const;  // weft::Error: bad ids, negative numbers, a cycle
  bool operator==(const PartitionDag&) const = default;
};

// Forward ops of a training graph as a DAG: compute = FLOPs of the op and of every op it owns
// (owner_forward_op: backward ops and updates), values = forward activations made by a forward op
// and read by forward ops.
PartitionDag dag_from_graph(const ir::Graph& training_graph);

// Cut bytes of an assignment: Σ over values and distinct consumer stages s != the producer's
// stage of bytes (a tensor sent once to each later stage that reads it).
std::int64_t cut_bytes(const PartitionDag& dag, const std::vector<int>& stage_of_node);
// Per-stage compute of an assignment.
std::vector<double> stage_compute(const PartitionDag& dag, const std::vector<int>& stage_of_node,
                                  int num_stages);
// The assignment is monotone (producer stage <= consumer stage) and every stage's compute lies in
// [(1 − ε)·τ, (1 + ε)·τ], τ = total / S (with a 1e-9 relative slack).
bool feasible_partition(const PartitionDag& dag, const std::vector<int>& stage_of_node, int num_stages,
                        double epsilon);

// Per node, the stages [lower, upper] it may take in any feasible partition (see the derivation
// in partition_ilp.cpp / docs/modules/pipeline.md). With paper_upper = true, the upper bound is
// the one printed in Rhino §5.2 (kept to demonstrate that it cuts off feasible optima).
struct StageBounds {
  std::vector<int> lower, upper;
  int num_fixed() const;  // nodes with lower == upper
};
StageBounds stage_bounds(const PartitionDag& dag, int num_stages, double epsilon, bool paper_upper = false);

struct IlpPartitionOptions {
  int num_stages = 2;
  double epsilon = 0.1;  // balance tolerance, relative to total / S
  bool bound_tightening = true;
  bool paper_upper_bound = false;  // for experiments only: Rhino's printed (wrong) upper bound
  double time_limit_s = 30;
  double relative_gap = 0;
};

struct IlpPartition {
  std::vector<int> stage_of_node;  // per DAG node (empty when no solution)
  std::vector<int> stage_of_op;    // per op of the graph (partition_ilp only; -1 when unowned)
  std::vector<double> stage_flops;
  std::int64_t cut_bytes = 0;
  solver::IlpStatus status = solver::IlpStatus::Error;
  double gap = 0;
  double wall_s = 0;   // model build + solve
  double solve_s = 0;  // CBC only
  int num_variables = 0, num_constraints = 0;
  int num_fixed_nodes = 0;  // nodes whose stage the bounds fix
  bool has_solution() const { return !stage_of_node.empty(); }
  std::string to_string() const;
};

// weft::Error when num_stages < 1 or > nodes, epsilon < 0, or the bounds leave a node no stage
// (then no balanced partition exists: the message names the node). An infeasible or timed-out
// model returns status Infeasible/Timeout with no solution.
IlpPartition partition_dag_ilp(const PartitionDag& dag, const IlpPartitionOptions& options);
IlpPartition partition_ilp(const ir::Graph& training_graph, const IlpPartitionOptions& options);

// Exhaustive oracle: every monotone assignment of <= 14 nodes (weft::Error beyond); least cut
// bytes among the feasible ones (ties: the first in enumeration order), no solution (status
// Infeasible) when none.
IlpPartition partition_dag_exhaustive(const PartitionDag& dag, int num_stages, double epsilon);

}  // namespace weft::pipeline
