// Roofline compute time of the calibrated device: t = max(flops / (peak × ceiling),
// bytes / (bw × memory efficiency)) + overhead.
#include "weft/cost/roofline.hpp"

#include <algorithm>

#include "weft/core/error.hpp"

namespace weft::cost {

RooflineTime roofline(double flops, double bytes, DType dtype, const cluster::Device& dev,
                      const Calibration& cal, const GemmShape* gemm) {
  WEFT_CHECK(flops >= 0 && bytes >= 0, "roofline needs flops >= 0 and bytes >= 0 (got {}, {})", flops, bytes);
  RooflineTime r;
  // calibrated(dev.spec, cal) without copying the spec (this runs per op in the hetero evaluator):
  // a calibrated curve replaces the preset's, a calibrated constant its ceiling (the shape terms
  // stay).
  const auto& s = dev.spec;
  cluster::MatmulEfficiency me = s.matmul(dtype);
  if (const cluster::MatmulEfficiency* m = cal.given_matmul(s.kind, dtype))
    me = *m;
  else if (auto e = cal.given_compute_eff(s.kind, dtype))
    me.ceiling = *e;
  const double eff = gemm ? me.at(gemm->parallel(), gemm->k) : me.ceiling;
  const double mem_eff = cal.given_memory_eff(s.kind).value_or(s.memory_efficiency);
  r.compute = flops > 0 ? flops / (s.peak(dtype) * eff) : 0.0;
  r.memory = bytes / (s.memory_bandwidth * mem_eff);
  r.total = std::max(r.compute, r.memory) + cal.kernel_overhead.value_or(s.kernel_overhead);
  return r;
}

double compute_time(double flops, double bytes, DType dtype, const cluster::Device& dev,
                    const Calibration& cal) {
  return roofline(flops, bytes, dtype, dev, cal).total;
}

}  // namespace weft::cost
