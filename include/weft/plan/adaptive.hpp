#pragma once
// Ada-Grouper in the planner: a plan's pipeline, per sample, under a bandwidth trace on its
// inter-stage links; the (k, micro-batch size) frontier under the plan's memory limit; and the
// policy — which frontier point (which k) to run in each window of the trace — with its expected
// step time against every fixed point and against 1F1B (k = 1). See docs/modules/plan.md.
#include <string>
#include <vector>

#include "weft/cluster/bandwidth_trace.hpp"
#include "weft/sim/adagrouper.hpp"
#include "weft/sim/simulator.hpp"

namespace weft::plan {

struct Plan;

struct AdaptiveOptions {
  double window_s = 60.0;     // one frontier point per window of the trace (> 0)
  int k_max = 8;              // kFkB group sizes 1..k_max (>= 1)
  double duration_s = 0.0;    // trace time covered; 0 = up to the trace's last change + one window
  int samples_per_window = 16;  // iterations simulated per window and point, starts evenly spread
  // Fixed cost per micro-batch and stage (kernel launches, framework): weft's datasheet costs are
  // linear in the batch, so 0 unless measured; with it, small micro-batches cost compute.
  double forward_overhead_s = 0, backward_overhead_s = 0;
};

struct AdaptiveWindow {
  double start = 0, end = 0;  // trace time, seconds
  int candidate = 0;          // index into AdaptivePolicy::frontier
  double step = 0;            // that point's mean step in this window, seconds
  bool operator==(const AdaptiveWindow&) const = default;
};

struct AdaptivePolicy {
  // Per k = 1..k_max (those that fit): the micro-batch size b with the shortest step on the
  // full-bandwidth network among those whose kFkB peak memory fits (ties: the larger b).
  std::vector<sim::Candidate> frontier;
  std::vector<AdaptiveWindow> windows;   // the point to run in each window
  std::vector<double> fixed_step;        // per frontier point: mean step over the trace, run throughout
  double step = 0;                       // the policy's mean step over the trace
  int best_fixed = 0;                    // the fastest fixed point
  int one_f_one_b = -1;                  // the k = 1 point (-1: none fits)
  double window_s = 0, duration_s = 0;
  // The optimizer steps after a stage's last backward: not part of Ada-Grouper's kFkB model, added
  // to every step time above (the largest over the stages).
  double optimizer_time = 0;
  double speedup_vs_1f1b() const;          // fixed_step[one_f_one_b] / step (0 when no k = 1)
  double speedup_vs_best_fixed() const;    // fixed_step[best_fixed] / step
  std::string summary() const;             // a few lines
  bool operator==(const AdaptivePolicy&) const = default;
};

// The plan's stages per sample at its micro-batch size b: F(b') = overhead + (F − overhead)/b·b'
// (likewise B), sent bytes and saved activations divided by b, static = static + transient
// memory. The plan's own schedule chunks (interleaved, ZB-V) are not modelled: Ada-Grouper's kFkB
// runs one chunk per stage.
std::vector<sim::StageModel> stage_models_of(const Plan& p, double forward_overhead_s = 0,
                                             double backward_overhead_s = 0);
// Ada-Grouper's candidates on weft's costs: per k, the b described at AdaptivePolicy::frontier.
std::vector<sim::Candidate> adaptive_frontier(const std::vector<sim::StageModel>& stages,
                                              const std::vector<sim::LinkSpec>& full_bandwidth_links,
                                              int samples, double memory_limit, int k_max);
// The plan's inter-stage links (bandwidth = boundary bytes / send time) with `trace` on each.
std::vector<sim::LinkSpec> trace_links_of(const Plan& p, const cluster::BandwidthTrace& trace);
// weft::Error naming the bad field (window_s > 0, k_max in [1, 64], duration_s >= 0,
// samples_per_window in [1, 1024]).
void check_adaptive_options(const AdaptiveOptions& o);
// The policy for a plan (its memory limit, or its peak memory when it has none, bounds the
// frontier); weft::Error on bad options or a plan without stages.
AdaptivePolicy adaptive_policy(const Plan& p, const cluster::BandwidthTrace& trace,
                               const AdaptiveOptions& o = {});

}  // namespace weft::plan
