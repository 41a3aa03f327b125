#pragma once
// Compute time of one op on one device (roofline):
//   t = max( flops / (peak_flops[dtype] × compute_eff),  bytes / (memory_bandwidth × memory_eff) )
//       + kernel_overhead
// The IR-specific glue (FLOPs and bytes of an op) lives elsewhere and calls this.
#include "weft/cluster/cluster.hpp"
#include "weft/core/dtype.hpp"
#include "weft/cost/calibration.hpp"
#include "weft/cost/gemm_shape.hpp"

namespace weft::cost {

struct RooflineTime {
  double compute = 0;  // flops / effective peak
  double memory = 0;   // bytes / effective bandwidth
  double total = 0;    // max(compute, memory) + overhead
  bool compute_bound() const { return compute >= memory; }
};

// gemm: the op's GEMM shape (cost/gemm_shape.hpp), whose matmul efficiency then applies (the
// calibration's curve or ceiling where it gives one); nullptr: the ceiling alone.
RooflineTime roofline(double flops, double bytes, DType dtype, const cluster::Device& device,
                      const Calibration& cal = {}, const GemmShape* gemm = nullptr);
double compute_time(double flops, double bytes, DType dtype, const cluster::Device& device,
                    const Calibration& cal = {});

}  // namespace weft::cost
