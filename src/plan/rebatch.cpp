// Rebatching a graph (see rebatch.hpp): new leaf shapes, then every op in topological order
// re-derived from its operands' new shapes by its rule; the result is validated as a whole.
#include "weft/plan/rebatch.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "weft/core/error.hpp"
#include "weft/ir/op_rules.hpp"

namespace weft::plan {

std::int64_t batch_size(const ir::Graph& g) {
  std::int64_t b = -1;
  for (const auto& t : g.tensors()) {
    if (t.role != ir::Role::Input || t.producer != ir::kNoOp || t.rank() < 1) continue;
    if (b < 0) b = t.shape[0];
    WEFT_CHECK(t.shape[0] == b,
               "batch_size: graph '{}' has inputs with different leading sizes ({} and {} of '{}')", g.name(),
               b, t.shape[0], t.name);
  }
  WEFT_CHECK(b >= 1, "batch_size: graph '{}' has no Input tensor with a batch dimension", g.name());
  return b;
}

ir::Graph rebatch(const ir::Graph& g, std::int64_t nb) {
  WEFT_CHECK(nb >= 1, "rebatch: the new batch must be >= 1 (got {})", nb);
  const std::int64_t B = batch_size(g);
  if (nb == B) return g;
  std::vector<ir::TensorInfo> ts = g.tensors();
  for (auto& t : ts) {
    if (t.producer != ir::kNoOp || t.rank() < 1 || t.shape[0] != B) continue;
    if (t.role == ir::Role::Input || t.role == ir::Role::Activation || t.role == ir::Role::Gradient)
      t.shape[0] = nb;
  }
  std::vector<ir::Op> ops = g.ops();
  for (ir::OpId o : g.topo_order()) {
    auto& op = ops[o];
    const auto& old_op = g.op(o);
    std::vector<ir::Shape> in;
    std::vector<DType> dt;
    bool batch_changed = false;
    for (ir::TensorId t : op.inputs) {
      in.push_back(ts[t].shape);
      dt.push_back(ts[t].dtype);
      const auto& old = g.tensor(t).shape;
      if (!old.empty() && old[0] == B && ts[t].shape[0] == nb) batch_changed = true;
    }
    auto& ints = op.attrs.ints;
    const bool shape_attr =
        op.kind == ir::OpKind::Reshape || op.kind == ir::OpKind::BroadcastTo || op.kind == ir::OpKind::Opaque;
    if (shape_attr && !ints.empty() && ints[0] == B) {
      const bool inserts_dim0 =
          op.kind == ir::OpKind::BroadcastTo &&
          std::find(op.attrs.axes.begin(), op.attrs.axes.end(), 0) != op.attrs.axes.end();
      if (batch_changed || inserts_dim0) ints[0] = nb;
    }
    // A forward sum over the batch (a batch statistic, or a loss summed over the batch) has no exact
    // split: a plan sums each part's gradients with weight 1/parts (the mean over the step), which
    // is right for means only. Refused, saying what to write instead.
    if (op.kind == ir::OpKind::Reduce && op.attrs.reduce == ir::ReduceFn::Sum && batch_changed &&
        g.tensor(op.outputs[0]).role == ir::Role::Activation &&
        std::find(op.attrs.axes.begin(), op.attrs.axes.end(), 0) != op.attrs.axes.end())
      fail(
          "rebatch: graph '{}' cannot change batch {} -> {}: op '{}' sums over the batch (a batch statistic, "
          "or a "
          "loss summed over the batch); a split batch computes means exactly — write a summed loss as its "
          "mean times "
          "the batch size (weft.from_torch does so for a sum to a scalar)",
          g.name(), B, nb, old_op.name);
    // A mean's gradient scale (autodiff: 1/count of tensor ints[0] over axes) counts the new batch.
    if (op.kind == ir::OpKind::Unary && op.attrs.unary == ir::UnaryFn::Scale && ints.size() == 1 &&
        !op.attrs.axes.empty() && ints[0] >= 0 && ints[0] < static_cast<std::int64_t>(ts.size())) {
      const auto& xs = ts[static_cast<std::size_t>(ints[0])].shape;
      std::int64_t count = 1;
      for (int ax : op.attrs.axes)
        if (ax >= 0 && ax < static_cast<int>(xs.size())) count *= xs[static_cast<std::size_t>(ax)];
      op.attrs.scalar = 1.0 / static_cast<double>(count);
    }
    // A dropout over the batch keys its mask by the sample's place in the whole step (the executor
    // adds the micro-batch's and replica's offset), so a micro-batch draws the mask the full batch would.
    if (op.kind == ir::OpKind::Dropout && batch_changed) op.attrs.axes = {0};
    ir::OpSignature sig;
    try {
      sig = ir::derive_signature(op.kind, op.attrs, in, dt, op.name);
    } catch (const Error& e) {
      fail("rebatch: graph '{}' cannot change batch {} -> {} at op '{}': {}", g.name(), B, nb, old_op.name,
           e.what());
    }
    WEFT_CHECK(sig.output_shapes.size() == op.outputs.size(), "rebatch: op '{}' changed its result count",
               op.name);
    for (std::size_t i = 0; i < op.outputs.size(); ++i) ts[op.outputs[i]].shape = sig.output_shapes[i];
    op.index_map = std::move(sig.index_map);
  }
  ir::Graph out(g.name());
  for (auto& t : ts) out.add_tensor_unchecked(std::move(t));
  for (auto& op : ops) out.add_op_unchecked(std::move(op));
  for (ir::TensorId t : g.outputs()) out.mark_output(t);
  if (g.loss()) out.set_loss(*g.loss());
  for (ir::TensorId t = 0; t < static_cast<ir::TensorId>(g.tensors().size()); ++t)
    if (auto of = g.grad_of(t)) out.set_grad_of(t, *of);
  // The values the model carries (parameters, buffers, constants: none of them batch-sized).
  for (const auto& [t, v] : g.values()) out.set_value(t, v);
  out.set_seed_parameters(g.seed_parameters());
  try {
    out.validate();
  } catch (const Error& e) {
    fail("rebatch: graph '{}' at batch {} does not validate: {}", g.name(), nb, e.what());
  }
  return out;
}

}  // namespace weft::plan
