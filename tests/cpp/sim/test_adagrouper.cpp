#include <doctest/doctest.h>

#include "weft/core/error.hpp"
#include "weft/sim/adagrouper.hpp"

using namespace weft::sim;
using weft::cluster::BandwidthTrace;

namespace {
std::vector<StageModel> models(int S, double act_mem = 1.0, double fixed = 0.0) {
  StageModel m;
  m.forward_per_sample = 1.0;
  m.forward_overhead = fixed;
  m.backward_per_sample = 2.0;
  m.backward_overhead = 2 * fixed;
  m.activation_bytes_per_sample = 1.0;
  m.activation_memory_per_sample = act_mem;
  return std::vector<StageModel>(static_cast<std::size_t>(S), m);
}
}  // namespace

TEST_CASE("frontier: hand-computed case") {
  // 4 stages, 1 byte per sample in flight, limit 12, global batch 24 (derivation in sim.md)
  auto f = adagrouper_frontier(models(4), 24, 12.0, 6);
  REQUIRE(f.size() == 3);
  CHECK(f[0] == Candidate{1, 3, 8, 12.0});
  CHECK(f[1] == Candidate{2, 1, 24, 8.0});
  CHECK(f[2] == Candidate{3, 1, 24, 12.0});
  CHECK(f[1].to_string() == "k=2,b=1,M=24");
}

TEST_CASE("frontier: brute force over all (k, b) pairs") {
  for (int S : {2, 3, 5})
    for (int B : {12, 18, 32})
      for (double limit : {5.0, 9.0, 20.0, 40.0}) {
        auto ms = models(S);
        ms[0].static_memory = 2.0;
        auto f = adagrouper_frontier(ms, B, limit, 8);
        std::size_t idx = 0;
        for (int k = 1; k <= 8; ++k) {
          int best_b = 0;
          for (int b = 1; b <= B; ++b) {
            if (B % b || k > B / b) continue;
            double mem = 0;
            for (int s = 0; s < S; ++s)
              mem = std::max(mem, (s == 0 ? 2.0 : 0.0) + std::min(B / b, k * (S - s)) * b * 1.0);
            if (mem <= limit) best_b = b;
          }
          if (best_b == 0) continue;
          REQUIRE(idx < f.size());
          CHECK(f[idx].k == k);
          CHECK(f[idx].micro_batch_size == best_b);
          ++idx;
        }
        CHECK(idx == f.size());
      }
  CHECK_THROWS_AS(adagrouper_frontier(models(2), 0, 10, 2), weft::Error);
  CHECK_THROWS_AS(adagrouper_frontier({}, 8, 10, 2), weft::Error);
}

TEST_CASE("tuner picks the shortest simulated step; larger k wins when communication is slow") {
  auto ms = models(4, 1.0, 0.5);
  auto cands = adagrouper_frontier(ms, 24, 12.0, 6);
  // fast network: transfers negligible
  std::vector<LinkSpec> fast{LinkSpec{.bandwidth = 1e9, .latency = 0, .trace = {}}};
  auto t1 = adagrouper_tune(cands, ms, fast, 0.0);
  for (std::size_t i = 0; i < cands.size(); ++i) {
    CHECK(t1.step_times[i] == doctest::Approx(candidate_step_time(cands[i], ms, fast, 0.0)));
    CHECK(t1.step_times[static_cast<std::size_t>(t1.best)] <= t1.step_times[i]);
  }
  CHECK(cands[static_cast<std::size_t>(t1.best)].k == 1);  // biggest b, least overhead
  // no communication, b = 3, M = 8, S = 4: (M+S-1)(F+B) with F = 0.5+3, B = 1+6
  CHECK(t1.step_times[0] == doctest::Approx(11 * (3.5 + 7.0)).epsilon(1e-6));
  // slow network (transfer of one sample ~ 0.9 of its forward), a preempted link
  std::vector<LinkSpec> slow{LinkSpec{.bandwidth = 1.0 / 0.9, .latency = 0, .trace = {}}};
  auto t2 = adagrouper_tune(cands, ms, slow, 0.0);
  CHECK(cands[static_cast<std::size_t>(t2.best)].k > 1);
}

TEST_CASE("driver: switches only at iteration boundaries; lookahead never loses an iteration") {
  auto ms = models(4, 1.0, 0.1);
  auto cands = adagrouper_frontier(ms, 24, 12.0, 6);
  auto trace = BandwidthTrace({0, 1000, 2000}, {1.0, 0.3, 1.0});
  std::vector<LinkSpec> links{LinkSpec{.bandwidth = 1.0, .latency = 0, .trace = trace}};
  DriverOptions o;
  o.until = 3000;
  auto ad = adagrouper_drive(cands, ms, links, o);
  REQUIRE(ad.iterations.size() > 5);
  double t = 0;
  for (const auto& it : ad.iterations) {
    CHECK(it.start == doctest::Approx(t));  // back to back: a plan runs whole iterations
    for (const auto& c : cands) CHECK(it.step <= candidate_step_time(c, ms, links, it.start) + 1e-9);
    t += it.step;
  }
  CHECK(ad.end_time == doctest::Approx(t));
  CHECK(ad.switches >= 1);
  o.fixed = 0;
  auto f0 = adagrouper_drive(cands, ms, links, o);
  CHECK(f0.switches == 0);
  for (const auto& it : f0.iterations) CHECK(it.candidate == 0);
  CHECK(ad.mean_step() <= f0.mean_step());
  o.fixed = -1;
  o.estimate = DriverOptions::Estimate::PastMean;
  auto pm = adagrouper_drive(cands, ms, links, o);
  CHECK(pm.iterations.size() > 5);
  CHECK(pm.to_string().find("iterations") != std::string::npos);
  o.retune_every = 0;
  CHECK_THROWS_AS(adagrouper_drive(cands, ms, links, o), weft::Error);
}
