// Ada-Grouper on a plan (include/weft/plan/adaptive.hpp).
// Per window [a, a + w) of the trace and per frontier point c, the window's mean step is the mean
// of `samples_per_window` simulated kFkB iterations starting at evenly spread times in the window
// (sim::candidate_step_time reads the trace from each start). The policy runs, in each window,
// the point with the smallest mean step there; the expected step over the trace is the mean over
// windows (every window the same wall-clock length), so it is <= every fixed point's by
// construction, and equal to the best fixed one on a constant network.
#include "weft/plan/adaptive.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "weft/core/error.hpp"
#include "weft/plan/plan.hpp"

namespace weft::plan {

std::vector<sim::StageModel> stage_models_of(const Plan& p, double fo, double bo) {
  WEFT_CHECK(std::isfinite(fo) && fo >= 0 && std::isfinite(bo) && bo >= 0,
             "adaptive policy: per-micro-batch overheads must be finite and >= 0");
  WEFT_CHECK(!p.stages.empty(), "adaptive policy: the plan has no stages");
  WEFT_CHECK(p.microbatch_size >= 1, "adaptive policy: the plan's micro-batch size must be >= 1 (got {})",
             p.microbatch_size);
  const auto b = static_cast<double>(p.microbatch_size);
  std::vector<sim::StageModel> out;
  for (int s = 0; s < p.num_stages(); ++s) {
    const auto& st = p.stages[static_cast<std::size_t>(s)];
    sim::StageModel m;
    // The replica collectives run on the devices' streams (pipeline_of), not inside the times.
    const double fwd = std::max(0.0, st.forward_time - st.replica.in_forward);
    const double bwd = std::max(0.0, st.backward_time - st.replica.in_backward);
    WEFT_CHECK(fo <= fwd && bo <= bwd,
               "adaptive policy: stage {}'s per-micro-batch overheads exceed its forward / backward time", s);
    m.forward_overhead = fo;
    m.backward_overhead = bo;
    m.forward_per_sample = (fwd - fo) / b;
    m.backward_per_sample = (bwd - bo) / b;
    m.replica = st.replica.collectives;
    const bool sends = s + 1 < p.num_stages() && static_cast<std::size_t>(s) < p.boundary_bytes.size();
    m.activation_bytes_per_sample = sends ? std::max(1.0, p.boundary_bytes[static_cast<std::size_t>(s)]) / b : 0.0;
    m.activation_memory_per_sample = st.activation_memory / b;
    m.static_memory = st.static_memory + st.transient_memory;
    out.push_back(m);
  }
  return out;
}

std::vector<sim::LinkSpec> trace_links_of(const Plan& p, const cluster::BandwidthTrace& trace) {
  std::vector<sim::LinkSpec> links;
  for (int d = 0; d + 1 < p.num_stages(); ++d) {
    const auto i = static_cast<std::size_t>(d);
    const double bytes = i < p.boundary_bytes.size() ? std::max(1.0, p.boundary_bytes[i]) : 1.0;
    const double t = i < p.send_time.size() ? p.send_time[i] : 0.0;
    sim::LinkSpec l;
    l.bandwidth = t > 0 ? bytes / t : 1e300;
    l.latency = 0;
    l.trace = trace;
    links.push_back(std::move(l));
  }
  return links;
}

std::vector<sim::Candidate> adaptive_frontier(const std::vector<sim::StageModel>& stages,
                                              const std::vector<sim::LinkSpec>& links, int samples,
                                              double memory_limit, int k_max) {
  // Ada-Grouper's memory-limit curve takes the largest b per k (bigger micro-batches run nearer a
  // GPU's peak); weft's costs price that directly (the per-micro-batch overheads), so each k takes
  // the b whose full-bandwidth step is shortest, under Ada-Grouper's peak-memory rule.
  std::vector<sim::Candidate> out;
  for (int k = 1; k <= k_max; ++k) {
    std::optional<sim::Candidate> best;
    double best_t = 0;
    for (int b = samples; b >= 1; --b) {
      if (samples % b || k > samples / b) continue;
      const sim::Candidate c{k, b, samples / b, sim::adagrouper_peak_memory(stages, k, b, samples / b)};
      if (c.peak_memory > memory_limit) continue;
      const double t = sim::candidate_step_time(c, stages, links, 0.0);
      if (!best || t < best_t) best = c, best_t = t;
    }
    if (best) out.push_back(*best);
  }
  return out;
}

double AdaptivePolicy::speedup_vs_1f1b() const {
  if (one_f_one_b < 0 || step <= 0) return 0.0;
  return fixed_step[static_cast<std::size_t>(one_f_one_b)] / step;
}

double AdaptivePolicy::speedup_vs_best_fixed() const {
  if (fixed_step.empty() || step <= 0) return 0.0;
  return fixed_step[static_cast<std::size_t>(best_fixed)] / step;
}

std::string AdaptivePolicy::summary() const {
  if (frontier.empty()) return "adaptive: no (k, micro-batch) point fits the memory limit";
  std::string s = fmt::format("adaptive (Ada-Grouper) over {:.4g} s of the trace in {} windows of {:.4g} s:\n",
                              duration_s, windows.size(), window_s);
  s += "  frontier:";
  for (std::size_t c = 0; c < frontier.size(); ++c)
    s += fmt::format(" {} ({:.4g} s/step fixed)", frontier[c].to_string(), fixed_step[c]);
  s += "\n  k per window:";
  for (const auto& w : windows) s += fmt::format(" {}", frontier[static_cast<std::size_t>(w.candidate)].k);
  s += fmt::format("\n  expected step {:.4g} s vs best fixed {} {:.4g} s ({:.3f}x)", step,
                   frontier[static_cast<std::size_t>(best_fixed)].to_string(),
                   fixed_step[static_cast<std::size_t>(best_fixed)], speedup_vs_best_fixed());
  if (one_f_one_b >= 0)
    s += fmt::format(" vs 1F1B {:.4g} s ({:.3f}x)", fixed_step[static_cast<std::size_t>(one_f_one_b)],
                     speedup_vs_1f1b());
  return s;
}

void check_adaptive_options(const AdaptiveOptions& o) {
  WEFT_CHECK(std::isfinite(o.window_s) && o.window_s > 0, "adaptive policy: window must be > 0 s (got {})",
             o.window_s);
  WEFT_CHECK(o.k_max >= 1 && o.k_max <= 64, "adaptive policy: k_max must be in [1, 64] (got {})", o.k_max);
  WEFT_CHECK(std::isfinite(o.duration_s) && o.duration_s >= 0, "adaptive policy: duration must be >= 0 s (got {})",
             o.duration_s);
  WEFT_CHECK(o.samples_per_window >= 1 && o.samples_per_window <= 1024,
             "adaptive policy: samples_per_window must be in [1, 1024] (got {})", o.samples_per_window);
  WEFT_CHECK(std::isfinite(o.forward_overhead_s) && o.forward_overhead_s >= 0 &&
                 std::isfinite(o.backward_overhead_s) && o.backward_overhead_s >= 0,
             "adaptive policy: forward / backward overheads must be finite and >= 0 s");
}

AdaptivePolicy adaptive_policy(const Plan& p, const cluster::BandwidthTrace& trace, const AdaptiveOptions& o) {
  check_adaptive_options(o);
  const auto stages = stage_models_of(p, o.forward_overhead_s, o.backward_overhead_s);
  const auto links = trace_links_of(p, trace);
  const std::int64_t per_replica = static_cast<std::int64_t>(p.num_microbatches) * p.microbatch_size;
  WEFT_CHECK(per_replica >= 1 && per_replica <= std::numeric_limits<int>::max(),
             "adaptive policy: samples per replica {} out of range", per_replica);
  const double limit = p.memory_limit > 0 ? p.memory_limit : p.peak_memory;
  WEFT_CHECK(limit > 0, "adaptive policy: the plan has neither a memory limit nor a peak memory");
  AdaptivePolicy pol;
  pol.window_s = o.window_s;
  pol.duration_s = o.duration_s > 0 ? o.duration_s : trace.times().back() + o.window_s;
  // The optimizer after the simulated kFkB iterations (the replica collectives it waits for and the
  // all-gather after it are inside the simulation).
  for (const auto& st : p.stages)
    pol.optimizer_time = std::max(pol.optimizer_time, st.optimizer_time - st.replica.in_optimizer);
  pol.frontier = adaptive_frontier(stages, trace_links_of(p, cluster::BandwidthTrace{}),
                                   static_cast<int>(per_replica), limit, o.k_max);
  if (pol.frontier.empty()) return pol;
  const std::size_t C = pol.frontier.size();
  const int W = std::max(1, static_cast<int>(std::ceil(pol.duration_s / o.window_s - 1e-9)));
  std::vector<double> total(C, 0.0);
  for (int w = 0; w < W; ++w) {
    AdaptiveWindow win;
    win.start = w * o.window_s;
    win.end = std::min(pol.duration_s, (w + 1) * o.window_s);
    double best = std::numeric_limits<double>::infinity();
    for (std::size_t c = 0; c < C; ++c) {
      double sum = 0;
      for (int j = 0; j < o.samples_per_window; ++j) {
        const double t0 = win.start + (j + 0.5) * (win.end - win.start) / o.samples_per_window;
        sum += sim::candidate_step_time(pol.frontier[c], stages, links, t0, trace);
      }
      const double mean = sum / o.samples_per_window + pol.optimizer_time;
      total[c] += mean;
      if (mean < best) best = mean, win.candidate = static_cast<int>(c), win.step = mean;
    }
    pol.step += win.step;
    pol.windows.push_back(win);
  }
  pol.step /= W;
  for (std::size_t c = 0; c < C; ++c) {
    pol.fixed_step.push_back(total[c] / W);
    if (pol.frontier[c].k == 1) pol.one_f_one_b = static_cast<int>(c);
  }
  pol.best_fixed =
      static_cast<int>(std::min_element(pol.fixed_step.begin(), pol.fixed_step.end()) - pol.fixed_step.begin());
  return pol;
}

}  // namespace weft::plan
