// Activation recomputation (planner.hpp, Recompute): which tensors a block keeps under each mode,
// and what a mode does to a stage's time and memory.
//
// Full recomputation (Chen et al. 2016; Megatron-LM's "full" at the planner's block granularity)
// keeps each block's forward inputs and runs the stage's forward again in the backward, one block
// at a time: saved activations per in-flight micro-batch shrink to the checkpoints, the backward
// grows by one forward (compute and collectives: tensor-parallel all-reduces repeat as in
// Megatron), and while a block's backward runs its own saved results exist again (transient).
//
// Selective recomputation (Korthikanti et al., "Reducing Activation Recomputation in Large
// Transformer Models", 2022) recomputes only the attention cores, whose s² results are big and
// cheap to make again. In the IR, without op names: a forward contraction of two activations
// (Q·Kᵀ: neither operand is a parameter, state or constant, and an index is contracted) starts a
// region, which grows through the forward ops of the same result shape that read only region
// tensors and constants (scale, mask, softmax, dropout — a dropout's mask is regenerated from its
// counter-based seed); a constant is a Constant / Buffer leaf or what forward ops make from
// constants alone (the zoo Llama's causal mask, made from a positions table in each layer). The contraction
// that reads the region (probabilities × values) closes it: it runs again as well (Megatron's and torch's
// checkpointed attention core recompute it; its result stays saved). The region's saved results are dropped;
// its ops' forward time is added to the backward; one region's dropped bytes are re-made at a time.
#include <algorithm>
#include <deque>

#include "planner_detail.hpp"
#include "weft/core/error.hpp"
#include "weft/pipeline/grouping.hpp"

namespace weft::plan {

std::string_view recompute_name(Recompute r) {
  switch (r) {
    case Recompute::Auto: return "auto";
    case Recompute::None: return "none";
    case Recompute::Selective: return "selective";
    case Recompute::Full: return "full";
  }
  return "none";
}

Recompute parse_recompute(std::string_view name) {
  for (Recompute r : {Recompute::Auto, Recompute::None, Recompute::Selective, Recompute::Full})
    if (name == recompute_name(r)) return r;
  throw Error(fmt::format("recompute: expected auto, none, selective or full, got '{}'", name));
}

std::vector<std::vector<ir::OpId>> selective_regions(const ir::Graph& g) {
  const auto phase = pipeline::classify_ops(g);
  std::vector<char> fwd(g.ops().size(), 0), saved(g.tensors().size(), 0);
  for (std::size_t o = 0; o < fwd.size(); ++o) fwd[o] = phase[o] == pipeline::OpPhase::Forward;
  for (ir::OpId o = 0; o < static_cast<ir::OpId>(g.ops().size()); ++o)
    if (phase[static_cast<std::size_t>(o)] == pipeline::OpPhase::Backward)
      for (ir::TensorId t : g.op(o).inputs) {
        const ir::OpId p = g.tensor(t).producer;
        saved[static_cast<std::size_t>(t)] = p != ir::kNoOp && fwd[static_cast<std::size_t>(p)];
      }
  std::vector<std::vector<ir::OpId>> out;
  for (auto& r : detail::recompute_sets(g, fwd, saved).regions) out.push_back(std::move(r.ops));
  return out;
}

namespace detail {

std::vector<Recompute> recompute_modes(Recompute option) {
  if (option == Recompute::Auto) return {Recompute::None, Recompute::Selective, Recompute::Full};
  return {option};
}

namespace {

bool activation_derived(const ir::TensorInfo& t) {
  return !(t.producer == ir::kNoOp && (t.role == ir::Role::Parameter || t.role == ir::Role::OptimizerState ||
                                       t.role == ir::Role::Constant || t.role == ir::Role::Buffer));
}

// An index the operands carry and no result does.
bool contracts(const ir::Op& op) {
  const auto& im = op.index_map;
  for (int f = 0; f < static_cast<int>(im.factors.size()); ++f) {
    bool in_input = false, in_output = false;
    for (const auto& u : im.uses(f)) (u.output ? in_output : in_input) = true;
    if (in_input && !in_output) return true;
  }
  return false;
}

}  // namespace

RecomputeSets recompute_sets(const ir::Graph& g, const std::vector<char>& forward_op,
                             const std::vector<char>& saved) {
  const int nt = static_cast<int>(g.tensors().size());
  WEFT_ASSERT(static_cast<int>(saved.size()) == nt && forward_op.size() == g.ops().size(),
              "recompute_sets: per-tensor / per-op flags of another graph");
  RecomputeSets out;
  out.checkpoint.assign(nt, 0);
  for (ir::OpId o = 0; o < static_cast<ir::OpId>(g.ops().size()); ++o) {
    if (!forward_op[o]) continue;
    for (ir::TensorId t : g.op(o).inputs) {
      const auto& info = g.tensor(t);
      if (info.producer == ir::kNoOp && (info.role == ir::Role::Activation || info.role == ir::Role::Input))
        out.checkpoint[t] = 1;
    }
  }
  // Tensors fixed by constants alone: Constant / Buffer leaves and forward results of them only.
  const auto order = g.topo_order();
  std::vector<char> fixed(nt, 0);
  for (ir::TensorId t = 0; t < nt; ++t) {
    const auto& info = g.tensor(t);
    fixed[t] =
        info.producer == ir::kNoOp && (info.role == ir::Role::Constant || info.role == ir::Role::Buffer);
  }
  for (ir::OpId o : order) {
    const ir::Op& op = g.op(o);
    if (!forward_op[o] || op.inputs.empty()) continue;
    const bool all =
        std::all_of(op.inputs.begin(), op.inputs.end(), [&](ir::TensorId i) { return fixed[i] != 0; });
    for (ir::TensorId r : op.outputs) fixed[r] = all;
  }
  std::vector<char> in_region(g.ops().size(), 0), region_tensor(nt, 0);
  for (ir::OpId start : order) {
    const ir::Op& op = g.op(start);
    if (!forward_op[start] || in_region[start] || op.kind != ir::OpKind::Einsum || op.inputs.size() != 2 ||
        op.outputs.size() != 1)
      continue;
    if (!activation_derived(g.tensor(op.inputs[0])) || !activation_derived(g.tensor(op.inputs[1])) ||
        !contracts(op))
      continue;
    RecomputeSets::Region r;
    const auto& shape = g.tensor(op.outputs[0]).shape;
    std::deque<ir::TensorId> todo{op.outputs[0]};
    std::vector<ir::OpId> ends;
    in_region[start] = 1;
    region_tensor[op.outputs[0]] = 1;
    r.ops.push_back(start);
    while (!todo.empty()) {
      const ir::TensorId t = todo.front();
      todo.pop_front();
      for (ir::OpId c : g.consumers(t)) {
        const ir::Op& cop = g.op(c);
        if (!forward_op[c] || in_region[c] || cop.outputs.size() != 1) continue;
        if (cop.kind == ir::OpKind::Einsum && contracts(cop)) {
          // The next contraction (probabilities × values) ends the region and runs again too (as
          // Megatron's and torch's checkpointed attention core do), its result is kept.
          ends.push_back(c);
          continue;
        }
        if (g.tensor(cop.outputs[0]).shape != shape) continue;
        bool only_region = true;
        for (ir::TensorId i : cop.inputs)
          only_region = only_region && (region_tensor[i] || fixed[i] || !activation_derived(g.tensor(i)));
        if (!only_region) continue;
        in_region[c] = 1;
        region_tensor[cop.outputs[0]] = 1;
        r.ops.push_back(c);
        todo.push_back(cop.outputs[0]);
      }
    }
    for (ir::OpId o : r.ops)
      if (saved[g.op(o).outputs[0]]) r.dropped.push_back(g.op(o).outputs[0]);
    for (ir::OpId e : ends)
      if (forward_op[e] && !in_region[e]) {
        in_region[e] = 1;
        r.ops.push_back(e);
      }
    if (!r.dropped.empty()) out.regions.push_back(std::move(r));
  }
  return out;
}

StageAgg recomputed(const StageAgg& a, Recompute mode) {
  StageAgg r = a;
  r.recompute = mode;
  switch (mode) {
    case Recompute::Auto:
    case Recompute::None: r.recompute = Recompute::None; break;
    case Recompute::Full:
      r.bwd += a.fwd;
      r.compute += a.fwd_compute;
      r.comm += a.fwd - a.fwd_compute;
      r.act_mem = a.checkpoint_mem;
      r.transient = std::max(a.transient, a.full_transient);
      break;
    case Recompute::Selective:
      r.bwd += a.sel_time;
      r.compute += a.sel_time;
      r.act_mem = std::max(0.0, a.act_mem - a.sel_mem);
      r.transient = std::max(a.transient, a.sel_transient);
      break;
  }
  return r;
}

std::vector<int> recompute_order(const StageAgg& a, int inflight) {
  const int n = static_cast<int>(a.blk_act.size());
  std::vector<int> order(static_cast<std::size_t>(n));
  for (int b = 0; b < n; ++b) order[static_cast<std::size_t>(b)] = b;
  auto saving = [&](int b) {  // peak bytes saved: the in-flight activations less the remake's transient
    const auto i = static_cast<std::size_t>(b);
    return inflight * (a.blk_act[i] - a.blk_ckpt[i]) - std::max(0.0, a.blk_remake[i] - a.transient);
  };
  std::stable_sort(order.begin(), order.end(), [&](int x, int y) {
    const double sx = saving(x), sy = saving(y);
    if (sx != sy) return sx > sy;
    return a.blk_fwd[static_cast<std::size_t>(x)] < a.blk_fwd[static_cast<std::size_t>(y)];
  });
  return order;
}

std::vector<int> selective_order(const StageAgg& a, int inflight) {
  std::vector<int> order;
  for (int b = 0; b < static_cast<int>(a.blk_sel_mem.size()); ++b)
    if (a.blk_sel_mem[static_cast<std::size_t>(b)] > 0) order.push_back(b);
  // Peak bytes saved per second of re-made forward by this block alone (recomputed_per_block's
  // price): its dropped bytes per in-flight micro-batch, less what its re-make adds to the transient
  // (the blocks up to it kept, the later ones freed).
  std::vector<double> upto(a.blk_act.size());
  for (std::size_t i = 0; i < upto.size(); ++i) upto[i] = (i ? upto[i - 1] : 0.0) + a.blk_act[i];
  auto per_second = [&](int b) {
    const auto i = static_cast<std::size_t>(b);
    const double rise = std::max(0.0, upto[i] + a.blk_sel_remake[i] - a.act_mem - a.transient);
    const double saved = inflight * a.blk_sel_mem[i] - rise;
    return a.blk_sel_time[i] > 0 ? saved / a.blk_sel_time[i] : saved > 0 ? kInf : saved;
  };
  std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return per_second(x) > per_second(y); });
  return order;
}

StageAgg recomputed_per_block(const StageAgg& a, std::vector<int> full, std::vector<int> selective) {
  const std::size_t n = a.blk_act.size();
  WEFT_ASSERT(!full.empty() || !selective.empty(), "recomputed_per_block: no block recomputed");
  std::sort(full.begin(), full.end());
  std::sort(selective.begin(), selective.end());
  StageAgg r = a;
  r.recompute = full.empty() ? Recompute::Selective : Recompute::Full;
  // Per block: 0 keeps its activations, 1 selective, 2 full.
  std::vector<char> mode(n, 0);
  for (const auto* set : {&selective, &full})
    for (int b : *set) {
      WEFT_ASSERT(b >= 0 && b < static_cast<int>(n) && mode[static_cast<std::size_t>(b)] == 0,
                  "recomputed_per_block: a block out of range or in both sets");
      mode[static_cast<std::size_t>(b)] = set == &full ? 2 : 1;
    }
  std::vector<double> kept(n);  // per block: what it keeps per micro-batch
  for (std::size_t i = 0; i < n; ++i) {
    kept[i] = a.blk_act[i];
    if (mode[i] == 2) {
      r.bwd += a.blk_fwd[i];
      r.compute += a.blk_fwd_compute[i];
      r.comm += a.blk_fwd[i] - a.blk_fwd_compute[i];
      kept[i] = a.blk_ckpt[i];
    } else if (mode[i] == 1) {
      r.bwd += a.blk_sel_time[i];
      r.compute += a.blk_sel_time[i];
      kept[i] = a.blk_act[i] - a.blk_sel_mem[i];
    }
    r.act_mem -= a.blk_act[i] - kept[i];
  }
  // Block b is re-made (whole, or one attention core at a time) in a micro-batch's backward after
  // the blocks behind it have freed theirs: that micro-batch then holds the blocks before b as
  // kept, b's kept share and b's re-made results (its remake) instead of its full share — the peak
  // over the other in-flight micro-batches' shares, as a transient above one share.
  double prefix = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (mode[i] != 0)
      r.transient = std::max(
          r.transient, prefix + kept[i] + (mode[i] == 2 ? a.blk_remake[i] : a.blk_sel_remake[i]) - r.act_mem);
    prefix += kept[i];
  }
  r.recompute_set = std::move(full);
  r.selective_set = std::move(selective);
  return r;
}

StageAgg recomputed_blocks(const StageAgg& a, std::vector<int> set) {
  WEFT_ASSERT(!set.empty() && set.size() < a.blk_act.size(),
              "recomputed_blocks: not a proper subset of the blocks");
  return recomputed_per_block(a, std::move(set), {});
}

}  // namespace detail
}  // namespace weft::plan
