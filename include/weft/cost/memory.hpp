#pragma once
// Liveness of tensors over a topological order of a (training) graph: the live sets whose
// per-device bytes bound the peak memory of one step.
//
// Position p = the p-th op of the order. A tensor produced at position p is live on [p, q] with q
// its last consumer's position (the end of the step for graph outputs and the loss; p itself when
// nothing reads it). A leaf (parameter, optimizer state, input, constant) is live from the start
// to its last consumer — updated parameters and states are then the update op's outputs, so an
// in-place update is counted once per tensor, not twice. Peak memory = max over positions of the
// bytes of the live set there.
#include <cstdint>
#include <vector>

#include "weft/ir/graph.hpp"

namespace weft::cost {

struct Liveness {
  std::vector<ir::OpId> order;  // topological order used
  std::vector<int> begin, end;  // per tensor: live interval in positions; begin = -1 if unused
  std::vector<std::vector<ir::TensorId>> sets;  // per position: tensors live there (ascending id);
                                                // empty until build_live_sets when not asked for
};

// with_sets = false leaves `sets` empty (the intervals are linear in the graph; the sets are
// quadratic in depth on a training graph): build_live_sets fills them when they are needed.
Liveness liveness(const ir::Graph& g, bool with_sets = true);
void build_live_sets(Liveness& l);

// Positions whose live set is not a subset of a neighbour's (the local maxima): bounding these
// bounds all positions. Ascending.
std::vector<int> maximal_positions(const Liveness& l);

// Σ bytes(t) over the live set of every position.
std::vector<double> live_bytes(const Liveness& l, const std::vector<double>& tensor_bytes);
// Peak of Σ bytes(t) over the live sets, with bytes given per tensor (e.g. local bytes under a
// plan). Returns {peak bytes, position}. Needs the intervals only (not the sets) when every
// size is a whole number of bytes.
std::pair<double, int> peak_memory(const Liveness& l, const std::vector<double>& tensor_bytes);

}  // namespace weft::cost
