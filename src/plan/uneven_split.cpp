// Whale's `split` over mixed GPUs on the planner's cost model: one SPMD stage on a 1-D mesh whose
// devices are of different kinds, every split factor cut unevenly in proportion to what each
// device can do (Whale §3.3: "balances the FLOP of a partitioned operation through uneven
// sharding in splitting dimension among multiple devices").
//
// Strategies. The SPMD search runs once per block on the mixed mesh, priced on the slowest kind
// (SearchOptions::device): the strategies are those of an even split (the homogeneous search's
// space); the uneven split keeps them and changes only how much of each split factor a device
// holds. Device i holds the fraction p_i (Σ p_i = 1) of every factor mesh axis 0 splits: a factor
// of size F is cut into pipeline::proportional_pieces(F, p) (whole elements), so an op's work on
// device i is cost::op_cost_fractional with that factor at piece_i / F; a replicated op runs whole
// on every device.
//
// Time per micro-batch. Devices meet at every collective, so per op the slowest device counts:
//     F = Σ_{forward ops} max_i t_i(op) + comm_F · n·max_i p_i        (B, W, update alike),
// an upper bound of the per-device sums. Ring collectives over uneven pieces move the largest
// piece in each of their n − 1 steps, so the even split's communication (and gradient
// synchronisation) is scaled by n·max_i p_i; for an all-reduce of partial sums (full-size
// tensors, chunked evenly) that is an over-estimate.
//
// Memory per device. A tensor sharded on the axis (its even local bytes below its full bytes)
// holds n·p_i of its even share on device i, a replicated or partial one its full local bytes:
//     memory_i = R + S·n·p_i + transient · max(1, n·p_i),
// R and S the whole and the split parts of static (params + grads + optimizer state) + in-flight ×
// activations, transient the even split's (scaled for the devices above 1/n).
//
// Balancing (Algorithm 1 on this model). Per device kind the stage time per micro-batch plus the
// optimizer step over M micro-batches, T_K(p), is read at p = 1/n and 2/n and taken as affine
// (fixed + slope·p, the balancer's fixed work and work per unit); memory is the linear upper bound
// R + transient + (S + transient)·n·p; the shares are units of 1/(64·n) from
// pipeline::try_balance_load (the min-max optimum over integer units under each device's memory),
// then refined on the exact cost (moves of fraction between kinds, see balanced_fractions). The
// split is then costed exactly as above.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "planner_detail.hpp"
#include "weft/core/units.hpp"
#include "weft/cost/op_cost.hpp"
#include "weft/pipeline/hetero.hpp"
#include "weft/sim/simulator.hpp"

namespace weft::plan::detail {

namespace {

struct MemoryParts {
  // Bytes every device holds whole (replicated or partial) and bytes split on the axis (the even
  // share per device), for the static state and for one micro-batch's saved activations.
  double static_whole = 0, static_split = 0, act_whole = 0, act_split = 0;
  double transient = 0;  // the even split's
  // Device holding the fraction p of n: static + in-flight × activations + transient.
  double static_at(double n, double p) const { return static_whole + static_split * n * p; }
  double act_at(double n, double p) const { return act_whole + act_split * n * p; }
  double transient_at(double n, double p) const { return transient * std::max(1.0, n * p); }
  double at(double n, double p, int inflight) const {
    return static_at(n, p) + inflight * act_at(n, p) + transient_at(n, p);
  }
};

MemoryParts memory_parts(Context& ctx, int first, int last, std::int64_t bs, const MeshOption& m, int variant,
                         int forced) {
  MemoryParts mp;
  const auto& ab = ctx.blocks_at(bs);
  for (int b = first; b <= last; ++b) {
    const BlockCost& bc = ctx.block_cost(b, bs, m, variant, forced);
    if (!bc.ok) continue;
    const auto& bg = ab.blocks[b].graph;
    for (int t = 0; t < static_cast<int>(bc.mem_class.size()); ++t) {
      const auto cls = bc.mem_class[t];
      if (cls == BlockCost::kNone) continue;
      const double local = bc.local_bytes[t];
      const bool split = local < static_cast<double>(bg.tensor(t).bytes()) * (1 - 1e-9);
      if (cls == BlockCost::kActivation)
        (split ? mp.act_split : mp.act_whole) += local;
      else  // a parameter counts with its gradient, an optimizer state once (state_bytes_factor)
        (split ? mp.static_split : mp.static_whole) += state_bytes_factor(bg, t) * local;
    }
    mp.transient = std::max(mp.transient, bc.transient);
  }
  return mp;
}

// Compute seconds per phase of one device of `spec` holding the fraction p of every split factor
// (continuous: the balancer's model).
struct PhaseTimes {
  double fwd = 0, bwd = 0, wgt = 0, upd = 0;
  // Adds t seconds of (training-graph) op `orig` to its phase.
  void add(const Context& ctx, ir::OpId orig, double t) {
    switch (ctx.phase[orig]) {
      case pipeline::OpPhase::Forward: fwd += t; break;
      case pipeline::OpPhase::Backward:
        bwd += t;
        if (ctx.weight_grad_op[orig]) wgt += t;
        break;
      case pipeline::OpPhase::Update: upd += t; break;
    }
  }
};
PhaseTimes device_compute(Context& ctx, int first, int last, std::int64_t bs, const MeshOption& m,
                          int variant, int forced, const cluster::DeviceSpec& spec, double p) {
  PhaseTimes pt;
  const auto& ab = ctx.blocks_at(bs);
  for (int b = first; b <= last; ++b) {
    const BlockCost& bc = ctx.block_cost(b, bs, m, variant, forced);
    const auto& blk = ab.blocks[b];
    const auto& bg = blk.graph;
    for (ir::OpId o = 0; o < static_cast<ir::OpId>(bg.ops().size()); ++o) {
      const ir::Op& op = bg.op(o);
      std::vector<double> frac(op.index_map.factors.size(), 1.0);
      if (bc.split_factor[o] >= 0) frac[static_cast<std::size_t>(bc.split_factor[o])] = p;
      pt.add(ctx, blk.original_op[o], cost::op_cost_fractional(bg, op, spec, frac).time);
    }
  }
  return pt;
}

}  // namespace

UnevenStage uneven_stage(Context& ctx, int first, int last, std::int64_t bs, const MeshOption& m, int variant,
                         int forced, const std::vector<double>& fraction, int inflight) {
  UnevenStage u;
  const auto& ids = m.mesh.device_ids();
  const std::size_t n = ids.size();
  WEFT_ASSERT(fraction.size() == n && m.mesh.ndim() == 1,
              "uneven_stage: a fraction per device of a 1-D mesh");
  const double total = std::accumulate(fraction.begin(), fraction.end(), 0.0);
  u.fraction = fraction;
  for (double& f : u.fraction) f /= total;
  const double maxp = *std::max_element(u.fraction.begin(), u.fraction.end());
  const double scale = static_cast<double>(n) * maxp;  // ring collectives over uneven pieces
  const auto& ab = ctx.blocks_at(bs);
  PhaseTimes ops;  // per op its slowest device's time
  for (int b = first; b <= last; ++b) {
    const BlockCost& bc = ctx.block_cost(b, bs, m, variant, forced);
    if (!bc.ok) {
      u.error = bc.error;
      return u;
    }
    const auto& blk = ab.blocks[b];
    const auto& bg = blk.graph;
    for (ir::OpId o = 0; o < static_cast<ir::OpId>(bg.ops().size()); ++o) {
      const ir::Op& op = bg.op(o);
      const int sf = bc.split_factor[o];
      std::vector<std::int64_t> pieces;
      std::int64_t F = 1;
      if (sf >= 0) {
        F = op.index_map.factors[static_cast<std::size_t>(sf)].size;
        pieces = pipeline::proportional_pieces(F, u.fraction);
      }
      // Per (kind, piece): devices of one kind holding equal pieces cost the same.
      std::map<std::pair<std::string, std::int64_t>, double> seen;
      double worst = 0;
      std::vector<double> frac(op.index_map.factors.size(), 1.0);
      for (std::size_t i = 0; i < n; ++i) {
        const auto& spec = ctx.c_.device(ids[i]).spec;
        const std::int64_t piece = sf >= 0 ? pieces[i] : F;
        auto [it, fresh] = seen.try_emplace({spec.kind, piece}, 0.0);
        if (fresh) {
          if (sf >= 0)
            frac[static_cast<std::size_t>(sf)] = static_cast<double>(piece) / static_cast<double>(F);
          it->second = cost::op_cost_fractional(bg, op, spec, frac).time;
        }
        worst = std::max(worst, it->second);
      }
      ops.add(ctx, blk.original_op[o], worst);
    }
    const double cf = bc.fwd - bc.fwd_compute, cb = bc.bwd - bc.bwd_compute, cw = bc.wgt - bc.wgt_compute;
    const double cu = bc.upd - bc.upd_compute - bc.grad_sync;
    u.fwd += cf * scale;
    u.bwd += cb * scale;
    u.wgt += cw * scale;
    u.upd += (cu + bc.grad_sync) * scale;
    u.grad_sync += bc.grad_sync * scale;
    u.comm += (cf + cb) * scale;
  }
  u.fwd += ops.fwd;
  u.bwd += ops.bwd;
  u.wgt += ops.wgt;
  u.upd += ops.upd;
  u.compute = ops.fwd + ops.bwd;
  // Tensors passed between the stage's blocks (each block's plan chose its own layout).
  const Context::InternalReshard r = ctx.internal_reshard(first, last, bs, m, variant, forced);
  u.fwd += r.fwd * scale;
  u.bwd += r.bwd * scale;
  u.upd += r.upd * scale;
  u.comm += (r.fwd + r.bwd) * scale;
  const MemoryParts mp = memory_parts(ctx, first, last, bs, m, variant, forced);
  const double nd = static_cast<double>(n);
  for (std::size_t i = 0; i < n; ++i) {
    const double p = u.fraction[i];
    u.memory.push_back(mp.at(nd, p, inflight));
    u.static_mem.push_back(mp.static_at(nd, p));
    u.act_mem.push_back(mp.act_at(nd, p));
    u.transient.push_back(mp.transient_at(nd, p));
  }
  u.ok = true;
  return u;
}

std::vector<double> balanced_fractions(Context& ctx, int first, int last, std::int64_t bs,
                                       const MeshOption& m, int variant, int forced, int M, int inflight,
                                       std::string* why) {
  const auto& ids = m.mesh.device_ids();
  const std::size_t n = ids.size();
  const double nd = static_cast<double>(n);
  for (int b = first; b <= last; ++b) {
    const BlockCost& bc = ctx.block_cost(b, bs, m, variant, forced);
    if (!bc.ok) {
      if (why) *why = bc.error;
      return {};
    }
  }
  const MemoryParts mp = memory_parts(ctx, first, last, bs, m, variant, forced);
  // Linear upper bound of MemoryParts::at in p (transient · max(1, n·p) <= transient · (1 + n·p)).
  const double whole = mp.static_whole + inflight * mp.act_whole + mp.transient;
  const double split = mp.static_split + inflight * mp.act_split + mp.transient;
  const std::int64_t U = 64 * static_cast<std::int64_t>(n);
  const double p1 = 1.0 / nd, p2 = std::min(1.0, 2.0 / nd);
  std::map<std::string, std::pair<double, double>> per_kind;  // kind -> (fixed s, s per unit)
  std::vector<pipeline::DeviceCapacity> caps;
  std::vector<pipeline::LoadModel> loads;
  for (int id : ids) {
    const auto& spec = ctx.c_.device(id).spec;
    auto it = per_kind.find(spec.kind);
    if (it == per_kind.end()) {
      auto period = [&](double p) {
        const PhaseTimes t = device_compute(ctx, first, last, bs, m, variant, forced, spec, p);
        return t.fwd + t.bwd + t.upd / M;
      };
      const double a = period(p1), b = period(p2);
      const double slope = std::max((b - a) / (p2 - p1), 1e-15);
      it = per_kind.emplace(spec.kind, std::make_pair(std::max(0.0, a - slope * p1), slope / U)).first;
    }
    caps.emplace_back(1.0, ctx.usable_of_device(id), fmt::format("{}#{}", spec.kind, id));
    loads.emplace_back(it->second.second, whole, split * nd / U, it->second.first);
  }
  const pipeline::HeteroShares s = pipeline::try_balance_load(caps, loads, U);
  if (!s.feasible) {
    if (why) *why = s.message;
    return {};
  }
  std::vector<double> f;
  for (auto x : s.units) f.push_back(static_cast<double>(x) / static_cast<double>(U));
  // Exact refinement: the roofline bends (an op turns memory-bound at small pieces) and the
  // communication scales with the largest fraction, which the affine model does not see. Move a
  // step of fraction from the devices of one kind to those of another (δ more on each receiving
  // device) while the exact period M·(F + B) + update improves and every device fits; halve δ
  // from 1/(8·n) down to 1/(256·n).
  std::map<std::string, int> kinds;  // kind -> devices of it
  for (int id : ids) ++kinds[ctx.c_.device(id).spec.kind];
  auto period = [&](const std::vector<double>& fr) {
    const UnevenStage u = uneven_stage(ctx, first, last, bs, m, variant, forced, fr, inflight);
    for (std::size_t i = 0; i < n; ++i)
      if (u.memory[i] > ctx.usable_of_device(ids[i]) * (1 + 1e-9)) return kInf;
    return M * (u.fwd + u.bwd) + u.upd;
  };
  double cur = period(f);
  for (double delta = 1.0 / (8 * nd); delta >= 1.0 / (256 * nd); delta /= 2) {
    bool moved = true;
    while (moved) {
      moved = false;
      for (const auto& [from, n_from] : kinds)
        for (const auto& [to, n_to] : kinds) {
          if (from == to) continue;
          // δ more on every device of `to`, the same total less on the devices of `from`.
          std::vector<double> t = f;
          bool ok = true;
          for (std::size_t i = 0; i < n; ++i) {
            const auto& k = ctx.c_.device(ids[i]).spec.kind;
            if (k == from) ok = ok && (t[i] -= delta * n_to / n_from) >= 0;
            if (k == to) t[i] += delta;
          }
          if (!ok) continue;
          const double v = period(t);
          if (v < cur * (1 - 1e-9)) {
            f = t, cur = v, moved = true;
          }
        }
    }
  }
  return f;
}

Built split_build(Context& ctx, const MeshOption& m, int M, const std::vector<double>& fraction,
                  const std::string& strategy) {
  const int L = ctx.L();
  const std::int64_t bs = ctx.global_batch / M;
  Built out;
  out.plan.strategy = strategy;
  if (const auto& why = ctx.rebatch_note(bs); !why.empty()) {  // nothing to cost: no stages
    out.note =
        fmt::format("the batch {} cannot be split into {} micro-batches: {}", ctx.global_batch, M, why);
    return out;
  }
  // The block boundaries free or agreed (as best_stage), the fast SPMD variant or the lean one
  // when the fast one does not fit; the fractions given or balanced for each. The feasible choice
  // with the shortest period M·(F + B) + update wins; none feasible: the last one tried, noted.
  struct Pick {
    UnevenStage u;
    int variant = 0, forced = 0;
    std::string over;
    double period = kInf;
  };
  std::optional<Pick> best, last_tried;
  for (int forced : {0, static_cast<int>(m.mesh.size())}) {
    std::vector<double> fr = fraction;
    if (fr.empty()) {
      std::string why;
      fr = balanced_fractions(ctx, 0, L - 1, bs, m, 0, forced, M, 1, &why);
      if (fr.empty()) {
        out.note = why;
        continue;
      }
    }
    for (int variant = 0; variant < 2; ++variant) {
      Pick pk;
      pk.u = uneven_stage(ctx, 0, L - 1, bs, m, variant, forced, fr, 1);
      pk.variant = variant;
      pk.forced = forced;
      if (!pk.u.ok) {
        out.note = pk.u.error;
        continue;
      }
      for (std::size_t i = 0; i < pk.u.memory.size() && pk.over.empty(); ++i) {
        const int id = m.mesh.device_ids()[i];
        if (pk.u.memory[i] > ctx.usable_of_device(id) * (1 + 1e-9))
          pk.over = fmt::format("device {} (fraction {:.3f}): {} > {} usable", id, pk.u.fraction[i],
                                format_bytes(pk.u.memory[i]), format_bytes(ctx.usable_of_device(id)));
      }
      pk.period = M * (pk.u.fwd + pk.u.bwd) + pk.u.upd;
      if (pk.over.empty()) {
        if (!best || pk.period < best->period) best = pk;
        break;  // the fast variant fits: the lean one is not faster
      }
      last_tried = pk;
    }
  }
  if (!best && !last_tried) return out;
  const Pick& pk = best ? *best : *last_tried;
  const UnevenStage& u = pk.u;
  Candidate cand;
  cand.strategy = strategy;
  cand.M = M;
  cand.dp = 1;
  cand.bs = bs;
  StageChoice sc;
  sc.first = 0;
  sc.last = L - 1;
  sc.variant = pk.variant;
  sc.forced_dp = pk.forced;
  sc.time = u.fwd + u.bwd;
  sc.memory = *std::max_element(u.memory.begin(), u.memory.end());
  cand.stages.push_back(sc);
  cand.devices.push_back(m.mesh.device_ids());
  cand.meshes.push_back(m);
  out = materialise(ctx, {}, cand, reshard::Balancer::LargestFirst);
  Plan& p = out.plan;
  p.strategy = strategy;
  p.split_fraction = u.fraction;
  Stage& st = p.stages[0];
  st.forward_time = u.fwd;
  st.backward_time = u.bwd;
  st.weight_time = u.wgt;
  st.compute_time = u.compute;
  st.comm_time = u.comm;
  double grad_bytes = 0;
  for (const auto& pr : st.params) grad_bytes += pr.bytes_per_device;
  st.optimizer_time = u.upd - u.grad_sync + exposed_grad_sync(ctx.opt_, u.grad_sync, grad_bytes, u.bwd) +
                      step_allreduce_time(ctx.c_, ctx.opt_, p.devices_used);
  p.device_memory = u.memory;
  // The stage's memory line: the fullest device's parts.
  const auto full =
      static_cast<std::size_t>(std::max_element(u.memory.begin(), u.memory.end()) - u.memory.begin());
  p.peak_memory = u.memory[full];
  st.peak_memory = p.peak_memory;
  st.static_memory = u.static_mem[full];
  st.activation_memory = u.act_mem[full];
  st.transient_memory = u.transient[full];
  const sim::SimResult r = resimulate(p);
  p.step_time = r.step_time;
  p.bubble_fraction = r.bubble_fraction;
  p.throughput = p.step_time > 0 ? static_cast<double>(p.global_batch()) / p.step_time : 0;
  p.mfu = p.step_time > 0 ? p.model_flops / (p.step_time * p.cluster_peak_flops) : 0;
  out.feasible = pk.over.empty();
  out.note = pk.over;
  return out;
}

MeshOption whole_cluster_mesh(Context& ctx) {
  const int N = ctx.c_.num_devices();
  std::vector<int> ids(static_cast<std::size_t>(N));
  std::iota(ids.begin(), ids.end(), 0);
  cluster::DeviceMesh mesh({N}, ids);
  return MeshOption{pipeline::SubmeshShape(1, N), {N}, mesh, ctx.mesh_key(mesh)};
}

}  // namespace weft::plan::detail

namespace weft::plan {

Plan split_plan(const ir::Graph& g, const cluster::Cluster& c, const std::vector<double>& fraction, int M,
                const PlanOptions& o) {
  using namespace detail;
  const double start = now_s();
  Context ctx = given_shares_context(g, c, o, start, M, fraction.size(), "split_plan", "fractions");
  double sum = 0;
  for (double f : fraction) {
    WEFT_CHECK(std::isfinite(f) && f >= 0, "split_plan: fractions must be finite and >= 0 (got {})", f);
    sum += f;
  }
  WEFT_CHECK(sum > 0, "split_plan: the fractions sum to 0");
  WEFT_CHECK(c.num_devices() >= 2, "split_plan: a split needs at least two devices");
  Built b = split_build(ctx, whole_cluster_mesh(ctx), M, fraction, "spmd (given split)");
  WEFT_CHECK(b.feasible, "split_plan: {}", b.note);
  b.plan.plan_seconds = now_s() - start;
  return b.plan;
}

}  // namespace weft::plan
