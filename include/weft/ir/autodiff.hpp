#pragma once
// Reverse-mode autodiff over the IR: from a forward graph with a scalar loss, the training-step
// graph (forward + backward + optimizer update). Backward ops are themselves IR ops with index
// maps (the gradient of an einsum is an einsum, of a reduce a broadcast, ...), so the solvers
// search the whole training step.
#include "weft/ir/graph.hpp"

namespace weft::ir {

enum class Optimizer : std::uint8_t { None, Sgd, Adam };

struct TrainOptions {
  Optimizer optimizer = Optimizer::Adam;
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
};

// The training step. Gradient tensors have Role::Gradient and grad_of() set; Adam's two state
// tensors per parameter have Role::OptimizerState; updated parameters are graph outputs.
// Throws weft::Error when the forward graph has no scalar loss.
Graph build_training_graph(const Graph& forward, const TrainOptions& options = {});

// FLOPs of forward + backward (no optimizer) of a forward graph: what Megatron calls model FLOPs.
double training_flops(const Graph& forward);

}  // namespace weft::ir
