#pragma once
// How close a device comes to its datasheet: the part of peak FLOP/s a matmul of a given shape
// reaches, and the part of HBM bandwidth a memory-bound op reaches. Presets carry defaults from
// measurements (docs/modules/cost.md cites each); a calibration file replaces them.
//
//   matmul efficiency(b·m·n, k) = ceiling × min(1, b·m·n / fill_elements) × k / (k + half_k)
//
// - ceiling: what large, well-shaped GEMMs reach (cuBLAS never reaches the datasheet peak);
// - fill_elements: output elements (batch × rows × columns) a GEMM needs for one tile on every
//   SM; fewer leave SMs idle (tile/wave quantization, smoothed to stay monotone);
// - half_k: the contraction length at which the k-loop's fixed prologue/epilogue costs half the
//   time (short contractions such as attention's head dim run far below the ceiling).
// - floor: the efficiency the curve never goes below — a calibration sets it to the curve's value
//   at the smallest shapes it was fitted on, so a GEMM far smaller than any measured one is priced
//   at the smallest measured efficiency, not at an extrapolation towards 0 (0: no floor).
// Monotone non-decreasing in every dimension and never above the ceiling. All-default values
// (1, 0, 0, 0) are the datasheet: every op at 100% of peak.
namespace weft::cluster {

struct MatmulEfficiency {
  double ceiling = 1.0;
  double fill_elements = 0;  // 0 = no fill penalty
  double half_k = 0;         // 0 = no contraction penalty
  double floor = 0;          // 0 = extrapolated down to any shape

  // Efficiency of a GEMM with `parallel` output elements per device (batch × m × n) and
  // contraction length `k` (both > 0); `ceiling` alone for ops that are not GEMMs.
  double at(double parallel, double k) const {
    double e = ceiling;
    if (fill_elements > 0 && parallel < fill_elements) e *= parallel / fill_elements;
    if (half_k > 0) e *= k / (k + half_k);
    return e < floor ? floor : e;
  }
  bool operator==(const MatmulEfficiency&) const = default;
};

}  // namespace weft::cluster
