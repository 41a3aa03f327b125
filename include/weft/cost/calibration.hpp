#pragma once
// Calibration: the constants of the cost model measured on a real cluster, loadable from JSON.
// Defaults are 1.0 efficiencies and no overhead (pure datasheet roofline and α-β).
// JSON (every field optional):
//   {"compute_efficiency": {"default": 0.6, "V100-SXM2-32GB": {"f16": 0.55, "f32": 0.8}},
//    "memory_efficiency": {"default": 0.8, "A100-SXM4-80GB": 0.9},
//    "kernel_overhead_s": 5e-6,
//    "alpha_scale": 1.0, "beta_scale": 1.15}
#include <map>
#include <string>
#include <string_view>

#include "weft/cluster/cluster.hpp"
#include "weft/cluster/device_mesh.hpp"
#include "weft/core/dtype.hpp"

namespace weft::cost {

struct Calibration {
  double default_compute_efficiency = 1.0;                            // fraction of peak FLOP/s
  std::map<std::string, std::map<DType, double>> compute_efficiency;  // per device kind, dtype
  double default_memory_efficiency = 1.0;                             // fraction of HBM bandwidth
  std::map<std::string, double> memory_efficiency;                    // per device kind
  double kernel_overhead = 0;                                         // seconds added per op (launch)
  double alpha_scale = 1.0;                                           // multiplies every link latency
  double beta_scale = 1.0;                                            // multiplies every s/byte (1/bandwidth)

  double compute_eff(const std::string& kind, DType t) const;
  double memory_eff(const std::string& kind) const;
  cluster::AxisLink apply(cluster::AxisLink l) const;   // scaled α and β
  static Calibration from_json(std::string_view text);  // throws weft::Error, values must be > 0
  std::string to_json() const;
  bool operator==(const Calibration&) const = default;
};

// The cluster as the calibration measured it: every device's peak FLOP/s times its kind's compute
// efficiency (per dtype), its memory bandwidth times the memory efficiency, the kernel overhead
// added to every op; every link's latency times alpha_scale and bandwidth over beta_scale. A
// planner given the calibrated cluster prices everything (ops, collectives, resharding, stage
// transfers, optimizer updates) with the measured constants; capacities are unchanged.
cluster::Cluster calibrated(const cluster::Cluster& c, const Calibration& cal);

}  // namespace weft::cost
