#pragma once
// A GPT block built with the IR builder (test helper): LN -> Q,K,V [h,h] -> attention -> out
// projection -> residual -> LN -> FFN [h,4h] gelu [4h,h] -> residual -> mean loss.
#include <string>

#include "weft/ir/graph.hpp"

namespace weft::spmd::testing {

inline ir::Graph gpt_block(std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t heads,
                           int layers = 1) {
  using namespace weft::ir;
  Graph g("gpt_block");
  const std::int64_t d = h / heads;
  TensorId x = g.input("x", {b, s, h});
  for (int l = 0; l < layers; ++l) {
    const std::string p = layers == 1 ? "" : "l" + std::to_string(l) + ".";
    TensorId g1 = g.parameter(p + "ln1.g", {h}), b1 = g.parameter(p + "ln1.b", {h});
    TensorId wq = g.parameter(p + "wq", {h, h}), wk = g.parameter(p + "wk", {h, h}),
             wv = g.parameter(p + "wv", {h, h});
    TensorId wo = g.parameter(p + "wo", {h, h});
    TensorId g2 = g.parameter(p + "ln2.g", {h}), b2 = g.parameter(p + "ln2.b", {h});
    TensorId w1 = g.parameter(p + "w1", {h, 4 * h}), w2 = g.parameter(p + "w2", {4 * h, h});
    TensorId a = g.layer_norm(x, g1, b1, 1e-5, p + "ln1");
    auto heads_of = [&](TensorId w, const std::string& n) {
      TensorId y = g.einsum("bsh,hf->bsf", {a, w}, p + n);
      return g.reshape(y, {b, s, heads, d}, p + n + ".heads");
    };
    TensorId q = heads_of(wq, "q"), k = heads_of(wk, "k"), v = heads_of(wv, "v");
    TensorId sc = g.einsum("bsnd,btnd->bnst", {q, k}, p + "scores");
    TensorId sc2 = g.unary(UnaryFn::Scale, sc, p + "scale", 1.0 / 8.0);
    TensorId pr = g.softmax(sc2, -1, p + "probs");
    TensorId ctx = g.einsum("bnst,btnd->bsnd", {pr, v}, p + "ctx");
    TensorId ctx2 = g.reshape(ctx, {b, s, h}, p + "ctx.merge");
    TensorId o = g.einsum("bsh,hk->bsk", {ctx2, wo}, p + "out");
    TensorId r1 = g.add(x, o, p + "res1");
    TensorId a2 = g.layer_norm(r1, g2, b2, 1e-5, p + "ln2");
    TensorId f1 = g.einsum("bsh,hf->bsf", {a2, w1}, p + "ffn1");
    TensorId ge = g.unary(UnaryFn::Gelu, f1, p + "gelu");
    TensorId f2 = g.einsum("bsf,fh->bsh", {ge, w2}, p + "ffn2");
    x = g.add(r1, f2, p + "res2");
  }
  TensorId loss = g.reduce(ReduceFn::Mean, x, {0, 1, 2}, "loss");
  g.set_loss(loss);
  return g;
}

// A chain of einsums with weights: x -> [x W_i] -> ... -> mean (for O2 == O3 on chains).
inline ir::Graph mlp_chain(std::int64_t b, const std::vector<std::int64_t>& widths) {
  using namespace weft::ir;
  Graph g("mlp_chain");
  TensorId x = g.input("x", {b, widths[0]});
  for (std::size_t i = 0; i + 1 < widths.size(); ++i) {
    TensorId w = g.parameter("w" + std::to_string(i), {widths[i], widths[i + 1]});
    x = g.einsum("bi,io->bo", {x, w}, "mm" + std::to_string(i));
    if (i + 2 < widths.size()) x = g.unary(UnaryFn::Relu, x, "relu" + std::to_string(i));
  }
  g.set_loss(g.reduce(ReduceFn::Mean, x, {0, 1}, "loss"));
  return g;
}

}  // namespace weft::spmd::testing
