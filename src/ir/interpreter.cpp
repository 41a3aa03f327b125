// Reference interpreter: runs every op of a graph in topological order with the kernels of
// kernels.cpp on whole tensors.
#include "weft/ir/interpreter.hpp"

#include <fmt/ranges.h>

#include "weft/core/error.hpp"
#include "weft/ir/kernels.hpp"
#include "weft/ir/precision.hpp"

namespace weft::ir {

std::int64_t HostTensor::numel() const {
  std::int64_t n = 1;
  for (auto s : shape) n *= s;
  return n;
}

std::vector<HostTensor> interpret(const Graph& g, const std::map<TensorId, HostTensor>& feeds) {
  g.validate();
  const auto& ts = g.tensors();
  std::vector<HostTensor> val(ts.size());
  std::vector<bool> have(ts.size(), false);
  for (const auto& [id, v] : feeds) {
    WEFT_CHECK(id >= 0 && id < static_cast<TensorId>(ts.size()), "feed for tensor id {} which does not exist",
               id);
    WEFT_CHECK(ts[id].producer == kNoOp, "feed for '{}' which op '{}' produces (only leaves are fed)",
               ts[id].name, g.op(ts[id].producer).name);
    WEFT_CHECK(v.shape == ts[id].shape, "feed for '{}' has shape {}, the tensor has {}", ts[id].name, v.shape,
               ts[id].shape);
    WEFT_CHECK(static_cast<std::int64_t>(v.data.size()) == v.numel(),
               "feed for '{}' has {} values for shape {}", ts[id].name, v.data.size(), v.shape);
    val[id] = v;
    have[id] = true;
  }
  // Every tensor at the precision its dtype asks for (precision.hpp): the interpreter runs the base
  // dtype in f64, an f32 region of an f64 model in f32.
  const DType base = base_float_dtype(g);
  auto held = [&](TensorId t) { return held_dtype(ts[static_cast<std::size_t>(t)].dtype, base, DType::F64); };
  for (TensorId t = 0; t < static_cast<TensorId>(ts.size()); ++t)
    if (have[static_cast<std::size_t>(t)]) round_to_dtype(val[static_cast<std::size_t>(t)], held(t));
  auto loss = g.loss();
  for (TensorId t = 0; t < static_cast<TensorId>(ts.size()); ++t) {
    if (ts[t].producer != kNoOp || have[t]) continue;
    bool seed = ts[t].role == Role::Constant && loss && g.grad_of(t) == loss && ts[t].shape.empty();
    WEFT_CHECK(seed, "no feed for {} '{}' (shape {})", role_name(ts[t].role), ts[t].name, ts[t].shape);
    val[t] = HostTensor{{}, {1.0}};
    have[t] = true;
  }
  for (OpId o : g.topo_order()) {
    const Op& op = g.op(o);
    std::vector<const HostTensor*> in;
    for (TensorId t : op.inputs) in.push_back(&val[t]);
    auto outs = run_kernel(g, op, in);
    WEFT_ASSERT(outs.size() == op.outputs.size(), "kernel result count");
    for (std::size_t i = 0; i < outs.size(); ++i) {
      WEFT_ASSERT(outs[i].shape == ts[op.outputs[i]].shape, "kernel result shape for op " + op.name);
      round_to_dtype(outs[i], held(op.outputs[i]));
      val[op.outputs[i]] = std::move(outs[i]);
    }
  }
  return val;
}

}  // namespace weft::ir
