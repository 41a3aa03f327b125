// The zoo's Llama: parameter counts by hand, the model FLOPs against the graphs' matmuls, a tiny
// Llama run by the interpreter against a plain-loop forward pass (RMSNorm, GQA, rotary, causal
// softmax, SwiGLU, untied head), fused attention equal to unfused, and bad configs.
#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "weft/core/error.hpp"
#include "weft/ir/interpreter.hpp"
#include "weft/models/models.hpp"

using namespace weft;
using namespace weft::models;
using weft::ir::OpKind;

namespace {

using i64 = std::int64_t;
using Vec = std::vector<double>;

double einsum_flops(const ir::Graph& g) {
  double f = 0;
  for (const auto& op : g.ops())
    if (op.kind == OpKind::Einsum) f += op.flops();
  return f;
}

LlamaConfig tiny(bool fused) {
  LlamaConfig c;
  c.name = "tiny";
  c.layers = 1, c.hidden = 8, c.heads = 2, c.kv_heads = 1, c.ffn = 6, c.seq = 4, c.vocab = 5, c.batch = 2;
  c.dtype = DType::F64, c.rope_theta = 10000.0, c.fused_attention = fused;
  return c;
}

// Feeds for every leaf: the graph's own Constant values, ids / labels, random parameters
// (norm scales around 1).
std::map<ir::TensorId, ir::HostTensor> feeds_for(const ir::Graph& g, std::map<std::string, Vec>& val) {
  std::mt19937_64 gen{11};
  std::normal_distribution<double> nd(0, 0.5);
  std::map<ir::TensorId, ir::HostTensor> feeds;
  for (ir::TensorId t = 0; t < static_cast<ir::TensorId>(g.tensors().size()); ++t) {
    const auto& info = g.tensor(t);
    if (info.producer != ir::kNoOp) continue;
    Vec data;
    if (const ir::LeafValue* v = g.value(t)) {
      data = v->load().data;
    } else if (info.dtype == DType::I32) {
      for (i64 i = 0; i < info.numel(); ++i)
        data.push_back(static_cast<double>((i * 3 + (info.name == "labels")) % 5));
    } else {
      for (i64 i = 0; i < info.numel(); ++i)
        data.push_back((info.name.ends_with(".gamma") ? 1.0 : 0.0) + nd(gen));
    }
    val[info.name] = data;
    feeds[t] = ir::HostTensor{info.shape, data};
  }
  return feeds;
}

}  // namespace

TEST_CASE("llama: the presets' parameter counts by hand") {
  // Llama 3 8B: 2·128256·4096 (table + untied head) = 1,050,673,152; per layer q + o 2·4096²,
  // k + v 2·4096·1024, MLP 3·4096·14336, norms 2·4096 = 218,112,000, x32 = 6,979,584,000; + 4,096.
  CHECK(llama(llama_config("llama3-8b", 1)).num_params() == 8'030'261'248);
  // Llama 3 70B: 2·128256·8192 = 2,101,346,304; per layer 2·8192² + 2·8192·1024 + 3·8192·28672 + 16384
  // = 855,654,400, x80 = 68,452,352,000; + 8,192.
  CHECK(build_preset("llama3-70b").num_params() == 70'553'706'496);
  CHECK(build_preset("llama2-7b").num_params() == 6'738'415'616);  // Meta's published count
  const LlamaConfig c = llama_config("llama3.1-405b", 4, DType::BF16);
  CHECK(c.name == "llama3-405b");
  CHECK((c.layers == 126 && c.hidden == 16384 && c.heads == 128 && c.kv_heads == 8 && c.ffn == 53248 &&
         c.vocab == 128256 && c.seq == 8192 && c.rope_theta == 500000.0 && c.batch == 4 &&
         c.dtype == DType::BF16));
  CHECK(llama_config("llama2-13b").rope_theta == 10000.0);
  CHECK(llama_config("llama2-13b").kv_heads == 40);
  CHECK_THROWS_AS(llama_config("GPT-2.7B"), Error);
}

TEST_CASE(
    "llama: 3 x the forward matmuls are 6·N'·T + 12·L·h·s·T; llama_flops adds the norms as torchtitan") {
  LlamaConfig c = tiny(false);
  c.layers = 3, c.hidden = 64, c.heads = 8, c.kv_heads = 2, c.ffn = 96, c.seq = 32, c.vocab = 200,
  c.batch = 2;
  const double T = 64, L = 3, h = 64, s = 32;
  // N' (matmul weights): per layer 64·64 (q) + 2·64·16 (k, v) + 64·64 (o) + 3·64·96 = 28,672; x3 + the
  // head 64·200 = 98,816.
  const double n_mm = 3 * 28'672 + 12'800;
  const ir::Graph g = llama(c);
  CHECK(3 * einsum_flops(g) == doctest::Approx(6 * n_mm * T + 12 * L * h * s * T).epsilon(1e-12));
  CHECK(llama_flops(c) ==
        doctest::Approx(6 * (n_mm + (2 * L + 1) * h) * T + 12 * L * h * s * T).epsilon(1e-12));
}

TEST_CASE("llama: a tiny Llama computes the loss of a plain-loop one; fused attention the same") {
  const LlamaConfig c = tiny(false);
  const ir::Graph g = llama(c);
  std::map<std::string, Vec> val;
  auto feeds = feeds_for(g, val);
  const double got = ir::interpret(g, feeds)[static_cast<std::size_t>(*g.loss())].data.at(0);

  const i64 B = 2, S = 4, H = 8, N = 2, KV = 1, D = 4, F = 6, V = 5;
  auto at = [&](const std::string& n, i64 i) { return val.at(n).at(static_cast<std::size_t>(i)); };
  auto rms = [&](const Vec& x, const std::string& n) {
    Vec y(x.size());
    for (i64 r = 0; r < B * S; ++r) {
      double ms = 0;
      for (i64 k = 0; k < H; ++k)
        ms += x[static_cast<std::size_t>(r * H + k)] * x[static_cast<std::size_t>(r * H + k)] / H;
      for (i64 k = 0; k < H; ++k)
        y[static_cast<std::size_t>(r * H + k)] =
            x[static_cast<std::size_t>(r * H + k)] / std::sqrt(ms + 1e-5) * at(n, k);
    }
    return y;
  };
  auto lin = [&](const Vec& x, i64 in, i64 o, const std::string& n) {
    const i64 rows = static_cast<i64>(x.size()) / in;
    Vec y(static_cast<std::size_t>(rows * o), 0.0);
    for (i64 r = 0; r < rows; ++r)
      for (i64 j = 0; j < o; ++j)
        for (i64 k = 0; k < in; ++k)
          y[static_cast<std::size_t>(r * o + j)] +=
              x[static_cast<std::size_t>(r * in + k)] * at(n, k * o + j);
    return y;
  };
  // rotary on row r = (b, p) of heads x D: pair (i, i + D/2) rotated by p / 10000^(2i/D)
  auto rope = [&](Vec x, i64 heads) {
    for (i64 b = 0; b < B; ++b)
      for (i64 p = 0; p < S; ++p)
        for (i64 hd = 0; hd < heads; ++hd)
          for (i64 i = 0; i < D / 2; ++i) {
            const double a = static_cast<double>(p) / std::pow(10000.0, 2.0 * static_cast<double>(i) / D);
            auto& x1 = x[static_cast<std::size_t>(((b * S + p) * heads + hd) * D + i)];
            auto& x2 = x[static_cast<std::size_t>(((b * S + p) * heads + hd) * D + i + D / 2)];
            const double r1 = x1 * std::cos(a) - x2 * std::sin(a), r2 = x2 * std::cos(a) + x1 * std::sin(a);
            x1 = r1, x2 = r2;
          }
    return x;
  };
  Vec x(static_cast<std::size_t>(B * S * H));
  for (i64 r = 0; r < B * S; ++r)
    for (i64 k = 0; k < H; ++k)
      x[static_cast<std::size_t>(r * H + k)] = at("wte", static_cast<i64>(at("tokens", r)) * H + k);
  {
    const Vec a = rms(x, "h0.attn_norm.gamma");
    const Vec q = rope(lin(a, H, N * D, "h0.attn.q.w"), N), k = rope(lin(a, H, KV * D, "h0.attn.k.w"), KV);
    const Vec v = lin(a, H, KV * D, "h0.attn.v.w");
    Vec ctx(static_cast<std::size_t>(B * S * N * D), 0.0);
    for (i64 b = 0; b < B; ++b)
      for (i64 n = 0; n < N; ++n) {
        const i64 kvh = n / (N / KV);  // the query head's key/value group
        for (i64 i = 0; i < S; ++i) {
          Vec sc;
          for (i64 j = 0; j <= i; ++j) {  // causal: keys up to the query
            double dot = 0;
            for (i64 e = 0; e < D; ++e)
              dot += q[static_cast<std::size_t>(((b * S + i) * N + n) * D + e)] *
                     k[static_cast<std::size_t>(((b * S + j) * KV + kvh) * D + e)];
            sc.push_back(dot / std::sqrt(static_cast<double>(D)));
          }
          double mx = sc[0], z = 0;
          for (double s : sc) mx = std::max(mx, s);
          for (double& s : sc) z += (s = std::exp(s - mx));
          for (i64 j = 0; j <= i; ++j)
            for (i64 e = 0; e < D; ++e)
              ctx[static_cast<std::size_t>(((b * S + i) * N + n) * D + e)] +=
                  sc[static_cast<std::size_t>(j)] / z *
                  v[static_cast<std::size_t>(((b * S + j) * KV + kvh) * D + e)];
        }
      }
    const Vec o = lin(ctx, N * D, H, "h0.attn.o.w");
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += o[i];
  }
  {
    const Vec m = rms(x, "h0.mlp_norm.gamma");
    Vec gate = lin(m, H, F, "h0.mlp.gate.w");
    const Vec up = lin(m, H, F, "h0.mlp.up.w");
    for (std::size_t i = 0; i < gate.size(); ++i) gate[i] = gate[i] / (1 + std::exp(-gate[i])) * up[i];
    const Vec down = lin(gate, F, H, "h0.mlp.down.w");
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += down[i];
  }
  const Vec logits = lin(rms(x, "norm_f.gamma"), H, V, "lm_head.w");
  double loss = 0;
  for (i64 r = 0; r < B * S; ++r) {
    double mx = -1e300, z = 0;
    for (i64 j = 0; j < V; ++j) mx = std::max(mx, logits[static_cast<std::size_t>(r * V + j)]);
    for (i64 j = 0; j < V; ++j) z += std::exp(logits[static_cast<std::size_t>(r * V + j)] - mx);
    loss += (std::log(z) + mx - logits[static_cast<std::size_t>(r * V + static_cast<i64>(at("labels", r)))]) /
            (B * S);
  }
  CHECK(got == doctest::Approx(loss).epsilon(1e-12));

  // The fused causal op: the same function (its own leaves: no mask positions).
  const ir::Graph f = llama(tiny(true));
  std::map<std::string, Vec> fval;
  auto ffeeds = feeds_for(f, fval);
  for (auto& [t, h] : ffeeds)
    if (val.count(f.tensor(t).name)) h.data = val.at(f.tensor(t).name);
  CHECK(ir::interpret(f, ffeeds)[static_cast<std::size_t>(*f.loss())].data.at(0) ==
        doctest::Approx(loss).epsilon(1e-12));
  CHECK(!f.find_tensor("causal.positions"));
}

TEST_CASE("llama: bad configs are clear errors naming the field") {
  auto fails = [](LlamaConfig c, const char* what) {
    CAPTURE(what);
    try {
      (void)llama(c);
      FAIL("no error");
    } catch (const Error& e) {
      CHECK(std::string(e.what()).find(what) != std::string::npos);
    }
  };
  LlamaConfig c = tiny(false);
  c.kv_heads = 3;
  fails(c, "kv_heads");
  c = tiny(false), c.ffn = 0;
  fails(c, "ffn");
  c = tiny(false), c.hidden = 6, c.heads = 2, c.kv_heads = 2;  // head dim 3: no rotary pairs
  fails(c, "even");
  c = tiny(false), c.rope_theta = 0.5;
  fails(c, "rope_theta");
  c = tiny(false), c.norm_eps = 0;
  fails(c, "norm_eps");
  c = tiny(false), c.dtype = DType::I32;
  fails(c, "dtype");
  CHECK(tiny(true).to_string().find("kv_heads=1") != std::string::npos);
}
