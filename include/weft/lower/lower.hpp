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
#include <string>
#include <vector>

#include "weft/cluster/cluster.hpp"
#include "weft/cluster/device_mesh.hpp"
#include "weft/ir/graph.hpp"
#include "weft/lower/program.hpp"
#include "weft/plan/plan.hpp"
#include "weft/reshard/plan.hpp"
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

// The layout an SPMD search chose.
SpmdLayout layout_of(const ir::Graph& g, const spmd::SpmdPlan& plan);
// A random valid layout of `g` on `mesh`: every op a random strategy of its index map, every leaf
// a random non-partial spec (a pure function of the seed). For stress tests of the lowering and
// the executors: layouts no search would choose move data with every collective kind.
SpmdLayout random_layout(const ir::Graph& g, const std::vector<std::int64_t>& mesh, std::uint32_t seed);

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
  double grad_bucket_bytes = 25e6;  // PipelineOptions::grad_bucket_bytes
};

// Lowers one SPMD stage. Throws weft::Error naming the op for an assignment that is not a valid
// strategy, a leaf spec of the wrong shape/mesh, or an Opaque op.
Program lower_spmd(const ir::Graph& g, const cluster::Cluster& cluster, const cluster::DeviceMesh& mesh,
                   const SpmdLayout& layout, const StageOptions& options = {});

// One stage of a pipeline: its mesh ([replicas] + the SPMD mesh when replicas > 1; its devices are
// the stage's ranks, row-major), the ops of the graph it runs, and their layout on its SPMD mesh
// (op_axes indexed by op id of the whole graph; the entries of other stages' ops are not read).
struct PipelineStage {
  cluster::DeviceMesh mesh;
  std::vector<ir::OpId> ops;
  SpmdLayout layout;
  // Activation recomputation (plan::Stage::recompute): per op of the graph, the unit its forward
  // is re-made with (full: its layer-grouping block; selective: its attention core; -1: never
  // re-made); empty = no recomputation. The forward keeps what a unit reads from outside it (the
  // checkpoints: what the stage received or loaded, other units' results) and frees the rest at
  // its last use; in the backward a unit's forward instructions run again (no transfers) right
  // before the first backward instruction that reads one of its results, so one unit is re-made
  // at a time, as the planner prices it. Same values, fewer activations held.
  std::vector<int> recompute_unit;
  // ZeRO across the data-parallel replicas (plan::Stage::zero; needs PipelineOptions::replicas > 1):
  // >= 1 runs each optimizer update on its own shard along the replica axis (the first strategy on
  // the stage's whole mesh that keeps the op's SPMD layout and splits a factor along that axis)
  // and stores the optimizer states it reads (master copy, moments) in that shard only; the
  // resharding then makes ZeRO's collectives: the replicas' partial gradient mean reduce-scattered
  // into the update, the new parameter all-gathered into its replicated leaf. Level 2 also
  // reduce-scatters each micro-batch's gradient into a sharded accumulator as soon as it is made;
  // level 3 also stores each parameter sharded and gathers it before each use (forward, backward,
  // a recomputed forward), freed after (docs/modules/lower.md).
  int zero = 0;
  // Per-block levels (plan::Stage::zero_blocks): per op of the graph the level its update runs at
  // (an update op's level decides its parameter's, gradient's and states' form); empty = `zero`.
  std::vector<int> zero_level;
  // FSDP units (plan::Plan::num_blocks' layer-grouping blocks, as lower() passes them): per op of
  // the graph its unit. Under ZeRO-3 the parameters a phase gathers are gathered per run of one
  // unit's ops, as one bucket, and the next run's bucket is issued before this run's compute
  // (prefetch depth 1); empty = each op its own unit. Only with grad_bucket_bytes > 0 (0: every
  // ZeRO collective one per tensor, where the op needs it).
  std::vector<int> zero_unit;
};

// How a tensor made in stage from_stage travels to stage to_stage: it leaves in src_spec (on the
// producer's SPMD mesh; a partial placement is reduced on that mesh first) and arrives in dst_spec
// (on the consumer's SPMD mesh), replica r of the producer sending to replica r of the consumer.
// A crossing without one leaves in the producer's layout and arrives in the same spec (equal SPMD
// mesh shapes) or replicated.
struct CrossStageSpec {
  ir::TensorId tensor = -1;
  int from_stage = 0, to_stage = 0;
  sharding::ShardingSpec src_spec, dst_spec;
};

// Broadcast transfers, senders balanced largest first (deterministic and fast on big meshes).
reshard::PlanOptions default_transfer_options();

struct PipelineOptions {
  int replicas = 1;               // data-parallel replicas of the whole pipeline (mesh axis 0 of every stage)
  int microbatches = 1;           // per step and replica
  std::string schedule = "1f1b";  // schedule::make_schedule kinds but "interleaved" (a device runs one stage)
  int schedule_k = 1;             // kFkB group size
  // Uneven data parallelism: samples per micro-batch of each replica (size = replicas; the graph is
  // at their maximum). The replicas' accumulated gradients and losses are weighted by their share
  // of the samples before the all-reduce. Empty: every replica runs the graph's batch.
  std::vector<std::int64_t> replica_microbatch;
  // Uneven tensor split (one stage on a 1-D mesh): device i's fraction of every dim a spec shards
  // (Program StageMesh::split_fraction). Empty: even tiles.
  std::vector<double> split_fraction;
  reshard::PlanOptions transfers = default_transfer_options();  // cross-stage transfer plans
  // Gradient buckets (DDP's flat buckets; plan::PlanOptions prices the same): the replicas'
  // gradient all-reduces of a stage are grouped, in the order their gradients become final, into
  // buckets of at least this many bytes of local tile (the last one smaller), and each bucket is
  // issued right after the last of its gradients is final — inside the last micro-batch's
  // backward — so it overlaps the rest of the backward. 1: a bucket per gradient; 0: no buckets
  // (each all-reduce where the update needs it). ZeRO's collectives follow it too: ZeRO-1's
  // once-per-step reduce-scatters are such buckets; ZeRO-2/3's per-micro-batch reduce-scatters are
  // grouped the same way in each micro-batch's backward; ZeRO-1/2's end-of-step all-gathers of the
  // new parameters in buckets of this size, each after its last update; ZeRO-3's gathers per unit
  // (PipelineStage::zero_unit) with the next unit's prefetched. 0: none of these.
  double grad_bucket_bytes = 25e6;
};

// Lowers a pipeline: every rank runs its stage's ops in the schedule's order — F / B (/ W under
// zb_h1, whose W phase holds the weight-gradient ops) of micro-batch m on micro-batch m's own
// buffers — then the update once per step. Tensors crossing stages are sent after the phase that
// makes them and received before the phase that first reads them, by the transfers of a
// reshard::plan per (stage pair, phase pair, replica). A tied parameter (a state leaf read by
// several stages) is updated where its update op is, and the new value is sent to the other
// stages' copies at the end of the step. Throws weft::Error naming the op / tensor / stage for an
// invalid layout, an op in no stage or in two, a device in two stages, or data that flows against
// the schedule's order.
Program lower_pipeline(const ir::Graph& g, const cluster::Cluster& cluster,
                       const std::vector<PipelineStage>& stages, const std::vector<CrossStageSpec>& cross,
                       const PipelineOptions& options);

// Lowers a plan made by plan::make_plan (or layout_plan / megatron_plan / data_parallel_plan) for
// the training step `step` (the global-batch graph the plan was made for) on `cluster`: its stages
// with their recorded layouts on the per-micro-batch graph, its cross-stage tensors in the specs
// the planner costed, its schedule, micro-batches and replicas. Not lowered yet (weft::Error saying
// so): nothing. The uneven tensor split gives each device its proportional piece of every sharded
// dim (the specs stay the even ones). Uneven replica shares run each replica's graph at its share (a
// device with no share is left out); the interleaved schedule deals each stage's ops into
// schedule_v chunks, the model's k-th chunk on the devices of stage k mod D (Megatron's
// assignment; the planner approximates it as 1/v of each stage's work). A plan without
// the stage layouts (made before lowering existed) throws weft::Error asking to re-plan.
Program lower(const plan::Plan& plan, const ir::Graph& step, const cluster::Cluster& cluster);

// The program carries out `plan` (issue 38: counts consistent with the plan): the plan's graph
// fingerprint is the program's training step's; as many stages; per stage the plan's devices, its
// micro-batches, micro-batch size and replicas (uneven shares: the replicas with a share, each at
// its share), and the plan's schedule when there are several stages. lower() ends with it;
// verify(program, step, plan) runs it after verify(program, step). weft::Error naming the field.
void check_against_plan(const Program& program, const plan::Plan& plan);
void verify(const Program& program, const ir::Graph& step, const plan::Plan& plan);

// Ada-Grouper at run time: one program per kFkB group size of the plan's adaptive policy
// (Plan::adaptive; one per frontier point, in frontier order, with the windows that run it; a
// point no window of this trace picks is lowered too, for when the network changes). Point (k, b) is the
// plan's layout at micro-batch size b (per replica) under kFkB with group size k (1F1B for k = 1),
// per_replica / b micro-batches; a runtime switches program at a window boundary (between steps:
// every program holds the same parameters and optimizer states in the same layouts). weft::Error
// when the plan has no policy or a point's micro-batch size does not divide a layout's split.
struct AdaptiveProgram {
  int k = 1;
  std::int64_t microbatch_size = 1;
  int num_microbatches = 1;
  std::vector<int> windows;  // indices into AdaptivePolicy::windows that run this program
  Program program;
};
std::vector<AdaptiveProgram> lower_adaptive(const plan::Plan& plan, const ir::Graph& step,
                                            const cluster::Cluster& cluster);
// The same for a policy computed apart (plan::adaptive_policy of this plan).
std::vector<AdaptiveProgram> lower_adaptive(const plan::Plan& plan, const plan::AdaptivePolicy& policy,
                                            const ir::Graph& step, const cluster::Cluster& cluster);

}  // namespace weft::lower
