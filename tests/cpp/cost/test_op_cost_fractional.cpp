// op_cost_fractional (uneven splits over mixed GPUs) against closed forms and against op_cost.
#include <doctest/doctest.h>

#include <vector>

#include "weft/cluster/cluster.hpp"
#include "weft/core/error.hpp"
#include "weft/cost/op_cost.hpp"
#include "weft/ir/graph.hpp"

using namespace weft;

TEST_CASE("op_cost_fractional: an uneven column split of a matmul, by hand") {
  ir::Graph g;
  const auto x = g.input("x", {64, 1024});        // f32
  const auto w = g.parameter("w", {1024, 4096});  // f32
  const auto y = g.einsum("bk,kn->bn", {x, w}, "y");
  (void)y;
  const ir::Op& op = g.op(0);
  const auto& m = op.index_map;
  const auto v100 = cluster::Cluster::preset("M8").device(0).spec;
  const auto p100 = cluster::Cluster::preset("P100").device(0).spec;
  // The device holding 3/8 of n: FLOPs 2·64·1024·4096·3/8; bytes x (whole) + w·3/8 + y·3/8.
  std::vector<double> frac(m.factors.size(), 1.0);
  int n_factor = -1;
  for (int f = 0; f < static_cast<int>(m.factors.size()); ++f)
    if (m.factors[f].size == 4096) n_factor = f;
  REQUIRE(n_factor >= 0);
  frac[n_factor] = 3.0 / 8;
  const double flops = 2.0 * 64 * 1024 * 4096 * 3 / 8;
  const double bytes = 4.0 * (64 * 1024 + 1024 * 4096 * 3.0 / 8 + 64 * 4096 * 3.0 / 8);
  for (const auto& dev : {v100, p100}) {
    const cost::OpCost c = cost::op_cost_fractional(g, op, dev, frac);
    CHECK(c.flops == doctest::Approx(flops).epsilon(1e-12));
    CHECK(c.bytes == doctest::Approx(bytes).epsilon(1e-12));
    // The local GEMM is 64 x 1024 @ 1024 x 1536: efficiency at b·m·n = 64·1536, k = 1024 (by hand
    // from the preset's f32 curve: ceiling × (64·1536 / fill) × 1024 / (1024 + half_k)).
    const auto& me = dev.matmul(DType::F32);
    const double eff = me.ceiling * (64.0 * 1536 / me.fill_elements) * 1024 / (1024 + me.half_k);
    CHECK(me.fill_elements > 64.0 * 1536);  // the fill term applies
    CHECK(c.time == doctest::Approx(std::max(flops / (dev.peak_flops.at(DType::F32) * eff),
                                             bytes / (dev.memory_bandwidth * dev.memory_efficiency)) +
                                    dev.kernel_overhead)
                        .epsilon(1e-12));
  }
  // Fractions 1/k equal op_cost with k shards (the even split is the special case).
  std::vector<std::int64_t> shards(m.factors.size(), 1);
  for (std::int64_t k : {1, 2, 4, 8}) {
    shards[n_factor] = k;
    frac[n_factor] = 1.0 / static_cast<double>(k);
    CHECK(cost::op_cost_fractional(g, op, v100, frac).time ==
          doctest::Approx(cost::op_cost(g, op, v100, shards).time).epsilon(1e-12));
  }
  // Nothing held: the op does not run there.
  frac[n_factor] = 0;
  CHECK(cost::op_cost_fractional(g, op, v100, frac) == cost::OpCost{});
  frac[n_factor] = 1.5;
  CHECK_THROWS_AS(cost::op_cost_fractional(g, op, v100, frac), Error);
  CHECK_THROWS_AS(cost::op_cost_fractional(g, op, v100, {1.0}), Error);
}

TEST_CASE("op_cost of fused attention: flash FLOPs at the ceiling, its operands and results as bytes") {
  // q, k, v [b=4, h=8, s=512, d=64] f16 on the H100 preset: FLOPs 4·b·h·s²·d, bytes q, k, v, out
  // (2 B each) + lse (f32), no GEMM shape (the ceiling). Heads split 4 ways: a quarter of each.
  ir::Graph g;
  const auto q = g.input("q", {4, 8, 512, 64}, DType::F16), k = g.input("k", {4, 8, 512, 64}, DType::F16),
             v = g.input("v", {4, 8, 512, 64}, DType::F16);
  g.attention(q, k, v, {}, false, "attn");
  const ir::Op& op = g.op(0);
  const auto h100 = cluster::Cluster::preset("H100").device(0).spec;
  const double flops = 4.0 * 4 * 8 * 512 * 512 * 64;
  const double bytes = 4.0 * 2 * (4 * 8 * 512 * 64) + 4.0 * (4 * 8 * 512);
  std::vector<std::int64_t> shards(op.index_map.factors.size(), 1);
  shards[1] = 4;  // the heads factor (leading dims first)
  const cost::OpCost c = cost::op_cost(g, op, h100, shards);
  CHECK(c.flops == doctest::Approx(flops / 4).epsilon(1e-12));
  CHECK(c.bytes == doctest::Approx(bytes / 4).epsilon(1e-12));
  const auto& me = h100.matmul(DType::F16);
  CHECK(c.time == doctest::Approx(std::max(flops / 4 / (h100.peak_flops.at(DType::F16) * me.ceiling),
                                           bytes / 4 / (h100.memory_bandwidth * h100.memory_efficiency)) +
                                  h100.kernel_overhead)
                      .epsilon(1e-12));
}

TEST_CASE("op_cost: a cast is a memory-bound copy (f64 read, f32 written), split like its operand") {
  ir::Graph g;
  const auto x = g.input("x", {1024, 4096}, DType::F64);
  (void)g.cast(x, DType::F32, "down");
  const ir::Op& op = g.op(0);
  const auto dev = cluster::Cluster::preset("M8").device(0).spec;
  const double n = 1024.0 * 4096;
  const cost::OpCost whole = cost::op_cost(g, op, dev, {1, 1});
  CHECK(whole.flops == n);                // one conversion per element
  CHECK(whole.bytes == (8.0 + 4.0) * n);  // read f64, write f32
  CHECK(whole.time ==
        doctest::Approx(whole.bytes / (dev.memory_bandwidth * dev.memory_efficiency) + dev.kernel_overhead)
            .epsilon(1e-12));  // memory-bound: the bytes, not the FLOPs, set the time
  const cost::OpCost half = cost::op_cost(g, op, dev, {2, 1});  // rows split over 2 devices
  CHECK(half.bytes == whole.bytes / 2);
}
