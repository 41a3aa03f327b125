#pragma once
// Reverse-mode autodiff over the IR: from a forward graph with a scalar loss, the training-step
// graph (forward + backward + optimizer update). Backward ops are themselves IR ops with index
// maps (the gradient of an einsum is an einsum, of a reduce a broadcast, ...), so the solvers
// search the whole training step. The rule of every kind is in docs/modules/ir.md.
#include <cstdint>

#include <utility>
#include <vector>

#include "weft/ir/graph.hpp"

namespace weft::ir {

enum class Optimizer : std::uint8_t { None, Sgd, Adam };

struct TrainOptions {
  Optimizer optimizer = Optimizer::Adam;
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  std::int64_t step = 1;  // Adam's bias-correction step (1 for the first update)
  double momentum = 0;    // SGD's heavy-ball momentum μ (0: plain SGD, no state)
  // Mixed precision: an f32 master copy of every f16/bf16 parameter, updated in f32 (the
  // parameter is its cast), with the optimizer states in f32 too. f32/f64 parameters are their
  // own master, so the flag changes nothing for them: "on" is the rule for half types, and only
  // turning it off (pure half-precision training, states in the parameter's dtype) differs.
  bool master_weights = true;
};

// Whether a parameter of dtype `dt` gets an f32 master copy under `options`.
bool uses_master_weights(const TrainOptions& options, DType dt);

// The master copy an update op (SgdUpdate / AdamUpdate) reads: its operand 2 when the op has the
// master form (see op.hpp), else -1 (also for any other op).
TensorId master_copy(const Op& op);

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
// - Optimizer::Sgd: one SgdUpdate per parameter, with an OptimizerState leaf "sgd_momentum:<p>"
//   when momentum > 0; Adam: one AdamUpdate per parameter with two OptimizerState leaves
//   "adam_m:<p>", "adam_v:<p>". With master weights (uses_master_weights) the update also reads
//   and writes an f32 OptimizerState leaf "master:<p>" (after the gradient, before the other
//   states) and every state is f32; otherwise the states have the parameter's dtype. All states
//   have grad_of = p. The updated parameter (Role::Parameter, with a producer) and states
//   (Role::OptimizerState) have grad_of = p and are graph outputs. Optimizer::None: the
//   parameters' gradients are the graph outputs. The loss is always an output. A parameter the
//   loss does not depend on gets no gradient and no update.
// Throws weft::Error when the forward graph has no scalar loss, or when the gradient must pass
// through an op that has no rule (Opaque, a backward kind), naming the op.
Graph build_training_graph(const Graph& forward, const TrainOptions& options = {});

// A leaf the training step carries to the next one: a Parameter or OptimizerState with no producer.
bool is_state_leaf(const TensorInfo& t);

// The results that replace state leaves next step, as (result, leaf): the k-th graph-output result
// of an op reading state leaves (an update op) replaces the k-th state leaf it reads, when their
// shapes agree (Adam (p, g[, master], m, v) -> (p'[, master'], m', v'); SGD (p, g[, master][, mom])
// -> (p'[, master'][, mom'])). The loop-carried tensors of a training graph, in op order.
std::vector<std::pair<TensorId, TensorId>> updated_states(const Graph& g);

// FLOPs of forward + backward (no optimizer) of a forward graph: what Megatron calls model FLOPs.
// Linear in the graph size (it builds the backward graph once).
double training_flops(const Graph& forward);

}  // namespace weft::ir
