// The Cast op and the precision executors hold float tensors at (precision.hpp), against values
// derived by hand (binary expansions) and IEEE arithmetic of the host's float.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "weft/core/error.hpp"
#include "weft/ir/autodiff.hpp"
#include "weft/ir/interpreter.hpp"
#include "weft/ir/json.hpp"
#include "weft/ir/precision.hpp"

using namespace weft;
using namespace weft::ir;

TEST_CASE("round_to_dtype: f32 as the host's float, bf16 and f16 to nearest even by hand") {
  const double x = 1.0 + std::ldexp(1.0, -30);  // needs 31 significand bits
  CHECK(round_to_dtype(x, DType::F32) == 1.0);
  CHECK(round_to_dtype(x, DType::F64) == x);
  CHECK(round_to_dtype(0.1, DType::F32) == static_cast<double>(0.1f));
  // bf16 keeps 8 significand bits: 1 + 2^-8 is a tie between 1 and 1 + 2^-7: even (1) wins;
  // 1 + 3·2^-8 ties between 1 + 2^-7 (odd) and 1 + 2^-6 (even).
  CHECK(round_to_dtype(1.0 + std::ldexp(1.0, -8), DType::BF16) == 1.0);
  CHECK(round_to_dtype(1.0 + 3 * std::ldexp(1.0, -8), DType::BF16) == 1.0 + std::ldexp(1.0, -6));
  CHECK(round_to_dtype(-(1.0 + std::ldexp(1.0, -7)), DType::BF16) == -(1.0 + std::ldexp(1.0, -7)));
  // f16: 11 bits, largest 65504; 65520 is the tie to 65536 (even) -> overflow to inf.
  CHECK(round_to_dtype(1.0 + std::ldexp(1.0, -11), DType::F16) == 1.0);
  CHECK(round_to_dtype(65504.0, DType::F16) == 65504.0);
  CHECK(round_to_dtype(65519.0, DType::F16) == 65504.0);
  CHECK(std::isinf(round_to_dtype(65520.0, DType::F16)));
  // f16 subnormals are multiples of 2^-24: 3·2^-26 -> 2^-24 (0.75 ulp rounds up), 2^-25 is a tie -> 0.
  CHECK(round_to_dtype(3 * std::ldexp(1.0, -26), DType::F16) == std::ldexp(1.0, -24));
  CHECK(round_to_dtype(std::ldexp(1.0, -25), DType::F16) == 0.0);
  CHECK(std::isnan(round_to_dtype(std::numeric_limits<double>::quiet_NaN(), DType::BF16)));
}

TEST_CASE(
    "held_dtype: the base at the run's dtype, a narrower region at most its own, a wider one at least") {
  CHECK(held_dtype(DType::F64, DType::F64, DType::F64) == DType::F64);
  CHECK(held_dtype(DType::F32, DType::F64, DType::F64) == DType::F32);  // Llama's RMSNorm in an f64 model
  CHECK(held_dtype(DType::F32, DType::F64, DType::F32) == DType::F32);
  CHECK(held_dtype(DType::BF16, DType::F64, DType::F32) == DType::BF16);
  CHECK(held_dtype(DType::F32, DType::F32, DType::F64) == DType::F64);    // one dtype: the run's
  CHECK(held_dtype(DType::F32, DType::BF16, DType::BF16) == DType::F32);  // a bf16 model's upcast
  CHECK(held_dtype(DType::F32, DType::BF16, DType::F64) == DType::F64);
  CHECK(held_dtype(DType::I64, DType::F64, DType::F32) == DType::I64);
}

TEST_CASE("cast: rule, identity, refusals, base dtype, JSON, interpreter rounding and gradient") {
  Graph g("c");
  auto x = g.input("x", {2, 3}, DType::F64);
  auto w = g.parameter("w", {2, 3}, DType::F64);
  CHECK(g.cast(x, DType::F64) == x);  // identity conversions are free
  auto h = g.cast(g.mul(x, w), DType::F32, "down");
  auto y = g.mul(h, h);
  auto l = g.reduce(ReduceFn::Sum, g.cast(y, DType::F64, "up"), {0, 1});
  g.set_loss(l);
  const Op& c = g.op(g.tensor(h).producer);
  CHECK(c.kind == OpKind::Cast);
  CHECK(g.tensor(h).dtype == DType::F32);
  CHECK(c.index_map.factors.size() == 2);  // elementwise: one parallel factor per dim
  for (const auto& f : c.index_map.factors) CHECK(f.kind == FactorKind::Parallel);
  CHECK(base_float_dtype(g) == DType::F64);
  Graph other("ints");
  CHECK_THROWS_AS(other.cast(other.input("ids", {2}, DType::I64), DType::F32), Error);
  OpAttrs bad = encode_cast_attrs(DType::I32);
  CHECK_THROWS_AS(cast_dtype(bad, "op"), Error);
  CHECK(graph_from_json(graph_to_json(g)) == g);

  // f32 region: x·w rounded to f32, its square in f32 arithmetic (one correctly rounded product:
  // f64 then round is exactly f32's), the sum back in f64.
  HostTensor X{{2, 3}, {0.1, 0.2, 0.3, 0.4, 0.5, 0.6}}, W{{2, 3}, {1.1, 1.2, 1.3, 1.4, 1.5, 1.6}};
  auto v = interpret(g, {{x, X}, {w, W}});
  double want = 0;
  for (int i = 0; i < 6; ++i) {
    const float p = static_cast<float>(X.data[i] * W.data[i]);
    want += static_cast<double>(p * p);
  }
  CHECK(v[l].data[0] == want);

  // Gradient: dy in f64 cast back to f32 at "up", through the f32 product, cast to f64 at "down".
  auto step = build_training_graph(g, {.optimizer = Optimizer::None});
  auto gw = step.grad(*step.find_tensor("w"));
  REQUIRE(gw);
  CHECK(step.tensor(*gw).dtype == DType::F64);
  int casts = 0;
  for (const auto& op : step.ops()) casts += op.kind == OpKind::Cast;
  CHECK(casts == 4);  // two forward, two backward
  auto sv = interpret(step, {{*step.find_tensor("x"), X}, {*step.find_tensor("w"), W}});
  for (int i = 0; i < 6; ++i) {
    const float p = static_cast<float>(X.data[i] * W.data[i]);
    const float dh = 2.0f * p;  // d(h·h)/dh in f32 (dy = 1 exactly)
    CHECK(sv[*gw].data[static_cast<std::size_t>(i)] == static_cast<double>(dh) * X.data[i]);
  }
}
