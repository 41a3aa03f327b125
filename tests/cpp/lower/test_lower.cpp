// The program format: JSON round trip, readable dump, and the static check that runs before
// execution (buffers read before written, groups, collective mismatches, deadlocks).
#include <doctest/doctest.h>

#include <algorithm>

#include "weft/cluster/cluster.hpp"
#include "weft/core/error.hpp"
#include "weft/ir/autodiff.hpp"
#include "weft/lower/lower.hpp"
#include "weft/models/models.hpp"
#include "weft/sharding/sharding_spec.hpp"

using namespace weft;

namespace {

// A one-layer GPT step whose every op splits its first splittable factor on each mesh axis
// (a layout with collectives on both axes of a 2x2 mesh).
lower::Program program_2x2() {
  models::GptConfig c;
  c.layers = 1, c.hidden = 16, c.heads = 2, c.seq = 4, c.vocab = 32, c.batch = 4;
  const auto g = ir::build_training_graph(models::gpt(c));
  const std::vector<std::int64_t> mesh{2, 2};
  lower::SpmdLayout l;
  for (const auto& op : g.ops()) {
    auto st = spmd::enumerate_strategies(g, op, mesh);
    l.op_axes.push_back(st[st.size() / 2].axes);
  }
  return lower::lower_spmd(g, cluster::Cluster::preset("M8", 1), cluster::DeviceMesh::iota(mesh), l);
}

// Index of the first collective on `rank` along `axis`.
std::size_t first_collective(const lower::Program& p, int rank, int axis, std::size_t from = 0) {
  const auto& ins = p.ranks[static_cast<std::size_t>(rank)].instrs();
  for (std::size_t k = from; k < ins.size(); ++k)
    if (lower::is_collective(ins[k].kind) && ins[k].axis == axis) return k;
  return ins.size();
}

}  // namespace

TEST_CASE("lower: a program has one list per rank, round-trips through JSON and dumps readably") {
  const auto p = program_2x2();
  REQUIRE(p.num_ranks() == 4);
  CHECK_NOTHROW(lower::check(p));
  for (int r = 0; r < 4; ++r) {
    CHECK(p.ranks[static_cast<std::size_t>(r)].rank == r);
    CHECK(p.ranks[static_cast<std::size_t>(r)].code == p.ranks[0].code);  // SPMD: one shared list
    CHECK(p.instructions(r).size() == p.num_instructions(r));
  }
  CHECK(first_collective(p, 0, 0) < p.ranks[0].instrs().size());
  CHECK(first_collective(p, 0, 1) < p.ranks[0].instrs().size());
  // Groups along an axis: ranks differing only in that coordinate, in coordinate order.
  const auto& i0 = p.ranks[3].instrs()[first_collective(p, 3, 0)];
  CHECK(p.group_of(3, i0) == std::vector<int>{1, 3});
  CHECK(p.group_of(0, i0) == std::vector<int>{0, 2});
  const auto& i1 = p.ranks[3].instrs()[first_collective(p, 3, 1)];
  CHECK(p.group_of(3, i1) == std::vector<int>{2, 3});
  CHECK(p.instructions(3)[first_collective(p, 3, 1)].group == std::vector<int>{2, 3});
  const auto back = lower::Program::from_json(p.to_json());
  CHECK(back == p);
  CHECK(back.ranks[1].code == back.ranks[2].code);  // still shared after the round trip
  CHECK(back.dump() == p.dump());
  CHECK(p.dump_rank(0).find("rank 0 #0 load-input") != std::string::npos);
  CHECK_THROWS_WITH_AS(lower::Program::from_json("{\"format\": \"other\"}"),
                       doctest::Contains("not a weft program"), Error);
  auto j = p.to_json();
  j.replace(j.find("\"all-"), 5, "\"bogus-");
  CHECK_THROWS_WITH_AS(lower::Program::from_json(j), doctest::Contains("unknown instruction kind"), Error);
}

TEST_CASE("lower: the static check catches what would hang or read garbage, naming rank and instruction") {
  const auto good = program_2x2();
  SUBCASE("two collectives of different groups swapped on one rank: deadlock or mismatch") {
    auto p = good;
    const std::size_t a = first_collective(p, 0, 0), b = first_collective(p, 0, 1);
    auto& ins = p.ranks[0].edit();  // rank 0's own list from now on
    std::swap(ins[a], ins[b]);
    CHECK_THROWS_WITH_AS(lower::check(p), doctest::Contains("rank"), Error);
  }
  SUBCASE("a collective missing on one member: its group never gathers") {
    auto p = good;
    const std::size_t a = first_collective(p, 2, 0);
    auto& ins = p.ranks[2].edit();
    ins[a].kind = lower::InstrKind::Copy;
    ins[a].group.clear();
    CHECK_THROWS_AS(lower::check(p), Error);
  }
  SUBCASE("a rank outside its own group") {
    auto p = good;
    const std::size_t a = first_collective(p, 1, 1);
    auto& i = p.ranks[1].edit()[a];
    i.group = {0, 2};  // an explicit group without rank 1
    CHECK_THROWS_WITH_AS(lower::check(p), doctest::Contains("not in its own group"), Error);
  }
  SUBCASE("a buffer read after its free") {
    auto p = good;
    auto& ins = p.ranks[0].edit();
    auto f = std::find_if(ins.begin(), ins.end(),
                          [](const lower::Instr& i) { return i.kind == lower::InstrKind::Free; });
    REQUIRE(f != ins.end());
    const int freed = f->in[0];
    // Read it again at the end.
    lower::Instr copy;
    copy.kind = lower::InstrKind::Copy;
    copy.in = {freed};
    copy.out = {freed};
    ins.push_back(copy);
    CHECK_THROWS_WITH_AS(lower::check(p), doctest::Contains("has not written or has freed"), Error);
  }
}

TEST_CASE("lower: bad layouts and plans are refused with the op or field named") {
  models::GptConfig c;
  c.layers = 1, c.hidden = 16, c.heads = 2, c.seq = 4, c.vocab = 32, c.batch = 4;
  const auto g = ir::build_training_graph(models::gpt(c));
  const auto cl = cluster::Cluster::preset("M8", 1);
  lower::SpmdLayout l;
  l.op_axes.assign(g.ops().size(), {spmd::AxisAssign{}});
  l.op_axes[0] = {spmd::AxisAssign{99, 0}};  // no such factor
  CHECK_THROWS_WITH_AS(lower::lower_spmd(g, cl, cluster::DeviceMesh::iota({2}), l),
                       doctest::Contains(g.op(0).name.c_str()), Error);
  l.op_axes.pop_back();
  CHECK_THROWS_WITH_AS(lower::lower_spmd(g, cl, cluster::DeviceMesh::iota({2}), l),
                       doctest::Contains("op assignments"), Error);
}
