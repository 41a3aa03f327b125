#pragma once
// Lowering: a plan's layouts -> a lower::Program (per-rank instruction lists, program.hpp).
//
// One SPMD stage (lower_spmd): every op of the graph, in topological order, runs on local tiles
// under its strategy (spmd::make_strategy of its mesh-axis -> factor assignment); before it, each
// operand whose current layout differs from the one the strategy needs is resharded by the
// cheapest single-axis collective sequence (sharding::ReshardPlanner on the cluster's α-β links
// of the mesh: the same planner and links the SPMD search priced the edge with), each layout of a
// tensor made once and shared by its readers. Vocab-parallel cross-entropy is lowered to its
// statistics protocol (two all-reduces over the axes splitting the classes). At the end of the
// step each updated parameter / optimizer state is resharded to its leaf's layout and copied
// into the leaf (the loop-carried edge of the search). Buffers are freed after their last use,
// except the leaves, the loss and the parameters' gradients (results of the step).
#include <cstdint>
#include <map>
#include <vector>

#include "weft/cluster/cluster.hpp"
#include "weft/cluster/device_mesh.hpp"
#include "weft/ir/graph.hpp"
#include "weft/lower/program.hpp"
#include "weft/plan/plan.hpp"
#include "weft/sharding/sharding_spec.hpp"
#include "weft/spmd/search.hpp"
#include "weft/spmd/strategy.hpp"

namespace weft::lower {

// The layout of one SPMD stage: the mesh (its device ids give the ranks' devices; rank = position
// in the mesh, row-major), per op of the graph its axis assignment (one AxisAssign per mesh axis),
// and the spec of every leaf tensor an op reads (a leaf missing here is replicated).
struct SpmdLayout {
  std::vector<std::vector<spmd::AxisAssign>> op_axes;  // per op id
  std::map<ir::TensorId, sharding::ShardingSpec> leaf_specs;
};

// The loop-carried state of a training step, as the SPMD search prices it: the k-th graph-output
// result of an op that reads state leaves (parameters, optimizer states) replaces the k-th state
// leaf it reads (Adam: (p, g, m, v) -> (p', m', v'); SGD: (p, g) -> p'). Pairs (result, leaf).
std::vector<std::pair<ir::TensorId, ir::TensorId>> state_carries(const ir::Graph& g);

// The layout an SPMD search chose.
SpmdLayout layout_of(const ir::Graph& g, const spmd::SpmdPlan& plan);

// Data parallelism and gradient accumulation of one stage. With replicas > 1 the mesh passed to
// lower_spmd is [replicas] + the SPMD mesh (the layout is on the SPMD mesh; every spec gets R on the
// replica axis); each replica runs `microbatches` micro-batches of the graph's batch: forward and
// backward per micro-batch (the Input leaves loaded with that micro-batch's samples), the
// gradients read by the update accumulated, scaled by 1/(microbatches·replicas) and, labelled
// P(sum) on the replica axis, resharded to the update's layout — the replicas' gradient
// all-reduce (or reduce-scatter) — then the update once per step. The loss is accumulated the same way.
struct StageOptions {
  int replicas = 1;
  int microbatches = 1;
};

// Lowers one SPMD stage. Throws weft::Error naming the op for an assignment that is not a valid
// strategy, a leaf spec of the wrong shape/mesh, or an Opaque op.
Program lower_spmd(const ir::Graph& g, const cluster::Cluster& cluster, const cluster::DeviceMesh& mesh,
                   const SpmdLayout& layout, const StageOptions& options = {});

// Lowers a plan made by plan::make_plan for the training step `step` (the global-batch graph the
// plan was made for) on `cluster`. Supported today: one stage, one micro-batch, one replica (the
// "spmd" plans); other plans throw weft::Error saying what is not lowered yet. A plan without the
// stage layouts (made before lowering existed) throws weft::Error asking to re-plan.
Program lower(const plan::Plan& plan, const ir::Graph& step, const cluster::Cluster& cluster);

}  // namespace weft::lower
