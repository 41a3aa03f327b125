// lower::verify (issue 38): a program is the contract between planning and running; every
// mutation of a lowered program that would crash the executor or run garbage is refused by name.
#include <doctest/doctest.h>

#include <algorithm>
#include <functional>

#include "weft/cluster/cluster.hpp"
#include "weft/core/error.hpp"
#include "weft/ir/autodiff.hpp"
#include "weft/lower/lower.hpp"
#include "weft/models/models.hpp"
#include "weft/plan/planner.hpp"
#include "weft/sharding/sharding_spec.hpp"

using namespace weft;
using lower::InstrKind;

namespace {

ir::Graph tiny_gpt(int layers = 1, int hidden = 16) {
  models::GptConfig c;
  c.layers = layers, c.hidden = hidden, c.heads = 2, c.seq = 4, c.vocab = 32, c.batch = 4;
  return ir::build_training_graph(models::gpt(c));
}

// Two replicas x two micro-batches over a 2-way SPMD mesh: gradient all-reduces over the replica
// axis, loads of two micro-batches, accumulations and scales, resharding collectives on axis 1.
lower::Program program_dp(const ir::Graph& g) {
  const std::vector<std::int64_t> spmd{2};
  lower::SpmdLayout l;
  for (const auto& op : g.ops()) {
    auto st = spmd::enumerate_strategies(g, op, spmd);
    l.op_axes.push_back(st[st.size() / 2].axes);
  }
  lower::StageOptions o;
  o.replicas = 2;
  o.microbatches = 2;
  return lower::lower_spmd(g, cluster::Cluster::preset("M8", 1), cluster::DeviceMesh::iota({2, 2}), l, o);
}

const lower::Program& good() {
  static const lower::Program p = [] {
    auto g = tiny_gpt();
    // lower_spmd runs the micro-batch graph: the batch of the stage is the graph's.
    return program_dp(g);
  }();
  return p;
}

// The first instruction of rank 0's list that satisfies `pred` (rank 0's own copy, to edit).
lower::Instr& find_instr(lower::Program& p, const std::function<bool(const lower::Instr&)>& pred) {
  auto& ins = p.ranks[0].edit();
  for (auto& r : p.ranks) r.code = p.ranks[0].code;  // every rank runs the edited list
  auto it = std::find_if(ins.begin(), ins.end(), pred);
  REQUIRE(it != ins.end());
  return *it;
}

void refused(const lower::Program& p, const char* what) {
  CHECK_THROWS_WITH_AS(lower::verify(p), doctest::Contains(what), Error);
  // The same through JSON (from_json verifies) — never a crash.
  CHECK_THROWS_AS((void)lower::Program::from_json(p.to_json()), Error);
}

}  // namespace

TEST_CASE("verify: a lowered program verifies, against its graph and after a JSON round trip") {
  const auto& p = good();
  CHECK_NOTHROW(lower::verify(p));
  CHECK_NOTHROW(lower::verify(p, p.graph));
  CHECK(p.graph_fingerprint == ir::graph_fingerprint(p.graph));
  const auto back = lower::Program::from_json(p.to_json());
  CHECK(back == p);
  CHECK_THROWS_WITH_AS(lower::verify(p, tiny_gpt(1, 32)), doctest::Contains("fingerprint"), Error);
}

TEST_CASE("verify: the graph fingerprint is the structure, not the name or the values") {
  auto a = tiny_gpt(), b = tiny_gpt();
  CHECK(ir::graph_fingerprint(a) == ir::graph_fingerprint(b));
  b.set_name("renamed");
  CHECK(ir::graph_fingerprint(a) == ir::graph_fingerprint(b));
  CHECK(ir::graph_fingerprint(a) != ir::graph_fingerprint(tiny_gpt(1, 32)));
  CHECK(ir::graph_fingerprint(a) != ir::graph_fingerprint(tiny_gpt(3, 16)));
  CHECK(ir::graph_fingerprint(a).size() == 16);
}

TEST_CASE("verify: mutations are refused by name") {
  SUBCASE("the graph replaced (fingerprint)") {
    auto p = good();
    p.graph = tiny_gpt(1, 32);
    refused(p, "fingerprint");
  }
  SUBCASE("the graph replaced, fingerprint updated too: the buffers' shapes") {
    auto p = good();
    p.graph = tiny_gpt(1, 32);
    p.graph_fingerprint = ir::graph_fingerprint(p.graph);
    refused(p, "shape");
  }
  SUBCASE("the graph replaced by a deeper one") {
    auto p = good();
    p.graph = tiny_gpt(3, 16);
    p.graph_fingerprint.clear();
    CHECK_THROWS_AS(lower::verify(p), Error);
  }
  SUBCASE("all code emptied") {
    auto p = good();
    p.ranks[0].edit().clear();
    for (auto& r : p.ranks) r.code = p.ranks[0].code;
    refused(p, "run by no rank");
  }
  SUBCASE("a buffer shape of 2^62") {
    auto p = good();
    p.buffers[0].shape[0] = std::int64_t{1} << 62;
    refused(p, "shape");
  }
  SUBCASE("a buffer's tensor id changed") {
    auto p = good();
    auto& b = p.buffers[static_cast<std::size_t>(p.loss)];
    b.tensor = 0;
    CHECK_THROWS_AS(lower::verify(p), Error);
  }
  SUBCASE("the loss never written (its instruction deleted)") {
    auto p = good();
    auto& ins = p.ranks[0].edit();
    for (auto& r : p.ranks) r.code = p.ranks[0].code;
    const auto ce = p.graph.tensor(*p.graph.loss()).producer;
    ins.erase(std::remove_if(ins.begin(), ins.end(), [&](const lower::Instr& i) { return i.op == ce; }), ins.end());
    CHECK_THROWS_AS(lower::verify(p), Error);
  }
  SUBCASE("micro-batch size, micro-batches, replicas") {
    for (std::int64_t mb : {std::int64_t{-1}, std::int64_t{0}, std::int64_t{1} << 40}) {
      auto p = good();
      p.stages[0].microbatch_size = mb;
      refused(p, "microbatch_size");
    }
    auto p = good();
    p.stages[0].replicas = 0;
    refused(p, "replicas");
    p = good();
    p.stages[0].replicas = 3;
    refused(p, "replica");
    p = good();
    p.stages[0].microbatches = 0;
    refused(p, "micro-batches");
  }
  SUBCASE("a load of micro-batch -1 or 99") {
    for (int m : {-1, 99}) {
      auto p = good();
      find_instr(p, [](const lower::Instr& i) { return i.kind == InstrKind::LoadInput; }).microbatch = m;
      refused(p, "micro-batch");
    }
  }
  SUBCASE("a compute's op changed") {
    auto p = good();
    auto& i = find_instr(p, [](const lower::Instr& x) { return x.kind == InstrKind::Compute; });
    i.op = (i.op + 1) % static_cast<ir::OpId>(p.graph.ops().size());
    refused(p, "op");
  }
  SUBCASE("a compute's op out of range") {
    auto p = good();
    find_instr(p, [](const lower::Instr& x) { return x.kind == InstrKind::Compute; }).op = 100000;
    refused(p, "does not exist");
  }
  SUBCASE("a compute's operand changed") {
    auto p = good();
    auto& i = find_instr(p, [](const lower::Instr& x) { return x.kind == InstrKind::Compute && x.in.size() >= 2; });
    std::swap(i.in[0], i.in[1]);
    refused(p, "operand");
  }
  SUBCASE("a sum all-reduce turned into max") {
    auto p = good();
    auto& i = find_instr(p, [](const lower::Instr& x) {
      return x.kind == InstrKind::AllReduce && !x.internal && x.reduce == lower::ReduceOp::Sum;
    });
    i.reduce = lower::ReduceOp::Max;
    refused(p, "reduced by sum, not max");
  }
  SUBCASE("a leaf's spec changed R -> S(0)") {
    auto p = good();
    bool changed = false;
    for (int b : p.leaf_buffers) {
      auto& buf = p.buffers[static_cast<std::size_t>(b)];
      if (buf.spec == "R R" && !buf.shape.empty() && buf.shape[0] % 4 == 0 &&
          p.graph.tensor(buf.tensor).role == ir::Role::Parameter) {
        buf.spec = "R S(0)";
        changed = true;
        break;
      }
    }
    REQUIRE(changed);
    CHECK_THROWS_AS(lower::verify(p), Error);
  }
  SUBCASE("element bytes 0 or -4") {
    for (int eb : {0, -4, 3}) {
      auto p = good();
      p.buffers[0].element_bytes = eb;
      refused(p, "element_bytes");
    }
  }
  SUBCASE("no ranks; the loss reported as -1") {
    auto p = good();
    p.ranks.clear();
    CHECK_THROWS_AS(lower::verify(p), Error);
    p = good();
    p.loss = -1;
    refused(p, "loss");
  }
  SUBCASE("a collective's axis outside the mesh") {
    auto p = good();
    find_instr(p, [](const lower::Instr& x) { return lower::is_collective(x.kind); }).axis = 7;
    refused(p, "axis");
  }
  SUBCASE("an accumulation deleted, or a micro-batch loaded twice (followed through the step)") {
    // Two micro-batches: each accumulator has one accumulate. Without it the accumulator is a
    // plain copy of micro-batch 0's value, which no per-instruction check can tell.
    auto p = good();
    auto& ins = p.ranks[0].edit();
    for (auto& r : p.ranks) r.code = p.ranks[0].code;
    auto it = std::find_if(ins.begin(), ins.end(),
                           [](const lower::Instr& x) { return x.kind == InstrKind::Accumulate; });
    REQUIRE(it != ins.end());
    ins.erase(it);
    refused(p, "from micro-batches {0} of the stage's 2 (an accumulation is missing)");
    p = good();
    auto& loads = p.ranks[0].edit();
    for (auto& r : p.ranks) r.code = p.ranks[0].code;
    for (auto& x : loads)
      if (x.kind == InstrKind::LoadInput) x.microbatch = 0;
    refused(p, "a micro-batch counted twice");
  }
  SUBCASE("a gradient reported from a buffer of another tensor") {
    auto p = good();
    REQUIRE(!p.gradients.empty());
    p.gradients.begin()->second = p.loss;
    refused(p, "gradient");
  }
}

TEST_CASE("verify: a plan made for one graph is not lowered with another") {
  plan::Plan q;
  q.model = "gpt";
  q.graph_fingerprint = ir::graph_fingerprint(tiny_gpt(1, 64));
  const auto g = tiny_gpt(1, 32);
  try {
    (void)lower::lower(q, g, cluster::Cluster::preset("M8", 1));
    FAIL("lowered");
  } catch (const Error& e) {
    const std::string m = e.what();
    CHECK(m.find(q.graph_fingerprint) != std::string::npos);
    CHECK(m.find(ir::graph_fingerprint(g)) != std::string::npos);
  }
}

TEST_CASE("verify: a program carries out its plan (stages, devices, counts)") {
  const auto g = tiny_gpt(2, 16);
  const auto c = cluster::Cluster::preset("M8", 1);
  plan::PlanOptions o;
  o.spmd_time_limit_s = 5;
  const plan::Plan p = plan::megatron_plan(g, c, plan::MegatronLayout{1, 2, 4}, o);
  const auto prog = lower::lower(p, g, c);
  lower::verify(prog, g, p);
  auto q = p;
  q.num_microbatches += 1;
  CHECK_THROWS_WITH_AS(lower::check_against_plan(prog, q), doctest::Contains("micro-batches, the plan"),
                       Error);
  q = p;
  q.microbatch_size *= 2;
  CHECK_THROWS_WITH_AS(lower::check_against_plan(prog, q), doctest::Contains("samples, the plan"), Error);
  q = p;
  q.data_parallel = 2;
  CHECK_THROWS_WITH_AS(lower::check_against_plan(prog, q), doctest::Contains("replicas, the plan"), Error);
  q = p;
  std::swap(q.stages[0].devices, q.stages[1].devices);
  CHECK_THROWS_WITH_AS(lower::check_against_plan(prog, q), doctest::Contains("runs on devices"), Error);
  q = p;
  q.stages.pop_back();
  CHECK_THROWS_WITH_AS(lower::check_against_plan(prog, q), doctest::Contains("stages, the plan has 1"),
                       Error);
}
