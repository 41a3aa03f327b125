// The planner (controller): training graph + cluster -> the fastest plan that fits in memory.
//
// Cost of a stage. The training graph is cut into L blocks (pipeline::group_layers). For a block b
// and a logical mesh m, an SPMD search on the block's own graph (pipeline::extract_stage) gives
// per micro-batch: compute and communication time, split into forward F_b, backward B_b (W_b of
// it the weight gradients) and update U_b by op phase; static memory S_b (parameters + their
// gradients + optimizer states under the chosen specs), activation memory A_b (forward tensors
// read by the backward, per in-flight micro-batch) and the transient rest of the SPMD peak. The
// stage of blocks i..j on m then costs
//     t(i, j, m) = Σ_{b=i..j} (F_b + B_b),   memory(i, j, m, s) = Σ S_b + f(s)·Σ A_b + max transient,
// with f(s) the peak in-flight micro-batches of a stage that has s − 1 stages after it (1F1B:
// min(s, M); GPipe: M; eager 1F1B: min(2s − 1, M)). Results are cached by (block structure,
// mesh links, variant): identical layers are solved once. Two variants per (block, mesh): the
// fastest SPMD plan (no memory limit) and a lean one (memory limit: the block's share of usable); a
// stage takes the fastest variant whose memory fits.
//
// Stage partition (Alpa §5.2 with the stage position): with M micro-batches a pipeline of stage
// times t_1..t_S has latency ≈ Σ t_s + (M − 1)·max t_s. For each bound t_max (distinct stage
// costs, ascending, thinned to a geometric grid) the DP
//     G(s, k, d) = min_{j >= k, m: |m| <= d, t(k, j, m) <= t_max, memory(k, j, m, s) fits}
//                      t(k, j, m) + G(s − 1, j + 1, d − |m|),     G(0, L, 0) = 0,
// gives the least Σ t for every stage count s using exactly the D devices (s counts the stages
// from k to the end, so the in-flight count of a stage is known when it is placed — the reason
// this DP keeps s where pipeline::partition_dp does not). The best (t_max, s) per stage count
// is a candidate; so are the equal-block partitions on every submesh size that divides D
// (Megatron-like shapes). SPMD only = one stage on the whole cluster.
//
// Every candidate is materialised: stages placed on devices (pipeline::assign_submeshes),
// tensors crossing stages resharded by the reshard planner (simulated time = send time), the
// schedule simulated (sim::simulate). The lowest simulated step time wins.
//
// Files: this one is the search driver (make_plan: the options checked, the (micro-batches,
// replicas) pairs and their branch and bound, the candidates simulated, the Megatron baselines
// compared, the winner re-planned with the best resharding; a bandwidth trace's re-ranking).
// planner_context.cpp: the per-block SPMD costs, the logical meshes and the resharding between a
// stage's blocks; stage_dp.cpp: the best layout of a stage, the stage DP and the partition
// candidates; materialise.cpp: a candidate to a simulated Plan; megatron.cpp: the Megatron
// baselines and layout_plan; planner_report.cpp: the layout, alternatives and search-space text.
// Heterogeneous clusters: hetero_planner.cpp and uneven_split.cpp; recomputation: recompute.cpp;
// ZeRO: zero.cpp. Their shared internals: planner_detail.hpp.
#include "weft/plan/planner.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "planner_detail.hpp"
#include "weft/core/error.hpp"
#include "weft/core/units.hpp"
#include "weft/ir/autodiff.hpp"
#include "weft/pipeline/grouping.hpp"
#include "weft/plan/adaptive.hpp"
#include "weft/plan/rebatch.hpp"

namespace weft::plan {

namespace detail {

void validate_options(const PlanOptions& o, const cluster::Cluster& c) {
  static const std::set<std::string> kinds{"1f1b",        "gpipe",           "kfkb",           "eager_1f1b",
                                           "interleaved", "zb_h1",           "zb_interleaved", "zbv",
                                           "dualpipev",   "kfkb_interleaved"};
  WEFT_CHECK(kinds.count(o.schedule),
             "make_plan: unknown schedule '{}' (1f1b, gpipe, kfkb, eager_1f1b, interleaved, zb_h1, "
             "zb_interleaved, zbv, dualpipev, kfkb_interleaved)",
             o.schedule);
  WEFT_CHECK(o.num_microbatches >= 0, "make_plan: num_microbatches must be >= 0 (0 = auto; got {})",
             o.num_microbatches);
  WEFT_CHECK(o.num_blocks >= 0, "make_plan: num_blocks must be >= 0 (got {})", o.num_blocks);
  WEFT_CHECK(o.max_stages >= 0, "make_plan: max_stages must be >= 0 (got {})", o.max_stages);
  WEFT_CHECK(o.max_data_parallel >= 0, "make_plan: max_data_parallel must be >= 0 (got {})",
             o.max_data_parallel);
  WEFT_CHECK(o.schedule_k >= 1 && o.schedule_v >= 1, "make_plan: schedule_k and schedule_v must be >= 1");
  WEFT_CHECK(o.spmd_time_limit_s > 0 && o.time_limit_s > 0, "make_plan: time limits must be > 0");
  WEFT_CHECK(o.memory_fraction > 0 && o.memory_fraction <= 1, "make_plan: memory_fraction must be in (0, 1]");
  WEFT_CHECK(o.memory_limit >= 0, "make_plan: memory_limit must be >= 0 (0 = the device's memory)");
  WEFT_CHECK(o.memory_reserve == -1 || o.memory_reserve >= 0,
             "make_plan: memory_reserve must be >= 0 bytes, or -1 (auto; got {})", o.memory_reserve);
  for (const auto& d : c.devices()) {
    const double cap = o.memory_limit > 0 ? o.memory_limit : d.spec.memory_bytes;
    WEFT_CHECK(memory_reserve_of(o, d.spec) < cap,
               "make_plan: memory_reserve {} leaves nothing of the {} of device {} ({})",
               format_bytes(memory_reserve_of(o, d.spec)), format_bytes(cap), d.id, d.spec.kind);
  }
  WEFT_CHECK(o.zero >= -1 && o.zero <= 3, "make_plan: zero must be -1 (auto) or a ZeRO level 0..3 (got {})",
             o.zero);
  WEFT_CHECK(o.grad_bucket_bytes > 0, "make_plan: grad_bucket_bytes must be > 0 (got {})",
             o.grad_bucket_bytes);
  WEFT_CHECK(o.step_allreduce_bytes >= 0, "make_plan: step_allreduce_bytes must be >= 0 (got {})",
             o.step_allreduce_bytes);
  WEFT_CHECK(c.num_devices() >= 1, "make_plan: the cluster has no device");
}

double usable_memory_of(const PlanOptions& o, const cluster::Cluster& c) {
  double mem = kInf;
  for (const auto& d : c.devices()) mem = std::min(mem, usable_memory(o, d.spec));
  return mem;
}

// The device whose usable memory is the least (the one the messages speak of).
const cluster::DeviceSpec& tightest_device(const PlanOptions& o, const cluster::Cluster& c) {
  const cluster::Device* best = &c.devices().front();
  for (const auto& d : c.devices())
    if (usable_memory(o, d.spec) < usable_memory(o, best->spec)) best = &d;
  return best->spec;
}

int auto_blocks(const ir::Graph& g, const PlanOptions& o) {
  if (o.num_blocks > 0) return o.num_blocks;
  int fwd = 0;
  for (auto ph : pipeline::classify_ops(g))
    if (ph == pipeline::OpPhase::Forward) ++fwd;
  return std::max(1, std::min(fwd, 16));
}

std::string Context::usable_text() const { return usable_memory_text(opt_, tightest_device(opt_, c_)); }

void init_layout_blocks(Context& ctx, const PlanOptions& o, int depth) {
  ctx.repeated = {};
  if (o.num_blocks == 0) {
    // Layers that are most of the model (a conv net's longest run of identical blocks may be a
    // small part of it: its blocks would then be few and uneven).
    const pipeline::RepeatedLayers rl = pipeline::repeated_layers(ctx.g_);
    if (rl.count >= 2 && 2 * rl.count * rl.period >= rl.forward_ops) {
      ctx.repeated = rl;
      if (depth <= rl.count) {
        ctx.init_blocks(rl.count, std::vector<int>(rl.starts.begin() + 1, rl.starts.end()), true);
        return;
      }
    }
  }
  // Deeper than the layers (a repeated unit of an MoE model is two layers): the blocks as before.
  ctx.init_blocks(auto_blocks(ctx.g_, o));
}

void check_total_memory(const Context& ctx) {
  const auto& c = ctx.c_;
  const double need = model_state_bytes(ctx.g_);
  double have = 0;
  for (const auto& d : c.devices()) have += ctx.usable_of_device(d.id);
  if (need > have)
    fail(
        "make_plan: the model cannot fit: its parameters, gradients and optimizer states need {}, "
        "the cluster has {} usable ({} devices, {} on the smallest): {} missing ({})",
        format_bytes(need), format_bytes(have), c.num_devices(), format_bytes(ctx.usable_memory),
        format_bytes(need - have), ctx.usable_text());
}

// Micro-batch counts to try: the given one, or the powers of two dividing the batch (auto). The
// interleaved schedule needs at least as many micro-batches as pipeline stages, which a batch with
// an odd factor may offer no power of two for (12 samples on 8 stages): for it, each power of two
// 2^k <= B that does not divide B is stood in for by the smallest divisor of B above it (12 here).
std::vector<int> microbatch_counts(const PlanOptions& o, std::int64_t B) {
  if (o.num_microbatches > 0) {
    WEFT_CHECK(B % o.num_microbatches == 0, "make_plan: the batch {} is not divisible by num_microbatches {}",
               B, o.num_microbatches);
    return {o.num_microbatches};
  }
  const bool interleaved = o.schedule == "interleaved";
  std::vector<int> out;
  for (std::int64_t m = 1; m <= B && (o.max_microbatches <= 0 || m <= o.max_microbatches); m *= 2) {
    std::int64_t n = m;
    if (interleaved)
      while (B % n) ++n;
    if (B % n == 0 && (o.max_microbatches <= 0 || n <= o.max_microbatches) &&
        (out.empty() || out.back() != static_cast<int>(n)))
      out.push_back(static_cast<int>(n));
  }
  return out;
}

bool replica_may_fit(Context& ctx, std::int64_t bs, int D, bool kept) {
  return ctx.min_bytes(ctx.blocks_at(bs), 0, ctx.L() - 1, 1, kept, ctx.c_.num_devices() / D) / D <=
         ctx.usable_memory;
}

std::vector<ReplicaConfig> replica_configs(Context& ctx, const std::vector<int>& Ms, int* pruned) {
  // With recompute=auto, the pairs that fit only by recomputing (a replica cannot hold one
  // micro-batch's activations otherwise) are searched only when no pair fits without: each one
  // costs the SPMD searches of its micro-batch size, for a plan that rarely wins (fewer
  // micro-batches: a larger bubble). GPT-39B on 64 V100 planned in 126 s with them, 8 s without,
  // to the same plan. Stages inside the searched pairs still recompute where that pays.
  std::vector<ReplicaConfig> out;
  int left_out = 0;
  for (bool kept : {ctx.opt_.recompute == Recompute::Auto, false}) {
    out.clear();
    left_out = 0;
    for (int M : Ms)
      for (int d : dp_degrees(ctx.opt_, ctx.c_, ctx.global_batch / M)) {
        const std::int64_t bs = ctx.global_batch / (static_cast<std::int64_t>(M) * d);
        if (!ctx.rebatch_note(bs).empty()) continue;  // the batch stays whole (search_space says why)
        if (!ctx.opt_.bound_search || replica_may_fit(ctx, bs, ctx.c_.num_devices() / d, kept))
          out.push_back({M, d});
        else
          ++left_out;
      }
    if (!out.empty()) break;
  }
  if (pruned) *pruned = left_out;
  return out;
}

std::vector<int> dp_degrees(const PlanOptions& o, const cluster::Cluster& c, std::int64_t per_mb) {
  std::vector<int> out;
  const int N = c.num_devices();
  for (int d = 1; d <= N; ++d) {
    if (N % d || per_mb % d) continue;
    if (o.max_data_parallel > 0 && d > o.max_data_parallel) continue;
    if (!o.pipeline && d != 1 && d != N) continue;
    out.push_back(d);
  }
  return out;
}

Context make_context(const ir::Graph& g, const cluster::Cluster& c, const PlanOptions& o, double start,
                     bool layout_evaluation) {
  validate_options(o, c);
  Context ctx(g, c, o, start);
  ctx.usable_memory = usable_memory_of(o, c);
  // Fail fast, before any search (a layout evaluation asked for an infeasible plan prices it anyway).
  if (!(layout_evaluation && o.allow_infeasible)) check_total_memory(ctx);
  (void)batch_size(g);
  return ctx;
}

Context given_shares_context(const ir::Graph& g, const cluster::Cluster& c, const PlanOptions& o,
                             double start, int M, std::size_t shares, const char* who, const char* what) {
  Context ctx = make_context(g, c, o, start);
  ctx.init_blocks(auto_blocks(g, o));
  WEFT_CHECK(M >= 1 && ctx.global_batch % M == 0, "{}: the batch {} is not divisible by {} micro-batches",
             who, ctx.global_batch, M);
  WEFT_CHECK(static_cast<int>(shares) == c.num_devices(),
             "{}: {} {} for {} devices (one per device, in id order)", who, shares, what, c.num_devices());
  return ctx;
}

}  // namespace detail

using namespace detail;

double memory_reserve_of(const PlanOptions& o, const cluster::DeviceSpec& d) {
  if (o.memory_reserve >= 0) return o.memory_reserve;
  return o.memory_limit == 0 && d.memory_bytes >= kMemoryReserveFrom ? kMemoryReserve : 0.0;
}

double usable_memory(const PlanOptions& o, const cluster::DeviceSpec& d) {
  const double cap = o.memory_limit > 0 ? o.memory_limit : d.memory_bytes;
  return std::max(0.0, cap - memory_reserve_of(o, d)) * o.memory_fraction;
}

std::string usable_memory_text(const PlanOptions& o, const cluster::DeviceSpec& d) {
  const double cap = o.memory_limit > 0 ? o.memory_limit : d.memory_bytes;
  const double r = memory_reserve_of(o, d);
  return fmt::format("usable {} = ({} {} − {} reserve) × {:.3g}", format_bytes(usable_memory(o, d)),
                     format_bytes(cap), o.memory_limit > 0 ? "memory_limit" : "capacity", format_bytes(r),
                     o.memory_fraction);
}

double state_bytes_factor(const ir::Graph& g, ir::TensorId t) {
  const auto& info = g.tensor(t);
  if (!is_state_leaf(info)) return 0.0;
  if (info.role != ir::Role::Parameter) return 1.0;
  for (ir::OpId c : g.consumers(t)) {
    const auto& op = g.op(c);
    if (!op.inputs.empty() && op.inputs[0] == t && ir::master_copy(op) >= 0)
      return 1.0 + static_cast<double>(dtype_size(DType::F32)) / static_cast<double>(dtype_size(info.dtype));
  }
  return 2.0;
}

double model_state_bytes(const ir::Graph& g) {
  double b = 0;
  for (ir::TensorId t = 0; t < static_cast<ir::TensorId>(g.tensors().size()); ++t)
    b += static_cast<double>(g.tensor(t).bytes()) * state_bytes_factor(g, t);
  return b;
}

namespace {

// contenders (when given): up to kTraceContenders more feasible plans, fastest first after the
// returned one (each at its simulated step on the full-bandwidth network), for re-ranking under a
// bandwidth trace.
constexpr std::size_t kTraceContenders = 6;
Plan make_plan_fixed(const ir::Graph& g, const cluster::Cluster& c, const PlanOptions& o,
                     std::vector<Plan>* contenders = nullptr) {
  const double start = now_s();
  Context ctx = make_context(g, c, o, start);
  ctx.progress("grouping", 0.0, "layer grouping");
  ctx.init_blocks(auto_blocks(g, o));
  if (!c.homogeneous()) {
    Plan p = make_hetero_plan(ctx);
    p.search_status = ctx.timed_out ? "timeout" : "complete";
    p.plan_seconds = now_s() - start;
    ctx.progress("done", 1.0, fmt::format("{} SPMD searches in {:.2f} s", ctx.spmd_solves, ctx.spmd_seconds));
    return p;
  }
  auto subs = make_mesh_options(ctx);
  WEFT_CHECK(!subs.empty(), "make_plan: no submesh left by the search limits");
  const auto Ms = microbatch_counts(o, ctx.global_batch);
  int pruned = 0;
  const auto configs = replica_configs(ctx, Ms, &pruned);
  if (configs.empty()) {
    // Every pair left out by the bound: name the least demanding one (most micro-batches the graph
    // can be cut into, one replica).
    std::int64_t bs = ctx.global_batch;
    bool any_cut = false;
    for (int M : Ms)
      if (ctx.rebatch_note(ctx.global_batch / M).empty()) bs = ctx.global_batch / M, any_cut = true;
    if (!any_cut && !Ms.empty()) {  // not memory: the graph cannot be cut into any of these counts
      const std::string why = ctx.rebatch_note(ctx.global_batch / Ms.front());
      fail("make_plan: the batch {} cannot be split into {} micro-batches: {}", ctx.global_batch,
           fmt::join(Ms, " or "), why);
    }
    const auto& ab = ctx.blocks_at(bs);
    const double state = ctx.min_bytes(ab, 0, ctx.L() - 1, 0), act = ctx.min_bytes(ab, 0, ctx.L() - 1, 1) - state;
    fail(
        "make_plan: the model cannot fit: with {} micro-batches of {} samples and one replica over all {} "
        "devices, parameter state {} plus one micro-batch of saved activations {} need "
        ">= {} per device, {} usable ({})",
        ctx.global_batch / bs, bs, c.num_devices(), format_bytes(state), format_bytes(act),
        format_bytes((state + act) / c.num_devices()), format_bytes(ctx.usable_memory), ctx.usable_text());
  }
  prefetch_stage_costs(ctx, subs, configs);
  // Branch and bound over the (M, replicas) pairs: each pair's relaxed stage DP (unconstrained
  // layouts, no memory-limited SPMD search) bounds its pipeline latency proxy, which bounds its
  // step from below; pairs are searched in the order of their bounds, the best candidate of each
  // is simulated, and a pair whose bound is not below the best simulated step so far is not
  // searched (the memory-limited searches of hopeless pairs were most of the planning time).
  std::vector<std::pair<double, ReplicaConfig>> by_bound;
  for (const auto& rc : configs) {
    double lb = kInf;
    for (const auto& cand : partition_candidates(ctx, subs, rc.M, rc.dp, true)) lb = std::min(lb, cand.proxy);
    by_bound.emplace_back(lb, rc);
  }
  std::stable_sort(by_bound.begin(), by_bound.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<ReplicaConfig> searched;
  double best_step = kInf;  // the best simulated step so far
  int bounded = 0;
  std::vector<Candidate> cands;
  for (const auto& [lb, rc] : by_bound) {
    // The DP's bounds grid is geometric (ratio 1.02): its proxy is within 2% of the relaxation's optimum.
    if (o.bound_search && (lb / 1.02 >= best_step || lb == kInf)) {
      ++bounded;
      continue;
    }
    searched.push_back(rc);
    const int M = rc.M, d = rc.dp;
    auto cs = partition_candidates(ctx, subs, M, d);
    if (!cs.empty() && !ctx.out_of_time()) {
      const auto top = std::min_element(cs.begin(), cs.end(),
                                        [](const Candidate& a, const Candidate& b) { return a.proxy < b.proxy; });
      Built b = materialise(ctx, subs, *top, reshard::Balancer::LargestFirst);
      if (b.feasible) best_step = std::min(best_step, b.plan.step_time);
    }
    cands.insert(cands.end(), cs.begin(), cs.end());
    // Equal-block partitions on every submesh size that divides the replica (Megatron-like).
    if (!o.uniform_partitions || !o.pipeline) continue;
    const int D = c.num_devices() / d;
    const std::int64_t bs = ctx.global_batch / (static_cast<std::int64_t>(M) * d);
    for (int si = 0; si < static_cast<int>(subs.size()); ++si) {
      const int n = subs[si].shape.num_devices();
      if (n > D || D % n) continue;
      const int p = D / n;
      if (p < 2 || p > ctx.L() || (o.max_stages > 0 && p > o.max_stages)) continue;
      const auto split = balanced_split(ctx.grouping, p);
      Candidate cand;
      cand.strategy = "pipeline (equal blocks)";
      cand.M = M;
      cand.dp = d;
      cand.bs = bs;
      bool ok = true;
      for (int s = 0; s < p && ok; ++s) {
        auto sc = best_stage(ctx, subs[si].meshes, split[s].first, split[s].second, si, bs, M,
                             in_flight(o.schedule, p - s, M, o.schedule_k), 0, nullptr, d);
        if (!sc)
          ok = false;
        else
          cand.stages.push_back(*sc);
      }
      if (!ok) continue;
      cand.proxy = pipeline_proxy(cand.stages, M);
      cands.push_back(std::move(cand));
    }
  }
  // Rhino's stage ILP on a non-linear block DAG (skip connections): block orders whose contiguous
  // cuts the grouping's order does not contain, and the stage DP again over each (no new SPMD
  // search: block costs are cached by structure).
  if (o.pipeline && o.stage_ilp) {
    ctx.progress("partition", 0.66, "stage ILP block orders");
    for (const auto& order : ilp_block_orders(ctx, o.max_stages > 0 ? o.max_stages : c.num_devices())) {
      BlockOrderScope scope(ctx, order);
      for (const auto [M, d] : searched)
        for (auto& cand : partition_candidates(ctx, subs, M, d)) {
          if (cand.stages.size() < 2) continue;  // one stage: the same as in the grouping's order
          cand.strategy = "pipeline (ILP order)";
          cand.block_order = order;
          cands.push_back(std::move(cand));
        }
    }
  }
  ctx.progress("simulate", 0.7, fmt::format("simulating {} candidates", cands.size()));
  std::vector<Alternative> alts;
  std::optional<Built> best;
  std::optional<Candidate> best_cand;
  // Simulate the candidates, cheapest proxy first; materialising all of them is what costs (the
  // resharding plans), so only the best few per (M, dp) by proxy are simulated.
  std::stable_sort(cands.begin(), cands.end(),
                   [](const Candidate& a, const Candidate& b) { return a.proxy < b.proxy; });
  const std::size_t max_sim = static_cast<std::size_t>(std::max(1, o.max_simulated));
  std::vector<Plan> runners;  // the fastest feasible plans (contenders), kept when asked for
  auto keep = [&](const Plan& q) {
    if (!contenders) return;
    runners.push_back(q);
    std::stable_sort(runners.begin(), runners.end(),
                     [](const Plan& x, const Plan& y) { return x.step_time < y.step_time; });
    if (runners.size() > kTraceContenders + 1) runners.pop_back();
  };
  for (std::size_t i = 0; i < cands.size() && i < max_sim; ++i) {
    if (ctx.out_of_time() && (best || ctx.past_grace())) break;
    Built b = materialise(ctx, subs, cands[i], reshard::Balancer::LargestFirst);
    alts.push_back(alternative_of(b));
    if (b.feasible) keep(b.plan);
    if (b.feasible && (!best || b.plan.step_time < best->plan.step_time)) {
      best = std::move(b);
      best_cand = cands[i];
    }
  }
  // The Megatron-style layouts are points of the search space too (equal blocks, tensor-parallel
  // groups inside a node, replicated pipelines, the group's inputs replicated): they compete.
  bool mega_won = false;
  if (o.compare_megatron && !ctx.out_of_time()) {
    auto [mb, malts] = megatron_all(ctx);
    for (auto& a : malts) {
      a.strategy += " (baseline)";
      alts.push_back(a);
    }
    if (mb && mb->feasible) keep(mb->plan);
    if (mb && mb->feasible && (!best || mb->plan.step_time < best->plan.step_time)) {
      best = std::move(mb);
      mega_won = true;
    }
  }
  if (!best) {
    sort_alternatives(alts, 0, false);
    std::string why;
    for (std::size_t i = 0; i < std::min<std::size_t>(4, alts.size()); ++i)
      why += fmt::format("\n  {} {}: {}", alts[i].strategy, alts[i].layout, alts[i].note);
    if (ctx.timed_out)
      fail(
          "make_plan: no plan found within the time limit of {} s for {} on {} (raise time_limit or narrow "
          "the search: num_blocks, whole_nodes_only, power_of_two_nodes, max_logical_shapes, "
          "num_microbatches); candidates so far:{}",
          o.time_limit_s, g.name(), c.to_string(), why.empty() ? std::string(" none") : why);
    fail("make_plan: no plan fits in {} per device ({}) for {} on {}; closest candidates:{}",
         format_bytes(ctx.usable_memory), ctx.usable_text(), g.name(), c.to_string(), why);
  }
  // The winner with the best resharding plans (skipped at the deadline: the largest-first plans
  // it was simulated with stand).
  ctx.progress("simulate", 0.97, "final resharding plans");
  if (!mega_won && !ctx.out_of_time()) {
    Built fin = materialise(ctx, subs, *best_cand, reshard::Balancer::Best);
    if (fin.feasible && fin.plan.step_time <= best->plan.step_time) best = std::move(fin);
  }
  sort_alternatives(alts, o.max_alternatives);
  Plan p = std::move(best->plan);
  p.alternatives = std::move(alts);
  p.search_space = search_space_text(ctx, subs, Ms, configs.size(), pruned, bounded);
  p.search_status = ctx.timed_out ? "timeout" : "complete";
  if (contenders) {  // the others, without the winner's own largest-first version
    const std::string winner = layout_text(p);
    for (auto& q : runners)
      if (contenders->size() < kTraceContenders && !(layout_text(q) == winner && q.num_microbatches == p.num_microbatches &&
                                                      q.data_parallel == p.data_parallel))
        contenders->push_back(std::move(q));
  }
  p.plan_seconds = now_s() - start;
  ctx.progress("done", 1.0, fmt::format("{} SPMD searches in {:.2f} s", ctx.spmd_solves, ctx.spmd_seconds));
  return p;
}

}  // namespace

// The fixed-schedule search, then (with a bandwidth trace or schedule "adaptive") Ada-Grouper's
// policy: the layout is planned under 1F1B, whose in-flight memory is the frontier's k = 1 point;
// the fastest plans of that search (up to 1 + kTraceContenders, full-bandwidth steps) are
// re-ranked by their policy's mean step over the trace, so a busy network can change the layout
// (fewer or cheaper stage boundaries), not only the k per window.
Plan make_plan(const ir::Graph& g, const cluster::Cluster& c, const PlanOptions& o) {
  if (o.schedule != "adaptive" && !o.bandwidth_trace) return make_plan_fixed(g, c, o);
  check_adaptive_options(o.adaptive);  // bad options fail before any search
  PlanOptions fixed = o;
  if (o.schedule == "adaptive") fixed.schedule = "1f1b";
  std::vector<Plan> contenders;
  Plan p = make_plan_fixed(g, c, fixed, &contenders);
  const double t0 = now_s();
  const cluster::BandwidthTrace trace = o.bandwidth_trace.value_or(cluster::BandwidthTrace{});
  p.adaptive = adaptive_policy(p, trace, o.adaptive);
  const std::string first = layout_text(p);
  const double first_step = p.adaptive->step;
  int ranked = 1;
  for (Plan& q : contenders) {
    if (o.stop.cancelled()) break;
    AdaptivePolicy pol;
    try {
      pol = adaptive_policy(q, trace, o.adaptive);
    } catch (const InternalError&) {
      throw;
    } catch (const Error&) {
      continue;  // no kFkB point of this layout fits: not a contender under the trace
    }
    ++ranked;
    if (pol.step < p.adaptive->step * (1 - 1e-9)) {
      q.alternatives = std::move(p.alternatives);
      q.search_space = std::move(p.search_space);
      q.search_status = p.search_status;
      q.plan_seconds = p.plan_seconds;
      q.adaptive = std::move(pol);
      p = std::move(q);
    }
  }
  p.search_space += fmt::format(
      "; under the bandwidth trace: the {} fastest plans re-ranked by their policy's mean step ({}: {:.4g} s{})",
      ranked, layout_text(p) == first ? "the full-bandwidth best kept" : "changed from " + first,
      p.adaptive->step, layout_text(p) == first ? "" : fmt::format(" against {:.4g} s", first_step));
  p.plan_seconds += now_s() - t0;
  return p;
}

}  // namespace weft::plan
