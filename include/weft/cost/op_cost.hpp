#pragma once
// Compute cost of one IR op on one device under a split of its index map's factors.
//
//   local FLOPs  = op FLOPs / Π_{f ∈ work_factors} shards(f)
//   local bytes  = Σ over operands and results of numel / Π_{f in the tensor} shards(f) × dtype size
//   time         = max(local FLOPs / (peak(dtype) × matmul efficiency),
//                      local bytes / (memory bandwidth × memory efficiency)) + kernel overhead
// The matmul efficiency follows the op's local GEMM shape (gemm_shape.hpp, cluster/efficiency.hpp);
// ops that are not GEMMs run at the dtype's ceiling.
//
// shards(f) is the number of pieces factor f is cut into (product of the mesh axis sizes a
// strategy assigns to it; 1 = not split). Partial results count at full size (each device holds
// a full-size term of the sum).
#include <cstdint>
#include <vector>

#include "weft/cluster/cluster.hpp"
#include "weft/cost/gemm_shape.hpp"
#include "weft/ir/graph.hpp"

namespace weft::cost {

struct OpCost {
  double flops = 0;  // per device
  double bytes = 0;  // per device, operands + results
  double time = 0;   // seconds, roofline
  bool operator==(const OpCost&) const = default;
};

// The dtype whose peak FLOP/s applies: the first floating result, else the first floating
// operand, else f32.
DType compute_dtype(const ir::Graph& g, const ir::Op& op);

// Roofline time of `flops` and `bytes` on `device` under its efficiency model, plus the device's
// kernel overhead when the op does any work (throws weft::Error when the device has no peak for the dtype and no f32
// fallback, or a non-positive bandwidth). A calibrated cluster (cost::calibrated) carries the
// measured efficiencies in its peaks and bandwidths.
// `gemm`: the op's local GEMM shape (nullptr: not a GEMM, the ceiling alone).
double roofline_time(double flops, double bytes, const cluster::DeviceSpec& device, DType dtype,
                     const GemmShape* gemm = nullptr);

// factor_shards.size() must equal op.index_map.factors.size() (throws weft::Error otherwise).
// factor_stride: per factor the inner stride of its split (spmd::OpStrategy::factor_stride), empty
// or 0 = block. Only a causal fused attention's query split reads it: its FLOPs are its busiest
// tile's (ir::attention_tile_imbalance), which a block split loads most.
OpCost op_cost(const ir::Graph& g, const ir::Op& op, const cluster::DeviceSpec& device,
               const std::vector<std::int64_t>& factor_shards,
               const std::vector<std::int64_t>& factor_stride = {});

// An uneven split (Whale's `split` over mixed GPUs): per factor the fraction of it this device
// holds, 0 <= fraction <= 1 (1 = whole). The same formulas with shards(f) = 1 / fraction(f); a
// device holding nothing of some factor does not run the op (all zeros).
OpCost op_cost_fractional(const ir::Graph& g, const ir::Op& op, const cluster::DeviceSpec& device,
                          const std::vector<double>& factor_fraction);

// Bytes per device of operand (is_output=false) or result `index` under factor_shards.
double local_tensor_bytes(const ir::Graph& g, const ir::Op& op, bool is_output, int index,
                          const std::vector<std::int64_t>& factor_shards);

}  // namespace weft::cost
