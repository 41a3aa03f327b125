#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "weft/core/error.hpp"
#include "weft/schedule/schedule.hpp"
#include "weft/sim/simulator.hpp"

using namespace weft::schedule;
using namespace weft::sim;

namespace {
Pipeline no_comm(double tf, double tb, double tw = 0) {
  Pipeline p;
  p.stages.push_back(StageSpec{.forward_time = tf, .backward_time = tb, .weight_time = tw});
  return p;
}
// transfers of exactly `c` time units on every boundary (bytes / bandwidth = c, no latency)
Pipeline with_comm(double tf, double tb, double c) {
  Pipeline p = no_comm(tf, tb);
  p.stages[0].activation_bytes = 1000.0;
  p.links.push_back(LinkSpec{.bandwidth = 1000.0 / c, .latency = 0.0, .trace = {}});
  return p;
}
double end_of(const SimResult& r, TaskKind k, int stage, int micro) {
  for (const auto& e : r.timeline)
    if (e.kind == k && e.stage == stage && e.micro == micro && e.peer < 0) return e.end;
  return -1;
}
double start_of(const SimResult& r, TaskKind k, int stage, int micro) {
  for (const auto& e : r.timeline)
    if (e.kind == k && e.stage == stage && e.micro == micro && e.peer < 0) return e.start;
  return -1;
}
}  // namespace

TEST_CASE("no communication: step (M+S-1)(Tf+Tb) for GPipe, 1F1B, kFkB, eager-1F1B") {
  for (int S = 1; S <= 6; ++S)
    for (int M = 1; M <= 12; ++M) {
      const double tf = 1.0, tb = 2.0, want = (M + S - 1) * (tf + tb);
      std::vector<Schedule> all{gpipe(S, M), one_f_one_b(S, M), eager_1f1b(S, M)};
      for (int k = 2; k <= M; ++k) all.push_back(kfkb(S, M, k));
      for (const auto& s : all) {
        auto r = simulate(s, no_comm(tf, tb));
        INFO(s.to_string());
        CHECK(r.step_time == doctest::Approx(want));
        // bubble = (S-1)/(M+S-1)
        CHECK(r.bubble_fraction == doctest::Approx(double(S - 1) / (M + S - 1)));
      }
    }
}

TEST_CASE("interleaved 1F1B: bubble (D-1)(tf+tb) against M*v*(tf+tb) of work per device") {
  for (int D = 2; D <= 4; ++D)
    for (int v = 1; v <= 3; ++v)
      for (int M : {D, 2 * D, 3 * D}) {
        auto s = interleaved_1f1b(D, v, M);
        const double tf = 1.0, tb = 2.0;
        auto r = simulate(s, no_comm(tf, tb));
        INFO(s.to_string());
        CHECK(r.step_time == doctest::Approx((M * v + D - 1) * (tf + tb)));
      }
}

TEST_CASE("ZB-H1: bubble (S-1)(Tf+Tb-Tw)") {
  for (int S = 2; S <= 6; ++S)
    for (int M = S; M <= 3 * S; M += S) {
      auto r = simulate(zb_h1(S, M), no_comm(1.0, 1.0, 1.0));
      INFO("S=", S, " M=", M);
      CHECK(r.step_time == doctest::Approx(M * 3.0 + (S - 1) * (1.0 + 1.0 - 1.0)));
      // 1F1B with the same total backward (B+W fused) has bubble (S-1)(Tf+Tb+Tw)
      auto o = simulate(one_f_one_b(S, M), no_comm(1.0, 1.0, 1.0));
      CHECK(o.step_time == doctest::Approx(M * 3.0 + (S - 1) * 3.0));
    }
}

TEST_CASE("kFkB with communication: hand-computed 2-stage case (Tb = 2Tf, transfer 0.5Tf)") {
  // See docs/modules/sim.md for the hand derivation: 1F1B 17, 2F2B 16.
  auto r1 = simulate(one_f_one_b(2, 4), with_comm(1.0, 2.0, 0.5));
  auto r2 = simulate(kfkb(2, 4, 2), with_comm(1.0, 2.0, 0.5));
  CHECK(r1.step_time == doctest::Approx(17.0));
  CHECK(r2.step_time == doctest::Approx(16.0));
  CHECK(start_of(r1, TaskKind::B, 0, 1) == doctest::Approx(8.0));
  CHECK(start_of(r2, TaskKind::B, 0, 1) == doctest::Approx(8.0));
  CHECK(start_of(r1, TaskKind::F, 1, 1) == doctest::Approx(4.5));
  CHECK(start_of(r2, TaskKind::F, 1, 2) == doctest::Approx(7.5));
}

TEST_CASE("kFkB with communication (Ada-Grouper Fig. 2): 2F2B beats 1F1B") {
  for (int S : {2, 4, 8})
    for (int M : {8, 16}) {
      auto r1 = simulate(one_f_one_b(S, M), with_comm(1.0, 2.0, 0.5));
      auto r2 = simulate(kfkb(S, M, 2), with_comm(1.0, 2.0, 0.5));
      INFO("S=", S, " M=", M);
      CHECK(r2.step_time < r1.step_time);
    }
}

TEST_CASE("eager-1F1B: forward outputs are ready a slot ahead in the steady phase; 1F1B has no slack") {
  const int S = 4, M = 12;
  auto e = simulate(eager_1f1b(S, M), no_comm(1.0, 1.0));
  auto o = simulate(one_f_one_b(S, M), no_comm(1.0, 1.0));
  int steady = 0;
  for (int i = 0; i + 1 < S; ++i) {
    const double first_b = start_of(e, TaskKind::B, i + 1, 0);
    for (int m = 0; m < M; ++m) {
      const double need = start_of(e, TaskKind::F, i + 1, m);
      if (need < first_b) continue;  // consumed in stage i+1's warm-up: the pipeline is filling
      ++steady;
      INFO("stage ", i, " micro ", m);
      CHECK(need - end_of(e, TaskKind::F, i, m) >= 1.0);
    }
  }
  CHECK(steady > 10);
  // in 1F1B the steady-phase forward of stage i+1 starts the moment stage i's output exists
  int zero = 0;
  for (int i = 0; i + 1 < S; ++i)
    for (int m = S; m < M; ++m)
      zero += start_of(o, TaskKind::F, i + 1, m) - end_of(o, TaskKind::F, i, m) == 0.0;
  CHECK(zero > 0);
  // with a transfer of one slot, eager-1F1B's step grows less than 1F1B's
  auto e1 = simulate(eager_1f1b(S, M), with_comm(1.0, 1.0, 1.0));
  auto o1 = simulate(one_f_one_b(S, M), with_comm(1.0, 1.0, 1.0));
  CHECK(e1.step_time < o1.step_time);
}

TEST_CASE("memory: static + in-flight x activation bytes; peaks from the simulator") {
  Pipeline p = no_comm(1, 2);
  p.stages[0].static_memory = 100;
  p.stages[0].activation_memory = 10;
  auto r = simulate(kfkb(4, 8, 2), p);
  CHECK(r.peak_in_flight == std::vector<int>{8, 6, 4, 2});
  CHECK(r.peak_memory == std::vector<double>{180, 160, 140, 120});
}

TEST_CASE("bandwidth trace slows transfers at absolute time") {
  // S=2, M=1: F0 [0,1], activation 10 B at 10 B/s with f = 0.5 on [0, 100) -> 2 s, F1 [3,4], B1 [4,6],
  // gradient 2 s -> B0 [8,10]
  Pipeline p = no_comm(1, 2);
  p.stages[0].activation_bytes = 10;
  p.links.push_back(
      LinkSpec{.bandwidth = 10, .latency = 0, .trace = weft::cluster::BandwidthTrace({0, 100}, {0.5, 1})});
  auto r = simulate(one_f_one_b(2, 1), p);
  CHECK(r.step_time == doctest::Approx(10.0));
  // reading the trace from t = 98.5: the first transfer starts at 99.5 and straddles the change:
  // 0.5 s at 5 B/s (2.5 B) + 0.75 s at 10 B/s -> F1 [2.25, 3.25], B1 [3.25, 5.25], grad 1 s, B0 [6.25, 8.25]
  auto r2 = simulate(one_f_one_b(2, 1), p, SimOptions{.trace_offset = 98.5});
  CHECK(start_of(r2, TaskKind::F, 1, 0) == doctest::Approx(2.25));
  CHECK(r2.step_time == doctest::Approx(8.25));
  // latency adds to each transfer
  p.links[0].latency = 0.25;
  CHECK(simulate(one_f_one_b(2, 1), p).step_time == doctest::Approx(10.5));
}

TEST_CASE("a broken order is reported as a deadlock, not a hang") {
  auto order = one_f_one_b(3, 4).order();
  std::swap(order[1][1], order[1][2]);  // stage 1: F0 B0 F1 ... B0 before its gradient can come
  std::swap(order[2][0], order[2][1]);  // stage 2: B0 before F0
  Schedule bad("broken", 3, 3, 4, false, order);
  auto r = simulate(bad, with_comm(1, 2, 0.5));
  CHECK(r.deadlock);
  CHECK(r.deadlock_report.find("device 2 blocked at B(s2,m0) waiting for F(s2,m0)") != std::string::npos);
  CHECK(r.to_string().find("DEADLOCK") != std::string::npos);
  // a pairing mismatch is refused up front
  auto order2 = one_f_one_b(3, 4).order();
  std::swap(order2[1][0], order2[1][1]);
  CHECK_THROWS_WITH_AS(simulate(Schedule("swapped", 3, 3, 4, false, order2), with_comm(1, 2, 0.5)),
                       doctest::Contains("send/recv mismatch"), weft::Error);
}

TEST_CASE("Chrome trace export and input validation") {
  auto r = simulate(one_f_one_b(3, 4), with_comm(1, 2, 0.5));
  auto j = nlohmann::json::parse(r.to_chrome_trace());
  int x = 0;
  for (const auto& e : j["traceEvents"]) x += e["ph"] == "X";
  CHECK(x == static_cast<int>(r.num_tasks));
  CHECK(r.num_tasks == 3 * 4 * 2 + 3 + 2 * 2 * 4);  // ops + optimizer steps + transfers
  CHECK(r.events == r.num_tasks);
  Pipeline bad = no_comm(1, 2);
  bad.stages[0].forward_time = -1;
  CHECK_THROWS_AS(simulate(one_f_one_b(2, 2), bad), weft::Error);
  Pipeline two = no_comm(1, 2);
  two.stages.push_back(two.stages[0]);
  CHECK_THROWS_WITH_AS(simulate(one_f_one_b(3, 2), two), doctest::Contains("stage specs"), weft::Error);
  Pipeline l = with_comm(1, 2, 1);
  l.links.push_back(l.links[0]);
  l.links.push_back(l.links[0]);
  l.links.push_back(l.links[0]);
  CHECK_THROWS_WITH_AS(simulate(one_f_one_b(2, 2), l), doctest::Contains("links"), weft::Error);
  // interleaved over 3 devices needs the wrap-around link 2 -> 0
  Pipeline l2 = with_comm(1, 2, 1);
  l2.links.push_back(l2.links[0]);
  CHECK_THROWS_WITH_AS(simulate(interleaved_1f1b(3, 2, 3), l2), doctest::Contains("needs link 2"),
                       weft::Error);
}

TEST_CASE("interleaved with communication uses the wrap-around link and stays deadlock-free") {
  for (int D : {2, 3, 4}) {
    Pipeline p = with_comm(1, 2, 0.5);
    p.links.assign(static_cast<std::size_t>(D), p.links[0]);
    auto s = interleaved_1f1b(D, 2, 2 * D);
    auto r = simulate(s, p);
    INFO("D=", D);
    CHECK_FALSE(r.deadlock);
    CHECK(r.step_time > (2 * D * 2 + D - 1) * 3.0);  // slower than without communication
    int wraps = 0;
    for (const auto& e : r.timeline) wraps += e.kind == TaskKind::SendActivation && e.device == D - 1 && e.peer == 0;
    CHECK(wraps == 2 * D);  // chunk 0 -> chunk 1 for every micro-batch
  }
}

TEST_CASE("simulation is deterministic") {
  Pipeline p = with_comm(1, 2, 0.7);
  p.links[0].trace = weft::cluster::BandwidthTrace::preempted(5, {.duration = 100, .normal_min = 1, .normal_max = 5,
                                                                  .preempt_min = 1, .preempt_max = 5});
  auto a = simulate(kfkb(5, 20, 3), p), b = simulate(kfkb(5, 20, 3), p);
  CHECK(a.step_time == b.step_time);
  CHECK(a.to_chrome_trace() == b.to_chrome_trace());
}
