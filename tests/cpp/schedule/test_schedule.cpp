#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <unordered_set>

#include "weft/core/error.hpp"
#include "weft/schedule/schedule.hpp"

using namespace weft::schedule;

namespace {
std::string stage_text(const Schedule& s, int d) {
  std::string out;
  for (const Op& op : s.device_order(d))
    out += std::string(op_kind_name(op.kind)) + std::to_string(op.micro) + " ";
  return out;
}
}  // namespace

TEST_CASE("hand-written orders: 1F1B, kFkB, eager-1F1B, ZB-H1") {
  auto a = one_f_one_b(3, 4);
  CHECK(stage_text(a, 0) == "F0 F1 F2 B0 F3 B1 B2 B3 ");
  CHECK(stage_text(a, 1) == "F0 F1 B0 F2 B1 F3 B2 B3 ");
  CHECK(stage_text(a, 2) == "F0 B0 F1 B1 F2 B2 F3 B3 ");
  auto k2 = kfkb(3, 6, 2);
  CHECK(stage_text(k2, 0) == "F0 F1 F2 F3 F4 F5 B0 B1 B2 B3 B4 B5 ");
  CHECK(stage_text(k2, 1) == "F0 F1 F2 F3 B0 B1 F4 F5 B2 B3 B4 B5 ");
  CHECK(stage_text(k2, 2) == "F0 F1 B0 B1 F2 F3 B2 B3 F4 F5 B4 B5 ");
  // k = 4 does not divide M = 6: groups {0..3}, {4, 5}
  auto k4 = kfkb(2, 6, 4);
  CHECK(stage_text(k4, 1) == "F0 F1 F2 F3 B0 B1 B2 B3 F4 F5 B4 B5 ");
  auto e = eager_1f1b(3, 8);  // warm-ups 5, 3, 1
  CHECK(stage_text(e, 0) == "F0 F1 F2 F3 F4 B0 F5 B1 F6 B2 F7 B3 B4 B5 B6 B7 ");
  CHECK(stage_text(e, 2) == "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7 ");
  auto z = zb_h1(3, 4);
  CHECK(stage_text(z, 0) == "F0 F1 F2 B0 W0 F3 B1 W1 B2 W2 B3 W3 ");
  CHECK(stage_text(z, 2) == "F0 B0 F1 B1 F2 B2 W0 F3 B3 W1 W2 W3 ");
}

TEST_CASE("kFkB: k = 1 is exactly 1F1B and k = M exactly GPipe") {
  for (int S = 1; S <= 6; ++S)
    for (int M = 1; M <= 12; ++M) {
      CHECK(kfkb(S, M, 1).order() == one_f_one_b(S, M).order());
      CHECK(kfkb(S, M, M).order() == gpipe(S, M).order());
      CHECK(kfkb(S, M, M + 3).order() == gpipe(S, M).order());
    }
}

TEST_CASE("peak in-flight activations: kFkB min(M, k(S-s)), 1F1B S-s, GPipe M, eager min(M, 2(S-s)-1)") {
  for (int S = 1; S <= 8; ++S)
    for (int M = 1; M <= 16; ++M) {
      auto g = gpipe(S, M).peak_in_flight();
      auto o = one_f_one_b(S, M).peak_in_flight();
      auto e = eager_1f1b(S, M).peak_in_flight();
      for (int s = 0; s < S; ++s) {
        CHECK(g[static_cast<std::size_t>(s)] == M);
        CHECK(o[static_cast<std::size_t>(s)] == std::min(M, S - s));
        CHECK(e[static_cast<std::size_t>(s)] == std::min(M, 2 * (S - s) - 1));
        CHECK(e[static_cast<std::size_t>(s)] - o[static_cast<std::size_t>(s)] <= S - s);  // eager's extra
      }
      for (int k = 1; k <= M + 1; ++k) {
        auto p = kfkb(S, M, k).peak_in_flight();
        for (int s = 0; s < S; ++s)
          CHECK(p[static_cast<std::size_t>(s)] == std::min(M, std::min(k, M) * (S - s)));
      }
    }
  // ZB-H1 keeps activations until W: S on every stage (stage 0's 1F1B peak), at most M
  auto z = zb_h1(4, 8).peak_in_flight();
  CHECK(z == std::vector<int>{4, 4, 4, 4});
}

TEST_CASE("every generated order passes the dependency and pairing checks") {
  for (int S = 1; S <= 6; ++S)
    for (int M = 1; M <= 10; ++M) {
      std::vector<Schedule> all{gpipe(S, M), one_f_one_b(S, M), eager_1f1b(S, M), zb_h1(S, M)};
      for (int k = 2; k <= 4; ++k) all.push_back(kfkb(S, M, k));
      if (M % S == 0)
        for (int v = 1; v <= 3; ++v) all.push_back(interleaved_1f1b(S, v, M));
      for (const auto& s : all) {
        auto c = check_order(s);
        INFO(s.to_string(), " ", c.to_string());
        CHECK(c.ok);
      }
    }
}

TEST_CASE("interleaved: stage c*D+d on device d, Megatron warm-up, peaks") {
  auto s = interleaved_1f1b(2, 2, 4);
  CHECK(s.num_stages() == 4);
  CHECK(s.num_devices() == 2);
  CHECK(s.device_of(3) == 1);
  // device 0 warm-up 2*(2-0-1) + (2-1)*2 = 4 forwards: chunk 0 m0 m1, chunk 1 m0 m1
  const auto& o = s.device_order(0);
  CHECK(o[0] == Op{OpKind::F, 0, 0});
  CHECK(o[1] == Op{OpKind::F, 0, 1});
  CHECK(o[2] == Op{OpKind::F, 2, 0});
  CHECK(o[3] == Op{OpKind::F, 2, 1});
  CHECK(o[4] == Op{OpKind::F, 0, 2});
  CHECK(o[5] == Op{OpKind::B, 2, 0});  // backward visits the last chunk first
  CHECK_THROWS_AS(interleaved_1f1b(3, 2, 2), weft::Error);  // fewer micro-batches than devices
  CHECK_NOTHROW(interleaved_1f1b(3, 2, 4));                  // any M >= D (rounds of M / floor(M/D))
}

TEST_CASE("broken orders: deadlock and pairing mismatch are reported") {
  auto good = one_f_one_b(3, 4);
  auto order = good.order();
  // last stage runs B0 before F0: B0 waits for F0 which waits behind B0
  std::swap(order[2][0], order[2][1]);
  Schedule bad("broken", 3, 3, 4, false, order);
  auto c = check_order(bad);
  CHECK_FALSE(c.ok);
  CHECK(c.to_string().find("deadlock") != std::string::npos);
  CHECK(c.to_string().find("device 2 blocked at B(s2,m0)") != std::string::npos);
  // stage 1 consumes micro-batch 1 before 0: activation channel 0 -> 1 mismatches
  auto order2 = good.order();
  std::swap(order2[1][0], order2[1][1]);
  auto c2 = check_pairing(Schedule("swapped", 3, 3, 4, false, order2));
  CHECK_FALSE(c2.ok);
  CHECK(c2.to_string().find("activation channel device 0 -> 1") != std::string::npos);
}

TEST_CASE("Schedule validation, JSON round trip, printing, hashing") {
  auto s = kfkb(4, 8, 3);
  auto back = Schedule::from_json(s.to_json());
  CHECK(back == s);
  CHECK(back.hash() == s.hash());
  CHECK(s.to_string() == "Schedule(kfkb(k=3), S=4, D=4, M=8, 64 ops)");
  CHECK(make_schedule("kfkb", 4, 8, 3).order() == s.order());
  CHECK(make_schedule("interleaved", 2, 4, 1, 2).num_stages() == 4);
  CHECK_THROWS_AS(make_schedule("pipedream", 2, 2), weft::Error);
  auto order = s.order();
  order[0].pop_back();
  CHECK_THROWS_WITH_AS(Schedule("x", 4, 4, 8, false, order), doctest::Contains("is missing"), weft::Error);
  order = s.order();
  order[0].push_back(order[0][0]);
  CHECK_THROWS_WITH_AS(Schedule("x", 4, 4, 8, false, order), doctest::Contains("twice"), weft::Error);
  order = s.order();
  order[1].push_back(order[0].back());
  order[0].pop_back();
  CHECK_THROWS_WITH_AS(Schedule("x", 4, 4, 8, false, order), doctest::Contains("lives on device"),
                       weft::Error);
  CHECK_THROWS_AS(kfkb(0, 4, 1), weft::Error);
  CHECK_THROWS_AS(kfkb(2, 4, 0), weft::Error);
  CHECK_THROWS_AS(Schedule::from_json("{"), weft::Error);
}
