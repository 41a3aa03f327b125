#pragma once
// Heterogeneous load balancing (Whale's hardware-aware balancing, Algorithm 1, with memory
// modelled as static + load × per-unit bytes) and its uses: uneven data-parallel batch shares,
// uneven tensor splits, pipeline stage layer counts on mixed GPUs in memory-descending device
// order; plus a throughput evaluator (roofline compute of the training graph, α-β gradient
// all-reduce, 1F1B event simulation) that scores the even and the balanced split alike.
//
// The balancing problem (docs/modules/hetero.md has the derivation):
//   minimise  max_i t_i(u_i),   t_i(u) = (fixed_flops_i + u · flops_per_unit_i) / flops_i
//   s.t.      Σ_i u_i = T,  u_i ∈ ℕ,  static_bytes_i + u_i · bytes_per_unit_i ≤ memory_i
// Algorithm 1 (corrected) reaches the optimum of this integer problem; see balance_load.
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "weft/cluster/cluster.hpp"
#include "weft/core/dtype.hpp"
#include "weft/cost/calibration.hpp"
#include "weft/ir/autodiff.hpp"
#include "weft/ir/graph.hpp"

namespace weft::pipeline {

// One device (or one pipeline slot) as the balancer sees it.
struct DeviceCapacity {
  double flops = 0;         // effective FLOP/s (> 0): peak × efficiency, or work / measured time
  double memory_bytes = 0;  // usable memory (> 0)
  std::string name;         // free text, e.g. "V100-SXM2-32GB#3"
  DeviceCapacity() = default;
  DeviceCapacity(double flops, double memory_bytes, std::string name = {});  // validates
  std::string to_string() const;                                             // "V100#3(15.7 TFLOP/s, 32 GiB)"
  bool operator==(const DeviceCapacity&) const = default;
};

// What one unit of load (a sample, a layer, a granule of a tensor dim) costs. Memory is
// static + units × bytes_per_unit: parameters, gradients and optimizer state do not scale with a
// data-parallel batch share (Whale's pseudo-code scales all memory with load; it must not).
struct LoadModel {
  double flops_per_unit = 1;  // > 0
  double static_bytes = 0;    // >= 0, independent of the load
  double bytes_per_unit = 0;  // >= 0, activations per unit
  double fixed_flops = 0;     // >= 0, work independent of the load (embedding, optimizer step)
  LoadModel() = default;
  LoadModel(double flops_per_unit, double static_bytes = 0, double bytes_per_unit = 0,
            double fixed_flops = 0);  // validates
  double memory(std::int64_t units) const {
    return static_bytes + static_cast<double>(units) * bytes_per_unit;
  }
  double work(std::int64_t units) const { return fixed_flops + static_cast<double>(units) * flops_per_unit; }
  // Largest unit count that fits `memory_bytes`: -1 when the static part alone does not fit,
  // kUnlimitedUnits when a unit needs no memory.
  std::int64_t max_units(double memory_bytes) const;
  std::string to_string() const;
  bool operator==(const LoadModel&) const = default;
};
inline constexpr std::int64_t kUnlimitedUnits = std::int64_t{1} << 60;

// Result of a balance (or the evaluation of given shares).
struct HeteroShares {
  std::vector<std::int64_t> units;         // per device, Σ = total
  std::vector<std::int64_t> proportional;  // Algorithm 1's first phase (∝ FLOP/s, memory ignored)
  std::vector<double> time;                // per device: work / flops, seconds
  std::vector<double> memory;              // per device: static + units × bytes_per_unit
  double max_time = 0;                     // the objective: max over devices of `time`
  int shifts = 0;                          // load shifts the memory phase made
  bool feasible = true;                    // every device within memory
  std::int64_t missing_units = 0;          // units that fit on no device (infeasible case)
  double missing_bytes = 0;                // memory to add for a fit (infeasible case), see message
  std::string message;                     // why infeasible; empty when feasible
  std::string to_string() const;           // one line
  bool operator==(const HeteroShares&) const = default;
};

// Whale's Algorithm 1, corrected (per-device load models: pipeline slots differ):
//  1. proportional phase: the continuous optimum x (water level t with Σ max(0, (t·F_i −
//     fixed_i)/fpu_i) = T; x_i = T·F_i/ΣF when nothing is fixed), floored, and the remaining
//     units handed one by one to the device whose time after the unit is smallest;
//  2. memory phase: while a device is over its memory (oom), take the oom device with the
//     highest memory utilisation (peak) and the non-full device whose time after one more unit
//     is lowest (valley; ties: lower memory utilisation, lower index) and shift
//     b = min(peak's excess, valley's headroom, units the valley takes before its time passes
//     the next valley's) units. Unlike the paper's pseudo-code the peak stays in the oom set
//     until it fits, and the loop runs until every device fits.
// Guarantee (tested against brute force): when feasible, Σ units = T, every device fits, and
// max_i t_i(u_i) is the minimum over all integer share vectors that fit. Infeasible requests
// (static part larger than a device, or fewer unit slots than T) come back with feasible =
// false, missing_units, missing_bytes and a message; balance_load throws weft::Error with it.
HeteroShares try_balance_load(const std::vector<DeviceCapacity>& devices, const std::vector<LoadModel>& loads,
                              std::int64_t total_units);
HeteroShares try_balance_load(const std::vector<DeviceCapacity>& devices, const LoadModel& load,
                              std::int64_t total_units);
HeteroShares balance_load(const std::vector<DeviceCapacity>& devices, const std::vector<LoadModel>& loads,
                          std::int64_t total_units);
HeteroShares balance_load(const std::vector<DeviceCapacity>& devices, const LoadModel& load,
                          std::int64_t total_units);
// Times, memory and feasibility of given shares (units.size() == devices.size()).
HeteroShares evaluate_load(const std::vector<DeviceCapacity>& devices, const std::vector<LoadModel>& loads,
                           const std::vector<std::int64_t>& units);
// The even split: ⌊T/N⌋ each, the remainder one each to the first devices.
std::vector<std::int64_t> even_units(std::int64_t total_units, int devices);

// Uneven tensor split: a dim of `dim_size` elements cut into pieces that are multiples of
// `granularity` (which must divide dim_size), balanced by FLOP/s under memory; `per_granule`
// is the load of one granule (flops, bytes) plus the static part every device holds.
// Returns the piece sizes in elements (Σ = dim_size); throws weft::Error when infeasible.
std::vector<std::int64_t> split_dimension(const std::vector<DeviceCapacity>& devices, std::int64_t dim_size,
                                          std::int64_t granularity = 1, const LoadModel& per_granule = {});

// Pieces of a dim of `size` elements in proportion to `fraction` (>= 0, Σ > 0): ⌊size·f_i/Σf⌋
// each, the remaining elements one each to the largest remainders (ties: lower index). Σ = size.
// The planner's uneven split cuts every split factor of every op this way.
std::vector<std::int64_t> proportional_pieces(std::int64_t size, const std::vector<double>& fraction);

// Device order for pipeline stages: memory descending (ties: FLOP/s descending, then index), so
// the early stages — which hold the most in-flight activations in 1F1B — get the big GPUs.
std::vector<int> memory_descending_order(const std::vector<DeviceCapacity>& devices);
// The devices of `device_ids` on `cluster` as capacities (peak FLOP/s of `dtype` × calibrated
// efficiency, memory capacity).
std::vector<DeviceCapacity> capacities(const cluster::Cluster& cluster, const std::vector<int>& device_ids,
                                       DType dtype = DType::F32, const cost::Calibration& cal = {});

// ---------------------------------------------------------------------------------------------
// Model profile: the training graph's ops as affine functions of the batch b (FLOPs and bytes of
// every op are exactly f0 + f1·b for the zoo, read off graphs built at b = 1 and b = 2), grouped
// into pre (embedding), layers 0..L−1 and post (head, loss) for pipelines; exact liveness peak
// memory as max over positions of (A_p + C_p·b).
class ModelProfile {
 public:
  // build(b) returns the forward graph at batch b. layer_prefix: ops (and parameters) named
  // "<prefix><i>." belong to layer i; "" tries "layer" (BERT) then "h" (GPT/MoE).
  static ModelProfile from_builder(const std::function<ir::Graph(std::int64_t)>& build,
                                   const ir::TrainOptions& options = {}, std::string layer_prefix = {});
  static ModelProfile from_preset(std::string_view preset, DType dtype = DType::F32,
                                  const ir::TrainOptions& options = {});

  const std::string& name() const { return name_; }
  int num_layers() const { return num_layers_; }
  double param_bytes() const { return param_bytes_; }  // = gradient bytes of a data-parallel all-reduce
  double flops(double batch) const;                    // training step (forward + backward + optimizer)
  // Σ over ops of the roofline time on `device` at batch b (the training step, no communication).
  double time(double batch, const cluster::Device& device, const cost::Calibration& cal = {}) const;
  double forward_time(double batch, const cluster::Device& device, const cost::Calibration& cal = {}) const;
  double peak_memory(double batch) const;  // liveness peak of the training step, bytes
  // The memory line static + b·per_sample through the exact peaks at b = 1 and b = b_hi: since
  // the peak is convex in b, it bounds the peak from above on [1, b_hi].
  LoadModel memory_line(std::int64_t b_hi) const;
  std::string to_string() const;

  // Pipeline pieces, per micro-batch of size m. group: −1 = pre, 0..L−1 = layer, L = post.
  double group_flops(int group, double m) const;  // forward + backward
  double group_time(int group, double m, const cluster::Device& device, const cost::Calibration& cal,
                    bool forward) const;  // F (forward) or B (backward) time
  double group_optimizer_time(int group, const cluster::Device& device, const cost::Calibration& cal) const;
  double group_static_bytes(int group) const;              // params + gradients + optimizer state
  double group_param_bytes(int group) const;               // params alone (= its gradient all-reduce)
  double group_stash_bytes(int group, double m) const;     // forward activations the backward reads
  double boundary_bytes(int after_layer, double m) const;  // sent from layers ≤ l to layers > l

  struct OpLine {
    double f0 = 0, f1 = 0, b0 = 0, b1 = 0;  // flops = f0 + f1·b, bytes = b0 + b1·b
    // A GEMM's shape (cost/gemm_shape.hpp) as lines too: output elements p0 + p1·b, contraction
    // k0 + k1·b (a weight gradient contracts over the batch), so its matmul efficiency follows b.
    bool gemm = false;
    double p0 = 0, p1 = 0, k0 = 0, k1 = 0;
    DType dtype = DType::F32;
    int group = 0;
    std::uint8_t phase = 0;  // 0 forward, 1 backward, 2 optimizer
  };

 private:
  std::string name_;
  int num_layers_ = 0;
  double param_bytes_ = 0;
  std::vector<OpLine> ops_;
  std::vector<std::pair<double, double>> memory_hull_;  // (A, C): peak(b) = max A + C·b
  std::vector<double> group_static_;                    // index group + 1
  std::vector<double> group_params_;                    // index group + 1
  std::vector<std::pair<double, double>> group_stash_;  // affine per group
  std::vector<std::pair<double, double>> boundary_;     // affine per layer boundary
};

// ---- data parallel over mixed GPUs -----------------------------------------------------------
struct DataParallelOptions {
  cost::Calibration calibration{};
  // Gradient all-reduce overlapped with the backward pass (bucketed, as in Horovod/DDP/Whale):
  // step = max_i over replicas of max(optimizer + compute + AR(bucket), optimizer + forward +
  // AR(all)) — each replica updates right after the all-reduce and starts its next forward, the
  // replicas meet only at the all-reduce; otherwise max_i(optimizer + compute) + AR.
  bool overlap_grad_sync = true;
  double bucket_bytes = 25e6;
};
struct DpEvaluation {
  std::vector<std::int64_t> batch;  // per device
  std::vector<double> compute;      // per device: forward + backward + optimizer, seconds
  std::vector<double> memory;       // per device: liveness peak, bytes
  double allreduce = 0;             // seconds, α-β over the group's mesh
  double step_time = 0;
  double throughput = 0;  // samples / s
  bool fits = true;       // every device within its memory
  std::string to_string() const;
};
DpEvaluation evaluate_data_parallel(const ModelProfile& model, const cluster::Cluster& cluster,
                                    const std::vector<int>& device_ids,
                                    const std::vector<std::int64_t>& batch,
                                    const DataParallelOptions& options = {});
// Batch shares by Algorithm 1: per device the effective FLOP/s (training FLOPs per sample over the
// roofline time per sample, secant over the batch range), the batch-independent time as fixed
// work, and the memory line of ModelProfile::memory_line(global_batch).
HeteroShares balance_data_parallel(const ModelProfile& model, const cluster::Cluster& cluster,
                                   const std::vector<int>& device_ids, std::int64_t global_batch,
                                   const DataParallelOptions& options = {});

// ---- pipeline stages on mixed GPUs -------------------------------------------------------------
struct PipelineOptions {
  cost::Calibration calibration{};
  std::int64_t micro_batch = 1;  // samples per micro-batch
  int num_micro = 8;             // micro-batches per step (1F1B)
  // Nested data parallelism: `replicas` identical pipelines; stage s of replica j runs on
  // device_order[s·replicas + j], and each stage all-reduces its gradients over its replicas
  // after its last backward (α-β on those devices) before its optimizer step.
  int replicas = 1;
};
struct PipelineEvaluation {
  std::vector<int> device_order;   // stage s of replica j runs on device_order[s·replicas + j]
  std::vector<int> layers;         // per stage
  std::vector<double> stage_time;  // per stage: F + B per micro-batch
  std::vector<double> memory;      // per stage: static + peak in-flight × stash
  double step_time = 0;            // simulated 1F1B step
  double throughput = 0;           // samples / s, all replicas
  bool fits = true;
  std::string to_string() const;
};
// Simulates 1F1B (weft::sim) with per-stage F/B from the roofline, the cluster's links between
// consecutive stages, and the memory of each stage.
PipelineEvaluation evaluate_pipeline(const ModelProfile& model, const cluster::Cluster& cluster,
                                     const std::vector<int>& device_order, const std::vector<int>& layers,
                                     const PipelineOptions& options = {});
// Devices in memory-descending order (with replicas: consecutive groups of `replicas` devices form
// one stage, timed by its slowest device and bounded by its smallest memory), layer counts by
// Algorithm 1 (unit = one layer; stage s
// holds min(M, S−s) micro-batches' activations; the first stage also runs the embedding, the last
// the head), then evaluated. Throws weft::Error when no split fits, with the missing memory.
PipelineEvaluation balance_pipeline(const ModelProfile& model, const cluster::Cluster& cluster,
                                    const std::vector<int>& device_ids, const PipelineOptions& options = {});
// Even layer counts (the remainder to the first stages) in the given device order.
std::vector<int> even_layers(int num_layers, int stages);

}  // namespace weft::pipeline
