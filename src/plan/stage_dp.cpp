// The stage search of the homogeneous planner: a stage's costs from its blocks (aggregate), the
// best logical mesh, SPMD variant, boundary mode, recomputation and ZeRO level of one stage
// (best_stage), the stage DP shared with the heterogeneous search (stage_dp; the math is at the
// top of planner.cpp), the partition candidates of one (micro-batches, replicas) pair with the SPMD
// prefetch they read and their relaxed lower bound (partition_candidates), the equal-block split
// of the Megatron-like candidates (balanced_split) and the block orders of Rhino's stage ILP
// (ilp_block_orders).
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "planner_detail.hpp"
#include "weft/core/error.hpp"
#include "weft/core/units.hpp"
#include "weft/pipeline/grouping.hpp"
#include "weft/pipeline/partition.hpp"
#include "weft/pipeline/submesh.hpp"

namespace weft::plan::detail {

StageAgg aggregate(Context& ctx, int first, int last, std::int64_t bs, const MeshOption& m, int variant,
                   int forced_dp) {
  StageAgg a;
  auto tensors = std::make_shared<ParamTensors>();
  for (int b = first; b <= last; ++b) {
    const BlockCost& bc = ctx.block_cost(b, bs, m, variant, forced_dp);
    if (!bc.ok) {
      a.error = bc.error;
      return a;
    }
    a.fwd += bc.fwd;
    a.bwd += bc.bwd;
    a.wgt += bc.wgt;
    a.upd += bc.upd;
    a.grad_sync += bc.grad_sync;
    a.compute += bc.compute;
    a.comm += bc.comm;
    a.static_mem += bc.static_mem;
    a.act_mem += bc.act_mem;
    a.transient = std::max(a.transient, bc.transient);
    a.fwd_compute += bc.fwd_compute;
    a.checkpoint_mem += bc.checkpoint_mem;
    a.sel_mem += bc.sel_mem;
    a.sel_time += bc.sel_time;
    a.param_mem += bc.param_mem;
    a.grad_mem += bc.grad_mem;
    a.opt_mem += bc.opt_mem;
    a.max_block_param = std::max(a.max_block_param, bc.param_mem);
    a.upd_excess = std::max(a.upd_excess, bc.upd_excess);
    a.rest_excess = std::max(a.rest_excess, bc.rest_excess);
    a.upd_compute += bc.upd_compute;
    a.full_transient = std::max(a.full_transient, bc.transient + bc.full_remake);
    a.blk_act.push_back(bc.act_mem);
    a.blk_ckpt.push_back(bc.checkpoint_mem);
    a.blk_fwd.push_back(bc.fwd);
    a.blk_fwd_compute.push_back(bc.fwd_compute);
    a.blk_remake.push_back(bc.transient + bc.full_remake);
    a.blk_param.push_back(bc.param_mem);
    a.blk_sel_mem.push_back(bc.sel_mem);
    a.blk_sel_time.push_back(bc.sel_time);
    a.blk_sel_remake.push_back(bc.transient + bc.sel_peak);
    tensors->bytes.insert(tensors->bytes.end(), bc.param_tensor_bytes.begin(), bc.param_tensor_bytes.end());
    a.sel_transient = std::max(a.sel_transient, bc.transient + bc.sel_peak);
  }
  // Tensors passed between the stage's blocks: each block's SPMD plan chose its own layout.
  const Context::InternalReshard r = ctx.internal_reshard(first, last, bs, m, variant, forced_dp);
  a.fwd += r.fwd;
  a.bwd += r.bwd;
  a.upd += r.upd;
  a.comm += r.fwd + r.bwd;
  a.between_blocks = r.fwd + r.bwd + r.upd;
  tensors->sum = std::accumulate(tensors->bytes.begin(), tensors->bytes.end(), 0.0);
  a.param_tensors = std::move(tensors);
  a.ok = true;
  return a;
}

double stage_memory(const StageAgg& a, int inflight) {
  return a.static_mem + inflight * a.act_mem + a.transient;
}

// Best (mesh, variant, boundary mode) of a stage on a submesh (see planner_detail.hpp).
std::optional<StageChoice> best_stage(Context& ctx, const std::vector<MeshOption>& meshes, int first,
                                      int last, int sub, std::int64_t bs, int M, int inflight, int forced_dp,
                                      std::string* why, int replicas) {
  std::optional<StageChoice> best;
  double best_share = kInf;  // M·(F + B) + update of `best`
  if (meshes.empty()) return best;
  const int n = static_cast<int>(meshes[0].mesh.size());
  const double usable = ctx.usable(meshes[0].mesh);
  // Quick reject, before any SPMD search: state bytes (over the replicas where ZeRO may shard them)
  // and the in-flight micro-batches' saved activations cannot shrink below full / devices.
  const double need = ctx.min_bytes(ctx.blocks_at(bs), first, last, inflight, false, replicas) / n;
  // The replica options: (ZeRO level, links of its shard groups); one replica: none.
  std::vector<std::pair<int, const ReplicaLinks*>> sharding;
  if (replicas > 1)
    for (int level : zero_levels(ctx.opt_, replicas))
      for (int z : level == 0 ? std::vector<int>{replicas} : shard_groups(ctx.c_, ctx.opt_, replicas, n))
        sharding.emplace_back(level, &ctx.canonical_replica_links(n, replicas, z));
  if (need > usable) {
    if (why)
      *why = fmt::format("needs >= {}/device (parameter state and {} micro-batch(es) of activations)",
                         format_bytes(need), inflight);
    return best;
  }
  for (int mi = 0; mi < static_cast<int>(meshes.size()); ++mi) {
    // Free boundaries (each block picks the layouts of what it passes on; the stage pays the
    // resharding between blocks) and, on several devices, agreed ones (every block's inputs and
    // passed-on results batch-sharded on mesh axis 0 where the batch divides, else replicated).
    // Agreed boundaries only add constraints and costs to every block's SPMD objective, so when
    // free boundaries fit and reshard nothing between the blocks they are skipped (exact for one
    // micro-batch, where a stage's share of the step is that objective; a heuristic beyond).
    std::vector<int> boundary{forced_dp};
    if (forced_dp == 0 && meshes[mi].mesh.size() > 1)
      boundary.push_back(static_cast<int>(meshes[mi].mesh.shape()[0]));
    bool free_is_best = false;
    // Per variant the recomputation modes cheapest first (none, selective, full): the first that
    // fits is that variant's best; the lean variant is still tried when the fast one needs a
    // recomputation (keeping its activations may beat recomputing the fast layout's).
    const std::vector<Recompute> modes = recompute_modes(ctx.opt_.recompute);
    const bool kept_may_fit =
        ctx.min_bytes(ctx.blocks_at(bs), first, last, inflight, true, replicas) / n <= usable;
    for (int f : boundary)
      for (int v = 0; v < 2 && !(f != forced_dp && free_is_best); ++v) {
        const StageAgg plain = aggregate(ctx, first, last, bs, meshes[mi], v, f);
        if (!plain.ok) {
          if (why) *why = plain.error;
          continue;
        }
        // Every (recomputation, ZeRO level) pair: the fastest that fits. Without replicas the first
        // mode that fits is the fastest (recomputation only adds time); with them a ZeRO level that
        // moves more bytes may lose to a recomputation under a lighter level.
        const std::size_t options = std::max<std::size_t>(1, sharding.size());
        auto keep_if_faster = [&](const StageAgg& a, double mem) {
          const double t = a.fwd + a.bwd;
          const double share = M * t + a.upd;
          if (!best || share < best_share) {
            best = StageChoice{first,
                               last,
                               sub,
                               mi,
                               v,
                               f,
                               t,
                               mem,
                               a.recompute,
                               a.zero,
                               a.zero_group,
                               a.recompute_set,
                               a.zero3_set,
                               a.selective_set};
            best_share = share;
          }
        };
        auto consider = [&](const StageAgg& rc, std::size_t zi) {  // true when it fits
          const StageAgg a = sharding.empty() ? rc
                                              : with_replicas(rc, sharding[zi].first, *sharding[zi].second,
                                                              rc.param_mem, ctx.opt_);
          const double mem = stage_memory(a, inflight);
          if (mem > usable) {
            if (why)
              *why = fmt::format("needs {}/device > {} usable{}{}", format_bytes(mem), format_bytes(usable),
                                 modes.size() > 1 || rc.recompute != Recompute::None
                                     ? fmt::format(" (recompute {})", recompute_name(rc.recompute))
                                     : std::string(),
                                 sharding.empty() ? std::string() : fmt::format(" (ZeRO-{})", a.zero));
            return false;
          }
          keep_if_faster(a, mem);
          return true;
        };
        auto consider_mixed = [&](const StageAgg& rc, int level, const std::vector<int>& set,
                                  const ReplicaLinks& links) {
          const StageAgg a = with_mixed_zero(rc, level, set, links, rc.param_mem, ctx.opt_);
          const double mem = stage_memory(a, inflight);
          if (mem > usable) return false;
          keep_if_faster(a, mem);
          return true;
        };
        bool fits_as_is = false;
        for (Recompute mode : modes) {
          const StageAgg rc = recomputed(plain, mode);
          bool fitted = false;
          for (std::size_t zi = 0; zi < options; ++zi) fitted = consider(rc, zi) || fitted;
          if (!fitted) continue;
          fits_as_is = fits_as_is || mode == Recompute::None;
          if (sharding.empty()) break;
        }
        // With recompute=auto, when every activation does not fit: a mode per block, along three
        // walks per ZeRO option, each adding time at every step (a block's forward is at least its
        // attention cores'), so the first assignment of a walk that fits is the walk's cheapest:
        //  - selective on some blocks (issue 37; a greedy heuristic): the blocks with attention
        //    cores in selective_order (the most peak bytes saved per second of re-made forward
        //    first), all but the last of them (all is the uniform mode tried above);
        //  - full on some blocks (issue 22), the others none: in recompute_order;
        //  - full on some blocks, selective on the others with cores: from selective on every one,
        //    full on blocks in recompute_order of what they keep there, up to all but one block.
        // A step whose F + B alone already loses to the best choice ends its walk (the replicas
        // only add time): the cheap selective walk first prunes the others.
        const int nb = static_cast<int>(plain.blk_act.size());
        if (ctx.opt_.recompute == Recompute::Auto && !fits_as_is && nb >= 2) {
          auto loses = [&](const StageAgg& rc) { return best && M * (rc.fwd + rc.bwd) >= best_share; };
          // One step of a walk: true when the walk ends (it fits, or it and the rest lose).
          auto step = [&](const StageAgg& rc, std::size_t zi) { return loses(rc) || consider(rc, zi); };
          const std::vector<int> sel = selective_order(plain, inflight);
          const std::vector<int> order = recompute_order(plain, inflight);
          StageAgg base = plain;  // selective on every block: what a full block then saves
          for (std::size_t i = 0; i < base.blk_act.size(); ++i) base.blk_act[i] -= base.blk_sel_mem[i];
          const std::vector<int> full_order = recompute_order(base, inflight);
          for (std::size_t zi = 0; zi < options; ++zi) {
            for (std::size_t k = 1; k < sel.size(); ++k)
              if (step(recomputed_per_block(plain, {}, std::vector<int>(sel.begin(), sel.begin() + k)), zi))
                break;
            for (int k = 1; k < nb; ++k)
              if (step(recomputed_blocks(plain, std::vector<int>(order.begin(), order.begin() + k)), zi))
                break;
            for (int k = 1; k < nb && !sel.empty(); ++k) {
              const std::vector<int> full(full_order.begin(), full_order.begin() + k);
              std::vector<int> rest;
              for (int b : sel)
                if (std::find(full.begin(), full.end(), b) == full.end()) rest.push_back(b);
              if (rest.empty()) break;  // full on some blocks alone: the walk above
              if (step(recomputed_per_block(plain, full, std::move(rest)), zi)) break;
            }
          }
        }
        // With zero=auto: ZeRO-3 on some blocks only, level 1 or 2 on the rest (per shard grouping,
        // per recomputation mode): the fewest blocks, most parameter bytes first, that fit —
        // between a level that does not fit and ZeRO-3 everywhere, which gathers every block.
        if (ctx.opt_.zero < 0 && nb >= 2)
          for (Recompute mode : modes) {
            const StageAgg rc = recomputed(plain, mode);
            const std::vector<int> order = zero3_order(rc);
            for (const auto& [level, links] : sharding) {
              if (level != 1 && level != 2) continue;
              for (int k = 1; k < nb; ++k) {
                const std::vector<int> set(order.begin(), order.begin() + k);
                if (consider_mixed(rc, level, set, *links)) break;
              }
            }
          }
        // The lean variant is worth its memory-limited search only if some layout could hold every
        // activation (the bound without recomputation fits); else it would recompute as well. With
        // ZeRO options across replicas, not when the fast variant fits under one of them: the lean
        // search shards the state inside the mesh against a budget that assumes it replicated across
        // the replicas, which ZeRO already relieves (GPT-3 175B on 128 nodes: 75 -> 32 s of planning).
        if (!fits_as_is && !(v == 0 && best && (!kept_may_fit || !sharding.empty()))) continue;
        if (fits_as_is) free_is_best = f == forced_dp && v == 0 && plain.between_blocks <= 0;
        break;  // the fast variant fits without recomputation: the lean one is not faster
      }
  }
  return best;
}

// The DP described at the top of planner.cpp over the devices of one replica (D = N / dp); returns
// the best candidate per stage count.
std::vector<std::optional<StageDpPath>> stage_dp(Context& ctx, const StageDpInput& in) {
  const int L = in.L, S_max = in.S_max, P = in.positions, Q = static_cast<int>(in.width.size());
  // Tables with j innermost (the DP's inner loop): the choice, its time (+∞ = no fit) and the
  // suffix minimum over j' >= j of the time (the inner loop stops once it exceeds t_max).
  auto ti = [&](int s, int k, int q, int j) {
    return ((static_cast<std::size_t>(s - 1) * L + k) * Q + static_cast<std::size_t>(q)) * L + j;
  };
  const std::size_t tsz = static_cast<std::size_t>(S_max) * L * Q * L;
  std::vector<const StageChoice*> table(tsz, nullptr);
  std::vector<double> time(tsz, kInf), suffix(tsz, kInf);
  std::vector<double> all_costs;
  const int pairs = L * (L + 1) / 2;
  int done = 0;
  // Every stage cost the DP can read: s − 1 more stages need s − 1 more blocks, and a stage that
  // does not fit with s in flight does not fit with more.
  for (int k = 0; k < L; ++k)
    for (int j = k; j < L; ++j, ++done) {
      ctx.progress("spmd", 0.05 + 0.6 * done / std::max(1, pairs),
                   fmt::format("{}: stage costs of blocks {}-{} ({} SPMD searches so far)", in.what, k, j,
                               ctx.spmd_solves));
      for (int q = 0; q < Q; ++q)
        for (int s = 1; s <= S_max && L - 1 - j >= s - 1; ++s) {
          const StageChoice* c = in.cost(s, k, j, q);
          if (!c) break;
          table[ti(s, k, q, j)] = c;
          time[ti(s, k, q, j)] = c->time;
          all_costs.push_back(c->time);
        }
    }
  for (int s = 1; s <= S_max; ++s)
    for (int k = 0; k < L; ++k)
      for (int q = 0; q < Q; ++q) {
        double run = kInf;
        for (int j = L - 1; j >= k; --j) suffix[ti(s, k, q, j)] = run = std::min(run, time[ti(s, k, q, j)]);
      }
  std::sort(all_costs.begin(), all_costs.end());
  all_costs.erase(std::unique(all_costs.begin(), all_costs.end()), all_costs.end());
  // Thin to a geometric grid (ratio 1.02) and at most 64 bounds: T within ~2% of the DP optimum.
  std::vector<double> bounds;
  for (double t : all_costs)
    if (bounds.empty() || t > bounds.back() * 1.02) bounds.push_back(t);
  if (!all_costs.empty() && bounds.back() != all_costs.back()) bounds.push_back(all_costs.back());
  if (bounds.size() > 64) {
    std::vector<double> thin;
    for (std::size_t i = 0; i < 64; ++i) thin.push_back(bounds[i * (bounds.size() - 1) / 63]);
    bounds = thin;
  }
  std::vector<std::optional<StageDpPath>> best(static_cast<std::size_t>(S_max) + 1);
  // G(s, k, pos) with k innermost: the inner loop reads G(s − 1, j + 1, next) for consecutive j.
  const std::size_t gsz = static_cast<std::size_t>(S_max + 1) * (P + 1) * (L + 1);
  auto gi = [&](int s, int k, int pos) {
    return (static_cast<std::size_t>(s) * (P + 1) + static_cast<std::size_t>(pos)) * (L + 1) + k;
  };
  std::vector<double> G(gsz);
  std::vector<int> cj(gsz), cq(gsz);
  for (double tmax : bounds) {
    double worst = 0;
    for (int s = 1; s <= S_max; ++s)
      worst = std::max(worst,
                       best[static_cast<std::size_t>(s)] ? best[static_cast<std::size_t>(s)]->proxy : kInf);
    if (in.M * tmax >= worst) break;  // no partition with this max can beat any stage count's best
    if (ctx.out_of_time() && (ctx.past_grace() || std::any_of(best.begin(), best.end(),
                                                              [](const auto& b) { return b.has_value(); })))
      break;  // the deadline: keep the partitions found so far
    std::fill(G.begin(), G.end(), kInf);
    for (int pos = in.end_anywhere ? 1 : P; pos <= P; ++pos) G[gi(0, L, pos)] = 0;
    for (int s = 1; s <= S_max; ++s)
      for (int pos = 0; pos < P; ++pos)
        for (int k = L - 1; k >= 0; --k) {
          double bv = kInf;
          int bj = -1, bq = -1;
          for (int q : in.options_at[static_cast<std::size_t>(pos)]) {
            const int next = pos + in.width[static_cast<std::size_t>(q)];
            if (next > P) continue;
            const std::size_t row = ti(s, k, q, 0);
            const double* rest = &G[gi(s - 1, 0, next)];
            for (int j = k; j < L; ++j) {
              if (suffix[row + static_cast<std::size_t>(j)] > tmax) break;
              const double t = time[row + static_cast<std::size_t>(j)];
              if (t > tmax) continue;
              const double v = t + rest[j + 1];
              if (v < bv) bv = v, bj = j, bq = q;
            }
          }
          G[gi(s, k, pos)] = bv;
          cj[gi(s, k, pos)] = bj;
          cq[gi(s, k, pos)] = bq;
        }
    for (int s = 1; s <= S_max; ++s) {
      const double sum = G[gi(s, 0, 0)];
      if (sum == kInf) continue;
      const double T = sum + (in.M - 1) * tmax;
      auto& b = best[static_cast<std::size_t>(s)];
      if (b && T >= b->proxy) continue;
      StageDpPath path;
      path.proxy = T;
      for (int k = 0, pos = 0, ss = s; ss > 0; --ss) {
        const int j = cj[gi(ss, k, pos)], q = cq[gi(ss, k, pos)];
        path.stages.push_back({k, j, q, table[ti(ss, k, q, j)]});
        pos += in.width[static_cast<std::size_t>(q)];
        k = j + 1;
      }
      b = std::move(path);
    }
  }
  return best;
}

double pipeline_proxy(const std::vector<StageChoice>& stages, int M) {
  double sum = 0, mx = 0;
  for (const auto& st : stages) sum += st.time, mx = std::max(mx, st.time);
  return sum + (M - 1) * mx;
}

Candidate candidate_of(const StageDpPath& path, std::string strategy, int M, int dp, std::int64_t bs) {
  Candidate cand;
  cand.strategy = std::move(strategy);
  cand.M = M;
  cand.dp = dp;
  cand.bs = bs;
  cand.proxy = path.proxy;
  for (const auto& st : path.stages) cand.stages.push_back(*st.choice);
  return cand;
}

// Every block's SPMD search that the stage DPs of make_plan will read (the fast variant with free
// block boundaries, on each logical mesh of each submesh a replica can hold, at each micro-batch
// size), run on every core before the DPs ask for them one by one.
void prefetch_stage_costs(Context& ctx, const std::vector<SubmeshOptions>& subs,
                          const std::vector<ReplicaConfig>& configs) {
  const auto& o = ctx.opt_;
  std::vector<Context::BlockRequest> reqs;
  for (const auto [M, d] : configs) {
    const int D = ctx.c_.num_devices() / d;
    const std::int64_t bs = ctx.global_batch / (static_cast<std::int64_t>(M) * d);
    for (const auto& sub : subs) {
      const int n = sub.shape.num_devices();
      if (n > D || (!o.pipeline && n != D)) continue;
      for (const auto& mesh : sub.meshes)
        for (int b = 0; b < ctx.L(); ++b) reqs.push_back({b, bs, &mesh, 0, 0});
    }
  }
  ctx.progress("spmd", 0.05,
               fmt::format("SPMD searches of {} blocks on {} thread(s)", ctx.L(), ctx.num_threads()));
  ctx.prefetch_block_costs(reqs);
}

// The stage DP's best partition per stage count of one (M, dp). relaxed: a lower bound instead —
// every stage priced at the sum of its blocks' unconstrained layouts (the prefetched fast variant
// with free boundaries, no resharding between blocks, the best logical mesh) and memory checked
// only by the state + activation bound; no SPMD search beyond the prefetched ones runs.
std::vector<Candidate> partition_candidates(Context& ctx, const std::vector<SubmeshOptions>& subs, int M,
                                            int dp, bool relaxed) {
  const int L = ctx.L();
  const int D = ctx.c_.num_devices() / dp;
  const std::int64_t bs = ctx.global_batch / (static_cast<std::int64_t>(M) * dp);
  std::vector<int> usable_subs;
  for (int m = 0; m < static_cast<int>(subs.size()); ++m)
    if (subs[m].shape.num_devices() <= D) usable_subs.push_back(m);
  if (usable_subs.empty()) return {};
  int unit = 0;
  for (int m : usable_subs) unit = std::gcd(unit, subs[m].shape.num_devices());
  if (D % unit) return {};
  int S_max = std::min(L, D / subs[usable_subs.front()].shape.num_devices());
  if (ctx.opt_.max_stages > 0) S_max = std::min(S_max, ctx.opt_.max_stages);
  if (!ctx.opt_.pipeline) S_max = 1;
  S_max = std::max(S_max, 1);
  // Positions are device units used so far; any submesh fits at any position (the placement is
  // made afterwards by pipeline::replicate_pipeline), so every option is open everywhere.
  StageDpInput in;
  in.L = L;
  in.S_max = S_max;
  in.positions = D / unit;
  in.M = M;
  const int NS = static_cast<int>(subs.size());
  for (int m = 0; m < NS; ++m) in.width.push_back(subs[m].shape.num_devices() / unit);
  in.options_at.assign(static_cast<std::size_t>(in.positions), usable_subs);
  in.what = fmt::format("{}M={} dp={}", relaxed ? "bound " : "", M, dp);
  std::map<std::tuple<int, int, int, int>, std::optional<StageChoice>> memo;  // (k, j, m, in-flight)
  // The relaxed stage: Σ over its blocks of the fast variant's F + B on the best logical mesh, plus
  // the recomputation the memory bound forces (the cheapest allowed mode whose bound fits), at the
  // device's best speed over all its devices — no layout recomputes faster.
  auto relaxed_stage = [&](int k, int j, int m, int inf) -> std::optional<StageChoice> {
    const auto& meshes = subs[m].meshes;
    if (meshes.empty()) return std::nullopt;
    const auto& ab = ctx.blocks_at(bs);
    const double n = static_cast<double>(meshes[0].mesh.size()), usable = ctx.usable(meshes[0].mesh);
    auto need = [&](const std::vector<double>& act) {
      double b = 0;
      for (int x = k; x <= j; ++x) b += ctx.state_bound(x, dp) + inf * act[static_cast<std::size_t>(x)];
      return b;
    };
    std::optional<double> extra_flops;
    for (Recompute mode : recompute_modes(ctx.opt_.recompute)) {
      const auto& act = mode == Recompute::Full        ? ab.act_bytes_ckpt
                        : mode == Recompute::Selective ? ab.act_bytes_sel
                                                       : ab.act_bytes_kept;
      if (need(act) / n > usable) continue;
      double f = 0;
      for (int x = k; x <= j && mode != Recompute::None; ++x)
        f += (mode == Recompute::Full ? ab.fwd_flops : ab.sel_flops)[static_cast<std::size_t>(x)];
      extra_flops = f;
      break;
    }
    if (!extra_flops) return std::nullopt;
    const auto& spec = ctx.mesh_spec(meshes[0].mesh);
    const double extra = *extra_flops / (n * peak_or_f32(spec, ctx.dtype_) * spec.matmul(ctx.dtype_).ceiling);
    std::optional<StageChoice> best;
    for (int mi = 0; mi < static_cast<int>(meshes.size()); ++mi) {
      double t = extra;
      bool ok = true;
      for (int b = k; b <= j && ok; ++b) {
        const BlockCost& bc = ctx.block_cost(b, bs, meshes[mi], 0, 0);
        ok = bc.ok;
        t += bc.fwd + bc.bwd;
      }
      if (ok && (!best || t < best->time)) best = StageChoice{k, j, m, mi, 0, 0, t, need(ab.act_bytes)};
    }
    return best;
  };
  in.cost = [&](int s, int k, int j, int m) -> const StageChoice* {
    if (S_max == 1 && (subs[m].shape.num_devices() != D || k != 0 || j != L - 1)) return nullptr;
    if (std::find(usable_subs.begin(), usable_subs.end(), m) == usable_subs.end()) return nullptr;
    const int inf = in_flight(ctx.opt_.schedule, s, M, ctx.opt_.schedule_k);
    auto it = memo.find({k, j, m, inf});
    if (it == memo.end())
      it = memo.emplace(std::make_tuple(k, j, m, inf),
                        relaxed ? relaxed_stage(k, j, m, inf)
                                : best_stage(ctx, subs[m].meshes, k, j, m, bs, M, inf, 0, nullptr, dp))
               .first;
    return it->second ? &*it->second : nullptr;
  };
  std::vector<Candidate> out;
  const auto paths = stage_dp(ctx, in);
  for (int s = 1; s <= S_max; ++s)
    if (paths[static_cast<std::size_t>(s)])
      out.push_back(candidate_of(*paths[static_cast<std::size_t>(s)],
                                 s == 1 ? (dp == 1 ? "spmd" : "spmd x data parallel") : "pipeline", M, dp,
                                 bs));
  return out;
}

// Contiguous split of blocks into p groups minimising the max group FLOPs (exact DP).
std::vector<std::pair<int, int>> balanced_split(const pipeline::LayerGrouping& gr, int p) {
  const int L = static_cast<int>(gr.blocks.size());
  std::vector<double> pre(L + 1, 0);
  for (int b = 0; b < L; ++b) pre[b + 1] = pre[b] + gr.blocks[b].compute_flops();
  std::vector<std::vector<double>> F(p + 1, std::vector<double>(L + 1, kInf));
  std::vector<std::vector<int>> arg(p + 1, std::vector<int>(L + 1, -1));
  F[0][0] = 0;
  for (int s = 1; s <= p; ++s)
    for (int e = s; e <= L; ++e)
      for (int b = s - 1; b < e; ++b) {
        const double v = std::max(F[s - 1][b], pre[e] - pre[b]);
        if (v < F[s][e]) F[s][e] = v, arg[s][e] = b;
      }
  std::vector<std::pair<int, int>> out(p);
  int e = L;
  for (int s = p; s >= 1; --s) {
    const int b = arg[s][e];
    out[s - 1] = {b, e - 1};
    e = b;
  }
  return out;
}

std::vector<std::vector<int>> ilp_block_orders(Context& ctx, int max_stages) {
  const int L = ctx.L();
  if (L < 3) return {};
  // The DAG of the blocks: compute = the block's forward + backward FLOPs, values = forward
  // activations made in one block and read in others.
  const pipeline::PartitionDag ops = pipeline::dag_from_graph(ctx.g_);
  pipeline::PartitionDag dag;
  for (const auto& b : ctx.grouping.blocks) dag.compute.push_back(b.compute_flops());
  bool chain = true;
  for (const auto& v : ops.values) {
    const int a = ctx.grouping.block_of_op[ops.op_of_node[static_cast<std::size_t>(v.producer)]];
    std::vector<int> cons;
    for (int c : v.consumers) {
      const int b = ctx.grouping.block_of_op[ops.op_of_node[static_cast<std::size_t>(c)]];
      if (b != a && std::find(cons.begin(), cons.end(), b) == cons.end()) cons.push_back(b);
    }
    if (a < 0 || cons.empty()) continue;
    for (int b : cons) chain = chain && b == a + 1;
    dag.values.push_back({a, cons, v.bytes});
  }
  if (chain) return {};  // every contiguous cut is already in the DP's space
  std::vector<std::vector<int>> out;
  for (int S = 2; S <= std::min(L, max_stages); ++S) {
    // The tightest balance tolerance that has a solution (coarse blocks rarely balance within 10%).
    pipeline::IlpPartition part;
    for (double eps : {0.1, 0.25, 0.5}) {
      pipeline::IlpPartitionOptions io;
      io.num_stages = S;
      io.epsilon = eps;
      io.time_limit_s = std::min(5.0, ctx.opt_.spmd_time_limit_s * 2);
      try {
        part = pipeline::partition_dag_ilp(dag, io);
      } catch (const Error&) {
        continue;  // the bounds show no ε-balanced partition with S stages exists
      }
      if (part.has_solution()) break;
    }
    if (!part.has_solution()) continue;
    std::vector<int> order(static_cast<std::size_t>(L));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int x, int y) {
      return part.stage_of_node[static_cast<std::size_t>(x)] <
             part.stage_of_node[static_cast<std::size_t>(y)];
    });
    bool identity = true;
    for (int i = 0; i < L; ++i) identity = identity && order[static_cast<std::size_t>(i)] == i;
    if (!identity && std::find(out.begin(), out.end(), order) == out.end()) out.push_back(order);
  }
  return out;
}

}  // namespace weft::plan::detail
