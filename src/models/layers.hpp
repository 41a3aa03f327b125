#pragma once
// Internal building blocks shared by the zoo's builders (not installed): a thin wrapper over
// ir::Graph that names parameters and ops under a prefix and keeps one dtype.
#include <cstdint>
#include <string>

#include "weft/ir/graph.hpp"

namespace weft::models::detail {

using ir::TensorId;

class Net {
 public:
  Net(ir::Graph& g, DType dtype) : g_(g), dt_(dtype) {}
  ir::Graph& g() { return g_; }
  DType dtype() const { return dt_; }

  TensorId param(const std::string& name, ir::Shape shape) {
    return g_.parameter(name, std::move(shape), dt_);
  }
  // x[..., in] -> x @ W[in, out] (+ b[out]).
  TensorId linear(TensorId x, std::int64_t in, std::int64_t out, const std::string& name, bool bias = true);
  // LayerNorm over the last dim (size h) with gamma and beta.
  TensorId layer_norm(TensorId x, std::int64_t h, const std::string& name);
  // Multi-head self-attention of x[b,s,h] with a fused QKV weight [h,3h] whose output is viewed
  // as [b,s,3,n,d]; Q scaled by 1/sqrt(d); no causal mask (it changes neither FLOPs nor
  // parameters). Returns the output projection [b,s,h] (before the residual add). `fused`: the
  // core softmax(q·kᵀ/√d)·v as one ir Attention op on q, k, v viewed as [b,n,s,d].
  // `probs_dropout` drops the softmax probabilities (not with `fused`); `causal` masks the fused
  // op (a query sees the keys up to its own position; only with `fused`).
  TensorId attention(TensorId x, std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t heads,
                     const std::string& name, bool fused = false, double probs_dropout = 0.0,
                     bool causal = false);
  // Training-mode dropout with probability p (x itself when p = 0); every site of the model gets
  // its own mask seed, numbered in build order, so a model's masks are the same build after build.
  TensorId dropout(TensorId x, double p, const std::string& name) {
    return p > 0 ? g_.dropout(x, p, next_dropout_seed_++, name) : x;
  }
  // Dense FFN h -> f (GeLU) -> h with biases.
  TensorId ffn(TensorId x, std::int64_t h, std::int64_t f, const std::string& name);
  // conv2d without bias: x[n,cin,H,W] * w[cout,cin,k,k].
  TensorId conv(TensorId x, std::int64_t cin, std::int64_t cout, std::int64_t k, std::int64_t stride,
                std::int64_t pad, const std::string& name);
  // Per-channel bias b[c,1,1] added to x[n,c,H,W].
  TensorId channel_bias(TensorId x, std::int64_t c, const std::string& name);
  // BatchNorm as a per-channel affine: x * gamma[c,1,1] + beta[c,1,1].
  TensorId batch_norm(TensorId x, std::int64_t c, const std::string& name);
  TensorId relu(TensorId x, const std::string& name) { return g_.unary(ir::UnaryFn::Relu, x, name); }
  TensorId gelu(TensorId x, const std::string& name) { return g_.unary(ir::UnaryFn::Gelu, x, name); }

 private:
  ir::Graph& g_;
  DType dt_;
  std::int64_t next_dropout_seed_ = 1;
};

}  // namespace weft::models::detail
