// Ada-Grouper in the planner (plan::adaptive_policy, PlanOptions::bandwidth_trace, schedule
// "adaptive"): per-sample stage models by hand, the policy against a brute-force recomputation of
// every window from the simulator, never slower than any fixed k, and JSON.
#include <doctest/doctest.h>

#include <algorithm>
#include <limits>

#include "weft/cluster/bandwidth_trace.hpp"
#include "weft/cluster/cluster.hpp"
#include "weft/core/error.hpp"
#include "weft/ir/autodiff.hpp"
#include "weft/models/models.hpp"
#include "weft/plan/adaptive.hpp"
#include "weft/plan/plan.hpp"
#include "weft/plan/planner.hpp"
#include "weft/sim/adagrouper.hpp"

using namespace weft;

namespace {

// A pipeline plan written by hand: S stages, each F = f·b, B = 2f·b per micro-batch of b samples,
// activations act_per_sample·b held per micro-batch in flight, boundary transfers of
// bytes_per_sample·b taking `send` seconds at full bandwidth.
plan::Plan hand_plan(int S, int M, std::int64_t b, double f, double send, double memory_limit) {
  plan::Plan p;
  p.model = "hand";
  p.strategy = "pipeline";
  p.schedule = "1f1b";
  p.num_microbatches = M;
  p.microbatch_size = b;
  p.memory_limit = memory_limit;
  for (int s = 0; s < S; ++s) {
    plan::Stage st;
    st.index = s;
    st.devices = {s};
    st.forward_time = f * static_cast<double>(b);
    st.backward_time = 2 * f * static_cast<double>(b);
    st.optimizer_time = 0.01 * (s + 1);
    st.static_memory = 1e9;
    st.transient_memory = 0.5e9;
    st.activation_memory = 0.25e9 * static_cast<double>(b);
    p.stages.push_back(st);
  }
  for (int s = 0; s + 1 < S; ++s) {
    p.boundary_bytes.push_back(4e6 * static_cast<double>(b));
    p.send_time.push_back(send);
  }
  return p;
}

}  // namespace

TEST_CASE("adaptive: per-sample stage models and traced links of a plan, by hand") {
  const auto p = hand_plan(3, 8, 4, 0.1, 0.02, 16e9);
  const auto m = plan::stage_models_of(p);
  REQUIRE(m.size() == 3);
  CHECK(m[0].forward_per_sample == doctest::Approx(0.1));
  CHECK(m[0].backward_per_sample == doctest::Approx(0.2));
  CHECK(m[0].forward_overhead == 0.0);
  CHECK(m[1].activation_bytes_per_sample == doctest::Approx(4e6));
  CHECK(m[2].activation_bytes_per_sample == 0.0);  // the last stage sends nothing on
  CHECK(m[1].activation_memory_per_sample == doctest::Approx(0.25e9));
  CHECK(m[2].static_memory == doctest::Approx(1.5e9));  // static + transient
  // at(b) gives the plan's own stage back
  const auto at = m[1].at(4);
  CHECK(at.forward_time == doctest::Approx(p.stages[1].forward_time));
  CHECK(at.backward_time == doctest::Approx(p.stages[1].backward_time));
  const auto trace = cluster::BandwidthTrace({0.0, 5.0}, {1.0, 0.5});
  const auto links = plan::trace_links_of(p, trace);
  REQUIRE(links.size() == 2);
  CHECK(links[0].bandwidth == doctest::Approx(16e6 / 0.02));  // bytes / send time
  CHECK(links[0].trace == trace);
}

TEST_CASE("adaptive: the policy equals a brute-force recomputation and beats no fixed k") {
  // pp = 4, 16 micro-batches of 4 samples (64 per step), transfers of c = 1 and 2 × F.
  for (double c : {1.0, 2.0}) {
    CAPTURE(c);
    const double f = 0.01;  // F per sample; F per micro-batch = 0.04
    const auto p = hand_plan(4, 16, 4, f, c * f * 4, 40e9);
    const auto trace = cluster::BandwidthTrace::preempted(
        7, {.duration = 240, .normal_min = 20, .normal_max = 60, .preempt_min = 20, .preempt_max = 60,
            .low = 0.2, .high = 0.4});
    plan::AdaptiveOptions o;
    o.window_s = 30;
    o.k_max = 4;
    o.samples_per_window = 4;
    o.duration_s = 240;
    const auto pol = plan::adaptive_policy(p, trace, o);
    const auto stages = plan::stage_models_of(p);
    const auto links = plan::trace_links_of(p, trace);
    // The frontier, by brute force: per k, every b dividing 64 whose peak (by hand) fits, and none
    // with a shorter full-bandwidth step than the chosen one.
    const auto full = plan::trace_links_of(p, {});
    REQUIRE(pol.frontier.size() == 4);
    for (const auto& pt : pol.frontier) {
      CAPTURE(pt.to_string());
      CHECK(pt.num_micro * pt.micro_batch_size == 64);
      const double peak = 1.5e9 + std::min(pt.num_micro, pt.k * 4) * pt.micro_batch_size * 0.25e9;
      CHECK(pt.peak_memory == doctest::Approx(peak));
      CHECK(pt.peak_memory <= 40e9);
      const double t = sim::candidate_step_time(pt, stages, full, 0);
      for (int b = 1; b <= 64; ++b) {
        if (64 % b || pt.k > 64 / b) continue;
        const sim::Candidate other{pt.k, b, 64 / b, 1.5e9 + std::min(64 / b, pt.k * 4) * b * 0.25e9};
        if (other.peak_memory <= 40e9) CHECK(t <= sim::candidate_step_time(other, stages, full, 0) * (1 + 1e-12));
      }
    }
    REQUIRE(pol.one_f_one_b >= 0);
    CHECK(pol.frontier[static_cast<std::size_t>(pol.one_f_one_b)].k == 1);
    CHECK(pol.optimizer_time == doctest::Approx(0.04));
    REQUIRE(pol.windows.size() == 8);
    // Brute force: every window, every point, the sampled iterations straight from the simulator.
    std::vector<double> fixed(pol.frontier.size(), 0.0);
    double policy = 0;
    for (int w = 0; w < 8; ++w) {
      double best = std::numeric_limits<double>::infinity();
      int arg = -1;
      for (std::size_t i = 0; i < pol.frontier.size(); ++i) {
        double sum = 0;
        for (int j = 0; j < 4; ++j)
          sum += sim::candidate_step_time(pol.frontier[i], stages, links, 30.0 * w + (j + 0.5) * 7.5);
        const double mean = sum / 4 + 0.04;
        fixed[i] += mean / 8;
        if (mean < best) best = mean, arg = static_cast<int>(i);
      }
      CHECK(pol.windows[static_cast<std::size_t>(w)].candidate == arg);
      CHECK(pol.windows[static_cast<std::size_t>(w)].step == doctest::Approx(best));
      policy += best / 8;
    }
    CHECK(pol.step == doctest::Approx(policy));
    for (std::size_t i = 0; i < fixed.size(); ++i) {
      CHECK(pol.fixed_step[i] == doctest::Approx(fixed[i]));
      CHECK(pol.step <= pol.fixed_step[i]);  // never slower than a fixed k
    }
    CHECK(pol.speedup_vs_best_fixed() >= 1.0);
    CHECK(pol.speedup_vs_1f1b() > 1.0);  // slow transfers: grouping hides them
  }
}

TEST_CASE("adaptive: a per-micro-batch overhead moves the frontier to larger micro-batches") {
  const auto p = hand_plan(4, 16, 4, 0.01, 0.04, 40e9);
  plan::AdaptiveOptions o;
  o.duration_s = 10;
  o.window_s = 10;
  o.samples_per_window = 1;
  const auto lean = plan::adaptive_policy(p, {}, o);
  o.forward_overhead_s = 0.02;  // half of F per micro-batch (0.04 s at b = 4)
  o.backward_overhead_s = 0.04;
  const auto heavy = plan::adaptive_policy(p, {}, o);
  REQUIRE(!lean.frontier.empty());
  REQUIRE(!heavy.frontier.empty());
  CHECK(heavy.frontier[0].micro_batch_size > lean.frontier[0].micro_batch_size);
  // The models give the plan's own stage back at its own b.
  const auto m = plan::stage_models_of(p, 0.02, 0.04);
  CHECK(m[0].at(4).forward_time == doctest::Approx(p.stages[0].forward_time));
  CHECK(m[0].at(8).forward_time == doctest::Approx(0.02 + 0.02 * 2));
}

TEST_CASE("adaptive: on a constant network every window runs the best fixed point") {
  const auto p = hand_plan(4, 16, 4, 0.01, 0.04, 40e9);
  plan::AdaptiveOptions o;
  o.window_s = 10;
  o.duration_s = 30;
  o.samples_per_window = 2;
  const auto pol = plan::adaptive_policy(p, cluster::BandwidthTrace::constant(0.5), o);
  REQUIRE(pol.windows.size() == 3);
  for (const auto& w : pol.windows) CHECK(w.candidate == pol.best_fixed);
  CHECK(pol.step == doctest::Approx(pol.fixed_step[static_cast<std::size_t>(pol.best_fixed)]));
}

TEST_CASE("adaptive: bad options and plans are named errors") {
  const auto p = hand_plan(2, 4, 2, 0.01, 0.01, 40e9);
  plan::AdaptiveOptions o;
  o.window_s = 0;
  CHECK_THROWS_WITH_AS(plan::adaptive_policy(p, {}, o), doctest::Contains("window"), weft::Error);
  o = {};
  o.k_max = 0;
  CHECK_THROWS_WITH_AS(plan::adaptive_policy(p, {}, o), doctest::Contains("k_max"), weft::Error);
  plan::Plan empty;
  CHECK_THROWS_WITH_AS(plan::adaptive_policy(empty, {}, {}), doctest::Contains("no stages"), weft::Error);
}

TEST_CASE("adaptive: make_plan with schedule 'adaptive' and a trace; the policy survives JSON") {
  models::GptConfig gc;
  gc.name = "gpt-small";
  gc.layers = 4;
  gc.hidden = 64;
  gc.heads = 4;
  gc.seq = 32;
  gc.vocab = 256;
  gc.batch = 16;
  const auto g = ir::build_training_graph(models::gpt(gc));
  const auto c = cluster::Cluster::preset("S1", 4);  // one GPU per node: stages talk over the NIC
  plan::PlanOptions o;
  o.max_data_parallel = 1;
  o.compare_megatron = false;
  const auto fixed = plan::make_plan(g, c, o);
  CHECK(!fixed.adaptive);
  o.schedule = "adaptive";
  o.bandwidth_trace = cluster::BandwidthTrace::preempted(3, {.duration = 120});
  o.adaptive.window_s = 30;
  o.adaptive.samples_per_window = 2;
  const auto p = plan::make_plan(g, c, o);
  REQUIRE(p.adaptive);
  CHECK(p.schedule == "1f1b");  // the layout is planned under 1F1B
  // The trace re-ranks the fastest plans: the chosen one's policy is no slower under the trace
  // than the full-bandwidth winner's, and at full bandwidth it is no faster than that winner.
  const auto before = plan::adaptive_policy(fixed, *o.bandwidth_trace, o.adaptive);
  CHECK(p.adaptive->step <= before.step * (1 + 1e-12));
  CHECK(p.step_time >= fixed.step_time * (1 - 1e-12));
  CHECK(*p.adaptive == plan::adaptive_policy(p, *o.bandwidth_trace, o.adaptive));
  CHECK(p.adaptive->duration_s == doctest::Approx(o.bandwidth_trace->times().back() + 30));
  for (double s : p.adaptive->fixed_step) CHECK(p.adaptive->step <= s);
  CHECK(p.summary().find("adaptive (Ada-Grouper)") != std::string::npos);
  const auto back = plan::Plan::from_json(p.to_json());
  CHECK(back == p);
  // Bad adaptive options fail before the search.
  o.adaptive.window_s = -1;
  CHECK_THROWS_WITH_AS(plan::make_plan(g, c, o), doctest::Contains("window"), weft::Error);
  // A damaged policy in the JSON is named.
  auto text = p.to_json();
  const auto at = text.find("\"candidate\": ");
  REQUIRE(at != std::string::npos);
  text.replace(at, 13, "\"candidate\": 99");
  CHECK_THROWS_WITH_AS(plan::Plan::from_json(text), doctest::Contains("adaptive.windows[0].candidate"),
                       weft::Error);
}
