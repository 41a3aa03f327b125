// DualPipeV (torch's ScheduleDualPipeV): the order written out by hand from torch's steps, the
// checks over a grid, the V placement, peaks against brute force and the closed form, and the
// kind's name in make_schedule. tests/python/test_schedule_dualpipev.py compares the order with
// torch's own generated action lists op for op.
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
// order and whose W is not — by sets over every prefix.
std::vector<int> brute_peak_device(const Schedule& s) {
  std::vector<int> out;
  for (int d = 0; d < s.num_devices(); ++d) {
    const auto& o = s.device_order(d);
    int best = 0;
    for (std::size_t n = 0; n <= o.size(); ++n) {
      std::set<std::pair<int, int>> held;
      for (std::size_t i = 0; i < n; ++i)
        if (o[i].kind == OpKind::F) held.insert({o[i].stage, o[i].micro});
      for (std::size_t i = 0; i < n; ++i)
        if (o[i].kind == OpKind::W) held.erase({o[i].stage, o[i].micro});
      best = std::max(best, static_cast<int>(held.size()));
    }
    out.push_back(best);
  }
  return out;
}
}  // namespace

TEST_CASE("DualPipeV by hand: D = 2, M = 4 and D = 3, M = 6") {
  // D = 2, n = M = 4. Device 0 (stages c0 = 0, c1 = 3): step 1, 2(D−1−d) = 2 × F0; step 2, once
  // (F0, F3); step 3, once (B3 with its W at once, F3); step 4, n−2D+d+1 = 1 × the pairs (F0, B̄3),
  // (F3, B̄0) (B̄ = B then W); step 5, once B̄3 then the pair (F3, B̄0); step 6, d+1 = 1 pair at
  // h = 0: B̄3 whole (d even), B0 plain (W queued); step 7, once (queued W0.2, plain B0.3); step
  // 8, the queued W0.3.
  const Schedule z = dualpipev(2, 4);
  CHECK(z.name() == "dualpipev");
  CHECK(z.split_backward());
  CHECK(z.placement() == std::vector<int>{0, 1, 1, 0});
  // to_text writes an op as kind, micro-batch, ".", chunk (0 = c0, 1 = c1).
  CHECK(z.to_text() ==
        "d0: F0.0 F1.0 F2.0 F0.1 B0.1 W0.1 F1.1 F3.0 B1.1 W1.1 F2.1 B0.0 W0.0 B2.1 W2.1 F3.1 B1.0 W1.0 B3.1 "
        "W3.1 B2.0 W2.0 B3.0 W3.0\n"
        // Device 1 (stages 1, 2): no step 1; step 2 twice (F1, F2); no step 3; step 4 twice; no
        // step 5; step 6, two pairs with h = 1: (B̄2, B̄1) whole, then (B2, B1) plain (d odd);
        // step 8, the two queued W's in queue order.
        "d1: F0.0 F0.1 F1.0 F1.1 F2.0 B0.1 W0.1 F2.1 B0.0 W0.0 F3.0 B1.1 W1.1 F3.1 B1.0 W1.0 B2.1 W2.1 B2.0 "
        "W2.0 B3.1 B3.0 W3.1 W3.0\n");
  // D = 3, M = 6. Device 1 (stages 1, 4): step 1 2 × F1; step 2 twice (F1, F4); step 3 once (B4,
  // W4, F4); step 4 n−2D+d+1 = 2 × the pairs; step 5 once B̄4, (F4, B̄1); step 6, two pairs with
  // h = 1: (B̄4, B̄1), then (B4, B1) plain; step 7 once (queued W4.5, plain B1.5); step 8 the
  // queued W1.4, W1.5. torch prints the same (its 4I0 4W0 ... 1I4 4W5 1I5 1W4 1W5).
  const Schedule y = dualpipev(3, 6);
  CHECK(y.placement() == std::vector<int>{0, 1, 2, 2, 1, 0});
  const std::vector<Op> d1{
      {OpKind::F, 1, 0}, {OpKind::F, 1, 1}, {OpKind::F, 1, 2}, {OpKind::F, 4, 0}, {OpKind::F, 1, 3},
      {OpKind::F, 4, 1}, {OpKind::B, 4, 0}, {OpKind::W, 4, 0}, {OpKind::F, 4, 2},  // steps 1-3
      {OpKind::F, 1, 4}, {OpKind::B, 4, 1}, {OpKind::W, 4, 1}, {OpKind::F, 4, 3}, {OpKind::B, 1, 0},
      {OpKind::W, 1, 0}, {OpKind::F, 1, 5}, {OpKind::B, 4, 2}, {OpKind::W, 4, 2}, {OpKind::F, 4, 4},
      {OpKind::B, 1, 1}, {OpKind::W, 1, 1},  // step 4
      {OpKind::B, 4, 3}, {OpKind::W, 4, 3}, {OpKind::F, 4, 5}, {OpKind::B, 1, 2}, {OpKind::W, 1, 2},  // 5
      {OpKind::B, 4, 4}, {OpKind::W, 4, 4}, {OpKind::B, 1, 3}, {OpKind::W, 1, 3}, {OpKind::B, 4, 5},
      {OpKind::B, 1, 4},                                                            // step 6
      {OpKind::W, 4, 5}, {OpKind::B, 1, 5}, {OpKind::W, 1, 4}, {OpKind::W, 1, 5}};  // steps 7, 8
  CHECK(y.device_order(1) == d1);
}

TEST_CASE("DualPipeV: every order passes the dependency and pairing checks (D <= 8, M <= 20)") {
  // M < 2D included: torch refuses those M; weft keeps the order for 2D without the missing ones.
  int n = 0;
  for (int D = 1; D <= 8; ++D)
    for (int M = 1; M <= 20; ++M) {
      const Schedule s = dualpipev(D, M);
      auto c = check_order(s);
      INFO(s.to_string(), " ", c.to_string());
      CHECK(c.ok);
      CHECK(s.num_ops() == static_cast<std::size_t>(3 * 2 * D * M));
      ++n;
    }
  CHECK(n == 160);
}

TEST_CASE("DualPipeV: below 2D micro-batches the order for 2D without the missing micro-batches") {
  for (int D = 1; D <= 6; ++D)
    for (int M = 1; M < 2 * D; ++M) {
      const Schedule full = dualpipev(D, 2 * D), part = dualpipev(D, M);
      for (int d = 0; d < D; ++d) {
        std::vector<Op> kept;
        for (const Op& op : full.device_order(d))
          if (op.micro < M) kept.push_back(op);
        CHECK(part.device_order(d) == kept);
      }
    }
}

TEST_CASE("DualPipeV: peak in-flight 2D + 1 chunk activations per device once M >= 2D") {
  for (int D = 1; D <= 6; ++D)
    for (int M = 1; M <= 4 * D; ++M) {
      const Schedule s = dualpipev(D, M);
      INFO("D=", D, " M=", M);
      const auto pd = s.peak_in_flight_device();
      CHECK(pd == brute_peak_device(s));
      // One chunk more than ZB-V's 2D (D + 1/2 stages' worth): e.g. D = 2, device 0 holds F0.0
      // F0.1 F0.2 F3.0 (4), drops 3.0 with W3.0 (3), then F3.1 F0.3 (5) before W3.1.
      for (int d = 0; d < D; ++d) {
        CHECK(pd[static_cast<std::size_t>(d)] <= std::min(2 * M, 2 * D + 1));
        if (M >= 2 * D) CHECK(pd[static_cast<std::size_t>(d)] == 2 * D + 1);
      }
    }
}

TEST_CASE("DualPipeV by name; its kind's properties; bad arguments") {
  CHECK(make_schedule("dualpipev", 3, 6) == dualpipev(3, 6));
  CHECK(make_schedule("dualpipev", 3, 6, 1, 2) == dualpipev(3, 6));
  CHECK_THROWS_WITH_AS(make_schedule("dualpipev", 2, 4, 1, 3), doctest::Contains("v = 2"), weft::Error);
  CHECK_THROWS_AS(dualpipev(0, 4), weft::Error);
  CHECK_THROWS_AS(dualpipev(2, 0), weft::Error);
  CHECK_THROWS_WITH_AS(make_schedule("dualpipe", 2, 4), doctest::Contains("dualpipev"), weft::Error);
  CHECK(Schedule::from_json(dualpipev(3, 7).to_json()) == dualpipev(3, 7));
  for (const char* k : {"zbv", "dualpipev"}) {
    CHECK(v_shaped(k));
    CHECK(splits_backward(k));
  }
  for (const char* k : {"zb_h1", "zb_interleaved"}) {
    CHECK_FALSE(v_shaped(k));
    CHECK(splits_backward(k));
  }
  for (const char* k : {"1f1b", "gpipe", "kfkb", "eager_1f1b", "interleaved", "kfkb_interleaved"}) {
    CHECK_FALSE(v_shaped(k));
    CHECK_FALSE(splits_backward(k));
    // the property agrees with the generated schedule
    CHECK(make_schedule(k, 2, 4, 1, 1).split_backward() == splits_backward(k));
  }
  CHECK(make_schedule("zb_h1", 2, 4).split_backward());
}
