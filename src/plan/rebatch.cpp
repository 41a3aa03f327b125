// Rebatching a graph (see rebatch.hpp): where the batch lies in every tensor (followed through the
// index maps), new leaf shapes, the shape attributes that carry the batch scaled, then every op in
// topological order re-derived from its operands' new shapes by its rule; the result is validated
// as a whole.
#include "weft/plan/rebatch.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <utility>

#include "weft/core/error.hpp"
#include "weft/ir/op_rules.hpp"

namespace weft::plan {

namespace {

bool batch_leaf_role(ir::Role r) {
  return r == ir::Role::Input || r == ir::Role::Activation || r == ir::Role::Gradient;
}

std::string_view role_word(ir::Role r) {
  switch (r) {
    case ir::Role::Parameter: return "Parameter";
    case ir::Role::Constant: return "Constant";
    default: return "state";
  }
}

// The factor of dim `d` that holds the batch (B samples, `inner` the product of the sizes minor to
// it in the dim), and the product of the sizes minor to the batch within that factor; factor -1
// when the batch straddles two factors (a reshape that splits it, [8·N] -> [4, 2·N]).
std::pair<int, std::int64_t> factor_of_batch(const ir::IndexMap& m, const ir::DimFactors& d,
                                             std::int64_t inner, std::int64_t B) {
  std::int64_t lo = 1;  // product of the sizes of the factors minor to d[p]
  for (std::size_t p = d.size(); p-- > 0;) {
    const std::int64_t hi = lo * m.factors[static_cast<std::size_t>(d[p])].size;
    if (inner >= lo && inner % lo == 0 && inner * B <= hi && hi % (inner * B) == 0) return {d[p], inner / lo};
    lo = hi;
  }
  return {-1, 0};
}

std::int64_t minor_product(const ir::IndexMap& m, const ir::DimFactors& d, int pos) {
  std::int64_t p = 1;
  for (std::size_t k = static_cast<std::size_t>(pos) + 1; k < d.size(); ++k)
    p *= m.factors[static_cast<std::size_t>(d[k])].size;
  return p;
}

// Batch 1 has no batch factor to follow (a size-1 dim carries none): dim 0 of the batch leaves,
// and of every result of size 1 in dim 0 made from a batch operand or inserted by a broadcast,
// is taken to be the batch.
std::vector<BatchDim> leading_dims(const ir::Graph& g) {
  std::vector<BatchDim> bd(g.tensors().size());
  for (ir::TensorId t = 0; t < static_cast<ir::TensorId>(bd.size()); ++t) {
    const auto& ti = g.tensor(t);
    if (ti.producer == ir::kNoOp && ti.rank() >= 1 && ti.shape[0] == 1 && batch_leaf_role(ti.role))
      bd[t].dim = 0;
  }
  for (ir::OpId o : g.topo_order()) {
    const auto& op = g.op(o);
    bool from_batch =
        std::any_of(op.inputs.begin(), op.inputs.end(), [&](ir::TensorId t) { return bd[t].dim == 0; });
    from_batch |= op.kind == ir::OpKind::BroadcastTo &&
                  std::find(op.attrs.axes.begin(), op.attrs.axes.end(), 0) != op.attrs.axes.end();
    if (!from_batch) continue;
    for (ir::TensorId t : op.outputs)
      if (g.tensor(t).rank() >= 1 && g.tensor(t).shape[0] == 1) bd[t].dim = 0;
  }
  return bd;
}

// The scale autodiff puts on a mean's gradient, 1 / (elements averaged), is a literal: where the
// mean averages over the batch (the scale feeds only broadcasts that insert the batch, and it is
// 1 / the inserted size) the micro-batch averages over its own samples, as the lowering assumes
// when it scales each micro-batch's gradient by 1 / (M·d). Returns the new scale, or the old one.
double mean_gradient_scale(const ir::Graph& g, const ir::Op& op,
                           const std::vector<std::vector<ir::OpId>>& readers, const std::vector<BatchDim>& bd,
                           std::int64_t B, std::int64_t nb) {
  const double s = op.attrs.scalar;
  if (op.kind != ir::OpKind::Unary || op.attrs.unary != ir::UnaryFn::Scale || op.outputs.size() != 1 ||
      g.tensor(op.outputs[0]).role != ir::Role::Gradient || readers[op.outputs[0]].empty())
    return s;
  std::int64_t averaged = 0;
  for (ir::OpId r : readers[op.outputs[0]]) {
    const ir::Op& b = g.op(r);
    if (b.kind != ir::OpKind::BroadcastTo) return s;
    const auto& ys = g.tensor(b.outputs[0]).shape;
    const BatchDim yb = bd[b.outputs[0]];
    std::int64_t count = 1;
    bool batch_inserted = false;
    for (int a : b.attrs.axes) {
      const int ax = a < 0 ? a + static_cast<int>(ys.size()) : a;
      count *= ys[static_cast<std::size_t>(ax)];
      batch_inserted |= ax == yb.dim;
    }
    if (!batch_inserted || std::abs(s * static_cast<double>(count) - 1.0) > 1e-12) return s;
    averaged = count;
  }
  return 1.0 / static_cast<double>(averaged / B * nb);  // as autodiff computes it at the new batch
}

}  // namespace

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

std::vector<BatchDim> batch_dims(const ir::Graph& g) {
  const std::int64_t B = batch_size(g);
  if (B == 1) return leading_dims(g);
  const auto n = static_cast<ir::TensorId>(g.tensors().size());
  std::vector<BatchDim> bd(static_cast<std::size_t>(n));
  std::vector<std::vector<ir::OpId>> readers(static_cast<std::size_t>(n));
  for (ir::OpId o = 0; o < static_cast<ir::OpId>(g.ops().size()); ++o)
    for (ir::TensorId t : g.op(o).inputs) readers[t].push_back(o);
  std::deque<ir::TensorId> work;
  for (ir::TensorId t = 0; t < n; ++t) {
    const auto& ti = g.tensor(t);
    if (ti.producer == ir::kNoOp && ti.rank() >= 1 && ti.shape[0] == B && batch_leaf_role(ti.role)) {
      bd[t] = {0, 1};
      work.push_back(t);
    }
  }
  // t gets the batch at `want` from op o (a union of places: the batch of a tensor is one place).
  auto place = [&](ir::TensorId t, BatchDim want, const ir::Op& o) {
    const auto& ti = g.tensor(t);
    if (bd[t].dim >= 0) {
      WEFT_CHECK(bd[t] == want, "the batch reaches '{}' {} in two places (dim {} and dim {}) through op '{}'",
                 ti.name, ti.shape, bd[t].dim, want.dim, o.name);
      return;
    }
    WEFT_CHECK(ti.producer != ir::kNoOp || batch_leaf_role(ti.role),
               "op '{}' needs the batch in dim {} of {} leaf '{}' {}: a batch-sized {} holds values per "
               "sample, which a micro-batch cannot cut from the graph",
               o.name, want.dim, role_word(ti.role), ti.name, ti.shape, role_word(ti.role));
    bd[t] = want;
    work.push_back(t);
  };
  auto visit = [&](ir::OpId o) {
    const ir::Op& op = g.op(o);
    const ir::IndexMap& m = op.index_map;
    auto slot = [&](bool out, int k) {
      return out ? op.outputs[static_cast<std::size_t>(k)] : op.inputs[static_cast<std::size_t>(k)];
    };
    auto dims = [&](bool out, int k) -> const std::vector<ir::DimFactors>& {
      return out ? m.outputs[static_cast<std::size_t>(k)] : m.inputs[static_cast<std::size_t>(k)];
    };
    if (op.kind ==
        ir::OpKind::Opaque) {  // fresh factors: an opaque result of leading size B follows its operands
      const bool from_batch = std::any_of(op.inputs.begin(), op.inputs.end(),
                                          [&](ir::TensorId t) { return bd[t] == BatchDim{0, 1}; });
      if (from_batch && !op.attrs.ints.empty() && op.attrs.ints[0] == B) place(op.outputs[0], {0, 1}, op);
      return;
    }
    for (bool out : {false, true}) {
      const int count = static_cast<int>(out ? op.outputs.size() : op.inputs.size());
      for (int k = 0; k < count; ++k) {
        const BatchDim b = bd[slot(out, k)];
        if (b.dim < 0) continue;
        const auto& td = dims(out, k).at(static_cast<std::size_t>(b.dim));
        auto [f, off] = factor_of_batch(m, td, b.inner, B);
        WEFT_CHECK(f >= 0, "op '{}' splits the batch of '{}' {} (dim {}) over two factors", op.name,
                   g.tensor(slot(out, k)).name, g.tensor(slot(out, k)).shape, b.dim);
        for (const auto& u : m.uses(f)) {
          const auto& ud = dims(u.output, u.tensor)[static_cast<std::size_t>(u.dim)];
          place(slot(u.output, u.tensor), {u.dim, minor_product(m, ud, u.pos) * off}, op);
        }
      }
    }
  };
  while (!work.empty()) {
    const ir::TensorId t = work.front();
    work.pop_front();
    if (g.tensor(t).producer != ir::kNoOp) visit(g.tensor(t).producer);
    for (ir::OpId o : readers[t]) visit(o);
  }
  return bd;
}

// A mean over the batch is exact under a split batch only where the loss is linear in it: the
// parts' means, weighted by their shares (as a plan sums the parts' gradients), make the whole
// batch's. Every forward reader on the way from `t` to the loss must be linear in its operand: an
// add or subtraction, a negation or scale, a product or quotient with a leaf (a parameter or
// constant), a reshape, transpose or broadcast, a further sum or mean. Returns the first reader
// that is not (a square, a product of two activations, a softmax...), or nullptr.
const ir::Op* nonlinear_reader(const ir::Graph& g, const std::vector<std::vector<ir::OpId>>& readers,
                               ir::TensorId t) {
  std::vector<ir::TensorId> todo{t};
  std::vector<char> seen(g.tensors().size(), 0);
  while (!todo.empty()) {
    const ir::TensorId x = todo.back();
    todo.pop_back();
    if (seen[x]) continue;
    seen[x] = 1;
    for (ir::OpId r : readers[x]) {
      const ir::Op& op = g.op(r);
      if (op.outputs.size() != 1 || g.tensor(op.outputs[0]).role != ir::Role::Activation)
        continue;  // backward
      bool linear = false;
      switch (op.kind) {
        case ir::OpKind::Reshape:
        case ir::OpKind::Transpose:
        case ir::OpKind::BroadcastTo: linear = true; break;
        case ir::OpKind::Reduce: linear = op.attrs.reduce != ir::ReduceFn::Max; break;
        case ir::OpKind::Unary:
          linear = op.attrs.unary == ir::UnaryFn::Identity || op.attrs.unary == ir::UnaryFn::Neg ||
                   op.attrs.unary == ir::UnaryFn::Scale;
          break;
        case ir::OpKind::Binary:
          if (op.attrs.binary == ir::BinaryFn::Add || op.attrs.binary == ir::BinaryFn::Sub) {
            linear = true;
          } else if (op.attrs.binary == ir::BinaryFn::Mul ||
                     (op.attrs.binary == ir::BinaryFn::Div && op.inputs.size() == 2 && op.inputs[0] == x)) {
            // by a leaf only: a product of two activations (x · x included) is not linear in either
            linear = std::count(op.inputs.begin(), op.inputs.end(), x) == 1;
            for (ir::TensorId in : op.inputs)
              if (in != x && g.tensor(in).producer != ir::kNoOp) linear = false;
          }
          break;
        default: break;
      }
      if (!linear) return &op;
      todo.push_back(op.outputs[0]);
    }
  }
  return nullptr;
}

ir::Graph rebatch(const ir::Graph& g, std::int64_t nb) {
  WEFT_CHECK(nb >= 1, "rebatch: the new batch must be >= 1 (got {})", nb);
  const std::int64_t B = batch_size(g);
  if (nb == B) return g;
  std::vector<BatchDim> bd;
  try {
    bd = batch_dims(g);
  } catch (const Error& e) {
    fail("rebatch: graph '{}' cannot change batch {} -> {}: {}", g.name(), B, nb, e.what());
  }
  auto scaled = [&](std::int64_t size) { return size / B * nb; };
  auto rebatched_shape = [&](ir::TensorId t) {
    ir::Shape s = g.tensor(t).shape;
    if (bd[t].dim >= 0)
      s[static_cast<std::size_t>(bd[t].dim)] = scaled(s[static_cast<std::size_t>(bd[t].dim)]);
    return s;
  };
  std::vector<ir::TensorInfo> ts = g.tensors();
  for (ir::TensorId t = 0; t < static_cast<ir::TensorId>(ts.size()); ++t)
    if (ts[t].producer == ir::kNoOp) ts[t].shape = rebatched_shape(t);
  std::vector<std::vector<ir::OpId>> readers(ts.size());
  for (ir::OpId o = 0; o < static_cast<ir::OpId>(g.ops().size()); ++o)
    for (ir::TensorId t : g.op(o).inputs) readers[t].push_back(o);
  std::vector<ir::Op> ops = g.ops();
  for (ir::OpId o : g.topo_order()) {
    auto& op = ops[o];
    const auto& old_op = g.op(o);
    auto cannot = [&](const std::string& why) {
      fail("rebatch: graph '{}' cannot change batch {} -> {} at op '{}': {}", g.name(), B, nb, old_op.name,
           why);
    };
    std::vector<ir::Shape> in;
    std::vector<DType> dt;
    for (ir::TensorId t : op.inputs) {
      in.push_back(ts[t].shape);
      dt.push_back(ts[t].dtype);
    }
    const BatchDim in0 = op.inputs.empty() ? BatchDim{} : bd[op.inputs[0]];
    const BatchDim out0 = op.outputs.empty() ? BatchDim{} : bd[op.outputs[0]];
    auto axis = [&](const ir::Shape& s) {
      const int a = op.attrs.axes.at(0);
      return a < 0 ? a + static_cast<int>(s.size()) : a;
    };
    switch (op.kind) {
      case ir::OpKind::Reshape:
      case ir::OpKind::BroadcastTo:
      case ir::OpKind::Opaque: {
        // The target shape is an attribute: its batch dim (a literal B, or B·N) is scaled with the batch.
        auto& ints = op.attrs.ints;
        if (out0.dim >= 0 && out0.dim < static_cast<int>(ints.size()) &&
            ints[static_cast<std::size_t>(out0.dim)] > 0)
          ints[static_cast<std::size_t>(out0.dim)] = scaled(ints[static_cast<std::size_t>(out0.dim)]);
        break;
      }
      case ir::OpKind::Unary:
        if (op.attrs.unary == ir::UnaryFn::Scale && op.attrs.ints.size() == 1 && !op.attrs.axes.empty() &&
            op.attrs.ints[0] >= 0 && op.attrs.ints[0] < static_cast<std::int64_t>(ts.size())) {
          // A mean's gradient scale as autodiff records it (1/count of tensor ints[0] over axes): recounted.
          const auto& xs = ts[static_cast<std::size_t>(op.attrs.ints[0])].shape;
          std::int64_t count = 1;
          for (int ax : op.attrs.axes)
            if (ax >= 0 && ax < static_cast<int>(xs.size())) count *= xs[static_cast<std::size_t>(ax)];
          op.attrs.scalar = 1.0 / static_cast<double>(count);
        } else {  // a graph saved before autodiff recorded it: recognised by its shape
          op.attrs.scalar = mean_gradient_scale(g, old_op, readers, bd, B, nb);
        }
        break;
      case ir::OpKind::Slice:
      case ir::OpKind::Pad:
        // Which samples a slice keeps is not a property of the micro-batch.
        if (in0.dim >= 0 && in0.dim == axis(g.tensor(op.inputs[0]).shape))
          cannot(fmt::format("it {} along the batch (dim {})",
                             op.kind == ir::OpKind::Slice ? "slices" : "pads", in0.dim));
        break;
      case ir::OpKind::Dropout:
        // A dropout over the batch keys its mask by the sample's place in the whole step (the executor
        // adds the micro-batch's and replica's offset to dim 0), so a micro-batch draws the mask the
        // full batch would; that offset is only right where dim 0 is the batch alone.
        if (in0.dim >= 0) {
          if (!(in0 == BatchDim{0, 1}))
            cannot(
                fmt::format("its operand holds the batch in dim {} (inner size {}), not as its leading dim, "
                            "and the mask is keyed by the leading dim",
                            in0.dim, in0.inner));
          op.attrs.axes = {0};
        }
        break;
      default: break;
    }
    // A forward sum over the batch (a batch statistic, or a loss summed over the batch) has no exact
    // split: a plan sums each part's gradients with weight 1/parts (the mean over the step), which
    // is right for means only. Refused, saying what to write instead.
    if (op.kind == ir::OpKind::Reduce && op.attrs.reduce != ir::ReduceFn::Max && in0.dim >= 0 &&
        g.tensor(op.outputs[0]).role == ir::Role::Activation) {
      const int r = static_cast<int>(g.tensor(op.inputs[0]).shape.size());
      bool over_batch = false;
      for (int a : op.attrs.axes) over_batch = over_batch || (a < 0 ? a + r : a) == in0.dim;
      if (over_batch && op.attrs.reduce == ir::ReduceFn::Sum)
        cannot(
            "it sums over the batch (a batch statistic, or a loss summed over the batch); a split batch "
            "computes means exactly: write a summed loss as its mean times the batch size "
            "(weft.from_torch does so for a sum to a scalar)");
      if (over_batch)
        if (const ir::Op* nl = nonlinear_reader(g, readers, old_op.outputs[0]))
          cannot(
              fmt::format("it averages over the batch and '{}' ({}) reads the mean non-linearly: a batch "
                          "statistic (a load-balancing loss, batch norm) differs between a micro-batch and "
                          "the whole batch, so the batch must stay whole",
                          nl->name, ir::op_kind_name(nl->kind)));
    }
    ir::OpSignature sig;
    try {
      sig = ir::derive_signature(op.kind, op.attrs, in, dt, op.name);
    } catch (const Error& e) {
      cannot(e.what());
    }
    WEFT_CHECK(sig.output_shapes.size() == op.outputs.size(), "rebatch: op '{}' changed its result count",
               op.name);
    for (std::size_t i = 0; i < op.outputs.size(); ++i) {
      const ir::TensorId t = op.outputs[i];
      // With B > 1 the batch of every result is known: a rule that derives another size has a batch
      // the analysis did not see (an attribute holding it that is not a shape target).
      if (B > 1 && bd[t].dim >= 0 && sig.output_shapes[i] != rebatched_shape(t))
        cannot(fmt::format("its result '{}' comes out {} where the batch analysis expects {}", ts[t].name,
                           sig.output_shapes[i], rebatched_shape(t)));
      ts[t].shape = sig.output_shapes[i];
    }
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

std::string rebatch_obstacle(const ir::Graph& g, std::int64_t new_batch) {
  try {
    (void)rebatch(g, new_batch);
  } catch (const Error& e) {
    std::string s = e.what();
    if (s.rfind("rebatch: ", 0) == 0) s.erase(0, 9);
    return s;
  }
  return {};
}

}  // namespace weft::plan
