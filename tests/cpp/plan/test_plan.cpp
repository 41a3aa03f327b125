// Tests of the planner (plan::make_plan), the Plan value type and the Megatron-style baseline.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <set>
#include <string>

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
  CHECK(p.num_microbatches == 4);
  CHECK(p.microbatch_size == 2);  // the graph is the global batch of 8
  CHECK(p.data_parallel == 1);
  CHECK(p.throughput == doctest::Approx(8 / p.step_time));
  CHECK(p.mfu > 0);
  CHECK(p.mfu < 1);
  // Every op of the training graph is in the stage.
  CHECK(st.ops.size() == g.ops().size());
  // Every parameter has a spec on the 1-device mesh.
  CHECK(st.params.size() ==
        static_cast<std::size_t>(std::count_if(g.tensors().begin(), g.tensors().end(), [](const auto& t) {
          return t.role == ir::Role::Parameter && t.producer == ir::kNoOp;
        })));
}

TEST_CASE("plan: the stored step time equals an independent re-simulation, JSON round trip is exact") {
  const auto g = small_gpt(4, 64, 16);
  const auto c = one_node(4);
  plan::PlanOptions o;
  o.num_microbatches = 4;
  o.num_blocks = 4;
  o.compare_megatron = false;
  const auto p = plan::make_plan(g, c, o);
  // Re-simulate from the stored numbers only (through JSON: nothing else survives).
  const auto q = plan::Plan::from_json(p.to_json());
  CHECK(q == p);
  CHECK(q.to_json() == p.to_json());
  const auto r = plan::resimulate(q);
  CHECK(r.step_time == doctest::Approx(p.step_time).epsilon(1e-12));
  // And by hand, with our own pipeline built from the stage table.
  sim::Pipeline pipe;
  for (const auto& st : q.stages) {
    sim::StageSpec ss;
    ss.forward_time = st.forward_time;
    ss.backward_time = st.backward_time;
    ss.optimizer_time = st.optimizer_time;
    ss.activation_bytes = 1;
    pipe.stages.push_back(ss);
  }
  for (double t : q.send_time) {
    sim::LinkSpec l;
    l.bandwidth = t > 0 ? 1.0 / t : 1e300;
    pipe.links.push_back(l);
  }
  const auto r2 = sim::simulate(schedule::one_f_one_b(q.num_stages(), q.num_microbatches), pipe);
  CHECK(r2.step_time == doctest::Approx(p.step_time).epsilon(1e-9));
  // Every op in exactly one stage; stages cover blocks 0..L-1 in order; devices disjoint.
  std::set<std::string> ops;
  std::set<int> devs;
  int next_block = 0;
  for (const auto& st : p.stages) {
    CHECK(st.first_block == next_block);
    next_block = st.last_block + 1;
    for (const auto& n : st.ops) CHECK(ops.insert(n).second);
    for (int d : st.devices) CHECK(devs.insert(d).second);
  }
  CHECK(next_block == p.num_blocks);
  CHECK(ops.size() == g.ops().size());
  CHECK(p.num_microbatches * p.microbatch_size * p.data_parallel == 16);
  // Peak memory is what the stages say.
  double peak = 0;
  for (const auto& st : p.stages) {
    CHECK(st.peak_memory ==
          doctest::Approx(st.static_memory + st.in_flight * st.activation_memory + st.transient_memory));
    peak = std::max(peak, st.peak_memory);
  }
  CHECK(p.peak_memory == peak);
  // Bad JSON: clear errors.
  CHECK_THROWS_WITH_AS(plan::Plan::from_json("{"), doctest::Contains("not valid JSON"), Error);
  std::string broken = p.to_json();
  broken.replace(broken.find("\"step_time\""), 11, "\"step_tim\"");
  CHECK_THROWS_WITH_AS(plan::Plan::from_json(broken), doctest::Contains("step_time"), Error);
  CHECK_THROWS_WITH_AS(plan::Plan::from_json("{\"format\": \"other\"}"), doctest::Contains("format"), Error);
}

TEST_CASE("plan: every schedule gives a plan whose stored numbers re-simulate to its step time") {
  const auto g = small_gpt(4, 64, 16);
  const auto c = one_node(2);
  for (const std::string sched : {"1f1b", "gpipe", "kfkb", "eager_1f1b", "zb_h1", "interleaved"}) {
    plan::PlanOptions o;
    o.schedule = sched;
    o.num_microbatches = 4;
    o.num_blocks = 4;
    o.compare_megatron = false;
    const plan::Planner planner(o);
    const auto p = planner.plan(g, c);
    CHECK(p.schedule == sched);
    CHECK(plan::resimulate(p).step_time == doctest::Approx(p.step_time).epsilon(1e-12));
    CHECK(plan::Plan::from_json(p.to_json()) == p);
    // GPipe keeps every micro-batch in flight: the first stage holds M activations.
    if (sched == "gpipe" && p.num_stages() > 1) CHECK(p.stages[0].in_flight == 4);
    if (sched == "1f1b") CHECK(p.stages[0].in_flight == std::min(4, p.num_stages()));
    // The split schedule uses W <= B.
    for (const auto& st : p.stages) CHECK(st.weight_time <= st.backward_time);
  }
}

TEST_CASE("plan: a model that cannot fit fails fast and says how much memory is missing") {
  const auto g = small_gpt(2, 64, 8);
  const auto c = one_node(2);
  plan::PlanOptions o;
  const double need = plan::model_state_bytes(g);
  o.memory_limit = need / 4;  // 2 devices x need/4 x 0.9: 0.45 of what the state needs
  o.memory_fraction = 0.9;
  const double missing = need - 2 * o.memory_limit * 0.9;
  try {
    (void)plan::make_plan(g, c, o);
    FAIL("expected weft::Error");
  } catch (const Error& e) {
    const std::string m = e.what();
    CHECK(m.find("cannot fit") != std::string::npos);
    CHECK(m.find("missing") != std::string::npos);
    CHECK(m.find(fmt::format("{:.4g} GB missing", missing / 1e9)) != std::string::npos);
  }
  // model_state_bytes by hand: Adam keeps param + grad + m + v = 4 x the parameter bytes.
  CHECK(need == doctest::Approx(4.0 * static_cast<double>(ir::build_training_graph(models::gpt([] {
                                                            models::GptConfig c;
                                                            c.name = "gpt-small";
                                                            c.layers = 2;
                                                            c.hidden = 64;
                                                            c.heads = 4;
                                                            c.seq = 32;
                                                            c.vocab = 256;
                                                            c.batch = 8;
                                                            return c;
                                                          }()))
                                                              .param_bytes())));
  // Heterogeneous clusters: the total is summed over every device's own memory.
  auto p100 = cluster::Cluster::preset("P100", 1).nodes()[0];
  p100.num_devices = 1;
  const auto mixed = cluster::Cluster::concat(one_node(1), cluster::Cluster({p100}));
  const std::string expect = fmt::format("{:.4g} GB missing", missing / 1e9);
  CHECK_THROWS_WITH_AS(plan::make_plan(g, mixed, o), doctest::Contains(expect.c_str()), Error);
  // Bad options.
  plan::PlanOptions bad;
  bad.schedule = "2f2b";
  CHECK_THROWS_WITH_AS(plan::make_plan(g, c, bad), doctest::Contains("unknown schedule"), Error);
  bad = {};
  bad.num_microbatches = 3;  // 8 is not divisible by 3
  CHECK_THROWS_WITH_AS(plan::make_plan(g, c, bad), doctest::Contains("divisible"), Error);
}

TEST_CASE("plan: a stage pays the resharding between its blocks (finer blocks never look cheaper)") {
  // One stage of a 2-layer GPT on 2 GPUs, cut into 1, 2, 4 or 8 blocks, each block searched alone
  // (O3, exact). Any combination of per-block strategies is a strategy of the whole stage, so with
  // the tensors passed between blocks priced (the producer's layout to the consumer's, partial
  // sums reduced) the stage is never cheaper than the exact search of the stage as one block.
  // Without that charge finer blocks looked cheaper than the optimum (measured on the same model
  // at seq 128: 8 blocks 12% below it).
  const auto g = small_gpt(2, 256, 8);
  const auto c = one_node(2);
  plan::PlanOptions o;
  o.spmd_level = plan::SpmdLevel::O3;
  o.spmd_relative_gap = 0;
  o.compare_megatron = false;
  double one = 0;
  for (int nb : {1, 2, 4, 8}) {
    o.num_blocks = nb;
    const plan::Plan p = plan::layout_plan(g, c, {{0, nb - 1, {0, 1}, {}}}, 1, o);
    REQUIRE(p.num_stages() == 1);
    const double fb = p.stages[0].forward_time + p.stages[0].backward_time;
    if (nb == 1) one = fb;
    MESSAGE(nb << " blocks: F + B = " << fb * 1e3 << " ms");
    CHECK(fb >= one * (1 - 1e-9));
  }
}

TEST_CASE("plan: Megatron layouts enumerate t | GPUs per node, t·p·d = devices") {
  const auto c = cluster::Cluster::preset("M8", 2);
  const auto ls = plan::megatron_layouts(c);
  // t in {1,2,4,8}; for each, p | 16/t: t=1: 5, t=2: 4, t=4: 3, t=8: 2 -> 14.
  CHECK(ls.size() == 14);
  for (const auto& l : ls) {
    CHECK(l.t * l.p * l.d == 16);
    CHECK(8 % l.t == 0);
  }
}

TEST_CASE("plan: on a small model the planner is no worse than every Megatron-style layout") {
  const auto g = small_gpt(4, 128, 16);
  const auto c = one_node(4);
  plan::PlanOptions o;
  o.num_blocks = 4;
  o.num_microbatches = 4;
  const auto best = plan::make_plan(g, c, o);
  o.compare_megatron = false;
  for (const auto& l : plan::megatron_layouts(c)) {
    try {
      const auto m = plan::megatron_plan(g, c, l, o);
      CHECK(best.step_time <= m.step_time * (1 + 1e-9));
    } catch (const Error&) {
      // a layout that does not fit
    }
  }
}

// Issue 5 acceptance: GPT-6.7B on 16 V100 (2 M8 nodes), planner <= best Megatron-style layout under
// the same cost model.
TEST_CASE("plan: GPT-6.7B on 2 M8 nodes is no worse than the best Megatron-style layout") {
  if (std::getenv("WEFT_SANITIZED")) return;  // minutes under ASan; the Release run keeps it
  const auto g = ir::build_training_graph(models::gpt_preset("GPT-6.7B", 16, DType::F16));
  const auto c = cluster::Cluster::preset("M8", 2);
  plan::PlanOptions o;
  o.num_blocks = 8;
  o.num_microbatches = 8;
  o.compare_megatron = false;
  const auto p = plan::make_plan(g, c, o);
  const auto m = plan::best_megatron_plan(g, c, o);
  MESSAGE("planner ", p.to_string());
  MESSAGE("megatron ", m.to_string());
  CHECK(p.step_time <= m.step_time * (1 + 1e-9));
  CHECK(p.peak_memory <= p.memory_limit);
}

// Progress to stderr every 5 % (the manual timing cases below).
static std::function<void(const plan::PlanProgress&)> print_progress() {
  return [last = -1.0](const plan::PlanProgress& p) mutable {
    if (p.fraction - last > 0.05 || p.phase == "done") {
      fmt::print(stderr, "[{:.0f}%] {}: {}\n", p.fraction * 100, p.phase, p.message);
      last = p.fraction;
    }
  };
}

// Heavy: run with --no-skip (used for timing during development and by nobody in CI).
TEST_CASE("plan: GPT-2.7B on 2 M8 nodes (manual)" * doctest::skip()) {
  const auto g = ir::build_training_graph(models::gpt_preset("GPT-2.7B", 16, DType::F16));
  const auto c = cluster::Cluster::preset("M8", 2);
  plan::PlanOptions o;
  o.progress = print_progress();
  const auto p = plan::make_plan(g, c, o);
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

TEST_CASE("plan: GPT-3 175B on 128 DGX-A100 nodes (manual, benchmark)" * doctest::skip()) {
  const auto g = ir::build_training_graph(models::gpt_preset("GPT-175B", 1536, DType::F16));
  const auto c = cluster::Cluster::preset("DGX-A100", 128);
  plan::PlanOptions o;
  o.num_blocks = 96;
  o.num_microbatches = 64;
  o.max_stages = 16;
  o.whole_nodes_only = true;
  o.power_of_two_nodes = true;
  o.compare_megatron = false;
  o.max_data_parallel = 8;
  o.max_simulated = 12;
  o.progress = print_progress();
  const auto p = plan::make_plan(g, c, o);
  fmt::print("{}\n", p.summary());
}
