#pragma once
// An op of the IR: its kind and attributes say what it computes (for the interpreter and
// autodiff); its index map says how its dimensions relate (for everything else).
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "weft/ir/index_map.hpp"
#include "weft/ir/tensor.hpp"

namespace weft::ir {

enum class OpKind : std::uint8_t {
  // forward ops
  Einsum,        // attrs.equation "bsh,hf->bsf"; matmul, batched matmul, MoE dispatch/combine
  Unary,         // attrs.unary; attrs.scalar for Scale / Pow
  Binary,        // attrs.binary, numpy broadcasting (trailing alignment)
  Reduce,        // attrs.reduce over attrs.axes (dims removed)
  Softmax,       // over attrs.axes[0]
  LayerNorm,     // (x, gamma, beta) over the last dim, eps = attrs.scalar
  Embedding,     // (table[v,h], ids[...]) -> [..., h]
  CrossEntropy,  // (logits[..., v], labels[...] int[, weight[v]]) -> scalar mean loss; attributes in
                 // CrossEntropyAttrs below (ignore_index, label smoothing, the normaliser)
  Transpose,     // attrs.axes = permutation: out dim i = in dim perm[i]
  Reshape,       // row-major reshape to attrs.ints
  Concat,        // along attrs.axes[0]
  Slice,         // attrs.axes[0], attrs.ints = {begin, end}
  Conv2d,        // (x[n,c,H,W], w[o,c,r,t]) attrs.ints = {stride, pad}
  Pool2d,        // x[n,c,H,W], attrs.reduce Max|Mean, attrs.ints = {kernel, stride, pad}
  Opaque,        // dims can only be replicated; attrs.ints = output shape, attrs.scalar = FLOPs
  Dropout,       // x -> x·keep/(1−p), p = attrs.scalar, attrs.ints = {seed}; keep is a counter-based
                 // hash of (seed, step, the element's global index): any shard computes its own part
                 // of the same mask. attrs.axes = {0}: dim 0 is the batch (set by plan::rebatch), the
                 // index counts samples across the step's micro-batches and replicas. Its own
                 // gradient: the same op on dy.
  // Routing ops (MoE routers: top-k experts, gather their outputs, scatter-add the combine). The
  // routed axis (attrs.axes[0]) is need-replication: a tile holds it whole, so a kernel on local
  // tiles is the global op; every other dim is parallel (index and data share those dims).
  Gather,      // (x, index int) -> out[i] = x[i with i[axis] := index[i]]: torch.gather; index has
               // x's rank, its shape off the axis equal to x's; out has index's shape
  ScatterAdd,  // (base, index int, src) -> base, then out[i with i[axis] := index[i]] += src[i]:
               // torch.scatter_add; or (index, src) with attrs.ints = {result axis size}: a zero
               // base (gather's adjoint). index and src share one shape; off the axis, base's.
  TopK,        // x -> (values, indices int) of the attrs.ints[0] largest (attrs.ints[1] = 1) or
               // smallest (0) along attrs.axes[0], sorted best first; ties: the lower index first
  // ops made by autodiff and the optimizer
  UnaryGrad,           // (x, dy) -> dx for attrs.unary
  BroadcastTo,         // x -> attrs.ints shape, inserting the dims in attrs.axes (reduce/binary grads)
  SoftmaxGrad,         // (y, dy) -> dx over attrs.axes[0]
  LayerNormGrad,       // (x, gamma, dy) -> dx, eps = attrs.scalar
  LayerNormParamGrad,  // (x, dy) -> (dgamma, dbeta), eps = attrs.scalar
  EmbeddingGrad,       // (ids, dy) -> dtable, table shape in attrs.ints
  CrossEntropyGrad,    // (logits, labels, dloss[, weight]) -> dlogits, the forward's attrs
  Pad,                 // inverse of Slice along attrs.axes[0]: attrs.ints = {begin, end, full size}
  Conv2dGradInput,     // (dy, w) -> dx, attrs.ints = {stride, pad, H, W}
  Conv2dGradWeight,    // (x, dy) -> dw, attrs.ints = {stride, pad, r, t}
  Pool2dGrad,          // (x, y, dy) -> dx, same attrs as Pool2d
  // Optimizer updates; with master weights the f32 master copy follows the gradient and the
  // new parameter is its cast (outputs in the order of the state inputs).
  SgdUpdate,   // (param, grad[, master][, buf]) -> (param'[, master'][, buf']), attrs.scalars =
               // {lr} or {lr, momentum} (the momentum form reads and writes buf)
  AdamUpdate,  // (param, grad[, master], m, v) -> (param'[, master'], m', v'),
               // attrs.scalars = {lr, b1, b2, eps, step}
  // Kinds added later go last: a graph's fingerprint (plans and programs record it) hashes a kind's
  // number, so inserting one above would change the fingerprint of every graph saved before.
  // Fused (flash) attention: (q[..., s, d], k[..., t, d], v[..., t, e]) -> (out[..., s, e],
  // lse[..., s] f32) with out = softmax(scale·q·kᵀ)·v and lse the log-sum-exp of each score row;
  // scale = attrs.scalar, attrs.ints = {causal}: causal keeps key j <= query i (torch's is_causal,
  // top-left aligned). What it saves for the backward is O(s): out and lse, never the s x t
  // probabilities. Leading dims (batch, heads) and the query sequence are parallel; the key/value
  // sequence and the head dims need replication (attention.hpp).
  Attention,
  AttentionGrad,  // (q, k, v, out, lse, dout) -> (dq, dk, dv), Attention's attrs: the
                  // probabilities recomputed from q, k and lse (flash attention's backward)
  // A floating dtype conversion (torch's x.to(dtype)): x -> x rounded to the dtype in attrs.ints =
  // {DType number} (floating only); elementwise. Its gradient is the cast of dy back to x's dtype.
  Cast,
};

enum class UnaryFn : std::uint8_t {
  Identity,
  Neg,
  Relu,
  Gelu,
  Tanh,
  Exp,
  Log,
  Sigmoid,
  Sqrt,
  Rsqrt,
  Square,
  Scale,
  GeluErf
};
enum class BinaryFn : std::uint8_t { Add, Sub, Mul, Div, Max };
enum class ReduceFn : std::uint8_t { Sum, Max, Mean };

std::string_view op_kind_name(OpKind k);
OpKind parse_op_kind(std::string_view name);
std::string_view unary_fn_name(UnaryFn f);
UnaryFn parse_unary_fn(std::string_view name);
std::string_view binary_fn_name(BinaryFn f);
BinaryFn parse_binary_fn(std::string_view name);
std::string_view reduce_fn_name(ReduceFn f);
ReduceFn parse_reduce_fn(std::string_view name);

// Attributes of every kind in one plain struct (see OpKind for which fields a kind reads), so
// that ops stay value types that compare, copy and serialise without a variant per kind.
struct OpAttrs {
  std::string equation;
  UnaryFn unary = UnaryFn::Identity;
  BinaryFn binary = BinaryFn::Add;
  ReduceFn reduce = ReduceFn::Sum;
  std::vector<int> axes;
  std::vector<std::int64_t> ints;
  double scalar = 0;
  std::vector<double> scalars;
  bool operator==(const OpAttrs&) const = default;
};

// CrossEntropy's attributes, torch's F.cross_entropy: labels equal to ignore_index contribute 0;
// the loss is Σ_t [y_t ≠ ii]·ℓ_t / D with ℓ_t = (1 − ε)·w[y_t]·nll_t + ε/C·Σ_c w_c·(lse_t − x_tc)
// (w ≡ 1 without the weight operand). D, the normaliser: by default the weighted valid count
// Σ_t w[y_t]·[y_t ≠ ii] of the WHOLE step (torch's mean; the executors give each micro-batch its
// share of it, KernelContext::ce_valid_fraction); with token_mean the token count (reduction='sum'
// is that times the step's tokens, a literal). Stored as attrs.ints = {ignore_index, token_mean},
// attrs.scalar = ε; the defaults are stored as no attribute at all (graphs made before keep their
// fingerprint).
struct CrossEntropyAttrs {
  std::int64_t ignore_index = -100;
  double label_smoothing = 0;
  bool token_mean = false;
  bool operator==(const CrossEntropyAttrs&) const = default;
};

struct Op {
  OpKind kind = OpKind::Opaque;
  std::string name;
  std::vector<TensorId> inputs;
  std::vector<TensorId> outputs;
  OpAttrs attrs;
  IndexMap index_map;  // derived from (kind, attrs, shapes) by op_rules; never set by hand

  double flops() const { return index_map.flops(); }
  bool operator==(const Op&) const = default;
};

// The attributes of a CrossEntropy / CrossEntropyGrad op, and their encoding.
CrossEntropyAttrs cross_entropy_attrs(const Op& op);
OpAttrs encode_cross_entropy_attrs(const CrossEntropyAttrs& a);
// A Cast op's target dtype (attrs.ints = {DType number}); weft::Error naming `op` unless it is one
// floating dtype.
DType cast_dtype(const OpAttrs& a, std::string_view op);
OpAttrs encode_cast_attrs(DType to);
// Whether the op has class weights (the forward's operand 2, the gradient's operand 3).
bool cross_entropy_weighted(const Op& op);

}  // namespace weft::ir
