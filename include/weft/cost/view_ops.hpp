#pragma once
// Layout-only ops that are views: they move no data, so the SPMD cost model charges them no
// compute (no HBM traffic, no launch). A kernel only reinterprets strides when
//   - a Reshape reads contiguous row-major data (every IR tensor is; a transpose that a reshape
//     reads is not a view itself, below, so it is materialised first);
//   - a Transpose's result is read only by Einsum ops (a GEMM takes a transposed operand through
//     its strides / transpose flag) and is not a graph output;
//   - a Slice cuts a contiguous block: every dimension before the sliced one has size 1.
// Everything else (Concat, Pad, BroadcastTo, the compute ops) writes new data.
#include <cstdint>
#include <vector>

#include "weft/cluster/cluster.hpp"
#include "weft/ir/graph.hpp"

namespace weft::cost {

// Per op id of g: 1 when the op is a view (rules above). Linear in the graph size.
std::vector<char> view_ops(const ir::Graph& g);

// The compute time the SPMD model charges an op under a factor split: 0 for a view, else the
// roofline time of cost::op_cost.
double compute_time(const ir::Graph& g, const ir::Op& op, const cluster::DeviceSpec& device,
                    const std::vector<std::int64_t>& factor_shards, bool is_view,
                    const std::vector<std::int64_t>& factor_stride = {});

}  // namespace weft::cost
