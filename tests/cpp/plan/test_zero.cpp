// Sharded data parallelism across replicas (zero.hpp): ZeRO's closed forms for memory and traffic
// by hand (ZeRO paper, Figure 1 and §7), the planner's stage memory and times at each level against
// them and against the α-β collectives of the replicas' ring, the level the planner picks when
// memory forces one, and hybrid sharding on a cluster with a slow NIC.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <string>

#include "weft/cluster/alpha_beta.hpp"
#include "weft/cluster/cluster.hpp"
#include "weft/core/error.hpp"
#include "weft/ir/autodiff.hpp"
#include "weft/models/models.hpp"
#include "weft/pipeline/grouping.hpp"
#include "weft/plan/plan.hpp"
#include "weft/plan/planner.hpp"
#include "weft/plan/zero.hpp"
#include "weft/sim/simulator.hpp"

using namespace weft;

namespace {

models::GptConfig layer_config(std::int64_t batch = 16) {
  models::GptConfig c;
  c.layers = 2, c.hidden = 128, c.heads = 4, c.seq = 64, c.vocab = 256, c.batch = batch;
  c.dtype = DType::F16;
  return c;
}

// f16 Adam with f32 master weights: 2 + 2 + 12 bytes per parameter (K = 12 in ZeRO's notation).
ir::Graph fp16_adam_step(std::int64_t batch = 16) {
  return ir::build_training_graph(models::gpt(layer_config(batch)));
}

plan::PlanOptions exact_options(int zero) {
  plan::PlanOptions o;
  o.zero = zero;
  o.num_blocks = 1;  // one block: the stage's state is counted once (no parameter in two blocks)
  o.overlap_grad_sync = false;
  o.recompute = plan::Recompute::None;
  o.memory_fraction = 1.0;
  return o;
}

// One collective per parameter tensor of g: what the lowering issues with buckets of 1 byte, by
// hand from the graph's parameters.
double per_tensor(double (*f)(const cluster::AxisLink&, double), const cluster::AxisLink& l,
                  const ir::Graph& g) {
  double t = 0;
  for (const auto& info : g.tensors())
    if (info.role == ir::Role::Parameter && info.producer == ir::kNoOp)
      t += f(l, static_cast<double>(info.bytes()));
  return t;
}

}  // namespace

TEST_CASE("zero: memory per device of the four levels, ZeRO's Figure 1 by hand") {
  const double psi = 1e9, n = 64;  // ZeRO's example: 7.5B → here Ψ = 1e9 parameters, N_d = 64
  const double P = 2 * psi, O = 12 * psi;
  CHECK(plan::zero_memory(0, P, O, 64).state() == doctest::Approx(16 * psi));
  CHECK(plan::zero_memory(1, P, O, 64).state() == doctest::Approx(4 * psi + 12 * psi / n));
  CHECK(plan::zero_memory(2, P, O, 64).state() == doctest::Approx(2 * psi + 14 * psi / n));
  CHECK(plan::zero_memory(3, P, O, 64).state() == doctest::Approx(16 * psi / n));
  // Gradients held in f32 (4ψ: weft.Trainer's and Megatron-LM's mixed precision): 18ψ unsharded;
  // ZeRO-1 keeps them whole, ZeRO-2 shards them.
  CHECK(plan::zero_memory(0, P, O, 64, 0, 25e6, 4 * psi).state() == doctest::Approx(18 * psi));
  CHECK(plan::zero_memory(1, P, O, 64, 0, 25e6, 4 * psi).state() == doctest::Approx(6 * psi + 12 * psi / n));
  CHECK(plan::zero_memory(2, P, O, 64, 0, 25e6, 4 * psi).state() == doctest::Approx(2 * psi + 16 * psi / n));
  // Working sets: ZeRO-3 holds a block gathered, the next prefetched and its whole gradients.
  const auto z3 = plan::zero_memory(3, P, O, 64, 0.1 * P);
  CHECK(z3.working == doctest::Approx(3 * 0.1 * P * (1 - 1 / n)));
  CHECK(plan::zero_memory(2, P, O, 64, 0, 25e6).working == 25e6);
  CHECK(plan::zero_memory(1, P, O, 64).working == 0);
  CHECK(plan::zero_memory(3, P, O, 1).state() == doctest::Approx(16 * psi));  // one replica: nothing to shard
  CHECK_THROWS_AS(plan::zero_memory(4, P, O, 8), Error);
  CHECK(plan::parse_zero("auto") == -1);
  CHECK(plan::parse_zero("3") == 3);
  CHECK_THROWS_WITH_AS(plan::parse_zero("4"), doctest::Contains("auto, 0, 1, 2 or 3"), Error);
}

TEST_CASE("zero: bytes each device sends per step, ZeRO's §7 by hand") {
  const double P = 2e9;  // Ψ = 1e9 f16 parameters
  for (int n : {2, 8, 64}) {
    const double ring = (n - 1.0) / n;
    CAPTURE(n);
    CHECK(plan::zero_traffic(0, P, n).total(1) == doctest::Approx(2 * ring * P));  // all-reduce
    CHECK(plan::zero_traffic(1, P, n).total(1) ==
          doctest::Approx(2 * ring * P));  // reduce-scatter + all-gather
    CHECK(plan::zero_traffic(2, P, n).total(1) == doctest::Approx(2 * ring * P));
    CHECK(plan::zero_traffic(3, P, n).total(1) == doctest::Approx(3 * ring * P));  // 1.5 × data parallelism
    // Micro-batches: ZeRO-2 reduce-scatters every micro-batch's gradients, ZeRO-3 gathers every time.
    CHECK(plan::zero_traffic(2, P, n).total(4) == doctest::Approx(5 * ring * P));
    CHECK(plan::zero_traffic(3, P, n).total(4) == doctest::Approx(12 * ring * P));
    CHECK(plan::zero_traffic(0, P, n).total(4) == doctest::Approx(2 * ring * P));
  }
  // Hybrid: 4 groups of 8, the gradient shard all-reduced across the groups once per step.
  CHECK(plan::zero_traffic(3, P, 8, 4).per_step == doctest::Approx(2 * 0.75 * P / 8));
}

TEST_CASE("zero: the planner's stage at each level equals the closed forms and the ring's α-β, by hand") {
  const auto g = fp16_adam_step();
  const auto c = cluster::Cluster::preset("M8", 1);
  const double psi = static_cast<double>(models::gpt(layer_config()).num_params());
  // f16 parameters 2ψ, their gradients held in f32 (weft.Trainer's mixed precision) 4ψ, the f32
  // master copy and moments 12ψ.
  const double P = 2 * psi, G = 4 * psi, O = 12 * psi;
  const int n = 8;
  // t=1 p=1 d=8: each replica is one device, so the SPMD layout keeps every tensor whole.
  std::vector<plan::Plan> at;
  for (int level = 0; level <= 3; ++level) {
    auto o = exact_options(level);
    o.grad_bucket_bytes = 1;  // a bucket per tensor: each collective's latency counted per tensor
    at.push_back(plan::megatron_plan(g, c, {1, 1, n}, o));
    REQUIRE(at.back().stages.size() == 1);
    CHECK(at.back().stages[0].zero == level);
    CHECK(at.back().stages[0].zero_group == (level ? n : 1));
    CHECK(at.back().stages[0].static_memory ==
          doctest::Approx(plan::zero_memory(level, P, O, n, 0, 25e6, G).state()));
  }
  const auto& s0 = at[0].stages[0];
  const auto& s1 = at[1].stages[0];
  const auto& s2 = at[2].stages[0];
  const auto& s3 = at[3].stages[0];
  // The ring of the 8 replicas (one node): all-gather of the parameters, reduce-scatter of the
  // gradients, all-reduce = both.
  const auto link = cluster::axis_links(c, cluster::DeviceMesh::iota({n}))[0];
  const double ag = cluster::all_gather_time(link, P), rs = cluster::reduce_scatter_time(link, P);
  const double ar = cluster::all_reduce_time(link, P);
  CHECK(ar == doctest::Approx(ag + rs));
  // ZeRO's collectives as the lowering issues them with 1-byte buckets: one per parameter tensor
  // (the same bytes as one collective of P, a latency term per tensor), except ZeRO-3's gathers:
  // one per block (its unit), here the stage's one block: one gather of P.
  const double agt = per_tensor(cluster::all_gather_time, link, g),
               rst = per_tensor(cluster::reduce_scatter_time, link, g),
               art = per_tensor(cluster::all_reduce_time, link, g);
  CHECK(agt > ag);
  // ZeRO-3 gathers before the forward and before the backward, reduce-scatters in the backward.
  CHECK(s3.forward_time - s0.forward_time == doctest::Approx(ag));
  CHECK(s3.backward_time - s0.backward_time == doctest::Approx(ag + rst));
  // ZeRO-2 reduce-scatters in the backward; its update all-gathers as ZeRO-1's does.
  CHECK(s2.forward_time == doctest::Approx(s0.forward_time));
  CHECK(s2.backward_time - s0.backward_time == doctest::Approx(rst));
  // Update: DDP = the whole update (as on one device) + the gradients' all-reduces, one per tensor
  // as the lowering issues them in 1-byte buckets; ZeRO-3 = the own shard's
  // update alone (its collectives ran in the micro-batches); ZeRO-1 = the shard's update +
  // reduce-scatter + all-gather.
  auto o1 = exact_options(0);
  o1.grad_bucket_bytes = 1;
  const double update = plan::layout_plan(g, c, {{0, 0, {0}, {}}}, 1, o1).stages[0].optimizer_time;
  CHECK(art > ar);
  // Every stage also pays the training loop's all-reduce of 16 bytes (gradient norm and loss) over
  // the plan's 8 devices; the one-device layout_plan above has none.
  const double step_ar = cluster::all_reduce_time(link, 16);
  CHECK(s0.optimizer_time == doctest::Approx(update + art + step_ar));
  CHECK(s3.optimizer_time == doctest::Approx(update / n + step_ar));
  CHECK(s1.optimizer_time - s3.optimizer_time == doctest::Approx(agt + rst));
  CHECK(s2.optimizer_time == doctest::Approx(s3.optimizer_time + agt));
  // Working set: one block, gathered, prefetched (none next) and its whole gradients.
  CHECK(s3.transient_memory - s0.transient_memory == doctest::Approx(3 * P * (n - 1.0) / n));
  // Summary and JSON carry the level.
  CHECK(at[3].summary().find("ZeRO-3 across 8 replicas") != std::string::npos);
  CHECK(at[3].summary().find("zero          ZeRO-3 over 8 replicas") != std::string::npos);
  CHECK(plan::Plan::from_json(at[3].to_json()) == at[3]);
  CHECK(plan::Plan::from_json(at[2].to_json()).stages[0].zero == 2);
}

TEST_CASE(
    "zero: the simulator runs the replica collectives on each device's stream; a busy network slows them") {
  const auto g = fp16_adam_step(32);
  const auto c = cluster::Cluster::preset("M8", 1);
  const double psi = static_cast<double>(models::gpt(layer_config()).num_params());
  const double P = 2 * psi;
  const int n = 8, M = 4;
  auto o = exact_options(3);
  o.overlap_grad_sync = true;
  o.num_blocks = 4;  // several blocks: ZeRO-3 gathers one block ahead of its compute
  o.num_microbatches = M;
  const auto p = plan::megatron_plan(g, c, {1, 1, n}, o);
  REQUIRE(p.stages.size() == 1);
  const auto& st = p.stages[0];
  const auto link = cluster::axis_links(c, cluster::DeviceMesh::iota({n}))[0];
  const double rs = cluster::reduce_scatter_time(link, P);  // P < 25 MB: one bucket
  // ZeRO-3 gathers one block at a time (FSDP's unit, as the lowering does): the bytes of one
  // gather of P, the latency once per block with parameters (one node: (n − 1)·α each).
  int blocks = 0;
  for (const auto& b : pipeline::group_layers(g, p.num_blocks).blocks) {
    bool reads = false;
    for (ir::OpId o : b.ops)
      for (ir::TensorId t : g.op(o).inputs)
        reads = reads || (g.tensor(t).role == ir::Role::Parameter && g.tensor(t).producer == ir::kNoOp);
    blocks += reads;
  }
  REQUIRE(blocks > 1);
  const double ag = cluster::all_gather_time(link, P) + (blocks - 1) * (n - 1) * link.intra_alpha;
  // The stage's collectives, by hand: a gather before each forward and backward, a reduce-scatter
  // after each backward; nothing left for the step (one device per replica: no in-mesh sync).
  const sim::ReplicaCollectives& rc = st.replica.collectives;
  CHECK(rc.gather_forward == doctest::Approx(ag));
  CHECK(rc.gather_backward == doctest::Approx(ag));
  CHECK(rc.reduce_backward == doctest::Approx(rs));
  CHECK(rc.step_sync == 0);
  CHECK(rc.step_gather == 0);
  CHECK(rc.gather_unit < 1);
  CHECK(rc.prefetch);
  // The times hold the closed-form rule's exposed part; the simulator takes it out.
  const sim::Pipeline pipe = plan::pipeline_of(p);
  const double fwd = pipe.stages[0].forward_time;
  CHECK(st.replica.in_forward == doctest::Approx(std::max(rc.gather_unit * ag, ag - fwd)));
  CHECK(fwd + st.replica.in_forward == doctest::Approx(st.forward_time));
  CHECK(pipe.stages[0].replica == rc);
  // The step is the simulation's, collectives included: 2 gathers (first unit and rest) before
  // each F and B and a reduce-scatter after each B, M micro-batches.
  const auto r = sim::simulate(plan::schedule_of(p), pipe);
  CHECK(p.step_time == doctest::Approx(r.step_time));
  int gathers = 0, reduces = 0;
  for (const auto& e : r.timeline)
    gathers += e.kind == sim::TaskKind::Gather, reduces += e.kind == sim::TaskKind::Reduce;
  CHECK(gathers == 4 * M);
  CHECK(reduces == M);
  CHECK(r.collective_time[0] == doctest::Approx(M * (2 * ag + rs)));
  // Streams: the backward's gather runs beside the forward, so the step is no longer than the
  // closed-form rule's (the same times with the collectives folded in).
  sim::Pipeline folded = pipe;
  folded.stages[0].forward_time = st.forward_time;
  folded.stages[0].backward_time = st.backward_time;
  folded.stages[0].optimizer_time = st.optimizer_time;
  folded.stages[0].replica = {};
  const double closed_form = sim::simulate(plan::schedule_of(p), folded).step_time;
  CHECK(r.step_time <= closed_form * (1 + 1e-12));
  // A network at half its bandwidth doubles every replica collective: exactly the same step as
  // doubled collective times at full bandwidth.
  sim::Pipeline half = pipe, doubled = pipe;
  half.replica_trace = cluster::BandwidthTrace::constant(0.5);
  for (double* x : {&doubled.stages[0].replica.gather_forward, &doubled.stages[0].replica.gather_backward,
                    &doubled.stages[0].replica.reduce_backward})
    *x *= 2;
  const double slow = sim::simulate(plan::schedule_of(p), half).step_time;
  CHECK(slow == doctest::Approx(sim::simulate(plan::schedule_of(p), doubled).step_time));
  CHECK(slow > r.step_time);
  // The planner's bandwidth-trace policy sees it: one stage has no pipeline link, so before the
  // collectives were simulated a busy network left this plan's step unchanged.
  const auto nominal = plan::adaptive_policy(p, cluster::BandwidthTrace::constant(1.0));
  const auto busy = plan::adaptive_policy(p, cluster::BandwidthTrace::constant(0.1));
  CHECK(busy.step > nominal.step * 1.02);
  auto folded_plan = p;  // the collectives folded into the times, as before: the trace cannot reach them
  folded_plan.stages[0].replica = {};
  CHECK(plan::adaptive_policy(folded_plan, cluster::BandwidthTrace::constant(0.1)).step ==
        doctest::Approx(plan::adaptive_policy(folded_plan, cluster::BandwidthTrace::constant(1.0)).step));
  MESSAGE(
      fmt::format("ZeRO-3 on 8 replicas, M = {}: step {:.4g} ms on the streams, {:.4g} ms by the closed-form "
                  "rule, {:.4g} ms at half bandwidth; Ada-Grouper policy {:.4g} ms nominal, {:.4g} ms at a "
                  "tenth of the bandwidth",
                  M, r.step_time * 1e3, closed_form * 1e3, slow * 1e3, nominal.step * 1e3, busy.step * 1e3));
  // JSON keeps the collectives; an old plan without them simulates with the folded times.
  const auto back = plan::Plan::from_json(p.to_json());
  CHECK(back == p);
  CHECK(plan::resimulate(folded_plan).step_time == doctest::Approx(closed_form));
}

TEST_CASE("zero: auto picks the fastest level that fits; the level keeps the data-parallel layout feasible") {
  const auto g = fp16_adam_step();
  const auto c = cluster::Cluster::preset("M8", 1);
  const double psi = static_cast<double>(models::gpt(layer_config()).num_params());
  auto o = exact_options(-1);
  o.overlap_grad_sync = true;
  auto o0 = o;
  o0.zero = 0;
  const auto replicated = plan::megatron_plan(g, c, {1, 1, 8}, o0);
  CHECK(replicated.stages[0].zero == 0);
  // A limit 8Ψ under the replicated layout's peak (its state is 16Ψ; ZeRO-1 keeps 5.5Ψ of it on 8).
  o.memory_limit = replicated.peak_memory - 8 * psi;
  o0.memory_limit = o.memory_limit;
  CHECK_THROWS_WITH_AS(plan::megatron_plan(g, c, {1, 1, 8}, o0), doctest::Contains("does not fit"), Error);
  const auto tight = plan::megatron_plan(g, c, {1, 1, 8}, o);
  CHECK(tight.stages[0].zero > 0);
  CHECK(tight.peak_memory <= o.memory_limit * (1 + 1e-9));
  // The chosen level is the fastest of those that fit.
  for (int level = 1; level <= 3; ++level) {
    auto ol = o;
    ol.zero = level;
    try {
      const auto p = plan::megatron_plan(g, c, {1, 1, 8}, ol);
      CHECK(tight.step_time <= p.step_time * (1 + 1e-9));
    } catch (const Error&) {
    }
  }
  // make_plan finds a plan too (a ZeRO level or an SPMD layout that shards the states).
  const auto best = plan::make_plan(g, c, o);
  CHECK(best.peak_memory <= o.memory_limit * (1 + 1e-9));
  CHECK(best.step_time <= tight.step_time * (1 + 1e-9));
}

TEST_CASE("zero: hybrid sharding (in node, replicated across nodes) wins over full ZeRO-3 on a slow NIC") {
  const auto g = fp16_adam_step(64);
  auto node = cluster::Cluster::preset("M8", 1).nodes()[0];
  node.nic.bandwidth = 1.25e9;  // 10 Gb/s Ethernet between 4 nodes of 8 GPUs
  const cluster::Cluster c(std::vector<cluster::NodeSpec>(4, node));
  auto o = exact_options(3);
  o.overlap_grad_sync = true;
  const auto hybrid = plan::megatron_plan(g, c, {1, 1, 32}, o);
  CHECK(hybrid.stages[0].zero == 3);
  CHECK(hybrid.stages[0].zero_group == 8);  // one node's replicas
  CHECK(hybrid.summary().find("hybrid: 4 groups of 8") != std::string::npos);
  o.hybrid_sharding = false;
  const auto full = plan::megatron_plan(g, c, {1, 1, 32}, o);
  CHECK(full.stages[0].zero_group == 32);
  CHECK(hybrid.step_time < full.step_time);
  // Full sharding keeps less: 1/32 of the state against 1/8.
  CHECK(full.stages[0].static_memory < hybrid.stages[0].static_memory);
  MESSAGE(fmt::format("ZeRO-3 on 4 nodes at 10 Gb/s: hybrid {:.4g} s, full {:.4g} s per step",
                      hybrid.step_time, full.step_time));
}

TEST_CASE(
    "zero: ZeRO-3 on some blocks only when one level does not fit and ZeRO-3 everywhere gathers too much") {
  // A GPT whose embedding (tied LM head) holds most parameters: ZeRO-2 does not fit under the
  // limit, ZeRO-3 everywhere fits but gathers every block each micro-batch. Per-block levels put
  // the embedding's block(s) at ZeRO-3 and keep the layers at ZeRO-2 (or 1): the state and the
  // exposed collectives are the two uniform levels' mixed by those blocks' share f of the
  // parameters, the same f for both (with_mixed_zero), and the step lands between the two.
  models::GptConfig gc = layer_config(16);
  gc.vocab = 8192;  // 1 M embedding parameters against 0.2 M per layer
  const auto g = ir::build_training_graph(models::gpt(gc));
  const auto c = cluster::Cluster::preset("M8", 1);
  auto o = exact_options(2);
  o.num_blocks = 4;
  o.num_microbatches = 2;
  const auto z2 = plan::megatron_plan(g, c, {1, 1, 8}, o);
  o.zero = 3;
  const auto z3 = plan::megatron_plan(g, c, {1, 1, 8}, o);
  REQUIRE(z3.peak_memory < z2.peak_memory);
  REQUIRE(z3.step_time > z2.step_time);  // nothing overlapped: every gather is exposed
  o.zero = -1;
  o.memory_limit = (z2.peak_memory + z3.peak_memory) / 2;
  const auto mixed = plan::megatron_plan(g, c, {1, 1, 8}, o);
  const auto& st = mixed.stages[0];
  REQUIRE(!st.zero_blocks.empty());
  CHECK((st.zero == 1 || st.zero == 2));
  CHECK(mixed.peak_memory <= o.memory_limit * (1 + 1e-9));
  CHECK(mixed.step_time < z3.step_time);
  // Against the same base level, uniform: the mix is linear in f with one f for state and time.
  auto ob = o;
  ob.zero = st.zero;
  ob.memory_limit = 0;
  const auto base = plan::megatron_plan(g, c, {1, 1, 8}, ob);
  const double f_mem = (st.static_memory - base.stages[0].static_memory) /
                       (z3.stages[0].static_memory - base.stages[0].static_memory);
  const double f_fwd = (st.forward_time - base.stages[0].forward_time) /
                       (z3.stages[0].forward_time - base.stages[0].forward_time);
  CHECK(f_mem > 0);
  CHECK(f_mem < 1);
  CHECK(f_fwd == doctest::Approx(f_mem));
  // The embedding's share: its block is moved first (most parameter bytes).
  const double emb = static_cast<double>(gc.vocab * gc.hidden);
  CHECK(f_mem >= emb / static_cast<double>(models::gpt(gc).num_params()) * 0.99);
  CHECK(mixed.summary().find("ZeRO-3 on blocks") != std::string::npos);
  CHECK(plan::Plan::from_json(mixed.to_json()) == mixed);
  // A hand-written plan naming a block the plan does not have is refused, naming it.
  auto bad = mixed;
  bad.stages[0].zero_blocks = {99};
  CHECK_THROWS_WITH_AS(plan::Plan::from_json(bad.to_json()), doctest::Contains("zero_blocks names block 99"),
                       Error);
  bad.stages[0].zero_blocks = {0};
  bad.stages[0].zero = 3;
  CHECK_THROWS_WITH_AS(plan::Plan::from_json(bad.to_json()), doctest::Contains("not 1 or 2"), Error);
  MESSAGE(fmt::format(
      "per-block ZeRO: ZeRO-{} with ZeRO-3 on blocks {} (f = {:.2f}): {:.4g} ms, peak {:.3g} MB; "
      "ZeRO-2 {:.4g} ms / {:.3g} MB, ZeRO-3 {:.4g} ms / {:.3g} MB",
      st.zero, fmt::join(st.zero_blocks, ","), f_mem, mixed.step_time * 1e3, mixed.peak_memory / 1e6,
      z2.step_time * 1e3, z2.peak_memory / 1e6, z3.step_time * 1e3, z3.peak_memory / 1e6));
}
