// Tests of the planner (plan::make_plan), the Plan value type and the Megatron-style baseline.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <string>

#include <fmt/format.h>

#include "weft/cluster/cluster.hpp"
#include "weft/core/error.hpp"
#include "weft/ir/autodiff.hpp"
#include "weft/models/models.hpp"
#include "weft/plan/plan.hpp"
#include "weft/plan/planner.hpp"
#include "weft/plan/rebatch.hpp"
#include "weft/schedule/schedule.hpp"
#include "weft/sim/simulator.hpp"

using namespace weft;

namespace {

ir::Graph small_gpt(std::int64_t layers = 4, std::int64_t hidden = 64, std::int64_t batch = 8) {
  models::GptConfig c;
  c.name = "gpt-small";
  c.layers = layers;
  c.hidden = hidden;
  c.heads = 4;
  c.seq = 32;
  c.vocab = 256;
  c.batch = batch;
  return ir::build_training_graph(models::gpt(c));
}

cluster::Cluster one_node(int gpus) {
  auto c = cluster::Cluster::preset("M8", 1);
  auto n = c.nodes()[0];
  n.num_devices = gpus;
  return cluster::Cluster({n});
}

}  // namespace

TEST_CASE("plan: a small model on one GPU is a 1-stage plan whose numbers add up") {
  const auto g = small_gpt(2);
  const auto c = one_node(1);
  plan::PlanOptions o;
  o.num_microbatches = 4;
  const auto p = plan::make_plan(g, c, o);
  CHECK(p.num_stages() == 1);
  CHECK(p.stages[0].devices == std::vector<int>{0});
  CHECK(p.cross_tensors.empty());
  const auto& st = p.stages[0];
  // 1 stage, 1F1B: the step is M·(F + B) + the update, exactly.
  const double expect = o.num_microbatches * (st.forward_time + st.backward_time) + st.optimizer_time;
  CHECK(p.step_time == doctest::Approx(expect).epsilon(1e-12));
  CHECK(p.throughput == doctest::Approx(o.num_microbatches * 8 / p.step_time));
  CHECK(p.mfu > 0);
  CHECK(p.mfu < 1);
  // Every op of the training graph is in the stage.
  CHECK(st.ops.size() == g.ops().size());
  // Every parameter has a spec on the 1-device mesh.
  CHECK(st.params.size() == static_cast<std::size_t>(std::count_if(g.tensors().begin(), g.tensors().end(), [](const auto& t) {
          return t.role == ir::Role::Parameter && t.producer == ir::kNoOp;
        })));
}

// Heavy: run with --no-skip (used for timing during development and by nobody in CI).
TEST_CASE("plan: GPT-2.7B on 2 M8 nodes (manual)" * doctest::skip()) {
  const auto g = ir::build_training_graph(models::gpt_preset("GPT-2.7B", 16, DType::F16));
  const auto c = cluster::Cluster::preset("M8", 2);
  plan::PlanOptions o;
  if (std::getenv("O3")) o.spmd_level = plan::SpmdLevel::O3;
  o.progress = [](const plan::PlanProgress& p) {
    static double last = -1;
    if (p.fraction - last > 0.05 || p.phase == "done") {
      fmt::print(stderr, "[{:.0f}%] {}: {}\n", p.fraction * 100, p.phase, p.message);
      last = p.fraction;
    }
  };
  const auto p = plan::make_plan(g, c, o);
  fmt::print("{}\n", p.summary());
}

TEST_CASE("plan: megatron GPT-6.7B (manual)" * doctest::skip()) {
  const auto g = ir::build_training_graph(models::gpt_preset("GPT-6.7B", 8, DType::F16));
  const auto c = cluster::Cluster::preset("M8", 2);
  plan::PlanOptions o;
  o.num_blocks = 8;
  const int t = std::atoi(std::getenv("MT") ? std::getenv("MT") : "4");
  const int pp = std::atoi(std::getenv("MP") ? std::getenv("MP") : "2");
  const auto p = plan::megatron_plan(g, c, {t, pp, 16 / (t * pp)}, o);
  fmt::print("{}\n", p.summary());
}

TEST_CASE("plan: rebatch equals building the model at the smaller batch") {
  models::GptConfig c;
  c.layers = 2;
  c.hidden = 32;
  c.heads = 4;
  c.seq = 16;
  c.vocab = 64;
  c.batch = 8;
  const auto big = ir::build_training_graph(models::gpt(c));
  c.batch = 2;
  const auto small = ir::build_training_graph(models::gpt(c));
  CHECK(plan::batch_size(big) == 8);
  const auto re = plan::rebatch(big, 2);
  CHECK(re == small);
  CHECK(plan::rebatch(big, 8) == big);
  CHECK_THROWS_AS(plan::rebatch(big, 0), Error);
  // MoE (dispatch masks are inputs with the batch first) and a CNN too.
  models::MoeConfig m;
  m.layers = 2;
  m.hidden = 32;
  m.heads = 4;
  m.seq = 16;
  m.vocab = 64;
  m.experts = 8;  // != the batch: a BroadcastTo that inserts a dim of size B is read as the batch
  m.batch = 4;
  const auto mbig = ir::build_training_graph(models::moe(m));
  // (batch 1 would differ legitimately: autodiff reduces a bias gradient only over dims whose sizes
  // differ, and a batch of 1 matches the bias' 1.)
  m.batch = 2;
  CHECK(plan::rebatch(mbig, 2) == ir::build_training_graph(models::moe(m)));

}
