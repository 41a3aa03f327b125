// The fused attention ops (Attention, AttentionGrad): rules (shapes, index maps, FLOPs by hand,
// errors), the kernel against brute-force loops, gradients against the unfused
// einsum-softmax-einsum graph and central differences, a causal tile of a split query sequence,
// JSON round trip.
#include <doctest/doctest.h>

#include <cmath>
#include <random>

#include "weft/core/error.hpp"
#include "weft/ir/autodiff.hpp"
#include "weft/ir/interpreter.hpp"
#include "weft/ir/json.hpp"
#include "weft/ir/kernels.hpp"

using namespace weft::ir;

namespace {

HostTensor uniform(const Shape& s, std::mt19937& gen) {
  std::uniform_real_distribution<double> u(-1, 1);
  HostTensor t{s, {}};
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data.push_back(u(gen));
  return t;
}

const Factor& factor_of(const Op& op, bool output, int tensor, int dim) {
  const auto& dims = output ? op.index_map.outputs : op.index_map.inputs;
  return op.index_map.factors[static_cast<std::size_t>(dims[tensor][dim].at(0))];
}

// out[b, i, :] and lse[b, i] by the textbook formula, one (batch, query) row at a time.
void brute(const HostTensor& q, const HostTensor& k, const HostTensor& v, double scale, bool causal,
           std::int64_t B, std::int64_t s, std::int64_t t, std::int64_t d, std::int64_t e,
           std::vector<double>& out, std::vector<double>& lse) {
  out.assign(static_cast<std::size_t>(B * s * e), 0.0);
  lse.assign(static_cast<std::size_t>(B * s), 0.0);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t i = 0; i < s; ++i) {
      std::vector<double> w(static_cast<std::size_t>(t), 0.0);
      double z = 0;
      for (std::int64_t j = 0; j < t; ++j) {
        if (causal && j > i) continue;
        double sc = 0;
        for (std::int64_t c = 0; c < d; ++c) sc += q.data[(b * s + i) * d + c] * k.data[(b * t + j) * d + c];
        w[j] = std::exp(scale * sc);
        z += w[j];
      }
      lse[b * s + i] = std::log(z);
      for (std::int64_t j = 0; j < t; ++j)
        for (std::int64_t c = 0; c < e; ++c)
          out[(b * s + i) * e + c] += w[j] / z * v.data[(b * t + j) * e + c];
    }
}

// Loss Σ out·r of attention over parameters q, k, v: fused, or einsum · scale, (+ mask), softmax,
// einsum.
struct Model {
  Graph g{"attn"};
  TensorId q, k, v, r, mask = -1, out;
  Model(const Shape& qs, const Shape& ks, const Shape& vs, double scale, bool causal, bool fused) {
    q = g.parameter("q", qs);
    k = g.parameter("k", ks);
    v = g.parameter("v", vs);
    Shape os = qs;
    os.back() = vs.back();
    r = g.input("r", os);
    if (fused) {
      out = g.attention(q, k, v, scale, causal, "attn").first;
    } else {
      auto sc = g.unary(UnaryFn::Scale, g.einsum("bhsd,bhtd->bhst", {q, k}), "", scale);
      if (causal) {
        mask = g.input("mask", {qs[2], ks[2]});
        sc = g.add(sc, mask);
      }
      out = g.einsum("bhst,bhte->bhse", {g.softmax(sc, -1), v});
    }
    g.set_loss(g.einsum("bhse,bhse->", {out, r}, "loss"));
  }
};

}  // namespace

TEST_CASE("attention rule: shapes, lse in f32, batch and queries parallel, keys and head dims replicated") {
  Graph g("a");
  auto q = g.input("q", {2, 3, 5, 4}), k = g.input("k", {2, 3, 7, 4}), v = g.input("v", {2, 3, 7, 6});
  const auto outs = g.attention(q, k, v, {}, false, "attn");
  const TensorId out = outs.first, lse = outs.second;
  CHECK(g.tensor(out).shape == Shape{2, 3, 5, 6});
  CHECK(g.tensor(lse).shape == Shape{2, 3, 5});
  CHECK(g.tensor(lse).dtype == weft::DType::F32);
  const Op& op = g.op(g.tensor(out).producer);
  CHECK(op.attrs.scalar == doctest::Approx(0.5));  // 1/√d, d = 4
  CHECK(factor_of(op, false, 0, 0).kind == FactorKind::Parallel);
  CHECK(factor_of(op, false, 0, 1).kind == FactorKind::Parallel);
  CHECK(factor_of(op, false, 0, 2).kind == FactorKind::Parallel);         // queries
  CHECK(factor_of(op, false, 1, 2).kind == FactorKind::NeedReplication);  // keys
  CHECK(factor_of(op, false, 0, 3).kind == FactorKind::NeedReplication);  // d
  CHECK(factor_of(op, false, 2, 3).kind == FactorKind::NeedReplication);  // e
  CHECK(op.index_map.inputs[0][2] == op.index_map.outputs[1][2]);         // lse follows the queries
  CHECK(op.index_map.inputs[1][2] == op.index_map.inputs[2][2]);          // k and v share the keys
  // Flash attention's FLOPs by hand: 2·(d + e) per (query, key) pair: 6 heads · 5 · 7 · 2 · 10.
  CHECK(op.flops() == doctest::Approx(4200));
  // Causal: 1 + 2 + 3 + 4 + 5 = 15 pairs of 35 kept per head: 6 · 15 · 20.
  const TensorId causal_out = g.attention(q, k, v, 0.25, true, "causal").first;
  CHECK(g.op(g.tensor(causal_out).producer).flops() == doctest::Approx(1800));
  // Causal with more queries than keys: query i reads min(i + 1, t) keys: 1 + 2 + 3 + 3 + 3 = 12.
  auto k3 = g.input("k3", {2, 3, 3, 4}), v3 = g.input("v3", {2, 3, 3, 6});
  const TensorId o3 = g.attention(q, k3, v3, 0.25, true, "wide").first;
  CHECK(g.op(g.tensor(o3).producer).flops() == doctest::Approx(6 * 12 * 20));

  // The backward: 2·(3d + 2e) per pair (2.5x the forward when d = e).
  Graph h("b");
  auto hq = h.parameter("q", {2, 3, 5, 4}), hk = h.parameter("k", {2, 3, 7, 4}),
       hv = h.parameter("v", {2, 3, 7, 4});
  auto ho = h.attention(hq, hk, hv, {}, false, "attn").first;
  h.set_loss(h.reduce(ReduceFn::Sum, ho, {0, 1, 2, 3}));
  TrainOptions o;
  o.optimizer = Optimizer::None;
  Graph tg = build_training_graph(h, o);
  int grads = 0, softmaxes = 0;
  for (const auto& gop : tg.ops()) {
    softmaxes += gop.kind == OpKind::Softmax || gop.kind == OpKind::SoftmaxGrad;
    if (gop.kind != OpKind::AttentionGrad) continue;
    ++grads;
    CHECK(gop.inputs[3] == ho);  // it reads the saved output and the log-sum-exp
    CHECK(gop.flops() == doctest::Approx(2.5 * h.op(h.tensor(ho).producer).flops()));
    CHECK(factor_of(gop, false, 0, 0).kind == FactorKind::Parallel);
    // its queries a sum reduction that dq carries (context parallelism: dk, dv partial sums)
    CHECK(factor_of(gop, false, 0, 2).kind == FactorKind::Reduction);
    CHECK(factor_of(gop, false, 0, 2).reduce == ReduceKind::Sum);
    CHECK(factor_of(gop, true, 0, 2).name == "s");
    CHECK(*tg.grad(hq) == gop.outputs[0]);
    CHECK(*tg.grad(hk) == gop.outputs[1]);
    CHECK(*tg.grad(hv) == gop.outputs[2]);
  }
  CHECK(grads == 1);
  CHECK(softmaxes == 0);
}

TEST_CASE("attention rule errors name the op and the problem") {
  Graph g("e");
  auto q = g.input("q", {2, 5, 4}), k = g.input("k", {2, 7, 4}), v = g.input("v", {2, 7, 6});
  auto k8 = g.input("k8", {2, 7, 8}), v6 = g.input("v6", {2, 6, 6}), kb = g.input("kb", {3, 7, 4});
  CHECK_THROWS_WITH_AS(g.attention(q, k8, v, {}, false, "a1"), doctest::Contains("q's head dim 4 != k's 8"),
                       weft::Error);
  CHECK_THROWS_WITH_AS(g.attention(q, k, v6, {}, false, "a2"), doctest::Contains("k and v have 7 and 6 keys"),
                       weft::Error);
  CHECK_THROWS_WITH_AS(g.attention(q, kb, v, {}, false, "a3"),
                       doctest::Contains("must share their leading (batch, head) dims"), weft::Error);
  auto ids = g.input("ids", {2, 5, 4}, weft::DType::I64);
  CHECK_THROWS_WITH_AS(g.attention(ids, k, v, {}, false, "a4"), doctest::Contains("must be floating point"),
                       weft::Error);
  OpAttrs a;
  a.scalar = 0.5;
  a.ints = {2};
  CHECK_THROWS_WITH_AS(g.add_op(OpKind::Attention, {q, k, v}, a, "a5"),
                       doctest::Contains("attrs.ints = {causal (0 or 1)}"), weft::Error);
  a.ints = {0};
  CHECK_THROWS_WITH_AS(g.add_op(OpKind::AttentionGrad, {q, k, v}, a, "a6"),
                       doctest::Contains("expected 6 operands"), weft::Error);
}

TEST_CASE("attention kernel equals the textbook formula; causal is top-left aligned") {
  std::mt19937 gen(3);
  for (bool causal : {false, true}) {
    const std::int64_t B = 6, s = 5, t = 7, d = 4, e = 3;
    Graph g("k");
    auto q = g.input("q", {2, 3, s, d}), k = g.input("k", {2, 3, t, d}), v = g.input("v", {2, 3, t, e});
    const auto outs = g.attention(q, k, v, 0.7, causal, "attn");
    const TensorId out = outs.first, lse = outs.second;
    HostTensor Q = uniform({2, 3, s, d}, gen), K = uniform({2, 3, t, d}, gen), V = uniform({2, 3, t, e}, gen);
    for (auto& x : Q.data) x *= 3;  // peaked rows: the max-shifted sums matter
    auto val = interpret(g, {{q, Q}, {k, K}, {v, V}});
    std::vector<double> want_out, want_lse;
    brute(Q, K, V, 0.7, causal, B, s, t, d, e, want_out, want_lse);
    for (std::size_t i = 0; i < want_out.size(); ++i)
      CHECK(val[out].data[i] == doctest::Approx(want_out[i]).epsilon(1e-13));
    for (std::size_t i = 0; i < want_lse.size(); ++i)
      CHECK(val[lse].data[i] == doctest::Approx(want_lse[i]).epsilon(1e-13));
    if (causal)  // the first query reads the first key alone
      for (std::int64_t c = 0; c < e; ++c)
        CHECK(val[out].data[c] == doctest::Approx(V.data[c]).epsilon(1e-15));
  }
}

TEST_CASE("attention gradients equal the unfused graph's and central differences") {
  std::mt19937 gen(11);
  for (bool causal : {false, true}) {
    INFO("causal " << causal);
    const Shape qs{2, 2, 4, 3}, ks{2, 2, 4, 3}, vs{2, 2, 4, 2};
    Model fused(qs, ks, vs, 0.6, causal, true), plain(qs, ks, vs, 0.6, causal, false);
    std::map<TensorId, HostTensor> ff{{fused.q, uniform(qs, gen)},
                                      {fused.k, uniform(ks, gen)},
                                      {fused.v, uniform(vs, gen)},
                                      {fused.r, uniform({2, 2, 4, 2}, gen)}};
    std::map<TensorId, HostTensor> pf{
        {plain.q, ff[fused.q]}, {plain.k, ff[fused.k]}, {plain.v, ff[fused.v]}, {plain.r, ff[fused.r]}};
    if (causal) {
      HostTensor m{{4, 4}, std::vector<double>(16, 0.0)};
      for (int i = 0; i < 4; ++i)
        for (int j = i + 1; j < 4; ++j) m.data[i * 4 + j] = -INFINITY;
      pf[plain.mask] = m;
    }
    TrainOptions o;
    o.optimizer = Optimizer::None;
    Graph tf = build_training_graph(fused.g, o), tp = build_training_graph(plain.g, o);
    tf.validate();
    auto vf = interpret(tf, ff), vp = interpret(tp, pf);
    CHECK(vf[*tf.loss()].data[0] == doctest::Approx(vp[*tp.loss()].data[0]).epsilon(1e-13));
    const std::vector<std::pair<TensorId, TensorId>> same{
        {fused.q, plain.q}, {fused.k, plain.k}, {fused.v, plain.v}};
    for (const auto& ab : same) {
      const auto& ga = vf[*tf.grad(ab.first)].data;
      const auto& gb = vp[*tp.grad(ab.second)].data;
      REQUIRE(ga.size() == gb.size());
      for (std::size_t i = 0; i < ga.size(); ++i)
        CHECK(ga[i] == doctest::Approx(gb[i]).epsilon(1e-12).scale(1.0));
    }
    // Central differences of the fused forward (an oracle independent of both backward rules).
    for (TensorId p : {fused.q, fused.k, fused.v}) {
      const auto& grad = vf[*tf.grad(p)].data;
      for (std::int64_t i = 0; i < ff[p].numel(); i += 5) {
        auto f = ff;
        const double h = 1e-6;
        f[p].data[i] += h;
        const double up = interpret(fused.g, f)[*fused.g.loss()].data[0];
        f[p].data[i] -= 2 * h;
        const double down = interpret(fused.g, f)[*fused.g.loss()].data[0];
        CHECK(grad[i] == doctest::Approx((up - down) / (2 * h)).epsilon(1e-6).scale(1.0));
      }
    }
  }
}

TEST_CASE("a causal tile of a split query sequence masks by global positions") {
  // Queries 3..5 of 6 on one device: the kernel on the tile, told the rows' global positions,
  // equals rows 3..5 of the whole op (and differs from a tile that believes it starts at 0).
  std::mt19937 gen(7);
  Graph g("tile");
  auto q = g.input("q", {1, 6, 2}), k = g.input("k", {1, 6, 2}), v = g.input("v", {1, 6, 2});
  auto out = g.attention(q, k, v, {}, true, "attn").first;
  const Op& op = g.op(g.tensor(out).producer);
  HostTensor Q = uniform({1, 6, 2}, gen), K = uniform({1, 6, 2}, gen), V = uniform({1, 6, 2}, gen);
  auto whole = run_kernel(g, op, {&Q, &K, &V});
  HostTensor Qt{{1, 3, 2}, std::vector<double>(Q.data.begin() + 6, Q.data.end())};
  KernelContext ctx;
  ctx.out_shapes = {{1, 3, 2}, {1, 3}};
  ctx.element_index = {{0}, {3, 4, 5}, {0, 1}};
  auto tile = run_kernel(g, op, {&Qt, &K, &V}, ctx);
  for (int i = 0; i < 6; ++i) CHECK(tile[0].data[i] == doctest::Approx(whole[0].data[6 + i]).epsilon(1e-14));
  for (int i = 0; i < 3; ++i) CHECK(tile[1].data[i] == doctest::Approx(whole[1].data[3 + i]).epsilon(1e-14));
  KernelContext from_zero;
  from_zero.out_shapes = ctx.out_shapes;
  auto naive = run_kernel(g, op, {&Qt, &K, &V}, from_zero);
  CHECK(naive[1].data[0] != doctest::Approx(whole[1].data[3]));
}

TEST_CASE("attention round-trips through JSON with its training step") {
  Graph g("j");
  auto q = g.parameter("q", {2, 5, 4}), k = g.parameter("k", {2, 5, 4}), v = g.parameter("v", {2, 5, 4});
  auto out = g.attention(q, k, v, 0.3, true, "attn").first;
  g.set_loss(g.reduce(ReduceFn::Mean, out, {0, 1, 2}));
  TrainOptions o;
  Graph tg = build_training_graph(g, o);
  Graph back = graph_from_json(graph_to_json(tg));
  CHECK(back == tg);
  bool saw = false;
  for (const auto& op : back.ops())
    saw = saw || (op.kind == OpKind::AttentionGrad && op.attrs.ints == std::vector<std::int64_t>{1});
  CHECK(saw);
  CHECK(op_kind_name(OpKind::Attention) == "attention");
  CHECK(parse_op_kind("attention_grad") == OpKind::AttentionGrad);
}
