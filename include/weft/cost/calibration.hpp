#pragma once
// Calibration: the constants of the cost model measured on a real cluster, loadable from JSON.
// Defaults are 1.0 efficiencies and no overhead (pure datasheet roofline and α-β).
// JSON (every field optional):
//   {"compute_efficiency": {"default": 0.6, "V100-SXM2-32GB": {"f16": 0.55, "f32": 0.8}},
//    "memory_efficiency": {"default": 0.8, "A100-SXM4-80GB": 0.9},
//    "matmul_efficiency": {"H100-SXM5-80GB": {"bf16": {"ceiling": 0.74, "fill_elements": 2.3e6,
//                                                      "half_k": 197}}},
//    "kernel_overhead_s": 5e-6,
//    "alpha_scale": 1.0, "beta_scale": 1.15}
// A number the calibration gives replaces the device's default efficiency model for what it
// covers (calibrated() below): a measured compute efficiency is the whole fraction of the
// datasheet reached, so it replaces the preset's ceiling (the shape terms stay); a matmul_efficiency
// entry replaces the whole curve of that kind and dtype (give one or the other for a kind and
// dtype, not both); a memory efficiency replaces the preset's; kernel_overhead_s replaces the
// device's overhead. What the calibration does not give keeps the preset's default.
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "weft/cluster/cluster.hpp"
#include "weft/cluster/device_mesh.hpp"
#include "weft/core/dtype.hpp"

namespace weft::cost {

struct Calibration {
  std::optional<double> default_compute_efficiency;                   // fraction of peak FLOP/s
  std::map<std::string, std::map<DType, double>> compute_efficiency;  // per device kind, dtype
  // per device kind ("default": kinds not listed), dtype: the whole matmul curve
  std::map<std::string, std::map<DType, cluster::MatmulEfficiency>> matmul_efficiency;
  std::optional<double> default_memory_efficiency;  // fraction of HBM bandwidth
  std::map<std::string, double> memory_efficiency;  // per device kind
  std::optional<double> kernel_overhead;            // seconds per op (launch), replaces the device's
  double alpha_scale = 1.0;                         // multiplies every link latency
  double beta_scale = 1.0;                          // multiplies every s/byte (1/bandwidth)

  // What the calibration says for a kind (nullopt / nullptr: it says nothing, the device keeps
  // its default).
  std::optional<double> given_compute_eff(const std::string& kind, DType t) const;
  std::optional<double> given_memory_eff(const std::string& kind) const;
  const cluster::MatmulEfficiency* given_matmul(const std::string& kind, DType t) const;
  // The given numbers, 1.0 where none is given (the roofline's factors on top of a device).
  double compute_eff(const std::string& kind, DType t) const;
  double memory_eff(const std::string& kind) const;
  cluster::AxisLink apply(cluster::AxisLink l) const;   // scaled α and β
  static Calibration from_json(std::string_view text);  // throws weft::Error, values must be > 0
  std::string to_json() const;
  bool operator==(const Calibration&) const = default;
};

// The cluster as the calibration measured it: every device's peak FLOP/s times its kind's given
// compute efficiency (per dtype; the device's ceiling then 1), its given matmul curve, its memory
// bandwidth times the given memory efficiency (the device's then 1), the given kernel overhead; every link's latency times alpha_scale and bandwidth over beta_scale. A
// planner given the calibrated cluster prices everything (ops, collectives, resharding, stage
// transfers, optimizer updates) with the measured constants; capacities are unchanged.
cluster::Cluster calibrated(const cluster::Cluster& c, const Calibration& cal);
cluster::DeviceSpec calibrated(const cluster::DeviceSpec& d, const Calibration& cal);

}  // namespace weft::cost
