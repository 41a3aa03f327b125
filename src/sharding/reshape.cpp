// Reshape propagation; the math is in reshape.hpp.
#include "weft/sharding/reshape.hpp"

#include <fmt/format.h>

#include "weft/core/error.hpp"

namespace weft::sharding {

ReshapeResult propagate_reshape(const ShardingSpec& in, const std::vector<int64_t>& out) {
  int64_t ni = 1, no = 1;
  for (int64_t x : in.tensor_shape()) ni *= x;
  for (int64_t x : out) {
    WEFT_CHECK(x >= 1, "reshape target dims must be >= 1 (got [{}])", fmt::join(out, ","));
    no *= x;
  }
  WEFT_CHECK(ni == no, "cannot reshape [{}] ({} elements) to [{}] ({} elements)",
             fmt::join(in.tensor_shape(), ","), ni, fmt::join(out, ","), no);
  ReshapeResult r;
  if (in.is_padded()) {
    r.reason = "the input spec is padded (uneven shards): padding is not preserved by a reshape";
    return r;
  }
  const int rank_in = in.rank(), rank_out = static_cast<int>(out.size());
  std::vector<int64_t> P(static_cast<std::size_t>(rank_in)), Q(static_cast<std::size_t>(rank_out));
  int64_t acc = 1;
  for (int d = rank_in - 1; d >= 0; --d) {
    P[static_cast<std::size_t>(d)] = acc;
    acc *= in.tensor_shape()[static_cast<std::size_t>(d)];
  }
  acc = 1;
  for (int j = rank_out - 1; j >= 0; --j) {
    Q[static_cast<std::size_t>(j)] = acc;
    acc *= out[static_cast<std::size_t>(j)];
  }
  std::vector<Placement> p = in.per_axis();
  for (int a = 0; a < in.mesh_ndim(); ++a) {
    Placement& x = p[static_cast<std::size_t>(a)];
    if (x.kind != Placement::Shard) continue;
    const int64_t k = in.mesh_shape()[static_cast<std::size_t>(a)];
    const int64_t V = x.stride * P[static_cast<std::size_t>(x.dim)];
    int target = -1;
    for (int j = 0; j < rank_out && target < 0; ++j) {
      const int64_t q = Q[static_cast<std::size_t>(j)], top = q * out[static_cast<std::size_t>(j)];
      if (k == 1 ? (V >= q && V < top) : (V % q == 0 && top % (V * k) == 0)) target = j;
    }
    if (target < 0 && k == 1) target = 0;
    if (target < 0) {
      r.reason = fmt::format(
          "mesh axis {} shards input dim {} with stride {} ({} shards): that digit (place value {} in the "
          "flat "
          "index) straddles output dims of [{}], so the reshape needs communication",
          a, x.dim, x.stride, k, V, fmt::join(out, ","));
      return r;
    }
    x.stride = k == 1 ? 1 : V / Q[static_cast<std::size_t>(target)];
    x.dim = target;
  }
  r.spec = ShardingSpec(out, in.mesh_shape(), std::move(p), in.allow_padding());
  return r;
}

}  // namespace weft::sharding
