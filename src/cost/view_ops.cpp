// Which layout-only ops are views (rules in view_ops.hpp).
#include "weft/cost/view_ops.hpp"

#include <set>

#include "weft/cost/op_cost.hpp"

namespace weft::cost {

std::vector<char> view_ops(const ir::Graph& g) {
  const int n = static_cast<int>(g.ops().size());
  std::vector<char> only_einsum_reads(g.tensors().size(), 1), read(g.tensors().size(), 0);
  for (const auto& op : g.ops())
    for (ir::TensorId t : op.inputs) {
      read[t] = 1;
      if (op.kind != ir::OpKind::Einsum) only_einsum_reads[t] = 0;
    }
  const std::set<ir::TensorId> outs(g.outputs().begin(), g.outputs().end());
  std::vector<char> view(n, 0);
  for (int o = 0; o < n; ++o) {
    const auto& op = g.op(o);
    switch (op.kind) {
      case ir::OpKind::Reshape: view[o] = 1; break;
      case ir::OpKind::Transpose: {
        const ir::TensorId y = op.outputs.at(0);
        view[o] = read[y] && only_einsum_reads[y] && !outs.count(y) ? 1 : 0;
        break;
      }
      case ir::OpKind::Slice: {
        const auto& shape = g.tensor(op.inputs.at(0)).shape;
        int axis = op.attrs.axes.at(0);
        if (axis < 0) axis += static_cast<int>(shape.size());
        bool contiguous = true;
        for (int d = 0; d < axis; ++d) contiguous = contiguous && shape[d] == 1;
        view[o] = contiguous ? 1 : 0;
        break;
      }
      default: break;
    }
  }
  return view;
}

double compute_time(const ir::Graph& g, const ir::Op& op, const cluster::DeviceSpec& device,
                    const std::vector<std::int64_t>& factor_shards, bool is_view,
                    const std::vector<std::int64_t>& factor_stride) {
  return is_view ? 0.0 : op_cost(g, op, device, factor_shards, factor_stride).time;
}

}  // namespace weft::cost
