// Replica collectives (ZeRO / FSDP / DDP) on each device's communication stream: hand-computed
// timelines (docs/modules/sim.md, "Collectives").
#include <doctest/doctest.h>

#include "weft/core/error.hpp"
#include "weft/schedule/schedule.hpp"
#include "weft/sim/simulator.hpp"

using namespace weft::schedule;
using namespace weft::sim;

namespace {
const TimelineEntry* find(const SimResult& r, TaskKind k, int micro, int nth = 0) {
  for (const auto& e : r.timeline)
    if (e.kind == k && e.micro == micro && nth-- == 0) return &e;
  return nullptr;
}
// One stage on one device, 1F1B over 2 micro-batches: F0 B0 F1 B1, then the optimizer.
Pipeline one_stage(double tf, double tb, double opt, ReplicaCollectives rc) {
  Pipeline p;
  p.stages.push_back(
      StageSpec{.forward_time = tf, .backward_time = tb, .optimizer_time = opt, .replica = rc});
  return p;
}
}  // namespace

TEST_CASE("ZeRO-3 on one stage: prefetched gathers, overlapped reduce-scatters, contention on the stream") {
  // Gathers of 2 before F and B (a quarter of each before the compute may start), reduce-scatters
  // of 2 after B (a quarter of it left after B ends). By hand, stream order GF0 GB0 R0 GF1 GB1 R1:
  //   GF0 [0, 0.5) + [0.5, 2); F0 [0.5, 4.5) (not before 2 + 1); GB0 [2, 2.5) + [2.5, 4) prefetched
  //   during F0; B0 [4.5, 12.5); R0 starts with B0 at 4.5, ends at 12.5 + 0.5 = 13; GF1 waits for R0
  //   on the stream: [13, 13.5) + [13.5, 15); F1 [13.5, 17.5); GB1 [15, 17); B1 [17.5, 25.5);
  //   R1 [17.5, 26); the optimizer after R1: [26, 27).
  ReplicaCollectives rc{.gather_forward = 2,
                        .gather_backward = 2,
                        .reduce_backward = 2,
                        .gather_unit = 0.25,
                        .reduce_unit = 0.25};
  const auto r = simulate(one_f_one_b(1, 2), one_stage(4, 8, 1, rc));
  REQUIRE_FALSE(r.deadlock);
  CHECK(r.step_time == doctest::Approx(27.0));
  CHECK(find(r, TaskKind::F, 0)->start == doctest::Approx(0.5));
  CHECK(find(r, TaskKind::B, 0)->start == doctest::Approx(4.5));
  CHECK(find(r, TaskKind::Reduce, 0)->start == doctest::Approx(4.5));
  CHECK(find(r, TaskKind::Reduce, 0)->end == doctest::Approx(13.0));
  CHECK(find(r, TaskKind::Gather, 1)->start == doctest::Approx(13.0));  // behind R0 on the stream
  CHECK(find(r, TaskKind::F, 1)->start == doctest::Approx(13.5));
  CHECK(find(r, TaskKind::B, 1)->end == doctest::Approx(25.5));
  CHECK(find(r, TaskKind::Optimizer, -1)->start == doctest::Approx(26.0));
  CHECK(r.busy_time[0] == doctest::Approx(4 + 8 + 4 + 8 + 1));  // compute only
  CHECK(r.collective_time[0] == doctest::Approx(2 * (2 + 2 + 2)));
  // The planner's closed-form overlap rule prices this at 2·(4.5 + 9) + 1 = 28: the stream lets
  // the backward's gather hide behind the forward, which the rule does not see.

  SUBCASE("without prefetch a gather waits for the compute before it to end") {
    rc.prefetch = false;
    const auto q = simulate(one_f_one_b(1, 2), one_stage(4, 8, 1, rc));
    CHECK(find(q, TaskKind::Gather, 0, 2)->start == doctest::Approx(4.5));  // GB0's first part after F0
    CHECK(find(q, TaskKind::B, 0)->start == doctest::Approx(5.0));
  }
  SUBCASE("units of 1: nothing overlaps") {
    ReplicaCollectives serial{
        .gather_forward = 2, .gather_backward = 2, .reduce_backward = 2, .prefetch = false};
    const auto q = simulate(one_f_one_b(1, 2), one_stage(4, 8, 1, serial));
    // per micro-batch 2 + 4 + 2 + 8 + 2 (the reduce-scatter after B), then the optimizer
    CHECK(q.step_time == doctest::Approx(2 * 18 + 1));
  }
}

TEST_CASE(
    "ZeRO-1 / DDP: the step's gradient sync beside the last backward, the parameters' all-gather after the "
    "update") {
  // F0 [0,4) B0 [4,12) F1 [12,16) B1 [16,24); sync of 3 starts with B1 and ends at 24 + 0.75; the
  // optimizer [24.75, 25.75); the all-gather of 2 [25.75, 27.75) ends the step.
  const ReplicaCollectives rc{.step_sync = 3, .step_gather = 2, .sync_unit = 0.25};
  auto p = one_stage(4, 8, 1, rc);
  const auto r = simulate(one_f_one_b(1, 2), p);
  CHECK(r.step_time == doctest::Approx(27.75));
  CHECK(find(r, TaskKind::Reduce, -1)->start == doctest::Approx(16.0));
  CHECK(find(r, TaskKind::Reduce, -1)->end == doctest::Approx(24.75));
  SUBCASE("a busy network slows the replica collectives (trace at absolute time)") {
    p.replica_trace = weft::cluster::BandwidthTrace::constant(0.5);
    // sync 6: [16, 22), ends at 24 + 1.5; optimizer [25.5, 26.5); gather 4: [26.5, 30.5)
    CHECK(simulate(one_f_one_b(1, 2), p).step_time == doctest::Approx(30.5));
    p.replica_trace = weft::cluster::BandwidthTrace({0.0, 26.0}, {1.0, 0.5});
    // sync as at full bandwidth; the gather from 25.75: 0.25 s at full, 1.75 left at half: 3.5 s
    CHECK(simulate(one_f_one_b(1, 2), p).step_time == doctest::Approx(29.5));
    SimOptions o;
    o.trace_offset = 100.0;  // the whole step in the slow part
    CHECK(simulate(one_f_one_b(1, 2), p, o).step_time == doctest::Approx(30.5));
  }
}

TEST_CASE(
    "split backward: a micro-batch's reduce-scatter runs beside its W; every stage's update waits for its "
    "own") {
  ReplicaCollectives rc{.gather_forward = 0.5,
                        .gather_backward = 0.5,
                        .reduce_backward = 1.0,
                        .gather_unit = 0.5,
                        .reduce_unit = 0.5};
  Pipeline p;
  p.stages.push_back(StageSpec{
      .forward_time = 1, .backward_time = 1, .weight_time = 1, .optimizer_time = 0.5, .replica = rc});
  const auto r = simulate(zb_h1(3, 6), p);
  REQUIRE_FALSE(r.deadlock);
  int reduces = 0;
  for (const auto& e : r.timeline) {
    if (e.kind != TaskKind::Reduce) continue;
    ++reduces;
    double w_start = -1, w_end = -1;
    for (const auto& w : r.timeline)
      if (w.kind == TaskKind::W && w.stage == e.stage && w.micro == e.micro) w_start = w.start, w_end = w.end;
    CHECK(e.start >= w_start - 1e-12);
    CHECK(e.end >= w_end + 0.5 - 1e-12);  // half of it left after W
    for (const auto& o : r.timeline)
      if (o.kind == TaskKind::Optimizer && o.stage == e.stage) CHECK(o.start >= e.end - 1e-12);
  }
  CHECK(reduces == 3 * 6);
  // The collectives never overlap on one device's stream.
  for (int d = 0; d < 3; ++d) {
    double last = 0;
    for (const auto& e : r.timeline)
      if ((e.kind == TaskKind::Gather || e.kind == TaskKind::Reduce) && e.device == d) {
        CHECK(e.start >= last - 1e-12);
        last = e.end;
      }
  }
  // More collective time than the compute can hide: the stream bounds the step.
  rc.reduce_backward = 10;
  p.stages[0].replica = rc;
  const auto q = simulate(zb_h1(3, 6), p);
  for (int d = 0; d < 3; ++d)
    CHECK(q.collective_time[static_cast<std::size_t>(d)] == doctest::Approx(6 * 11.0));
  CHECK(q.step_time >= 6 * 11.0);
  CHECK(q.step_time > r.step_time + 40);
}

TEST_CASE("replica collectives: input checks and determinism") {
  ReplicaCollectives rc{.gather_forward = 1, .gather_unit = 0};
  CHECK_THROWS_AS(simulate(one_f_one_b(1, 2), one_stage(1, 1, 0, rc)), weft::Error);
  rc.gather_unit = 0.5;
  rc.reduce_backward = -1;
  CHECK_THROWS_AS(simulate(one_f_one_b(1, 2), one_stage(1, 1, 0, rc)), weft::Error);
  rc.reduce_backward = 1;
  const auto a = simulate(interleaved_1f1b(2, 2, 4), one_stage(1, 2, 0.5, rc));
  const auto b = simulate(interleaved_1f1b(2, 2, 4), one_stage(1, 2, 0.5, rc));
  REQUIRE_FALSE(a.deadlock);
  CHECK(a.step_time == b.step_time);
  CHECK(a.to_chrome_trace() == b.to_chrome_trace());
  CHECK(a.to_chrome_trace().find("replica collectives") != std::string::npos);
}
