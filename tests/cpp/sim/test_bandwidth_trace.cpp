#include <doctest/doctest.h>

#include <cmath>

#include "weft/cluster/bandwidth_trace.hpp"
#include "weft/core/error.hpp"

using weft::cluster::BandwidthTrace;

TEST_CASE("BandwidthTrace: default constant, fraction_at, exact finish_time, mean") {
  BandwidthTrace c;
  CHECK(c.is_constant());
  CHECK(c.fraction_at(123.0) == 1.0);
  CHECK(c.finish_time(2.0, 100.0, 50.0) == doctest::Approx(4.0));
  // f = 1 on [0,2), 0.5 on [2,6), 0.25 from 6 on; nominal 10 B/s
  BandwidthTrace t({0, 2, 6}, {1.0, 0.5, 0.25});
  CHECK(t.fraction_at(0) == 1.0);
  CHECK(t.fraction_at(1.999) == 1.0);
  CHECK(t.fraction_at(2) == 0.5);
  CHECK(t.fraction_at(100) == 0.25);
  // from t=1: 10 B in [1,2), then 5 B/s: 20 B more take 4 s -> ends at 6 exactly
  CHECK(t.finish_time(1, 30, 10) == doctest::Approx(6.0));
  // 5 more bytes at 2.5 B/s -> 8
  CHECK(t.finish_time(1, 35, 10) == doctest::Approx(8.0));
  CHECK(t.finish_time(3, 0, 10) == 3.0);
  CHECK(t.mean_fraction(0, 6) == doctest::Approx((2 * 1.0 + 4 * 0.5) / 6));
  CHECK(t.mean_fraction(5, 8) == doctest::Approx((0.5 + 2 * 0.25) / 3));
  CHECK(t.mean_fraction(4, 4) == 0.5);
  // window [1, 7): starts with 1.0 for 1 s, 0.5 for 4 s, then 0.25
  auto w = t.window(1, 7);
  CHECK(w.times() == std::vector<double>{0, 1, 5});
  CHECK(w.fractions() == std::vector<double>{1.0, 0.5, 0.25});
}

TEST_CASE("BandwidthTrace: finish_time agrees with brute-force integration") {
  auto t = BandwidthTrace::preempted(7, {.duration = 50,
                                         .normal_min = 1,
                                         .normal_max = 4,
                                         .preempt_min = 1,
                                         .preempt_max = 4,
                                         .low = 0.3,
                                         .high = 0.6});
  for (double t0 : {0.0, 3.3, 17.2, 49.0}) {
    for (double bytes : {1.0, 25.0, 80.0}) {
      const double T = t.finish_time(t0, bytes, 4.0);
      // integrate with a fine step and compare the bytes delivered by T
      double acc = 0, dt = 1e-4;
      for (double x = t0; x < T; x += dt) acc += t.fraction_at(x) * 4.0 * std::min(dt, T - x);
      CHECK(acc == doctest::Approx(bytes).epsilon(1e-3));
      CHECK(t.mean_fraction(t0, T) * 4.0 * (T - t0) == doctest::Approx(bytes));
    }
  }
}

TEST_CASE("BandwidthTrace: preempted generator is deterministic and in range") {
  auto a = BandwidthTrace::preempted(42), b = BandwidthTrace::preempted(42),
       c = BandwidthTrace::preempted(43);
  CHECK(a == b);
  CHECK(a.hash() == b.hash());
  CHECK_FALSE(a == c);
  int low = 0;
  for (double f : a.fractions()) {
    CHECK((f == 1.0 || (f >= 0.3 && f <= 0.6)));
    low += f < 1.0;
  }
  CHECK(low >= 5);
  CHECK(a.times().back() < 600.0);
}

TEST_CASE("BandwidthTrace: JSON round trip, printing and validation") {
  BandwidthTrace t({0, 1.5}, {0.4, 1.0});
  CHECK(BandwidthTrace::from_json(t.to_json()) == t);
  CHECK(BandwidthTrace().to_string() == "BandwidthTrace(constant 1)");
  CHECK(t.to_string().find("2 segments") != std::string::npos);
  CHECK_THROWS_WITH_AS(BandwidthTrace({1.0}, {1.0}), doctest::Contains("start at 0"), weft::Error);
  CHECK_THROWS_WITH_AS(BandwidthTrace({0, 2, 1}, {1, 1, 1}), doctest::Contains("strictly increasing"),
                       weft::Error);
  CHECK_THROWS_WITH_AS(BandwidthTrace({0, 1}, {1, 0}), doctest::Contains("> 0"), weft::Error);
  CHECK_THROWS_WITH_AS(BandwidthTrace({0, 1}, {1}), doctest::Contains("must be equal"), weft::Error);
  CHECK_THROWS_AS(BandwidthTrace::from_json("[1,2]"), weft::Error);
  CHECK_THROWS_AS(BandwidthTrace::from_json("{\"times\":[0],\"fractions\":[\"a\"]}"), weft::Error);
  CHECK_THROWS_AS(t.finish_time(0, -1, 1), weft::Error);
  CHECK_THROWS_AS(t.mean_fraction(2, 1), weft::Error);
}
