#pragma once
// plan::Plan — the planner's answer for one (training graph, cluster): the pipeline stages (blocks,
// ops, submesh devices, logical mesh, parameter sharding specs, per-micro-batch times, memory),
// the schedule and micro-batching, the tensors that cross stages with their resharding plans, and
// the predictions (step time from the event simulator, throughput, MFU, peak memory per device),
// plus the alternatives the planner compared. A plain value: JSON round trip is exact, and
// resimulate() recomputes the step time from the stored stage times alone.
//
// Conventions. The training graph is ONE STEP of the global batch B (its Input leaves' dim 0). A
// step runs num_microbatches micro-batches on each of data_parallel replicas of the pipeline, so
// B = num_microbatches × data_parallel × microbatch_size (the planner costs the micro-batch with
// plan::rebatch). Times are seconds, memory bytes per device. A stage's devices list every replica
// (replica-major); with data_parallel > 1 its mesh_shape starts with the replica axis and the
// parameter specs start with "R" on it. The gradient all-reduce across replicas is part of
// optimizer_time.
// Per stage and micro-batch: forward_time = F, backward_time = B (input + weight gradients; the
// split schedules take weight_time = W out of it), optimizer_time = the parameter update once per
// step. send_time of a boundary = simulated time of its resharding plan (reshard module), which the
// simulator's link reproduces exactly (bandwidth = bytes / send_time).
// For lowering to per-device programs, a stage also records what its SPMD searches chose, on its
// SPMD mesh (mesh_shape without the replica axis): every op's layout (OpLayout) and the spec of
// every leaf tensor it reads (TensorLayout).
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "weft/plan/adaptive.hpp"
#include "weft/schedule/schedule.hpp"
#include "weft/sim/simulator.hpp"

namespace weft::plan {

struct ParamSpec {
  std::string name;
  std::vector<std::int64_t> shape;
  std::string spec;  // sharding::ShardingSpec text on the stage's logical mesh, e.g. "S(1) R"
  double bytes_per_device = 0;
  bool operator==(const ParamSpec&) const = default;
};

// How the SPMD search of a stage laid out one op of the per-micro-batch training graph
// (plan::rebatch(step, microbatch_size)): per axis of the stage's SPMD mesh (mesh_shape without
// the leading replica axis when data_parallel > 1), the index-map factor of the op that the axis
// splits (-1 = replicated along it) and its inner stride (0 = the default, maximum stride).
struct OpLayout {
  std::string op;                           // op name in the training graph
  std::vector<int> factors;                 // per SPMD mesh axis
  std::vector<std::int64_t> inner_strides;  // per SPMD mesh axis
  bool operator==(const OpLayout&) const = default;
};
// The spec the SPMD search chose for a leaf tensor a stage reads (parameters, optimizer states,
// inputs, constants), on the stage's SPMD mesh (same mesh as OpLayout).
struct TensorLayout {
  std::string tensor;
  std::string spec;  // sharding::ShardingSpec text
  bool operator==(const TensorLayout&) const = default;
};

// A stage's collectives across its data-parallel replicas (and its SPMD mesh's gradient
// synchronisation), seconds at nominal bandwidth per logical pipeline stage, and what the stage's
// times hold of them by the planner's closed-form overlap rule (zero.hpp). pipeline_of() takes
// those parts out of the times and lets the simulator run the collectives on each device's
// communication stream (sim::ReplicaCollectives), where they contend with each other and a
// bandwidth trace slows them. Empty (no collectives) in plans made before, and by the
// heterogeneous planners: their times keep the closed form.
struct ReplicaComm {
  sim::ReplicaCollectives collectives;
  double in_forward = 0, in_backward = 0, in_optimizer = 0;
  bool operator==(const ReplicaComm&) const = default;
};

struct Stage {
  int index = 0;
  int first_block = 0, last_block = 0;   // inclusive range of layer-grouping blocks
  std::vector<std::string> ops;          // op names of the training graph, ascending op id
  std::vector<int> devices;              // device ids, row-major over mesh_shape
  std::vector<std::int64_t> mesh_shape;  // logical mesh the SPMD search ran on
  std::vector<ParamSpec> params;
  // Every op of the stage, ascending op id; empty in plans made before lowering existed.
  std::vector<OpLayout> op_layouts;
  std::vector<TensorLayout> leaf_specs;                                             // sorted by tensor name
  double forward_time = 0, backward_time = 0, weight_time = 0, optimizer_time = 0;  // see header
  double compute_time = 0, comm_time = 0;  // per micro-batch (F + B), roofline / collectives
  double static_memory = 0;                // params + grads + optimizer states per device
  double activation_memory = 0;            // saved activations per in-flight micro-batch
  double transient_memory = 0;             // working set of one micro-batch beyond the two above
  int in_flight = 0;                       // peak in-flight micro-batches under the schedule
  double peak_memory = 0;                  // static + in_flight × activation + transient
  // Activation recomputation of the stage: "none", "selective" or "full" (planner.hpp, Recompute),
  // the strongest mode any of its blocks uses. backward_time includes the recomputed forward;
  // activation_memory is what stays saved.
  std::string recompute = "none";
  // Per-block modes (layer-grouping blocks in the grouping's own numbering: Plan's num_blocks,
  // pipeline::group_layers) where the stage does not run `recompute` on every block; both empty:
  // `recompute` on every block of the stage. The planner takes per-block modes when they are
  // enough to fit and cheaper (Megatron's "block" recomputation; selective on some blocks).
  //   recompute_blocks: with "full", the blocks recomputed whole;
  //   selective_blocks: the blocks whose attention cores are re-made: with "selective" these only,
  //   with "full" beside a non-empty recompute_blocks (disjoint from it).
  // Blocks in neither list keep their activations.
  std::vector<int> recompute_blocks;
  std::vector<int> selective_blocks;
  // Sharded data parallelism across the plan's data_parallel replicas (zero.hpp): ZeRO level 0..3
  // and the replicas of one shard group (zero_group = data_parallel: fully sharded; fewer: hybrid,
  // the groups replicate each other; 1 with level 0). static_memory, the times and transient_memory
  // include what the level keeps and moves.
  int zero = 0;
  int zero_group = 1;
  // Per-block levels: these layer-grouping blocks (the grouping's numbering, as recompute_blocks)
  // at ZeRO-3 — their parameters stored sharded and gathered per use —, the stage's others at
  // `zero` (1 or 2); empty = `zero` for every block.
  std::vector<int> zero_blocks;
  ReplicaComm replica;  // the collectives the simulator runs on the devices' communication streams
  bool operator==(const Stage&) const = default;
};

// One tensor crossing a stage boundary (forward activation i → i+1, or its gradient i+1 → i, or a
// non-adjacent one such as a skip connection, the gradient contribution to a tied embedding or the
// tied embedding's updated value).
struct CrossTensor {
  std::string name;
  int from_stage = 0, to_stage = 0;
  std::vector<std::int64_t> shape;
  std::string dtype;
  std::int64_t bytes = 0;  // whole tensor
  std::string src_spec, dst_spec;
  double reshard_time = 0;  // reshard::plan simulated completion time (alone)
  double lower_bound = 0;   // reshard::lower_bound
  std::string reshard_summary;
  // Sent once per step, not per micro-batch: a gradient contribution that only a parameter's
  // gradient sum reads on the receiving stage (accumulated, then sent), or a tied parameter's new
  // value (`refresh`: from the stage that updates it to another stage that reads it).
  bool per_step = false;
  bool refresh = false;
  bool operator==(const CrossTensor&) const = default;
};

struct Alternative {
  std::string strategy;  // "spmd", "pipeline", "megatron t=4 p=2 d=2", ...
  std::string layout;    // e.g. "2 stages: [0-7]@1x8(2,4) [8-15]@1x8(8)"
  double step_time = 0;  // 0 when infeasible
  double peak_memory = 0;
  bool feasible = true;
  std::string note;  // why infeasible, or what else is worth knowing
  bool operator==(const Alternative&) const = default;
};

struct Plan {
  std::string model;     // graph name
  // ir::graph_fingerprint of the training graph the plan was made for (lower refuses another
  // graph, naming both); empty in plans written before fingerprints (not checked then).
  std::string graph_fingerprint;
  std::string cluster;   // Cluster::to_string()
  std::string strategy;  // "spmd" (one stage on the whole cluster), "pipeline", or a baseline name
  std::string schedule;  // schedule kind: "1f1b", "gpipe", "kfkb", "eager_1f1b", "interleaved", "zb_h1"
  int schedule_k = 1;    // kFkB group size
  int schedule_v = 1;    // interleaved virtual stages
  int num_microbatches = 1;
  std::int64_t microbatch_size = 0;  // samples per micro-batch (the graph's batch)
  int data_parallel = 1;             // replicas of the pipeline
  // Uneven data parallelism (heterogeneous clusters, Whale): samples per micro-batch of each replica
  // (replica r = the r-th device of stage 0's devices; Σ = the micro-batch over all replicas, so
  // B = num_microbatches × Σ). Empty: every replica runs microbatch_size samples. When set,
  // microbatch_size is the largest share and the stage times are those of the slowest replica.
  std::vector<std::int64_t> replica_microbatch;
  // Uneven tensor split (Whale's `split` over mixed GPUs): one stage whose device i (of stage 0's
  // devices) holds the fraction split_fraction[i] of every factor its mesh axis splits (Σ = 1).
  // Empty: even split. device_memory is then per device; the stage times are the slowest device's
  // per op.
  std::vector<double> split_fraction;
  int num_blocks = 0;  // layer-grouping blocks
  // Where the blocks begin (after the first), as positions of the forward order: the cuts
  // pipeline::group_layers was restricted to (megatron_plan: the model's repeated layers, one
  // block each). Empty: group_layers(graph, num_blocks) cut anywhere. lower() regroups with them.
  std::vector<int> block_cuts;
  // Gradient buckets the replicas' gradient all-reduces (and ZeRO's collectives) are grouped in,
  // each issued as soon as its last gradient is made (PlanOptions::grad_bucket_bytes, with or
  // without overlap_grad_sync, which says only whether the compute hides them; 0: no buckets, one
  // collective per tensor); lower() lays them out so (lower::PipelineOptions::grad_bucket_bytes).
  double grad_bucket_bytes = 25e6;
  std::vector<Stage> stages;
  std::vector<CrossTensor> cross_tensors;
  std::vector<double> send_time;       // per boundary i (stage i → i+1), seconds per micro-batch
  std::vector<double> boundary_bytes;  // per boundary, bytes per micro-batch
  double step_time = 0;                // simulated
  double bubble_fraction = 0;
  double throughput = 0;              // samples / s
  double model_flops = 0;             // per step: forward + backward FLOPs of the graph × micro-batches
  double cluster_peak_flops = 0;      // Σ peak FLOP/s of the devices used
  double mfu = 0;                     // model_flops / (step_time × cluster_peak_flops)
  double peak_memory = 0;             // max over devices
  std::vector<double> device_memory;  // per device id used (indexed like devices_used)
  std::vector<int> devices_used;
  double memory_limit = 0;  // per device, as planned
  double plan_seconds = 0;
  // The search space the planner explored, rule by rule (its defaults and the user's limits),
  // e.g. "blocks 16 (min(forward ops, 16)); micro-batches 1..1024 ...". Empty for given layouts.
  std::string search_space;
  // "complete", or "timeout": the planning time limit cut the search short and this is the best
  // plan found by then.
  std::string search_status = "complete";
  // false only for a layout evaluated with PlanOptions::allow_infeasible that does not fit: the
  // plan is priced at every stage's unconstrained layouts and infeasible_reason says what does not
  // fit (peak_memory − memory_limit is the shortfall on the fullest device).
  bool feasible = true;
  std::string infeasible_reason;
  std::vector<Alternative> alternatives;  // best first
  // Planned with a bandwidth trace (PlanOptions::bandwidth_trace) or schedule "adaptive": this
  // plan's pipeline under the trace — Ada-Grouper's (k, micro-batch) frontier, the point to run in
  // each trace window, and the expected step against every fixed point and 1F1B. The stages,
  // schedule and step_time above stay the plan as simulated without the trace.
  std::optional<AdaptivePolicy> adaptive;

  int num_stages() const { return static_cast<int>(stages.size()); }
  std::int64_t global_batch() const;  // samples per step
  std::string summary() const;        // readable multi-line text
  std::string to_string() const;      // one line
  std::string to_json() const;
  static Plan from_json(std::string_view text);  // weft::Error naming the bad field
  bool operator==(const Plan&) const = default;
};

// The pipeline the simulator runs for a plan: one StageSpec per stage from the stored stage times
// and memories, and links that take exactly send_time per micro-batch.
sim::Pipeline pipeline_of(const Plan& p);
schedule::Schedule schedule_of(const Plan& p);
// Re-simulates the plan from its stored numbers (an independent check of step_time).
sim::SimResult resimulate(const Plan& p);

}  // namespace weft::plan
