#pragma once
// The graph of the IR: tensors and ops, a builder API whose every call derives the op's index map
// (so a built graph is always shape-consistent), validation for graphs that come from outside
// (JSON), topological order, and the aggregate numbers the planner needs.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "weft/ir/leaf_value.hpp"
#include "weft/ir/op.hpp"
#include "weft/ir/op_rules.hpp"
#include "weft/ir/tensor.hpp"

namespace weft::ir {

class Graph {
 public:
  Graph() = default;
  explicit Graph(std::string name) : name_(std::move(name)) {}

  // ---- leaves
  TensorId input(std::string name, Shape shape, DType dtype = DType::F32);
  TensorId parameter(std::string name, Shape shape, DType dtype = DType::F32);
  TensorId constant(std::string name, Shape shape, DType dtype = DType::F32);
  TensorId buffer(std::string name, Shape shape, DType dtype = DType::F32);
  TensorId add_tensor(TensorInfo info);  // any role; producer must be kNoOp

  // ---- generic op: derives output shapes and the index map; returns the outputs. Op names are
  // unique within a graph (validate() requires it): a name already used throws weft::Error; an
  // empty name gets a fresh "<kind>_<n>".
  std::vector<TensorId> add_op(OpKind kind, const std::vector<TensorId>& inputs, OpAttrs attrs = {},
                               std::string name = {}, Role output_role = Role::Activation);

  // ---- builders for the forward op kinds (names are optional; a unique one is made)
  TensorId einsum(const std::string& equation, const std::vector<TensorId>& operands, std::string name = {});
  TensorId matmul(TensorId a, TensorId b, std::string name = {});  // [..., m, k] x [k, n]
  TensorId unary(UnaryFn fn, TensorId x, std::string name = {}, double scalar = 0);
  TensorId binary(BinaryFn fn, TensorId a, TensorId b, std::string name = {});
  // Training-mode dropout with probability p in [0, 1); `seed` keys its mask (give each dropout
  // of a model its own).
  TensorId dropout(TensorId x, double p, std::int64_t seed, std::string name = {});
  // x converted to the floating dtype `to` (torch's x.to(dtype)); x itself when it has that dtype.
  TensorId cast(TensorId x, DType to, std::string name = {});
  TensorId add(TensorId a, TensorId b, std::string name = {}) {
    return binary(BinaryFn::Add, a, b, std::move(name));
  }
  TensorId mul(TensorId a, TensorId b, std::string name = {}) {
    return binary(BinaryFn::Mul, a, b, std::move(name));
  }
  TensorId reduce(ReduceFn fn, TensorId x, std::vector<int> axes, std::string name = {});
  TensorId softmax(TensorId x, int axis = -1, std::string name = {});
  TensorId layer_norm(TensorId x, TensorId gamma, TensorId beta, double eps = 1e-5, std::string name = {});
  TensorId embedding(TensorId table, TensorId ids, std::string name = {});
  TensorId cross_entropy(TensorId logits, TensorId labels, std::string name = {});
  // torch's F.cross_entropy with ignore_index, label smoothing, the normaliser (CrossEntropyAttrs)
  // and class weights `weight` [v] (-1: none; a tensor no parameter reaches: torch does not
  // differentiate the weights).
  TensorId cross_entropy(TensorId logits, TensorId labels, const CrossEntropyAttrs& attrs,
                         TensorId weight = -1, std::string name = {});
  TensorId transpose(TensorId x, std::vector<int> perm, std::string name = {});
  TensorId reshape(TensorId x, Shape shape, std::string name = {});
  TensorId concat(const std::vector<TensorId>& xs, int axis, std::string name = {});
  TensorId slice(TensorId x, int axis, std::int64_t begin, std::int64_t end, std::string name = {});
  TensorId conv2d(TensorId x, TensorId w, std::int64_t stride = 1, std::int64_t pad = 0,
                  std::string name = {});
  TensorId pool2d(ReduceFn fn, TensorId x, std::int64_t kernel, std::int64_t stride, std::int64_t pad = 0,
                  std::string name = {});
  TensorId opaque(const std::vector<TensorId>& inputs, Shape out_shape, double flops, std::string name = {});
  // Routing (torch.gather / scatter_add / topk; op.hpp): the axis is need-replication.
  TensorId gather(TensorId x, TensorId index, int axis, std::string name = {});
  TensorId scatter_add(TensorId base, TensorId index, TensorId src, int axis, std::string name = {});
  // (values, indices) of the k largest (or smallest) along axis, sorted best first.
  std::pair<TensorId, TensorId> topk(TensorId x, std::int64_t k, int axis, bool largest = true,
                                     std::string name = {});
  // Fused attention (op.hpp): (out, lse) of softmax(scale·q·kᵀ)·v over q[..., s, d], k[..., t, d],
  // v[..., t, e]; scale defaults to 1/√d; causal keeps key j <= query i.
  std::pair<TensorId, TensorId> attention(TensorId q, TensorId k, TensorId v,
                                          std::optional<double> scale = {}, bool causal = false,
                                          std::string name = {});

  // ---- outputs: the loss (a scalar) and any other tensors a caller wants kept
  void set_loss(TensorId t);
  std::optional<TensorId> loss() const { return loss_; }
  void mark_output(TensorId t);
  const std::vector<TensorId>& outputs() const { return outputs_; }

  // ---- access
  const std::string& name() const { return name_; }
  void set_name(std::string n) { name_ = std::move(n); }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::vector<Op>& ops() const { return ops_; }
  const TensorInfo& tensor(TensorId t) const;
  const Op& op(OpId o) const;
  std::optional<TensorId> find_tensor(const std::string& name) const;
  void set_role(TensorId t, Role role);  // e.g. an optimizer op's state results
  bool has_op_name(const std::string& name) const { return op_names_.count(name) > 0; }
  std::vector<OpId> consumers(TensorId t) const;  // in op order; O(#ops): build an index for loops
  // The index: per tensor the ops reading it, in op order (an op once per operand that reads it).
  std::vector<std::vector<OpId>> consumer_index() const;
  // Bookkeeping for autodiff: which forward tensor a gradient/optimizer tensor belongs to.
  void set_grad_of(TensorId grad, TensorId of);
  std::optional<TensorId> grad_of(TensorId grad) const;
  // The gradient of a forward tensor, if made: the lowest-id tensor with grad_of == of whose role
  // is Gradient or Constant (the dloss seed); optimizer states and updated parameters that also
  // record grad_of are not gradients. O(1).
  std::optional<TensorId> grad(TensorId of) const;

  // ---- values a model carries (leaf_value.hpp): of Parameter, Buffer and Constant leaves.
  // set_value checks the leaf (a Parameter / Buffer / Constant without a producer), the shape (the
  // value's shape equal to the tensor's) and, for an integer tensor, integral values; weft::Error
  // naming the tensor otherwise. set_value_file names a tensor of a value file instead (its shape
  // is checked when read).
  void set_value(TensorId t, HostTensor value);
  void set_value_file(TensorId t, std::string file, std::string key);
  void set_value(TensorId t, LeafValue value);  // either kind, checked as above
  void clear_value(TensorId t);
  const LeafValue* value(TensorId t) const;  // null when the leaf has none
  const std::map<TensorId, LeafValue>& values() const { return values_; }
  // Whether Parameters without a value may be initialised from a seed (exec/init.hpp): true for
  // graphs built in code (the zoo, the builder API), false for an imported module, whose weights
  // are its own. Buffers and Constants are never seeded.
  bool seed_parameters() const { return seed_parameters_; }
  void set_seed_parameters(bool on) { seed_parameters_ = on; }

  // ---- analysis
  std::vector<OpId> topo_order() const;  // throws weft::Error on a cycle
  // Full check for graphs from outside: ids in range, each tensor produced at most once,
  // no dangling tensor, no cycle, every op's stored index map and output shapes equal to what
  // its rule derives. Throws weft::Error with a precise message.
  void validate() const;
  // Elements / bytes of the Parameter leaves (an updated parameter made by an optimizer op is a
  // Parameter tensor with a producer and is not counted again).
  std::int64_t num_params() const;
  std::int64_t param_bytes() const;
  double flops() const;      // Σ op FLOPs of this graph as it is
  std::string dump() const;  // one line per op

  // Content equality: name, tensors, ops, outputs, loss, grad_of, values and the seeding rule (not
  // the name counter).
  bool operator==(const Graph& o) const;

  // Used by the JSON loader: append a tensor / an op exactly as stored (no derivation, any
  // producer; validate() checks).
  TensorId add_tensor_unchecked(TensorInfo info);
  OpId add_op_unchecked(Op op);

 private:
  std::string unique_name(const std::string& base);
  std::string name_;
  std::vector<TensorInfo> tensors_;
  std::vector<Op> ops_;
  std::vector<TensorId> outputs_;
  std::optional<TensorId> loss_;
  std::vector<TensorId> grad_of_;  // per tensor: the forward tensor it is the gradient of, or -1
  std::map<TensorId, LeafValue> values_;
  bool seed_parameters_ = true;
  // Indices derived from the above (not part of equality): op names in use, and per forward tensor
  // its gradient (what grad() returns), so that builders and autodiff stay linear.
  std::unordered_set<std::string> op_names_;
  std::vector<TensorId> grad_index_;
  int name_counter_ = 0;
  void index_grad(TensorId grad, TensorId of);
};

// A content hash of the graph's structure (16 hex digits, FNV-1a 64): its tensors (name, shape,
// dtype, role, producer, grad_of), its ops (kind, name, operands, results, attributes), its
// outputs and loss. The graph's name, the values its leaves carry and the seeding rule are left
// out: a plan and a program depend on the structure only (the same plan runs whatever weights are
// loaded, a checkpoint does not invalidate it, and hashing gigabytes of weights — or reading value
// files — at every load would cost more than the check is worth). Plans and programs record the
// fingerprint of the graph they were made for (lower::verify).
std::string graph_fingerprint(const Graph& g);

}  // namespace weft::ir
