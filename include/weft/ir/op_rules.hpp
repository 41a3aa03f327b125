#pragma once
// One rule per op kind: from the kind, the attributes and the operand shapes, the result shapes
// and the index map. This is the only place that knows what a kind means dimension-wise; the
// solvers read index maps, never kinds.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "weft/ir/op.hpp"

namespace weft::ir {

using Shape = std::vector<std::int64_t>;

struct OpSignature {
  std::vector<Shape> output_shapes;
  std::vector<DType> output_dtypes;
  IndexMap index_map;
};

// Throws weft::Error naming the op and the problem (shape mismatch, bad attribute, ...).
OpSignature derive_signature(OpKind kind, const OpAttrs& attrs, const std::vector<Shape>& input_shapes,
                             const std::vector<DType>& input_dtypes, std::string_view op_name);

// An einsum equation "ab,bc->ac" split into its operand terms and its result term. Throws
// weft::Error (naming `op_name`) when there is no "->".
struct EinsumTerms {
  std::vector<std::string> inputs;
  std::string output;
};
EinsumTerms split_einsum(std::string_view equation, std::string_view op_name = "");

// The factor grouping of a row-major reshape: the common refinement of the two shapes, each
// input/output dim as a list of factor sizes (major to minor). Returns false when the shapes
// have no common refinement into a divisibility chain within a group (then the op's factors
// need replication).
bool reshape_factors(const Shape& in, const Shape& out, std::vector<std::vector<std::int64_t>>& in_dims,
                     std::vector<std::vector<std::int64_t>>& out_dims);

// A fused attention op (Attention, AttentionGrad) whose query sequence is split into `shards`
// tiles: the (query, key) pairs of its busiest tile over the even share (1 / shards of the
// pairs). `stride` is the split's (sharding::Placement's: runs of `stride` queries dealt to the
// tiles in turn); 0 = block (s / shards). 1 without a causal mask; with one a block split leaves
// the last tile's queries the most keys (2 − 1/n for n tiles of a square mask) — context
// parallelism's load imbalance — and a cyclic one (stride 1) evens it out (1 + (n − 1)/(s + 1)
// for a square mask). 1 for any other op or shards <= 1.
double attention_tile_imbalance(const Op& op, std::int64_t shards, std::int64_t stride = 0);

}  // namespace weft::ir
