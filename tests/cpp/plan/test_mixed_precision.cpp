// Mixed-precision memory: the training step's static bytes (parameters + gradients + optimizer
// states) against hand counts from the GPT's closed-form parameter count (ZeRO's 16 bytes per
// parameter for mixed-precision Adam), their ZeRO-style sharding, and the planner refusing a
// model that only fitted under the old 8-byte count.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <string>

#include "weft/cluster/cluster.hpp"
#include "weft/core/error.hpp"
#include "weft/core/units.hpp"
#include "weft/ir/autodiff.hpp"
#include "weft/models/models.hpp"
#include "weft/plan/planner.hpp"
#include "weft/sharding/sharding_spec.hpp"

using namespace weft;

namespace {

models::GptConfig gpt_config(DType dt, std::int64_t layers = 1, std::int64_t batch = 2) {
  models::GptConfig c;
  c.layers = layers, c.hidden = 64, c.heads = 4, c.seq = 16, c.vocab = 128, c.batch = batch;
  c.dtype = dt;
  return c;
}

// GPT's closed form (src/models/transformers.cpp): L·(12h² + 13h) + V·h + S·h + 2h.
double gpt_params(const models::GptConfig& c) {
  const double h = static_cast<double>(c.hidden);
  return static_cast<double>(c.layers) * (12 * h * h + 13 * h) + static_cast<double>(c.vocab + c.seq) * h +
         2 * h;
}

ir::Graph step(DType dt, ir::Optimizer opt, bool master = true, double momentum = 0) {
  ir::TrainOptions o;
  o.optimizer = opt;
  o.master_weights = master;
  o.momentum = momentum;
  return ir::build_training_graph(models::gpt(gpt_config(dt)), o);
}

}  // namespace

TEST_CASE("mixed precision: static bytes per parameter of a GPT layer, by hand") {
  const double n = gpt_params(gpt_config(DType::F16));
  REQUIRE(static_cast<double>(models::gpt(gpt_config(DType::F16)).num_params()) == n);
  // Adam, f16 with f32 master weights (the default): param 2 + grad 4 (weft.Trainer keeps a master-
  // copied parameter's gradient in f32, as Megatron-LM's main_grad) + master 4 + m 4 + v 4.
  CHECK(plan::model_state_bytes(step(DType::F16, ir::Optimizer::Adam)) == 18 * n);
  CHECK(plan::model_state_bytes(step(DType::BF16, ir::Optimizer::Adam)) == 18 * n);
  // f32 Adam: param 4 + grad 4 + m 4 + v 4; the flag changes nothing for f32 parameters.
  CHECK(plan::model_state_bytes(step(DType::F32, ir::Optimizer::Adam)) == 16 * n);
  CHECK(step(DType::F32, ir::Optimizer::Adam, false) == step(DType::F32, ir::Optimizer::Adam, true));
  // Pure f16 Adam (master weights off): param, grad, m, v all 2 bytes, the old count.
  CHECK(plan::model_state_bytes(step(DType::F16, ir::Optimizer::Adam, false)) == 8 * n);
  // SGD without momentum: param + grad (2 × the parameter bytes), plus the f32 master copy.
  CHECK(plan::model_state_bytes(step(DType::F32, ir::Optimizer::Sgd)) == 2 * 4 * n);
  CHECK(plan::model_state_bytes(step(DType::F16, ir::Optimizer::Sgd, false)) == 2 * 2 * n);
  CHECK(plan::model_state_bytes(step(DType::F16, ir::Optimizer::Sgd)) == (2 + 4 + 4) * n);
  // With momentum: one more state, f32 under master weights.
  CHECK(plan::model_state_bytes(step(DType::F32, ir::Optimizer::Sgd, true, 0.9)) == 3 * 4 * n);
  CHECK(plan::model_state_bytes(step(DType::F16, ir::Optimizer::Sgd, false, 0.9)) == 3 * 2 * n);
  CHECK(plan::model_state_bytes(step(DType::F16, ir::Optimizer::Sgd, true, 0.9)) == (2 + 4 + 4 + 4) * n);
  // Per leaf: 3 bytes per byte of a master-copied f16 parameter (itself and its f32 gradient), 2 of
  // one without a master copy or in f32, 1 of an optimizer state, 0 of anything else.
  const auto g = step(DType::F16, ir::Optimizer::Adam);
  const auto f32 = step(DType::F32, ir::Optimizer::Adam);
  const auto pure = step(DType::F16, ir::Optimizer::Adam, false);
  for (const auto* graph : {&g, &f32, &pure})
    for (ir::TensorId t = 0; t < static_cast<ir::TensorId>(graph->tensors().size()); ++t) {
      const auto& info = graph->tensor(t);
      const double want = !ir::is_state_leaf(info)           ? 0.0
                          : info.role != ir::Role::Parameter ? 1.0
                          : graph == &g                      ? 3.0
                                                             : 2.0;
      CHECK(plan::state_bytes_factor(*graph, t) == want);
    }
  // No optimizer: gradients only, no states whatever the flag.
  CHECK(plan::model_state_bytes(step(DType::F16, ir::Optimizer::None)) == 2 * 2 * n);
}

TEST_CASE("mixed precision: the training graph's master copies, states and update ops") {
  const auto g = step(DType::F16, ir::Optimizer::Adam);
  g.validate();
  int updates = 0;
  for (const auto& op : g.ops()) {
    if (op.kind != ir::OpKind::AdamUpdate) continue;
    ++updates;
    const auto& p = g.tensor(op.inputs[0]);
    REQUIRE(op.inputs.size() == 5);
    REQUIRE(op.outputs.size() == 4);
    CHECK(ir::master_copy(op) == op.inputs[2]);
    CHECK(g.tensor(op.inputs[2]).name == "master:" + p.name);
    CHECK(g.tensor(op.inputs[3]).name == "adam_m:" + p.name);
    CHECK(g.tensor(op.inputs[4]).name == "adam_v:" + p.name);
    for (int k = 2; k < 5; ++k) {
      const auto& s = g.tensor(op.inputs[static_cast<std::size_t>(k)]);
      CHECK(s.dtype == DType::F32);
      CHECK(s.role == ir::Role::OptimizerState);
      CHECK(g.grad_of(op.inputs[static_cast<std::size_t>(k)]) == op.inputs[0]);
    }
    // p' in the parameter's dtype (the cast of master'), the states f32, all graph outputs.
    CHECK(g.tensor(op.outputs[0]).dtype == DType::F16);
    CHECK(g.tensor(op.outputs[0]).role == ir::Role::Parameter);
    for (int k = 1; k < 4; ++k) {
      CHECK(g.tensor(op.outputs[static_cast<std::size_t>(k)]).dtype == DType::F32);
      CHECK(g.tensor(op.outputs[static_cast<std::size_t>(k)]).role == ir::Role::OptimizerState);
    }
    // Elementwise: every operand and result indexed by the same factors (states shard with p).
    const auto& im = op.index_map;
    for (const auto& d : im.inputs) CHECK(d == im.inputs[0]);
    for (const auto& d : im.outputs) CHECK(d == im.inputs[0]);
  }
  CHECK(updates == 4 + 12 * 1);  // wte, wpe, ln_f γ β + 12 per layer (2 LN × 2, 4 linear × 2)
  // Without master weights: the old form, states in f16.
  const auto pure = step(DType::F16, ir::Optimizer::Adam, false);
  for (const auto& op : pure.ops())
    if (op.kind == ir::OpKind::AdamUpdate) {
      CHECK(op.inputs.size() == 4);
      CHECK(ir::master_copy(op) == -1);
      CHECK(pure.tensor(op.inputs[2]).dtype == DType::F16);
    }
  // SGD with momentum and master weights: (p, g, master, buf) -> (p', master', buf').
  const auto sgd = step(DType::BF16, ir::Optimizer::Sgd, true, 0.9);
  for (const auto& op : sgd.ops())
    if (op.kind == ir::OpKind::SgdUpdate) {
      REQUIRE(op.inputs.size() == 4);
      CHECK(op.outputs.size() == 3);
      CHECK(op.attrs.scalars.size() == 2);
      CHECK(ir::master_copy(op) == op.inputs[2]);
      CHECK(sgd.tensor(op.inputs[3]).name == "sgd_momentum:" + sgd.tensor(op.inputs[0]).name);
      CHECK(sgd.tensor(op.inputs[3]).dtype == DType::F32);
      CHECK(sgd.tensor(op.outputs[0]).dtype == DType::BF16);
    }
}

TEST_CASE("mixed precision: bad options and malformed update ops are errors") {
  const auto fwd = models::gpt(gpt_config(DType::F16));
  ir::TrainOptions o;
  o.optimizer = ir::Optimizer::Sgd;
  o.momentum = -0.5;
  CHECK_THROWS_WITH_AS(ir::build_training_graph(fwd, o), doctest::Contains("momentum must be >= 0"), Error);
  o.optimizer = ir::Optimizer::Adam;
  o.momentum = 0.9;
  CHECK_THROWS_WITH_AS(ir::build_training_graph(fwd, o), doctest::Contains("sgd option"), Error);
  // An update with a wrong number of operands names what it expects.
  ir::Graph g("u");
  auto p = g.parameter("p", {4}, DType::F16);
  auto d = g.input("d", {4}, DType::F16);
  ir::OpAttrs a;
  a.scalars = {0.1, 0.9, 0.99, 1e-8, 1};
  CHECK_THROWS_WITH_AS(g.add_op(ir::OpKind::AdamUpdate, {p, d, p}, a, "adam3"),
                       doctest::Contains("expected 4 operand(s), or 5 with a master copy, got 3"), Error);
  ir::OpAttrs s;
  s.scalars = {0.1, 0.9, 0.5};
  CHECK_THROWS_WITH_AS(g.add_op(ir::OpKind::SgdUpdate, {p, d}, s, "sgd3"),
                       doctest::Contains("sgd needs scalars {lr} or {lr, momentum}"), Error);
}

TEST_CASE("mixed precision: states sharded ZeRO-style over n devices take 1/n of the 16 bytes") {
  // Every static leaf (parameter, master copy, moments) and every parameter's gradient split on
  // dim 0 over a 1-D mesh of n: the tiles' bytes sum to 16·N/n on each device.
  const auto c = gpt_config(DType::F16);
  const auto g = step(DType::F16, ir::Optimizer::Adam);
  const double n_params = gpt_params(c);
  for (std::int64_t n : {2, 4, 8}) {
    CAPTURE(n);
    double per_device = 0;
    for (ir::TensorId t = 0; t < static_cast<ir::TensorId>(g.tensors().size()); ++t) {
      const auto& ti = g.tensor(t);
      if (ti.producer != ir::kNoOp || (ti.role != ir::Role::Parameter && ti.role != ir::Role::OptimizerState))
        continue;
      REQUIRE(ti.shape[0] % n == 0);
      const auto spec = sharding::ShardingSpec::parse("S(0)", ti.shape, {n});
      const double tile = static_cast<double>(spec.max_local_elements() * dtype_size(ti.dtype));
      per_device += ti.role == ir::Role::Parameter ? 2 * tile : tile;  // its gradient has its tile too
    }
    CHECK(per_device == 16 * n_params / static_cast<double>(n));
  }
}

TEST_CASE("mixed precision: a model that fitted under the 8-byte count is refused under the 16-byte one") {
  // One device whose memory is the peak of the pure-f16 plan (params, grads and f16 moments: 8
  // bytes per parameter, plus activations): that plan fits by construction; with f32 master weights
  // and moments the static bytes alone (16 per parameter) exceed it, and make_plan says so.
  auto c = cluster::Cluster::preset("M8", 1);
  auto node = c.nodes()[0];
  node.num_devices = 1;
  const cluster::Cluster one({node});
  const auto fwd = models::gpt(gpt_config(DType::F16, 2, 1));
  ir::TrainOptions pure;
  pure.master_weights = false;
  const auto old_step = ir::build_training_graph(fwd, pure);
  const auto new_step = ir::build_training_graph(fwd);
  plan::PlanOptions o;
  o.compare_megatron = false;
  o.memory_fraction = 1.0;
  const auto free_plan = plan::make_plan(old_step, one, o);
  o.memory_limit = free_plan.peak_memory;
  const double need = plan::model_state_bytes(new_step);
  REQUIRE(plan::model_state_bytes(old_step) < o.memory_limit);
  REQUIRE(need > o.memory_limit);  // activations < 8 bytes per parameter at this batch
  const auto fits = plan::make_plan(old_step, one, o);
  CHECK(fits.peak_memory <= o.memory_limit * (1 + 1e-9));
  try {
    (void)plan::make_plan(new_step, one, o);
    FAIL("expected weft::Error");
  } catch (const Error& e) {
    const std::string m = e.what();
    CHECK(m.find("cannot fit") != std::string::npos);
    CHECK(m.find("need " + format_bytes(need)) != std::string::npos);
  }
}
