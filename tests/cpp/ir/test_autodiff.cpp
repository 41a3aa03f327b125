// Autodiff against central finite differences of the interpreted loss (f64), for every
// differentiable op kind, and the optimizer updates against their closed forms.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <random>

#include "weft/core/error.hpp"
#include "weft/ir/autodiff.hpp"
#include "weft/ir/interpreter.hpp"

using namespace weft::ir;

namespace {

HostTensor uniform(const Shape& s, std::mt19937& gen, double lo, double hi) {
  std::uniform_real_distribution<double> u(lo, hi);
  HostTensor t{s, {}};
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data.push_back(u(gen));
  return t;
}

// loss = Σ y ⊙ R with a random input R (an einsum contraction to a scalar), or y itself if scalar.
TensorId wrap_loss(Graph& g, TensorId y) {
  const Shape s = g.tensor(y).shape;
  if (s.empty()) {
    g.set_loss(y);
    return y;
  }
  auto r = g.input("loss_weights", s);
  std::string l;
  for (std::size_t i = 0; i < s.size(); ++i) l += static_cast<char>('a' + i);
  auto loss = g.einsum(l + "," + l + "->", {y, r}, "loss");
  g.set_loss(loss);
  return loss;
}

struct Case {
  Graph g;
  std::map<TensorId, HostTensor> feeds;  // every leaf; parameters are the differentiated ones
};

double loss_of(const Graph& g, const std::map<TensorId, HostTensor>& feeds) {
  return interpret(g, feeds)[*g.loss()].data[0];
}

// Compares autodiff's parameter gradients (interpreted training graph, no optimizer) with central
// differences of the forward loss, element by element.
void check_gradients(const Case& c, double h = 1e-6, double tol = 1e-6) {
  TrainOptions o;
  o.optimizer = Optimizer::None;
  Graph tg = build_training_graph(c.g, o);
  tg.validate();
  auto vals = interpret(tg, c.feeds);
  int checked = 0;
  for (const auto& [id, value] : c.feeds) {
    const auto& ti = c.g.tensor(id);
    if (ti.role != Role::Parameter) continue;
    auto gid = tg.grad(id);
    REQUIRE_MESSAGE(gid.has_value(), "no gradient for " << ti.name);
    CHECK(tg.tensor(*gid).role == Role::Gradient);
    CHECK(tg.grad_of(*gid) == id);
    const HostTensor& grad = vals[*gid];
    REQUIRE(grad.shape == ti.shape);
    for (std::int64_t i = 0; i < value.numel(); ++i) {
      auto f = c.feeds;
      f[id].data[i] = value.data[i] + h;
      double up = loss_of(c.g, f);
      f[id].data[i] = value.data[i] - h;
      double down = loss_of(c.g, f);
      double fd = (up - down) / (2 * h);
      INFO("tensor " << ti.name << " element " << i << " of graph " << c.g.name());
      CHECK(grad.data[i] == doctest::Approx(fd).epsilon(tol).scale(1.0));
      ++checked;
    }
  }
  CHECK(checked > 0);
}

// A case with parameters `params` (shape, value range) and a body that builds y from them.
Case make_case(const std::string& name,
               const std::vector<std::pair<Shape, std::pair<double, double>>>& params,
               const std::function<TensorId(Graph&, const std::vector<TensorId>&)>& body, unsigned seed = 1) {
  std::mt19937 gen(seed);
  Case c{Graph(name), {}};
  std::vector<TensorId> ps;
  for (std::size_t i = 0; i < params.size(); ++i) {
    ps.push_back(c.g.parameter("p" + std::to_string(i), params[i].first));
    c.feeds[ps.back()] = uniform(params[i].first, gen, params[i].second.first, params[i].second.second);
  }
  TensorId y = body(c.g, ps);
  wrap_loss(c.g, y);
  if (auto r = c.g.find_tensor("loss_weights")) c.feeds[*r] = uniform(c.g.tensor(*r).shape, gen, -1, 1);
  return c;
}

const std::pair<double, double> kAny{-1.0, 1.0}, kPos{0.5, 2.0};

}  // namespace

TEST_CASE("gradients of einsums: matmul, batched, 3 operands, an index summed in one operand only") {
  check_gradients(make_case("matmul", {{{2, 3, 4}, kAny}, {{4, 5}, kAny}},
                            [](Graph& g, auto p) { return g.einsum("bsh,hf->bsf", {p[0], p[1]}); }));
  check_gradients(make_case("bmm", {{{2, 3, 4}, kAny}, {{2, 4, 2}, kAny}},
                            [](Graph& g, auto p) { return g.einsum("bij,bjk->bik", {p[0], p[1]}); }));
  check_gradients(make_case("three", {{{2, 3, 4}, kAny}, {{4, 5}, kAny}, {{2, 5}, kAny}},
                            [](Graph& g, auto p) { return g.einsum("bij,jk,bk->ik", {p[0], p[1], p[2]}); }));
  // l is summed inside operand 1 alone: its gradient is constant along l (a BroadcastTo).
  check_gradients(make_case("lonely", {{{3, 4}, kAny}, {{4, 2}, kAny}},
                            [](Graph& g, auto p) { return g.einsum("ij,jl->i", {p[0], p[1]}); }));
  // The same tensor twice: both uses contribute.
  check_gradients(make_case("square", {{{3, 3}, kAny}},
                            [](Graph& g, auto p) { return g.einsum("ij,jk->ik", {p[0], p[0]}); }));
  check_gradients(make_case("transposed_out", {{{3, 4}, kAny}},
                            [](Graph& g, auto p) { return g.einsum("ij->ji", {p[0]}); }));
}

TEST_CASE("gradients of every unary function") {
  for (UnaryFn f :
       {UnaryFn::Identity, UnaryFn::Neg, UnaryFn::Relu, UnaryFn::Gelu, UnaryFn::Tanh, UnaryFn::Exp,
        UnaryFn::Log, UnaryFn::Sigmoid, UnaryFn::Sqrt, UnaryFn::Rsqrt, UnaryFn::Square, UnaryFn::Scale}) {
    bool pos = f == UnaryFn::Log || f == UnaryFn::Sqrt || f == UnaryFn::Rsqrt;
    check_gradients(make_case(std::string(unary_fn_name(f)), {{{2, 5}, pos ? kPos : kAny}},
                              [f](Graph& g, auto p) { return g.unary(f, p[0], {}, 1.7); }));
  }
}

TEST_CASE("gradient of dropout: the same mask on dy (central differences; a mask that drops some)") {
  check_gradients(make_case("dropout", {{{4, 6}, kAny}}, [](Graph& g, auto p) {
    return g.dropout(g.unary(UnaryFn::Tanh, p[0]), 0.4, 11);
  }));
}

TEST_CASE("gradients of every binary function, with broadcasting on both sides") {
  for (BinaryFn f : {BinaryFn::Add, BinaryFn::Sub, BinaryFn::Mul, BinaryFn::Div, BinaryFn::Max}) {
    auto rb = f == BinaryFn::Div ? kPos : kAny;
    check_gradients(make_case(std::string(binary_fn_name(f)) + "_bcast", {{{2, 3, 4}, kAny}, {{3, 1}, rb}},
                              [f](Graph& g, auto p) { return g.binary(f, p[0], p[1]); }));
    check_gradients(make_case(std::string(binary_fn_name(f)) + "_both", {{{2, 1, 4}, kAny}, {{3, 1}, rb}},
                              [f](Graph& g, auto p) { return g.binary(f, p[0], p[1]); }));
    check_gradients(make_case(std::string(binary_fn_name(f)) + "_same", {{{2, 3}, kAny}, {{2, 3}, rb}},
                              [f](Graph& g, auto p) { return g.binary(f, p[0], p[1]); }));
  }
  // x·x and x + x: one tensor, two operand slots.
  check_gradients(make_case("xx", {{{4}, kAny}}, [](Graph& g, auto p) { return g.mul(p[0], p[0]); }));
  check_gradients(make_case("x+x", {{{4}, kAny}}, [](Graph& g, auto p) { return g.add(p[0], p[0]); }));
}

TEST_CASE("gradients of reduce sum, mean and max") {
  check_gradients(make_case("sum", {{{2, 3, 4}, kAny}},
                            [](Graph& g, auto p) { return g.reduce(ReduceFn::Sum, p[0], {0, 2}); }));
  check_gradients(make_case("mean", {{{2, 3, 4}, kAny}},
                            [](Graph& g, auto p) { return g.reduce(ReduceFn::Mean, p[0], {-2}); }));
  check_gradients(make_case("max", {{{2, 3, 4}, kAny}},
                            [](Graph& g, auto p) { return g.reduce(ReduceFn::Max, p[0], {1}); }));
  check_gradients(make_case("max_all", {{{3, 4}, kAny}},
                            [](Graph& g, auto p) { return g.reduce(ReduceFn::Max, p[0], {0, 1}); }));
}

TEST_CASE("gradients of softmax, layer norm, embedding and cross entropy") {
  check_gradients(
      make_case("softmax", {{{2, 3, 4}, kAny}}, [](Graph& g, auto p) { return g.softmax(p[0], 1); }));
  check_gradients(make_case("layer_norm", {{{2, 3, 5}, kAny}, {{5}, kAny}, {{5}, kAny}},
                            [](Graph& g, auto p) { return g.layer_norm(p[0], p[1], p[2], 1e-3); }));
  {
    Case c = make_case("embedding", {{{5, 3}, kAny}}, [](Graph& g, auto p) {
      auto ids = g.input("ids", {2, 3}, weft::DType::I32);
      return g.embedding(p[0], ids);
    });
    c.feeds[*c.g.find_tensor("ids")] = HostTensor{{2, 3}, {4, 0, 4, 1, 1, 4}};  // repeated ids accumulate
    check_gradients(c);
  }
  {
    Case c = make_case("cross_entropy", {{{2, 3, 5}, {-2.0, 2.0}}}, [](Graph& g, auto p) {
      auto lab = g.input("labels", {2, 3}, weft::DType::I64);
      return g.cross_entropy(p[0], lab);
    });
    c.feeds[*c.g.find_tensor("labels")] = HostTensor{{2, 3}, {0, 4, 2, 2, 1, 3}};
    check_gradients(c);
  }
}

TEST_CASE("gradients of transpose, reshape, concat and slice") {
  check_gradients(make_case("transpose", {{{2, 3, 4}, kAny}},
                            [](Graph& g, auto p) { return g.transpose(p[0], {2, 0, 1}); }));
  check_gradients(
      make_case("reshape", {{{2, 3, 4}, kAny}}, [](Graph& g, auto p) { return g.reshape(p[0], {4, 6}); }));
  check_gradients(make_case("concat", {{{2, 3}, kAny}, {{2, 2}, kAny}},
                            [](Graph& g, auto p) { return g.concat({p[0], p[1], p[0]}, -1); }));
  check_gradients(
      make_case("slice", {{{2, 5, 3}, kAny}}, [](Graph& g, auto p) { return g.slice(p[0], 1, 1, 4); }));
}

TEST_CASE("gradients of conv2d with stride and padding, and of max / mean pooling") {
  check_gradients(make_case("conv", {{{2, 2, 5, 5}, kAny}, {{3, 2, 3, 3}, kAny}},
                            [](Graph& g, auto p) { return g.conv2d(p[0], p[1], 2, 1); }));
  check_gradients(make_case("conv_s1", {{{1, 2, 4, 4}, kAny}, {{2, 2, 2, 2}, kAny}},
                            [](Graph& g, auto p) { return g.conv2d(p[0], p[1], 1, 0); }));
  check_gradients(make_case("maxpool", {{{1, 2, 5, 5}, kAny}},
                            [](Graph& g, auto p) { return g.pool2d(ReduceFn::Max, p[0], 2, 2, 1); }));
  check_gradients(make_case("meanpool", {{{1, 2, 5, 5}, kAny}},
                            [](Graph& g, auto p) { return g.pool2d(ReduceFn::Mean, p[0], 3, 2, 1); }));
}

TEST_CASE("gradients through a small transformer-ish block: shared tensors accumulate") {
  Case c = make_case("block",
                     {{{4, 3}, kAny}, {{3}, kAny}, {{3}, kAny}, {{3, 6}, kAny}, {{6, 3}, kAny}, {{3}, kAny}},
                     [](Graph& g, auto p) {
                       auto x = g.input("x", {2, 2, 3});
                       auto ln = g.layer_norm(x, p[1], p[2], 1e-5);
                       auto h = g.unary(UnaryFn::Gelu, g.matmul(ln, p[3]));
                       auto o = g.add(g.matmul(h, p[4]), p[5]);
                       auto r = g.add(x, o);  // residual: x read twice
                       auto s = g.softmax(r, -1);
                       auto logits = g.einsum("bsh,vh->bsv", {s, p[0]});
                       auto lab = g.input("lab", {2, 2}, weft::DType::I32);
                       return g.cross_entropy(logits, lab);
                     });
  std::mt19937 gen(3);
  c.feeds[*c.g.find_tensor("x")] = uniform({2, 2, 3}, gen, -1, 1);
  c.feeds[*c.g.find_tensor("lab")] = HostTensor{{2, 2}, {0, 3, 2, 1}};
  check_gradients(c);
}

TEST_CASE("training graph structure: roles, grad_of, outputs, Adam states") {
  Graph g("mlp");
  auto x = g.input("x", {4, 3});
  auto w1 = g.parameter("w1", {3, 5});
  auto w2 = g.parameter("w2", {5, 2});
  auto unused = g.parameter("unused", {7});
  auto y = g.matmul(g.unary(UnaryFn::Relu, g.matmul(x, w1)), w2);
  auto loss = g.reduce(ReduceFn::Mean, y, {0, 1}, "loss");
  g.set_loss(loss);
  Graph t = build_training_graph(g);
  t.validate();
  CHECK(t.num_params() == g.num_params());
  int states = 0, updates = 0;
  for (const auto& ti : t.tensors()) {
    if (ti.role == Role::OptimizerState && ti.producer == kNoOp) ++states;
    if (ti.producer != kNoOp && t.op(ti.producer).kind == OpKind::AdamUpdate) ++updates;
  }
  CHECK(states == 4);              // m and v of w1 and w2; none for the unused parameter
  CHECK(updates == 6);             // (w', m', v') per parameter
  CHECK(t.outputs().size() == 7);  // loss + 6
  CHECK(!t.grad(x).has_value());   // inputs get no gradient
  CHECK(!t.grad(unused).has_value());
  REQUIRE(t.grad(w1).has_value());
  CHECK(t.tensor(*t.grad(w1)).shape == Shape{3, 5});
  CHECK(t.tensor(*t.grad(loss)).role == Role::Constant);  // the seed
  // FLOPs: forward 2·4·3·5 + 4·5 + 2·4·5·2 + 4·2; backward: dW1 only (x needs none), dh, dW2, relu', mean'.
  double fwd = 2.0 * 4 * 3 * 5 + 4 * 5 * 1 + 2.0 * 4 * 5 * 2 + 4 * 2;
  double bwd = 2.0 * 4 * 3 * 5 + 2.0 * 4 * 5 * 2 * 2 + 4 * 5 * 2 + 1 /*scale*/;
  CHECK(g.flops() == doctest::Approx(fwd));
  CHECK(training_flops(g) == doctest::Approx(fwd + bwd));
}

TEST_CASE("one SGD step and one Adam step match the closed-form updates") {
  Graph g("lin");
  auto w = g.parameter("w", {3});
  auto x = g.input("x", {3});
  auto loss = g.einsum("i,i->", {w, x}, "loss");  // dL/dw = x
  g.set_loss(loss);
  HostTensor W{{3}, {0.5, -1.0, 2.0}}, X{{3}, {1.0, 2.0, -3.0}};
  {
    TrainOptions o;
    o.optimizer = Optimizer::Sgd;
    o.lr = 0.1;
    Graph t = build_training_graph(g, o);
    auto v = interpret(t, {{w, W}, {x, X}});
    auto upd = t.outputs()[1];
    CHECK(t.tensor(upd).role == Role::Parameter);
    CHECK(t.grad_of(upd) == w);
    for (int i = 0; i < 3; ++i) CHECK(v[upd].data[i] == doctest::Approx(W.data[i] - 0.1 * X.data[i]));
  }
  {
    TrainOptions o;
    o.optimizer = Optimizer::Adam;
    o.lr = 0.01;
    o.beta1 = 0.8;
    o.beta2 = 0.9;
    o.eps = 1e-3;
    o.step = 2;
    Graph t = build_training_graph(g, o);
    TensorId m = *t.find_tensor("adam_m:w"), vv = *t.find_tensor("adam_v:w");
    HostTensor M{{3}, {0.1, 0.2, -0.3}}, V{{3}, {0.5, 0.1, 0.2}};
    auto v = interpret(t, {{w, W}, {x, X}, {m, M}, {vv, V}});
    const Op& adam = t.op(t.tensor(t.outputs()[1]).producer);
    REQUIRE(adam.kind == OpKind::AdamUpdate);
    for (int i = 0; i < 3; ++i) {
      double gi = X.data[i];
      double m1 = 0.8 * M.data[i] + 0.2 * gi, v1 = 0.9 * V.data[i] + 0.1 * gi * gi;
      double p1 = W.data[i] - 0.01 * (m1 / (1 - 0.64)) / (std::sqrt(v1 / (1 - 0.81)) + 1e-3);
      CHECK(v[adam.outputs[0]].data[i] == doctest::Approx(p1).epsilon(1e-12));
      CHECK(v[adam.outputs[1]].data[i] == doctest::Approx(m1).epsilon(1e-12));
      CHECK(v[adam.outputs[2]].data[i] == doctest::Approx(v1).epsilon(1e-12));
    }
    CHECK(t.tensor(adam.outputs[1]).role == Role::OptimizerState);
  }
}

TEST_CASE("master weights: SGD with momentum and Adam update the f32 copy; the parameter is its value") {
  Graph g("lin16");
  auto w = g.parameter("w", {3}, weft::DType::F16);
  auto x = g.input("x", {3}, weft::DType::F16);
  auto loss = g.einsum("i,i->", {w, x}, "loss");  // dL/dw = x
  g.set_loss(loss);
  // The master copy differs from w on purpose: the rule reads it, not w.
  HostTensor W{{3}, {0.5, -1.0, 2.0}}, X{{3}, {1.0, 2.0, -3.0}}, Wm{{3}, {0.25, -0.75, 1.5}};
  {
    TrainOptions o;
    o.optimizer = Optimizer::Sgd;
    o.lr = 0.1;
    o.momentum = 0.5;
    Graph t = build_training_graph(g, o);
    TensorId m = *t.find_tensor("master:w"), b = *t.find_tensor("sgd_momentum:w");
    CHECK(t.tensor(m).dtype == weft::DType::F32);
    CHECK(t.tensor(b).dtype == weft::DType::F32);
    HostTensor B{{3}, {0.2, 0.0, -0.4}};
    auto v = interpret(t, {{w, W}, {x, X}, {m, Wm}, {b, B}});
    const Op& sgd = t.op(t.tensor(t.outputs()[1]).producer);
    REQUIRE(sgd.kind == OpKind::SgdUpdate);
    REQUIRE(sgd.outputs.size() == 3);
    for (int i = 0; i < 3; ++i) {
      double b1 = 0.5 * B.data[i] + X.data[i], w1 = Wm.data[i] - 0.1 * b1;
      CHECK(v[sgd.outputs[0]].data[i] == doctest::Approx(w1).epsilon(1e-12));
      CHECK(v[sgd.outputs[1]].data[i] == doctest::Approx(w1).epsilon(1e-12));
      CHECK(v[sgd.outputs[2]].data[i] == doctest::Approx(b1).epsilon(1e-12));
    }
  }
  {
    TrainOptions o;
    o.lr = 0.01;
    o.step = 2;
    Graph t = build_training_graph(g, o);
    TensorId mw = *t.find_tensor("master:w"), m = *t.find_tensor("adam_m:w"), vv = *t.find_tensor("adam_v:w");
    HostTensor M{{3}, {0.1, 0.2, -0.3}}, V{{3}, {0.5, 0.1, 0.2}};
    auto v = interpret(t, {{w, W}, {x, X}, {mw, Wm}, {m, M}, {vv, V}});
    const Op& adam = t.op(t.tensor(t.outputs()[1]).producer);
    REQUIRE(adam.outputs.size() == 4);
    for (int i = 0; i < 3; ++i) {
      double gi = X.data[i];
      double m1 = 0.9 * M.data[i] + 0.1 * gi, v1 = 0.999 * V.data[i] + 0.001 * gi * gi;
      double p1 = Wm.data[i] - 0.01 * (m1 / (1 - 0.81)) / (std::sqrt(v1 / (1 - 0.999 * 0.999)) + 1e-8);
      CHECK(v[adam.outputs[0]].data[i] == doctest::Approx(p1).epsilon(1e-12));
      CHECK(v[adam.outputs[1]].data[i] == doctest::Approx(p1).epsilon(1e-12));
      CHECK(v[adam.outputs[2]].data[i] == doctest::Approx(m1).epsilon(1e-12));
      CHECK(v[adam.outputs[3]].data[i] == doctest::Approx(v1).epsilon(1e-12));
    }
    CHECK(t.tensor(adam.outputs[0]).dtype == weft::DType::F16);
    CHECK(t.tensor(adam.outputs[1]).role == Role::OptimizerState);
  }
}

TEST_CASE("autodiff errors: no loss, opaque on the gradient path, bad options") {
  Graph g("e");
  auto w = g.parameter("w", {2});
  auto y = g.opaque({w}, {}, 5, "blackbox");
  CHECK_THROWS_WITH_AS(build_training_graph(g), doctest::Contains("has no loss"), weft::Error);
  g.set_loss(y);
  CHECK_THROWS_WITH_AS(build_training_graph(g),
                       doctest::Contains("'blackbox' of kind opaque is not differentiable"), weft::Error);
  // Opaque off the gradient path is fine.
  Graph h("ok");
  auto x = h.input("x", {2});
  auto o = h.opaque({x}, {2}, 5, "pre");
  auto w2 = h.parameter("w", {2});
  h.set_loss(h.einsum("i,i->", {o, w2}));
  CHECK_NOTHROW(build_training_graph(h));
  TrainOptions bad;
  bad.lr = -1;
  CHECK_THROWS_WITH_AS(build_training_graph(h, bad), doctest::Contains("learning rate"), weft::Error);
}

TEST_CASE("build_training_graph is linear: each layer adds the same ops, a 48-layer stack builds fast") {
  auto build = [](int layers) {
    Graph g("deep");
    auto x = g.input("x", {8, 16});
    TensorId h = x;
    for (int l = 0; l < layers; ++l) {
      auto w = g.parameter("w" + std::to_string(l), {16, 16});
      auto gm = g.parameter("g" + std::to_string(l), {16});
      auto bt = g.parameter("b" + std::to_string(l), {16});
      h = g.add(h, g.unary(UnaryFn::Gelu, g.matmul(g.layer_norm(h, gm, bt), w)));
    }
    g.set_loss(g.reduce(ReduceFn::Sum, h, {0, 1}));
    return g;
  };
  auto added = [&](int layers) {
    return build_training_graph(build(layers)).ops().size() - build(layers).ops().size();
  };
  auto t0 = std::chrono::steady_clock::now();
  auto n48 = added(48);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(n48 - added(36) == added(36) - added(24));  // the same backward+update ops per layer
  CHECK(n48 - added(36) > 12 * 5);
  CHECK(secs < 2.0);
}
