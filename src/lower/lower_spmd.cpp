// One SPMD stage lowered as a pipeline of one stage (lower_pipeline.cpp), and the helpers both use.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <set>

#include "weft/core/error.hpp"
#include "weft/lower/lower.hpp"
#include "weft/ir/autodiff.hpp"
#include "weft/pipeline/grouping.hpp"
#include "weft/sharding/reshard.hpp"

namespace weft::lower {

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
  PipelineStage stage{mesh, {}, layout};
  for (ir::OpId o = 0; o < static_cast<ir::OpId>(g.ops().size()); ++o) stage.ops.push_back(o);
  PipelineOptions po;
  po.replicas = options.replicas;
  po.microbatches = options.microbatches;
  po.grad_bucket_bytes = options.grad_bucket_bytes;
  return lower_pipeline(g, cluster, {stage}, {}, po);
}

}  // namespace weft::lower
