#pragma once
// Private to src/ir: the fused attention ops (Attention, AttentionGrad), their rules and f64
// kernels in one place (attention.cpp); op_rules.cpp and kernels.cpp dispatch to them.
//
// The index map: leading dims (batch, heads) are parallel factors shared by every operand and
// result. The query sequence s is parallel in the forward (a query row needs all keys but no
// other query). The key/value sequence t needs replication: splitting it leaves partial softmax
// statistics, not partial sums (the log-sum-exp combine of context parallelism is not an op here).
// The head dims d (q·kᵀ's contracted dim, inside a nonlinearity) and e (v's, which the backward's
// rowsum(dout·out) contracts) need replication. In the backward the query sequence is a sum
// reduction that dq carries: split, dq is split by the queries and dk, dv are partial sums over the
// local queries (context parallelism as Llama 3 trains it: k and v gathered in the forward, their
// gradients reduce-scattered in the backward; a causal tile reads its rows' global positions).
//
// FLOPs are flash attention's: forward 2·(d + e) per unmasked (query, key) pair (q·kᵀ and P·v),
// backward 2·(3d + 2e) (q·kᵀ recomputed, dv = Pᵀ·dout, dP = dout·vᵀ, dq = dS·k, dk = dSᵀ·q): 4 and
// 10 per pair and head dim when d = e (the backward 2.5x). Causal counts the unmasked pairs only.
#include <cstdint>
#include <string_view>
#include <vector>

#include "weft/ir/host_tensor.hpp"
#include "weft/ir/kernels.hpp"
#include "weft/ir/op.hpp"
#include "weft/ir/op_rules.hpp"

namespace weft::ir::attention {

// Rule of Attention and AttentionGrad; weft::Error naming the op on a bad operand or attribute.
OpSignature rule(OpKind kind, const OpAttrs& a, const std::vector<Shape>& in, const std::vector<DType>& dt,
                 std::string_view op);

// (query, key) pairs a causal mask keeps for s queries and t keys (key j <= query i), or s·t.
double unmasked_pairs(std::int64_t s, std::int64_t t, bool causal);

// ir::attention_tile_imbalance (op_rules.hpp) of an Attention / AttentionGrad op.
double tile_imbalance(const Op& op, std::int64_t shards, std::int64_t stride);

// Kernels on f64 tiles. A causal forward whose query sequence is split reads the global position
// of each local query row from ctx.element_index[rank − 2] (the result's tile; empty = 0..s−1).
std::vector<HostTensor> forward(const Op& op, const HostTensor& q, const HostTensor& k, const HostTensor& v,
                                const KernelContext& ctx);
std::vector<HostTensor> backward(const Op& op, const std::vector<const HostTensor*>& in,
                                 const KernelContext& ctx);

}  // namespace weft::ir::attention
