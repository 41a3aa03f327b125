// GPT, GShard MoE and BERT forward graphs.
//
// Parameter counts (closed forms the tests check against the built graphs):
//   block (attention + dense FFN f + 2 LN): 4h² + 4h + 2hf + f + h + 4h
//   GPT:  L·block(f=4h) + V·h (token embedding, tied with the logits) + S·h (positions) + 2h
//   MoE:  dense blocks as GPT with f=8h; an MoE block replaces the FFN by E·(2hf + f + h) + h·E
//   BERT: L·block + V·h + S·h + T·h + 2h (embedding LN) + h² + h + 2h (MLM dense + LN) + V
// Megatron's model FLOPs of a GPT step: 3 × forward matmul FLOPs =
//   3·(24·B·S·L·h² + 4·B·S²·L·h + 2·B·S·V·h) = 72·B·S·L·h²·(1 + S/(6h) + V/(12·L·h)).
#include <fmt/format.h>

#include "layers.hpp"
#include "weft/core/error.hpp"
#include "weft/models/models.hpp"

namespace weft::models {

using detail::Net;
using ir::TensorId;

namespace {

// The decoder LM that GPT and MoE share: token + learned position embedding, `layers` pre-LN
// blocks (attention, then ffn(l, x, prefix) on the second LN's output), a final LN, logits tied
// with the token embedding and the cross-entropy loss.
// Dropout (GPT only; the MoE builder passes none) as Megatron-LM places it: hidden on the embedding's
// output and on each branch's output before its residual add, attention on the probabilities.
struct Dropouts {
  double hidden = 0, attention = 0;
};

template <class Ffn>
void decoder_lm(ir::Graph& g, Net& net, std::int64_t B, std::int64_t S, std::int64_t H, std::int64_t heads,
                std::int64_t layers, std::int64_t vocab, Ffn&& ffn, bool fused_attention = false,
                Dropouts drop = {}, bool causal = false) {
  TensorId ids = g.input("tokens", {B, S}, DType::I32);
  TensorId labels = g.input("labels", {B, S}, DType::I32);
  TensorId wte = net.param("wte", {vocab, H});
  TensorId wpe = net.param("wpe", {S, H});
  TensorId x = g.embedding(wte, ids, "embed.tokens");
  x = g.add(x, wpe, "embed");  // [b,s,h] + [s,h]: positions broadcast over the batch
  x = net.dropout(x, drop.hidden, "embed.dropout");
  for (std::int64_t l = 0; l < layers; ++l) {
    const std::string p = fmt::format("h{}", l);
    TensorId a = net.layer_norm(x, H, p + ".ln1");
    a = net.attention(a, B, S, H, heads, p + ".attn", fused_attention, drop.attention, causal);
    x = g.add(x, net.dropout(a, drop.hidden, p + ".attn.dropout"), p + ".res1");
    TensorId m = net.layer_norm(x, H, p + ".ln2");
    x = g.add(x, net.dropout(ffn(l, m, p), drop.hidden, p + ".mlp.dropout"), p + ".res2");
  }
  x = net.layer_norm(x, H, "ln_f");
  TensorId logits = g.einsum("bsh,vh->bsv", {x, wte}, "logits");  // tied with the token embedding
  g.set_loss(g.cross_entropy(logits, labels, "loss"));
}

}  // namespace

ir::Graph gpt(const GptConfig& c) {
  c.validate();
  ir::Graph g(c.name);
  Net net(g, c.dtype);
  decoder_lm(
      g, net, c.batch, c.seq, c.hidden, c.heads, c.layers, c.vocab,
      [&](std::int64_t, TensorId m, const std::string& p) {
        return net.ffn(m, c.hidden, c.ffn_size(), p + ".mlp");
      },
      c.fused_attention, Dropouts{c.hidden_dropout, c.attention_dropout}, c.causal);
  return g;
}

double megatron_flops(const GptConfig& c) {
  c.validate();
  const double B = static_cast<double>(c.batch), S = static_cast<double>(c.seq),
               L = static_cast<double>(c.layers), h = static_cast<double>(c.hidden),
               V = static_cast<double>(c.vocab);
  return 72.0 * B * S * L * h * h * (1.0 + S / (6.0 * h) + V / (12.0 * L * h));
}

namespace {

// GShard's MoE FFN on x[g,s,m] (one group per sequence): gate logits gsm,me->gse and their
// softmax; the top-2 routing decision is the dispatch mask [g,s,e,c], an Input of the graph
// (computed from the gate by the runtime each step; top-k is not differentiable, so the mask
// carries no gradient either way); combine weights gsec = mask ⊙ gate probs keep the gate's
// gradient path; dispatch gsec,gsm->egcm; expert FFNs with the expert index on the weights
// egcm,emf->egcf and egcf,efm->egcm; combine gsec,egcm->gsm.
TensorId moe_ffn(Net& net, TensorId x, const MoeConfig& c, const std::string& p) {
  ir::Graph& g = net.g();
  const std::int64_t B = c.batch, S = c.seq, M = c.hidden, E = c.experts, F = c.ffn_size(), C = c.capacity();
  TensorId wg = net.param(p + ".gate.w", {M, E});
  TensorId gate = g.einsum("gsm,me->gse", {x, wg}, p + ".gate.logits");
  TensorId probs = g.softmax(gate, -1, p + ".gate.probs");
  TensorId mask = g.input(p + ".dispatch_mask", {B, S, E, C}, c.dtype);
  TensorId combine = g.einsum("gsec,gse->gsec", {mask, probs}, p + ".combine_weights");
  TensorId disp = g.einsum("gsec,gsm->egcm", {mask, x}, p + ".dispatch");
  TensorId h =
      g.einsum("egcm,emf->egcf", {disp, net.param(p + ".experts.wi", {E, M, F})}, p + ".experts.fc1.matmul");
  h = g.add(h, net.param(p + ".experts.bi", {E, 1, 1, F}), p + ".experts.fc1");
  h = net.gelu(h, p + ".experts.gelu");
  TensorId y =
      g.einsum("egcf,efm->egcm", {h, net.param(p + ".experts.wo", {E, F, M})}, p + ".experts.fc2.matmul");
  y = g.add(y, net.param(p + ".experts.bo", {E, 1, 1, M}), p + ".experts.fc2");
  return g.einsum("gsec,egcm->gsm", {combine, y}, p + ".combine");
}

}  // namespace

ir::Graph moe(const MoeConfig& c) {
  c.validate();
  ir::Graph g(c.name);
  Net net(g, c.dtype);
  decoder_lm(g, net, c.batch, c.seq, c.hidden, c.heads, c.layers, c.vocab,
             [&](std::int64_t l, TensorId m, const std::string& p) {
               const bool is_moe = (l % c.moe_every) == c.moe_every - 1;  // every other block: the odd ones
               return is_moe ? moe_ffn(net, m, c, p + ".moe")
                             : net.ffn(m, c.hidden, c.ffn_size(), p + ".mlp");
             });
  return g;
}

ir::Graph bert(const BertConfig& c) {
  c.validate();
  ir::Graph g(c.name);
  Net net(g, c.dtype);
  const std::int64_t B = c.batch, S = c.seq, H = c.hidden;
  TensorId ids = g.input("tokens", {B, S}, DType::I32);
  TensorId types = g.input("token_types", {B, S}, DType::I32);
  TensorId labels = g.input("labels", {B, S}, DType::I32);
  TensorId wte = net.param("embed.word", {c.vocab, H});
  TensorId x = g.embedding(wte, ids, "embed.tokens");
  x = g.add(x, net.param("embed.position", {S, H}), "embed.with_positions");
  x = g.add(x, g.embedding(net.param("embed.type", {c.type_vocab, H}), types, "embed.types"), "embed.sum");
  x = net.dropout(net.layer_norm(x, H, "embed.ln"), c.hidden_dropout, "embed.dropout");
  for (std::int64_t l = 0; l < c.layers; ++l) {  // post-LN blocks
    const std::string p = fmt::format("layer{}", l);
    TensorId a = net.attention(x, B, S, H, c.heads, p + ".attn", false, c.attention_dropout);
    a = net.dropout(a, c.hidden_dropout, p + ".attn.dropout");
    x = net.layer_norm(g.add(x, a, p + ".res1"), H, p + ".ln1");
    TensorId m = net.dropout(net.ffn(x, H, c.ffn_size(), p + ".mlp"), c.hidden_dropout, p + ".mlp.dropout");
    x = net.layer_norm(g.add(x, m, p + ".res2"), H, p + ".ln2");
  }
  TensorId t = net.gelu(net.linear(x, H, H, "mlm.dense"), "mlm.gelu");
  t = net.layer_norm(t, H, "mlm.ln");
  TensorId logits = g.einsum("bsh,vh->bsv", {t, wte}, "mlm.decoder");  // tied with the word embedding
  logits = g.add(logits, net.param("mlm.bias", {c.vocab}), "logits");
  g.set_loss(g.cross_entropy(logits, labels, "loss"));
  return g;
}

}  // namespace weft::models
