// Tests of the planner (plan::make_plan), the Plan value type and the Megatron-style baseline.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "weft/cluster/cluster.hpp"
#include "weft/core/error.hpp"
#include "weft/core/units.hpp"
#include "weft/ir/autodiff.hpp"
#include "weft/models/models.hpp"
#include "weft/plan/plan.hpp"
#include "weft/plan/planner.hpp"
#include "weft/plan/rebatch.hpp"
#include "weft/schedule/schedule.hpp"
#include "weft/sharding/sharding_spec.hpp"
#include "weft/sim/simulator.hpp"
#include "weft/spmd/strategy.hpp"

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
  for (const std::string sched : {"1f1b", "gpipe", "kfkb", "eager_1f1b", "zb_h1", "interleaved",
                                  "zb_interleaved", "zbv", "dualpipev", "kfkb_interleaved"}) {
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
    CHECK(m.find(format_bytes(missing) + " missing") != std::string::npos);
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
  const std::string expect = format_bytes(missing) + " missing";
  CHECK_THROWS_WITH_AS(plan::make_plan(g, mixed, o), doctest::Contains(expect.c_str()), Error);
  // Bad options.
  plan::PlanOptions bad;
  bad.schedule = "2f2b";
  CHECK_THROWS_WITH_AS(plan::make_plan(g, c, bad), doctest::Contains("unknown schedule"), Error);
  bad = {};
  bad.num_microbatches = 3;  // 8 is not divisible by 3
  CHECK_THROWS_WITH_AS(plan::make_plan(g, c, bad), doctest::Contains("divisible"), Error);
}

// What lowering reads from a plan: per stage, every op's SPMD layout on the stage's SPMD mesh
// (valid strategies of the per-micro-batch graph) and the specs of the leaves it reads.
static void check_layouts(const ir::Graph& step, const plan::Plan& p) {
  const ir::Graph g = plan::rebatch(step, p.microbatch_size);
  std::map<std::string, ir::OpId> op_id;
  for (ir::OpId o = 0; o < static_cast<ir::OpId>(g.ops().size()); ++o) op_id[g.op(o).name] = o;
  for (const auto& st : p.stages) {
    CAPTURE(st.index);
    std::vector<std::int64_t> mesh = st.mesh_shape;
    if (p.data_parallel > 1) mesh.erase(mesh.begin());
    // Every op of the stage, in order, exactly once, with a valid strategy.
    REQUIRE(st.op_layouts.size() == st.ops.size());
    std::set<std::string> stage_ops;
    for (std::size_t i = 0; i < st.ops.size(); ++i) {
      const auto& l = st.op_layouts[i];
      CHECK(l.op == st.ops[i]);
      stage_ops.insert(l.op);
      REQUIRE(l.factors.size() == mesh.size());
      REQUIRE(l.inner_strides.size() == mesh.size());
      std::vector<spmd::AxisAssign> axes;
      for (std::size_t a = 0; a < mesh.size(); ++a) axes.push_back({l.factors[a], l.inner_strides[a]});
      REQUIRE(op_id.count(l.op));
      const auto s = spmd::make_strategy(g, g.op(op_id.at(l.op)), mesh, axes);
      CHECK_MESSAGE(s.has_value(), l.op);
    }
    // The leaves: exactly those the stage's ops read, sorted by name, specs parse on the mesh.
    std::set<std::string> leaves;
    for (const auto& name : stage_ops)
      for (ir::TensorId t : g.op(op_id.at(name)).inputs)
        if (g.tensor(t).producer == ir::kNoOp) leaves.insert(g.tensor(t).name);
    std::vector<std::string> recorded;
    std::map<std::string, std::string> spec_of;
    for (const auto& l : st.leaf_specs) {
      recorded.push_back(l.tensor);
      spec_of[l.tensor] = l.spec;
      const auto t = g.find_tensor(l.tensor);
      REQUIRE(t.has_value());
      CHECK_NOTHROW((void)sharding::ShardingSpec::parse(l.spec, g.tensor(*t).shape, mesh));
    }
    CHECK(recorded == std::vector<std::string>(leaves.begin(), leaves.end()));
    // The parameters' specs are the leaves' (with the replica axis first when replicated).
    for (const auto& pr : st.params) {
      CAPTURE(pr.name);
      REQUIRE(spec_of.count(pr.name));
      CHECK(pr.spec == (p.data_parallel > 1 ? "R " : "") + spec_of.at(pr.name));
    }
  }
}

TEST_CASE("plan: stages record every op's SPMD layout and the leaves' specs for lowering") {
  const auto g = small_gpt(4, 64, 16);
  const auto c = one_node(4);
  plan::PlanOptions o;
  o.num_microbatches = 4;
  o.num_blocks = 4;
  o.compare_megatron = false;
  std::vector<plan::Plan> plans;
  plans.push_back(plan::make_plan(g, c, o));
  // Two stages of two devices; one stage on a 2x2 mesh holding both readers of the tied embedding
  // (the first and the last block).
  plans.push_back(plan::layout_plan(g, c, {{0, 1, {0, 1}, {1, 2}}, {2, 3, {2, 3}, {}}}, 4, o));
  plans.push_back(plan::layout_plan(g, c, {{0, 3, {0, 1, 2, 3}, {2, 2}}}, 2, o));
  // Replicated pipelines (the replica axis is not part of the SPMD mesh).
  plans.push_back(plan::megatron_plan(g, c, {2, 1, 2}, o));
  plans.push_back(plan::megatron_plan(g, c, {1, 2, 2}, o));
  // Mixed kinds: uneven data parallelism (one-device SPMD mesh) and an uneven split (the even
  // split's layouts).
  auto p100 = cluster::Cluster::preset("P100", 1).nodes()[0];
  p100.num_devices = 1;
  const auto mixed = cluster::Cluster::concat(one_node(1), cluster::Cluster({p100}));
  plans.push_back(plan::data_parallel_plan(g, mixed, {5, 3}, 2, o));
  plans.push_back(plan::split_plan(g, mixed, {0.6, 0.4}, 2, o));
  for (const auto& p : plans) {
    CAPTURE(p.to_string());
    check_layouts(g, p);
    const auto q = plan::Plan::from_json(p.to_json());
    CHECK(q == p);
    CHECK(q.to_json() == p.to_json());
  }
  CHECK(plans[3].data_parallel == 2);
  // Not all replicated: the 2x2 stage splits ops on both axes.
  std::set<std::size_t> split_axes;
  for (const auto& l : plans[2].stages[0].op_layouts)
    for (std::size_t a = 0; a < l.factors.size(); ++a)
      if (l.factors[a] >= 0) split_axes.insert(a);
  CHECK(split_axes.size() == 2);
  CHECK(plans[2].stages[0].mesh_shape == std::vector<std::int64_t>{2, 2});
  // The layouts are part of the value.
  auto changed = plans[2];
  changed.stages[0].op_layouts[0].factors[0] = 7;
  CHECK(changed != plans[2]);
  changed = plans[2];
  changed.stages[0].leaf_specs[0].spec += " ";
  CHECK(changed != plans[2]);
  // A plan written before the layouts existed still loads (empty), and bad layouts name the field.
  auto j = nlohmann::json::parse(plans[2].to_json());
  for (auto& st : j["stages"]) {
    st.erase("op_layouts");
    st.erase("leaf_specs");
  }
  const auto old = plan::Plan::from_json(j.dump());
  CHECK(old.stages[0].op_layouts.empty());
  CHECK(old.stages[0].leaf_specs.empty());
  auto expect = plans[2];
  expect.stages[0].op_layouts.clear();
  expect.stages[0].leaf_specs.clear();
  CHECK(old == expect);
  j = nlohmann::json::parse(plans[2].to_json());
  j["stages"][0]["op_layouts"][1]["factors"] = "x";
  CHECK_THROWS_WITH_AS(plan::Plan::from_json(j.dump()),
                       doctest::Contains("plan.stages[0].op_layouts[1].factors"), Error);
  j = nlohmann::json::parse(plans[2].to_json());
  j["stages"][0]["op_layouts"][0]["factors"] = {-1};  // one factor on a 2-axis mesh
  j["stages"][0]["op_layouts"][0]["inner_strides"] = {0};
  CHECK_THROWS_WITH_AS(plan::Plan::from_json(j.dump()), doctest::Contains("plan.stages[0].op_layouts[0]"),
                       Error);
  j = nlohmann::json::parse(plans[2].to_json());
  j["stages"][0]["leaf_specs"][0].erase("spec");
  CHECK_THROWS_WITH_AS(plan::Plan::from_json(j.dump()),
                       doctest::Contains("plan.stages[0].leaf_specs[0].spec"), Error);
  j = nlohmann::json::parse(plans[2].to_json());
  j["stages"][0]["leaf_specs"] = 3;
  CHECK_THROWS_WITH_AS(plan::Plan::from_json(j.dump()), doctest::Contains("plan.stages[0].leaf_specs"),
                       Error);
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
// the same cost model. It was accepted on the pure-f16 step (f16 Adam moments, no master copy:
// planner 0.6560 s, Megatron t=4 p=2 d=2 0.6603 s), which the planner's own search still wins. With
// the default f32 master weights and moments the updates move twice the bytes and the Megatron
// layout's grow least: its own search gives 0.6581 s against 0.6551 s (a gap left to the planner);
// make_plan with the Megatron candidates (compare_megatron, the default) returns no worse.
// Under the realistic efficiency model (GEMM-shape matmul efficiency, 85% of HBM, 2 us per kernel)
// the pure-f16 search gives 0.9057 s against Megatron's 0.9045 s (another gap left to the
// planner, reported in issue 17's note): the strict search-vs-Megatron check runs on the datasheet
// cost model it was accepted on, the default plan is checked on the realistic one.
TEST_CASE("plan: GPT-6.7B on 2 M8 nodes is no worse than the best Megatron-style layout") {
  if (std::getenv("WEFT_SANITIZED")) return;  // minutes under ASan; the Release run keeps it
  const auto fwd = models::gpt_preset("GPT-6.7B", 16, DType::F16);
  ir::TrainOptions pure;
  pure.master_weights = false;
  const auto g = ir::build_training_graph(fwd, pure);
  const auto c = cluster::Cluster::preset("M8", 2);
  const auto datasheet = c.datasheet();
  plan::PlanOptions o;
  o.num_blocks = 8;
  o.num_microbatches = 8;
  o.compare_megatron = false;
  // Also priced per reader, as accepted: with shared resharding both get cheaper and Megatron's
  // t=4 p=2 d=2 more (0.6598 -> 0.6360 s) than the search's 3-stage pipeline (0.6558 -> 0.6375 s),
  // which the default planner (Megatron layouts compared, below) then returns.
  o.shared_resharding = false;
  const auto p = plan::make_plan(g, datasheet, o);
  const auto m = plan::best_megatron_plan(g, datasheet, o);
  MESSAGE("planner ", p.to_string());
  MESSAGE("megatron ", m.to_string());
  CHECK(p.step_time <= m.step_time * (1 + 1e-9));
  CHECK(p.peak_memory <= p.memory_limit);
  o.shared_resharding = true;
  const auto shared = plan::make_plan(g, datasheet, o), ms = plan::best_megatron_plan(g, datasheet, o);
  MESSAGE("shared resharding: planner ", shared.to_string(), "; megatron ", ms.to_string());
  CHECK(shared.step_time <= p.step_time * (1 + 1e-9));
  CHECK(ms.step_time <= m.step_time * (1 + 1e-9));
  const auto mixed = ir::build_training_graph(fwd);
  const auto mm = plan::best_megatron_plan(mixed, c, o);
  o.compare_megatron = true;
  const auto mp = plan::make_plan(mixed, c, o);
  MESSAGE("mixed precision: planner ", mp.to_string(), "; megatron ", mm.to_string());
  CHECK(mp.step_time <= mm.step_time * (1 + 1e-9));
  CHECK(mp.peak_memory <= mp.memory_limit);
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

TEST_CASE("plan: the user's limits bound every candidate family, the Megatron baselines included") {
  // Issue 18: max_data_parallel=1 returned an 8-way data-parallel Megatron layout.
  const auto g = small_gpt(4, 64, 16);
  const auto c = one_node(8);
  // The number right after `key` ("dp=", "d=", "p=", "M=") at a word start, or before " stage";
  // -1 when absent.
  auto number_after = [](const std::string& text, const std::string& key) -> int {
    for (std::size_t at = text.find(key); at != std::string::npos; at = text.find(key, at + 1)) {
      if (at > 0 && std::isalnum(static_cast<unsigned char>(text[at - 1]))) continue;
      std::size_t k = at + key.size();
      if (k < text.size() && std::isdigit(static_cast<unsigned char>(text[k])))
        return std::stoi(text.substr(k));
    }
    return -1;
  };
  auto stages_in = [](const std::string& text) -> int {
    const std::size_t at = text.find(" stage");
    if (at == std::string::npos) return -1;
    std::size_t b = at;
    while (b > 0 && std::isdigit(static_cast<unsigned char>(text[b - 1]))) --b;
    return b < at ? std::stoi(text.substr(b, at - b)) : -1;
  };
  struct Limit {
    std::string name;
    std::function<void(plan::PlanOptions&)> set;
    std::function<bool(int dp, int stages, int M)> ok;
  };
  const std::vector<Limit> limits{
      {"max_data_parallel=1", [](plan::PlanOptions& o) { o.max_data_parallel = 1; },
       [](int dp, int, int) { return dp <= 1; }},
      {"max_data_parallel=2", [](plan::PlanOptions& o) { o.max_data_parallel = 2; },
       [](int dp, int, int) { return dp <= 2; }},
      {"pipeline=false", [](plan::PlanOptions& o) { o.pipeline = false; },
       [](int, int stages, int) { return stages <= 1; }},
      {"max_stages=2", [](plan::PlanOptions& o) { o.max_stages = 2; },
       [](int, int stages, int) { return stages <= 2; }},
      {"num_microbatches=2", [](plan::PlanOptions& o) { o.num_microbatches = 2; },
       [](int, int, int M) { return M == -1 || M == 2; }},
  };
  for (const auto& l : limits) {
    CAPTURE(l.name);
    plan::PlanOptions o;
    o.num_blocks = 4;
    o.max_alternatives = 1000;
    l.set(o);
    const auto p = plan::make_plan(g, c, o);
    CAPTURE(p.summary());
    CHECK(l.ok(p.data_parallel, p.num_stages(), p.num_microbatches));
    for (const auto& a : p.alternatives) {
      const std::string text = a.strategy + " " + a.layout;
      CAPTURE(text);
      int dp = number_after(text, "dp="), stages = stages_in(text);
      if (text.rfind("megatron", 0) == 0) dp = number_after(text, "d="), stages = number_after(text, "p=");
      CHECK(l.ok(dp < 0 ? 1 : dp, stages < 0 ? 1 : stages, number_after(text, "M=")));
    }
  }
}

TEST_CASE("plan: the alternatives list each layout once and the candidates that do not fit in one row") {
  // Issue 18: one row per distinct candidate; the infeasible ones summarised with their reasons.
  const auto g = small_gpt(4, 256, 16);
  const auto c = one_node(8);
  plan::PlanOptions o;
  o.num_blocks = 4;
  o.max_alternatives = 1000;
  o.memory_limit = plan::model_state_bytes(g) * 0.6;  // whole replicas of the model do not fit
  o.memory_fraction = 1.0;
  o.zero = 0;  // replicated states (ZeRO across replicas would make every candidate fit)
  const auto p = plan::make_plan(g, c, o);
  REQUIRE(!p.alternatives.empty());
  int infeasible_rows = 0;
  std::set<std::tuple<std::string, std::string, double>> rows;
  for (const auto& a : p.alternatives) {
    if (!a.feasible) {
      ++infeasible_rows;
      continue;
    }
    CHECK(rows.insert({a.strategy, a.layout, a.step_time}).second);
  }
  REQUIRE(infeasible_rows == 1);
  const auto& last = p.alternatives.back();
  CHECK(!last.feasible);
  CHECK(last.strategy == "infeasible");
  // "N candidates" and the counts per reason add up to N.
  const int n = std::stoi(last.layout);
  int sum = 0;  // "K x (e.g. ...)" per reason, "; " between them
  for (std::size_t at = last.note.find(" x (e.g. "); at != std::string::npos;
       at = last.note.find(" x (e.g. ", at + 1)) {
    std::size_t b = at;
    while (b > 0 && std::isdigit(static_cast<unsigned char>(last.note[b - 1]))) --b;
    if (b < at && (b == 0 || (b >= 2 && last.note.compare(b - 2, 2, "; ") == 0)))
      sum += std::stoi(last.note.substr(b, at - b));
  }
  CHECK(n > 0);
  CHECK(sum == n);
  MESSAGE(last.layout << ": " << last.note.substr(0, 300));
  // A limited list keeps the summary as its last row (a second whole plan: Release only, CI time).
  if (std::getenv("WEFT_SANITIZED")) return;
  o.max_alternatives = 3;
  const auto q = plan::make_plan(g, c, o);
  CHECK(q.alternatives.size() == 3);
  CHECK(!q.alternatives.back().feasible);
}

TEST_CASE("plan: usable memory = (capacity - reserve) x fraction") {
  const auto a100 = cluster::Cluster::preset("DGX-A100", 1).device(0).spec;
  const double GiB = 1024.0 * 1024 * 1024;
  REQUIRE(a100.memory_bytes == 80 * GiB);
  plan::PlanOptions o;  // defaults: 1 GiB reserve on a device's own memory, fraction 0.9
  CHECK(plan::memory_reserve_of(o, a100) == GiB);
  CHECK(plan::usable_memory(o, a100) == doctest::Approx(79 * GiB * 0.9).epsilon(1e-15));
  o.memory_limit = 16e9;  // a limit is the budget as given: no reserve by default
  CHECK(plan::memory_reserve_of(o, a100) == 0);
  CHECK(plan::usable_memory(o, a100) == doctest::Approx(16e9 * 0.9).epsilon(1e-15));
  o.memory_reserve = 2e9;
  o.memory_fraction = 0.8;
  CHECK(plan::usable_memory(o, a100) == doctest::Approx(14e9 * 0.8).epsilon(1e-15));
  const std::string text = plan::usable_memory_text(o, a100);
  CHECK(text.find("reserve") != std::string::npos);
  CHECK(text.find("memory_limit") != std::string::npos);
  // Devices under 8 GiB (toy and test devices) get no default reserve.
  cluster::DeviceSpec toy = a100;
  toy.memory_bytes = 4 * GiB;
  CHECK(plan::memory_reserve_of(plan::PlanOptions{}, toy) == 0);
  // A reserve that leaves nothing, or a negative one, is refused before any search.
  models::GptConfig small;
  small.layers = 1, small.hidden = 16, small.heads = 2, small.seq = 8, small.vocab = 32, small.batch = 2;
  const ir::Graph g = ir::build_training_graph(models::gpt(small));
  plan::PlanOptions bad;
  bad.memory_reserve = -3;
  CHECK_THROWS_WITH_AS(plan::make_plan(g, cluster::Cluster::preset("DGX-A100", 1), bad),
                       doctest::Contains("memory_reserve must be"), Error);
  bad.memory_reserve = 100 * GiB;
  CHECK_THROWS_WITH_AS(plan::make_plan(g, cluster::Cluster::preset("DGX-A100", 1), bad),
                       doctest::Contains("leaves nothing"), Error);
}
