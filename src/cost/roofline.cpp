// Roofline compute time: t = max(flops / (peak × eff_c), bytes / (bw × eff_m)) + overhead.
#include "weft/cost/roofline.hpp"

#include <algorithm>

#include "weft/core/error.hpp"

namespace weft::cost {

RooflineTime roofline(double flops, double bytes, DType dtype, const cluster::Device& dev,
                      const Calibration& cal) {
  WEFT_CHECK(flops >= 0 && bytes >= 0, "roofline needs flops >= 0 and bytes >= 0 (got {}, {})", flops, bytes);
  RooflineTime r;
  r.compute = flops > 0 ? flops / (dev.spec.peak(dtype) * cal.compute_eff(dev.spec.kind, dtype)) : 0.0;
  r.memory = bytes / (dev.spec.memory_bandwidth * cal.memory_eff(dev.spec.kind));
  r.total = std::max(r.compute, r.memory) + cal.kernel_overhead + dev.spec.kernel_overhead;
  return r;
}

double compute_time(double flops, double bytes, DType dtype, const cluster::Device& dev,
                    const Calibration& cal) {
  return roofline(flops, bytes, dtype, dev, cal).total;
}

}  // namespace weft::cost
