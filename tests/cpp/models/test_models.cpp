// Model zoo: parameter counts against hand-derived closed forms and the papers' names, the
// Megatron FLOPs formula against the graphs' matmuls, structure of each family, bad input, and a
// small GPT executed by the interpreter against a plain-loop forward pass.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <random>
#include <set>

#include "weft/core/error.hpp"
#include "weft/ir/autodiff.hpp"
#include "weft/ir/interpreter.hpp"
#include "weft/models/models.hpp"

using namespace weft;
using namespace weft::models;
using weft::ir::OpKind;

namespace {

using i64 = std::int64_t;

// ---- closed forms, derived by hand from each architecture (independent of the builders)
i64 block_params(i64 h, i64 f) { return 4 * h * h + 4 * h + 2 * h * f + f + h + 4 * h; }

i64 gpt_params(const GptConfig& c) {
  const i64 h = c.hidden;
  return c.layers * block_params(h, c.ffn_size()) + c.vocab * h + c.seq * h + 2 * h;
}

i64 moe_params(const MoeConfig& c) {
  const i64 h = c.hidden, f = c.ffn_size(), E = c.experts;
  const i64 n_moe = c.layers / c.moe_every, n_dense = c.layers - n_moe;
  const i64 attn_ln = 4 * h * h + 4 * h + 4 * h;
  return n_dense * block_params(h, f) + n_moe * (attn_ln + E * (2 * h * f + f + h) + h * E) + c.vocab * h +
         c.seq * h + 2 * h;
}

i64 bert_params(const BertConfig& c) {
  const i64 h = c.hidden;
  return c.layers * block_params(h, c.ffn_size()) + (c.vocab + c.seq + c.type_vocab) * h + 2 * h + h * h + h +
         2 * h + c.vocab;
}

i64 wrn_params(const WideResNetConfig& c) {
  const std::vector<int> stages =
      c.layers == 50 ? std::vector<int>{3, 4, 6, 3} : std::vector<int>{3, 4, 23, 3};
  const i64 C = c.channels, W = c.width_factor;
  i64 p = 3 * C * 49 + 2 * C, cin = C;
  for (int i = 0; i < 4; ++i) {
    const i64 f = C << i;
    for (int j = 0; j < stages[static_cast<std::size_t>(i)]; ++j) {
      p += cin * f + 9 * f * (W * f) + (W * f) * 4 * f + 2 * (f + W * f + 4 * f);
      if (j == 0) p += cin * 4 * f + 2 * 4 * f;  // every stage's first block projects
      cin = 4 * f;
    }
  }
  return p + cin * c.classes + c.classes;
}

i64 unet_params(const UNetConfig& c) {
  auto dc = [](i64 ci, i64 co) { return 9 * ci * co + 9 * co * co + 4 * co; };
  i64 p = 0, ci = c.in_channels, f = c.base_channels;
  for (i64 d = 0; d < c.depth; ++d) p += dc(ci, f), ci = f, f *= 2;
  p += dc(ci, f);
  for (i64 d = c.depth - 1; d >= 0; --d) {
    const i64 fo = c.base_channels << d;
    p += 4 * f * fo + fo + dc(2 * fo, fo);
    f = fo;
  }
  return p + c.base_channels * c.classes + c.classes;
}

i64 vgg_params(const Vgg19Config& c) {
  const std::vector<std::pair<int, i64>> st{{2, 64}, {2, 128}, {4, 256}, {4, 512}, {4, 512}};
  i64 p = 0, ci = 3;
  for (auto [n, co] : st)
    for (int k = 0; k < n; ++k) p += 9 * ci * co + co, ci = co;
  const i64 side = c.image / 32;
  return p + 512 * side * side * 4096 + 4096 + 4096 * 4096 + 4096 + 4096 * c.classes + c.classes;
}

// Llama, d = h / n: per block q h·n·d + k, v 2·h·kv·d + o n·d·h + gate, up, down 3·h·f + two RMSNorm
// scales 2h; the token table V·h, the final norm h and the untied head h·V; no biases.
i64 llama_params(const LlamaConfig& c) {
  const i64 h = c.hidden, n = c.heads, kv = c.kv_heads, d = c.head_dim(), f = c.ffn;
  return c.layers * (h * n * d + 2 * h * kv * d + n * d * h + 3 * h * f + 2 * h) + c.vocab * h + h +
         h * c.vocab;
}

i64 closed_form(const Preset& p) {
  if (p.family == "llama") return llama_params(llama_config(p.name));
  if (p.family == "gpt") return gpt_params(gpt_config(p.name));
  if (p.family == "moe") return moe_params(moe_config(p.name));
  if (p.family == "wide_resnet") return wrn_params(wide_resnet_config(p.name));
  if (p.family == "unet") return unet_params(unet_config(p.name));
  if (p.family == "vgg19") return vgg_params(vgg19_config(p.name));
  return bert_params(bert_config(p.name));
}

double einsum_flops(const ir::Graph& g) {
  double f = 0;
  for (const auto& op : g.ops())
    if (op.kind == OpKind::Einsum) f += op.flops();
  return f;
}

// Under the sanitizers (WEFT_SANITIZED, 5-10x slower) the whole-graph sweeps keep the smallest
// preset of each family and batch 1; the Release run keeps every preset and batch.
bool sanitized() { return std::getenv("WEFT_SANITIZED") != nullptr; }
bool in_sweep(const std::string& name) {
  static const std::set<std::string> small{"GPT-Medium", "MoE-8E-380M", "WR-1.3B",
                                           "UNet-33M",   "VGG19",       "BERT-large"};
  return !sanitized() || small.count(name) > 0;
}
std::vector<i64> sweep_batches(std::vector<i64> all) {
  return sanitized() ? std::vector<i64>{all.front()} : all;
}

int count_if_params(const ir::Graph& g) {
  return static_cast<int>(std::count_if(g.tensors().begin(), g.tensors().end(),
                                        [](const auto& t) { return t.role == ir::Role::Parameter; }));
}

int count(const ir::Graph& g, OpKind k) {
  return static_cast<int>(
      std::count_if(g.ops().begin(), g.ops().end(), [&](const auto& o) { return o.kind == k; }));
}

}  // namespace

TEST_CASE("models: every preset's parameter count equals its closed form and is within 3% of its name") {
  REQUIRE(presets().size() == 28);
  for (const auto& p : presets()) {
    CAPTURE(p.name);
    ir::Graph g = build_preset(p.name, 1);
    CHECK(g.num_params() == closed_form(p));
    const double dev = static_cast<double>(g.num_params()) / p.named_params - 1.0;
    CAPTURE(dev);
    // MoE-16E-1.3B: Rhino's and Alpa's config (L16 h768 ffn 6144, 16 experts) has 1.348B
    // parameters by Alpa's own formula too; the name rounds it down (+3.7%). Reported to the lead.
    // llama2-7b: Meta's 7B has 6.738B parameters (its model card's figure too); the name rounds up (-3.7%).
    const double tol = p.name == "MoE-16E-1.3B" || p.name == "llama2-7b" ? 0.04 : 0.03;
    CHECK(std::abs(dev) <= tol);
  }
  // Spot values derived by hand: GPT-3 175B = 96·(12h² + 13h) + 51200h + 1024h + 2h, h = 12288.
  CHECK(gpt_preset("GPT-3").num_params() == 96 * (12 * 12288LL * 12288 + 13 * 12288) + 52226 * 12288LL);
  CHECK(build_preset("VGG19").num_params() == 143'667'240);  // torchvision's vgg19 (no BN)
}

TEST_CASE("models: GPT matmul FLOPs are exactly Megatron's formula, total FLOPs within 1%") {
  // Hand value of the formula for GPT-Medium, batch 1: 72·1024·24·1024²·(1 + 1/6 + 51200/(12·24·1024)).
  const double medium = 72.0 * 1024 * 24 * 1048576.0 * (1 + 1024.0 / 6144 + 51200.0 / (12.0 * 24 * 1024));
  CHECK(megatron_flops(gpt_config("GPT-Medium")) == doctest::Approx(medium).epsilon(1e-12));
  for (const char* name : {"GPT-Medium", "GPT-Large", "GPT-XL", "GPT-2.7B", "GPT-6.7B", "GPT-175B"}) {
    if (!in_sweep(name)) continue;
    for (i64 batch : sweep_batches({1, 2, 8})) {
      CAPTURE(name);
      CAPTURE(batch);
      GptConfig c = gpt_config(name, batch);
      ir::Graph g = gpt(c);
      const double formula = megatron_flops(c);
      // Forward matmuls ×3 (backward = 2× forward for every einsum) is the formula exactly.
      CHECK(3 * einsum_flops(g) == doctest::Approx(formula).epsilon(1e-9));
      // All forward FLOPs (elementwise, softmax, layer norm, loss included) stay within 1%.
      CHECK(std::abs(3 * g.flops() / formula - 1) < 0.01);
    }
  }
}

TEST_CASE("models: GPT structure — fused QKV viewed as heads, tied logits, i32 labels") {
  GptConfig c;
  c.layers = 2, c.hidden = 64, c.heads = 4, c.seq = 16, c.vocab = 100, c.batch = 3;
  ir::Graph g = gpt(c);
  CHECK_NOTHROW(g.validate());
  CHECK(count(g, OpKind::LayerNorm) == 2 * 2 + 1);
  CHECK(count(g, OpKind::Softmax) == 2);
  CHECK(count(g, OpKind::Einsum) == 2 * 6 + 1);
  // The reshape of the fused projection splits 3h into the factors (3, n, d).
  const auto& r = g.op(g.tensor(*g.find_tensor("h0.attn.qkv_heads")).producer);
  REQUIRE(r.kind == OpKind::Reshape);
  REQUIRE(r.index_map.inputs[0][2].size() == 3);
  CHECK(r.index_map.factors[static_cast<std::size_t>(r.index_map.inputs[0][2][1])].size == 4);  // heads
  const auto& logits = g.op(g.tensor(*g.find_tensor("logits")).producer);
  CHECK(logits.inputs[1] == *g.find_tensor("wte"));  // tied embedding
  CHECK(g.tensor(*g.find_tensor("labels")).dtype == DType::I32);
  REQUIRE(g.loss().has_value());
  CHECK(g.tensor(*g.loss()).shape.empty());
  // dtype reaches parameters and activations; bytes follow.
  c.dtype = DType::BF16;
  ir::Graph h = gpt(c);
  CHECK(h.param_bytes() == 2 * h.num_params());
  CHECK(h.tensor(*h.find_tensor("h1.mlp.gelu")).dtype == DType::BF16);
}

TEST_CASE("models: a causal GPT masks its fused attention, about half the pairs; unfused it is refused") {
  GptConfig c;
  c.layers = 2, c.hidden = 64, c.heads = 4, c.seq = 16, c.vocab = 100, c.batch = 3, c.fused_attention = true;
  const ir::Graph plain = gpt(c);
  c.causal = true;
  const ir::Graph causal = gpt(c);
  CHECK(causal.num_params() == plain.num_params());
  auto attention_ops = [](const ir::Graph& g) {
    std::vector<const ir::Op*> out;
    for (const auto& op : g.ops())
      if (op.kind == OpKind::Attention) out.push_back(&op);
    return out;
  };
  const auto masked = attention_ops(causal), full = attention_ops(plain);
  REQUIRE(masked.size() == 2);
  REQUIRE(full.size() == 2);
  for (std::size_t i = 0; i < masked.size(); ++i) {
    CHECK(masked[i]->attrs.ints.at(0) == 1);
    CHECK(full[i]->attrs.ints.at(0) == 0);
    // Per head: causal keeps 1 + 2 + … + 16 = 136 of the 16 · 16 = 256 (query, key) pairs.
    CHECK(masked[i]->flops() == doctest::Approx(full[i]->flops() * 136.0 / 256.0));
  }
  CHECK(c.to_string().find(" causal") != std::string::npos);
  c.fused_attention = false;
  CHECK_THROWS_WITH_AS(gpt(c), doctest::Contains("causal attention is the fused op's mask"), Error);
}

TEST_CASE("models: MoE structure — expert index on the FFN weights, top-2 capacity, every other layer") {
  MoeConfig c = moe_config("MoE-8E-380M", 2);
  CHECK(c.capacity() == 2 * 1024 / 8);
  ir::Graph g = moe(c);
  CHECK_NOTHROW(g.validate());
  // Blocks 1, 3, 5, 7 are MoE.
  CHECK(g.find_tensor("h1.moe.combine").has_value());
  CHECK_FALSE(g.find_tensor("h0.moe.combine").has_value());
  CHECK(g.find_tensor("h0.mlp.fc1").has_value());
  const auto& wi = g.tensor(*g.find_tensor("h1.moe.experts.wi"));
  CHECK(wi.shape == ir::Shape{8, 768, 6144});
  const auto& fc1 = g.op(g.tensor(*g.find_tensor("h1.moe.experts.fc1.matmul")).producer);
  CHECK(fc1.attrs.equation == "egcm,emf->egcf");
  // The expert factor is parallel: sharding experts needs no reduction.
  for (const auto& f : fc1.index_map.factors)
    if (f.name == "e") CHECK(f.kind == ir::FactorKind::Parallel);
  const auto& mask = g.tensor(*g.find_tensor("h1.moe.dispatch_mask"));
  CHECK(mask.role == ir::Role::Input);
  CHECK(mask.shape == ir::Shape{2, 1024, 8, 256});
  // The gate gets a gradient path through the combine weights.
  const auto& comb = g.op(g.tensor(*g.find_tensor("h1.moe.combine_weights")).producer);
  CHECK(comb.inputs[1] == *g.find_tensor("h1.moe.gate.probs"));
}

TEST_CASE("models: vision structure — Wide-ResNet, U-Net skips, VGG19 classifier") {
  WideResNetConfig w;
  w.channels = 16, w.image = 64, w.batch = 2, w.classes = 10;
  ir::Graph gw = wide_resnet(w);
  CHECK_NOTHROW(gw.validate());
  CHECK(count(gw, OpKind::Conv2d) == 1 + 16 * 3 + 4);  // stem, 3 per block, 4 projections
  CHECK(gw.tensor(*gw.find_tensor("global_pool")).shape == ir::Shape{2, 32 * 16});
  CHECK(gw.tensor(*gw.find_tensor("stage3.block2.out")).shape == ir::Shape{2, 512, 2, 2});
  w.layers = 101;
  CHECK(count(wide_resnet(w), OpKind::Conv2d) == 1 + 33 * 3 + 4);

  UNetConfig u;
  u.base_channels = 8, u.image = 32, u.batch = 2;
  ir::Graph gu = unet(u);
  CHECK_NOTHROW(gu.validate());
  CHECK(count(gu, OpKind::Concat) == 4);
  for (int d = 0; d < 4; ++d) {
    CAPTURE(d);
    const auto& cat = gu.op(gu.tensor(*gu.find_tensor("up" + std::to_string(d) + ".skip_concat")).producer);
    // The long skip: the encoder's tensor of the same level, concatenated along channels.
    CHECK(cat.inputs[0] == *gu.find_tensor("down" + std::to_string(d) + ".relu2"));
    const i64 fo = 8 << d, side = 32 >> d;
    CHECK(gu.tensor(cat.outputs[0]).shape == ir::Shape{2, 2 * fo, side, side});
  }
  CHECK(gu.tensor(*gu.find_tensor("head.nhwc")).shape == ir::Shape{2, 32, 32, 2});

  Vgg19Config v;
  v.classes = 1'000'000;
  ir::Graph gv = vgg19(v);
  CHECK(count(gv, OpKind::Conv2d) == 16);
  CHECK(gv.tensor(*gv.find_tensor("flatten")).shape == ir::Shape{1, 25088});
  CHECK(gv.tensor(*gv.find_tensor("classifier.w")).shape == ir::Shape{4096, 1'000'000});
  CHECK(gv.num_params() == vgg_params(v));

  BertConfig b = bert_config("BERT-large", 2);
  ir::Graph gb = bert(b);
  CHECK_NOTHROW(gb.validate());
  CHECK(count(gb, OpKind::Embedding) == 2);
  CHECK(gb.tensor(*gb.find_tensor("logits")).shape == ir::Shape{2, 512, 30522});
}

TEST_CASE("models: every preset graph validates") {
  for (const auto& p : presets()) {
    if (!in_sweep(p.name)) continue;
    CAPTURE(p.name);
    CHECK_NOTHROW(build_preset(p.name, 2, DType::BF16).validate());
  }
}

TEST_CASE("models: bad configs and names are clear errors") {
  GptConfig g;
  g.hidden = 100, g.heads = 16;
  CHECK_THROWS_WITH_AS(gpt(g), doctest::Contains("not divisible by heads"), Error);
  g = GptConfig{};
  g.batch = 0;
  CHECK_THROWS_WITH_AS(gpt(g), doctest::Contains("batch must be >= 1"), Error);
  g = GptConfig{};
  g.dtype = DType::I32;
  CHECK_THROWS_WITH_AS(gpt(g), doctest::Contains("floating"), Error);
  MoeConfig m;
  m.experts = 1;
  CHECK_THROWS_WITH_AS(moe(m), doctest::Contains("experts >= 2"), Error);
  m = MoeConfig{};
  m.capacity_factor = 0;
  CHECK_THROWS_AS(moe(m), Error);
  WideResNetConfig w;
  w.layers = 34;
  CHECK_THROWS_WITH_AS(wide_resnet(w), doctest::Contains("50 or 101"), Error);
  UNetConfig u;
  u.image = 100;
  CHECK_THROWS_WITH_AS(unet(u), doctest::Contains("divisible by 2^depth"), Error);
  Vgg19Config v;
  v.image = 200;
  CHECK_THROWS_AS(vgg19(v), Error);
  CHECK_THROWS_WITH_AS(build_preset("GPT-9000B"), doctest::Contains("unknown model preset"), Error);
  CHECK_THROWS_WITH_AS(gpt_preset("WR-6B"), doctest::Contains("not gpt"), Error);
  CHECK(find_preset("GPT-3").name == "GPT-175B");
  CHECK(gpt_config("GPT-2.7B", 4) == gpt_config("GPT-2.7B", 4));
  CHECK(gpt_config("GPT-2.7B", 4).to_string().find("hidden=2560") != std::string::npos);
}

// ---- a small GPT executed by the interpreter against a plain-loop forward pass
namespace {

using Vec = std::vector<double>;

struct Rng {
  std::mt19937_64 gen{7};
  std::uniform_real_distribution<double> u{-0.5, 0.5};
  Vec fill(i64 n) {
    Vec v(static_cast<std::size_t>(n));
    for (auto& x : v) x = u(gen);
    return v;
  }
};

double gelu(double x) { return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }

}  // namespace

TEST_CASE("models: a tiny GPT computes the loss of a plain-loop transformer") {
  GptConfig c;
  c.layers = 1, c.hidden = 4, c.heads = 2, c.seq = 3, c.vocab = 5, c.batch = 2;
  ir::Graph g = gpt(c);
  const i64 B = 2, S = 3, H = 4, N = 2, D = 2, V = 5, F = 16;
  Rng rng;
  std::map<ir::TensorId, ir::HostTensor> feeds;
  std::map<std::string, Vec> val;
  for (ir::TensorId t = 0; t < static_cast<ir::TensorId>(g.tensors().size()); ++t) {
    const auto& info = g.tensor(t);
    if (info.producer != ir::kNoOp) continue;
    Vec data;
    if (info.dtype == DType::I32) {
      for (i64 i = 0; i < info.numel(); ++i) data.push_back(static_cast<double>((i * 3 + 1) % V));
    } else {
      data = rng.fill(info.numel());
    }
    val[info.name] = data;
    feeds[t] = ir::HostTensor{info.shape, data};
  }
  auto out = ir::interpret(g, feeds);
  const double got = out[static_cast<std::size_t>(*g.loss())].data.at(0);

  // Plain loops: x = wte[ids] + wpe; pre-LN attention and FFN blocks; ln_f; tied logits.
  auto at = [&](const std::string& n, i64 i) { return val.at(n).at(static_cast<std::size_t>(i)); };
  auto ln = [&](const Vec& x, const std::string& n) {
    Vec y(x.size());
    for (i64 r = 0; r < B * S; ++r) {
      double mu = 0, var = 0;
      for (i64 k = 0; k < H; ++k) mu += x[static_cast<std::size_t>(r * H + k)] / H;
      for (i64 k = 0; k < H; ++k) var += std::pow(x[static_cast<std::size_t>(r * H + k)] - mu, 2) / H;
      for (i64 k = 0; k < H; ++k)
        y[static_cast<std::size_t>(r * H + k)] =
            (x[static_cast<std::size_t>(r * H + k)] - mu) / std::sqrt(var + 1e-5) * at(n + ".gamma", k) +
            at(n + ".beta", k);
    }
    return y;
  };
  auto lin = [&](const Vec& x, i64 in, i64 o, const std::string& n) {
    const i64 rows = static_cast<i64>(x.size()) / in;
    Vec y(static_cast<std::size_t>(rows * o));
    for (i64 r = 0; r < rows; ++r)
      for (i64 j = 0; j < o; ++j) {
        double s = at(n + ".b", j);
        for (i64 k = 0; k < in; ++k) s += x[static_cast<std::size_t>(r * in + k)] * at(n + ".w", k * o + j);
        y[static_cast<std::size_t>(r * o + j)] = s;
      }
    return y;
  };
  Vec x(static_cast<std::size_t>(B * S * H));
  for (i64 b = 0; b < B; ++b)
    for (i64 s = 0; s < S; ++s)
      for (i64 k = 0; k < H; ++k) {
        const i64 id = static_cast<i64>(at("tokens", b * S + s));
        x[static_cast<std::size_t>((b * S + s) * H + k)] = at("wte", id * H + k) + at("wpe", s * H + k);
      }
  Vec qkv = lin(ln(x, "h0.ln1"), H, 3 * H, "h0.attn.qkv");  // columns: [q | k | v], each [n, d]
  Vec ctx(x.size(), 0.0);
  for (i64 b = 0; b < B; ++b)
    for (i64 n = 0; n < N; ++n)
      for (i64 s = 0; s < S; ++s) {
        Vec sc(static_cast<std::size_t>(S));
        double mx = -1e300, z = 0;
        for (i64 t = 0; t < S; ++t) {
          double d = 0;
          for (i64 e = 0; e < D; ++e)
            d += qkv[static_cast<std::size_t>((b * S + s) * 3 * H + n * D + e)] *
                 qkv[static_cast<std::size_t>((b * S + t) * 3 * H + H + n * D + e)];
          sc[static_cast<std::size_t>(t)] = d / std::sqrt(static_cast<double>(D));
          mx = std::max(mx, sc[static_cast<std::size_t>(t)]);
        }
        for (auto& v : sc) z += (v = std::exp(v - mx));
        for (i64 t = 0; t < S; ++t)
          for (i64 e = 0; e < D; ++e)
            ctx[static_cast<std::size_t>((b * S + s) * H + n * D + e)] +=
                sc[static_cast<std::size_t>(t)] / z *
                qkv[static_cast<std::size_t>((b * S + t) * 3 * H + 2 * H + n * D + e)];
      }
  Vec a = lin(ctx, H, H, "h0.attn.proj");
  for (std::size_t i = 0; i < x.size(); ++i) x[i] += a[i];
  Vec f = lin(ln(x, "h0.ln2"), H, F, "h0.mlp.fc1");
  for (auto& v : f) v = gelu(v);
  Vec m = lin(f, F, H, "h0.mlp.fc2");
  for (std::size_t i = 0; i < x.size(); ++i) x[i] += m[i];
  Vec y = ln(x, "ln_f");
  double loss = 0;
  for (i64 r = 0; r < B * S; ++r) {
    Vec lg(static_cast<std::size_t>(V));
    double mx = -1e300, z = 0;
    for (i64 v = 0; v < V; ++v) {
      for (i64 k = 0; k < H; ++k)
        lg[static_cast<std::size_t>(v)] += y[static_cast<std::size_t>(r * H + k)] * at("wte", v * H + k);
      mx = std::max(mx, lg[static_cast<std::size_t>(v)]);
    }
    for (double v : lg) z += std::exp(v - mx);
    loss += -(lg[static_cast<std::size_t>(at("labels", r))] - mx - std::log(z)) / (B * S);
  }
  CHECK(got == doctest::Approx(loss).epsilon(1e-9));

  // fused_attention: the same leaves and the same function, the core one Attention op.
  c.fused_attention = true;
  ir::Graph fg = gpt(c);
  CHECK(fg.num_params() == g.num_params());
  int attention = 0, softmax = 0;
  for (const auto& op : fg.ops()) {
    attention += op.kind == OpKind::Attention;
    softmax += op.kind == OpKind::Softmax;
  }
  CHECK(attention == 1);
  CHECK(softmax == 0);
  CHECK(c.to_string().find("fused_attention") != std::string::npos);
  std::map<ir::TensorId, ir::HostTensor> ffeeds;
  for (ir::TensorId t = 0; t < static_cast<ir::TensorId>(fg.tensors().size()); ++t) {
    const auto& info = fg.tensor(t);
    if (info.producer == ir::kNoOp) ffeeds[t] = ir::HostTensor{info.shape, val.at(info.name)};
  }
  CHECK(ir::interpret(fg, ffeeds)[static_cast<std::size_t>(*fg.loss())].data.at(0) ==
        doctest::Approx(loss).epsilon(1e-9));
}

TEST_CASE("models: GPT training FLOPs (autodiff, no recomputation) within 1% of Megatron's formula") {
  for (const char* name : {"GPT-Medium", "GPT-Large", "GPT-XL", "GPT-2.7B", "GPT-6.7B", "GPT-175B"}) {
    if (!in_sweep(name)) continue;
    for (i64 batch : sweep_batches({1, 4, 8})) {
      CAPTURE(name);
      CAPTURE(batch);
      GptConfig c = gpt_config(name, batch);
      const double dev = ir::training_flops(gpt(c)) / megatron_flops(c) - 1;
      CAPTURE(dev);
      CHECK(dev >= 0);  // weft counts the matmuls exactly and elementwise work on top
      CHECK(dev < 0.01);
    }
  }
}

TEST_CASE("models: every family differentiates into a training step (MoE's routing mask gets no gradient)") {
  for (const auto& p : presets()) {
    if (!in_sweep(p.name)) continue;
    CAPTURE(p.name);
    ir::Graph fwd = build_preset(p.name, 1);
    ir::Graph tg = ir::build_training_graph(fwd);
    // Adam: one update per parameter; every parameter has a gradient.
    CHECK(count(tg, OpKind::AdamUpdate) == count_if_params(fwd));
    for (ir::TensorId t = 0; t < static_cast<ir::TensorId>(fwd.tensors().size()); ++t)
      if (fwd.tensor(t).role == ir::Role::Parameter) CHECK(tg.grad(t).has_value());
    if (p.family == "moe") CHECK_FALSE(tg.grad(*fwd.find_tensor("h1.moe.dispatch_mask")).has_value());
  }
}

namespace {

// Feeds every leaf of g with deterministic values (ids/labels cycle through [0, mod)).
std::map<ir::TensorId, ir::HostTensor> feed_all(const ir::Graph& g, i64 mod,
                                                std::map<std::string, Vec> overrides = {}) {
  Rng rng;
  std::map<ir::TensorId, ir::HostTensor> feeds;
  for (ir::TensorId t = 0; t < static_cast<ir::TensorId>(g.tensors().size()); ++t) {
    const auto& info = g.tensor(t);
    if (info.producer != ir::kNoOp) continue;
    Vec data;
    if (overrides.count(info.name)) {
      data = overrides.at(info.name);
    } else if (info.dtype == DType::I32) {
      for (i64 i = 0; i < info.numel(); ++i) data.push_back(static_cast<double>((i * 3 + 1) % mod));
    } else {
      data = rng.fill(info.numel());
    }
    feeds[t] = ir::HostTensor{info.shape, data};
  }
  return feeds;
}

const Vec& value(const ir::Graph& g, const std::vector<ir::HostTensor>& out,
                 const std::map<ir::TensorId, ir::HostTensor>& feeds, const std::string& name) {
  ir::TensorId t = *g.find_tensor(name);
  return feeds.count(t) ? feeds.at(t).data : out[static_cast<std::size_t>(t)].data;
}

}  // namespace

TEST_CASE("models: U-Net's einsum + reshape is a 2x2 stride-2 transposed conv") {
  UNetConfig c;
  c.base_channels = 2, c.depth = 1, c.in_channels = 1, c.image = 4, c.batch = 2;
  ir::Graph g = unet(c);
  auto feeds = feed_all(g, 2);
  auto out = ir::interpret(g, feeds);
  const Vec& x = value(g, out, feeds, "bottleneck.relu2");  // [2, 4, 2, 2]
  const Vec& w = value(g, out, feeds, "up0.upconv.w");      // [4, 2, 2, 2] = [c, o, a, b]
  const Vec& b = value(g, out, feeds, "up0.upconv.b");      // [2, 1, 1]
  const Vec& y = value(g, out, feeds, "up0.upconv.bias");   // [2, 2, 4, 4]
  const i64 N = 2, C = 4, O = 2, H = 2;
  for (i64 n = 0; n < N; ++n)
    for (i64 o = 0; o < O; ++o)
      for (i64 p = 0; p < 2 * H; ++p)
        for (i64 q = 0; q < 2 * H; ++q) {
          double s = b[static_cast<std::size_t>(o)];
          for (i64 ch = 0; ch < C; ++ch)
            s += x[static_cast<std::size_t>(((n * C + ch) * H + p / 2) * H + q / 2)] *
                 w[static_cast<std::size_t>(((ch * O + o) * 2 + p % 2) * 2 + q % 2)];
          CHECK(y[static_cast<std::size_t>(((n * O + o) * 2 * H + p) * 2 * H + q)] == doctest::Approx(s));
        }
}

TEST_CASE("models: the MoE layer computes Σ_e gate_e · expert_e(x) for tokens routed to both experts") {
  MoeConfig c;
  c.layers = 2, c.hidden = 4, c.heads = 2, c.experts = 2, c.seq = 3, c.vocab = 5, c.batch = 2, c.ffn = 6;
  ir::Graph g = moe(c);
  const i64 B = 2, S = 3, M = 4, E = 2, F = 6, Cap = c.capacity();
  REQUIRE(Cap == 3);
  // Top-2 of 2 experts: every token goes to both, token s into slot s of each expert's buffer.
  Vec mask(static_cast<std::size_t>(B * S * E * Cap), 0.0);
  for (i64 b = 0; b < B; ++b)
    for (i64 s = 0; s < S; ++s)
      for (i64 e = 0; e < E; ++e) mask[static_cast<std::size_t>(((b * S + s) * E + e) * Cap + s)] = 1;
  auto feeds = feed_all(g, 5, {{"h1.moe.dispatch_mask", mask}});
  auto out = ir::interpret(g, feeds);
  const Vec& x = value(g, out, feeds, "h1.ln2");
  const Vec& y = value(g, out, feeds, "h1.moe.combine");
  auto P = [&](const std::string& n) { return value(g, out, feeds, "h1.moe." + n); };
  const Vec &wg = P("gate.w"), &wi = P("experts.wi"), &bi = P("experts.bi"), &wo = P("experts.wo"),
            &bo = P("experts.bo");
  for (i64 t = 0; t < B * S; ++t) {
    auto X = [&](i64 m) { return x[static_cast<std::size_t>(t * M + m)]; };
    double l[2] = {0, 0};
    for (i64 e = 0; e < E; ++e)
      for (i64 m = 0; m < M; ++m) l[e] += X(m) * wg[static_cast<std::size_t>(m * E + e)];
    const double mx = std::max(l[0], l[1]), z = std::exp(l[0] - mx) + std::exp(l[1] - mx);
    for (i64 m = 0; m < M; ++m) {
      double want = 0;
      for (i64 e = 0; e < E; ++e) {
        double o = bo[static_cast<std::size_t>(e * M + m)];
        for (i64 f = 0; f < F; ++f) {
          double h = bi[static_cast<std::size_t>(e * F + f)];
          for (i64 k = 0; k < M; ++k) h += X(k) * wi[static_cast<std::size_t>((e * M + k) * F + f)];
          o += gelu(h) * wo[static_cast<std::size_t>((e * F + f) * M + m)];
        }
        want += std::exp(l[e] - mx) / z * o;
      }
      CHECK(y[static_cast<std::size_t>(t * M + m)] == doctest::Approx(want).epsilon(1e-9));
    }
  }
}

TEST_CASE("models: preset shorthands equal the config path; configs print in one line") {
  CHECK(moe_preset("MoE-8E-380M", 2) == moe(moe_config("MoE-8E-380M", 2)));
  CHECK(gpt_preset("GPT-XL", 3, DType::F16) == gpt(gpt_config("GPT-XL", 3, DType::F16)));
  CHECK(build_preset("WR-6B") == wide_resnet(wide_resnet_config("WR-6B")));
  const std::vector<std::string> lines{
      moe_config("MoE-32E-10B").to_string(), wide_resnet_config("WR-12B").to_string(),
      unet_config("UNet-768M").to_string(), vgg19_config("VGG19-4.2B").to_string(),
      bert_config("BERT-large").to_string()};
  const std::vector<std::string> want{"experts=32", "width_factor=12", "base_channels=320", "classes=1000000",
                                      "vocab=30522"};
  for (std::size_t i = 0; i < lines.size(); ++i) {
    CAPTURE(lines[i]);
    CHECK(lines[i].find(want[i]) != std::string::npos);
    CHECK(lines[i].find('\n') == std::string::npos);
  }
}
