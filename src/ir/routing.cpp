// The routing ops: Gather, ScatterAdd, TopK (see routing.hpp for why the routed axis is
// need-replication, and op.hpp / interpreter.hpp for their semantics).
#include "routing.hpp"

#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "weft/core/error.hpp"

namespace weft::ir::routing {
namespace {

bool is_int(DType t) { return t == DType::I32 || t == DType::I64; }

int routed_axis(const OpAttrs& a, std::size_t rank, std::string_view op, std::string_view kind) {
  WEFT_CHECK(a.axes.size() == 1, "op '{}': {} needs exactly one axis (attrs.axes), got {}", op, kind, a.axes);
  WEFT_CHECK(rank >= 1, "op '{}': {} of a scalar (it needs an axis)", op, kind);
  const int r = static_cast<int>(rank);
  const int ax = a.axes[0] < 0 ? a.axes[0] + r : a.axes[0];
  WEFT_CHECK(ax >= 0 && ax < r, "op '{}': axis {} out of range for rank {}", op, a.axes[0], r);
  return ax;
}

// The factors of a routed op: one parallel factor per dim off the axis (shared by every operand
// and result), and per axis size one need-replication factor.
struct RoutedMap {
  IndexMap map;
  std::vector<int> off;  // factor of each dim off the axis (-1 at the axis)

  RoutedMap(const Shape& s, int axis) : off(s.size(), -1) {
    for (std::size_t d = 0; d < s.size(); ++d)
      if (static_cast<int>(d) != axis) off[d] = add("d" + std::to_string(d), s[d], FactorKind::Parallel);
  }
  int add(std::string name, std::int64_t size, FactorKind kind) {
    map.factors.push_back(Factor{std::move(name), size, kind, ReduceKind::None});
    return static_cast<int>(map.factors.size()) - 1;
  }
  // The dims of a tensor of this op whose axis is factor `at`.
  std::vector<DimFactors> dims(int axis, int at) const {
    std::vector<DimFactors> d;
    for (std::size_t i = 0; i < off.size(); ++i) d.push_back({static_cast<int>(i) == axis ? at : off[i]});
    return d;
  }
};

// Equal off the axis (what a tile of each must share): weft::Error naming both shapes otherwise.
void check_off_axis(const Shape& a, const Shape& b, int axis, std::string_view op, std::string_view what_a,
                    std::string_view what_b) {
  WEFT_CHECK(a.size() == b.size(), "op '{}': {} {} and {} {} must have the same rank", op, what_a, a, what_b,
             b);
  for (std::size_t d = 0; d < a.size(); ++d)
    WEFT_CHECK(static_cast<int>(d) == axis || a[d] == b[d],
               "op '{}': {} {} and {} {} differ in dim {} (only the axis {} may differ)", op, what_a, a,
               what_b, b, d, axis);
}

// (outer, n, inner) around the axis: element (o, i, j) is at (o·n + i)·inner + j.
struct Around {
  std::int64_t outer = 1, n = 1, inner = 1;
  Around(const Shape& s, int axis) {
    for (int d = 0; d < static_cast<int>(s.size()); ++d) (d < axis ? outer : d == axis ? n : inner) *= s[d];
  }
  std::int64_t at(std::int64_t o, std::int64_t i, std::int64_t j) const { return (o * n + i) * inner + j; }
};

std::int64_t checked_index(double v, std::int64_t n, const Op& op) {
  const auto i = static_cast<std::int64_t>(v);
  WEFT_CHECK(static_cast<double>(i) == v && i >= 0 && i < n,
             "op '{}': index {} is not an integer in [0, {}) (the size of the {} axis)", op.name, v, n,
             op_kind_name(op.kind));
  return i;
}

}  // namespace

OpSignature gather_rule(const OpAttrs& a, const std::vector<Shape>& in, const std::vector<DType>& dt,
                        std::string_view op) {
  WEFT_CHECK(in.size() == 2, "op '{}' (gather): expected 2 operands (x, index), got {}", op, in.size());
  const int ax = routed_axis(a, in[0].size(), op, "gather");
  WEFT_CHECK(is_int(dt[1]), "op '{}': gather index must be i32 or i64, got {}", op, dtype_name(dt[1]));
  check_off_axis(in[0], in[1], ax, op, "x", "index");
  RoutedMap m(in[0], ax);
  const int fa = m.add("a", in[0][static_cast<std::size_t>(ax)], FactorKind::NeedReplication);
  // Splitting the index's positions along the axis splits the result with them (x whole): parallel.
  const int fk = m.add("k", in[1][static_cast<std::size_t>(ax)], FactorKind::Parallel);
  m.map.inputs = {m.dims(ax, fa), m.dims(ax, fk)};
  m.map.outputs = {m.dims(ax, fk)};
  return {{in[1]}, {dt[0]}, std::move(m.map)};  // a lookup: bytes, no arithmetic
}

OpSignature scatter_add_rule(const OpAttrs& a, const std::vector<Shape>& in, const std::vector<DType>& dt,
                             std::string_view op) {
  WEFT_CHECK(in.size() == 2 || in.size() == 3,
             "op '{}' (scatter_add): expected 3 operands (base, index, src) or 2 (index, src) with a zero "
             "base, got {}",
             op, in.size());
  const bool zero_base = in.size() == 2;
  const std::size_t ii = zero_base ? 0 : 1;  // the index operand
  const Shape &index = in[ii], &src = in[ii + 1];
  const int ax = routed_axis(a, index.size(), op, "scatter_add");
  WEFT_CHECK(is_int(dt[ii]), "op '{}': scatter_add index must be i32 or i64, got {}", op, dtype_name(dt[ii]));
  WEFT_CHECK(index == src, "op '{}': scatter_add index {} and src {} must have one shape", op, index, src);
  Shape out;
  if (zero_base) {
    WEFT_CHECK(a.ints.size() == 1 && a.ints[0] >= 1,
               "op '{}': scatter_add into a zero base needs attrs.ints = {{result axis size >= 1}}, got {}",
               op, a.ints);
    out = index;
    out[static_cast<std::size_t>(ax)] = a.ints[0];
  } else {
    WEFT_CHECK(a.ints.empty(), "op '{}': scatter_add with a base takes no ints (its shape is the base's)",
               op);
    WEFT_CHECK(dt[0] == dt[2], "op '{}': scatter_add base and src dtypes differ ({} vs {})", op,
               dtype_name(dt[0]), dtype_name(dt[2]));
    check_off_axis(in[0], index, ax, op, "base", "index");
    out = in[0];
  }
  RoutedMap m(index, ax);
  // Both axes need replication: src positions split across devices would each add into the whole
  // base (a partial sum that counts the base once per device).
  const int fa = m.add("a", out[static_cast<std::size_t>(ax)], FactorKind::NeedReplication);
  const int fk = m.add("k", index[static_cast<std::size_t>(ax)], FactorKind::NeedReplication);
  if (!zero_base) m.map.inputs.push_back(m.dims(ax, fa));
  m.map.inputs.push_back(m.dims(ax, fk));
  m.map.inputs.push_back(m.dims(ax, fk));
  m.map.outputs = {m.dims(ax, fa)};
  m.map.flops_per_point = 1;  // one add per src element
  for (const auto& d : m.dims(ax, fk)) m.map.work_factors.push_back(d[0]);
  return {{out}, {dt[ii + 1]}, std::move(m.map)};
}

OpSignature topk_rule(const OpAttrs& a, const std::vector<Shape>& in, const std::vector<DType>& dt,
                      std::string_view op) {
  WEFT_CHECK(in.size() == 1, "op '{}' (topk): expected 1 operand, got {}", op, in.size());
  const int ax = routed_axis(a, in[0].size(), op, "topk");
  const std::int64_t n = in[0][static_cast<std::size_t>(ax)];
  WEFT_CHECK(a.ints.size() == 2,
             "op '{}': topk needs attrs.ints = {{k, largest (1) or smallest (0)}}, got {}", op, a.ints);
  const std::int64_t k = a.ints[0];
  WEFT_CHECK(k >= 1 && k <= n, "op '{}': topk k = {} is not in [1, {}] (the size of axis {})", op, k, n, ax);
  WEFT_CHECK(a.ints[1] == 0 || a.ints[1] == 1, "op '{}': topk's largest flag must be 0 or 1, got {}", op,
             a.ints[1]);
  Shape out = in[0];
  out[static_cast<std::size_t>(ax)] = k;
  RoutedMap m(in[0], ax);
  const int fn = m.add("n", n, FactorKind::NeedReplication);
  const int fk = m.add("k", k, FactorKind::NeedReplication);  // the k best need the whole axis
  m.map.inputs = {m.dims(ax, fn)};
  m.map.outputs = {m.dims(ax, fk), m.dims(ax, fk)};
  // A selection: about log2(k) + 1 comparisons per element of x.
  m.map.flops_per_point = 1 + std::ceil(std::log2(static_cast<double>(k)));
  for (const auto& d : m.dims(ax, fn)) m.map.work_factors.push_back(d[0]);
  return {{out, out}, {dt[0], DType::I64}, std::move(m.map)};
}

HostTensor gather(const Op& op, const HostTensor& x, const HostTensor& index) {
  const int ax = routed_axis(op.attrs, x.shape.size(), op.name, "gather");
  const Around sx(x.shape, ax), si(index.shape, ax);
  HostTensor out{index.shape, std::vector<double>(index.data.size(), 0.0)};
  for (std::int64_t o = 0; o < si.outer; ++o)
    for (std::int64_t k = 0; k < si.n; ++k)
      for (std::int64_t j = 0; j < si.inner; ++j) {
        const std::int64_t p = si.at(o, k, j);
        out.data[p] = x.data[sx.at(o, checked_index(index.data[p], sx.n, op), j)];
      }
  return out;
}

HostTensor scatter_add(const Op& op, const HostTensor* base, const HostTensor& index, const HostTensor& src,
                       const Shape& out_shape) {
  const int ax = routed_axis(op.attrs, index.shape.size(), op.name, "scatter_add");
  HostTensor out;
  if (base) {
    out = *base;
  } else {  // gather's adjoint: a zero base of the result's shape
    std::int64_t n = 1;
    for (auto d : out_shape) n *= d;
    out = HostTensor{out_shape, std::vector<double>(static_cast<std::size_t>(n), 0.0)};
  }
  const Around so(out.shape, ax), si(index.shape, ax);
  // Row-major over src: a fixed order of the sums into one position.
  for (std::int64_t o = 0; o < si.outer; ++o)
    for (std::int64_t k = 0; k < si.n; ++k)
      for (std::int64_t j = 0; j < si.inner; ++j) {
        const std::int64_t p = si.at(o, k, j);
        out.data[so.at(o, checked_index(index.data[p], so.n, op), j)] += src.data[p];
      }
  return out;
}

std::vector<HostTensor> topk(const Op& op, const HostTensor& x) {
  const int ax = routed_axis(op.attrs, x.shape.size(), op.name, "topk");
  const std::int64_t k = op.attrs.ints[0];
  const bool largest = op.attrs.ints[1] != 0;
  Shape os = x.shape;
  os[static_cast<std::size_t>(ax)] = k;
  const Around sx(x.shape, ax), so(os, ax);
  HostTensor values{os, std::vector<double>(static_cast<std::size_t>(so.outer * k * so.inner), 0.0)};
  HostTensor indices = values;
  // torch's order: NaN counts as larger than every number; among equal values the lower index
  // first (a stable sort), so argmax is the first maximum, as torch documents.
  auto before = [&](double u, double v) {
    const bool nu = std::isnan(u), nv = std::isnan(v);
    if (nu || nv) return largest ? nu && !nv : nv && !nu;
    return largest ? u > v : u < v;
  };
  std::vector<std::int64_t> order(static_cast<std::size_t>(sx.n));
  for (std::int64_t o = 0; o < sx.outer; ++o)
    for (std::int64_t j = 0; j < sx.inner; ++j) {
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](std::int64_t p, std::int64_t q) {
        return before(x.data[sx.at(o, p, j)], x.data[sx.at(o, q, j)]);
      });
      for (std::int64_t i = 0; i < k; ++i) {
        values.data[so.at(o, i, j)] = x.data[sx.at(o, order[i], j)];
        indices.data[so.at(o, i, j)] = static_cast<double>(order[i]);
      }
    }
  return {values, indices};
}

}  // namespace weft::ir::routing
