#pragma once
// The GEMM an op runs on one device, read off its index map, so the matmul efficiency can follow
// the shape (cluster/efficiency.hpp). Of the op's work factors (local sizes):
//   in the result and both operands   -> batch
//   in the result and operand 0 only  -> m (rows)
//   in the result and operand 1 only  -> n (columns)
//   in no result (contracted)         -> k
// A conv is the implicit GEMM this gives: m = batch × output pixels, n = output channels,
// k = input channels × kernel window. Ops that are not GEMMs (one operand, or nothing contracted)
// have no shape and run at the ceiling alone.
#include <optional>
#include <vector>

#include "weft/ir/op.hpp"

namespace weft::cost {

struct GemmShape {
  double batch = 1, m = 1, n = 1, k = 1;
  double parallel() const { return batch * m * n; }  // output elements per device
  bool operator==(const GemmShape&) const = default;
};

// local_factor_size[f] = the factor's size on this device (size / shards, or size × fraction).
std::optional<GemmShape> gemm_shape(const ir::Op& op, const std::vector<double>& local_factor_size);

}  // namespace weft::cost
