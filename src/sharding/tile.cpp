// Tile math. For one dim: the sharding axes are digits (s_i, k_i) of the padded index e in
// [0, N'); the device with coordinates c_i holds e iff floor(e/s_i) mod k_i == c_i for all i.
//   local(e):  remove the digits, majors first: e <- floor(e/(s_i k_i)) * s_i + (e mod s_i)
//   global(l): insert them, minors first:     l <- floor(l/s_i) * s_i k_i + c_i s_i + (l mod s_i)
// (removing a major digit leaves the place values of minor digits intact; inserting the minor
// ones first restores the global place values the majors are expressed in). Both maps are
// increasing, so padding (e >= N) is always at the end of a local buffer.
#include "weft/sharding/tile.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "weft/core/error.hpp"

namespace weft::sharding {
namespace {

struct D {
  int64_t s, k, c;
};

// Digits of `dim` for this device, major first (axes with k == 1 carry none).
std::vector<D> digits(const ShardingSpec& spec, const std::vector<int64_t>& coord, int dim) {
  WEFT_CHECK(static_cast<int>(coord.size()) == spec.mesh_ndim(),
             "mesh coordinate has {} entries for a {}-D mesh", coord.size(), spec.mesh_ndim());
  WEFT_CHECK(dim >= 0 && dim < spec.rank(), "dim {} out of range for a rank-{} tensor", dim, spec.rank());
  std::vector<D> r;
  for (int a : spec.axes_of_dim(dim)) {
    const int64_t k = spec.mesh_shape()[static_cast<std::size_t>(a)];
    if (k > 1) r.push_back({spec.placement(a).stride, k, coord[static_cast<std::size_t>(a)]});
  }
  return r;
}

void check_coord(const ShardingSpec& spec, const std::vector<int64_t>& coord) {
  WEFT_CHECK(static_cast<int>(coord.size()) == spec.mesh_ndim(),
             "mesh coordinate has {} entries for a {}-D mesh", coord.size(), spec.mesh_ndim());
  for (std::size_t a = 0; a < coord.size(); ++a)
    WEFT_CHECK(coord[a] >= 0 && coord[a] < spec.mesh_shape()[a],
               "mesh coordinate {} out of range on axis {} (size {})", coord[a], a, spec.mesh_shape()[a]);
}

int64_t to_global(const std::vector<D>& ds, int64_t l) {
  for (auto it = ds.rbegin(); it != ds.rend(); ++it)
    l = (l / it->s) * it->s * it->k + it->c * it->s + l % it->s;
  return l;
}

int64_t padded_local(const ShardingSpec& spec, int dim) {
  return spec.padded_size(dim) / spec.num_shards(dim);
}

int64_t exact_local(const ShardingSpec& spec, const std::vector<D>& ds, int dim) {
  const int64_t L = padded_local(spec, dim), n = spec.tensor_shape()[static_cast<std::size_t>(dim)];
  if (spec.padded_size(dim) == n) return L;
  // count of l in [0, L) with to_global(l) < n; to_global is increasing.
  int64_t lo = 0, hi = L;
  while (lo < hi) {
    int64_t mid = (lo + hi) / 2;
    if (to_global(ds, mid) < n)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

}  // namespace

std::vector<int64_t> Tile::local_shape() const {
  std::vector<int64_t> r;
  for (const auto& iv : dims) {
    int64_t n = 0;
    for (const auto& x : iv) n += x.size();
    r.push_back(n);
  }
  return r;
}

int64_t Tile::num_elements() const {
  int64_t n = 1;
  for (int64_t x : local_shape()) n *= x;
  return n;
}

std::vector<int64_t> Tile::indices(int dim) const {
  WEFT_CHECK(dim >= 0 && dim < static_cast<int>(dims.size()), "dim {} out of range", dim);
  std::vector<int64_t> r;
  for (const auto& x : dims[static_cast<std::size_t>(dim)])
    for (int64_t i = x.begin; i < x.end; ++i) r.push_back(i);
  return r;
}

std::string Tile::to_string() const {
  std::vector<std::string> d;
  for (const auto& iv : dims) {
    std::vector<std::string> p;
    for (const auto& x : iv) p.push_back(fmt::format("{}:{}", x.begin, x.end));
    d.push_back(fmt::format("{{{}}}", fmt::join(p, ",")));
  }
  std::string s = fmt::format("Tile[{}]", fmt::join(d, " x "));
  if (partial) s += fmt::format(" partial {}/{}", partial_index, partial_count);
  return s;
}

Tile tile_of(const ShardingSpec& spec, const std::vector<int64_t>& coord) {
  check_coord(spec, coord);
  Tile t;
  for (int d = 0; d < spec.rank(); ++d) {
    const int64_t n = spec.tensor_shape()[static_cast<std::size_t>(d)];
    auto ds = digits(spec, coord, d);
    std::vector<Interval> iv;
    if (ds.empty()) {
      iv.push_back({0, n});
    } else {
      const int64_t smin = ds.back().s, L = padded_local(spec, d);
      for (int64_t l = 0; l < L; l += smin) {  // local runs of smin are contiguous globally
        const int64_t g = to_global(ds, l);
        if (g >= n) break;
        const int64_t e = std::min(g + smin, n);
        if (!iv.empty() && iv.back().end == g)
          iv.back().end = e;
        else
          iv.push_back({g, e});
      }
    }
    t.dims.push_back(std::move(iv));
  }
  int64_t idx = 0, cnt = 1;
  for (int a : spec.partial_axes()) {
    idx = idx * spec.mesh_shape()[static_cast<std::size_t>(a)] + coord[static_cast<std::size_t>(a)];
    cnt *= spec.mesh_shape()[static_cast<std::size_t>(a)];
  }
  t.partial = spec.has_partial();
  t.partial_index = static_cast<int>(idx);
  t.partial_count = static_cast<int>(cnt);
  return t;
}

int64_t global_index(const ShardingSpec& spec, const std::vector<int64_t>& coord, int dim, int64_t local) {
  check_coord(spec, coord);
  auto ds = digits(spec, coord, dim);
  const int64_t n = exact_local(spec, ds, dim);
  WEFT_CHECK(local >= 0 && local < n, "local index {} out of range [0, {}) on dim {}", local, n, dim);
  return to_global(ds, local);
}

int64_t local_index(const ShardingSpec& spec, const std::vector<int64_t>& coord, int dim, int64_t g) {
  check_coord(spec, coord);
  auto ds = digits(spec, coord, dim);
  const int64_t n = spec.tensor_shape()[static_cast<std::size_t>(dim)];
  WEFT_CHECK(g >= 0 && g < n, "global index {} out of range [0, {}) on dim {}", g, n, dim);
  for (const D& x : ds)
    if ((g / x.s) % x.k != x.c) return -1;
  for (const D& x : ds) g = (g / (x.s * x.k)) * x.s + g % x.s;  // majors first
  return g;
}

std::vector<int64_t> owner_coords(const ShardingSpec& spec, int dim, int64_t g) {
  WEFT_CHECK(dim >= 0 && dim < spec.rank(), "dim {} out of range for a rank-{} tensor", dim, spec.rank());
  const int64_t n = spec.tensor_shape()[static_cast<std::size_t>(dim)];
  WEFT_CHECK(g >= 0 && g < n, "global index {} out of range [0, {}) on dim {}", g, n, dim);
  std::vector<int64_t> r(static_cast<std::size_t>(spec.mesh_ndim()), -1);
  for (int a : spec.axes_of_dim(dim)) {
    const int64_t k = spec.mesh_shape()[static_cast<std::size_t>(a)];
    r[static_cast<std::size_t>(a)] = k == 1 ? 0 : (g / spec.placement(a).stride) % k;
  }
  return r;
}

int64_t local_size(const ShardingSpec& spec, const std::vector<int64_t>& coord, int dim) {
  check_coord(spec, coord);
  return exact_local(spec, digits(spec, coord, dim), dim);
}

}  // namespace weft::sharding
