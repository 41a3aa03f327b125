#pragma once
// Strategies of one op from its index map (no per-op-kind tables).
//
// A strategy assigns each mesh axis of size > 1 to at most one factor of the op's index map
// (or to none: replicated along that axis). NeedReplication factors are never assigned; a
// factor of size F split by axes of sizes k_1..k_j must have F divisible by Π k (no padding: an
// uneven split is not a strategy). Several axes on one factor nest in mesh-axis order (first
// axis major). From the assignment, for every operand and result:
//   - a factor assigned to axis a that appears in dim d at position i (major→minor) of the
//     tensor gives Shard(d, stride) on a with stride = (F / Π k_{≤a}) × M_i, M_i = Π sizes of
//     the factors minor to it in d (non-major positions are Rhino's strided shards);
//     an explicit inner stride σ (candidate generation) gives stride σ × M_i instead;
//   - a factor absent from the tensor: Replicate on a for operands and for results when the
//     factor is parallel, Partial(sum|max) on a for results when it is a reduction factor.
// The op's local work is FLOPs / Π shards of its work factors (cost::op_cost).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "weft/ir/graph.hpp"
#include "weft/sharding/sharding_spec.hpp"

namespace weft::spmd {

struct AxisAssign {
  int factor = -1;                // -1 = replicated along this mesh axis
  std::int64_t inner_stride = 0;  // 0 = default (maximum) stride inside the factor
  bool operator==(const AxisAssign&) const = default;
  auto operator<=>(const AxisAssign&) const = default;
};

struct OpStrategy {
  std::vector<AxisAssign> axes;                 // per mesh axis
  std::vector<sharding::ShardingSpec> inputs;   // required operand specs
  std::vector<sharding::ShardingSpec> outputs;  // produced result specs
  std::vector<std::int64_t> factor_shards;      // per factor: pieces it is cut into
  // per factor: the explicit inner stride of its split (AxisAssign::inner_stride), 0 = block
  std::vector<std::int64_t> factor_stride;
  // "b:x f:y" (factor names; strided ones as "f/4:y"), "R" when nothing is split.
  std::string describe(const ir::IndexMap& map, const std::vector<std::string>& axis_names) const;
  bool operator==(const OpStrategy& o) const { return axes == o.axes; }
};

// The strategy for one assignment, or nullopt when it is not valid (NeedReplication factor,
// indivisible size, a factor used twice in one tensor, an inner stride that does not fit).
std::optional<OpStrategy> make_strategy(const ir::Graph& g, const ir::Op& op,
                                        const std::vector<std::int64_t>& mesh,
                                        const std::vector<AxisAssign>& axes);

// Every valid default-stride assignment, deterministic order (all-replicated first); for a causal
// fused attention op also each one that splits the query sequence on one axis, again with the
// sequence split cyclically (inner stride 1): every tile then keeps about as many (query, key)
// pairs (ir::attention_tile_imbalance), where the block split leaves the last tile the most.
std::vector<OpStrategy> enumerate_strategies(const ir::Graph& g, const ir::Op& op,
                                             const std::vector<std::int64_t>& mesh);

// Variants of `base` whose produced result `out` (or required operand `in`, when is_output is
// false) equals `target` by changing inner strides only; nullopt when no such variant exists.
std::optional<OpStrategy> restride_to(const ir::Graph& g, const ir::Op& op,
                                      const std::vector<std::int64_t>& mesh, const OpStrategy& base,
                                      bool is_output, int index, const sharding::ShardingSpec& target);

}  // namespace weft::spmd
