#include "weft/ir/graph.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <cstdint>
#include <queue>
#include <set>
#include <string_view>
#include <type_traits>
#include <unordered_map>

#include "weft/core/error.hpp"

namespace weft::ir {

std::string Graph::unique_name(const std::string& base) {
  // Skip names already taken (by the user or by a loaded graph) so auto names never collide.
  std::string n;
  do n = fmt::format("{}_{}", base, name_counter_++);
  while (op_names_.count(n));
  return n;
}

bool Graph::operator==(const Graph& o) const {
  return name_ == o.name_ && tensors_ == o.tensors_ && ops_ == o.ops_ && outputs_ == o.outputs_ &&
         loss_ == o.loss_ && grad_of_ == o.grad_of_ && values_ == o.values_ &&
         seed_parameters_ == o.seed_parameters_;
}

namespace {
void check_value_leaf(const TensorInfo& info) {
  WEFT_CHECK(info.producer == kNoOp &&
                 (info.role == Role::Parameter || info.role == Role::Buffer || info.role == Role::Constant),
             "tensor '{}' ({}{}) cannot carry a value: only Parameter, Buffer and Constant leaves do "
             "(Inputs are fed per step)",
             info.name, role_name(info.role), info.producer == kNoOp ? "" : ", computed by an op");
}
}  // namespace

void Graph::set_value(TensorId t, HostTensor value) {
  set_value(t, LeafValue{std::make_shared<const HostTensor>(std::move(value)), {}, {}});
}

void Graph::set_value_file(TensorId t, std::string file, std::string key) {
  check_value_leaf(tensor(t));
  WEFT_CHECK(!file.empty() && !key.empty(), "value of '{}': a value file needs a path and a key",
             tensor(t).name);
  values_[t] = LeafValue{nullptr, std::move(file), std::move(key)};
}

void Graph::set_value(TensorId t, LeafValue value) {
  if (!value.data) return set_value_file(t, std::move(value.file), std::move(value.key));
  const TensorInfo& info = tensor(t);
  check_value_leaf(info);
  const HostTensor& v = *value.data;
  WEFT_CHECK(v.shape == info.shape, "value of '{}': shape {}, the tensor has {}", info.name, v.shape,
             info.shape);
  WEFT_CHECK(static_cast<std::int64_t>(v.data.size()) == v.numel(), "value of '{}': {} numbers for shape {}",
             info.name, v.data.size(), v.shape);
  if (!is_floating(info.dtype))
    for (double x : v.data)
      WEFT_CHECK(x == std::floor(x), "value of '{}': {} is not an integer, and the tensor is {}", info.name,
                 x, dtype_name(info.dtype));
  values_[t] = LeafValue{std::move(value.data), {}, {}};
}

void Graph::clear_value(TensorId t) {
  (void)tensor(t);
  values_.erase(t);
}

const LeafValue* Graph::value(TensorId t) const {
  auto it = values_.find(t);
  return it == values_.end() ? nullptr : &it->second;
}

TensorId Graph::add_tensor_unchecked(TensorInfo info) {
  tensors_.push_back(std::move(info));
  grad_of_.push_back(-1);
  return static_cast<TensorId>(tensors_.size()) - 1;
}

TensorId Graph::add_tensor(TensorInfo info) {
  WEFT_CHECK(info.producer == kNoOp, "tensor '{}': add_tensor makes leaves only", info.name);
  for (auto s : info.shape)
    WEFT_CHECK(s >= 1, "tensor '{}': shape {} has a non-positive dimension", info.name, info.shape);
  (void)info.bytes();  // its element and byte counts fit in int64 (weft::Error otherwise)
  if (info.name.empty()) info.name = unique_name("t");
  tensors_.push_back(std::move(info));
  grad_of_.push_back(-1);
  return static_cast<TensorId>(tensors_.size()) - 1;
}

TensorId Graph::input(std::string name, Shape shape, DType dtype) {
  return add_tensor({std::move(name), std::move(shape), dtype, Role::Input, kNoOp});
}
TensorId Graph::parameter(std::string name, Shape shape, DType dtype) {
  return add_tensor({std::move(name), std::move(shape), dtype, Role::Parameter, kNoOp});
}
TensorId Graph::constant(std::string name, Shape shape, DType dtype) {
  return add_tensor({std::move(name), std::move(shape), dtype, Role::Constant, kNoOp});
}
TensorId Graph::buffer(std::string name, Shape shape, DType dtype) {
  return add_tensor({std::move(name), std::move(shape), dtype, Role::Buffer, kNoOp});
}

const TensorInfo& Graph::tensor(TensorId t) const {
  WEFT_CHECK(t >= 0 && t < static_cast<TensorId>(tensors_.size()), "tensor id {} out of range (graph has {})",
             t, tensors_.size());
  return tensors_[t];
}

const Op& Graph::op(OpId o) const {
  WEFT_CHECK(o >= 0 && o < static_cast<OpId>(ops_.size()), "op id {} out of range (graph has {})", o,
             ops_.size());
  return ops_[o];
}

std::vector<TensorId> Graph::add_op(OpKind kind, const std::vector<TensorId>& inputs, OpAttrs attrs,
                                    std::string name, Role output_role) {
  if (name.empty()) name = unique_name(std::string(op_kind_name(kind)));
  WEFT_CHECK(!op_names_.count(name), "op name '{}' is already used in graph '{}'", name, name_);
  std::vector<Shape> shapes;
  std::vector<DType> dtypes;
  for (TensorId t : inputs) {
    WEFT_CHECK(t >= 0 && t < static_cast<TensorId>(tensors_.size()), "op '{}': operand id {} does not exist",
               name, t);
    shapes.push_back(tensors_[t].shape);
    dtypes.push_back(tensors_[t].dtype);
  }
  OpSignature sig = derive_signature(kind, attrs, shapes, dtypes, name);
  Op op{kind, name, inputs, {}, std::move(attrs), std::move(sig.index_map)};
  OpId id = static_cast<OpId>(ops_.size());
  for (std::size_t i = 0; i < sig.output_shapes.size(); ++i) {
    std::string tname = sig.output_shapes.size() == 1 ? name : fmt::format("{}:{}", name, i);
    tensors_.push_back({tname, sig.output_shapes[i], sig.output_dtypes[i], output_role, id});
    grad_of_.push_back(-1);
    op.outputs.push_back(static_cast<TensorId>(tensors_.size()) - 1);
  }
  op_names_.insert(name);
  ops_.push_back(std::move(op));
  return ops_.back().outputs;
}

OpId Graph::add_op_unchecked(Op op) {
  op_names_.insert(op.name);
  ops_.push_back(std::move(op));
  return static_cast<OpId>(ops_.size()) - 1;
}

TensorId Graph::einsum(const std::string& equation, const std::vector<TensorId>& operands, std::string name) {
  OpAttrs a;
  a.equation = equation;
  return add_op(OpKind::Einsum, operands, std::move(a), std::move(name))[0];
}

TensorId Graph::matmul(TensorId a, TensorId b, std::string name) {
  const auto& sa = tensor(a).shape;
  const auto& sb = tensor(b).shape;
  WEFT_CHECK(sa.size() >= 2 && sa.size() <= 20 && sb.size() == 2,
             "matmul: expected [..., m, k] x [k, n], got {} x {}", sa, sb);
  std::string lead;
  for (std::size_t i = 0; i + 1 < sa.size(); ++i) lead += static_cast<char>('a' + i);
  return einsum(fmt::format("{}y,yz->{}z", lead, lead), {a, b}, std::move(name));
}

TensorId Graph::unary(UnaryFn fn, TensorId x, std::string name, double scalar) {
  OpAttrs a;
  a.unary = fn;
  a.scalar = scalar;
  return add_op(OpKind::Unary, {x}, std::move(a), std::move(name))[0];
}

TensorId Graph::dropout(TensorId x, double p, std::int64_t seed, std::string name) {
  OpAttrs a;
  a.scalar = p;
  a.ints = {seed};
  return add_op(OpKind::Dropout, {x}, std::move(a), std::move(name))[0];
}

TensorId Graph::cast(TensorId x, DType to, std::string name) {
  WEFT_CHECK(x >= 0 && x < static_cast<TensorId>(tensors_.size()), "cast: tensor id {} does not exist", x);
  if (tensors_[static_cast<std::size_t>(x)].dtype == to) return x;  // an identity conversion is free
  return add_op(OpKind::Cast, {x}, encode_cast_attrs(to), std::move(name))[0];
}

TensorId Graph::binary(BinaryFn fn, TensorId x, TensorId y, std::string name) {
  OpAttrs a;
  a.binary = fn;
  return add_op(OpKind::Binary, {x, y}, std::move(a), std::move(name))[0];
}

TensorId Graph::reduce(ReduceFn fn, TensorId x, std::vector<int> axes, std::string name) {
  OpAttrs a;
  a.reduce = fn;
  a.axes = std::move(axes);
  return add_op(OpKind::Reduce, {x}, std::move(a), std::move(name))[0];
}

TensorId Graph::softmax(TensorId x, int axis, std::string name) {
  OpAttrs a;
  a.axes = {axis};
  return add_op(OpKind::Softmax, {x}, std::move(a), std::move(name))[0];
}

TensorId Graph::layer_norm(TensorId x, TensorId gamma, TensorId beta, double eps, std::string name) {
  OpAttrs a;
  a.scalar = eps;
  return add_op(OpKind::LayerNorm, {x, gamma, beta}, std::move(a), std::move(name))[0];
}

TensorId Graph::embedding(TensorId table, TensorId ids, std::string name) {
  return add_op(OpKind::Embedding, {table, ids}, {}, std::move(name))[0];
}

TensorId Graph::cross_entropy(TensorId logits, TensorId labels, std::string name) {
  return add_op(OpKind::CrossEntropy, {logits, labels}, {}, std::move(name))[0];
}

TensorId Graph::cross_entropy(TensorId logits, TensorId labels, const CrossEntropyAttrs& attrs,
                              TensorId weight, std::string name) {
  std::vector<TensorId> in{logits, labels};
  if (weight >= 0) in.push_back(weight);
  return add_op(OpKind::CrossEntropy, std::move(in), encode_cross_entropy_attrs(attrs), std::move(name))[0];
}

TensorId Graph::transpose(TensorId x, std::vector<int> perm, std::string name) {
  OpAttrs a;
  a.axes = std::move(perm);
  return add_op(OpKind::Transpose, {x}, std::move(a), std::move(name))[0];
}

TensorId Graph::reshape(TensorId x, Shape shape, std::string name) {
  OpAttrs a;
  a.ints = std::move(shape);
  return add_op(OpKind::Reshape, {x}, std::move(a), std::move(name))[0];
}

TensorId Graph::concat(const std::vector<TensorId>& xs, int axis, std::string name) {
  OpAttrs a;
  a.axes = {axis};
  return add_op(OpKind::Concat, xs, std::move(a), std::move(name))[0];
}

TensorId Graph::slice(TensorId x, int axis, std::int64_t begin, std::int64_t end, std::string name) {
  OpAttrs a;
  a.axes = {axis};
  a.ints = {begin, end};
  return add_op(OpKind::Slice, {x}, std::move(a), std::move(name))[0];
}

TensorId Graph::conv2d(TensorId x, TensorId w, std::int64_t stride, std::int64_t pad, std::string name) {
  OpAttrs a;
  a.ints = {stride, pad};
  return add_op(OpKind::Conv2d, {x, w}, std::move(a), std::move(name))[0];
}

TensorId Graph::pool2d(ReduceFn fn, TensorId x, std::int64_t kernel, std::int64_t stride, std::int64_t pad,
                       std::string name) {
  OpAttrs a;
  a.reduce = fn;
  a.ints = {kernel, stride, pad};
  return add_op(OpKind::Pool2d, {x}, std::move(a), std::move(name))[0];
}

TensorId Graph::opaque(const std::vector<TensorId>& inputs, Shape out_shape, double flops, std::string name) {
  OpAttrs a;
  a.ints = std::move(out_shape);
  a.scalar = flops;
  return add_op(OpKind::Opaque, inputs, std::move(a), std::move(name))[0];
}

namespace {
// A routing op's axis as stored (JSON keeps axes non-negative); the rule checks the range.
int stored_axis(int axis, const TensorInfo& t) { return axis < 0 ? axis + t.rank() : axis; }
}  // namespace

TensorId Graph::gather(TensorId x, TensorId index, int axis, std::string name) {
  OpAttrs a;
  a.axes = {stored_axis(axis, tensor(x))};
  return add_op(OpKind::Gather, {x, index}, std::move(a), std::move(name))[0];
}

TensorId Graph::scatter_add(TensorId base, TensorId index, TensorId src, int axis, std::string name) {
  OpAttrs a;
  a.axes = {stored_axis(axis, tensor(base))};
  return add_op(OpKind::ScatterAdd, {base, index, src}, std::move(a), std::move(name))[0];
}

std::pair<TensorId, TensorId> Graph::topk(TensorId x, std::int64_t k, int axis, bool largest,
                                          std::string name) {
  OpAttrs a;
  a.axes = {stored_axis(axis, tensor(x))};
  a.ints = {k, largest ? 1 : 0};
  auto out = add_op(OpKind::TopK, {x}, std::move(a), std::move(name));
  return {out[0], out[1]};
}

std::pair<TensorId, TensorId> Graph::attention(TensorId q, TensorId k, TensorId v,
                                               std::optional<double> scale, bool causal, std::string name) {
  const auto& qs = tensor(q).shape;
  WEFT_CHECK(!qs.empty(), "attention '{}': q must be [..., seq, head_dim], got a scalar", name);
  OpAttrs a;
  a.scalar = scale ? *scale : 1.0 / std::sqrt(static_cast<double>(qs.back()));
  a.ints = {causal ? 1 : 0};
  auto out = add_op(OpKind::Attention, {q, k, v}, std::move(a), std::move(name));
  return {out[0], out[1]};
}

void Graph::set_loss(TensorId t) {
  WEFT_CHECK(tensor(t).shape.empty(), "loss '{}' must be a scalar, has shape {}", tensor(t).name,
             tensor(t).shape);
  loss_ = t;
}

void Graph::mark_output(TensorId t) {
  tensor(t);
  for (TensorId o : outputs_)
    if (o == t) return;
  outputs_.push_back(t);
}

std::optional<TensorId> Graph::find_tensor(const std::string& name) const {
  for (std::size_t i = 0; i < tensors_.size(); ++i)
    if (tensors_[i].name == name) return static_cast<TensorId>(i);
  return std::nullopt;
}

std::vector<std::vector<OpId>> Graph::consumer_index() const {
  std::vector<std::vector<OpId>> cons(tensors_.size());
  for (std::size_t o = 0; o < ops_.size(); ++o)
    for (TensorId t : ops_[o].inputs) cons[static_cast<std::size_t>(t)].push_back(static_cast<OpId>(o));
  return cons;
}

std::vector<OpId> Graph::consumers(TensorId t) const {
  std::vector<OpId> out;
  for (std::size_t o = 0; o < ops_.size(); ++o)
    for (TensorId i : ops_[o].inputs)
      if (i == t) {
        out.push_back(static_cast<OpId>(o));
        break;
      }
  return out;
}

void Graph::set_grad_of(TensorId grad, TensorId of) {
  tensor(grad);
  tensor(of);
  WEFT_CHECK(grad != of, "tensor '{}' cannot be its own gradient", tensor(grad).name);
  if (grad_of_.size() < tensors_.size()) grad_of_.resize(tensors_.size(), -1);
  TensorId old = grad_of_[grad];
  grad_of_[grad] = of;
  if (old >= 0 && old < static_cast<TensorId>(grad_index_.size()) && grad_index_[old] == grad) {
    grad_index_[old] = -1;  // re-pointed: rebuild the old entry (rare)
    for (std::size_t i = 0; i < grad_of_.size(); ++i)
      if (grad_of_[i] == old) index_grad(static_cast<TensorId>(i), old);
  }
  index_grad(grad, of);
}

void Graph::set_role(TensorId t, Role role) {
  tensor(t);
  tensors_[t].role = role;
  if (grad_of_[t] >= 0) set_grad_of(t, grad_of_[t]);  // re-index: grad() depends on the role
}

void Graph::index_grad(TensorId grad, TensorId of) {
  Role r = tensors_[grad].role;
  if (r != Role::Gradient && r != Role::Constant) return;
  if (grad_index_.size() <= static_cast<std::size_t>(of)) grad_index_.resize(tensors_.size(), -1);
  if (grad_index_[of] < 0 || grad < grad_index_[of]) grad_index_[of] = grad;
}

std::optional<TensorId> Graph::grad_of(TensorId grad) const {
  if (grad < 0 || grad >= static_cast<TensorId>(grad_of_.size()) || grad_of_[grad] < 0) return std::nullopt;
  return grad_of_[grad];
}

std::optional<TensorId> Graph::grad(TensorId of) const {
  if (of < 0 || of >= static_cast<TensorId>(grad_index_.size()) || grad_index_[of] < 0) return std::nullopt;
  return grad_index_[of];
}

std::vector<OpId> Graph::topo_order() const {
  // Kahn's algorithm on op -> op edges through tensors; ties broken by op id (deterministic).
  const auto n = ops_.size();
  std::vector<int> indeg(n, 0);
  std::vector<std::vector<OpId>> succ(n);
  for (std::size_t o = 0; o < n; ++o)
    for (TensorId t : ops_[o].inputs) {
      if (t < 0 || t >= static_cast<TensorId>(tensors_.size())) continue;
      OpId p = tensors_[t].producer;
      if (p == kNoOp || p < 0 || p >= static_cast<OpId>(n)) continue;
      succ[p].push_back(static_cast<OpId>(o));
      ++indeg[o];
    }
  std::priority_queue<OpId, std::vector<OpId>, std::greater<>> ready;
  for (std::size_t o = 0; o < n; ++o)
    if (indeg[o] == 0) ready.push(static_cast<OpId>(o));
  std::vector<OpId> order;
  order.reserve(n);
  while (!ready.empty()) {
    OpId o = ready.top();
    ready.pop();
    order.push_back(o);
    for (OpId s : succ[o])
      if (--indeg[s] == 0) ready.push(s);
  }
  if (order.size() != n) {
    for (std::size_t o = 0; o < n; ++o)
      if (indeg[o] > 0) fail("graph '{}' has a cycle through op '{}'", name_, ops_[o].name);
  }
  return order;
}

void Graph::validate() const {
  const auto nt = static_cast<TensorId>(tensors_.size());
  std::vector<int> written(nt, 0);
  std::set<std::string> op_names;
  for (std::size_t o = 0; o < ops_.size(); ++o) {
    const Op& op = ops_[o];
    WEFT_CHECK(op_names.insert(op.name).second, "op name '{}' is used twice", op.name);
    std::vector<Shape> shapes;
    std::vector<DType> dtypes;
    for (TensorId t : op.inputs) {
      WEFT_CHECK(t >= 0 && t < nt, "op '{}': operand id {} does not exist (dangling tensor)", op.name, t);
      shapes.push_back(tensors_[t].shape);
      dtypes.push_back(tensors_[t].dtype);
    }
    for (TensorId t : op.outputs) {
      WEFT_CHECK(t >= 0 && t < nt, "op '{}': result id {} does not exist", op.name, t);
      WEFT_CHECK(tensors_[t].producer == static_cast<OpId>(o), "op '{}': result '{}' records producer {}",
                 op.name, tensors_[t].name, tensors_[t].producer);
      ++written[t];
    }
    OpSignature sig = derive_signature(op.kind, op.attrs, shapes, dtypes, op.name);
    WEFT_CHECK(sig.output_shapes.size() == op.outputs.size(),
               "op '{}' ({}): has {} results, its rule makes {}", op.name, op_kind_name(op.kind),
               op.outputs.size(), sig.output_shapes.size());
    for (std::size_t i = 0; i < op.outputs.size(); ++i) {
      const auto& t = tensors_[op.outputs[i]];
      WEFT_CHECK(t.shape == sig.output_shapes[i], "op '{}': result '{}' has shape {} but the op makes {}",
                 op.name, t.name, t.shape, sig.output_shapes[i]);
      WEFT_CHECK(t.dtype == sig.output_dtypes[i], "op '{}': result '{}' has dtype {} but the op makes {}",
                 op.name, t.name, dtype_name(t.dtype), dtype_name(sig.output_dtypes[i]));
    }
    WEFT_CHECK(op.index_map == sig.index_map, "op '{}': stored index map {} differs from its rule's {}",
               op.name, op.index_map.to_string(), sig.index_map.to_string());
  }
  for (TensorId t = 0; t < nt; ++t) {
    const auto& ti = tensors_[t];
    for (auto s : ti.shape)
      WEFT_CHECK(s >= 1, "tensor '{}' has a non-positive dimension in {}", ti.name, ti.shape);
    if (ti.producer == kNoOp) {
      WEFT_CHECK(written[t] == 0, "tensor '{}' is written by an op but records no producer", ti.name);
      WEFT_CHECK(ti.role != Role::Activation, "tensor '{}' is an activation that no op produces (dangling)",
                 ti.name);
    } else {
      WEFT_CHECK(ti.producer >= 0 && ti.producer < static_cast<OpId>(ops_.size()),
                 "tensor '{}' records producer {} which does not exist", ti.name, ti.producer);
      WEFT_CHECK(written[t] == 1, "tensor '{}' is written {} times", ti.name, written[t]);
    }
    if (t < static_cast<TensorId>(grad_of_.size()) && grad_of_[t] >= 0) {
      const TensorId of = grad_of_[t];
      WEFT_CHECK(of < nt, "tensor '{}': grad_of {} does not exist", ti.name, of);
      WEFT_CHECK(of != t, "tensor '{}' is recorded as its own gradient", ti.name);
      WEFT_CHECK(tensors_[of].shape == ti.shape, "tensor '{}' (shape {}) is the gradient of '{}' (shape {})",
                 ti.name, ti.shape, tensors_[of].name, tensors_[of].shape);
    }
  }
  for (TensorId t : outputs_) WEFT_CHECK(t >= 0 && t < nt, "graph output id {} does not exist", t);
  if (loss_) {
    WEFT_CHECK(*loss_ >= 0 && *loss_ < nt, "loss id {} does not exist", *loss_);
    WEFT_CHECK(tensors_[*loss_].shape.empty(), "loss '{}' is not a scalar", tensors_[*loss_].name);
  }
  topo_order();  // throws on a cycle
}

std::int64_t Graph::num_params() const {
  std::int64_t n = 0;
  for (const auto& t : tensors_)
    if (t.role == Role::Parameter && t.producer == kNoOp)
      WEFT_CHECK(!__builtin_add_overflow(n, t.numel(), &n), "graph '{}': more than 2^63 parameters", name_);
  return n;
}

std::int64_t Graph::param_bytes() const {
  std::int64_t n = 0;
  for (const auto& t : tensors_)
    if (t.role == Role::Parameter && t.producer == kNoOp)
      WEFT_CHECK(!__builtin_add_overflow(n, t.bytes(), &n), "graph '{}': parameter bytes exceed 2^63", name_);
  return n;
}

double Graph::flops() const {
  double f = 0;
  for (const auto& op : ops_) f += op.flops();
  return f;
}

std::string Graph::dump() const {
  std::string s = fmt::format("graph {} ({} ops, {} tensors, {} params)\n", name_, ops_.size(),
                              tensors_.size(), num_params());
  for (OpId o : topo_order()) {
    const Op& op = ops_[o];
    std::vector<std::string> ins, outs;
    for (TensorId t : op.inputs) ins.push_back(tensors_[t].name);
    for (TensorId t : op.outputs)
      outs.push_back(
          fmt::format("{}{}:{}", tensors_[t].name, tensors_[t].shape, dtype_name(tensors_[t].dtype)));
    s += fmt::format("  {} = {}[{}]({})  {}  flops={:.4g}\n", fmt::join(outs, ", "), op_kind_name(op.kind),
                     op.name, fmt::join(ins, ", "), op.index_map.to_string(), op.flops());
  }
  return s;
}

namespace {
// FNV-1a 64 over a canonical stream: every field with its length or a separator, so that no two
// different structures write the same bytes.
struct Fnv {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  void bytes(const void* p, std::size_t n) {
    const auto* c = static_cast<const unsigned char*>(p);
    for (std::size_t k = 0; k < n; ++k) h = (h ^ c[k]) * 0x100000001b3ULL;
  }
  void i64(std::int64_t v) { bytes(&v, sizeof v); }
  void f64(double v) {
    if (v == 0) v = 0;  // -0 == 0
    bytes(&v, sizeof v);
  }
  void str(std::string_view s) {
    i64(static_cast<std::int64_t>(s.size()));
    bytes(s.data(), s.size());
  }
  template <typename T>
  void list(const std::vector<T>& v) {
    i64(static_cast<std::int64_t>(v.size()));
    for (const auto& x : v) {
      if constexpr (std::is_floating_point_v<T>)
        f64(x);
      else
        i64(static_cast<std::int64_t>(x));
    }
  }
};
}  // namespace

std::string graph_fingerprint(const Graph& g) {
  Fnv f;
  f.str("weft.graph/fingerprint/1");
  f.i64(static_cast<std::int64_t>(g.tensors().size()));
  for (TensorId t = 0; t < static_cast<TensorId>(g.tensors().size()); ++t) {
    const auto& x = g.tensor(t);
    f.str(x.name);
    f.list(x.shape);
    f.i64(static_cast<std::int64_t>(x.dtype));
    f.i64(static_cast<std::int64_t>(x.role));
    f.i64(x.producer);
    f.i64(g.grad_of(t).value_or(-1));
  }
  f.i64(static_cast<std::int64_t>(g.ops().size()));
  for (const auto& op : g.ops()) {
    f.i64(static_cast<std::int64_t>(op.kind));
    f.str(op.name);
    f.list(op.inputs);
    f.list(op.outputs);
    f.str(op.attrs.equation);
    f.i64(static_cast<std::int64_t>(op.attrs.unary));
    f.i64(static_cast<std::int64_t>(op.attrs.binary));
    f.i64(static_cast<std::int64_t>(op.attrs.reduce));
    f.list(op.attrs.axes);
    f.list(op.attrs.ints);
    f.f64(op.attrs.scalar);
    f.list(op.attrs.scalars);
  }
  f.list(g.outputs());
  f.i64(g.loss().value_or(-1));
  return fmt::format("{:016x}", f.h);
}

}  // namespace weft::ir
