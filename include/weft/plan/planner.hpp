#pragma once
// The planner: (training graph, cluster) -> the plan::Plan with the lowest simulated step time that
// fits in memory. See docs/modules/plan.md for the full method; in short:
//   1. layer grouping (pipeline::group_layers) into L blocks;
//   2. per (block, logical mesh) an SPMD search (spmd::spmd_search on pipeline::extract_stage of the
//      block), cached by the block's structure (identical layers are solved once) and the mesh's
//      α-β links; a stage's per-micro-batch cost is the sum over its blocks;
//   3. stage partition by Alpa's DP (pipeline::partition_dp) over blocks × submeshes, once per
//      bound on the stage count (memory of a stage = static + in-flight × activations, in-flight
//      from the schedule); SPMD-only plans are the 1-stage case on the whole cluster; uniform
//      Megatron-like partitions are enumerated too;
//   4. every candidate is simulated with the chosen schedule (sim::simulate), cross-stage tensors
//      are resharded by the reshard planner (its simulated time is the send time), and the fastest
//      feasible one is returned; the others are kept as alternatives.
// Megatron-style manual layouts (megatron_plan) are evaluated with the same cost model.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "weft/cluster/cluster.hpp"
#include "weft/core/stop_token.hpp"
#include "weft/ir/graph.hpp"
#include "weft/plan/plan.hpp"
#include "weft/plan/zero.hpp"

namespace weft::plan {

enum class SpmdLevel { O2, O3 };

// Activation recomputation of a pipeline stage (docs/modules/plan.md, "Activation recomputation"):
//   None      every forward result the backward reads is kept (per in-flight micro-batch);
//   Selective the attention cores are recomputed in the backward (Korthikanti et al. 2022): the
//             results of every contraction of two activations (Q·Kᵀ scores) and of the same-shape
//             ops after it (mask, softmax, dropout) are dropped; their forward runs again;
//   Full      only each block's forward inputs are kept; the whole forward of the stage runs
//             again in the backward (one extra forward), one block at a time;
//   Auto      (options only) the planner picks per stage the cheapest of the three that fits, or,
//             where none does not fit, a mode per block (Stage::recompute_blocks / selective_blocks)
//             when that fits and is cheaper.
enum class Recompute : std::uint8_t { Auto, None, Selective, Full };
std::string_view recompute_name(Recompute r);  // "auto", "none", "selective", "full"
Recompute parse_recompute(std::string_view name);  // weft::Error naming the accepted values
// The attention cores selective recomputation re-makes in a training graph (the rule above), as
// op lists (forward ops, the closing contraction included), in topological order of their starts.
std::vector<std::vector<ir::OpId>> selective_regions(const ir::Graph& training_graph);

// The default reserve per device (PlanOptions::memory_reserve = -1) and the device memory from
// which it applies (toy and test devices below it get none); sources in plan.md, "Usable memory".
inline constexpr double kMemoryReserve = 1024.0 * 1024 * 1024;          // 1 GiB
inline constexpr double kMemoryReserveFrom = 8.0 * 1024 * 1024 * 1024;  // 8 GiB

struct PlanProgress {
  std::string phase;  // "grouping", "spmd", "partition", "simulate", "baseline", "done"
  double fraction = 0;
  std::string message;
};

struct PlanOptions {
  // "1f1b", "gpipe", "kfkb", "eager_1f1b", "interleaved", "zb_h1", "zb_interleaved", "zbv" and
  // "dualpipev" (two chunks per stage in the V shape), "kfkb_interleaved"; make_plan also takes "adaptive":
  // Ada-Grouper — the layout planned under 1F1B, then Plan::adaptive, the k per window of
  // bandwidth_trace (a constant network when none is given).
  std::string schedule = "1f1b";
  // A busy network: the fraction of nominal bandwidth over time on the inter-stage links. When
  // set, make_plan returns Plan::adaptive (the plan's pipeline under the trace, adaptive_policy).
  std::optional<cluster::BandwidthTrace> bandwidth_trace;
  AdaptiveOptions adaptive;  // window, k_max, duration of the policy
  int schedule_k = 2;  // kFkB group size (kfkb, kfkb_interleaved)
  int schedule_v = 2;  // virtual stages per device (interleaved, zb_interleaved, kfkb_interleaved)
  // 0 = auto: every power of two dividing the batch (up to max_microbatches when that is > 0),
  // less the (M, replicas) pairs whose replica cannot hold state + one micro-batch of activations.
  int num_microbatches = 0;
  int max_microbatches = 0;  // 0 = no cap
  int max_data_parallel = 0;  // 0 = any number of pipeline replicas
  int max_simulated = 256;    // candidates simulated (best DP proxies first)
  bool two_d_meshes = false;  // 2-D logical meshes for the SPMD search (slow: tens of s per block)
  int num_blocks = 0;         // layer-grouping blocks; 0 = auto (min(forward-op runs, 16))
  int max_stages = 0;         // 0 = no limit
  SpmdLevel spmd_level = SpmdLevel::O2;
  double spmd_time_limit_s = 2;     // per SPMD search (one block on one mesh)
  double spmd_relative_gap = 0.02;  // per ILP of an SPMD search
  bool shared_resharding = true;    // spmd::SearchOptions::shared_resharding in every SPMD search
  // Whole planning: at the deadline no new SPMD search starts, no more candidates are simulated,
  // and the best plan so far is returned (Plan::search_status "timeout"; within 1.5 × the limit +
  // 0.5 s); weft::Error only when no plan was found by then.
  double time_limit_s = 300;
  // Usable memory per device = (capacity − memory_reserve) × memory_fraction (plan.md, "Usable
  // memory"): capacity = memory_limit, or the device's memory when 0; the reserve holds what the
  // plan's tensors cannot use (the CUDA context, NCCL / communication buffers, library
  // workspaces); the fraction leaves the caching allocator's fragmentation margin.
  double memory_limit = 0;       // bytes per device; 0 = the device's memory
  double memory_reserve = -1;    // bytes per device; -1 = auto: kMemoryReserve on a device's own
                                 // memory of >= kMemoryReserveFrom, else 0 (a memory_limit is the
                                 // plan's budget as given)
  double memory_fraction = 0.9;  // the rest less a fragmentation margin (1 − fraction)
  // Gradient synchronisation (inside a stage's mesh and across data-parallel replicas) overlapped
  // with the last micro-batch's backward in buckets (PyTorch DDP, Horovod, Megatron's
  // overlap_grad_reduce): exposed = max(one bucket's share, sync − backward). false: all exposed.
  bool overlap_grad_sync = true;
  double grad_bucket_bytes = 25e6;  // DDP's default bucket
  // The training loop's one small all-reduce per step over every device of the plan, between the
  // last backward and the updates: weft.Trainer's global gradient norm and loss (two f64; torch's
  // clip_grad_norm_ plus a logged loss cost the same). Priced in every stage's optimizer_time;
  // 0 = none (weft.run's bare programs).
  double step_allreduce_bytes = 16;
  // Search space limits (the fast path for huge models / clusters):
  bool whole_nodes_only = false;    // submeshes of whole nodes only (no slices of a node)
  bool power_of_two_nodes = false;  // submeshes of 1, 2, 4, ... nodes only
  // On clusters of more than 8 nodes, whole-node submeshes have a node count that is a power of
  // two or divides the cluster's node count (the counts that tile replicas and stages); true:
  // every node count (slow: one SPMD search per block and count).
  bool all_node_counts = false;
  // Branch and bound over the (micro-batch count, replicas) pairs: a pair whose lower bound (its
  // stage DP on the blocks' unconstrained layouts, memory by the state + activation bound) is not
  // below the best simulated step so far is not searched, nor a pair whose replica cannot hold
  // the parameter state plus one micro-batch of saved activations. false: every pair is searched
  // (slow on big clusters: the memory-limited SPMD searches of hopeless pairs).
  bool bound_search = true;
  // Layout evaluation (megatron_plan, layout_plan): a layout that does not fit is returned as a
  // plan with Plan::feasible = false (its step time at each stage's unconstrained layouts, its
  // memory and the reason) instead of weft::Error. make_plan ignores it (it lists such layouts
  // among its alternatives).
  bool allow_infeasible = false;
  int max_logical_shapes = 0;       // per submesh, 0 = all 2-D shapes with the minor axis in a node
  bool pipeline = true;             // consider pipelines (false: SPMD only)
  bool uniform_partitions = true;   // also simulate equal-block partitions (Megatron-like shapes)
  // Rhino's stage ILP (pipeline::partition_dag_ilp) on a non-linear block DAG: the DP also runs
  // over the block orders of its solutions (stages that are not contiguous in the grouping's order).
  bool stage_ilp = true;
  bool compare_megatron = true;  // evaluate the Megatron-style baseline and list it
  // Megatron's sequence parallelism in its tensor-parallel stages (megatron_plan, the Megatron
  // baseline): the residual stream split along the tokens over the t devices (megatron_specs).
  bool sequence_parallel = false;
  // Mixed GPU kinds: also Whale's `split` — one SPMD stage over every device with every split
  // dimension cut unevenly in proportion to each device's speed (split_plan), and its even split.
  bool uneven_split = true;
  // Activation recomputation per stage: Auto searches none / selective / full per stage, and
  // per-block modes where none does not fit (the fastest that fits: recomputation only costs
  // time, so it is picked when memory forces it or when it lets a faster layout fit); an explicit
  // mode is used by every block of every stage.
  Recompute recompute = Recompute::Auto;
  // Sharded data parallelism across a stage's data-parallel replicas (zero.hpp: ZeRO levels 0-3,
  // FSDP): -1 = per stage the fastest level that fits (with recompute=auto both are searched
  // together); 0..3 = that level wherever a stage has replicas. hybrid_sharding: also shard over
  // the replicas of one node only (replicated across nodes: FSDP's HYBRID_SHARD) when it pays.
  int zero = -1;
  bool hybrid_sharding = true;
  int max_alternatives = 12;
  // Threads for the independent SPMD searches (blocks × meshes × micro-batch sizes); 0 = every
  // core (std::thread::hardware_concurrency). The plan is the same for any count.
  int threads = 0;
  std::function<void(const PlanProgress&)> progress;
  // The caller's deadline and cancellation (Ctrl-C) on top of time_limit_s: a cancel throws
  // weft::Cancelled.
  StopToken stop;
};

// Plans a training graph (one micro-batch; see plan.hpp) on a cluster. Throws weft::Error on bad
// options, when the model cannot fit in the cluster's total memory (the message says how many
// bytes are missing) or when no candidate fits.
Plan make_plan(const ir::Graph& training_graph, const cluster::Cluster& cluster,
               const PlanOptions& options = {});

// A Megatron-LM style manual layout: tensor parallel t inside a node (t divides the GPUs per node),
// pipeline p (equal FLOP split of the blocks, contiguous device ranges), data parallel d on the
// rest (t·p·d = devices). Each stage runs on a logical mesh (d, t) with the inputs forced
// batch-sharded on d; the split on t is the SPMD search's (which finds Megatron's column/row
// split on GPT blocks). Same cost model, schedule and memory rule as make_plan.
struct MegatronLayout {
  int t = 1, p = 1, d = 1;
  std::string to_string() const;  // "t=4 p=2 d=2"
  bool operator==(const MegatronLayout&) const = default;
};
std::vector<MegatronLayout> megatron_layouts(const cluster::Cluster& cluster, int max_p = 0);
// The plan of one layout; weft::Error when it does not fit in memory (message says why).
Plan megatron_plan(const ir::Graph& training_graph, const cluster::Cluster& cluster,
                   const MegatronLayout& layout, const PlanOptions& options = {});
// Every layout evaluated; the best feasible plan first in `alternatives`, weft::Error when none fits.
Plan best_megatron_plan(const ir::Graph& training_graph, const cluster::Cluster& cluster,
                        const PlanOptions& options = {});

// Heterogeneous clusters (nodes of different GPU kinds) are planned by make_plan too (see
// src/plan/hetero_planner.cpp): data parallelism with uneven batch shares (Whale's Algorithm 1 on
// the planner's per-kind costs), Whale's uneven tensor split (split_plan) and pipelines over the
// devices in memory-descending node order (a position-aware stage DP: faster GPUs take more
// blocks), each against its even split.
//
// Data parallelism with the given samples per micro-batch on every device (in device id order,
// Σ = batch / num_microbatches; 0 = the device only holds the state), costed like make_plan's
// candidates: step = the longest replica period (num_microbatches × its forward + backward + its
// optimizer step) + the exposed gradient all-reduce. Plan::replica_microbatch holds the shares. weft::Error
// on bad shares or when a device's memory is exceeded (the message names it).
Plan data_parallel_plan(const ir::Graph& training_graph, const cluster::Cluster& cluster,
                        const std::vector<std::int64_t>& shares, int num_microbatches,
                        const PlanOptions& options = {});

// Whale's `split` over mixed GPUs with given fractions: the whole graph as one SPMD stage on the
// 1-D mesh of every device (id order), device i holding fraction[i] / Σ fraction of every factor
// the mesh axis splits (the strategies: the SPMD search on the slowest kind), costed like
// make_plan's "spmd (uneven split)" candidates (see src/plan/uneven_split.cpp).
// Plan::split_fraction holds the fractions. weft::Error on bad fractions or when a device's
// memory is exceeded (the message names it).
Plan split_plan(const ir::Graph& training_graph, const cluster::Cluster& cluster,
                const std::vector<double>& fraction, int num_microbatches, const PlanOptions& options = {});

// A given pipeline layout, costed like make_plan's candidates (the SPMD search of each stage on its
// own devices, the schedule simulated, cross-stage tensors resharded): a manual layout to compare
// with, or the oracle of the planner's tests. Stages in pipeline order must cover the blocks
// 0..num_blocks−1 (layer grouping with PlanOptions::num_blocks) contiguously; `mesh` is the
// stage's logical mesh over its devices (empty = 1-D). weft::Error when a stage does not fit.
struct StageLayout {
  int first_block = 0, last_block = 0;
  std::vector<int> devices;
  std::vector<std::int64_t> mesh;
};
Plan layout_plan(const ir::Graph& training_graph, const cluster::Cluster& cluster,
                 const std::vector<StageLayout>& stages, int num_microbatches,
                 const PlanOptions& options = {});

// The reserve and the usable bytes of a device under the options (PlanOptions::memory_reserve).
double memory_reserve_of(const PlanOptions& options, const cluster::DeviceSpec& device);
double usable_memory(const PlanOptions& options, const cluster::DeviceSpec& device);
// "usable 70.6 GB = (80 GB − 1.07 GB reserve) × 0.9": how usable_memory came about, for messages.
std::string usable_memory_text(const PlanOptions& options, const cluster::DeviceSpec& device);

// Bytes per device of state that cannot be split below its total / devices: parameters, their
// gradients and optimizer states of the whole model (state_bytes_factor each).
double model_state_bytes(const ir::Graph& training_graph);
// Bytes a device holds per byte of state leaf t of g: an optimizer state 1; a parameter itself and
// its gradient, which weft.Trainer holds in f32 under mixed precision (the update reads an f32
// master copy: torch's and Megatron-LM's f32 gradient accumulation), so 1 + 4/2 = 3 for a bf16 /
// f16 parameter with a master copy (Adam: 2 + 4 + 4 master + 8 moments = 18 bytes per parameter),
// else 2; 0 for any other tensor.
double state_bytes_factor(const ir::Graph& g, ir::TensorId t);

// The object form (for callers that keep options around).
class Planner {
 public:
  explicit Planner(PlanOptions options = {}) : options_(std::move(options)) {}
  Plan plan(const ir::Graph& training_graph, const cluster::Cluster& cluster) const {
    return make_plan(training_graph, cluster, options_);
  }
  const PlanOptions& options() const { return options_; }

 private:
  PlanOptions options_;
};

}  // namespace weft::plan
