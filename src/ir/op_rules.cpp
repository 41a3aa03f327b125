// One rule per op kind: result shapes and the index map from (kind, attrs, operand shapes).
// See include/weft/ir/index_map.hpp for what the factor kinds mean to the solvers.
#include "weft/ir/op_rules.hpp"

#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <set>

#include "attention.hpp"
#include "routing.hpp"
#include "weft/core/error.hpp"

namespace weft::ir {
namespace {

// Builds an index map factor by factor, then dims, like Shardy's rule builder.
class MapBuilder {
 public:
  int factor(std::string name, std::int64_t size, FactorKind kind = FactorKind::Parallel,
             ReduceKind reduce = ReduceKind::None) {
    map_.factors.push_back(Factor{std::move(name), size, kind, reduce});
    return static_cast<int>(map_.factors.size()) - 1;
  }
  void input(std::vector<DimFactors> dims) { map_.inputs.push_back(std::move(dims)); }
  void output(std::vector<DimFactors> dims) { map_.outputs.push_back(std::move(dims)); }
  // One fresh factor per dim of a shape, all of one kind.
  std::vector<DimFactors> fresh(const Shape& s, const std::string& prefix, FactorKind kind,
                                ReduceKind reduce = ReduceKind::None) {
    std::vector<DimFactors> dims;
    for (std::size_t d = 0; d < s.size(); ++d)
      dims.push_back({factor(prefix + std::to_string(d), s[d], kind, reduce)});
    return dims;
  }
  IndexMap done(double flops_per_point, std::vector<int> work) {
    map_.flops_per_point = flops_per_point;
    map_.work_factors = std::move(work);
    return std::move(map_);
  }
  IndexMap done_all(double flops_per_point) {
    std::vector<int> all(map_.factors.size());
    std::iota(all.begin(), all.end(), 0);
    return done(flops_per_point, std::move(all));
  }
  const IndexMap& map() const { return map_; }

 private:
  IndexMap map_;
};

std::vector<int> flatten(const std::vector<DimFactors>& dims) {
  std::vector<int> out;
  for (const auto& d : dims) out.insert(out.end(), d.begin(), d.end());
  return out;
}

int norm_axis(int axis, int rank, std::string_view op) {
  int a = axis < 0 ? axis + rank : axis;
  WEFT_CHECK(a >= 0 && a < rank, "op '{}': axis {} out of range for rank {}", op, axis, rank);
  return a;
}

void check_arity(const std::vector<Shape>& in, std::size_t n, std::string_view op, std::string_view kind) {
  WEFT_CHECK(in.size() == n, "op '{}' ({}): expected {} operand(s), got {}", op, kind, n, in.size());
}

void check_rank(const Shape& s, std::size_t r, std::string_view op, std::string_view what) {
  WEFT_CHECK(s.size() == r, "op '{}': {} must have rank {}, got shape {}", op, what, r, s);
}

double unary_flops(UnaryFn f) {
  switch (f) {
    case UnaryFn::Identity: return 0;
    case UnaryFn::Neg:
    case UnaryFn::Relu:
    case UnaryFn::Square:
    case UnaryFn::Scale: return 1;
    case UnaryFn::Sqrt:
    case UnaryFn::Rsqrt: return 2;
    case UnaryFn::Tanh:
    case UnaryFn::Exp:
    case UnaryFn::Log:
    case UnaryFn::Sigmoid: return 4;
    case UnaryFn::Gelu: return 8;
    case UnaryFn::GeluErf: return 8;
  }
  return 1;
}

bool is_int(DType t) { return t == DType::I32 || t == DType::I64; }

// Output shape of a conv/pool spatial dim.
std::int64_t conv_out(std::int64_t in, std::int64_t k, std::int64_t stride, std::int64_t pad,
                      std::string_view op) {
  WEFT_CHECK(stride >= 1 && pad >= 0, "op '{}': stride must be >= 1 and pad >= 0", op);
  std::int64_t span = in + 2 * pad - k;
  WEFT_CHECK(span >= 0, "op '{}': kernel {} larger than padded input {}", op, k, in + 2 * pad);
  return span / stride + 1;
}

// Elementwise over one shape: a shared parallel factor per dim; `special` dims get kind `k`.
IndexMap same_shape_map(const Shape& s, int n_in, int n_out, double fpp, const std::vector<int>& special = {},
                        FactorKind k = FactorKind::NeedReplication) {
  MapBuilder b;
  std::vector<DimFactors> dims;
  for (std::size_t d = 0; d < s.size(); ++d) {
    bool sp = std::find(special.begin(), special.end(), static_cast<int>(d)) != special.end();
    dims.push_back({b.factor("d" + std::to_string(d), s[d], sp ? k : FactorKind::Parallel)});
  }
  for (int i = 0; i < n_in; ++i) b.input(dims);
  for (int i = 0; i < n_out; ++i) b.output(dims);
  return b.done_all(fpp);
}

OpSignature einsum_rule(const OpAttrs& a, const std::vector<Shape>& in, const std::vector<DType>& dt,
                        std::string_view op) {
  const std::string& eq = a.equation;
  auto [terms, rhs] = split_einsum(eq, op);
  WEFT_CHECK(terms.size() == in.size(), "op '{}': einsum '{}' has {} operand terms but {} operands", op, eq,
             terms.size(), in.size());
  std::map<char, std::int64_t> size;
  std::vector<char> order;  // letters in order of first appearance
  for (std::size_t t = 0; t < terms.size(); ++t) {
    WEFT_CHECK(terms[t].size() == in[t].size(),
               "op '{}': einsum term '{}' has {} letters but operand {} has shape {}", op, terms[t],
               terms[t].size(), t, in[t]);
    std::set<char> seen;
    for (std::size_t d = 0; d < terms[t].size(); ++d) {
      char c = terms[t][d];
      WEFT_CHECK(std::isalpha(static_cast<unsigned char>(c)), "op '{}': einsum '{}' has a non-letter '{}'",
                 op, eq, c);
      WEFT_CHECK(seen.insert(c).second, "op '{}': letter '{}' repeats within one operand of '{}'", op, c, eq);
      auto [it, fresh] = size.emplace(c, in[t][d]);
      if (fresh) order.push_back(c);
      WEFT_CHECK(it->second == in[t][d],
                 "op '{}': index '{}' has size {} in one operand and {} in another ({})", op, c, it->second,
                 in[t][d], eq);
    }
  }
  std::set<char> out_letters;
  for (char c : rhs) {
    WEFT_CHECK(size.count(c), "op '{}': output index '{}' of '{}' is in no operand", op, c, eq);
    WEFT_CHECK(out_letters.insert(c).second, "op '{}': output index '{}' repeats in '{}'", op, c, eq);
  }
  MapBuilder b;
  std::map<char, int> fid;
  for (char c : order)
    fid[c] = out_letters.count(c)
                 ? b.factor(std::string(1, c), size[c])
                 : b.factor(std::string(1, c), size[c], FactorKind::Reduction, ReduceKind::Sum);
  for (const auto& t : terms) {
    std::vector<DimFactors> dims;
    for (char c : t) dims.push_back({fid[c]});
    b.input(std::move(dims));
  }
  std::vector<DimFactors> od;
  Shape oshape;
  for (char c : rhs) {
    od.push_back({fid[c]});
    oshape.push_back(size[c]);
  }
  b.output(std::move(od));
  // One multiply per operand beyond the first and one add: 2 FLOPs per point for a matmul.
  double fpp = std::max<double>(1.0, static_cast<double>(in.size()));
  return {{oshape}, {dt[0]}, b.done_all(fpp)};
}

OpSignature binary_rule(const std::vector<Shape>& in, const std::vector<DType>& dt, std::string_view op) {
  const Shape &x = in[0], &y = in[1];
  std::size_t r = std::max(x.size(), y.size());
  Shape out(r);
  MapBuilder b;
  std::vector<DimFactors> dx(x.size()), dy(y.size()), dout(r);
  for (std::size_t i = 0; i < r; ++i) {  // i counts from the trailing end
    std::int64_t sx = i < x.size() ? x[x.size() - 1 - i] : 1;
    std::int64_t sy = i < y.size() ? y[y.size() - 1 - i] : 1;
    WEFT_CHECK(sx == sy || sx == 1 || sy == 1,
               "op '{}': shapes {} and {} do not broadcast (dim -{}: {} vs {})", op, x, y, i + 1, sx, sy);
    std::int64_t so = std::max(sx, sy);
    out[r - 1 - i] = so;
    int f = b.factor("d" + std::to_string(r - 1 - i), so);
    dout[r - 1 - i] = {f};
    if (i < x.size()) dx[x.size() - 1 - i] = (sx == so) ? DimFactors{f} : DimFactors{};
    if (i < y.size()) dy[y.size() - 1 - i] = (sy == so) ? DimFactors{f} : DimFactors{};
  }
  WEFT_CHECK(dt[0] == dt[1], "op '{}': operand dtypes differ ({} vs {})", op, dtype_name(dt[0]),
             dtype_name(dt[1]));
  b.input(dx);
  b.input(dy);
  b.output(dout);
  return {{out}, {dt[0]}, b.done_all(1)};
}

OpSignature reshape_rule(const OpAttrs& a, const Shape& in, DType dt, std::string_view op) {
  Shape out = a.ints;
  std::int64_t n = 1;
  for (auto s : in) n *= s;
  int infer = -1;
  std::int64_t known = 1;
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      WEFT_CHECK(infer < 0, "op '{}': reshape target {} has more than one -1", op, out);
      infer = static_cast<int>(i);
    } else {
      WEFT_CHECK(out[i] >= 1, "op '{}': reshape target {} has a non-positive size", op, out);
      known *= out[i];
    }
  }
  if (infer >= 0) {
    WEFT_CHECK(known > 0 && n % known == 0, "op '{}': cannot infer -1 in {} for {} elements", op, out, n);
    out[infer] = n / known;
  }
  std::int64_t m = 1;
  for (auto s : out) m *= s;
  WEFT_CHECK(m == n, "op '{}': reshape of {} ({} elements) to {} ({} elements)", op, in, n, out, m);
  std::vector<std::vector<std::int64_t>> ind, outd;
  MapBuilder b;
  if (reshape_factors(in, out, ind, outd)) {
    // The refinement is a sequence of factor sizes shared by both sides, in order.
    std::vector<DimFactors> di, dout;
    int next = 0;
    std::vector<int> ids;
    for (const auto& d : ind) {
      DimFactors df;
      for (auto s : d) {
        int f = b.factor("f" + std::to_string(next++), s);
        ids.push_back(f);
        df.push_back(f);
      }
      di.push_back(df);
    }
    std::size_t k = 0;
    for (const auto& d : outd) {
      DimFactors df;
      for (auto s : d) {
        WEFT_ASSERT(k < ids.size() && b.map().factors[ids[k]].size == s, "reshape refinement mismatch");
        df.push_back(ids[k++]);
      }
      dout.push_back(df);
    }
    b.input(di);
    b.output(dout);
  } else {
    b.input(b.fresh(in, "i", FactorKind::NeedReplication));
    b.output(b.fresh(out, "o", FactorKind::NeedReplication));
  }
  return {{out}, {dt}, b.done(0, {})};
}

}  // namespace

EinsumTerms split_einsum(std::string_view equation, std::string_view op_name) {
  auto arrow = equation.find("->");
  WEFT_CHECK(arrow != std::string_view::npos, "op '{}': einsum equation '{}' has no '->'", op_name, equation);
  EinsumTerms t;
  t.output = std::string(equation.substr(arrow + 2));
  std::string_view lhs = equation.substr(0, arrow);
  for (std::size_t start = 0;;) {
    auto comma = lhs.find(',', start);
    t.inputs.emplace_back(
        lhs.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return t;
}

bool reshape_factors(const Shape& in, const Shape& out, std::vector<std::vector<std::int64_t>>& in_dims,
                     std::vector<std::vector<std::int64_t>>& out_dims) {
  in_dims.assign(in.size(), {});
  out_dims.assign(out.size(), {});
  std::size_t i = 0, j = 0;
  while (i < in.size() || j < out.size()) {
    // Size-1 dims carry no factor.
    if (i < in.size() && in[i] == 1) {
      ++i;
      continue;
    }
    if (j < out.size() && out[j] == 1) {
      ++j;
      continue;
    }
    if (i >= in.size() || j >= out.size()) return false;
    // Smallest group of dims [i, i2) x [j, j2) with equal products.
    std::size_t i2 = i + 1, j2 = j + 1;
    std::int64_t pi = in[i], pj = out[j];
    while (pi != pj) {
      if (pi < pj) {
        if (i2 >= in.size()) return false;
        pi *= in[i2++];
      } else {
        if (j2 >= out.size()) return false;
        pj *= out[j2++];
      }
    }
    // Boundaries of the group from the minor end: suffix products of both sides.
    std::set<std::int64_t> cuts{1};
    std::int64_t p = 1;
    for (std::size_t k = i2; k-- > i;) cuts.insert(p *= in[k]);
    p = 1;
    for (std::size_t k = j2; k-- > j;) cuts.insert(p *= out[k]);
    std::vector<std::int64_t> chain(cuts.begin(), cuts.end());
    for (std::size_t k = 1; k < chain.size(); ++k)
      if (chain[k] % chain[k - 1] != 0) return false;  // e.g. [6,4] -> [4,6]: no common factors
    // Assign the factors (major to minor) to dims: a dim spans the cuts between its suffix products.
    auto assign = [&](const Shape& s, std::size_t a, std::size_t e,
                      std::vector<std::vector<std::int64_t>>& dims) {
      std::int64_t lo = 1;
      for (std::size_t k = e; k-- > a;) {
        std::int64_t hi = lo * s[k];
        std::vector<std::int64_t> fs;
        for (std::size_t c = 1; c < chain.size(); ++c)
          if (chain[c] > lo && chain[c] <= hi) fs.push_back(chain[c] / chain[c - 1]);
        std::reverse(fs.begin(), fs.end());
        if (s[k] != 1) dims[k] = fs;
        lo = hi;
      }
    };
    assign(in, i, i2, in_dims);
    assign(out, j, j2, out_dims);
    i = i2;
    j = j2;
  }
  return true;
}

namespace {

// Elements of a shape, or weft::Error when it (or its f64 bytes) does not fit in int64: every size,
// byte and FLOP figure downstream is then exact.
std::int64_t checked_numel(const Shape& s, std::string_view op, std::string_view what) {
  std::int64_t n = 1;
  for (auto d : s)
    WEFT_CHECK(!__builtin_mul_overflow(n, d, &n) && n <= std::numeric_limits<std::int64_t>::max() / 8,
               "op '{}': {} shape {} has more elements than weft can size (2^60)", op, what, s);
  return n;
}

OpSignature derive_unchecked(OpKind kind, const OpAttrs& a, const std::vector<Shape>& in,
                             const std::vector<DType>& dt, std::string_view op);

}  // namespace

double attention_tile_imbalance(const Op& op, std::int64_t shards, std::int64_t stride) {
  if (op.kind != OpKind::Attention && op.kind != OpKind::AttentionGrad) return 1.0;
  return attention::tile_imbalance(op, shards, stride);
}

OpSignature derive_signature(OpKind kind, const OpAttrs& a, const std::vector<Shape>& in,
                             const std::vector<DType>& dt, std::string_view op) {
  WEFT_ASSERT(in.size() == dt.size(), "shapes and dtypes differ in length");
  for (const auto& s : in) {
    for (auto d : s) WEFT_CHECK(d >= 1, "op '{}': operand shape {} has a non-positive dimension", op, s);
    checked_numel(s, op, "operand");
  }
  WEFT_CHECK(std::isfinite(a.scalar), "op '{}': attribute scalar is {} (must be finite)", op, a.scalar);
  for (double v : a.scalars)
    WEFT_CHECK(std::isfinite(v), "op '{}': attribute scalars hold {} (must be finite)", op, v);
  OpSignature sig = derive_unchecked(kind, a, in, dt, op);
  for (const auto& s : sig.output_shapes) checked_numel(s, op, "result");
  std::int64_t points = 1;
  for (int f : sig.index_map.work_factors)
    WEFT_CHECK(
        !__builtin_mul_overflow(points, sig.index_map.factors[static_cast<std::size_t>(f)].size, &points),
        "op '{}': its loop nest has more than 2^63 points (FLOPs would overflow)", op);
  return sig;
}

namespace {

OpSignature derive_unchecked(OpKind kind, const OpAttrs& a, const std::vector<Shape>& in,
                             const std::vector<DType>& dt, std::string_view op) {
  const auto kname = op_kind_name(kind);
  switch (kind) {
    case OpKind::Einsum: return einsum_rule(a, in, dt, op);
    case OpKind::Unary:
      check_arity(in, 1, op, kname);
      return {{in[0]}, {dt[0]}, same_shape_map(in[0], 1, 1, unary_flops(a.unary))};
    case OpKind::Binary: check_arity(in, 2, op, kname); return binary_rule(in, dt, op);
    case OpKind::Dropout:
      check_arity(in, 1, op, kname);
      WEFT_CHECK(a.scalar >= 0 && a.scalar < 1, "op '{}': dropout probability {} is not in [0, 1)", op,
                 a.scalar);
      WEFT_CHECK(a.ints.size() == 1, "op '{}': dropout needs attrs.ints = {{seed}}", op);
      WEFT_CHECK(a.axes.empty() || a.axes == std::vector<int>{0},
                 "op '{}': dropout's batch axes must be empty or {{0}}", op);
      return {{in[0]}, {dt[0]}, same_shape_map(in[0], 1, 1, 4)};  // hash, compare, scale
    case OpKind::Cast: {
      check_arity(in, 1, op, kname);
      const DType to = cast_dtype(a, op);
      WEFT_CHECK(is_floating(dt[0]),
                 "op '{}': cast converts floating tensors, got {} (integer inputs are "
                 "declared floating point where they are only converted)",
                 op, dtype_name(dt[0]));
      return {{in[0]}, {to}, same_shape_map(in[0], 1, 1, 1)};  // one conversion per element: memory-bound
    }
    case OpKind::Gather: return routing::gather_rule(a, in, dt, op);
    case OpKind::ScatterAdd: return routing::scatter_add_rule(a, in, dt, op);
    case OpKind::TopK: return routing::topk_rule(a, in, dt, op);
    case OpKind::Attention:
    case OpKind::AttentionGrad: return attention::rule(kind, a, in, dt, op);
    case OpKind::Reduce: {
      check_arity(in, 1, op, kname);
      WEFT_CHECK(!a.axes.empty(), "op '{}': reduce needs at least one axis", op);
      std::set<int> axes;
      for (int ax : a.axes)
        WEFT_CHECK(axes.insert(norm_axis(ax, static_cast<int>(in[0].size()), op)).second,
                   "op '{}': reduce axis {} given twice", op, ax);
      MapBuilder b;
      std::vector<DimFactors> di, dout;
      Shape out;
      ReduceKind rk = a.reduce == ReduceFn::Max ? ReduceKind::Max : ReduceKind::Sum;
      for (int d = 0; d < static_cast<int>(in[0].size()); ++d) {
        bool red = axes.count(d) > 0;
        int f = b.factor("d" + std::to_string(d), in[0][d],
                         red ? FactorKind::Reduction : FactorKind::Parallel, red ? rk : ReduceKind::None);
        di.push_back({f});
        if (!red) {
          dout.push_back({f});
          out.push_back(in[0][d]);
        }
      }
      b.input(di);
      b.output(dout);
      return {{out}, {dt[0]}, b.done_all(1)};
    }
    case OpKind::Softmax:
    case OpKind::SoftmaxGrad: {
      bool grad = kind == OpKind::SoftmaxGrad;
      check_arity(in, grad ? 2 : 1, op, kname);
      WEFT_CHECK(a.axes.size() == 1, "op '{}': softmax needs exactly one axis", op);
      if (grad) WEFT_CHECK(in[0] == in[1], "op '{}': y {} and dy {} differ", op, in[0], in[1]);
      int ax = norm_axis(a.axes[0], static_cast<int>(in[0].size()), op);
      return {{in[0]}, {dt[0]}, same_shape_map(in[0], grad ? 2 : 1, 1, grad ? 4 : 5, {ax})};
    }
    case OpKind::LayerNorm:
    case OpKind::LayerNormGrad: {
      check_arity(in, 3, op, kname);
      const Shape& x = in[0];
      WEFT_CHECK(!x.empty(), "op '{}': layer norm of a scalar", op);
      WEFT_CHECK(a.scalar >= 0, "op '{}': layer norm eps must be >= 0, got {}", op, a.scalar);
      const Shape h{x.back()};
      WEFT_CHECK(in[1] == h, "op '{}': gamma shape {} must be [{}]", op, in[1], x.back());
      if (kind == OpKind::LayerNorm)
        WEFT_CHECK(in[2] == h, "op '{}': beta shape {} must be [{}]", op, in[2], x.back());
      else
        WEFT_CHECK(in[2] == x, "op '{}': dy shape {} must equal x shape {}", op, in[2], x);
      MapBuilder b;
      std::vector<DimFactors> dx;
      for (std::size_t d = 0; d + 1 < x.size(); ++d) dx.push_back({b.factor("d" + std::to_string(d), x[d])});
      int fh = b.factor("h", x.back(), FactorKind::NeedReplication);
      dx.push_back({fh});
      b.input(dx);
      b.input({{fh}});
      b.input(kind == OpKind::LayerNorm ? std::vector<DimFactors>{{fh}} : dx);
      b.output(dx);
      return {{x}, {dt[0]}, b.done_all(kind == OpKind::LayerNorm ? 8 : 12)};
    }
    case OpKind::LayerNormParamGrad: {
      check_arity(in, 2, op, kname);
      const Shape& x = in[0];
      WEFT_CHECK(!x.empty() && in[1] == x, "op '{}': x {} and dy {} must match", op, x, in[1]);
      WEFT_CHECK(a.scalar >= 0, "op '{}': layer norm eps must be >= 0, got {}", op, a.scalar);
      MapBuilder b;
      std::vector<DimFactors> dx;
      for (std::size_t d = 0; d + 1 < x.size(); ++d)
        dx.push_back({b.factor("d" + std::to_string(d), x[d], FactorKind::Reduction, ReduceKind::Sum)});
      int fh = b.factor("h", x.back(), FactorKind::NeedReplication);
      dx.push_back({fh});
      b.input(dx);
      b.input(dx);
      b.output({{fh}});
      b.output({{fh}});
      return {{Shape{x.back()}, Shape{x.back()}}, {dt[0], dt[0]}, b.done_all(8)};
    }
    case OpKind::Embedding: {
      check_arity(in, 2, op, kname);
      check_rank(in[0], 2, op, "embedding table");
      WEFT_CHECK(is_int(dt[1]), "op '{}': embedding ids must be i32 or i64, got {}", op, dtype_name(dt[1]));
      MapBuilder b;
      int fv = b.factor("v", in[0][0], FactorKind::Reduction, ReduceKind::Sum);
      int fh = b.factor("h", in[0][1]);
      auto ids = b.fresh(in[1], "d", FactorKind::Parallel);
      b.input({{fv}, {fh}});
      b.input(ids);
      auto od = ids;
      od.push_back({fh});
      b.output(od);
      Shape out = in[1];
      out.push_back(in[0][1]);
      return {{out}, {dt[0]}, b.done(0, {})};  // a lookup: bytes, no arithmetic
    }
    case OpKind::EmbeddingGrad: {
      check_arity(in, 2, op, kname);
      WEFT_CHECK(a.ints.size() == 2 || a.ints.size() == 3,
                 "op '{}': embedding grad needs the table shape in ints (and optionally the padding row)",
                 op);
      WEFT_CHECK(is_int(dt[0]), "op '{}': embedding ids must be i32 or i64", op);
      Shape dyexp = in[0];
      dyexp.push_back(a.ints[1]);
      WEFT_CHECK(in[1] == dyexp, "op '{}': dy shape {} must be {}", op, in[1], dyexp);
      MapBuilder b;
      auto ids = b.fresh(in[0], "d", FactorKind::Reduction, ReduceKind::Sum);
      int fv = b.factor("v", a.ints[0]);
      int fh = b.factor("h", a.ints[1]);
      b.input(ids);
      auto dy = ids;
      dy.push_back({fh});
      b.input(dy);
      b.output({{fv}, {fh}});
      return {{Shape{a.ints[0], a.ints[1]}}, {dt[1]}, b.done(1, flatten(dy))};
    }
    case OpKind::CrossEntropy:
    case OpKind::CrossEntropyGrad: {
      bool grad = kind == OpKind::CrossEntropyGrad;
      const std::size_t plain = grad ? 3 : 2;  // operands without class weights
      WEFT_CHECK(in.size() == plain || in.size() == plain + 1,
                 "op '{}' ({}): expected {} operands (or {} with class weights), got {}", op, kname, plain,
                 plain + 1, in.size());
      Op probe;
      probe.name = std::string(op);
      probe.attrs = a;
      (void)cross_entropy_attrs(probe);  // the attributes are well formed
      const Shape& lg = in[0];
      WEFT_CHECK(!lg.empty(), "op '{}': logits must have a class dim", op);
      Shape lead(lg.begin(), lg.end() - 1);
      WEFT_CHECK(in[1] == lead, "op '{}': labels shape {} must be logits shape without the class dim {}", op,
                 in[1], lead);
      WEFT_CHECK(is_int(dt[1]), "op '{}': labels must be i32 or i64, got {}", op, dtype_name(dt[1]));
      if (grad) WEFT_CHECK(in[2].empty(), "op '{}': dloss must be a scalar, got {}", op, in[2]);
      MapBuilder b;
      const bool weighted = in.size() == plain + 1;
      if (weighted) {
        WEFT_CHECK(in[plain] == Shape{lg.back()},
                   "op '{}': class weights must have shape [{}] (the classes), got {}", op, lg.back(),
                   in[plain]);
        WEFT_CHECK(!is_int(dt[plain]), "op '{}': class weights must be floating point, got {}", op,
                   dtype_name(dt[plain]));
      }
      // Forward: every factor is reduced into the scalar mean loss (the class dim through a
      // max and a sum: a vocab-parallel loss exchanges per-token statistics only). Backward:
      // every factor is parallel in dlogits; sharding v needs the same small statistics. The
      // class weights share the class factor: a vocab-parallel loss holds its classes' weights.
      FactorKind k = grad ? FactorKind::Parallel : FactorKind::Reduction;
      ReduceKind r = grad ? ReduceKind::None : ReduceKind::Sum;
      std::vector<DimFactors> dl;
      for (std::size_t d = 0; d < lead.size(); ++d)
        dl.push_back({b.factor("d" + std::to_string(d), lead[d], k, r)});
      int fv = b.factor("v", lg.back(), k, r);
      auto dlog = dl;
      dlog.push_back({fv});
      b.input(dlog);
      b.input(dl);
      if (grad) {
        b.input({});
        b.output(dlog);
        if (weighted) b.input({{fv}});
        return {{lg}, {dt[0]}, b.done_all(5)};
      }
      b.output({});
      if (weighted) b.input({{fv}});
      // the loss in f32 (mixed precision's), in f64 for f64 logits
      return {{Shape{}}, {dt[0] == DType::F64 ? DType::F64 : DType::F32}, b.done_all(4)};
    }
    case OpKind::Transpose: {
      check_arity(in, 1, op, kname);
      const Shape& x = in[0];
      WEFT_CHECK(a.axes.size() == x.size(), "op '{}': permutation {} does not match rank {}", op, a.axes,
                 x.size());
      std::vector<int> p = a.axes;
      std::vector<int> sorted = p;
      std::sort(sorted.begin(), sorted.end());
      for (std::size_t i = 0; i < sorted.size(); ++i)
        WEFT_CHECK(sorted[i] == static_cast<int>(i), "op '{}': {} is not a permutation", op, a.axes);
      MapBuilder b;
      auto dx = b.fresh(x, "d", FactorKind::Parallel);
      std::vector<DimFactors> dout;
      Shape out;
      for (int i : p) {
        dout.push_back(dx[i]);
        out.push_back(x[i]);
      }
      b.input(dx);
      b.output(dout);
      return {{out}, {dt[0]}, b.done(0, {})};
    }
    case OpKind::Reshape: check_arity(in, 1, op, kname); return reshape_rule(a, in[0], dt[0], op);
    case OpKind::Concat: {
      WEFT_CHECK(!in.empty(), "op '{}': concat of nothing", op);
      WEFT_CHECK(a.axes.size() == 1, "op '{}': concat needs one axis", op);
      int r = static_cast<int>(in[0].size());
      int ax = norm_axis(a.axes[0], r, op);
      MapBuilder b;
      std::vector<DimFactors> shared(r);
      for (int d = 0; d < r; ++d)
        if (d != ax) shared[d] = {b.factor("d" + std::to_string(d), in[0][d])};
      std::int64_t total = 0;
      for (std::size_t i = 0; i < in.size(); ++i) {
        WEFT_CHECK(static_cast<int>(in[i].size()) == r, "op '{}': concat operand {} has rank {}, expected {}",
                   op, i, in[i].size(), r);
        for (int d = 0; d < r; ++d)
          WEFT_CHECK(d == ax || in[i][d] == in[0][d],
                     "op '{}': concat operand {} shape {} differs from {} off axis {}", op, i, in[i], in[0],
                     ax);
        WEFT_CHECK(dt[i] == dt[0], "op '{}': concat operands have different dtypes", op);
        auto di = shared;
        di[ax] = {b.factor("c" + std::to_string(i), in[i][ax], FactorKind::NeedReplication)};
        total += in[i][ax];
        b.input(di);
      }
      auto dout = shared;
      dout[ax] = {b.factor("c", total, FactorKind::NeedReplication)};
      b.output(dout);
      Shape out = in[0];
      out[ax] = total;
      return {{out}, {dt[0]}, b.done(0, {})};
    }
    case OpKind::Slice:
    case OpKind::Pad: {
      check_arity(in, 1, op, kname);
      bool pad = kind == OpKind::Pad;
      WEFT_CHECK(a.axes.size() == 1 && a.ints.size() == (pad ? 3u : 2u),
                 "op '{}': {} needs one axis and ints {{begin, end{}}}", op, kname, pad ? ", full size" : "");
      int ax = norm_axis(a.axes[0], static_cast<int>(in[0].size()), op);
      std::int64_t bgn = a.ints[0], end = a.ints[1];
      std::int64_t full = pad ? a.ints[2] : in[0][ax];
      WEFT_CHECK(0 <= bgn && bgn < end && end <= full, "op '{}': range [{}, {}) invalid for size {}", op, bgn,
                 end, full);
      if (pad) WEFT_CHECK(in[0][ax] == end - bgn, "op '{}': pad input size {} != end - begin", op, in[0][ax]);
      MapBuilder b;
      std::vector<DimFactors> di, dout;
      Shape out = in[0];
      out[ax] = pad ? full : end - bgn;
      for (int d = 0; d < static_cast<int>(in[0].size()); ++d) {
        if (d == ax) {
          di.push_back({b.factor("a_in", in[0][d], FactorKind::NeedReplication)});
          dout.push_back({b.factor("a_out", out[d], FactorKind::NeedReplication)});
        } else {
          int f = b.factor("d" + std::to_string(d), in[0][d]);
          di.push_back({f});
          dout.push_back({f});
        }
      }
      b.input(di);
      b.output(dout);
      return {{out}, {dt[0]}, b.done(0, {})};
    }
    case OpKind::Conv2d:
    case OpKind::Conv2dGradInput:
    case OpKind::Conv2dGradWeight: {
      check_arity(in, 2, op, kname);
      check_rank(in[0], 4, op, "first operand");
      check_rank(in[1], 4, op, "second operand");
      WEFT_CHECK(a.ints.size() >= 2, "op '{}': conv needs ints {{stride, pad, ...}}", op);
      std::int64_t st = a.ints[0], pd = a.ints[1];
      std::int64_t n, c, H, W, o, r, t, P, Q;
      if (kind == OpKind::Conv2d) {
        n = in[0][0], c = in[0][1], H = in[0][2], W = in[0][3];
        o = in[1][0], r = in[1][2], t = in[1][3];
        WEFT_CHECK(in[1][1] == c, "op '{}': input channels {} != weight channels {}", op, c, in[1][1]);
        P = conv_out(H, r, st, pd, op), Q = conv_out(W, t, st, pd, op);
      } else if (kind == OpKind::Conv2dGradInput) {  // (dy[n,o,P,Q], w[o,c,r,t]) -> dx[n,c,H,W]
        WEFT_CHECK(a.ints.size() == 4, "op '{}': needs ints {{stride, pad, H, W}}", op);
        n = in[0][0], o = in[0][1], P = in[0][2], Q = in[0][3];
        c = in[1][1], r = in[1][2], t = in[1][3], H = a.ints[2], W = a.ints[3];
        WEFT_CHECK(in[1][0] == o, "op '{}': dy channels {} != weight outputs {}", op, o, in[1][0]);
        WEFT_CHECK(conv_out(H, r, st, pd, op) == P && conv_out(W, t, st, pd, op) == Q,
                   "op '{}': dy spatial {}x{} inconsistent with input {}x{}", op, P, Q, H, W);
      } else {  // (x[n,c,H,W], dy[n,o,P,Q]) -> dw[o,c,r,t]
        WEFT_CHECK(a.ints.size() == 4, "op '{}': needs ints {{stride, pad, r, t}}", op);
        n = in[0][0], c = in[0][1], H = in[0][2], W = in[0][3];
        o = in[1][1], P = in[1][2], Q = in[1][3], r = a.ints[2], t = a.ints[3];
        WEFT_CHECK(in[1][0] == n, "op '{}': batch {} != {}", op, n, in[1][0]);
        WEFT_CHECK(conv_out(H, r, st, pd, op) == P && conv_out(W, t, st, pd, op) == Q,
                   "op '{}': dy spatial {}x{} inconsistent with input {}x{}", op, P, Q, H, W);
      }
      MapBuilder b;
      bool fwd = kind == OpKind::Conv2d, gi = kind == OpKind::Conv2dGradInput,
           gw = kind == OpKind::Conv2dGradWeight;
      auto red = [&](bool reduced) { return reduced ? FactorKind::Reduction : FactorKind::Parallel; };
      auto rk = [&](bool reduced) { return reduced ? ReduceKind::Sum : ReduceKind::None; };
      int fn = b.factor("n", n, red(gw), rk(gw));
      int fo = b.factor("o", o, red(gi), rk(gi));
      int fc = b.factor("c", c, red(fwd), rk(fwd));
      int fr = b.factor("r", r, red(!gw), rk(!gw));
      int ft = b.factor("t", t, red(!gw), rk(!gw));
      int fH = b.factor("H", H, FactorKind::NeedReplication);
      int fW = b.factor("W", W, FactorKind::NeedReplication);
      int fP = b.factor("P", P, FactorKind::NeedReplication);
      int fQ = b.factor("Q", Q, FactorKind::NeedReplication);
      std::vector<DimFactors> X{{fn}, {fc}, {fH}, {fW}}, Wt{{fo}, {fc}, {fr}, {ft}},
          Y{{fn}, {fo}, {fP}, {fQ}};
      std::vector<int> work{fn, fo, fc, fr, ft, fP, fQ};
      if (fwd) {
        b.input(X), b.input(Wt), b.output(Y);
        return {{Shape{n, o, P, Q}}, {dt[0]}, b.done(2, work)};
      }
      if (gi) {
        b.input(Y), b.input(Wt), b.output(X);
        return {{Shape{n, c, H, W}}, {dt[0]}, b.done(2, work)};
      }
      b.input(X), b.input(Y), b.output(Wt);
      return {{Shape{o, c, r, t}}, {dt[0]}, b.done(2, work)};
    }
    case OpKind::Pool2d:
    case OpKind::Pool2dGrad: {
      bool grad = kind == OpKind::Pool2dGrad;
      check_arity(in, grad ? 3 : 1, op, kname);
      check_rank(in[0], 4, op, "input");
      WEFT_CHECK(a.ints.size() == 3, "op '{}': pool needs ints {{kernel, stride, pad}}", op);
      WEFT_CHECK(a.reduce != ReduceFn::Sum, "op '{}': pool reduce must be max or mean", op);
      std::int64_t k = a.ints[0];
      WEFT_CHECK(k >= 1, "op '{}': kernel must be >= 1", op);
      const Shape& x = in[0];
      Shape y{x[0], x[1], conv_out(x[2], k, a.ints[1], a.ints[2], op),
              conv_out(x[3], k, a.ints[1], a.ints[2], op)};
      if (grad) {
        WEFT_CHECK(in[1] == y && in[2] == y, "op '{}': y and dy must have shape {}", op, y);
      }
      MapBuilder b;
      int fn = b.factor("n", x[0]), fc = b.factor("c", x[1]);
      int fH = b.factor("H", x[2], FactorKind::NeedReplication),
          fW = b.factor("W", x[3], FactorKind::NeedReplication);
      int fP = b.factor("P", y[2], FactorKind::NeedReplication),
          fQ = b.factor("Q", y[3], FactorKind::NeedReplication);
      std::vector<DimFactors> X{{fn}, {fc}, {fH}, {fW}}, Y{{fn}, {fc}, {fP}, {fQ}};
      b.input(X);
      if (grad)
        b.input(Y), b.input(Y), b.output(X);
      else
        b.output(Y);
      return {{grad ? x : y}, {dt[0]}, b.done(static_cast<double>(k * k), {fn, fc, fP, fQ})};
    }
    case OpKind::Opaque: {
      WEFT_CHECK(a.scalar >= 0, "op '{}': opaque FLOPs must be >= 0", op);
      for (auto d : a.ints) WEFT_CHECK(d >= 1, "op '{}': opaque output shape {} invalid", op, a.ints);
      MapBuilder b;
      for (std::size_t i = 0; i < in.size(); ++i)
        b.input(b.fresh(in[i], "i" + std::to_string(i) + "_", FactorKind::NeedReplication));
      b.output(b.fresh(a.ints, "o", FactorKind::NeedReplication));
      return {{a.ints}, {in.empty() ? DType::F32 : dt[0]}, b.done(a.scalar, {})};
    }
    case OpKind::UnaryGrad:
      check_arity(in, 2, op, kname);
      WEFT_CHECK(in[0] == in[1], "op '{}': x {} and dy {} differ", op, in[0], in[1]);
      return {{in[0]}, {dt[1]}, same_shape_map(in[0], 2, 1, unary_flops(a.unary) + 1)};
    case OpKind::BroadcastTo: {
      check_arity(in, 1, op, kname);
      const Shape& out = a.ints;
      std::set<int> newdims;
      for (int ax : a.axes)
        WEFT_CHECK(newdims.insert(norm_axis(ax, static_cast<int>(out.size()), op)).second,
                   "op '{}': broadcast axis {} repeats", op, ax);
      WEFT_CHECK(in[0].size() + newdims.size() == out.size(),
                 "op '{}': broadcast of {} to {} inserting {} dims", op, in[0], out, newdims.size());
      MapBuilder b;
      std::vector<DimFactors> di, dout;
      std::size_t k = 0;
      for (int d = 0; d < static_cast<int>(out.size()); ++d) {
        int f = b.factor("d" + std::to_string(d), out[d]);
        dout.push_back({f});
        if (!newdims.count(d)) {
          WEFT_CHECK(in[0][k] == out[d] || in[0][k] == 1, "op '{}': cannot broadcast {} to {}", op, in[0],
                     out);
          di.push_back(in[0][k] == out[d] ? DimFactors{f} : DimFactors{});
          ++k;
        }
      }
      b.input(di);
      b.output(dout);
      return {{out}, {dt[0]}, b.done(0, {})};
    }
    case OpKind::SgdUpdate:
    case OpKind::AdamUpdate: {
      // (param, grad[, master], states...): one result per input but the gradient, elementwise,
      // so a sharded parameter's master copy and states shard with it (ZeRO-style).
      const bool adam = kind == OpKind::AdamUpdate;
      if (adam)
        WEFT_CHECK(a.scalars.size() == 5, "op '{}': adam needs scalars {{lr, beta1, beta2, eps, step}}", op);
      else
        WEFT_CHECK(a.scalars.size() == 1 || a.scalars.size() == 2,
                   "op '{}': sgd needs scalars {{lr}} or {{lr, momentum}}", op);
      const std::size_t states = adam ? 2 : a.scalars.size() - 1;
      WEFT_CHECK(in.size() == 2 + states || in.size() == 3 + states,
                 "op '{}' ({}): expected {} operand(s), or {} with a master copy, got {}", op, kname,
                 2 + states, 3 + states, in.size());
      for (std::size_t i = 1; i < in.size(); ++i)
        WEFT_CHECK(in[i] == in[0], "op '{}': operand {} shape {} differs from param {}", op, i, in[i], in[0]);
      const int n_out = static_cast<int>(in.size()) - 1;
      std::vector<DType> odt = {dt[0]};
      for (std::size_t i = 2; i < in.size(); ++i) odt.push_back(dt[i]);
      // FLOPs per element: sgd 2 (+2 momentum), adam 12; +1 for the cast of a master copy.
      const double fpp = (adam ? 12.0 : 2.0 + 2.0 * static_cast<double>(states)) +
                         (static_cast<std::size_t>(n_out) > 1 + states ? 1.0 : 0.0);
      return {std::vector<Shape>(static_cast<std::size_t>(n_out), in[0]), std::move(odt),
              same_shape_map(in[0], static_cast<int>(in.size()), n_out, fpp)};
    }
  }
  throw InternalError("op kind without a rule");
}

}  // namespace

}  // namespace weft::ir
