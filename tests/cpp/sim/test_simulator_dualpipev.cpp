// Simulated steps of DualPipeV (no communication): a step worked out by hand, and the closed form
// at F = B = W. Units as test_simulator_zb.cpp: F, B, W per device, a chunk (v = 2) runs in half.
#include <doctest/doctest.h>

#include "weft/schedule/schedule.hpp"
#include "weft/sim/simulator.hpp"

using namespace weft::schedule;
using namespace weft::sim;

namespace {
Pipeline per_chunk(double F, double B, double W) {
  Pipeline p;
  p.stages.push_back(StageSpec{.forward_time = F / 2, .backward_time = B / 2, .weight_time = W / 2});
  return p;
}
}  // namespace

TEST_CASE("DualPipeV D = 2, M = 4 with unit chunk ops: 25, worked out by hand") {
  // Chunk F = B = W = 1 (per_chunk(2, 2, 2)); stages 0 → 1 → 2 → 3, device 0 holds 0 and 3.
  // Device 0: F0.0 F0.1 F0.2 [0,3]; F3.0 after F2.0 (device 1 ends it at 3) [3,4]; B3.0 W3.0
  // [4,6]; F3.1 after F2.1 (5) [6,7]; F0.3 B3.1 W3.1 [7,10]; F3.2 after F2.2 (9) [10,11]; B0.0
  // after B1.0 (10) [11,12]; W0.0 B3.2 W3.2 [12,15]; F3.3 after F2.3 (15) [15,16]; B0.1 after
  // B1.1 (16) [16,17]; W0.1 B3.3 W3.3 [17,20]; B0.2 after B1.2 (20) [20,21]; W0.2 [21,22]; idle
  // until B1.3 ends at 23; B0.3 W0.3 [23,25].
  // Device 1: idle [0,1] for F0.0; F1.0 F2.0 F1.1 F2.1 F1.2 [1,6]; B2.0 after B3.0 (5) [6,7];
  // W2.0 F2.2 B1.0 W1.0 [7,11]; F1.3 (F0.3 ended at 8) [11,12]; B2.1 (B3.1 at 9) [12,13]; W2.1
  // F2.3 B1.1 W1.1 [13,17]; B2.2 (B3.2 at 14) [17,18]; W2.2 B1.2 W1.2 [18,21]; B2.3 (B3.3 at 19)
  // [21,22]; B1.3 W2.3 W1.3 [22,25].
  // Each device runs 24 unit ops and idles once: 25 (ZB-V's 3MF + (D−1)F/2 with F = 2).
  auto r = simulate(dualpipev(2, 4), per_chunk(2, 2, 2));
  CHECK(r.step_time == doctest::Approx(25.0));
  CHECK(r.bubble_fraction == doctest::Approx(1.0 / 25.0));
}

TEST_CASE("DualPipeV: F = B = W: 3MF + (D-1)F/2 once M >= 2D, the step of ZB-V") {
  // Measured equal to ZB-V's step over the grid: without communication DualPipeV's pairs of
  // forward and whole backward gain nothing on ZB-V; its gain is the overlap of a pair's two
  // halves' communication (torch's OVERLAP_F_B), which a one-op-at-a-time order does not model.
  for (int D = 1; D <= 8; ++D)
    for (int M = 2 * D; M <= 3 * D + 1; ++M) {
      INFO("D=", D, " M=", M);
      auto r = simulate(dualpipev(D, M), per_chunk(1, 1, 1));
      CHECK(r.step_time == doctest::Approx(3.0 * M + (D - 1) * 0.5));
      CHECK(r.step_time == doctest::Approx(simulate(zbv(D, M), per_chunk(1, 1, 1)).step_time));
    }
  // torch's issue-21 shape: pp 4, M 8 and pp 8, M 16 in torch's units (F = I = W = 1)
  CHECK(simulate(dualpipev(4, 8), per_chunk(1, 1, 1)).step_time == doctest::Approx(25.5));
  CHECK(simulate(dualpipev(8, 16), per_chunk(1, 1, 1)).step_time == doctest::Approx(51.5));
}
