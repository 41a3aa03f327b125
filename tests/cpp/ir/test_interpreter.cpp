// The reference interpreter against hand-derived values and independent brute-force loops.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "weft/core/error.hpp"
#include "weft/ir/interpreter.hpp"
#include "weft/ir/kernels.hpp"

using namespace weft::ir;

namespace {

HostTensor rnd(const Shape& s, std::mt19937& gen) {
  std::uniform_real_distribution<double> u(-1, 1);
  HostTensor t{s, {}};
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data.push_back(u(gen));
  return t;
}

}  // namespace

TEST_CASE("interpreter: matmul, batched einsum and a 3-operand einsum against brute-force loops") {
  std::mt19937 gen(1);
  Graph g("e");
  auto a = g.input("a", {2, 3, 4});
  auto b = g.input("b", {4, 5});
  auto c = g.input("c", {2, 5});
  auto y = g.matmul(a, b);
  auto z = g.einsum("bij,jk,bk->ik", {a, b, c});  // sums over b and j
  auto A = rnd({2, 3, 4}, gen), B = rnd({4, 5}, gen), C = rnd({2, 5}, gen);
  auto v = interpret(g, {{a, A}, {b, B}, {c, C}});
  REQUIRE(v[y].shape == Shape{2, 3, 5});
  for (int bb = 0; bb < 2; ++bb)
    for (int i = 0; i < 3; ++i)
      for (int k = 0; k < 5; ++k) {
        double s = 0;
        for (int j = 0; j < 4; ++j) s += A.data[(bb * 3 + i) * 4 + j] * B.data[j * 5 + k];
        CHECK(v[y].data[(bb * 3 + i) * 5 + k] == doctest::Approx(s));
      }
  for (int i = 0; i < 3; ++i)
    for (int k = 0; k < 5; ++k) {
      double s = 0;
      for (int bb = 0; bb < 2; ++bb)
        for (int j = 0; j < 4; ++j)
          s += A.data[(bb * 3 + i) * 4 + j] * B.data[j * 5 + k] * C.data[bb * 5 + k];
      CHECK(v[z].data[i * 5 + k] == doctest::Approx(s));
    }
}

TEST_CASE("interpreter: unary, broadcasting binary, reduce, transpose, reshape, concat, slice") {
  Graph g;
  auto x = g.input("x", {2, 3});
  auto r = g.input("r", {3});
  auto gl = g.unary(UnaryFn::Gelu, x);
  auto sc = g.unary(UnaryFn::Scale, x, "sc", 2.5);
  auto sub = g.binary(BinaryFn::Sub, x, r);
  auto mx = g.binary(BinaryFn::Max, x, r);
  auto s0 = g.reduce(ReduceFn::Sum, x, {0});
  auto m1 = g.reduce(ReduceFn::Mean, x, {1});
  auto mxall = g.reduce(ReduceFn::Max, x, {0, 1});
  auto t = g.transpose(x, {1, 0});
  auto rs = g.reshape(x, {3, 2});
  auto cc = g.concat({x, x}, 1);
  auto sl = g.slice(x, 1, 1, 3);
  HostTensor X{{2, 3}, {1, -2, 3, -4, 5, 6}}, R{{3}, {0, 1, 2}};
  auto v = interpret(g, {{x, X}, {r, R}});
  double x0 = 1;
  CHECK(v[gl].data[0] == doctest::Approx(0.5 * x0 * (1 + std::tanh(std::sqrt(2 / M_PI) * (x0 + 0.044715)))));
  CHECK(v[sc].data == std::vector<double>{2.5, -5, 7.5, -10, 12.5, 15});
  CHECK(v[sub].data == std::vector<double>{1, -3, 1, -4, 4, 4});
  CHECK(v[mx].data == std::vector<double>{1, 1, 3, 0, 5, 6});
  CHECK(v[s0].data == std::vector<double>{-3, 3, 9});
  CHECK(v[m1].data[0] == doctest::Approx(2.0 / 3));
  CHECK(v[m1].data[1] == doctest::Approx(7.0 / 3));
  CHECK(v[mxall].shape.empty());
  CHECK(v[mxall].data == std::vector<double>{6});
  CHECK(v[t].data == std::vector<double>{1, -4, -2, 5, 3, 6});
  CHECK(v[rs].data == X.data);
  CHECK(v[cc].data == std::vector<double>{1, -2, 3, 1, -2, 3, -4, 5, 6, -4, 5, 6});
  CHECK(v[sl].data == std::vector<double>{-2, 3, 5, 6});
}

TEST_CASE("interpreter: softmax, layer norm and cross entropy closed forms") {
  Graph g;
  auto x = g.input("x", {2, 3});
  auto gm = g.parameter("g", {3});
  auto bt = g.parameter("b", {3});
  auto lab = g.input("lab", {2}, weft::DType::I32);
  auto sm = g.softmax(x, 1);
  auto ln = g.layer_norm(x, gm, bt, 0.0);
  auto ce = g.cross_entropy(x, lab);
  HostTensor X{{2, 3}, {1, 2, 3, 0, 0, 0}};
  auto v = interpret(g, {{x, X}, {gm, {{3}, {1, 1, 2}}}, {bt, {{3}, {0, 1, 0}}}, {lab, {{2}, {2, 0}}}});
  double z = std::exp(1) + std::exp(2) + std::exp(3);
  CHECK(v[sm].data[2] == doctest::Approx(std::exp(3) / z));
  CHECK(v[sm].data[4] == doctest::Approx(1.0 / 3));
  // Row [1,2,3]: mean 2, variance 2/3, x̂ = [-1,0,1]·√1.5.
  CHECK(v[ln].data[0] == doctest::Approx(-std::sqrt(1.5)));
  CHECK(v[ln].data[1] == doctest::Approx(1.0));
  CHECK(v[ln].data[2] == doctest::Approx(2 * std::sqrt(1.5)));
  // Row 2 is constant: x̂ = 0 (eps = 0 gives 0/0 only for var 0 — here (0-0)·inf is nan, so skip it).
  double expect = ((std::log(z) - 3) + (std::log(3.0) - 0)) / 2;
  CHECK(v[ce].data[0] == doctest::Approx(expect));
}

// torch's F.cross_entropy by hand on 2 tokens x 3 classes: row 0 = [0, ln 2, 0] (p = [1/4, 1/2, 1/4],
// lse = ln 4), row 1 = [0, 0, 0] (p = 1/3 each, lse = ln 3); class weights w = [1, 2, 3].
TEST_CASE("kernels: cross entropy with ignore_index, class weights and label smoothing by hand") {
  const double l2 = std::log(2.0), l3 = std::log(3.0);
  HostTensor X{{2, 3}, {0, l2, 0, 0, 0, 0}}, W{{3}, {1, 2, 3}}, dy{{}, {1}};
  struct Case {
    const char* what;
    std::vector<double> labels;
    CrossEntropyAttrs attrs;
    bool weighted;
    double loss;
    std::vector<double> grad;
  };
  CrossEntropyAttrs plain, smooth, pad0, tokens;
  smooth.label_smoothing = 0.3;
  pad0.ignore_index = 0;
  tokens.token_mean = true;
  const std::vector<Case> cases{
      // D = w[1] = 2: loss = 2·(ln 4 − ln 2)/2; dlogits row 0 = 2·(p − e1)/2, row 1 ignored
      {"ignored, weighted", {1, -100}, plain, true, l2, {0.25, -0.5, 0.25, 0, 0, 0}},
      // D = w[1] + w[0] = 3: (2 ln 2 + ln 3)/3; rows 2(p0 − e1)/3 and 1·(p1 − e0)/3
      {"weighted",
       {1, 0},
       plain,
       true,
       (2 * l2 + l3) / 3,
       {1. / 6, -1. / 3, 1. / 6, -2. / 9, 1. / 9, 1. / 9}},
      // ε = 0.3, D = 1: 0.7·ln 2 + 0.1·Σ_c (ln 4 − x_c) = 0.7 ln 2 + 0.1·5 ln 2; p − 0.7·e1 − 0.1
      {"smoothed", {1, -100}, smooth, false, 1.2 * l2, {0.15, -0.3, 0.15, 0, 0, 0}},
      // an in-range ignore_index: label 0 of row 1 is skipped
      {"ignore_index 0", {1, 0}, pad0, false, l2, {0.25, -0.5, 0.25, 0, 0, 0}},
      // the token mean (the importer's reduction='sum' is it times N): (2·ln 2 + 3·ln 3) over 2
      // tokens, not over D = 5; rows 2(p0 − e1)/2 and 3(p1 − e2)/2
      {"token mean", {1, 2}, tokens, true, (2 * l2 + 3 * l3) / 2, {0.25, -0.5, 0.25, 0.5, 0.5, -1}},
  };
  for (const auto& c : cases) {
    CAPTURE(c.what);
    Graph g;
    auto x = g.input("x", {2, 3});
    auto lab = g.input("lab", {2}, weft::DType::I64);
    auto w = g.constant("w", {3});
    auto ce = g.cross_entropy(x, lab, c.attrs, c.weighted ? w : -1);
    HostTensor L{{2}, c.labels};
    auto v = interpret(g, {{x, X}, {lab, L}, {w, W}});
    CHECK(v[ce].data[0] == doctest::Approx(c.loss).epsilon(1e-14));
    // the gradient op, and the four vocab-parallel steps over the classes split as {0, 1} | {2}
    const Op& fwd = g.op(g.tensor(ce).producer);
    Op grad = fwd;
    grad.kind = OpKind::CrossEntropyGrad;
    grad.inputs = {x, lab, x, x};  // only the count matters here (weights are operand 3)
    if (!c.weighted) grad.inputs.pop_back();
    std::vector<const HostTensor*> gin{&X, &L, &dy};
    if (c.weighted) gin.push_back(&W);
    const auto dx = run_kernel(g, grad, gin)[0];
    for (std::size_t k = 0; k < 6; ++k) CHECK(dx.data[k] == doctest::Approx(c.grad[k]).epsilon(1e-14));
    HostTensor xa{{2, 2}, {0, l2, 0, 0}}, xb{{2, 1}, {0, 0}}, wa{{2}, {1, 2}}, wb{{1}, {3}};
    KernelContext ca, cb;
    ca.vocab_index = {0, 1};
    cb.vocab_index = {2};
    ca.vocab_size = cb.vocab_size = 3;
    auto m = ce_row_max(X);  // the all-reduced max
    auto sa = ce_row_sum_target(fwd, xa, L, m, c.weighted ? &wa : nullptr, ca);
    auto sb = ce_row_sum_target(fwd, xb, L, m, c.weighted ? &wb : nullptr, cb);
    REQUIRE(sa.shape == Shape{2, ce_stat_width(fwd)});
    for (std::size_t k = 0; k < sa.data.size(); ++k) sa.data[k] += sb.data[k];  // all-reduce(sum)
    CHECK(ce_loss(fwd, L, m, sa, ca, true).data[0] == doctest::Approx(c.loss).epsilon(1e-14));
    CHECK(ce_loss(fwd, L, m, sa, cb, false).data[0] == 0.0);
    auto ga = ce_grad(grad, xa, L, dy, c.weighted ? &wa : nullptr, m, sa, ca);
    auto gb = ce_grad(grad, xb, L, dy, c.weighted ? &wb : nullptr, m, sa, cb);
    for (std::size_t t = 0; t < 2; ++t) {
      CHECK(ga.data[2 * t] == doctest::Approx(c.grad[3 * t]).epsilon(1e-14));
      CHECK(ga.data[2 * t + 1] == doctest::Approx(c.grad[3 * t + 1]).epsilon(1e-14));
      CHECK(gb.data[t] == doctest::Approx(c.grad[3 * t + 2]).epsilon(1e-14));
    }
  }
  // every label ignored: torch's 0/0 = nan loss, and no gradient
  Graph g;
  auto x = g.input("x", {2, 3});
  auto lab = g.input("lab", {2}, weft::DType::I64);
  auto ce = g.cross_entropy(x, lab);
  auto v = interpret(g, {{x, X}, {lab, {{2}, {-100, -100}}}});
  CHECK(std::isnan(v[ce].data[0]));
  // a label that is neither a class nor the ignore_index is an error naming the op
  CHECK_THROWS_WITH_AS(interpret(g, {{x, X}, {lab, {{2}, {-1, 0}}}}), doctest::Contains("label -1"),
                       weft::Error);
}

TEST_CASE("interpreter: conv2d with stride and padding, pools, embedding") {
  std::mt19937 gen(7);
  Graph g;
  auto x = g.input("x", {1, 2, 5, 5});
  auto w = g.parameter("w", {3, 2, 3, 3});
  auto y = g.conv2d(x, w, 2, 1);
  auto pm = g.pool2d(ReduceFn::Max, x, 2, 2, 1);
  auto pa = g.pool2d(ReduceFn::Mean, x, 3, 1, 0);
  auto table = g.parameter("table", {4, 2});
  auto ids = g.input("ids", {3}, weft::DType::I64);
  auto e = g.embedding(table, ids);
  auto X = rnd({1, 2, 5, 5}, gen), W = rnd({3, 2, 3, 3}, gen);
  HostTensor T{{4, 2}, {0, 1, 10, 11, 20, 21, 30, 31}}, I{{3}, {3, 0, 3}};
  auto v = interpret(g, {{x, X}, {w, W}, {table, T}, {ids, I}});
  REQUIRE(v[y].shape == Shape{1, 3, 3, 3});
  auto xat = [&](int c, int h, int ww) {
    return (h < 0 || h >= 5 || ww < 0 || ww >= 5) ? 0.0 : X.data[(c * 5 + h) * 5 + ww];
  };
  for (int o = 0; o < 3; ++o)
    for (int p = 0; p < 3; ++p)
      for (int q = 0; q < 3; ++q) {
        double s = 0;
        for (int c = 0; c < 2; ++c)
          for (int r = 0; r < 3; ++r)
            for (int t = 0; t < 3; ++t)
              s += xat(c, 2 * p + r - 1, 2 * q + t - 1) * W.data[((o * 2 + c) * 3 + r) * 3 + t];
        CHECK(v[y].data[(o * 3 + p) * 3 + q] == doctest::Approx(s));
      }
  REQUIRE(v[pm].shape == Shape{1, 2, 3, 3});
  CHECK(v[pm].data[0] == X.data[0]);  // window {(-1..0)x(-1..0)}: only x[0,0] in bounds
  CHECK(v[pm].data[4] == std::max({xat(0, 1, 1), xat(0, 1, 2), xat(0, 2, 1), xat(0, 2, 2)}));
  REQUIRE(v[pa].shape == Shape{1, 2, 3, 3});
  double s = 0;
  for (int h = 0; h < 3; ++h)
    for (int ww = 0; ww < 3; ++ww) s += xat(1, h + 1, ww + 2);
  CHECK(v[pa].data[9 + 1 * 3 + 2] == doctest::Approx(s / 9));
  CHECK(v[e].data == std::vector<double>{30, 31, 0, 1, 30, 31});
  CHECK_THROWS_WITH_AS(interpret(g, {{x, X}, {w, W}, {table, T}, {ids, {{3}, {3, 4, 0}}}}),
                       doctest::Contains("not an integer in [0, 4)"), weft::Error);
}

TEST_CASE("interpreter: bad feeds and opaque ops are clear errors") {
  Graph g;
  auto x = g.input("x", {2});
  auto y = g.unary(UnaryFn::Exp, x, "y");
  CHECK_THROWS_WITH_AS(interpret(g, {}), doctest::Contains("no feed for input 'x'"), weft::Error);
  CHECK_THROWS_WITH_AS(interpret(g, {{x, {{3}, {1, 2, 3}}}}), doctest::Contains("has shape [3]"),
                       weft::Error);
  CHECK_THROWS_WITH_AS(interpret(g, {{x, {{2}, {1, 2}}}, {y, {{2}, {1, 2}}}}),
                       doctest::Contains("only leaves"), weft::Error);
  g.opaque({y}, {2}, 10, "blackbox");
  CHECK_THROWS_WITH_AS(interpret(g, {{x, {{2}, {1, 2}}}}), doctest::Contains("'blackbox' is opaque"),
                       weft::Error);
}

TEST_CASE("graph: op names are unique, auto names skip taken ones, equality ignores the name counter") {
  Graph g;
  auto x = g.input("x", {2});
  g.unary(UnaryFn::Relu, x, "unary_0");
  auto y = g.unary(UnaryFn::Relu, x);  // would have been "unary_0"
  CHECK(g.op(g.tensor(y).producer).name == "unary_1");
  CHECK_THROWS_WITH_AS(g.unary(UnaryFn::Relu, x, "unary_0"), doctest::Contains("already used"), weft::Error);
  Graph h;
  auto hx = h.input("x", {2});
  h.unary(UnaryFn::Relu, hx, "unary_0");
  h.unary(UnaryFn::Relu, hx, "unary_1");
  CHECK(g == h);
  g.validate();
}

// The hash written out independently (FNV-free, by the documented formula): mix32 twice-rounded
// xorshift-multiply, key = mix(seed ^ mix(step)), h = mix(lo ^ mix(hi ^ key)).
namespace {
std::uint64_t mix_ref(std::uint64_t x) {
  const std::uint64_t m = 0xffffffffULL;
  x = (((x >> 16) ^ x) * 0x45d9f3bULL) & m;
  x = (((x >> 16) ^ x) * 0x45d9f3bULL) & m;
  return (x >> 16) ^ x;
}
}  // namespace

TEST_CASE("dropout: the documented counter-based mask, scaled by 1/(1-p), a fraction p dropped") {
  const double p = 0.3;
  Graph g("d");
  auto x = g.input("x", {50, 40}, weft::DType::F64);
  auto y = g.dropout(x, p, 5);
  std::mt19937 gen(3);
  auto X = rnd({50, 40}, gen);
  const auto v = interpret(g, {{x, X}});
  int dropped = 0;
  const std::uint64_t key = mix_ref(5 ^ mix_ref(1));  // the interpreter runs step 1
  for (std::int64_t i = 0; i < 2000; ++i) {
    const auto h = mix_ref(static_cast<std::uint64_t>(i) ^ mix_ref(0 ^ key));
    const bool keep = static_cast<double>(h) >= std::floor(p * 4294967296.0);
    CHECK(dropout_hash(5, 1, i) == h);
    CHECK(v[y].data[static_cast<std::size_t>(i)] ==
          (keep ? X.data[static_cast<std::size_t>(i)] * (1 / (1 - p)) : 0.0));
    dropped += keep ? 0 : 1;
  }
  // Binomial(2000, 0.3): mean 600, sd 20.5; 4 sd either side.
  CHECK(dropped > 518);
  CHECK(dropped < 682);
  // Indices past 2^32 use the high word: not the mask of index mod 2^32.
  int same = 0;
  for (std::int64_t i = 0; i < 256; ++i) same += dropout_hash(5, 1, i) == dropout_hash(5, 1, i + (1LL << 32));
  CHECK(same < 8);
  // Another seed or another step: another mask.
  int agree_seed = 0, agree_step = 0;
  for (std::int64_t i = 0; i < 2000; ++i) {
    agree_seed += dropout_keep(5, 1, i, 0.5) == dropout_keep(6, 1, i, 0.5);
    agree_step += dropout_keep(5, 1, i, 0.5) == dropout_keep(5, 2, i, 0.5);
  }
  CHECK(std::abs(agree_seed - 1000) < 100);
  CHECK(std::abs(agree_step - 1000) < 100);
  // p = 0 keeps everything.
  Graph g0("d0");
  auto x0 = g0.input("x", {3, 4}, weft::DType::F64);
  auto y0 = g0.dropout(x0, 0.0, 1);
  auto X0 = rnd({3, 4}, gen);
  CHECK(interpret(g0, {{x0, X0}})[y0].data == X0.data);
  CHECK_THROWS_AS(g0.dropout(x0, 1.0, 1), weft::Error);
  CHECK_THROWS_AS(g0.dropout(x0, -0.1, 1), weft::Error);
}

TEST_CASE("dropout on a shard: with the tile's global indices it computes its part of the whole mask") {
  Graph g("d");
  auto x = g.input("x", {6, 8}, weft::DType::F64);
  auto y = g.dropout(x, 0.5, 9);
  std::mt19937 gen(4);
  auto X = rnd({6, 8}, gen);
  const auto whole = interpret(g, {{x, X}})[y];
  // A strided tile: rows {1, 3, 5}, columns {2, 3, 6, 7}.
  const std::vector<std::int64_t> rows{1, 3, 5}, cols{2, 3, 6, 7};
  HostTensor tile{{3, 4}, {}};
  for (auto r : rows)
    for (auto c : cols) tile.data.push_back(X.data[static_cast<std::size_t>(r * 8 + c)]);
  KernelContext ctx;
  ctx.out_shapes = {{3, 4}};
  ctx.element_index = {rows, cols};
  ctx.element_shape = {6, 8};
  const auto part = run_kernel(g, g.op(0), {&tile}, ctx)[0];
  for (std::size_t i = 0; i < rows.size(); ++i)
    for (std::size_t j = 0; j < cols.size(); ++j)
      CHECK(part.data[i * 4 + j] == whole.data[static_cast<std::size_t>(rows[i] * 8 + cols[j])]);
}
