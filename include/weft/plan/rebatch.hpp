#pragma once
// The same (training) graph at another batch size: what a micro-batch, or one data-parallel
// replica's share of it, runs. The batch dimension is dim 0 of the graph's Input leaves (their
// common size B). Where the batch lies in every other tensor is followed through the ops' index
// maps (batch_dims): a factor that holds the batch in one operand or result holds it in every
// place it appears, so the batch is found after reshapes that fold or split it ([B, N, 3h] ->
// [B·N, 3h], timm's [B, N, 3, h, d] permuted to [3, B, h, N, d]) and in broadcasts that create it
// (a class token expanded to [B, 1, d] and concatenated with the patches). Every tensor that holds
// the batch gets the new size in that dim; the shape attributes that carry it (Reshape /
// BroadcastTo / Opaque targets) are scaled with it; every op's result shapes and index map are
// re-derived by its rule (ir::derive_signature). Names, roles, ids, outputs, loss and grad_of are
// kept, so op and tensor ids of the two graphs correspond one to one.
#include <cstdint>
#include <string>
#include <vector>

#include "weft/ir/graph.hpp"

namespace weft::plan {

// The batch B of a graph: dim 0 of its Input leaves of rank >= 1 (weft::Error when there is none
// or they disagree).
std::int64_t batch_size(const ir::Graph& g);

// Where a tensor holds the batch: the dim, and the product of the sizes minor to the batch within
// that dim (1 when the dim is the batch alone, N for [B·N, h]). dim = -1: no batch (parameters,
// their gradients, the loss).
struct BatchDim {
  int dim = -1;
  std::int64_t inner = 1;
  bool operator==(const BatchDim&) const = default;
};

// The batch of every tensor of g (indexed by TensorId), followed from the Input leaves (and the
// Activation / Gradient leaves whose dim 0 is B, the boundary tensors of an extracted stage) through
// the index maps in both directions. weft::Error saying where, when the batch cannot be followed: it
// would have to live in a Parameter, Buffer or Constant leaf (a batch-sized constant: its values
// are per sample), it is split over two factors, or it reaches one tensor in two places.
std::vector<BatchDim> batch_dims(const ir::Graph& g);

// Why g cannot be run at new_batch (empty when it can): what rebatch would throw, without the
// "rebatch:" prefix. The planner asks this before it offers micro-batch sizes or replica shares.
std::string rebatch_obstacle(const ir::Graph& g, std::int64_t new_batch);

// weft::Error when new_batch < 1 or the graph cannot be rebatched (batch_dims fails, a Slice / Pad
// along the batch, a dropout whose batch is not its leading dim, or the result does not validate).
ir::Graph rebatch(const ir::Graph& g, std::int64_t new_batch);

}  // namespace weft::plan
