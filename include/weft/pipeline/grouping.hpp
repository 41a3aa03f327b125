#pragma once
// Layer grouping (Alpa's layer clustering) of a training graph into pipeline-able blocks, and
// extraction of a set of ops as a standalone graph (a pipeline stage).
//
// The FORWARD ops are grouped into `num_blocks` contiguous runs of one topological order of the
// forward graph (no linear graph is required: a skip connection simply crosses several block
// boundaries). Every backward op and optimizer-update op is then attached to the forward op it
// belongs to (see owner_forward_op), so a block = its forward ops + their backward ops + the
// updates of the parameters its forward ops read first.
#include <cstdint>
#include <string>
#include <vector>

#include "weft/ir/graph.hpp"

namespace weft::pipeline {

// What an op of a training graph does. Backward = every op that (transitively) reads a tensor
// that has grad_of set (the dloss seed, gradients, optimizer states) and is not an update;
// Update = SgdUpdate / AdamUpdate; Forward = the rest.
enum class OpPhase : std::uint8_t { Forward, Backward, Update };
std::vector<OpPhase> classify_ops(const ir::Graph& training_graph);

// Per op: 1 for a backward Add of two same-shape gradient contributions whose result only feeds
// updates (or more such sums) — the gradient sum of a parameter used twice (a tied embedding).
// Linear up to the update, it may run once per step on contributions accumulated over the
// micro-batches: a contribution made on another pipeline stage then crosses once per step.
std::vector<char> gradient_sums_into_update(const ir::Graph& training_graph);

// For every op, the forward op whose block it joins (the op itself for a forward op), by the
// first rule that applies:
// - a backward op named "d:<forward op>/..." (autodiff's naming) -> that forward op (its input
//   gradients are computed with it even when one is the only contribution and so carries grad_of);
// - an op whose output has grad_of == t for a forward tensor t (a gradient sum "d:<t>", an
//   update's new parameter/state) -> t's producer, or for a parameter leaf its first forward
//   consumer (in topological order): updates live with the parameter;
// - any other backward op -> the owner of the first op that reads one of its outputs (the
//   gradient flows there), else the owner of the producer of one of its inputs.
// kNoOp only when the graph has no forward op.
std::vector<ir::OpId> owner_forward_op(const ir::Graph& training_graph);

struct Block {
  std::vector<ir::OpId> forward_ops;  // in the forward topological order (contiguous run of it)
  std::vector<ir::OpId> ops;          // all ops of the block (forward, backward, update), ascending id
  double forward_flops = 0;
  double backward_flops = 0;
  double update_flops = 0;
  std::int64_t param_bytes = 0;     // Parameter leaves owned by the block (first forward consumer)
  std::int64_t boundary_bytes = 0;  // forward activations made here and read by later blocks (each once)
  double compute_flops() const { return forward_flops + backward_flops; }
  bool operator==(const Block&) const = default;
  std::string to_string() const;  // one line
};

struct LayerGrouping {
  std::vector<Block> blocks;
  std::vector<int> block_of_op;         // per OpId; -1 for an op owned by no forward op
  std::vector<ir::OpId> forward_order;  // the forward topological order the blocks cut
  // Per boundary k (between blocks k and k+1): bytes of forward activations made before it and
  // read after it.
  std::vector<std::int64_t> crossing_bytes;
  double max_block_flops() const;  // max over blocks of compute_flops()
  // Σ over block boundaries of the bytes of forward activations that cross it (a tensor crossing
  // k boundaries counts k times: a linear pipeline relays it).
  std::int64_t cut_bytes() const;
  // Ops of blocks first..last (inclusive), ascending id. weft::Error on a bad range.
  std::vector<ir::OpId> ops_of_range(int first, int last) const;
  bool operator==(const LayerGrouping&) const = default;
  std::string to_string() const;  // one line per block
};

// Exact: minimises the max block compute (forward + backward FLOPs of the forward ops' owned ops),
// then, among the groupings reaching that max, the total boundary cut bytes. weft::Error when
// num_blocks < 1 or exceeds the number of forward ops, or when the graph has no forward op.
LayerGrouping group_layers(const ir::Graph& training_graph, int num_blocks);
// The same with cuts allowed only before the given positions of the forward order
// (LayerGrouping::forward_order; empty = anywhere): blocks made of whole runs between them.
// weft::Error on a position outside 1..n−1 or more blocks than runs.
LayerGrouping group_layers(const ir::Graph& training_graph, int num_blocks,
                           const std::vector<int>& cut_positions);

// The repeated layers of a model (transformer layers, residual blocks): the run of the forward
// order that repeats one pattern of ops back to back and covers the most forward ops. Ops are
// compared by kind, equation, elementwise / reduction kind and axes, and the shapes and dtypes of
// their operands and results, an operand told apart only as an activation (forward-made or an
// input) or a leaf of its role — not by names, seeds or scalars. The layers are cut where the
// fewest forward bytes cross inside the run (between transformer layers: the residual stream).
// count = 0 when nothing repeats (fewer than two copies).
struct RepeatedLayers {
  int count = 0;            // layers
  int period = 0;           // forward ops per layer
  std::vector<int> starts;  // per layer, the forward-order position of its first op
  int forward_ops = 0;      // of the whole graph (count · period of them are the layers')
};
RepeatedLayers repeated_layers(const ir::Graph& training_graph);
// One block per repeated layer: the ops before the first layer join it (an embedding), the ops
// after the last join the last (the final norm, the LM head and the loss).
LayerGrouping group_by_layers(const ir::Graph& training_graph, const RepeatedLayers& layers);

// A subset of a graph's ops as a graph of its own (op names and tensor names kept):
// - tensors read by the ops but produced by an op outside the set become leaves: an Activation
//   becomes an Input (validate() forbids an Activation leaf), a Gradient stays a Gradient, an
//   updated Parameter / OptimizerState keeps its role;
// - tensors produced inside and read outside, and the original outputs/loss made inside, are
//   outputs (the loss stays the loss);
// - grad_of is kept where both tensors are in the stage.
// The ops are kept in the original graph's topological order. weft::Error on an unknown or
// repeated op id, or an empty list.
struct StageGraph {
  ir::Graph graph;
  std::vector<ir::TensorId> original_tensor;  // per tensor of `graph`: its id in the source graph
  std::vector<ir::OpId> original_op;          // per op of `graph`: its id in the source graph
};
StageGraph extract_stage_mapped(const ir::Graph& graph, const std::vector<ir::OpId>& ops);
ir::Graph extract_stage(const ir::Graph& graph, const std::vector<ir::OpId>& ops);

// Structural identity of a (stage) graph, names ignored: op kinds, attributes, the wiring
// between ops (by position), and the shape, dtype and role of every tensor, in op order. Two
// graphs cut from identical layers of one model are equal, so a caller can solve one and reuse
// the result (e.g. the SPMD search per (block range, submesh) in Alpa's stage DP).
bool structurally_equal(const ir::Graph& a, const ir::Graph& b);
std::uint64_t structural_hash(const ir::Graph& graph);  // equal graphs -> equal hashes

}  // namespace weft::pipeline
