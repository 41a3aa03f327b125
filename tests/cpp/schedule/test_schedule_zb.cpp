// Interleaved zero bubble, ZB-V (V placement) and kFkB × interleaving: identities with the older
// generators, the checks over a grid, placements, peaks against brute force and closed forms.
#include <doctest/doctest.h>

#include <algorithm>
#include <set>
#include <string>
#include <utility>

#include "weft/core/error.hpp"
#include "weft/schedule/schedule.hpp"

using namespace weft::schedule;

namespace {
// Per device: the largest number of (stage, micro) pairs whose F is in a prefix of the device's
// order and whose last backward op (W when split, else B) is not — by sets over every prefix.
std::vector<int> brute_peak_device(const Schedule& s) {
  std::vector<int> out;
  const OpKind last = s.split_backward() ? OpKind::W : OpKind::B;
  for (int d = 0; d < s.num_devices(); ++d) {
    const auto& o = s.device_order(d);
    int best = 0;
    for (std::size_t n = 0; n <= o.size(); ++n) {
      std::set<std::pair<int, int>> held;
      for (std::size_t i = 0; i < n; ++i)
        if (o[i].kind == OpKind::F) held.insert({o[i].stage, o[i].micro});
      for (std::size_t i = 0; i < n; ++i)
        if (o[i].kind == last) held.erase({o[i].stage, o[i].micro});
      best = std::max(best, static_cast<int>(held.size()));
    }
    out.push_back(best);
  }
  return out;
}
}  // namespace

TEST_CASE("zb_interleaved with v = 1 is ZB-H1; kfkb_interleaved with k = 1 is interleaved 1F1B, v = 1 kFkB") {
  for (int D = 1; D <= 8; ++D)
    for (int M = 1; M <= 16; ++M) {
      CHECK(zb_interleaved(D, 1, M).order() == zb_h1(D, M).order());
      for (int k = 1; k <= 4; ++k) CHECK(kfkb_interleaved(D, 1, M, k).order() == kfkb(D, M, k).order());
      if (M >= D)
        for (int v = 2; v <= 3; ++v)
          CHECK(kfkb_interleaved(D, v, M, 1).order() == interleaved_1f1b(D, v, M).order());
    }
}

TEST_CASE("hand-written orders: ZB-V (D = 2, M = 3) and interleaved zero bubble (D = 2, v = 2, M = 2)") {
  // ZB-V, device 0 holds stages 0 and 3, device 1 stages 1 and 2. Device 0: 2D−1 = 3 forwards of
  // stage 0; D = 2 times (F, B, W) of stage 3; (B, W) stage 0 and (F, B, W) stage 3 while stage 3
  // lags; then (B, W) of stage 0 twice. Device 1: F(1) then (F(2), F(1)) once, (F, B, W) of stage
  // 2 once, the steady pair, then B(1) B(2), (B, W) of stage 1, the remaining W.
  const Schedule z = zbv(2, 3);
  CHECK(z.placement() == std::vector<int>{0, 1, 1, 0});
  const std::vector<Op> d0{{OpKind::F, 0, 0}, {OpKind::F, 0, 1}, {OpKind::F, 0, 2}, {OpKind::F, 3, 0},
                           {OpKind::B, 3, 0}, {OpKind::W, 3, 0}, {OpKind::F, 3, 1}, {OpKind::B, 3, 1},
                           {OpKind::W, 3, 1}, {OpKind::B, 0, 0}, {OpKind::W, 0, 0}, {OpKind::F, 3, 2},
                           {OpKind::B, 3, 2}, {OpKind::W, 3, 2}, {OpKind::B, 0, 1}, {OpKind::W, 0, 1},
                           {OpKind::B, 0, 2}, {OpKind::W, 0, 2}};
  const std::vector<Op> d1{{OpKind::F, 1, 0}, {OpKind::F, 2, 0}, {OpKind::F, 1, 1}, {OpKind::F, 2, 1},
                           {OpKind::B, 2, 0}, {OpKind::W, 2, 0}, {OpKind::F, 1, 2}, {OpKind::B, 1, 0},
                           {OpKind::W, 1, 0}, {OpKind::F, 2, 2}, {OpKind::B, 2, 1}, {OpKind::W, 2, 1},
                           {OpKind::B, 1, 1}, {OpKind::B, 2, 2}, {OpKind::B, 1, 2}, {OpKind::W, 1, 1},
                           {OpKind::W, 2, 2}, {OpKind::W, 1, 2}};
  CHECK(z.device_order(0) == d0);
  CHECK(z.device_order(1) == d1);
  CHECK(z.to_text() ==
        "d0: F0.0 F1.0 F2.0 F0.1 B0.1 W0.1 F1.1 B1.1 W1.1 B0.0 W0.0 F2.1 B2.1 W2.1 B1.0 W1.0 B2.0 W2.0\n"
        "d1: F0.0 F0.1 F1.0 F1.1 B0.1 W0.1 F2.0 B0.0 W0.0 F2.1 B1.1 W1.1 B1.0 B2.1 B2.0 W1.0 W2.1 W2.0\n");
  // Interleaved ZB, one round of R = 2: device 1 warms up (v−1)R + D−1−d = 2 forwards (chunk 0),
  // then (F, B) pairs, each W one B after its own (d = 1); device 0 one more forward, W at once.
  const Schedule i = zb_interleaved(2, 2, 2);
  CHECK(i.placement() == std::vector<int>{0, 1, 0, 1});
  const std::vector<Op> i1{{OpKind::F, 1, 0}, {OpKind::F, 1, 1}, {OpKind::F, 3, 0}, {OpKind::B, 3, 0},
                           {OpKind::F, 3, 1}, {OpKind::B, 3, 1}, {OpKind::W, 3, 0}, {OpKind::B, 1, 0},
                           {OpKind::W, 3, 1}, {OpKind::B, 1, 1}, {OpKind::W, 1, 0}, {OpKind::W, 1, 1}};
  CHECK(i.device_order(1) == i1);
  const std::vector<Op> i0{{OpKind::F, 0, 0}, {OpKind::F, 0, 1}, {OpKind::F, 2, 0}, {OpKind::F, 2, 1},
                           {OpKind::B, 2, 0}, {OpKind::W, 2, 0}, {OpKind::B, 2, 1}, {OpKind::W, 2, 1},
                           {OpKind::B, 0, 0}, {OpKind::W, 0, 0}, {OpKind::B, 0, 1}, {OpKind::W, 0, 1}};
  CHECK(i.device_order(0) == i0);
}

TEST_CASE("every new order passes the dependency and pairing checks (D <= 8, M <= 16, v <= 3, k <= 4)") {
  int n = 0;
  for (int D = 1; D <= 8; ++D)
    for (int M = 1; M <= 16; ++M) {
      std::vector<Schedule> all{zbv(D, M)};
      for (int v = 1; v <= 3; ++v) {
        all.push_back(zb_interleaved(D, v, M));  // M < D too: one round of M (torch's rule)
        for (int k = 1; k <= 4; ++k) all.push_back(kfkb_interleaved(D, v, M, k));  // any G = ceil(M/k)
      }
      for (const auto& s : all) {
        auto c = check_order(s);
        INFO(s.to_string(), " ", c.to_string());
        CHECK(c.ok);
        ++n;
      }
    }
  CHECK(n > 1000);
}

TEST_CASE("fewer micro-batches (groups) than devices: one round, as torch; bad arguments") {
  // One round of M: device d warms up (v−1)M + D−1−d forwards (all Mv when that is more), then
  // the first (F, B) pair adds one forward before the first B.
  const Schedule z = zb_interleaved(4, 2, 3);
  int lead = 0;
  while (z.device_order(1)[static_cast<std::size_t>(lead)].kind == OpKind::F) ++lead;
  CHECK(lead == (3 + 2) + 1);
  // kFkB × interleaving over 3 groups (of 3, 3, 2) on 4 devices: the group order of one round
  const Schedule k = kfkb_interleaved(4, 2, 8, 3);
  CHECK(k.device_order(0).front() == Op{OpKind::F, 0, 0});
  CHECK(k.num_ops() == 2u * 8 * 8);
  CHECK_THROWS_AS(zb_interleaved(2, 0, 4), weft::Error);
  CHECK_THROWS_AS(kfkb_interleaved(2, 2, 4, 0), weft::Error);
  CHECK_THROWS_AS(zbv(0, 4), weft::Error);
  CHECK_THROWS_WITH_AS(make_schedule("zbv", 2, 4, 1, 3), doctest::Contains("v = 2"), weft::Error);
}

TEST_CASE("placements: V shape, default s mod D, validation, JSON") {
  CHECK(v_placement(3) == std::vector<int>{0, 1, 2, 2, 1, 0});
  CHECK(loop_placement(6, 3) == std::vector<int>{0, 1, 2, 0, 1, 2});
  const Schedule z = zbv(3, 6);
  CHECK(z.num_stages() == 6);
  CHECK(z.virtual_stages() == 2);
  CHECK_FALSE(z.default_placement());
  for (int s = 0; s < 6; ++s) {
    CHECK(z.device_of(s) == (s < 3 ? s : 5 - s));
    CHECK(z.chunk_of(s) == (s < 3 ? 0 : 1));
  }
  for (int d = 0; d < 3; ++d)
    for (const Op& op : z.device_order(d)) CHECK(z.device_of(op.stage) == d);
  const Schedule i = zb_interleaved(3, 2, 6);
  CHECK(i.default_placement());
  CHECK(i.chunk_of(4) == 1);
  CHECK(i.device_of(4) == 1);
  // JSON: the V placement round-trips; a default placement writes no field (older JSON unchanged)
  auto back = Schedule::from_json(z.to_json());
  CHECK(back == z);
  CHECK(back.hash() == z.hash());
  CHECK(z.to_json().find("\"placement\"") != std::string::npos);
  CHECK(i.to_json().find("\"placement\"") == std::string::npos);
  CHECK(one_f_one_b(3, 4).to_json().find("\"placement\"") == std::string::npos);
  CHECK(Schedule::from_json(i.to_json()) == i);
  // the same order under another placement is another schedule
  CHECK_THROWS_WITH_AS(Schedule("x", 6, 3, 6, true, z.order()), doctest::Contains("lives on device"),
                       weft::Error);
  // validation of the placement itself
  auto ord = zbv(2, 2).order();
  CHECK_THROWS_WITH_AS(Schedule("x", 4, 2, 2, true, ord, {0, 1, 1}),
                       doctest::Contains("placement of 3 stages"), weft::Error);
  CHECK_THROWS_WITH_AS(Schedule("x", 4, 2, 2, true, ord, {0, 1, 1, 2}), doctest::Contains("on device 2"),
                       weft::Error);
  CHECK_THROWS_WITH_AS(Schedule("x", 4, 2, 2, true, ord, {0, 1, 1, 1}),
                       doctest::Contains("every device must hold 2"), weft::Error);
  CHECK_NOTHROW(Schedule("x", 4, 2, 2, true, ord, {0, 1, 1, 0}));
  CHECK(make_schedule("zbv", 3, 6).order() == z.order());
  CHECK(make_schedule("zbv", 3, 6, 1, 2) == z);
  CHECK(make_schedule("zb_interleaved", 3, 6, 1, 2) == i);
  CHECK(make_schedule("kfkb_interleaved", 3, 6, 2, 2).order() == kfkb_interleaved(3, 2, 6, 2).order());
}

TEST_CASE("peak in-flight of the new orders: brute force and closed forms") {
  for (int D = 1; D <= 6; ++D)
    for (int M = 1; M <= 12; ++M) {
      std::vector<Schedule> all{zbv(D, M)};
      for (int v = 1; v <= 3; ++v) {
        all.push_back(zb_interleaved(D, v, M));
        for (int k = 1; k <= 3; ++k) all.push_back(kfkb_interleaved(D, v, M, k));
      }
      for (const auto& s : all) {
        INFO(s.to_string());
        CHECK(s.peak_in_flight_device() == brute_peak_device(s));
        // the per-stage peaks never exceed the device's (its stages share the device's order)
        const auto ps = s.peak_in_flight();
        const auto pd = s.peak_in_flight_device();
        for (int st = 0; st < s.num_stages(); ++st)
          CHECK(ps[static_cast<std::size_t>(st)] <= pd[static_cast<std::size_t>(s.device_of(st))]);
      }
      // ZB-V keeps 1F1B's activation memory (the paper's "1x"): 2D chunk activations of 1/2 a
      // stage each on every device once M >= 2D − 1 (and never more than the 2M it could hold).
      const auto z = zbv(D, M).peak_in_flight_device();
      for (int d = 0; d < D; ++d) {
        CHECK(z[static_cast<std::size_t>(d)] <= std::min(2 * M, 2 * D));
        if (M >= 2 * D - 1) CHECK(z[static_cast<std::size_t>(d)] == 2 * D);
      }
      // Interleaved ZB (as ZB-H1, every device alike): device d warms up (v−1)R + D−1−d forwards,
      // runs one more and defers each W by d backwards, so it holds (v−1)R + D chunk activations;
      // with rounds of R = D micro-batches (D | M) that is D·v chunks of 1/v a stage: 1F1B's D.
      if (M >= D)
        for (int v = 2; v <= 3; ++v) {
          int rounds = std::max(1, M / D);  // torch's rounds, fewer when they do not divide M
          while (M % rounds != 0) --rounds;
          const int R = M / rounds;
          for (int p : zb_interleaved(D, v, M).peak_in_flight_device()) {
            CHECK(p == std::min(M * v, (v - 1) * R + D));
            if (M % D == 0) CHECK(p == D * v);
          }
        }
    }
}
