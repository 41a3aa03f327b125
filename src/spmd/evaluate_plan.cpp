// The independent evaluator (evaluate_plan): a plan's layouts priced again from the op
// assignments and leaf specs alone — compute per op, every resharding the layouts imply (shared
// layouts made once, loop-carried results back to their leaves), the collectives and the peak
// memory — without the search's model or problem.
#include <fmt/format.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "search_model.hpp"
#include "weft/cluster/device_mesh.hpp"
#include "weft/core/error.hpp"
#include "weft/cost/memory.hpp"
#include "weft/cost/op_cost.hpp"
#include "weft/cost/view_ops.hpp"
#include "weft/sharding/reshard.hpp"
#include "weft/spmd/search.hpp"

namespace weft::spmd {

using sharding::ShardingSpec;
using namespace detail;

PlanEvaluation evaluate_plan(const ir::Graph& g, const cluster::Cluster& cl, const cluster::DeviceMesh& mesh,
                             const std::vector<std::vector<AxisAssign>>& op_axes,
                             const std::map<ir::TensorId, ShardingSpec>& leaf_specs,
                             const std::map<ir::TensorId, ShardingSpec>& shared_specs) {
  WEFT_CHECK(op_axes.size() == g.ops().size(), "evaluate_plan: {} op assignments for {} ops", op_axes.size(),
             g.ops().size());
  const auto device = mesh_device(cl, mesh);
  PlanEvaluation out;
  const std::vector<char> view = cost::view_ops(g);
  std::vector<OpStrategy> st;
  for (int o = 0; o < static_cast<int>(g.ops().size()); ++o) {
    auto s = make_strategy(g, g.op(o), mesh.shape(), op_axes[o]);
    WEFT_CHECK(s.has_value(), "evaluate_plan: assignment of op '{}' is not a valid strategy", g.op(o).name);
    out.compute_time +=
        cost::compute_time(g, g.op(o), device, s->factor_shards, view[o] != 0, s->factor_stride);
    st.push_back(std::move(*s));
  }
  std::vector<std::optional<ShardingSpec>> spec(g.tensors().size());
  for (int o = 0; o < static_cast<int>(g.ops().size()); ++o)
    for (int i = 0; i < static_cast<int>(g.op(o).outputs.size()); ++i)
      spec[g.op(o).outputs[i]] = st[o].outputs[i];
  for (const auto& [t, s] : leaf_specs) spec.at(t) = s;
  const auto links = cluster::axis_links(cl, mesh);
  auto charge = [&](ir::TensorId t, const ShardingSpec& from, const ShardingSpec& to, DType dt,
                    const std::string& what) {
    if (from == to) return;
    if (from.has_partial() && !to.has_partial()) out.partial_reductions.push_back(t);
    sharding::ReshardOptions ro;
    ro.strided_intermediates = false;
    const auto pl = sharding::reshard_on_mesh(from, to, links, dtype_size(dt), ro);
    out.comm_time += pl.time;
    for (const auto& step : pl.steps)
      if (step.time > 0 || step.kind == sharding::CollectiveKind::AllReduce)
        out.collectives[sharding::collective_name(step.kind)]++;
    if (pl.time > 0) out.edges.push_back(fmt::format("{}: {}", what, pl.to_string()));
  };
  // A shared layout is made once; the readers that need exactly it read it for free.
  for (const auto& [t, a] : shared_specs) {
    WEFT_CHECK(t >= 0 && t < static_cast<ir::TensorId>(spec.size()) && spec[t].has_value(),
               "evaluate_plan: shared layout of unknown or unused tensor {}", t);
    charge(t, *spec[t], a, g.tensor(t).dtype,
           fmt::format("{} -> shared {}", g.tensor(t).name, a.to_string()));
  }
  auto read = [&](ir::TensorId t, const ShardingSpec& to, DType dt, const std::string& what) {
    if (auto it = shared_specs.find(t); it != shared_specs.end() && it->second == to) return;
    charge(t, *spec[t], to, dt, what);
  };
  for (int o = 0; o < static_cast<int>(g.ops().size()); ++o) {
    const auto& op = g.op(o);
    for (int i = 0; i < static_cast<int>(op.inputs.size()); ++i) {
      const ir::TensorId t = op.inputs[i];
      WEFT_CHECK(spec[t].has_value(), "evaluate_plan: leaf tensor '{}' has no spec", g.tensor(t).name);
      read(t, st[o].inputs[i], g.tensor(t).dtype, fmt::format("{} -> {}", g.tensor(t).name, op.name));
    }
  }
  for (const auto& [t, leaf] : carried_results(g))
    read(t, *spec[leaf], g.tensor(leaf).dtype,
         fmt::format("{} -> next step {}", g.tensor(t).name, g.tensor(leaf).name));
  std::vector<double> bytes(g.tensors().size(), 0.0);
  for (std::size_t t = 0; t < bytes.size(); ++t)
    bytes[t] =
        spec[t] ? spec_bytes(*spec[t], g.tensors()[t].dtype) : static_cast<double>(g.tensors()[t].bytes());
  out.peak_memory = cost::peak_memory(cost::liveness(g), bytes).first;
  out.cost = out.compute_time + out.comm_time;
  return out;
}

PlanEvaluation evaluate_plan(const ir::Graph& g, const cluster::Cluster& cl, const cluster::DeviceMesh& mesh,
                             const SpmdPlan& plan) {
  std::vector<std::vector<AxisAssign>> axes;
  for (const auto& s : plan.op_strategies) axes.push_back(s.axes);
  std::map<ir::TensorId, ShardingSpec> leaves, shared;
  for (ir::TensorId t = 0; t < static_cast<ir::TensorId>(g.tensors().size()); ++t) {
    if (g.tensor(t).producer == ir::kNoOp && plan.tensor_specs.at(t))
      leaves.emplace(t, *plan.tensor_specs[t]);
    if (static_cast<std::size_t>(t) < plan.shared_specs.size() && plan.shared_specs[t])
      shared.emplace(t, *plan.shared_specs[t]);
  }
  return evaluate_plan(g, cl, mesh, axes, leaves, shared);
}

}  // namespace weft::spmd
