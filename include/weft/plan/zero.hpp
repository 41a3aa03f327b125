#pragma once
// Sharded data parallelism across a stage's data-parallel replicas: ZeRO (Rajbhandari et al.,
// SC'20) stages 1-3 and PyTorch FSDP, with hybrid sharding (FSDP's HYBRID_SHARD, DeepSpeed's
// hpZ/MiCS: states sharded inside a group of replicas, the groups replicas of each other).
//
// Level, per device of one replica's stage mesh, with P = its parameter bytes, G = P its gradient
// bytes, O its optimizer-state bytes (the f32 master copy and moments of mixed precision included)
// and z the replicas of one shard group:
//   0  plain data parallelism (DDP): P + G + O; gradients all-reduced once per step.
//   1  optimizer states sharded (ZeRO-1, Megatron's distributed optimizer): P + G + O/z; per step
//      a reduce-scatter of the accumulated gradients, the update of the own shard, an all-gather of
//      the new parameters.
//   2  + gradients (ZeRO-2): P + G/z + O/z; each micro-batch's gradients reduce-scattered as the
//      backward makes them (one bucket held whole), the all-gather of the new parameters per step.
//   3  + parameters (ZeRO-3, FSDP FULL_SHARD): (P + G + O)/z + the working set: each block's
//      parameters all-gathered before its forward and again before its backward (the next block's
//      prefetched meanwhile) and its gradients reduce-scattered, every micro-batch.
// With hybrid sharding (z < replicas) the gradient shards are all-reduced across the groups once
// per step. Communication overlaps the compute it serves (prefetch, bucketed reduce-scatter): the
// stage chooser charges max(one block's or bucket's share, collective − compute) per phase, and the
// simulator runs the collectives themselves on each device's communication stream
// (plan::ReplicaComm, sim::ReplicaCollectives).
#include <cstdint>
#include <string_view>

namespace weft::plan {

// "0".."3" for the levels, "auto" (-1) for the planner's choice per stage.
int parse_zero(std::string_view text);  // weft::Error naming the accepted values

// Per device: what the level keeps of a stage's state (bytes). working = the transient working
// set the level adds: level 2 one gradient bucket held whole before its reduce-scatter; level 3
// the gathered parameters of the largest block and of the next one (prefetch) and its whole
// gradients before the reduce-scatter, less the own shards.
struct ZeroMemory {
  double params = 0, grads = 0, optimizer = 0, working = 0;
  double state() const { return params + grads + optimizer; }
};
// grad_bytes: the gradients as held (f32 under mixed precision: plan::state_bytes_factor); < 0 =
// as many as the parameters'.
ZeroMemory zero_memory(int level, double param_bytes, double optimizer_bytes, int group,
                       double largest_block_param_bytes = 0, double bucket_bytes = 25e6,
                       double grad_bytes = -1);

// Bytes one device sends over a ring of `group` replicas (ring all-reduce 2(z−1)/z·B, all-gather
// and reduce-scatter (z−1)/z·B), gradients and parameters of P bytes each:
//   level 0: per step 2(z−1)/z·P;  1: per step (z−1)/z·2P;  2: per micro-batch (z−1)/z·P, per
//   step (z−1)/z·P;  3: per micro-batch (z−1)/z·3P (two all-gathers and a reduce-scatter).
// ZeRO's §7 in its units (Ψ elements, n → ∞, one micro-batch): 2Ψ, 2Ψ, 2Ψ, 3Ψ. Hybrid sharding
// (`groups` > 1 groups of `group` replicas, levels 1-3) adds per step the all-reduce of the
// gradient shard across the groups: 2(x−1)/x·P/z with x = groups.
struct ZeroTraffic {
  double per_microbatch = 0, per_step = 0;
  double total(int microbatches) const { return microbatches * per_microbatch + per_step; }
};
ZeroTraffic zero_traffic(int level, double param_bytes, int group, int groups = 1);

}  // namespace weft::plan
