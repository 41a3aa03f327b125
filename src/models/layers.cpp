// Building blocks of the zoo: linear, layer norm, attention, FFN, conv, batch norm.
#include "layers.hpp"

#include <cmath>

#include "weft/core/error.hpp"

namespace weft::models::detail {

TensorId Net::linear(TensorId x, std::int64_t in, std::int64_t out, const std::string& name, bool bias) {
  TensorId w = param(name + ".w", {in, out});
  TensorId y = g_.matmul(x, w, bias ? name + ".matmul" : name);
  if (!bias) return y;
  return g_.add(y, param(name + ".b", {out}), name);
}

TensorId Net::layer_norm(TensorId x, std::int64_t h, const std::string& name) {
  return g_.layer_norm(x, param(name + ".gamma", {h}), param(name + ".beta", {h}), 1e-5, name);
}

TensorId Net::attention(TensorId x, std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t heads,
                        const std::string& name, bool fused, double probs_dropout, bool causal) {
  const std::int64_t d = h / heads;
  // The fused projection's output dim 3h is the product of factors (3, n, d): sharding the
  // heads factor of this einsum's output is a strided sharding of its dim (Rhino's case).
  TensorId qkv = linear(x, h, 3 * h, name + ".qkv");
  TensorId qkv5 = g_.reshape(qkv, {b, s, 3, heads, d}, name + ".qkv_heads");
  auto part = [&](int i, const char* which) {
    TensorId p = g_.slice(qkv5, 2, i, i + 1, name + "." + which + "_slice");
    return g_.reshape(p, {b, s, heads, d}, name + "." + which);
  };
  TensorId q = part(0, "q"), k = part(1, "k"), v = part(2, "v");
  WEFT_CHECK(!(fused && probs_dropout > 0), "{}: the fused attention op has no dropout", name);
  WEFT_CHECK(fused || !causal, "{}: a causal mask is the fused attention op's only", name);
  if (fused) {
    // [b,s,n,d] -> [b,n,s,d] (torch's SDPA layout), one op for the core, and back.
    // (one statement each: the ops' order must not depend on the order a call evaluates its arguments)
    const TensorId qh = g_.transpose(q, {0, 2, 1, 3}, name + ".q_heads");
    const TensorId kh = g_.transpose(k, {0, 2, 1, 3}, name + ".k_heads");
    const TensorId vh = g_.transpose(v, {0, 2, 1, 3}, name + ".v_heads");
    const TensorId core =  // (its log-sum-exp is for the backward)
        g_.attention(qh, kh, vh, 1.0 / std::sqrt(static_cast<double>(d)), causal, name + ".core").first;
    TensorId ctx = g_.transpose(core, {0, 2, 1, 3}, name + ".context");
    ctx = g_.reshape(ctx, {b, s, h}, name + ".context_merged");
    return linear(ctx, h, h, name + ".proj");
  }
  q = g_.unary(ir::UnaryFn::Scale, q, name + ".q_scaled", 1.0 / std::sqrt(static_cast<double>(d)));
  TensorId scores = g_.einsum("bsnd,btnd->bnst", {q, k}, name + ".scores");
  TensorId probs = dropout(g_.softmax(scores, -1, name + ".probs"), probs_dropout, name + ".probs_dropout");
  TensorId ctx = g_.einsum("bnst,btnd->bsnd", {probs, v}, name + ".context");
  ctx = g_.reshape(ctx, {b, s, h}, name + ".context_merged");
  return linear(ctx, h, h, name + ".proj");
}

TensorId Net::ffn(TensorId x, std::int64_t h, std::int64_t f, const std::string& name) {
  TensorId y = linear(x, h, f, name + ".fc1");
  y = gelu(y, name + ".gelu");
  return linear(y, f, h, name + ".fc2");
}

TensorId Net::conv(TensorId x, std::int64_t cin, std::int64_t cout, std::int64_t k, std::int64_t stride,
                   std::int64_t pad, const std::string& name) {
  return g_.conv2d(x, param(name + ".w", {cout, cin, k, k}), stride, pad, name);
}

TensorId Net::channel_bias(TensorId x, std::int64_t c, const std::string& name) {
  return g_.add(x, param(name + ".b", {c, 1, 1}), name + ".bias");
}

TensorId Net::batch_norm(TensorId x, std::int64_t c, const std::string& name) {
  TensorId y = g_.mul(x, param(name + ".gamma", {c, 1, 1}), name + ".scale");
  return g_.add(y, param(name + ".beta", {c, 1, 1}), name);
}

}  // namespace weft::models::detail
