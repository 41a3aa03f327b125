// Lowering of one SPMD stage to per-rank programs (see lower.hpp).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <set>

#include "weft/core/error.hpp"
#include "weft/lower/lower.hpp"
#include "weft/pipeline/grouping.hpp"
#include "weft/sharding/reshard.hpp"

namespace weft::lower {

namespace {

using sharding::Placement;
using sharding::ShardingSpec;

bool is_state_leaf(const ir::TensorInfo& t) {
  return t.producer == ir::kNoOp && (t.role == ir::Role::Parameter || t.role == ir::Role::OptimizerState);
}

InstrKind kind_of(sharding::CollectiveKind k) {
  switch (k) {
    case sharding::CollectiveKind::AllGather: return InstrKind::AllGather;
    case sharding::CollectiveKind::ReduceScatter: return InstrKind::ReduceScatter;
    case sharding::CollectiveKind::AllReduce: return InstrKind::AllReduce;
    case sharding::CollectiveKind::AllToAll: return InstrKind::AllToAll;
    case sharding::CollectiveKind::LocalSlice: return InstrKind::LocalSlice;
    case sharding::CollectiveKind::LocalPartial: return InstrKind::LocalPartial;
  }
  throw InternalError("collective kind");
}

// The spec of a per-token statistics tensor of logits laid out as `logits` (the class dim removed;
// the axes that split it replicate the statistics); `extra` appends an unsharded trailing dim.
ShardingSpec stats_spec(const ShardingSpec& logits, std::int64_t extra) {
  const int v = logits.rank() - 1;
  std::vector<std::int64_t> shape(logits.tensor_shape().begin(), logits.tensor_shape().end() - 1);
  if (extra > 0) shape.push_back(extra);
  std::vector<Placement> pl;
  for (const auto& p : logits.per_axis())
    pl.push_back(p.kind == Placement::Shard && p.dim == v ? Placement::replicate() : p);
  return ShardingSpec(shape, logits.mesh_shape(), pl);
}

class StageLowering {
 public:
  StageLowering(const ir::Graph& g, const cluster::Cluster& c, const cluster::DeviceMesh& mesh,
                const SpmdLayout& layout, const StageOptions& opt)
      : g_(g), mesh_(mesh), layout_(layout), opt_(opt), links_(cluster::axis_links(c, mesh)) {}

  Program run() {
    g_.validate();
    const auto& shape = mesh_.shape();
    const int dp = opt_.replicas, mbs = opt_.microbatches;
    WEFT_CHECK(dp >= 1 && mbs >= 1, "lowering: replicas ({}) and micro-batches ({}) must be >= 1", dp, mbs);
    WEFT_CHECK(dp == 1 || (!shape.empty() && shape[0] == dp),
               "lowering: with {} replicas the mesh must start with a replica axis of {}, it is {}", dp, dp, shape);
    lead_ = dp > 1 ? 1 : 0;
    spmd_shape_.assign(shape.begin() + lead_, shape.end());
    WEFT_CHECK(layout_.op_axes.size() == g_.ops().size(), "lowering: the layout has {} op assignments, the graph {} ops",
               layout_.op_axes.size(), g_.ops().size());
    p_.graph = g_;
    // Leaves read by some op (and every parameter): one buffer each in the leaf's spec.
    std::vector<char> read(g_.tensors().size(), 0);
    for (const auto& op : g_.ops())
      for (ir::TensorId t : op.inputs) read[static_cast<std::size_t>(t)] = 1;
    std::vector<int> inputs;
    for (ir::TensorId t = 0; t < static_cast<ir::TensorId>(g_.tensors().size()); ++t) {
      const auto& info = g_.tensor(t);
      if (info.producer != ir::kNoOp || !read[static_cast<std::size_t>(t)]) continue;
      auto it = layout_.leaf_specs.find(t);
      ShardingSpec spec = it != layout_.leaf_specs.end() ? it->second : ShardingSpec::replicated(info.shape, spmd_shape_);
      WEFT_CHECK(spec.tensor_shape() == info.shape && spec.mesh_shape() == spmd_shape_,
                 "lowering: the spec of leaf '{}' is for shape {} on mesh {}, the tensor is {} on mesh {}", info.name,
                 spec.tensor_shape(), spec.mesh_shape(), info.shape, spmd_shape_);
      int b = buffer(t, widen(spec));
      p_.leaf_buffers.push_back(b);
      if (info.role == ir::Role::Parameter) p_.parameters[info.name] = b;
      if (info.role == ir::Role::Input) inputs.push_back(b);
    }
    auto load_inputs = [&] {
      for (int b : inputs) {
        Instr i;
        i.kind = InstrKind::LoadInput;
        i.out = {b};
        i.microbatch = 0;
        emit(std::move(i));
      }
    };
    const auto order = g_.topo_order();
    if (dp == 1 && mbs == 1) {
      load_inputs();
      for (ir::OpId o : order) lower_op(o);
      if (auto loss = g_.loss()) p_.loss = produced(*loss);
      for (const auto& [name, b] : p_.parameters) {
        auto grad = g_.grad(p_.buffers[static_cast<std::size_t>(b)].tensor);
        if (grad && g_.tensor(*grad).producer != ir::kNoOp) p_.gradients[name] = produced(*grad);
      }
    } else {
      accumulate_microbatches(order, load_inputs);
    }
    carry_state();
    add_frees();
    instantiate();
    check(p_);
    return std::move(p_);
  }

 private:
  int buffer(ir::TensorId t, const ShardingSpec& spec, const std::string& label = {}, bool register_layout = true) {
    Buffer b;
    const std::string text = spec.to_string();
    b.tensor = t;
    b.shape = spec.tensor_shape();
    b.spec = text;
    b.element_bytes = t >= 0 ? static_cast<int>(dtype_size(g_.tensor(t).dtype)) : 4;
    b.name = (t >= 0 ? g_.tensor(t).name : label) + "@" + text;
    for (int k = 2; names_.count(b.name); ++k) b.name = fmt::format("{}@{}#{}", t >= 0 ? g_.tensor(t).name : label, text, k);
    names_.insert(b.name);
    p_.buffers.push_back(std::move(b));
    const int id = static_cast<int>(p_.buffers.size()) - 1;
    specs_.push_back(spec);
    if (t >= 0 && register_layout) layouts_[t].emplace_back(spec, id);
    return id;
  }
  int produced(ir::TensorId t) const { return layouts_.at(t).front().second; }

  // A spec of the SPMD mesh on the stage mesh: replicated along the replica axis.
  ShardingSpec widen(const ShardingSpec& s) const {
    if (lead_ == 0) return s;
    std::vector<Placement> pl{Placement::replicate()};
    pl.insert(pl.end(), s.per_axis().begin(), s.per_axis().end());
    return ShardingSpec(s.tensor_shape(), mesh_.shape(), pl);
  }

  // Micro-batches and replicas: the forward/backward instructions once per micro-batch (same
  // buffers), the tensors the update reads (gradients) and the loss accumulated, then scaled to
  // the mean and marked P(sum) on the replica axis; the update ops read them through the usual
  // resharding (the replicas' all-reduce / reduce-scatter).
  template <typename Load>
  void accumulate_microbatches(const std::vector<ir::OpId>& order, Load&& load_inputs) {
    const auto phase = pipeline::classify_ops(g_);
    std::vector<ir::OpId> per_mb, update;
    for (ir::OpId o : order) (phase[static_cast<std::size_t>(o)] == pipeline::OpPhase::Update ? update : per_mb).push_back(o);
    std::set<ir::OpId> in_mb(per_mb.begin(), per_mb.end());
    const std::size_t start = tmpl_.size();
    load_inputs();
    for (ir::OpId o : per_mb) lower_op(o);
    std::vector<ir::TensorId> acc_tensors;
    std::set<ir::TensorId> seen;
    for (ir::OpId o : update)
      for (ir::TensorId t : g_.op(o).inputs) {
        const ir::OpId prod = g_.tensor(t).producer;
        if (prod == ir::kNoOp || !in_mb.count(prod) || !seen.insert(t).second) continue;
        WEFT_CHECK(g_.tensor(t).role == ir::Role::Gradient,
                   "lowering: the update reads '{}' ({}) from the micro-batches; only gradients can be accumulated",
                   g_.tensor(t).name, ir::role_name(g_.tensor(t).role));
        acc_tensors.push_back(t);
      }
    if (auto loss = g_.loss()) acc_tensors.push_back(*loss);
    std::vector<int> acc;
    std::vector<std::size_t> acc_instr;  // index in the micro-batch block of the copy into acc
    for (ir::TensorId t : acc_tensors) {
      const int prod = produced(t);
      acc.push_back(buffer(t, specs_[static_cast<std::size_t>(prod)], {}, false));
      Instr i;
      i.kind = InstrKind::Copy;
      i.in = {prod};
      i.out = {acc.back()};
      acc_instr.push_back(tmpl_.size() - start);
      emit(std::move(i));
    }
    const std::vector<Instr> block(tmpl_.begin() + static_cast<std::ptrdiff_t>(start), tmpl_.end());
    for (int m = 1; m < opt_.microbatches; ++m)
      for (std::size_t k = 0; k < block.size(); ++k) {
        Instr i = block[k];
        if (i.kind == InstrKind::LoadInput) i.microbatch = m;
        if (std::find(acc_instr.begin(), acc_instr.end(), k) != acc_instr.end()) {
          i.kind = InstrKind::Accumulate;
          i.in = {i.out[0], i.in[0]};
        }
        emit(std::move(i));
      }
    const double scale = 1.0 / (static_cast<double>(opt_.microbatches) * opt_.replicas);
    for (std::size_t k = 0; k < acc_tensors.size(); ++k) {
      const ir::TensorId t = acc_tensors[k];
      ShardingSpec spec = specs_[static_cast<std::size_t>(acc[k])];
      if (lead_ > 0) spec = spec.with_axis(0, Placement::partial());
      const int mean = buffer(t, spec, {}, false);
      Instr i;
      i.kind = InstrKind::Scale;
      i.in = {acc[k]};
      i.out = {mean};
      i.scale = scale;
      emit(std::move(i));
      layouts_[t] = {{spec, mean}};  // the update reads the mean of the step
    }
    if (auto loss = g_.loss()) p_.loss = produced(*loss);
    for (const auto& [name, b] : p_.parameters) {
      auto grad = g_.grad(p_.buffers[static_cast<std::size_t>(b)].tensor);
      if (grad && g_.tensor(*grad).producer != ir::kNoOp) p_.gradients[name] = produced(*grad);
    }
    for (ir::OpId o : update) lower_op(o);
  }

  sharding::ReshardPlanner& planner(int element_bytes) {
    auto it = planners_.find(element_bytes);
    if (it == planners_.end()) it = planners_.emplace(element_bytes, sharding::ReshardPlanner(links_, element_bytes)).first;
    return it->second;
  }

  // The buffer of `t` in `spec`, resharding from its first (produced) layout when needed.
  int layout(ir::TensorId t, const ShardingSpec spec) {  // by value: callers pass specs_ elements
    auto& ls = layouts_.at(t);
    for (const auto& [s, b] : ls)
      if (s == spec) return b;
    int cur = ls.front().second;
    ShardingSpec from = ls.front().first;
    const auto& plan = planner(static_cast<int>(dtype_size(g_.tensor(t).dtype))).plan(from, spec);
    for (const auto& step : plan.steps) {
      int next = -1;
      for (const auto& [s, b] : layouts_.at(t))
        if (s == step.to) next = b;
      if (next < 0) {
        next = buffer(t, step.to);
        Instr i;
        i.kind = kind_of(step.kind);
        i.axis = step.axis;
        i.in = {cur};
        i.out = {next};
        if (auto r = step.from.reduce_kind(); r && *r == sharding::ReduceKind::Max) i.reduce = ReduceOp::Max;
        emit(std::move(i));
      }
      cur = next;
    }
    WEFT_ASSERT(specs_[static_cast<std::size_t>(cur)] == spec,
                fmt::format("resharding plan of '{}' from {} to {} ends in {} ({})", g_.tensor(t).name, from.to_string(),
                            spec.to_string(), specs_[static_cast<std::size_t>(cur)].to_string(), plan.to_string()));
    return cur;
  }

  void emit(Instr i) { tmpl_.push_back(std::move(i)); }

  void lower_op(ir::OpId o) {
    const ir::Op& op = g_.op(o);
    WEFT_CHECK(op.kind != ir::OpKind::Opaque, "lowering: op '{}' is opaque and cannot be executed", op.name);
    auto axes = layout_.op_axes[static_cast<std::size_t>(o)];
    WEFT_CHECK(axes.size() == spmd_shape_.size(), "lowering: op '{}' has {} axis assignments, the SPMD mesh {} axes",
               op.name, axes.size(), spmd_shape_.size());
    if (lead_ > 0) axes.insert(axes.begin(), spmd::AxisAssign{});  // replicated along the replicas
    auto strat = spmd::make_strategy(g_, op, mesh_.shape(), axes);
    WEFT_CHECK(strat.has_value(), "lowering: the layout of op '{}' is not a valid strategy on mesh {}", op.name,
               mesh_.shape());
    std::vector<int> in;
    for (std::size_t i = 0; i < op.inputs.size(); ++i) in.push_back(layout(op.inputs[i], strat->inputs[i]));
    const bool ce = op.kind == ir::OpKind::CrossEntropy || op.kind == ir::OpKind::CrossEntropyGrad;
    std::vector<int> vocab_axes;
    if (ce) vocab_axes = strat->inputs[0].axes_of_dim(strat->inputs[0].rank() - 1);
    if (!ce || vocab_axes.empty()) {
      Instr i;
      i.kind = InstrKind::Compute;
      i.op = o;
      i.in = in;
      for (std::size_t k = 0; k < op.outputs.size(); ++k) i.out.push_back(buffer(op.outputs[k], strat->outputs[k]));
      emit(std::move(i));
      return;
    }
    // Vocab-parallel cross-entropy: per-token max and (Σ exp, target logit) over the whole class
    // dim by all-reduces along the axes that split it, then the local loss / gradient.
    const ShardingSpec& lg = strat->inputs[0];
    const std::string base = op.name;
    auto stat_step = [&](InstrKind kind, const std::vector<int>& ins, const ShardingSpec& spec, ReduceOp red,
                         const std::string& label) {
      int b = buffer(-1, spec, base + "." + label);
      Instr i;
      i.kind = kind;
      i.op = o;
      i.in = ins;
      i.out = {b};
      emit(std::move(i));
      for (int a : vocab_axes) {
        int nb = buffer(-1, spec, base + "." + label + ".reduced");
        Instr r;
        r.kind = InstrKind::AllReduce;
        r.axis = a;
        r.in = {b};
        r.out = {nb};
        r.reduce = red;
        r.internal = true;
        emit(std::move(r));
        b = nb;
      }
      return b;
    };
    int row_max = stat_step(InstrKind::CeRowMax, {in[0]}, stats_spec(lg, 0), ReduceOp::Max, "row_max");
    int sum_target =
        stat_step(InstrKind::CeSumTarget, {in[0], in[1], row_max}, stats_spec(lg, 2), ReduceOp::Sum, "sum_target");
    Instr i;
    i.kind = op.kind == ir::OpKind::CrossEntropy ? InstrKind::CeLoss : InstrKind::CeGrad;
    i.op = o;
    i.axes = vocab_axes;
    i.in = in;
    i.in.push_back(row_max);
    i.in.push_back(sum_target);
    i.out = {buffer(op.outputs[0], strat->outputs[0])};
    emit(std::move(i));
  }

  // The loop-carried edges: each updated state is resharded to its leaf's layout and copied in.
  void carry_state() {
    std::vector<std::pair<int, int>> copies;
    for (auto [out, leaf_t] : state_carries(g_)) {
      const int leaf = layouts_.at(leaf_t).front().second;
      copies.emplace_back(layout(out, specs_[static_cast<std::size_t>(leaf)]), leaf);
    }
    for (auto [from, to] : copies) {
      Instr i;
      i.kind = InstrKind::Copy;
      i.in = {from};
      i.out = {to};
      emit(std::move(i));
    }
  }

  void add_frees() {
    std::set<int> keep(p_.leaf_buffers.begin(), p_.leaf_buffers.end());
    if (p_.loss >= 0) keep.insert(p_.loss);
    for (const auto& [n, b] : p_.gradients) keep.insert(b);
    std::map<int, std::size_t> last;  // buffer -> index of its last use (read or write)
    for (std::size_t k = 0; k < tmpl_.size(); ++k) {
      for (int b : tmpl_[k].in) last[b] = k;
      for (int b : tmpl_[k].out) last[b] = std::max(last[b], k);
    }
    std::vector<std::vector<int>> frees(tmpl_.size());
    for (auto [b, k] : last)
      if (!keep.count(b)) frees[k].push_back(b);
    std::vector<Instr> out;
    for (std::size_t k = 0; k < tmpl_.size(); ++k) {
      out.push_back(tmpl_[k]);
      if (frees[k].empty()) continue;
      Instr f;
      f.kind = InstrKind::Free;
      f.in = frees[k];
      out.push_back(std::move(f));
    }
    tmpl_ = std::move(out);
  }

  // Every rank runs the template; a collective's group is the rank's group along its axis.
  void instantiate() {
    const auto& ids = mesh_.device_ids();
    std::map<int, int> rank_of;
    StageMesh sm;
    sm.shape = mesh_.shape();
    sm.replicas = opt_.replicas;
    sm.microbatches = opt_.microbatches;
    sm.microbatch_size = g_.tensors().empty() ? 0 : batch_of(g_);
    for (std::size_t r = 0; r < ids.size(); ++r) {
      rank_of[ids[r]] = static_cast<int>(r);
      sm.ranks.push_back(static_cast<int>(r));
    }
    p_.stages = {sm};
    for (std::size_t r = 0; r < ids.size(); ++r) {
      RankProgram rp;
      rp.rank = static_cast<int>(r);
      rp.device = ids[r];
      rp.coord = mesh_.coord_of(ids[r]);
      rp.instrs = tmpl_;
      for (auto& i : rp.instrs)
        if (is_collective(i.kind))
          for (int d : mesh_.group_along(rp.coord, i.axis)) i.group.push_back(rank_of.at(d));
      p_.ranks.push_back(std::move(rp));
    }
  }

  static std::int64_t batch_of(const ir::Graph& g) {
    for (const auto& t : g.tensors())
      if (t.role == ir::Role::Input && t.producer == ir::kNoOp && t.rank() >= 1) return t.shape[0];
    return 0;
  }

  const ir::Graph& g_;
  const cluster::DeviceMesh& mesh_;
  const SpmdLayout& layout_;
  StageOptions opt_;
  int lead_ = 0;  // 1 when the mesh has a replica axis
  std::vector<std::int64_t> spmd_shape_;
  std::vector<cluster::AxisLink> links_;
  std::map<int, sharding::ReshardPlanner> planners_;
  Program p_;
  std::vector<ShardingSpec> specs_;  // per buffer
  std::map<ir::TensorId, std::vector<std::pair<ShardingSpec, int>>> layouts_;
  std::set<std::string> names_;
  std::vector<Instr> tmpl_;
};

}  // namespace

std::vector<std::pair<ir::TensorId, ir::TensorId>> state_carries(const ir::Graph& g) {
  std::set<ir::TensorId> outs(g.outputs().begin(), g.outputs().end());
  std::vector<std::pair<ir::TensorId, ir::TensorId>> carries;
  for (const auto& op : g.ops()) {
    std::vector<ir::TensorId> states;
    for (ir::TensorId t : op.inputs)
      if (is_state_leaf(g.tensor(t))) states.push_back(t);
    std::size_t k = 0;
    for (std::size_t i = 0; i < op.outputs.size() && k < states.size(); ++i) {
      const ir::TensorId out = op.outputs[i];
      if (!outs.count(out) || g.tensor(out).shape != g.tensor(states[k]).shape) continue;
      carries.emplace_back(out, states[k]);
      ++k;
    }
  }
  return carries;
}

SpmdLayout layout_of(const ir::Graph& g, const spmd::SpmdPlan& plan) {
  SpmdLayout l;
  for (const auto& s : plan.op_strategies) l.op_axes.push_back(s.axes);
  for (ir::TensorId t = 0; t < static_cast<ir::TensorId>(g.tensors().size()); ++t)
    if (g.tensor(t).producer == ir::kNoOp && t < static_cast<ir::TensorId>(plan.tensor_specs.size()) &&
        plan.tensor_specs[static_cast<std::size_t>(t)])
      l.leaf_specs.emplace(t, *plan.tensor_specs[static_cast<std::size_t>(t)]);
  return l;
}

Program lower_spmd(const ir::Graph& g, const cluster::Cluster& cluster, const cluster::DeviceMesh& mesh,
                   const SpmdLayout& layout, const StageOptions& options) {
  return StageLowering(g, cluster, mesh, layout, options).run();
}

}  // namespace weft::lower
