// Given layouts priced with the planner's cost model: the Megatron-style (t, p, d) layouts
// (megatron_layouts, megatron_plan, best_megatron_plan, and megatron_all, the sweep make_plan's
// candidates compete with) and layout_plan (stages of given blocks on given devices).
#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "planner_detail.hpp"
#include "weft/cluster/device_mesh.hpp"
#include "weft/core/error.hpp"
#include "weft/pipeline/submesh.hpp"
#include "weft/plan/planner.hpp"

namespace weft::plan {

namespace detail {

// Blocks first..last on `mesh` at their unconstrained layouts (the fast variant searched without
// the memory-bound shortcut) in one boundary mode, with no memory check.
std::optional<StageChoice> unconstrained_stage_in(Context& ctx, const MeshOption& mesh, int first, int last,
                                                  std::int64_t bs, int inflight, int forced_dp,
                                                  int replicas) {
  // With recompute=auto the layout is priced as it would run where it fits: without recomputation.
  // With zero=auto at the ZeRO option the planner turns to when memory binds: of the levels and
  // shard groups it would search (zero_levels, shard_groups), the one that keeps the least (ties:
  // the faster) — ZeRO-3 over every replica as a rule; ZeRO-0 held 3.6x its state on GPT-3.
  const Recompute mode = ctx.opt_.recompute == Recompute::Auto ? Recompute::None : ctx.opt_.recompute;
  StageAgg a = recomputed(aggregate(ctx, first, last, bs, mesh, kUnboundedVariant, forced_dp), mode);
  if (!a.ok) return std::nullopt;
  if (replicas > 1) {
    const int n = static_cast<int>(mesh.mesh.size());
    std::optional<StageAgg> pick;
    for (int level : zero_levels(ctx.opt_, replicas))
      for (int z : level == 0 ? std::vector<int>{replicas} : shard_groups(ctx.c_, ctx.opt_, replicas, n)) {
        StageAgg w =
            with_replicas(a, level, ctx.canonical_replica_links(n, replicas, z), a.param_mem, ctx.opt_);
        const double mem = stage_memory(w, inflight), t = w.fwd + w.bwd;
        if (!pick) {
          pick = std::move(w);
          continue;
        }
        const double pm = stage_memory(*pick, inflight);
        if (mem < pm * (1 - 1e-12) || (mem <= pm * (1 + 1e-12) && t < pick->fwd + pick->bwd))
          pick = std::move(w);
      }
    a = std::move(*pick);
  }
  return StageChoice{first,
                     last,
                     0,
                     0,
                     kUnboundedVariant,
                     forced_dp,
                     a.fwd + a.bwd,
                     stage_memory(a, inflight),
                     a.recompute,
                     a.zero,
                     a.zero_group};
}

// How a layout evaluation prices a stage that fits nowhere (the report then names the worst
// stage; PlanOptions::allow_infeasible returns the plan): its unconstrained layouts, in the
// boundary mode the stage chooser would pick with room — of free and agreed boundaries (forced_dp
// 0 on a mesh of several devices) the faster; a forced mode (Megatron's) as given. materialise
// then marks the plan infeasible with the memory it needs.
std::optional<StageChoice> unconstrained_stage(Context& ctx, const MeshOption& mesh, int first, int last,
                                               std::int64_t bs, int inflight, int forced_dp,
                                               int replicas = 1) {
  std::optional<StageChoice> best =
      unconstrained_stage_in(ctx, mesh, first, last, bs, inflight, forced_dp, replicas);
  if (forced_dp == 0 && mesh.mesh.size() > 1) {
    auto agreed = unconstrained_stage_in(ctx, mesh, first, last, bs, inflight,
                                         static_cast<int>(mesh.mesh.shape()[0]), replicas);
    if (agreed && (!best || agreed->time < best->time)) best = agreed;
  }
  return best;
}

// A plan with a stage that the stage chooser refused and that was priced at its unconstrained
// layout is infeasible even where that layout's peak fits (the chooser's reason stands).
Built refused_stays_refused(Built b, const std::string& first_refused) {
  if (b.feasible && !first_refused.empty()) {
    b.feasible = false;
    b.note = first_refused;
  }
  return b;
}

// A layout evaluation's result: the plan, or with allow_infeasible the plan marked infeasible.
Plan evaluated(Built b, const Context& ctx, double start, const std::string& what) {
  if (!b.feasible) {
    WEFT_CHECK(ctx.opt_.allow_infeasible && !b.plan.stages.empty(), "{}: {}", what, b.note);
    b.plan.feasible = false;
    b.plan.infeasible_reason = b.note;
  }
  b.plan.search_status = ctx.timed_out ? "timeout" : "complete";
  b.plan.plan_seconds = now_s() - start;
  return std::move(b.plan);
}

// Megatron's stages: with one block per layer and a depth dividing the layers, layers / p each
// (Megatron-LM's split: the embedding rides with the first stage, the LM head and loss with the
// last); otherwise the blocks' balanced FLOP split.
std::vector<std::pair<int, int>> megatron_split(const Context& ctx, int p) {
  if (ctx.layers == 0 || ctx.L() % p != 0) return balanced_split(ctx.grouping, p);
  const int per = ctx.L() / p;
  std::vector<std::pair<int, int>> out;
  for (int s = 0; s < p; ++s) out.emplace_back(s * per, s * per + per - 1);
  return out;
}

// `splits`: Megatron's column / row / vocabulary splits fixed in the tensor-parallel stages
// (megatron_plan); without, each block's layout is searched on the stage's t-device mesh with its
// inputs replicated (the (t, p, d) sweep make_plan's candidates compete with, best_megatron_plan).
Built megatron_build(Context& ctx, const MegatronLayout& lay, int M, bool splits) {
  const auto& c = ctx.c_;
  const int N = c.num_devices();
  Built b;
  b.plan.strategy = "megatron " + lay.to_string();
  // Megatron's column / row / vocabulary splits as fixed specs (megatron_specs.hpp); a graph with
  // none of its roles (a conv net) keeps the free search of its t-device stages, and says so.
  const int mode = splits ? ctx.megatron_mode(lay.t) : 1;
  if (splits && lay.t > 1 && mode != kMegatronTp)
    b.plan.strategy += " (no Megatron roles recognised: free tensor-parallel search)";
  WEFT_CHECK(lay.t >= 1 && lay.p >= 1 && lay.d >= 1 && lay.t * lay.p * lay.d == N,
             "megatron layout {}: t·p·d must equal the {} devices", lay.to_string(), N);
  if (lay.p > ctx.L()) {
    b.note = fmt::format(
        "{} stages but only {} blocks{}", lay.p, ctx.L(),
        ctx.repeated.count > 0
            ? fmt::format(" (the model repeats {} layers of {} forward ops; a stage holds at least "
                          "one block)",
                          ctx.repeated.count, ctx.repeated.period)
            : std::string(" (num_blocks)"));
    return b;
  }
  if (ctx.global_batch % (static_cast<std::int64_t>(M) * lay.d) != 0) {
    b.note = fmt::format("batch {} not divisible by M·d = {}", ctx.global_batch, M * lay.d);
    return b;
  }
  if (const auto& why = ctx.rebatch_note(ctx.global_batch / (static_cast<std::int64_t>(M) * lay.d));
      !why.empty()) {
    b.note = fmt::format("the batch cannot be split into {} × {}: {}", M, lay.d, why);
    return b;
  }
  Candidate cand;
  std::string first_refused;  // the first stage best_stage refused (priced unconstrained instead)
  cand.strategy = b.plan.strategy;
  cand.M = M;
  cand.dp = lay.d;
  cand.bs = ctx.global_batch / (static_cast<std::int64_t>(M) * lay.d);
  const int per = N / lay.p;  // devices of a stage: d replicas × t
  const auto split = megatron_split(ctx, lay.p);
  for (int s = 0; s < lay.p; ++s) {
    std::vector<int> ids(per);
    std::iota(ids.begin(), ids.end(), s * per);  // Megatron's rank order: t fastest, then d, then p
    std::vector<int> rep0(ids.begin(), ids.begin() + lay.t);
    cluster::DeviceMesh mesh({lay.t}, rep0);
    cand.meshes.push_back({pipeline::SubmeshShape(1, lay.t), {lay.t}, mesh, ctx.mesh_key(mesh)});
    cand.devices.push_back(ids);
    // The tensor-parallel group's inputs are replicated (Megatron): forced_dp = 1, or
    // kMegatronTp with Megatron's fixed specs.
    const int inf = in_flight(ctx.opt_.schedule, lay.p - s, M, ctx.opt_.schedule_k);
    std::string why;
    auto sc = best_stage(ctx, {cand.meshes.back()}, split[s].first, split[s].second, 0, cand.bs, M, inf, mode,
                         &why, lay.d);
    // A layout evaluation (megatron_plan) prices a stage that fits nowhere at its unconstrained
    // layout, so that what does not fit is reported by the worst stage and its figures.
    if (!sc && (ctx.opt_.allow_infeasible || splits)) {
      sc = unconstrained_stage(ctx, cand.meshes.back(), split[s].first, split[s].second, cand.bs, inf, mode,
                               lay.d);
      if (sc && first_refused.empty()) first_refused = fmt::format("stage {}: {}", s, why);
    }
    if (!sc) {
      b.note = fmt::format("stage {}: {}", s, why);
      return b;
    }
    cand.stages.push_back(*sc);
  }
  return refused_stays_refused(materialise(ctx, {}, cand, reshard::Balancer::LargestFirst), first_refused);
}

// The first t devices of the cluster as a 1-D tensor-parallel mesh: Megatron's stage meshes all
// have its key (same shape, kind and links), so its block costs serve every stage.
MeshOption megatron_mesh(Context& ctx, int t) {
  std::vector<int> ids(static_cast<std::size_t>(t));
  std::iota(ids.begin(), ids.end(), 0);
  cluster::DeviceMesh mesh({t}, ids);
  return {pipeline::SubmeshShape(1, t), {t}, mesh, ctx.mesh_key(mesh)};
}

// Every Megatron layout × micro-batch count; the best first.
std::pair<std::optional<Built>, std::vector<Alternative>> megatron_all(Context& ctx) {
  std::optional<Built> best;
  std::vector<Alternative> alts;
  const auto& o = ctx.opt_;
  const auto layouts = megatron_layouts(ctx.c_, std::min(ctx.L(), o.max_stages > 0 ? o.max_stages : ctx.L()));
  const auto Ms = microbatch_counts(o, ctx.global_batch);
  // The user's limits bound the baselines too.
  auto allowed = [&](const MegatronLayout& lay) {
    return !(o.max_data_parallel > 0 && lay.d > o.max_data_parallel) && !(!o.pipeline && lay.p > 1) &&
           !(o.max_stages > 0 && lay.p > o.max_stages);
  };
  // The memory bound of make_plan's pairs, on the layout's replica (t·p devices); a batch that M·d
  // does not divide is left to megatron_build's note.
  // With recompute=auto, as make_plan's pairs: the counts that fit only by recomputing are tried
  // for a layout only when none fits without.
  auto may_fit_as = [&](const MegatronLayout& lay, int M, bool kept) {
    const std::int64_t per = static_cast<std::int64_t>(M) * lay.d;
    return ctx.global_batch % per != 0 || !ctx.rebatch_note(ctx.global_batch / per).empty() ||
           replica_may_fit(ctx, ctx.global_batch / per, lay.t * lay.p, kept);  // else megatron_build's note
  };
  // A layout that fits only by recomputing is tried at its two largest micro-batch counts (the
  // smallest micro-batches: Megatron's choice when memory binds); each count costs SPMD searches.
  auto may_fit = [&](const MegatronLayout& lay, int M) {
    if (o.recompute != Recompute::Auto) return may_fit_as(lay, M, false);
    std::vector<int> fit_kept, fit_any;
    for (int m : Ms) {
      const std::int64_t per = static_cast<std::int64_t>(m) * lay.d;
      if (ctx.global_batch % per) continue;
      if (may_fit_as(lay, m, true)) fit_kept.push_back(m);
      if (may_fit_as(lay, m, false)) fit_any.push_back(m);
    }
    const std::int64_t per = static_cast<std::int64_t>(M) * lay.d;
    if (ctx.global_batch % per) return true;  // left to megatron_build's note
    if (!fit_kept.empty()) return std::find(fit_kept.begin(), fit_kept.end(), M) != fit_kept.end();
    std::sort(fit_any.rbegin(), fit_any.rend());
    if (fit_any.size() > 2) fit_any.resize(2);
    return std::find(fit_any.begin(), fit_any.end(), M) != fit_any.end();
  };
  {
    // Their SPMD searches on every core first (tensor-parallel meshes, inputs replicated).
    std::vector<MeshOption> meshes;
    for (const auto& lay : layouts) meshes.push_back(megatron_mesh(ctx, lay.t));
    std::vector<Context::BlockRequest> reqs;
    for (std::size_t li = 0; li < layouts.size(); ++li)
      for (int M : Ms) {
        const auto& lay = layouts[li];
        const std::int64_t per = static_cast<std::int64_t>(M) * lay.d;
        if (!allowed(lay) || lay.p > ctx.L() || ctx.global_batch % per ||
            !ctx.rebatch_note(ctx.global_batch / per).empty() || !may_fit(lay, M))
          continue;
        for (int b = 0; b < ctx.L(); ++b) reqs.push_back({b, ctx.global_batch / per, &meshes[li], 0, 1});
      }
    if (!ctx.out_of_time()) ctx.prefetch_block_costs(reqs);
  }
  std::size_t i = 0;
  for (const auto& lay : layouts)
    for (int M : Ms) {
      if (!allowed(lay)) continue;
      if (!may_fit(lay, M)) continue;
      if (ctx.out_of_time() && (best || ctx.past_grace())) break;
      ctx.progress("baseline", static_cast<double>(i++) / (layouts.size() * Ms.size()),
                   fmt::format("{} M={}", lay.to_string(), M));
      if (lay.p == 1 && M > 1 && Ms.size() > 1 && M != Ms.front()) {
        // a 1-stage layout gains nothing from more micro-batches except memory: still tried
      }
      Built b = megatron_build(ctx, lay, M, false);
      if (b.plan.stages.empty() && !b.note.empty() && b.note.find("divisible") != std::string::npos) continue;
      alts.push_back(alternative_of(b));
      if (b.feasible && (!best || b.plan.step_time < best->plan.step_time)) best = std::move(b);
    }
  return {std::move(best), std::move(alts)};
}

}  // namespace detail

using namespace detail;

std::string MegatronLayout::to_string() const { return fmt::format("t={} p={} d={}", t, p, d); }

std::vector<MegatronLayout> megatron_layouts(const cluster::Cluster& c, int max_p) {
  const int N = c.num_devices();
  const int G = c.nodes().empty() ? 1 : c.nodes()[0].num_devices;
  std::vector<MegatronLayout> out;
  for (int t = 1; t <= G; ++t) {
    if (G % t || N % t) continue;
    for (int p = 1; p <= N / t; ++p) {
      if ((N / t) % p) continue;
      if (max_p > 0 && p > max_p) continue;
      out.push_back({t, p, N / (t * p)});
    }
  }
  return out;
}

Plan megatron_plan(const ir::Graph& g, const cluster::Cluster& c, const MegatronLayout& layout,
                   const PlanOptions& o) {
  const double start = now_s();
  Context ctx = make_context(g, c, o, start, true);
  init_layout_blocks(ctx, o, layout.p);
  const auto Ms = microbatch_counts(o, ctx.global_batch);
  std::optional<Built> best, closest;  // closest: the infeasible one with the least peak memory
  std::string why;
  for (int M : Ms) {
    Built b = megatron_build(ctx, layout, M, true);
    if (b.feasible && (!best || b.plan.step_time < best->plan.step_time)) {
      best = std::move(b);
    } else if (!b.feasible) {
      why = b.note;
      if (!b.plan.stages.empty() && (!closest || b.plan.peak_memory < closest->plan.peak_memory))
        closest = std::move(b);
    }
  }
  if (!best && ctx.opt_.allow_infeasible && closest)
    return evaluated(std::move(*closest), ctx, start, "megatron layout " + layout.to_string());
  // The reason of the micro-batch count that came closest (least peak memory): its worst stage.
  WEFT_CHECK(
      best.has_value(), "megatron layout {} does not fit: {}{}", layout.to_string(),
      closest ? closest->note : why,
      closest ? fmt::format(" (the micro-batch count that came closest: {})", closest->plan.num_microbatches)
              : std::string());
  return evaluated(std::move(*best), ctx, start, "megatron layout " + layout.to_string());
}

Plan layout_plan(const ir::Graph& g, const cluster::Cluster& c, const std::vector<StageLayout>& layout, int M,
                 const PlanOptions& o) {
  const double start = now_s();
  Context ctx = make_context(g, c, o, start, true);
  ctx.init_blocks(auto_blocks(g, o));
  WEFT_CHECK(M >= 1 && ctx.global_batch % M == 0,
             "layout_plan: the batch {} is not divisible by {} micro-batches", ctx.global_batch, M);
  WEFT_CHECK(!layout.empty(), "layout_plan: no stage");
  const int S = static_cast<int>(layout.size());
  Candidate cand;
  cand.strategy = "layout";
  cand.M = M;
  cand.dp = 1;
  cand.bs = ctx.global_batch / M;
  std::set<int> used;
  std::string first_refused;
  int next = 0;
  for (int s = 0; s < S; ++s) {
    const auto& st = layout[static_cast<std::size_t>(s)];
    WEFT_CHECK(
        st.first_block == next && st.last_block >= st.first_block && st.last_block < ctx.L(),
        "layout_plan: stage {} covers blocks {}-{}; expected a range starting at block {} within the {} "
        "blocks",
        s, st.first_block, st.last_block, next, ctx.L());
    next = st.last_block + 1;
    WEFT_CHECK(!st.devices.empty(), "layout_plan: stage {} has no device", s);
    std::set<int> nodes;
    for (int d : st.devices) {
      WEFT_CHECK(d >= 0 && d < c.num_devices(), "layout_plan: stage {}: device {} is not in the cluster", s,
                 d);
      WEFT_CHECK(used.insert(d).second, "layout_plan: device {} is used by two stages", d);
      nodes.insert(c.node_of(d));
    }
    const int n = static_cast<int>(st.devices.size());
    std::vector<std::int64_t> logical = st.mesh.empty() ? std::vector<std::int64_t>{n} : st.mesh;
    cluster::DeviceMesh mesh(canonical_logical(logical), st.devices);  // validates the shape
    const int nn = static_cast<int>(nodes.size());
    const pipeline::SubmeshShape shape(nn, n % nn == 0 ? n / nn : n);
    cand.meshes.push_back({shape, mesh.shape(), mesh, ctx.mesh_key(mesh)});
    cand.devices.push_back(st.devices);
    std::string why;
    const int inf = in_flight(o.schedule, S - s, M, o.schedule_k);
    auto sc =
        best_stage(ctx, {cand.meshes.back()}, st.first_block, st.last_block, 0, cand.bs, M, inf, 0, &why);
    // Priced at its unconstrained layout so that the report names the worst stage.
    if (!sc) {
      sc = unconstrained_stage(ctx, cand.meshes.back(), st.first_block, st.last_block, cand.bs, inf, 0);
      const std::string r =
          fmt::format("stage {} (blocks {}-{} on {} devices): {}", s, st.first_block, st.last_block, n, why);
      WEFT_CHECK(sc.has_value(), "layout_plan: the layout does not fit: {}", r);
      if (first_refused.empty()) first_refused = r;
    }
    cand.stages.push_back(*sc);
  }
  WEFT_CHECK(next == ctx.L(), "layout_plan: the stages cover blocks 0-{} of {}", next - 1, ctx.L());
  return evaluated(refused_stays_refused(materialise(ctx, {}, cand, reshard::Balancer::Best), first_refused),
                   ctx, start, "layout_plan: the layout does not fit");
}

Plan best_megatron_plan(const ir::Graph& g, const cluster::Cluster& c, const PlanOptions& o) {
  const double start = now_s();
  Context ctx = make_context(g, c, o, start);
  ctx.init_blocks(auto_blocks(g, o));
  auto [best, alts] = megatron_all(ctx);
  WEFT_CHECK(best.has_value(), "no Megatron-style layout fits in memory ({} tried; first: {})", alts.size(),
             alts.empty() ? std::string("none") : alts.front().note);
  sort_alternatives(alts, o.max_alternatives);
  best->plan.alternatives = std::move(alts);
  best->plan.search_status = ctx.timed_out ? "timeout" : "complete";
  best->plan.plan_seconds = now_s() - start;
  return best->plan;
}

}  // namespace weft::plan
