// The planner on heterogeneous clusters (nodes of different GPU kinds): Whale's hardware-aware
// load balancing (§3.3) on the planner's own cost model (SPMD block costs, the schedule simulator,
// the resharding planner), so that a mixed cluster gets the same kind of Plan as a homogeneous one.
//
// Three plan families compete, each with its even-split counterpart as the baseline:
//
// 1. Data parallel with uneven batch shares (Whale's `replicate` TaskGraph). Every device runs the
//    whole training step on u_i samples of each of the M micro-batches, Σ u_i = T = B / M. Per
//    device kind K the planner's cost of one micro-batch on one device (the SPMD search on a 1-device
//    mesh, i.e. the roofline of every op) is read at two batch sizes and taken as affine,
//        t_K(u) = a_K + c_K·u,     memory_K(u) = s_K + r_K·u,
//    and the shares come from pipeline::try_balance_load (Algorithm 1, corrected: the min-max
//    optimum of max_i t_i(u_i) over integer shares that fit, memory as static + load × activations).
//    Every share is then costed exactly (the graph rebatched to u_i) and the plan is checked per
//    device against that device's own memory. Step = max_i (M·t_i(u_i) + optimizer_i) (a replica
//    updates right after the all-reduce and starts its next forward, so the replicas meet only at
//    the all-reduce, which waits for the replica with the longest period) + the exposed part of
//    the all-reduce over all devices (α-β, overlapped with that replica's last backward:
//    PlanOptions::overlap_grad_sync) — the homogeneous planner's data-parallel rule.
//
// 2. Pipelines over the nodes grouped by kind: Whale's memory-descending order first (in 1F1B
//    stage s of S holds min(M, S − s) micro-batches' activations, so the early stages go to the
//    big GPUs), then every other order of the kinds (the heuristic is not always best: a small
//    first stage, e.g. the embedding alone, can be better on the small GPU). A stage occupies the
//    devices [pos, pos + n) of the order: a power-of-two slice of one node, or whole nodes of one
//    kind. The planner's stage DP (stage_dp) with the device offset as state:
//        G(s, k, pos) = min_{j >= k, placement (pos, n)} t(k, j, pos, n; in_flight(s))
//                       + G(s − 1, j + 1, pos + n),        G(0, L, pos) = 0 for every pos >= 1,
//    for every bound t_max on the stage time. The stage cost t(k, j, pos, n) is the SPMD search on
//    that placement's own devices (cached by block structure, mesh links and device kind, so
//    equal placements are solved once), so faster GPUs take more blocks and memory is checked
//    against each stage's own devices. Trailing devices may stay idle (a slow GPU can be worth
//    leaving out). The even split (equal-FLOP blocks on equal device counts, Whale's order) is
//    the baseline. PlanOptions::pipeline = false keeps only families 1 and 3 (whole-cluster plans,
//    as on a homogeneous cluster); max_data_parallel below the device count drops family 1.
//
// 3. Whale's `split` (uneven_split.cpp): the whole graph as one SPMD stage over every device, each
//    split factor cut in proportion to what each device can do, against the even split.
//
// Not covered (see docs/modules/plan.md): split stages inside a pipeline, per-op fractions, and
// replicated pipelines on mixed kinds.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "planner_detail.hpp"
#include "weft/core/units.hpp"
#include "weft/pipeline/hetero.hpp"
#include "weft/sim/simulator.hpp"

namespace weft::plan::detail {

namespace {

// ---------------------------------------------------------------- data parallel, uneven shares

struct ReplicaCost {
  bool ok = false;
  std::string error;
  double fb = 0;      // forward + backward of one micro-batch
  double upd = 0;     // optimizer step, once per step
  double memory = 0;  // static + one micro-batch's activations + transient
};

class ReplicaModel {
 public:
  explicit ReplicaModel(Context& ctx) : ctx_(ctx) {
    for (const auto& d : ctx.c_.devices()) {
      if (one_device_.count(d.spec.kind)) continue;
      cluster::DeviceMesh mesh({1}, {d.id});
      one_device_.emplace(d.spec.kind,
                          MeshOption{pipeline::SubmeshShape(1, 1), {1}, mesh, ctx.mesh_key(mesh)});
    }
  }

  const MeshOption& mesh_of(const std::string& kind) const { return one_device_.at(kind); }

  // One device of `kind` running u samples per micro-batch (u = 0: it only holds the state).
  const ReplicaCost& cost(const std::string& kind, std::int64_t u) {
    const auto key = std::make_pair(kind, u);
    auto it = memo_.find(key);
    if (it != memo_.end()) return it->second;
    ReplicaCost rc;
    // A graph that cannot be cut to u samples (a batch-sized Constant pins its batch): no cost,
    // the reason instead (plan::rebatch_obstacle names what pins it).
    if (const auto& why = ctx_.rebatch_note(std::max<std::int64_t>(u, 1)); !why.empty()) {
      rc.error = fmt::format("the graph cannot run {} samples per micro-batch (the batch is {}): {}",
                             std::max<std::int64_t>(u, 1), ctx_.global_batch, why);
      return memo_.emplace(key, std::move(rc)).first->second;
    }
    const StageAgg a = aggregate(ctx_, 0, ctx_.L() - 1, std::max<std::int64_t>(u, 1), mesh_of(kind), 0, 0);
    if (!a.ok) {
      rc.error = a.error;
    } else {
      rc.ok = true;
      rc.fb = u > 0 ? a.fwd + a.bwd : 0.0;
      rc.upd = a.upd;
      rc.memory = u > 0 ? stage_memory(a, 1) : a.static_mem;
    }
    return memo_.emplace(key, std::move(rc)).first->second;
  }

 private:
  Context& ctx_;
  std::map<std::string, MeshOption> one_device_;
  std::map<std::pair<std::string, std::int64_t>, ReplicaCost> memo_;
};

// Balanced shares of T samples per micro-batch (Algorithm 1 on the affine per-kind model).
// A replica's period is M·t(u) + its optimizer step (it updates right after the all-reduce and
// starts the next forward; the replicas meet only at the all-reduce), so the optimizer is fixed
// work spread over the M micro-batches: a kind with a slower optimizer takes fewer samples.
pipeline::HeteroShares balanced_shares(Context& ctx, ReplicaModel& rm, int M, std::int64_t T) {
  const auto& c = ctx.c_;
  const int N = c.num_devices();
  const std::int64_t lo = std::max<std::int64_t>(1, T / N);
  const std::int64_t hi = std::max<std::int64_t>(lo + 1, std::min<std::int64_t>(T, 2 * T / N + 1));
  std::vector<pipeline::DeviceCapacity> caps;
  std::vector<pipeline::LoadModel> loads;
  for (const auto& d : c.devices()) {
    const ReplicaCost& a = rm.cost(d.spec.kind, lo);
    const ReplicaCost& b = rm.cost(d.spec.kind, hi);
    pipeline::HeteroShares bad;
    if (!a.ok || !b.ok) {
      bad.feasible = false;
      bad.message = fmt::format("{}: {}", d.spec.kind, a.ok ? b.error : a.error);
      return bad;
    }
    const double span = static_cast<double>(hi - lo);
    // Seconds per sample and fixed seconds (the balancer's "FLOPs" with a device speed of 1).
    const double slope = std::max((b.fb - a.fb) / span, 1e-15);
    const double fixed = std::max(0.0, a.fb - slope * static_cast<double>(lo)) + a.upd / M;
    const double per = std::max(0.0, (b.memory - a.memory) / span);
    const double stat = std::max(0.0, a.memory - per * static_cast<double>(lo));
    caps.emplace_back(1.0, ctx.usable_of_device(d.id), fmt::format("{}#{}", d.spec.kind, d.id));
    loads.emplace_back(slope, stat, per, fixed);
  }
  return pipeline::try_balance_load(caps, loads, T);
}

// The plan of given shares (samples per micro-batch per device, device id order).
Built data_parallel_build(Context& ctx, ReplicaModel& rm, int M, const std::vector<std::int64_t>& shares,
                          const std::string& strategy) {
  const auto& c = ctx.c_;
  const int N = c.num_devices();
  Built out;
  out.plan.strategy = strategy;
  // The critical replica: the largest period M·(F + B) + optimizer (see balanced_shares).
  int crit = 0;
  double crit_period = -1;
  std::vector<double> mem(static_cast<std::size_t>(N));
  std::string over;
  for (int i = 0; i < N; ++i) {
    const ReplicaCost& rc = rm.cost(c.device(i).spec.kind, shares[static_cast<std::size_t>(i)]);
    if (!rc.ok) {
      out.note = fmt::format("device {}: {}", i, rc.error);
      return out;
    }
    const double period = M * rc.fb + rc.upd;
    if (period > crit_period) {
      crit = i;
      crit_period = period;
    }
    mem[static_cast<std::size_t>(i)] = rc.memory;
    if (over.empty() && rc.memory > ctx.usable_of_device(i) * (1 + 1e-9))
      over = fmt::format("device {} ({} samples per micro-batch): {} > {} usable", i,
                         shares[static_cast<std::size_t>(i)], format_bytes(rc.memory),
                         format_bytes(ctx.usable_of_device(i)));
  }
  const std::string& kind = c.device(crit).spec.kind;
  const std::int64_t u = std::max<std::int64_t>(1, shares[static_cast<std::size_t>(crit)]);
  const ReplicaCost& rc = rm.cost(kind, u);
  // One stage replicated on every device; its times are those of the slowest replica.
  Candidate cand;
  cand.strategy = strategy;
  cand.M = M;
  cand.dp = N;
  cand.bs = u;
  StageChoice sc;
  sc.first = 0;
  sc.last = ctx.L() - 1;
  sc.time = rc.fb;
  sc.memory = rc.memory;
  cand.stages.push_back(sc);
  std::vector<int> ids(static_cast<std::size_t>(N));
  std::iota(ids.begin(), ids.end(), 0);
  cand.devices.push_back(ids);
  cand.meshes.push_back(rm.mesh_of(kind));
  out = materialise(ctx, {}, cand, reshard::Balancer::LargestFirst);
  Plan& p = out.plan;
  p.strategy = strategy;
  p.replica_microbatch = shares;
  p.microbatch_size = *std::max_element(shares.begin(), shares.end());
  p.device_memory = mem;
  p.peak_memory = *std::max_element(mem.begin(), mem.end());
  p.stages[0].peak_memory = p.peak_memory;
  const sim::SimResult r = resimulate(p);
  p.step_time = r.step_time;
  p.bubble_fraction = r.bubble_fraction;
  p.throughput = p.step_time > 0 ? static_cast<double>(p.global_batch()) / p.step_time : 0;
  p.mfu = p.step_time > 0 ? p.model_flops / (p.step_time * p.cluster_peak_flops) : 0;
  out.feasible = over.empty();
  out.note = over;
  return out;
}

// ---------------------------------------------------------------- pipelines in memory order

struct Placement {
  int pos = 0, n = 0;
  std::vector<int> ids;
  std::vector<MeshOption> meshes;
  int cls = 0;  // interned mesh keys: placements with equal costs share it
};

// Nodes by memory (descending), then peak FLOP/s (descending), then index: Whale's device order.
std::vector<int> memory_descending_nodes(const cluster::Cluster& c, DType dt) {
  std::vector<pipeline::DeviceCapacity> caps;
  for (const auto& nd : c.nodes()) {
    const auto& spec = nd.device;
    const double f = peak_or_f32(spec, dt);
    caps.emplace_back(f, spec.memory_bytes, nd.name);
  }
  return pipeline::memory_descending_order(caps);
}

// Node orders for pipelines: the nodes grouped by kind (node spec) in the order of `first`, then
// every permutation of the kind groups (at most 4 kinds: 24 orders), `first`'s grouping first.
std::vector<std::vector<int>> node_orders(const cluster::Cluster& c, const std::vector<int>& first) {
  std::vector<std::vector<int>> groups;
  for (int nd : first) {
    auto it = std::find_if(groups.begin(), groups.end(), [&](const std::vector<int>& gr) {
      return c.nodes()[static_cast<std::size_t>(gr.front())] == c.nodes()[static_cast<std::size_t>(nd)];
    });
    if (it == groups.end())
      groups.push_back({nd});
    else
      it->push_back(nd);
  }
  std::vector<int> perm(groups.size());
  std::iota(perm.begin(), perm.end(), 0);
  std::vector<std::vector<int>> out;
  do {
    std::vector<int> order;
    for (int gi : perm)
      order.insert(order.end(), groups[static_cast<std::size_t>(gi)].begin(),
                   groups[static_cast<std::size_t>(gi)].end());
    out.push_back(std::move(order));
  } while (groups.size() <= 4 && std::next_permutation(perm.begin(), perm.end()));
  return out;
}

std::vector<std::vector<Placement>> placements(Context& ctx, const std::vector<int>& node_order) {
  const auto& c = ctx.c_;
  const auto& o = ctx.opt_;
  std::vector<int> order, node_at;  // device ids in order; index into node_order per position
  for (int k = 0; k < static_cast<int>(node_order.size()); ++k)
    for (int d : c.devices_of_node(node_order[static_cast<std::size_t>(k)])) {
      order.push_back(d);
      node_at.push_back(k);
    }
  const int N = static_cast<int>(order.size());
  std::vector<std::vector<Placement>> at(static_cast<std::size_t>(N));
  std::vector<int> node_first(node_order.size(), 0);
  for (int pos = N - 1; pos >= 0; --pos) node_first[static_cast<std::size_t>(node_at[pos])] = pos;
  auto add = [&](int pos, const pipeline::SubmeshShape& shape) {
    Placement pl;
    pl.pos = pos;
    pl.n = shape.num_devices();
    pl.ids.assign(order.begin() + pos, order.begin() + pos + pl.n);
    pl.meshes = meshes_on(ctx, shape, pl.ids);
    if (pl.meshes.empty()) return;
    std::string key;
    for (const auto& m : pl.meshes) key += fmt::format("{},", m.key);
    pl.cls = ctx.intern("placement|" + key);
    at[static_cast<std::size_t>(pos)].push_back(std::move(pl));
  };
  for (int pos = 0; pos < N; ++pos) {
    const int k = node_at[pos];
    const auto& node = c.nodes()[static_cast<std::size_t>(node_order[static_cast<std::size_t>(k)])];
    const int G = node.num_devices;
    const int off = pos - node_first[static_cast<std::size_t>(k)];
    if (!o.whole_nodes_only)
      for (int n = 1; n < G; n *= 2)
        if (off % n == 0 && off + n <= G) add(pos, pipeline::SubmeshShape(1, n));
    if (off != 0) continue;
    for (int run = 1; k + run <= static_cast<int>(node_order.size()); ++run) {
      const auto& last =
          c.nodes()[static_cast<std::size_t>(node_order[static_cast<std::size_t>(k + run - 1)])];
      if (!(last.device == node.device && last.num_devices == G && last.intra == node.intra &&
            last.nic == node.nic))
        break;
      if (o.power_of_two_nodes && (run & (run - 1)) != 0) continue;
      add(pos, pipeline::SubmeshShape(run, G));
    }
  }
  return at;
}

// Candidates of one device order: the DP's best per stage count, plus (with `even_baseline`) the
// even split.
std::vector<Candidate> pipeline_candidates(Context& ctx, const std::vector<std::vector<Placement>>& at, int M,
                                           const std::string& name, bool even_baseline) {
  const int L = ctx.L();
  const int N = static_cast<int>(at.size());
  const std::int64_t bs = ctx.global_batch / M;
  const auto& o = ctx.opt_;
  int S_max = std::min(L, N);
  if (o.max_stages > 0) S_max = std::min(S_max, o.max_stages);
  // pipeline = false: plans on the whole cluster only, as on a homogeneous one (data parallelism).
  if (!o.pipeline) return {};
  // Stage costs per (first, last, placement class, in-flight), every one that can occur.
  std::map<std::tuple<int, int, int, int>, std::optional<StageChoice>> memo;
  auto stage = [&](int k, int j, const Placement& pl, int s) -> const std::optional<StageChoice>& {
    const int inf = in_flight(o.schedule, s, M, o.schedule_k);
    const auto key = std::make_tuple(k, j, pl.cls, inf);
    auto it = memo.find(key);
    if (it == memo.end()) it = memo.emplace(key, best_stage(ctx, pl.meshes, k, j, 0, bs, M, inf)).first;
    return it->second;
  };
  // Every placement once; option q = the q-th placement, open at its own position only.
  std::vector<const Placement*> pls;
  for (const auto& list : at)
    for (const auto& pl : list) pls.push_back(&pl);
  const int Q = static_cast<int>(pls.size());
  StageDpInput in;
  in.L = L;
  in.S_max = S_max;
  in.positions = N;
  in.M = M;
  in.end_anywhere = true;
  in.options_at.resize(static_cast<std::size_t>(N));
  for (int q = 0; q < Q; ++q) {
    in.width.push_back(pls[static_cast<std::size_t>(q)]->n);
    in.options_at[static_cast<std::size_t>(pls[static_cast<std::size_t>(q)]->pos)].push_back(q);
  }
  in.what = fmt::format("M={} on mixed devices", M);
  in.cost = [&](int s, int k, int j, int q) -> const StageChoice* {
    const auto& c = stage(k, j, *pls[static_cast<std::size_t>(q)], s);
    return c ? &*c : nullptr;
  };
  std::vector<Candidate> out;
  const auto paths = stage_dp(ctx, in);
  for (int s = 1; s <= S_max; ++s) {
    const auto& path = paths[static_cast<std::size_t>(s)];
    if (!path) continue;
    Candidate cand = candidate_of(*path, s == 1 ? "spmd (one kind)" : name, M, 1, bs);
    for (const auto& st : path->stages) {
      const Placement& pl = *pls[static_cast<std::size_t>(st.option)];
      cand.devices.push_back(pl.ids);
      cand.meshes.push_back(pl.meshes[static_cast<std::size_t>(st.choice->mesh)]);
    }
    out.push_back(std::move(cand));
  }
  // The even split (Whale's baseline): p stages of n devices each, equal-FLOP blocks, same order.
  for (int n = 1; n < N && even_baseline && o.pipeline; ++n) {
    if (N % n) continue;
    const int p = N / n;
    if (p < 2 || p > L || (o.max_stages > 0 && p > o.max_stages)) continue;
    const auto split = balanced_split(ctx.grouping, p);
    Candidate cand;
    cand.strategy = "pipeline (even split)";
    cand.M = M;
    cand.dp = 1;
    cand.bs = bs;
    bool ok = true;
    for (int s = 0; s < p && ok; ++s) {
      const auto& list = at[static_cast<std::size_t>(s * n)];
      auto pl = std::find_if(list.begin(), list.end(), [&](const Placement& x) { return x.n == n; });
      if (pl == list.end()) {
        ok = false;
        break;
      }
      const auto& c = stage(split[static_cast<std::size_t>(s)].first,
                            split[static_cast<std::size_t>(s)].second, *pl, p - s);
      if (!c) {
        ok = false;
        break;
      }
      cand.stages.push_back(*c);
      cand.devices.push_back(pl->ids);
      cand.meshes.push_back(pl->meshes[static_cast<std::size_t>(c->mesh)]);
    }
    if (!ok) continue;
    cand.proxy = pipeline_proxy(cand.stages, M);
    out.push_back(std::move(cand));
  }
  return out;
}

// The search space of make_hetero_plan, for Plan::search_space: the families and micro-batch counts
// searched, and what the graph's batch left out (sizes it cannot be cut to: shares, micro-batches).
std::string hetero_search_space_text(const Context& ctx, const std::vector<int>& Ms, bool dp,
                                     std::size_t orders) {
  const auto& o = ctx.opt_;
  std::string s = fmt::format("mixed cluster of {} devices; micro-batch counts {}", ctx.c_.num_devices(),
                              fmt::join(Ms, ","));
  s += dp ? "; data parallel: uneven shares (Algorithm 1) and even shares"
          : "; data parallel: off (max_data_parallel)";
  s += o.uneven_split && ctx.c_.num_devices() >= 2 ? "; Whale's split: uneven and even"
                                                   : "; Whale's split: off";
  s += o.pipeline ? fmt::format("; pipelines over {} device-kind orders", orders) : "; pipelines: off";
  const auto [sizes, why] = batch_sizes_left_out(ctx);
  if (!sizes.empty())
    s += fmt::format(
        "; {} samples per micro-batch or replica left out (shares, micro-batches and their plans: the batch "
        "{} "
        "cannot be cut that way): {}",
        fmt::join(sizes, ", "), ctx.global_batch, why);
  return s;
}

}  // namespace

Plan make_hetero_plan(Context& ctx) {
  const auto& c = ctx.c_;
  const auto& o = ctx.opt_;
  const std::int64_t B = ctx.global_batch;
  std::vector<Alternative> alts;
  std::optional<Built> best;
  std::optional<Candidate> best_cand;
  auto consider = [&](Built b, const Candidate* cand) {
    alts.push_back(alternative_of(b));
    if (b.feasible && (!best || b.plan.step_time < best->plan.step_time)) {
      best = std::move(b);
      if (cand)
        best_cand = *cand;
      else
        best_cand.reset();
    }
  };
  // An infeasible alternative that has no plan to cost (no shares fit). Algorithm 1's message
  // lists every device: the note is kept to one line.
  auto not_costed = [&](const std::string& strategy, std::string layout, const std::string& why) {
    Alternative a;
    a.strategy = strategy;
    a.layout = std::move(layout);
    a.feasible = false;
    a.note = why.size() > 240 ? why.substr(0, 240) + "..." : why;
    alts.push_back(std::move(a));
  };
  // Micro-batch counts the graph can be cut into (a batch-sized Constant pins the batch: M = 1
  // only); the others are left out and the search space says why.
  std::vector<int> Ms;
  for (int M : microbatch_counts(o, B))
    if (ctx.rebatch_note(B / M).empty()) Ms.push_back(M);
  if (Ms.empty()) {
    const auto all = microbatch_counts(o, B);
    fail("make_plan: the batch {} cannot be split into {} micro-batches: {}", B, fmt::join(all, " or "),
         ctx.rebatch_note(B / all.front()));
  }
  // 1. Data parallel: uneven (Algorithm 1) and even shares; a share the graph cannot be cut to
  //    leaves its plan out, with the reason (ReplicaModel::cost).
  ReplicaModel rm(ctx);
  const bool dp_allowed = o.max_data_parallel == 0 || o.max_data_parallel >= c.num_devices();
  for (int M : Ms) {
    if (!dp_allowed) break;
    ctx.progress("spmd", 0.02, fmt::format("M={}: data-parallel shares over {} devices", M, c.num_devices()));
    if (ctx.out_of_time() && (best || ctx.past_grace())) break;
    const std::int64_t T = B / M;
    const pipeline::HeteroShares s = balanced_shares(ctx, rm, M, T);
    if (s.feasible) {
      consider(data_parallel_build(ctx, rm, M, s.units, "data parallel (uneven shares)"), nullptr);
    } else {
      not_costed("data parallel (uneven shares)", fmt::format("M={} dp={}", M, c.num_devices()), s.message);
    }
    consider(data_parallel_build(ctx, rm, M, pipeline::even_units(T, c.num_devices()),
                                 "data parallel (even shares)"),
             nullptr);
  }
  // 3. Whale's split: the whole graph as one SPMD stage over every device, each split factor cut
  //    in proportion to what each device can do (uneven_split.cpp), against its even counterpart.
  if (o.uneven_split && c.num_devices() >= 2) {
    const MeshOption whole = whole_cluster_mesh(ctx);
    for (int M : Ms) {
      ctx.progress("spmd", 0.3, fmt::format("M={}: uneven split over {} devices", M, c.num_devices()));
      if (ctx.out_of_time() && (best || ctx.past_grace())) break;
      Built u = split_build(ctx, whole, M, {}, "spmd (uneven split)");
      if (u.plan.stages.empty()) {  // no fractions fit: nothing was costed
        not_costed("spmd (uneven split)", fmt::format("M={} split over {}", M, c.num_devices()), u.note);
      } else {
        consider(std::move(u), nullptr);
      }
      consider(split_build(ctx, whole, M, std::vector<double>(static_cast<std::size_t>(c.num_devices()), 1.0),
                           "spmd (even split)"),
               nullptr);
    }
  }
  // 2. Pipelines over the memory-descending device order.
  // Whale's order first, then every other order of the node kinds (a small first stage, such as
  // the embedding alone, can be better on the small GPU: the memory rule is a heuristic).
  std::vector<Candidate> cands;
  const auto orders = node_orders(c, memory_descending_nodes(c, DType::F32));
  for (std::size_t oi = 0; oi < orders.size(); ++oi) {
    const auto at = placements(ctx, orders[oi]);
    for (int M : Ms) {
      auto cs = pipeline_candidates(
          ctx, at, M, oi == 0 ? "pipeline (memory-descending)" : "pipeline (other kind order)", oi == 0);
      cands.insert(cands.end(), cs.begin(), cs.end());
    }
  }
  std::stable_sort(cands.begin(), cands.end(),
                   [](const Candidate& a, const Candidate& b) { return a.proxy < b.proxy; });
  ctx.progress("simulate", 0.7, fmt::format("simulating {} pipeline candidates", cands.size()));
  for (std::size_t i = 0; i < cands.size() && i < static_cast<std::size_t>(std::max(1, o.max_simulated));
       ++i) {
    if (ctx.out_of_time() && (best || ctx.past_grace())) break;
    consider(materialise(ctx, {}, cands[i], reshard::Balancer::LargestFirst), &cands[i]);
  }
  if (!best) {
    sort_alternatives(alts, 0, false);
    std::string why;
    for (std::size_t i = 0; i < std::min<std::size_t>(4, alts.size()); ++i)
      why += fmt::format("\n  {} {}: {}", alts[i].strategy, alts[i].layout, alts[i].note);
    // (or the batch: a share or micro-batch size the graph cannot be cut to)
    const bool pinned = std::any_of(ctx.rebatch_notes.begin(), ctx.rebatch_notes.end(),
                                    [](const auto& kv) { return !kv.second.empty(); });
    fail("make_plan: no plan fits the devices' memory{} for {} on {}; closest candidates:{}",
         pinned ? " and the graph's batch" : "", ctx.g_.name(), c.to_string(), why);
  }
  if (best_cand) {  // the winning pipeline with the best resharding plans
    Built fin = materialise(ctx, {}, *best_cand, reshard::Balancer::Best);
    if (fin.feasible && fin.plan.step_time <= best->plan.step_time) best = std::move(fin);
  }
  sort_alternatives(alts, o.max_alternatives);
  Plan p = std::move(best->plan);
  p.alternatives = std::move(alts);
  p.search_space = hetero_search_space_text(ctx, Ms, dp_allowed, orders.size());
  return p;
}

}  // namespace weft::plan::detail

namespace weft::plan {

Plan data_parallel_plan(const ir::Graph& g, const cluster::Cluster& c,
                        const std::vector<std::int64_t>& shares, int M, const PlanOptions& o) {
  using namespace detail;
  const double start = now_s();
  Context ctx = given_shares_context(g, c, o, start, M, shares.size(), "data_parallel_plan", "shares");
  std::int64_t sum = 0;
  for (auto u : shares) {
    WEFT_CHECK(u >= 0, "data_parallel_plan: a share is negative ({})", u);
    sum += u;
  }
  WEFT_CHECK(sum == ctx.global_batch / M,
             "data_parallel_plan: the shares sum to {}, a micro-batch has {} samples (batch {} / {})", sum,
             ctx.global_batch / M, ctx.global_batch, M);
  ReplicaModel rm(ctx);
  Built b = data_parallel_build(ctx, rm, M, shares, "data parallel (given shares)");
  WEFT_CHECK(b.feasible, "data_parallel_plan: {}", b.note);
  b.plan.plan_seconds = now_s() - start;
  return b.plan;
}

}  // namespace weft::plan
