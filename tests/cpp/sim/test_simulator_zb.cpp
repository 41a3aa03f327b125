// Simulated steps of interleaved zero bubble, ZB-V and kFkB × interleaving against the published
// formulas (no communication, equal stages) and torch's figures from issue 21; the V placement's
// transfers, optimizer tasks and static memory.
//
// Units: F, B, W are the times of a whole device's share of the model (one stage of a
// non-interleaved pipeline); a schedule with v chunks per device runs each chunk in F/v, B/v, W/v.
// These are the units of torch's comparison (ZB-H1 at pp = 4, M = 8 with F = I = W = 1: 27).
#include <doctest/doctest.h>

#include <cstdlib>

#include "weft/schedule/schedule.hpp"
#include "weft/sim/simulator.hpp"

using namespace weft::schedule;
using namespace weft::sim;

namespace {
Pipeline per_chunk(double F, double B, double W, int v) {
  Pipeline p;
  p.stages.push_back(StageSpec{.forward_time = F / v, .backward_time = B / v, .weight_time = W / v});
  return p;
}
}  // namespace

TEST_CASE("torch's figures (issue 21): interleaved ZB (v = 2), ZB-V: 25.5 (pp 4, M 8), 51.5 (pp 8, M 16)") {
  CHECK(simulate(zb_interleaved(4, 2, 8), per_chunk(1, 1, 1, 2)).step_time == doctest::Approx(25.5));
  CHECK(simulate(zbv(4, 8), per_chunk(1, 1, 1, 2)).step_time == doctest::Approx(25.5));
  CHECK(simulate(zb_interleaved(8, 2, 16), per_chunk(1, 1, 1, 2)).step_time == doctest::Approx(51.5));
  CHECK(simulate(zbv(8, 16), per_chunk(1, 1, 1, 2)).step_time == doctest::Approx(51.5));
  // against ZB-H1, weft's best before: 27 and 55
  CHECK(simulate(zb_h1(4, 8), per_chunk(1, 1, 1, 1)).step_time == doctest::Approx(27.0));
  CHECK(simulate(zb_h1(8, 16), per_chunk(1, 1, 1, 1)).step_time == doctest::Approx(55.0));
}

TEST_CASE("interleaved ZB: step M(F+B+W) + (D-1)(F+B-W)/v (ZB-H1's bubble over v), W <= B") {
  const double times[][3] = {{1, 1, 1}, {1, 2, 1}, {2, 1, 1}, {1, 2, 0.5}, {3, 2, 1}, {1, 1, 0.5}};
  for (int D = 1; D <= 6; ++D)
    for (int v = 1; v <= 3; ++v)
      for (int M = D; M <= 3 * D; ++M)
        for (const auto& t : times) {
          const double F = t[0], B = t[1], W = t[2];
          auto r = simulate(zb_interleaved(D, v, M), per_chunk(F, B, W, v));
          INFO("D=", D, " v=", v, " M=", M, " F=", F, " B=", B, " W=", W);
          CHECK(r.step_time == doctest::Approx(M * (F + B + W) + (D - 1) * (F + B - W) / v));
        }
}

TEST_CASE("ZB-V: F = B = W: only the last device's fill (D-1)F/2 is idle once M >= 2D-1") {
  for (int D = 1; D <= 8; ++D)
    for (int M = 2 * D - 1; M <= 3 * D; ++M) {
      auto r = simulate(zbv(D, M), per_chunk(1, 1, 1, 2));
      INFO("D=", D, " M=", M);
      // the last device's first op, F of stage D−1, cannot start before D−1 chunk forwards; from then
      // on no device waits: the step is that fill plus the device's work
      CHECK(r.step_time == doctest::Approx(3.0 * M + (D - 1) * 0.5));
      CHECK(r.bubble_fraction == doctest::Approx(1.0 - 3.0 * M / (3.0 * M + (D - 1) * 0.5)));
    }
}

TEST_CASE("kFkB x interleaving: interleaved 1F1B's step (M + (D-1)/v)(F+B) for every k, M >= D") {
  // As for kFkB (whose step is 1F1B's for every k): without communication the group size does not
  // change the step, the ops of a group flow through the pipeline one micro-batch after the other.
  for (int D = 1; D <= 5; ++D)
    for (int v = 2; v <= 3; ++v)
      for (int k = 1; k <= 4; ++k)
        for (int M = D; M <= 3 * D + 1; ++M) {
          const double F = 1, B = 2;
          auto r = simulate(kfkb_interleaved(D, v, M, k), per_chunk(F, B, 0, v));
          INFO("D=", D, " v=", v, " k=", k, " M=", M);
          CHECK(r.step_time == doctest::Approx((M + double(D - 1) / v) * (F + B)));
        }
}

TEST_CASE("V placement in the simulator: local hop at the V's tip, transfers only between neighbours") {
  for (int D = 2; D <= 5; ++D) {
    const int M = 2 * D;
    Pipeline p = per_chunk(1, 1, 1, 2);
    p.stages[0].activation_bytes = 100;
    p.links.push_back(LinkSpec{.bandwidth = 100.0 / 0.25, .latency = 0.0, .trace = {}});
    SimOptions o;
    o.record_timeline = true;
    auto r = simulate(zbv(D, M), p, o);
    CHECK_FALSE(r.deadlock);
    int acts = 0, grads = 0;
    for (const auto& e : r.timeline) {
      if (e.kind == TaskKind::SendActivation) {
        ++acts;
        CHECK(e.stage != D - 1);  // stages D−1 and D share device D−1
        CHECK(std::abs(e.device - e.peer) == 1);
      }
      if (e.kind == TaskKind::SendGradient) {
        ++grads;
        CHECK(e.stage != D);
        CHECK(std::abs(e.device - e.peer) == 1);
      }
    }
    // 2D − 1 stage boundaries, one of them on a device: 2D − 2 transfers per micro-batch each way
    CHECK(acts == M * (2 * D - 2));
    CHECK(grads == M * (2 * D - 2));
    // communication can only lengthen the step
    CHECK(r.step_time >= simulate(zbv(D, M), per_chunk(1, 1, 1, 2)).step_time);
  }
}

TEST_CASE("V placement: one optimizer per stage on its device, static memory of the device's stages") {
  const int D = 3;
  Pipeline p;
  for (int s = 0; s < 2 * D; ++s)
    p.stages.push_back(StageSpec{.forward_time = 1,
                                 .backward_time = 1,
                                 .weight_time = 1,
                                 .activation_memory = 0,
                                 .static_memory = double(s + 1),
                                 .optimizer_time = 0.5});
  SimOptions o;
  o.record_timeline = true;
  auto r = simulate(zbv(D, 2 * D), p, o);
  for (int d = 0; d < D; ++d)  // stages d and 2D−1−d: (d+1) + (2D−d)
    CHECK(r.peak_memory[static_cast<std::size_t>(d)] == doctest::Approx(2.0 * D + 1));
  int opt = 0;
  for (const auto& e : r.timeline)
    if (e.kind == TaskKind::Optimizer) {
      ++opt;
      CHECK(e.device == (e.stage < D ? e.stage : 2 * D - 1 - e.stage));
    }
  CHECK(opt == 2 * D);
}
