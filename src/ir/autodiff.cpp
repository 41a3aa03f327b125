// Reverse-mode autodiff. For a scalar loss L and an op y = f(x_1..x_k), the adjoint of each
// operand is dL/dx_i = (∂f/∂x_i)ᵀ · dL/dy, written with IR ops (the rules below, one per forward
// kind; docs/modules/ir.md lists them with their math). Ops are visited once in reverse
// topological order; a tensor read by several ops receives one contribution per use, summed with
// Binary Add when its producer is visited (all its consumers come later in topological order, so
// they are done by then). Only tensors that depend on a Parameter get gradients. Everything is
// linear in the graph size: no per-tensor scans of the op list.
#include "weft/ir/autodiff.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "weft/core/error.hpp"
#include "weft/ir/op_rules.hpp"

namespace weft::ir {
namespace {

class Backward {
 public:
  Backward(const Graph& fwd, Graph& g)
      : fwd_(fwd), g_(g), contrib_(fwd.tensors().size()), total_(fwd.tensors().size(), -1) {}

  // Runs the backward pass from `loss`; returns per forward tensor its total gradient (or -1).
  std::vector<TensorId> run(TensorId loss) {
    const auto& ts = fwd_.tensors();
    // needs[t]: t depends on a Parameter (forward reachability in topological order).
    needs_.assign(ts.size(), false);
    for (std::size_t t = 0; t < ts.size(); ++t)
      needs_[t] = ts[t].role == Role::Parameter && ts[t].producer == kNoOp && is_floating(ts[t].dtype);
    auto order = fwd_.topo_order();
    for (OpId o : order) {
      const Op& op = fwd_.op(o);
      bool any = false;
      for (TensorId t : op.inputs) any = any || needs_[t];
      for (TensorId t : op.outputs) needs_[t] = any && is_floating(ts[t].dtype);
    }
    if (!needs_[loss]) return total_;  // nothing to differentiate
    std::string seed_name = fresh_tensor_name("d:" + ts[loss].name);
    TensorId seed = g_.add_tensor({seed_name, {}, ts[loss].dtype, Role::Constant, kNoOp});
    g_.set_grad_of(seed, loss);
    contrib_[loss].push_back(seed);
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      const Op& op = fwd_.op(*it);
      bool any_in = false;
      for (TensorId t : op.inputs) any_in = any_in || needs_[t];
      if (!any_in) continue;
      std::vector<TensorId> dys;
      bool any_dy = false;
      for (TensorId t : op.outputs) {
        dys.push_back(finish(t));
        any_dy = any_dy || dys.back() >= 0;
      }
      if (!any_dy) continue;
      differentiate(op, dys);
    }
    for (std::size_t t = 0; t < ts.size(); ++t)
      if (ts[t].producer == kNoOp && needs_[t]) finish(static_cast<TensorId>(t));
    return total_;
  }

 private:
  const Graph& fwd_;
  Graph& g_;
  std::vector<std::vector<TensorId>> contrib_;
  std::vector<TensorId> total_;
  std::vector<bool> needs_;
  std::string base_;  // name prefix of the op being differentiated

  const TensorInfo& T(TensorId t) const { return g_.tensor(t); }

  std::string fresh_op_name(const std::string& base) {
    if (!g_.has_op_name(base)) return base;
    for (int i = 2;; ++i) {
      std::string n = fmt::format("{}#{}", base, i);
      if (!g_.has_op_name(n)) return n;
    }
  }
  std::string fresh_tensor_name(const std::string& base) { return fresh_op_name(base); }

  // One backward op, named after the forward op it differentiates.
  std::vector<TensorId> emit(OpKind kind, const std::vector<TensorId>& in, OpAttrs a,
                             const std::string& what) {
    return g_.add_op(kind, in, std::move(a), fresh_op_name(base_ + "/" + what), Role::Gradient);
  }
  TensorId emit1(OpKind kind, const std::vector<TensorId>& in, OpAttrs a, const std::string& what) {
    return emit(kind, in, std::move(a), what)[0];
  }
  TensorId unary(UnaryFn f, TensorId x, const std::string& what, double scalar = 0) {
    OpAttrs a;
    a.unary = f;
    a.scalar = scalar;
    return emit1(OpKind::Unary, {x}, std::move(a), what);
  }
  TensorId binary(BinaryFn f, TensorId x, TensorId y, const std::string& what) {
    OpAttrs a;
    a.binary = f;
    return emit1(OpKind::Binary, {x, y}, std::move(a), what);
  }
  TensorId unary_grad(UnaryFn f, double scalar, TensorId x, TensorId dy, const std::string& what) {
    OpAttrs a;
    a.unary = f;
    a.scalar = scalar;
    return emit1(OpKind::UnaryGrad, {x, dy}, std::move(a), what);
  }
  TensorId broadcast_to(TensorId x, const Shape& shape, std::vector<int> axes, const std::string& what) {
    OpAttrs a;
    a.ints = shape;
    a.axes = std::move(axes);
    return emit1(OpKind::BroadcastTo, {x}, std::move(a), what);
  }

  // The total gradient of t: its contributions summed (once), registered with grad_of.
  TensorId finish(TensorId t) {
    if (total_[t] >= 0 || contrib_[t].empty()) return total_[t];
    auto& cs = contrib_[t];
    std::string name = "d:" + fwd_.tensor(t).name;
    TensorId acc = cs[0];
    for (std::size_t i = 1; i < cs.size(); ++i) {
      OpAttrs a;
      a.binary = BinaryFn::Add;
      std::string n = i + 1 == cs.size() ? name : fmt::format("{}+{}", name, i);
      acc = g_.add_op(OpKind::Binary, {acc, cs[i]}, std::move(a), fresh_op_name(n), Role::Gradient)[0];
    }
    if (g_.grad_of(acc)) {  // passed through unchanged from another tensor's gradient
      if (fwd_.tensor(t).role == Role::Parameter) {
        OpAttrs a;
        a.unary = UnaryFn::Identity;
        acc = g_.add_op(OpKind::Unary, {acc}, std::move(a), fresh_op_name(name), Role::Gradient)[0];
        g_.set_grad_of(acc, t);
      }
    } else {
      g_.set_grad_of(acc, t);
    }
    cs.clear();
    cs.shrink_to_fit();
    return total_[t] = acc;
  }

  void add(TensorId x, TensorId g) {
    WEFT_ASSERT(T(x).shape == T(g).shape, fmt::format("gradient shape for tensor {}", x));
    contrib_[x].push_back(g);
  }

  // src scattered (summed) into zeros of `shape` at `index` along `axis`: a routing op's adjoint.
  TensorId scatter_zero(TensorId index, TensorId src, int axis, const Shape& shape, const std::string& what) {
    const int ax = axis < 0 ? axis + static_cast<int>(shape.size()) : axis;
    OpAttrs a;
    a.axes = {ax};
    a.ints = {shape[static_cast<std::size_t>(ax)]};
    return emit1(OpKind::ScatterAdd, {index, src}, std::move(a), what);
  }

  // Sums a broadcast-shaped gradient back to the operand's shape (numpy broadcasting inverse).
  TensorId unbroadcast(TensorId g, const Shape& target, const std::string& what) {
    const Shape gs = T(g).shape;
    std::size_t shift = gs.size() - target.size();
    std::vector<int> axes;
    for (std::size_t i = 0; i < gs.size(); ++i)
      if (i < shift || (target[i - shift] == 1 && gs[i] != 1)) axes.push_back(static_cast<int>(i));
    if (axes.empty()) return g;
    OpAttrs a;
    a.reduce = ReduceFn::Sum;
    a.axes = axes;
    TensorId r = emit1(OpKind::Reduce, {g}, std::move(a), what + ".sum");
    if (T(r).shape != target) {
      OpAttrs b;
      b.ints = target;
      r = emit1(OpKind::Reshape, {r}, std::move(b), what + ".reshape");
    }
    return r;
  }

  void differentiate(const Op& op, const std::vector<TensorId>& dys) {
    base_ = "d:" + op.name;
    const OpAttrs& at = op.attrs;
    const auto& in = op.inputs;
    auto need = [&](std::size_t i) { return needs_[in[i]]; };
    TensorId dy = dys[0];
    TensorId y = op.outputs.empty() ? -1 : op.outputs[0];
    switch (op.kind) {
      case OpKind::Einsum: {
        // y[out] = Σ Π_k x_k[t_k]. dx_i[t_i] = Σ dy[out]·Π_{k≠i} x_k[t_k] over the other letters:
        // an einsum "out,t_k...->t_i'", where t_i' drops the letters of t_i that occur nowhere
        // else (summed in x_i alone, so dx_i is constant along them: a BroadcastTo restores them).
        auto [terms, rhs] = split_einsum(at.equation, op.name);
        for (std::size_t i = 0; i < in.size(); ++i) {
          if (!need(i)) continue;
          std::string avail = rhs;
          std::vector<TensorId> ops{dy};
          std::string lhs = rhs;
          for (std::size_t k = 0; k < in.size(); ++k)
            if (k != i) {
              avail += terms[k];
              lhs += "," + terms[k];
              ops.push_back(in[k]);
            }
          std::string kept;
          std::vector<int> missing;
          Shape xs = T(in[i]).shape;
          for (std::size_t d = 0; d < terms[i].size(); ++d) {
            if (avail.find(terms[i][d]) != std::string::npos)
              kept += terms[i][d];
            else
              missing.push_back(static_cast<int>(d));
          }
          TensorId g = dy;
          if (!(ops.size() == 1 && kept == rhs)) {  // not an identity einsum
            OpAttrs a;
            a.equation = lhs + "->" + kept;
            g = emit1(OpKind::Einsum, ops, std::move(a), fmt::format("in{}", i));
          }
          if (!missing.empty()) g = broadcast_to(g, xs, missing, fmt::format("in{}.bcast", i));
          add(in[i], g);
        }
        return;
      }
      case OpKind::Unary: add(in[0], unary_grad(at.unary, at.scalar, in[0], dy, "in0")); return;
      case OpKind::Dropout: add(in[0], emit1(OpKind::Dropout, {dy}, at, "in0")); return;  // same mask
      case OpKind::Cast:  // torch's: dy converted back to x's dtype
        add(in[0], emit1(OpKind::Cast, {dy}, encode_cast_attrs(T(in[0]).dtype), "in0"));
        return;
      case OpKind::Binary: {
        const Shape sa = T(in[0]).shape, sb = T(in[1]).shape;
        TensorId ga = -1, gb = -1;  // gradients in the broadcast (output) shape
        switch (at.binary) {
          case BinaryFn::Add: ga = dy, gb = dy; break;
          case BinaryFn::Sub:
            ga = dy;
            if (need(1)) gb = unary(UnaryFn::Neg, dy, "in1.neg");
            break;
          case BinaryFn::Mul:
            if (need(0)) ga = binary(BinaryFn::Mul, dy, in[1], "in0.mul");
            if (need(1)) gb = binary(BinaryFn::Mul, dy, in[0], "in1.mul");
            break;
          case BinaryFn::Div:  // d(a/b)/da = 1/b; d(a/b)/db = −(a/b)/b = −y/b
            if (need(0)) ga = binary(BinaryFn::Div, dy, in[1], "in0.div");
            if (need(1))
              gb = unary(UnaryFn::Neg,
                         binary(BinaryFn::Div, binary(BinaryFn::Mul, dy, y, "in1.mul"), in[1], "in1.div"),
                         "in1.neg");
            break;
          case BinaryFn::Max: {  // dy goes to a where a > b, else to b: relu'(a − b) is the mask
            TensorId diff = binary(BinaryFn::Sub, in[0], in[1], "mask.sub");
            ga = unary_grad(UnaryFn::Relu, 0, diff, dy, "in0.mask");
            if (need(1)) gb = binary(BinaryFn::Sub, dy, ga, "in1.rest");
            break;
          }
        }
        if (need(0) && ga >= 0) add(in[0], unbroadcast(ga, sa, "in0"));
        if (need(1) && gb >= 0) add(in[1], unbroadcast(gb, sb, "in1"));
        return;
      }
      case OpKind::Reduce: {
        const Shape xs = T(in[0]).shape;
        std::vector<int> axes;
        std::int64_t count = 1;
        for (int a : at.axes) {
          int ax = a < 0 ? a + static_cast<int>(xs.size()) : a;
          axes.push_back(ax);
          count *= xs[ax];
        }
        std::sort(axes.begin(), axes.end());
        if (at.reduce == ReduceFn::Sum) {
          add(in[0], broadcast_to(dy, xs, axes, "in0"));
        } else if (at.reduce == ReduceFn::Mean) {
          // 1/count, with the tensor and axes it counts (ints = {x}, axes): re-batching a graph
          // (plan::rebatch) recounts it when the batch dim is among the axes.
          OpAttrs a;
          a.unary = UnaryFn::Scale;
          a.scalar = 1.0 / static_cast<double>(count);
          a.ints = {in[0]};
          a.axes = axes;
          TensorId s = emit1(OpKind::Unary, {dy}, std::move(a), "in0.scale");
          add(in[0], broadcast_to(s, xs, axes, "in0"));
        } else {  // Max: dx = dy where x equals the max, i.e. dy − dy·[max − x > 0]
          TensorId yb = broadcast_to(y, xs, axes, "max.bcast");
          TensorId dyb = broadcast_to(dy, xs, axes, "dy.bcast");
          TensorId gap = binary(BinaryFn::Sub, yb, in[0], "gap");
          TensorId below = unary_grad(UnaryFn::Relu, 0, gap, dyb, "below");
          add(in[0], binary(BinaryFn::Sub, dyb, below, "in0"));
        }
        return;
      }
      case OpKind::Softmax: {
        OpAttrs a;
        a.axes = at.axes;
        add(in[0], emit1(OpKind::SoftmaxGrad, {y, dy}, std::move(a), "in0"));
        return;
      }
      case OpKind::LayerNorm: {
        if (need(0)) {
          OpAttrs a;
          a.scalar = at.scalar;
          add(in[0], emit1(OpKind::LayerNormGrad, {in[0], in[1], dy}, std::move(a), "in0"));
        }
        if (need(1) || need(2)) {
          OpAttrs a;
          a.scalar = at.scalar;
          auto pg = emit(OpKind::LayerNormParamGrad, {in[0], dy}, std::move(a), "params");
          if (need(1)) add(in[1], pg[0]);
          if (need(2)) add(in[2], pg[1]);
        }
        return;
      }
      case OpKind::Embedding: {
        if (!need(0)) return;
        OpAttrs a;
        a.ints = T(in[0]).shape;
        if (!at.ints.empty()) a.ints.push_back(at.ints[0]);  // padding_idx: that row gets no gradient
        add(in[0], emit1(OpKind::EmbeddingGrad, {in[1], dy}, std::move(a), "in0"));
        return;
      }
      case OpKind::CrossEntropy: {
        // torch does not differentiate the class weights (nll_loss: "the derivative for 'weight' is
        // not implemented"): a weight a parameter reaches would silently get no gradient here.
        WEFT_CHECK(
            in.size() < 3 || !need(2),
            "cross entropy '{}': its class weights '{}' depend on a parameter; they must be a constant, "
            "buffer or input (torch does not differentiate them)",
            op.name, T(in[2]).name);
        std::vector<TensorId> gin{in[0], in[1], dy};
        if (in.size() > 2) gin.push_back(in[2]);
        if (need(0)) add(in[0], emit1(OpKind::CrossEntropyGrad, std::move(gin), at, "in0"));
        return;
      }
      case OpKind::Transpose: {
        OpAttrs a;
        a.axes.resize(at.axes.size());
        for (std::size_t i = 0; i < at.axes.size(); ++i) a.axes[at.axes[i]] = static_cast<int>(i);
        add(in[0], emit1(OpKind::Transpose, {dy}, std::move(a), "in0"));
        return;
      }
      case OpKind::Reshape: {
        OpAttrs a;
        a.ints = T(in[0]).shape;
        add(in[0], emit1(OpKind::Reshape, {dy}, std::move(a), "in0"));
        return;
      }
      case OpKind::Concat: {
        int r = static_cast<int>(T(y).shape.size());
        int ax = at.axes[0] < 0 ? at.axes[0] + r : at.axes[0];
        std::int64_t off = 0;
        for (std::size_t i = 0; i < in.size(); ++i) {
          std::int64_t n = T(in[i]).shape[ax];
          if (need(i)) {
            OpAttrs a;
            a.axes = {ax};
            a.ints = {off, off + n};
            add(in[i], emit1(OpKind::Slice, {dy}, std::move(a), fmt::format("in{}", i)));
          }
          off += n;
        }
        return;
      }
      case OpKind::Slice: {
        int r = static_cast<int>(T(in[0]).shape.size());
        int ax = at.axes[0] < 0 ? at.axes[0] + r : at.axes[0];
        OpAttrs a;
        a.axes = {ax};
        a.ints = {at.ints[0], at.ints[1], T(in[0]).shape[ax]};
        add(in[0], emit1(OpKind::Pad, {dy}, std::move(a), "in0"));
        return;
      }
      case OpKind::Conv2d: {
        const Shape xs = T(in[0]).shape, ws = T(in[1]).shape;
        if (need(0)) {
          OpAttrs a;
          a.ints = {at.ints[0], at.ints[1], xs[2], xs[3]};
          add(in[0], emit1(OpKind::Conv2dGradInput, {dy, in[1]}, std::move(a), "in0"));
        }
        if (need(1)) {
          OpAttrs a;
          a.ints = {at.ints[0], at.ints[1], ws[2], ws[3]};
          add(in[1], emit1(OpKind::Conv2dGradWeight, {in[0], dy}, std::move(a), "in1"));
        }
        return;
      }
      case OpKind::Pool2d: add(in[0], emit1(OpKind::Pool2dGrad, {in[0], y, dy}, at, "in0")); return;
      case OpKind::BroadcastTo: {
        // A forward broadcast (an imported expand: a class token to [B, 1, d]) copies x along the
        // inserted dims and the size-1 dims it widens: dx sums dy over them, per micro-batch too.
        const Shape xs = T(in[0]).shape, ys = T(y).shape;
        std::vector<int> axes;
        std::size_t k = 0;
        for (int d = 0; d < static_cast<int>(ys.size()); ++d) {
          const bool inserted = std::find_if(at.axes.begin(), at.axes.end(), [&](int a) {
                                  return (a < 0 ? a + static_cast<int>(ys.size()) : a) == d;
                                }) != at.axes.end();
          if (inserted || xs[k] != ys[static_cast<std::size_t>(d)]) axes.push_back(d);
          if (!inserted) ++k;
        }
        TensorId g = dy;
        if (!axes.empty()) {
          OpAttrs a;
          a.reduce = ReduceFn::Sum;
          a.axes = axes;
          g = emit1(OpKind::Reduce, {dy}, std::move(a), "in0.sum");
        }
        if (T(g).shape != xs) {
          OpAttrs a;
          a.ints = xs;
          g = emit1(OpKind::Reshape, {g}, std::move(a), "in0.reshape");
        }
        add(in[0], g);
        return;
      }
      // Routing: the adjoint of a gather is a scatter-add of dy into zeros at the same indices, and
      // of a scatter-add a gather of dy (the base's gradient is dy itself). Top-k's values are a
      // gather of x at its indices: the same scatter-add. Indices are integers: no gradient.
      case OpKind::Gather: {
        if (!need(0)) return;
        add(in[0], scatter_zero(in[1], dy, at.axes[0], T(in[0]).shape, "in0"));
        return;
      }
      case OpKind::ScatterAdd: {
        const bool zero_base = in.size() == 2;
        if (!zero_base && need(0)) add(in[0], dy);
        const std::size_t index = zero_base ? 0 : 1, src = index + 1;
        if (need(src)) {
          OpAttrs a;
          a.axes = at.axes;
          add(in[src], emit1(OpKind::Gather, {dy, in[index]}, std::move(a), fmt::format("in{}", src)));
        }
        return;
      }
      case OpKind::TopK: {
        if (dy < 0) return;  // only the indices are read
        add(in[0], scatter_zero(op.outputs[1], dy, at.axes[0], T(in[0]).shape, "in0"));
        return;
      }
      case OpKind::Attention: {
        // One fused backward from what the forward saved (q, k, v, out and the log-sum-exp): the
        // probabilities are recomputed, never stored. The log-sum-exp is a statistic for that
        // backward; a loss that reads it has no rule here.
        if (dys[1] >= 0)
          fail("op '{}': the loss depends on the log-sum-exp of an attention, which has no gradient rule",
               op.name);
        if (dy < 0) return;
        auto d = emit(OpKind::AttentionGrad, {in[0], in[1], in[2], y, op.outputs[1], dy}, at, "qkv");
        for (std::size_t i = 0; i < 3; ++i)
          if (need(i)) add(in[i], d[i]);
        return;
      }
      default:
        fail("op '{}' of kind {} is not differentiable, but the loss depends on a parameter through it",
             op.name, op_kind_name(op.kind));
    }
  }
};

}  // namespace

bool uses_master_weights(const TrainOptions& options, DType dt) {
  return options.master_weights && options.optimizer != Optimizer::None &&
         (dt == DType::F16 || dt == DType::BF16);
}

TensorId master_copy(const Op& op) {
  std::size_t plain = 0;  // operands without a master copy
  if (op.kind == OpKind::AdamUpdate)
    plain = 4;
  else if (op.kind == OpKind::SgdUpdate)
    plain = 1 + op.attrs.scalars.size();
  return plain > 0 && op.inputs.size() == plain + 1 ? op.inputs[2] : -1;
}

Graph build_training_graph(const Graph& forward, const TrainOptions& options) {
  auto loss = forward.loss();
  WEFT_CHECK(loss.has_value(), "graph '{}' has no loss: call set_loss() on a scalar first", forward.name());
  for (const auto& t : forward.tensors())
    WEFT_CHECK(
        t.role != Role::Gradient,
        "graph '{}' is already a training graph (it has gradient '{}'): build the training step from the "
        "forward graph",
        forward.name(), t.name);
  WEFT_CHECK(options.optimizer == Optimizer::None || options.lr > 0, "learning rate must be > 0, got {}",
             options.lr);
  if (options.optimizer == Optimizer::Adam)
    WEFT_CHECK(options.beta1 >= 0 && options.beta1 < 1 && options.beta2 >= 0 && options.beta2 < 1 &&
                   options.eps > 0 && options.step >= 1,
               "adam needs 0 <= beta1, beta2 < 1, eps > 0 and step >= 1");
  WEFT_CHECK(options.momentum >= 0, "sgd momentum must be >= 0, got {}", options.momentum);
  WEFT_CHECK(options.momentum == 0 || options.optimizer == Optimizer::Sgd,
             "momentum {} is an sgd option: adam has its own (beta1)", options.momentum);
  Graph g = forward;
  if (!g.name().empty()) g.set_name(g.name() + ".train");
  const auto& fts = forward.tensors();
  auto op_name = [&](const std::string& base) {
    std::string n = base;
    for (int i = 2; g.has_op_name(n); ++i) n = fmt::format("{}#{}", base, i);
    return n;
  };
  Backward bw(forward, g);
  std::vector<TensorId> grads = bw.run(*loss);
  g.mark_output(*loss);
  // One update of parameter p: reads (p, gp[, master], states...) and writes the new value of each
  // (the parameter keeps its role, the rest are OptimizerState), all with grad_of = p.
  auto add_update = [&](OpKind kind, const std::string& prefix, TensorId p, TensorId gp,
                        const std::vector<std::string>& state_prefixes, OpAttrs a) {
    const TensorInfo& ti = fts[static_cast<std::size_t>(p)];
    const bool master = uses_master_weights(options, ti.dtype);
    const DType sdt = master ? DType::F32 : ti.dtype;
    std::vector<TensorId> ins = {p, gp};
    auto state = [&](const std::string& name) {
      TensorId s = g.add_tensor({name + ti.name, ti.shape, sdt, Role::OptimizerState, kNoOp});
      g.set_grad_of(s, p);
      ins.push_back(s);
    };
    if (master) state("master:");
    for (const auto& sp : state_prefixes) state(sp);
    auto outs = g.add_op(kind, ins, std::move(a), op_name(prefix + ti.name), Role::Parameter);
    // The rule gives every result the first's role; all but the parameter are OptimizerState.
    for (std::size_t k = 0; k < outs.size(); ++k) {
      g.set_grad_of(outs[k], p);
      g.mark_output(outs[k]);
      if (k > 0) g.set_role(outs[k], Role::OptimizerState);
    }
  };
  for (std::size_t t = 0; t < fts.size(); ++t) {
    const auto& ti = fts[t];
    if (ti.role != Role::Parameter || ti.producer != kNoOp || grads[t] < 0) continue;
    auto p = static_cast<TensorId>(t);
    TensorId gp = grads[t];
    switch (options.optimizer) {
      case Optimizer::None: g.mark_output(gp); break;
      case Optimizer::Sgd: {
        const bool mom = options.momentum > 0;
        OpAttrs a;
        a.scalars = {options.lr};
        if (mom) a.scalars.push_back(options.momentum);
        add_update(OpKind::SgdUpdate, "sgd:", p, gp,
                   mom ? std::vector<std::string>{"sgd_momentum:"} : std::vector<std::string>{},
                   std::move(a));
        break;
      }
      case Optimizer::Adam: {
        OpAttrs a;
        a.scalars = {options.lr, options.beta1, options.beta2, options.eps,
                     static_cast<double>(options.step)};
        add_update(OpKind::AdamUpdate, "adam:", p, gp, {"adam_m:", "adam_v:"}, std::move(a));
        break;
      }
    }
  }
  return g;
}

double training_flops(const Graph& forward) {
  TrainOptions o;
  o.optimizer = Optimizer::None;
  return build_training_graph(forward, o).flops();
}

bool is_state_leaf(const TensorInfo& t) {
  return t.producer == kNoOp && (t.role == Role::Parameter || t.role == Role::OptimizerState);
}

std::vector<std::pair<TensorId, TensorId>> updated_states(const Graph& g) {
  const std::set<TensorId> outs(g.outputs().begin(), g.outputs().end());
  std::vector<std::pair<TensorId, TensorId>> carries;
  for (const auto& op : g.ops()) {
    std::vector<TensorId> states;
    for (TensorId t : op.inputs)
      if (is_state_leaf(g.tensor(t))) states.push_back(t);
    std::size_t k = 0;
    for (std::size_t i = 0; i < op.outputs.size() && k < states.size(); ++i) {
      const TensorId out = op.outputs[i];
      if (!outs.count(out) || g.tensor(out).shape != g.tensor(states[k]).shape) continue;
      carries.emplace_back(out, states[k]);
      ++k;
    }
  }
  return carries;
}

}  // namespace weft::ir
