#pragma once
// The op kernels: one function per op kind on f64 (semantics in interpreter.hpp), shared by the
// reference interpreter (whole tensors) and the program executor (exec::execute_program), which
// runs the same kernel on a device's local shards. A shard needs three things a whole tensor
// does not, and the KernelContext carries them: the local result shapes (from the result specs),
// the normalisers of the GLOBAL op (Reduce Mean's count, cross-entropy's token count N: a
// partial-sum strategy must divide by the global count, not the local one), and the global index
// of each local row of a vocabulary dim (vocab-parallel embedding = a masked lookup whose rows
// not held by the device contribute zero to a partial sum).
//
// Vocab-parallel cross-entropy is not one local kernel: its class dim needs per-token statistics
// over the whole vocabulary. It is split into the four ce_* steps below, with an all-reduce (max,
// then sum) of the statistics between them; the unsharded kernel is the same four steps with no
// exchange, so both paths share one implementation.
#include <cstdint>
#include <vector>

#include "weft/ir/graph.hpp"
#include "weft/ir/interpreter.hpp"

namespace weft::ir {

struct KernelContext {
  std::vector<Shape> out_shapes;  // local result shapes; empty = the graph's (whole tensors)
  double mean_count = 0;          // Reduce Mean: elements averaged (0 = the local count)
  double tokens = 0;              // CrossEntropy / CrossEntropyGrad: global token count N (0 = local)
  // CrossEntropy / CrossEntropyGrad (torch's mean, not token_mean): the step's weighted valid
  // fraction ρ = Σ w[y]·[y ≠ ignore_index] / (tokens) over EVERY label of the training step (all
  // micro-batches and replicas), so this op divides by tokens·ρ — its share of the step's weighted
  // count, which the lowering's 1/(micro-batches × replicas) scale (by samples) turns into the
  // whole step's. < 0: not given; whole tensors then divide by their own weighted count (the
  // interpreter), a batch-split tile is an error. exec::CeValidFractions computes it.
  double ce_valid_fraction = -1;
  // Global index of each local row of the vocabulary dim (Embedding's table dim 0, EmbeddingGrad's
  // result dim 0, the class dim of the cross-entropy steps); empty = 0..n-1 (whole tensor).
  std::vector<std::int64_t> vocab_index;
  std::int64_t vocab_size = 0;  // global vocabulary, for the id/label range check (0 = local)
  // The training step: AdamUpdate's bias correction (0 = attrs.scalars[4]) and Dropout's mask
  // (0 = step 1): an executor runs many steps, the interpreter one.
  double step = 0;
  // Dropout: the global index of each local position along every dim of the result (dim 0 already
  // offset by the samples of earlier micro-batches and replicas), and the shape whose row-major
  // flat index keys the mask (its dim 0 is not read). Empty = the whole tensor. A causal Attention
  // reads the global position of its local query rows from it (its result's dim rank − 2).
  std::vector<std::vector<std::int64_t>> element_index;
  Shape element_shape;
};

// Dropout's counter-based mask: 32-bit integer mixing (products stay below 2^59, so torch's int64
// reproduces it exactly), keep element `index` of step `step` iff the hash is >= p·2^32.
std::uint32_t dropout_hash(std::int64_t seed, std::int64_t step, std::int64_t index);
bool dropout_keep(std::int64_t seed, std::int64_t step, std::int64_t index, double p);

// Runs one op on its operand values. Throws weft::Error for an Opaque op or an id/label out of range.
std::vector<HostTensor> run_kernel(const Graph& g, const Op& op, const std::vector<const HostTensor*>& in,
                                   const KernelContext& ctx = {});

// Cross-entropy in steps, over logits [..., v_local] (tokens = Π leading dims; semantics in
// ir::CrossEntropyAttrs: ignored labels, class weights w, label smoothing ε, the normaliser D):
//   1. ce_row_max: per token, the max M over the local classes;            (all-reduce max)
//   2. ce_row_sum_target(M): per token over the local classes, ce_stat_width(op) statistics:
//      plain (no weights, ε = 0): [S = Σ exp(x − M), z = the label's logit where held, else 0];
//      otherwise [S, w_y·z, w_y, Σ_c w_c·x_c, Σ_c w_c] (w_y: the label's weight where held, else
//      0; w ≡ 1 without weights) — sums over the vocabulary;         (all-reduce sum)
//   3. ce_loss: (1/D)·Σ_counted tokens ((1 − ε)·w_y·(M + log S − z) + ε/C·(W·(M + log S) − Σ w x))
//      when `contribute`, else 0 (the other devices of a vocab group hold the same statistics; one
//      of them contributes to the partial sum);
//   4. ce_grad: dlogits = dloss/D · ((1 − ε)·w_y·(p − [class = label]) + ε/C·(W·p − w_c)) on the
//      local classes of counted tokens (p = exp(x − M)/S), 0 for ignored ones.
// D = tokens · ctx.ce_valid_fraction, or the tokens with token_mean; C = ctx.vocab_size.
// `weight`: the local classes' weights (null: none).
std::int64_t ce_stat_width(const Op& op);
HostTensor ce_row_max(const HostTensor& logits);
HostTensor ce_row_sum_target(const Op& op, const HostTensor& logits, const HostTensor& labels,
                             const HostTensor& row_max, const HostTensor* weight, const KernelContext& ctx);
HostTensor ce_loss(const Op& op, const HostTensor& labels, const HostTensor& row_max, const HostTensor& stats,
                   const KernelContext& ctx, bool contribute);
HostTensor ce_grad(const Op& op, const HostTensor& logits, const HostTensor& labels, const HostTensor& dloss,
                   const HostTensor* weight, const HostTensor& row_max, const HostTensor& stats,
                   const KernelContext& ctx);

}  // namespace weft::ir
