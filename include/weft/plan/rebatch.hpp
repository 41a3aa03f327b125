#pragma once
// The same (training) graph at another batch size: what a micro-batch, or one data-parallel
// replica's share of it, runs. The batch dimension is dim 0 of the graph's Input leaves (their
// common size B); every leaf of role Input / Activation / Gradient whose dim 0 is B gets the new
// size, every op's result shapes and index map are re-derived by its rule (ir::derive_signature),
// and the shape attributes that carry the batch (Reshape / BroadcastTo / Opaque targets whose dim 0
// follows an operand's dim 0, or a BroadcastTo that inserts dim 0 of size B) are scaled with it.
// Names, roles, ids, outputs, loss and grad_of are kept, so op and tensor ids of the two graphs
// correspond one to one.
#include <cstdint>

#include "weft/ir/graph.hpp"

namespace weft::plan {

// The batch B of a graph: dim 0 of its Input leaves of rank >= 1 (weft::Error when there is none
// or they disagree).
std::int64_t batch_size(const ir::Graph& g);

// weft::Error when new_batch < 1 or the result does not validate (a graph whose batch cannot be
// changed this way, e.g. a reshape that folds the batch into another dimension).
ir::Graph rebatch(const ir::Graph& g, std::int64_t new_batch);

}  // namespace weft::plan
