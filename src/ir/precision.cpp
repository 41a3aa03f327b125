// Held precision of float tensors (precision.hpp) and the Cast op's attributes.
#include "weft/ir/precision.hpp"

#include <cmath>
#include <limits>
#include <map>

#include "weft/core/error.hpp"
#include "weft/ir/op.hpp"

namespace weft::ir {

namespace {

int significand_bits(DType t) {
  switch (t) {
    case DType::BF16: return 8;
    case DType::F16: return 11;
    case DType::F32: return 24;
    case DType::F64: return 53;
    default: return 0;
  }
}

// x (a float) rounded to a binary format with `p` significand bits, smallest normal 2^min_exp and
// largest finite `max_finite`, to nearest even; beyond max_finite: ±inf (IEEE's overflow).
double round_bits(double x, int p, int min_exp, double max_finite) {
  if (!std::isfinite(x) || x == 0) return x;
  int e = 0;
  (void)std::frexp(x, &e);                           // |x| = m·2^e, m in [0.5, 1): ulp 2^(e − p)
  const int q = std::max(e - p, min_exp - (p - 1));  // subnormals share the smallest normal's ulp
  const double y = std::ldexp(std::nearbyint(std::ldexp(x, -q)), q);
  return std::fabs(y) > max_finite ? std::copysign(std::numeric_limits<double>::infinity(), x) : y;
}

}  // namespace

DType cast_dtype(const OpAttrs& a, std::string_view op) {
  WEFT_CHECK(a.ints.size() == 1, "op '{}': cast needs attrs.ints = {{target dtype}}", op);
  const auto v = a.ints[0];
  WEFT_CHECK(v >= 0 && v <= static_cast<std::int64_t>(DType::Bool), "op '{}': cast to dtype number {} (none)",
             op, v);
  const auto d = static_cast<DType>(v);
  WEFT_CHECK(is_floating(d), "op '{}': cast to {}: only floating dtypes (f64, f32, bf16, f16)", op,
             dtype_name(d));
  return d;
}

OpAttrs encode_cast_attrs(DType to) {
  OpAttrs a;
  a.ints = {static_cast<std::int64_t>(to)};
  return a;
}

DType base_float_dtype(const Graph& g) {
  std::map<DType, std::int64_t> params, others;
  for (const auto& t : g.tensors()) {
    if (!is_floating(t.dtype) || t.role == Role::OptimizerState) continue;
    ++(t.role == Role::Parameter && t.producer == kNoOp ? params : others)[t.dtype];
  }
  const auto& count = params.empty() ? others : params;
  DType best = DType::F32;
  std::int64_t n = 0;
  for (const auto& [d, c] : count)
    if (c > n || (c == n && significand_bits(d) > significand_bits(best))) {
      best = d;
      n = c;
    }
  return best;
}

DType held_dtype(DType t, DType base, DType run) {
  if (!is_floating(t) || t == base) return is_floating(t) ? run : t;
  const bool narrower = significand_bits(t) < significand_bits(base);
  const bool t_first = significand_bits(t) < significand_bits(run);
  // narrower than the base: the narrower of (t, run); wider: the wider of them
  return narrower == t_first ? t : run;
}

double round_to_dtype(double x, DType d) {
  switch (d) {
    case DType::F32: return static_cast<double>(static_cast<float>(x));
    case DType::BF16:
      return round_bits(static_cast<double>(static_cast<float>(x)), 8, -126, 3.3895313892515355e38);
    case DType::F16: return round_bits(static_cast<double>(static_cast<float>(x)), 11, -14, 65504.0);
    default: return x;
  }
}

void round_to_dtype(HostTensor& t, DType d) {
  if (d == DType::F64 || !is_floating(d)) return;
  for (auto& v : t.data) v = round_to_dtype(v, d);
}

}  // namespace weft::ir
