// Llama forward graphs (Llama 2 / Llama 3): RMSNorm, grouped-query attention with rotary position
// embedding, SwiGLU, untied LM head, no biases, causal attention.
//
// Parameter count (the closed form the tests check against the built graphs), d = h / n:
//   block: q h·n·d + k, v 2·h·kv·d + o n·d·h + gate, up, down 3·h·f + two RMSNorm scales 2h
//   Llama: L·block + V·h (token embedding) + h (final norm) + h·V (the untied LM head)
// Model FLOPs (llama_flops): 3 × the forward matmuls = 6·(N − V·h)·T + 12·L·h·s·T, T = b·s tokens.
#include <fmt/format.h>

#include <cmath>

#include "layers.hpp"
#include "weft/core/error.hpp"
#include "weft/models/models.hpp"

namespace weft::models {

using detail::Net;
using ir::TensorId;

namespace {

// A Constant leaf with its value (row-major), so that every executor reads the same numbers.
TensorId constant(ir::Graph& g, const std::string& name, ir::Shape shape, DType dt,
                  std::vector<double> values) {
  const TensorId t = g.constant(name, shape, dt);
  g.set_value(t, ir::HostTensor{std::move(shape), std::move(values)});
  return t;
}

struct Tables {
  TensorId cos = -1, sin = -1;  // [s, 1, d]: position p, broadcast over the heads, rotary dim i
  TensorId eps = -1;            // RMSNorm's eps, a scalar
  TensorId positions = -1;      // [s]: 0 .. s-1, for the causal mask (unfused attention only)
  DType mask_dtype = DType::F32;
};

// Rotary tables as Hugging Face's LlamaRotaryEmbedding (rope_type "default") computes them:
// inv_freq_j = 1 / θ^(2j/d) for j < d/2, the angle p · inv_freq_{i mod d/2} for i < d (the
// frequencies concatenated twice, matching rotate_half's halves).
Tables tables(ir::Graph& g, const LlamaConfig& c) {
  const std::int64_t S = c.seq, d = c.head_dim(), half = d / 2;
  std::vector<double> cs(static_cast<std::size_t>(S * d)), sn(cs.size());
  for (std::int64_t p = 0; p < S; ++p)
    for (std::int64_t i = 0; i < d; ++i) {
      const double inv_freq =
          1.0 / std::pow(c.rope_theta, static_cast<double>(2 * (i % half)) / static_cast<double>(d));
      const double a = static_cast<double>(p) * inv_freq;
      cs[static_cast<std::size_t>(p * d + i)] = std::cos(a);
      sn[static_cast<std::size_t>(p * d + i)] = std::sin(a);
    }
  Tables t;
  t.cos = constant(g, "rope.cos", {S, 1, d}, c.dtype, std::move(cs));
  t.sin = constant(g, "rope.sin", {S, 1, d}, c.dtype, std::move(sn));
  t.eps = constant(g, "rms_norm.eps", {}, c.dtype, {c.norm_eps});
  if (!c.fused_attention) {
    // Positions count exactly in f32 up to 2^24 (in bf16 / f16 neighbours above 256 would round
    // to one value and the mask would let a query see the next key); the mask is cast after.
    t.mask_dtype = c.dtype == DType::F64 ? DType::F64 : DType::F32;
    std::vector<double> pos(static_cast<std::size_t>(S));
    for (std::int64_t p = 0; p < S; ++p) pos[static_cast<std::size_t>(p)] = static_cast<double>(p);
    t.positions = constant(g, "causal.positions", {S}, t.mask_dtype, std::move(pos));
  }
  return t;
}

// x · rsqrt(mean(x²) + eps) · g over the last dim (Hugging Face's LlamaRMSNorm, in that order).
TensorId rms_norm(Net& net, TensorId x, std::int64_t h, const Tables& t, const std::string& name) {
  ir::Graph& g = net.g();
  const ir::Shape shape = g.tensor(x).shape;  // a copy: adding ops below grows the tensor table
  const int last = static_cast<int>(shape.size()) - 1;
  TensorId ms =
      g.reduce(ir::ReduceFn::Mean, g.unary(ir::UnaryFn::Square, x, name + ".square"), {last}, name + ".mean");
  ir::Shape keep = shape;
  keep.back() = 1;
  ms = g.reshape(ms, keep, name + ".mean_keepdim");
  const TensorId r = g.unary(ir::UnaryFn::Rsqrt, g.add(ms, t.eps, name + ".eps"), name + ".rsqrt");
  const TensorId normed = g.mul(x, r, name + ".normed");
  return g.mul(normed, net.param(name + ".gamma", {h}), name);
}

// x[b,s,n,d] · cos + rotate_half(x) · sin, rotate_half(x) = concat(−x[..., d/2:], x[..., :d/2]).
TensorId rotary(ir::Graph& g, TensorId x, std::int64_t d, const Tables& t, const std::string& name) {
  const TensorId lo = g.slice(x, 3, 0, d / 2, name + ".lo");
  const TensorId hi = g.slice(x, 3, d / 2, d, name + ".hi");
  const TensorId neg_hi = g.unary(ir::UnaryFn::Neg, hi, name + ".neg_hi");
  const TensorId rotated = g.concat({neg_hi, lo}, 3, name + ".rotate_half");
  const TensorId a = g.mul(x, t.cos, name + ".cos");
  const TensorId b = g.mul(rotated, t.sin, name + ".sin");
  return g.add(a, b, name);
}

// x[b,s,kv,d] -> [b,s,kv·rep,d], head j = group j / rep (Hugging Face's repeat_kv).
TensorId repeat_kv(ir::Graph& g, TensorId x, std::int64_t rep, const std::string& name) {
  if (rep == 1) return x;
  const ir::Shape s = g.tensor(x).shape;
  const TensorId x5 = g.reshape(x, {s[0], s[1], s[2], 1, s[3]}, name + ".groups");
  ir::OpAttrs a;
  a.ints = {s[0], s[1], s[2], rep, s[3]};
  const TensorId wide = g.add_op(ir::OpKind::BroadcastTo, {x5}, std::move(a), name + ".expand")[0];
  return g.reshape(wide, {s[0], s[1], s[2] * rep, s[3]}, name);
}

// The causal mask [s, s] added to the scores: 0 where key j <= query i, −1e9·(j − i) above the
// diagonal, whose exp underflows to exactly 0 (f16 rounds it to −inf: the same). Made from the
// positions in each layer (a few s x s element-wise ops next to the b·n·s² scores) rather than
// once, so that no s x s activation crosses a pipeline stage boundary.
TensorId causal_mask(ir::Graph& g, const Tables& t, std::int64_t S, DType dt, const std::string& name) {
  const TensorId q = g.reshape(t.positions, {S, 1}, name + ".query_positions");
  const TensorId k = g.reshape(t.positions, {1, S}, name + ".key_positions");
  const TensorId ahead =
      g.unary(ir::UnaryFn::Relu, g.binary(ir::BinaryFn::Sub, k, q, name + ".offset"), name + ".ahead");
  const TensorId mask = g.unary(ir::UnaryFn::Scale, ahead, name, -1e9);
  return t.mask_dtype == dt ? mask : g.cast(mask, dt, name + ".cast");
}

TensorId attention(Net& net, TensorId x, const LlamaConfig& c, const Tables& t, const std::string& p) {
  ir::Graph& g = net.g();
  const std::int64_t B = c.batch, S = c.seq, H = c.hidden, n = c.heads, kv = c.kv_heads, d = c.head_dim();
  TensorId q = g.reshape(net.linear(x, H, n * d, p + ".q", false), {B, S, n, d}, p + ".q_heads");
  TensorId k = g.reshape(net.linear(x, H, kv * d, p + ".k", false), {B, S, kv, d}, p + ".k_heads");
  TensorId v = g.reshape(net.linear(x, H, kv * d, p + ".v", false), {B, S, kv, d}, p + ".v_heads");
  q = rotary(g, q, d, t, p + ".q_rotary");
  k = repeat_kv(g, rotary(g, k, d, t, p + ".k_rotary"), n / kv, p + ".k_repeated");
  v = repeat_kv(g, v, n / kv, p + ".v_repeated");
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  TensorId ctx;
  if (c.fused_attention) {
    // (one statement each: the ops' order must not depend on the order a call evaluates its arguments)
    const TensorId qh = g.transpose(q, {0, 2, 1, 3}, p + ".q_bnsd");
    const TensorId kh = g.transpose(k, {0, 2, 1, 3}, p + ".k_bnsd");
    const TensorId vh = g.transpose(v, {0, 2, 1, 3}, p + ".v_bnsd");
    const TensorId core = g.attention(qh, kh, vh, scale, true, p + ".core").first;
    ctx = g.transpose(core, {0, 2, 1, 3}, p + ".context");
  } else {
    q = g.unary(ir::UnaryFn::Scale, q, p + ".q_scaled", scale);
    TensorId scores = g.einsum("bsnd,btnd->bnst", {q, k}, p + ".scores");
    scores = g.add(scores, causal_mask(g, t, S, c.dtype, p + ".causal_mask"), p + ".masked_scores");
    const TensorId probs = g.softmax(scores, -1, p + ".probs");
    ctx = g.einsum("bnst,btnd->bsnd", {probs, v}, p + ".context");
  }
  ctx = g.reshape(ctx, {B, S, n * d}, p + ".context_merged");
  return net.linear(ctx, n * d, H, p + ".o", false);
}

// down(silu(gate x) · up x), silu(z) = z · sigmoid(z).
TensorId swiglu(Net& net, TensorId x, const LlamaConfig& c, const std::string& p) {
  ir::Graph& g = net.g();
  const TensorId gate = net.linear(x, c.hidden, c.ffn, p + ".gate", false);
  const TensorId up = net.linear(x, c.hidden, c.ffn, p + ".up", false);
  const TensorId silu = g.mul(gate, g.unary(ir::UnaryFn::Sigmoid, gate, p + ".sigmoid"), p + ".silu");
  return net.linear(g.mul(silu, up, p + ".gated"), c.ffn, c.hidden, p + ".down", false);
}

}  // namespace

ir::Graph llama(const LlamaConfig& c) {
  c.validate();
  ir::Graph g(c.name);
  Net net(g, c.dtype);
  const std::int64_t H = c.hidden;
  const TensorId ids = g.input("tokens", {c.batch, c.seq}, DType::I32);
  const TensorId labels = g.input("labels", {c.batch, c.seq}, DType::I32);
  const Tables t = tables(g, c);
  TensorId x = g.embedding(net.param("wte", {c.vocab, H}), ids, "embed.tokens");
  for (std::int64_t l = 0; l < c.layers; ++l) {
    const std::string p = fmt::format("h{}", l);
    const TensorId a = attention(net, rms_norm(net, x, H, t, p + ".attn_norm"), c, t, p + ".attn");
    x = g.add(x, a, p + ".res1");
    const TensorId m = swiglu(net, rms_norm(net, x, H, t, p + ".mlp_norm"), c, p + ".mlp");
    x = g.add(x, m, p + ".res2");
  }
  x = rms_norm(net, x, H, t, "norm_f");
  const TensorId logits = net.linear(x, H, c.vocab, "lm_head", false);  // untied
  g.set_loss(g.cross_entropy(logits, labels, "loss"));
  return g;
}

double llama_flops(const LlamaConfig& c) {
  c.validate();
  const double L = static_cast<double>(c.layers), h = static_cast<double>(c.hidden),
               n = static_cast<double>(c.heads), kv = static_cast<double>(c.kv_heads),
               d = static_cast<double>(c.head_dim()), f = static_cast<double>(c.ffn),
               V = static_cast<double>(c.vocab), S = static_cast<double>(c.seq),
               T = static_cast<double>(c.batch) * S;
  const double block = h * n * d + 2 * h * kv * d + n * d * h + 3 * h * f + 2 * h;
  const double N = L * block + h + h * V;  // every parameter but the embedding table
  return 6.0 * N * T + 12.0 * L * n * d * S * T;
}

}  // namespace weft::models
