#pragma once
// Reverse-mode autodiff over the IR: from a forward graph with a scalar loss, the training-step
// graph (forward + backward + optimizer update). Backward ops are themselves IR ops with index
// maps (the gradient of an einsum is an einsum, of a reduce a broadcast, ...), so the solvers
// search the whole training step. The rule of every kind is in docs/modules/ir.md.
#include <cstdint>

#include "weft/ir/graph.hpp"

namespace weft::ir {

enum class Optimizer : std::uint8_t { None, Sgd, Adam };

struct TrainOptions {
  Optimizer optimizer = Optimizer::Adam;
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  std::int64_t step = 1;  // Adam's bias-correction step (1 for the first update)
};

// The training step: a copy of the forward graph (same ids) followed by the backward ops and the
// optimizer ops.
// - Gradients flow from the loss (seed: a scalar Constant "d:<loss>" = 1.0, grad_of = loss) to
//   every tensor that depends on a Parameter; other tensors (inputs, ids, labels) get none.
// - Every tensor the backward pass makes has Role::Gradient (backward ops are named
//   "d:<forward op>/<what>"); the total gradient of a forward tensor t (the contributions of its
//   consumers summed with Binary Add ops named "d:<t>") has grad_of == t, so Graph::grad(t) finds
//   it, except where one tensor is the gradient of two (both operands of an Add share dy): the
//   first owner keeps it. Every Parameter gets its own gradient tensor (an Identity copy in that
//   case), so grad(p) always works for parameters.
// - Optimizer::Sgd: one SgdUpdate per parameter; Adam: one AdamUpdate per parameter with two
//   OptimizerState leaves "adam_m:<p>", "adam_v:<p>" (grad_of = p). The updated parameter
//   (Role::Parameter, with a producer) and states (Role::OptimizerState) have grad_of = p and are
//   graph outputs. Optimizer::None: the parameters' gradients are the graph outputs. The loss is
//   always an output. A parameter the loss does not depend on gets no gradient and no update.
// Throws weft::Error when the forward graph has no scalar loss, or when the gradient must pass
// through an op that has no rule (Opaque, a backward kind), naming the op.
Graph build_training_graph(const Graph& forward, const TrainOptions& options = {});

// FLOPs of forward + backward (no optimizer) of a forward graph: what Megatron calls model FLOPs.
// Linear in the graph size (it builds the backward graph once).
double training_flops(const Graph& forward);

}  // namespace weft::ir
