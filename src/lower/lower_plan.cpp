// Lowering of a plan::Plan (see lower.hpp): the stage layouts the planner recorded, on the
// per-micro-batch graph it costed them on.
#include <fmt/format.h>
#include <algorithm>
#include <fmt/ranges.h>

#include "weft/core/error.hpp"
#include "weft/lower/lower.hpp"
#include "weft/plan/rebatch.hpp"

namespace weft::lower {

Program lower(const plan::Plan& plan, const ir::Graph& step, const cluster::Cluster& cluster) {
  WEFT_CHECK(!plan.stages.empty(), "lower: the plan has no stages");
  for (const auto& st : plan.stages)
    WEFT_CHECK(!st.op_layouts.empty(),
               "lower: stage {} of the plan has no op layouts (a plan made before lowering existed): plan it again "
               "with this version of weft",
               st.index);
  // Equal replica shares are ordinary data parallelism.
  const bool even_shares =
      std::all_of(plan.replica_microbatch.begin(), plan.replica_microbatch.end(),
                  [&](std::int64_t s) { return s == plan.microbatch_size; });
  WEFT_CHECK(plan.num_stages() == 1 && even_shares && plan.split_fraction.empty(),
             "lower: only one-stage plans are lowered so far (SPMD with data-parallel replicas and micro-batches); "
             "this plan has {} stages{}{} (pipelines with their schedules, uneven replica shares and the uneven "
             "split are the next lowering steps)",
             plan.num_stages(), even_shares ? "" : ", uneven replica shares",
             plan.split_fraction.empty() ? "" : ", an uneven tensor split");
  WEFT_CHECK(plan.model == step.name(), "lower: the plan is for model '{}', the step graph is '{}'", plan.model,
             step.name());
  const std::int64_t batch = plan::batch_size(step);
  WEFT_CHECK(plan.global_batch() == batch, "lower: the plan is for a global batch of {}, the step graph has {}",
             plan.global_batch(), batch);
  const ir::Graph g = plan.microbatch_size == batch ? step : plan::rebatch(step, plan.microbatch_size);
  const plan::Stage& st = plan.stages[0];
  cluster::DeviceMesh mesh(st.mesh_shape, st.devices);
  for (int d : st.devices)
    WEFT_CHECK(d >= 0 && d < cluster.num_devices(), "lower: the plan uses device {}, the cluster has {} devices", d,
               cluster.num_devices());
  SpmdLayout layout;
  layout.op_axes.assign(g.ops().size(), {});
  std::vector<char> seen(g.ops().size(), 0);
  std::map<std::string, ir::OpId> op_id;
  for (ir::OpId o = 0; o < static_cast<ir::OpId>(g.ops().size()); ++o) op_id[g.op(o).name] = o;
  for (const auto& l : st.op_layouts) {
    auto it = op_id.find(l.op);
    WEFT_CHECK(it != op_id.end(), "lower: the plan lays out op '{}', which the step graph does not have", l.op);
    const std::size_t spmd_ndim = st.mesh_shape.size() - (plan.data_parallel > 1 ? 1 : 0);
    WEFT_CHECK(l.factors.size() == spmd_ndim && l.inner_strides.size() == spmd_ndim,
               "lower: op '{}' has {} axis assignments, the stage's SPMD mesh {} axes", l.op, l.factors.size(),
               spmd_ndim);
    auto& axes = layout.op_axes[static_cast<std::size_t>(it->second)];
    for (std::size_t a = 0; a < l.factors.size(); ++a) axes.push_back({l.factors[a], l.inner_strides[a]});
    seen[static_cast<std::size_t>(it->second)] = 1;
  }
  for (ir::OpId o = 0; o < static_cast<ir::OpId>(g.ops().size()); ++o)
    WEFT_CHECK(seen[static_cast<std::size_t>(o)], "lower: the plan has no layout for op '{}'", g.op(o).name);
  const std::vector<std::int64_t> spmd_shape(st.mesh_shape.begin() + (plan.data_parallel > 1 ? 1 : 0),
                                             st.mesh_shape.end());
  for (const auto& l : st.leaf_specs) {
    auto t = g.find_tensor(l.tensor);
    WEFT_CHECK(t.has_value(), "lower: the plan lays out tensor '{}', which the step graph does not have", l.tensor);
    layout.leaf_specs.emplace(*t, sharding::ShardingSpec::parse(l.spec, g.tensor(*t).shape, spmd_shape));
  }
  return lower_spmd(g, cluster, mesh, layout, {plan.data_parallel, plan.num_microbatches});
}

}  // namespace weft::lower
