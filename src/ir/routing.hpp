#pragma once
// Private to src/ir: the routing ops (Gather, ScatterAdd, TopK — what MoE routers use), their
// rules and kernels in one place (routing.cpp); op_rules.cpp and kernels.cpp dispatch to them.
//
// Why one index map for all three: the routed axis (attrs.axes[0]) is data-dependent — which
// position an index names is known only at run time — so it is NeedReplication: a device holds it
// whole, and the kernel on a local tile is the global op on that tile. Every other dim is an
// ordinary parallel factor shared by data, index and result (they must be equal off the axis).
#include <string_view>
#include <vector>

#include "weft/ir/host_tensor.hpp"
#include "weft/ir/op.hpp"
#include "weft/ir/op_rules.hpp"

namespace weft::ir::routing {

// Rules (shapes, dtypes, index maps); weft::Error naming the op on a bad operand or attribute.
OpSignature gather_rule(const OpAttrs& a, const std::vector<Shape>& in, const std::vector<DType>& dt,
                        std::string_view op);
OpSignature scatter_add_rule(const OpAttrs& a, const std::vector<Shape>& in, const std::vector<DType>& dt,
                             std::string_view op);
OpSignature topk_rule(const OpAttrs& a, const std::vector<Shape>& in, const std::vector<DType>& dt,
                      std::string_view op);

// Kernels on f64 tiles (integer tensors hold integral doubles). `out_shape` is the local result
// shape. An index out of [0, axis size) is a weft::Error naming the op.
HostTensor gather(const Op& op, const HostTensor& x, const HostTensor& index);
HostTensor scatter_add(const Op& op, const HostTensor* base, const HostTensor& index, const HostTensor& src,
                       const Shape& out_shape);
std::vector<HostTensor> topk(const Op& op, const HostTensor& x);

}  // namespace weft::ir::routing
