#pragma once
// Spec propagation through a reshape (row-major, same element count) without communication.
// Math: the flat index F = Σ e_d P_d (P_d = product of the input dims after d). A shard digit
// (stride s, radix k) of input dim d is the digit of F at place value V = s·P_d with radix k
// (valid because s·k divides the dim). It is a digit of output dim j (place value Q_j, size b_j)
// iff Q_j | V and V·k | Q_j·b_j; the output stride is then V / Q_j. If some digit straddles two
// output dims (or the input is padded) no communication-free spec exists and `reason` says why.
// Replicate and Partial axes carry over unchanged.
#include <optional>
#include <string>
#include <vector>

#include "weft/sharding/sharding_spec.hpp"

namespace weft::sharding {

struct ReshapeResult {
  std::optional<ShardingSpec> spec;  // set when the reshape needs no communication
  std::string reason;                // why not, otherwise
  bool ok() const { return spec.has_value(); }
};

// Throws weft::Error when the element counts differ or a dim is < 1.
ReshapeResult propagate_reshape(const ShardingSpec& in, const std::vector<int64_t>& out_shape);

}  // namespace weft::sharding
