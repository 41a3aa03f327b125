// Heterogeneous load balancing (Whale's Algorithm 1, corrected): brute-force oracle, closed
// forms, memory-limited and infeasible cases; the model profile against costing the graph built
// at that batch; the acceptance figures of issue 5 (8 V100 + 8 P100 data parallel, 4 + 4
// pipeline).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <random>

#include "weft/core/error.hpp"
#include "weft/cost/memory.hpp"
#include "weft/cost/op_cost.hpp"
#include "weft/cost/roofline.hpp"
#include "weft/models/models.hpp"
#include "weft/pipeline/hetero.hpp"

using namespace weft;
using namespace weft::pipeline;

namespace {

constexpr double kGiB = 1073741824.0;

// Brute force: the minimum of max_i t_i(u_i) over all integer u ≥ 0, Σ u = T, within memory;
// +inf when nothing fits.
double brute_force(const std::vector<DeviceCapacity>& d, const std::vector<LoadModel>& l, std::int64_t T) {
  const std::size_t n = d.size();
  std::vector<std::int64_t> u(n, 0);
  double best = std::numeric_limits<double>::infinity();
  std::function<void(std::size_t, std::int64_t)> rec = [&](std::size_t i, std::int64_t left) {
    if (i + 1 == n) {
      u[i] = left;
      double mx = 0;
      for (std::size_t k = 0; k < n; ++k) {
        if (l[k].memory(u[k]) > d[k].memory_bytes) return;
        mx = std::max(mx, l[k].work(u[k]) / d[k].flops);
      }
      best = std::min(best, mx);
      return;
    }
    for (std::int64_t x = 0; x <= left; ++x) {
      u[i] = x;
      rec(i + 1, left - x);
    }
  };
  rec(0, T);
  return best;
}

cluster::Cluster v100_p100() {
  return cluster::Cluster::concat(cluster::Cluster::preset("M8"), cluster::Cluster::preset("P100"));
}

ModelProfile bert_large_128() {
  return ModelProfile::from_builder([](std::int64_t b) {
    models::BertConfig c = models::bert_config("BERT-large", b);
    c.seq = 128;
    return models::bert(c);
  });
}

}  // namespace

TEST_CASE("hetero: proportional shares in closed form, no memory limit") {
  std::vector<DeviceCapacity> d{{2e12, 1e9, "a"}, {1e12, 1e9, "b"}, {1e12, 1e9, "c"}};
  HeteroShares r = balance_load(d, LoadModel(1e9), 8);
  CHECK(r.units == std::vector<std::int64_t>{4, 2, 2});
  CHECK(r.proportional == r.units);
  CHECK(r.shifts == 0);
  CHECK(r.feasible);
  CHECK(r.max_time == doctest::Approx(4e9 / 2e12));
  CHECK(r.to_string().find("units=[4,2,2]") != std::string::npos);
  // Non-integer proportions: 7 units on 2:1 -> 4.67 / 2.33 -> floors 4, 2, the last unit to the
  // device whose time after it is smaller (5/2 < 3/1).
  CHECK(balance_load({d[0], d[1]}, LoadModel(1), 7).units == std::vector<std::int64_t>{5, 2});
  CHECK(balance_load(d, LoadModel(1), 0).units == std::vector<std::int64_t>{0, 0, 0});
}

TEST_CASE("hetero: Algorithm 1 equals brute force on small integer instances") {
  std::mt19937 rng(20261123);
  const int cases = std::getenv("WEFT_SANITIZED") ? 300 : 1500;
  int feasible = 0, memory_bound = 0;
  for (int c = 0; c < cases; ++c) {
    const int n = 1 + static_cast<int>(rng() % 4);
    const std::int64_t T = static_cast<std::int64_t>(rng() % (n == 4 ? 9 : 12));
    std::vector<DeviceCapacity> d;
    std::vector<LoadModel> l;
    for (int i = 0; i < n; ++i) {
      const double flops = static_cast<double>(1 + rng() % 6);
      const double fpu = static_cast<double>(1 + rng() % 3);
      const double fixed = rng() % 3 == 0 ? static_cast<double>(rng() % 7) : 0.0;
      const double stat = static_cast<double>(rng() % 4);
      const double bpu = static_cast<double>(rng() % 3);
      const double mem = stat + static_cast<double>(rng() % 9) + 0.5;
      d.emplace_back(flops, mem, "d" + std::to_string(i));
      l.emplace_back(fpu, stat + (rng() % 5 == 0 ? 9.0 : 0.0), bpu, fixed);
    }
    const double opt = brute_force(d, l, T);
    const HeteroShares r = try_balance_load(d, l, T);
    INFO("case " << c << ": " << r.to_string());
    REQUIRE(r.feasible == std::isfinite(opt));
    if (!r.feasible) {
      CHECK(!r.message.empty());
      CHECK(r.missing_bytes > 0);
      continue;
    }
    ++feasible;
    memory_bound += r.shifts > 0;
    std::int64_t sum = 0;
    for (int i = 0; i < n; ++i) {
      sum += r.units[static_cast<std::size_t>(i)];
      CHECK(l[static_cast<std::size_t>(i)].memory(r.units[static_cast<std::size_t>(i)]) <=
            d[static_cast<std::size_t>(i)].memory_bytes);
    }
    CHECK(sum == T);
    CHECK(r.max_time == doctest::Approx(opt).epsilon(1e-12));
    // Same objective as re-evaluating the shares independently.
    CHECK(evaluate_load(d, l, r.units).max_time == doctest::Approx(r.max_time));
  }
  MESSAGE("feasible " << feasible << " of " << cases << ", memory phase active in " << memory_bound);
  CHECK(feasible > cases / 3);
  CHECK(memory_bound > cases / 20);
}

TEST_CASE("hetero: memory-limited device sheds load until it fits (the peak is not dropped early)") {
  // Device 0 is 3x faster but holds only 2 units beyond its static part. Proportional: 4.8, 1.6,
  // 1.6 -> floors 4, 1, 1, then unit 7 to device 0 (5/3 < 2) and unit 8 to device 2 (a tie at 2
  // broken by the lower memory utilisation).
  std::vector<DeviceCapacity> d{{3, 4, "fast-small"}, {1, 3.5, "slow-tiny"}, {1, 100, "slow-big"}};
  const LoadModel l(1, 2, 1);  // static 2, 1 byte per unit
  HeteroShares r = balance_load(d, l, 8);
  CHECK(r.proportional == std::vector<std::int64_t>{5, 1, 2});
  // Caps: 2, 1, 98. The optimum keeps device 0 at its cap and puts the rest on device 2.
  CHECK(r.units == std::vector<std::int64_t>{2, 1, 5});
  CHECK(r.max_time == doctest::Approx(5.0));
  CHECK(r.shifts >= 1);
  CHECK(r.feasible);
  CHECK(r.memory[0] == doctest::Approx(4.0));
  // Static memory does not scale with the share: with all memory scaling with load (the paper's
  // simplification) the same 4 bytes would be read as 4/6 per unit and allow 6 units.
  CHECK(l.max_units(4) == 2);
  CHECK(LoadModel(1, 0, 4.0 / 6.0).max_units(4) == 6);
}

TEST_CASE("hetero: infeasible requests say how much memory is missing") {
  std::vector<DeviceCapacity> d{{1, 10 * kGiB, "a"}, {1, 10 * kGiB, "b"}};
  const LoadModel l(1, 4 * kGiB, 1 * kGiB);  // 6 units fit per device
  HeteroShares r = try_balance_load(d, l, 15);
  CHECK_FALSE(r.feasible);
  CHECK(r.missing_units == 3);
  CHECK(r.missing_bytes == doctest::Approx(3 * kGiB));
  CHECK(r.message.find("3 of 15 units") != std::string::npos);
  CHECK(r.message.find("3 GiB") != std::string::npos);
  CHECK_THROWS_WITH_AS(balance_load(d, l, 15), doctest::Contains("missing"), Error);
  // The static part alone does not fit.
  HeteroShares s = try_balance_load(d, LoadModel(1, 12 * kGiB, 0), 1);
  CHECK_FALSE(s.feasible);
  CHECK(s.missing_bytes == doctest::Approx(4 * kGiB));
  CHECK(s.message.find("load-independent") != std::string::npos);
  // Bad input.
  CHECK_THROWS_AS(LoadModel(0), Error);
  CHECK_THROWS_AS(LoadModel(1, -1), Error);
  CHECK_THROWS_AS(DeviceCapacity(0, 1), Error);
  CHECK_THROWS_AS(balance_load({}, LoadModel(1), 1), Error);
  CHECK_THROWS_AS(balance_load(d, LoadModel(1), -1), Error);
  CHECK_THROWS_AS(balance_load(d, std::vector<LoadModel>(3, LoadModel(1)), 1), Error);
}

TEST_CASE("hetero: uneven tensor split and memory-descending order") {
  std::vector<DeviceCapacity> d{{2e12, 16 * kGiB, "v"}, {1e12, 32 * kGiB, "p"}};
  // 4096 = 64 granules of 64; 2:1 -> 42.67 / 21.33 -> (43, 21) granules.
  CHECK(split_dimension(d, 4096, 64) == std::vector<std::int64_t>{2752, 1344});
  CHECK_THROWS_WITH_AS(split_dimension(d, 4096, 100), doctest::Contains("does not divide"), Error);
  // A memory-bound split: each granule holds 1 GiB of weights; device 0 fits 10 granules.
  const auto s = split_dimension(d, 64 * 24, 64, LoadModel(1, 6 * kGiB, 1 * kGiB));
  CHECK(s == std::vector<std::int64_t>{640, 896});
  CHECK(memory_descending_order(d) == std::vector<int>{1, 0});
  std::vector<DeviceCapacity> e{{1, 8, "a"}, {3, 16, "b"}, {2, 16, "c"}, {5, 8, "d"}};
  CHECK(memory_descending_order(e) == std::vector<int>{1, 2, 3, 0});
  const auto caps = capacities(v100_p100(), {0, 8});
  CHECK(caps[0].flops == doctest::Approx(15.7e12 * 0.74));  // peak x the preset ceiling
  CHECK(caps[1].flops == doctest::Approx(9.3e12 * 0.74));
  CHECK(caps[1].memory_bytes == doctest::Approx(16 * kGiB));
}

TEST_CASE("hetero: model profile equals costing the graph built at that batch") {
  models::GptConfig cfg;
  cfg.layers = 3, cfg.hidden = 64, cfg.heads = 4, cfg.seq = 16, cfg.vocab = 100;
  auto build = [&](std::int64_t b) {
    models::GptConfig c = cfg;
    c.batch = b;
    return models::gpt(c);
  };
  const ModelProfile p = ModelProfile::from_builder(build);
  CHECK(p.num_layers() == 3);
  // Each op's FLOPs, bytes and GEMM shape (output elements, contraction) are lines in the batch,
  // so the profile prices every op as costing the graph built at that batch does: on the
  // datasheet (every op at peak) and under the presets' matmul efficiency, whose fill and
  // contraction terms follow the GEMM's shape.
  const cluster::Cluster c = v100_p100().datasheet(), real = v100_p100();
  REQUIRE(real.device(0).spec.matmul(DType::F32).half_k > 0);
  for (std::int64_t b : {1, 3, 7}) {
    const ir::Graph g = ir::build_training_graph(build(b));
    CHECK(p.flops(static_cast<double>(b)) == doctest::Approx(g.flops()).epsilon(1e-12));
    for (const cluster::Cluster* cl : {&c, &real})
      for (int dev : {0, 8}) {
        double t = 0, ceiling_only = 0;
        for (const ir::Op& op : g.ops()) {
          const auto oc = cost::op_cost(g, op, cl->device(dev).spec,
                                        std::vector<std::int64_t>(op.index_map.factors.size(), 1));
          t += oc.time;
          ceiling_only +=
              cost::roofline(oc.flops, oc.bytes, cost::compute_dtype(g, op), cl->device(dev)).total;
        }
        CHECK(p.time(static_cast<double>(b), cl->device(dev)) == doctest::Approx(t).epsilon(1e-12));
        if (cl == &real) CHECK(t > ceiling_only * 1.01);  // the small GEMMs run below the ceiling
      }
    const cost::Liveness lv = cost::liveness(g);
    std::vector<double> bytes;
    for (const auto& ti : g.tensors()) bytes.push_back(static_cast<double>(ti.bytes()));
    CHECK(p.peak_memory(static_cast<double>(b)) ==
          doctest::Approx(cost::peak_memory(lv, bytes).first).epsilon(1e-12));
    // Groups partition the ops: pre + layers + post (F + B + optimizer) = the whole step.
    double sum = 0;
    for (int gr = -1; gr <= 3; ++gr)
      sum += p.group_time(gr, static_cast<double>(b), c.device(0), {}, true) +
             p.group_time(gr, static_cast<double>(b), c.device(0), {}, false) +
             p.group_optimizer_time(gr, c.device(0), {});
    CHECK(sum == doctest::Approx(p.time(static_cast<double>(b), c.device(0))).epsilon(1e-12));
    // Between two pre-LN blocks only the residual stream [b, s, h] (f32) crosses.
    CHECK(p.boundary_bytes(0, static_cast<double>(b)) ==
          doctest::Approx(static_cast<double>(b * 16 * 64 * 4)));
  }
  // Parameters + gradients + Adam's two states: 4x the parameter bytes.
  double st = 0;
  for (int gr = -1; gr <= 3; ++gr) st += p.group_static_bytes(gr);
  CHECK(st == doctest::Approx(4 * p.param_bytes()));
  // Layer i holds 12h² + 13h parameters (GPT block): ×4 bytes ×4.
  CHECK(p.group_static_bytes(1) == doctest::Approx(16.0 * (12 * 64 * 64 + 13 * 64)));
  // The memory line bounds the exact peak from above on [1, b_hi] (convexity).
  const LoadModel ml = p.memory_line(16);
  for (std::int64_t b = 1; b <= 16; ++b)
    CHECK(ml.memory(b) >= p.peak_memory(static_cast<double>(b)) * (1 - 1e-12));
  CHECK_THROWS_AS(ModelProfile::from_builder([&](std::int64_t b) {
                    models::GptConfig x = cfg;
                    x.batch = b;
                    x.layers = b;  // structure changes with the batch
                    return models::gpt(x);
                  }),
                  Error);
}

TEST_CASE("hetero: proportional pieces — largest remainders, brute force on small sizes") {
  CHECK(proportional_pieces(10, {1, 1, 1}) == std::vector<std::int64_t>{4, 3, 3});
  CHECK(proportional_pieces(4096, {15.7, 9.3}) == std::vector<std::int64_t>{2572, 1524});
  CHECK(proportional_pieces(0, {1, 2}) == std::vector<std::int64_t>{0, 0});
  CHECK(proportional_pieces(7, {0, 1}) == std::vector<std::int64_t>{0, 7});
  // Against brute force: the pieces minimise the largest |piece − size·f| over all integer vectors
  // summing to size (largest-remainder rounding is optimal for that), and each is floor or ceil.
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> U(0.05, 1.0);
  for (int trial = 0; trial < 200; ++trial) {
    const std::int64_t size = 1 + static_cast<std::int64_t>(rng() % 12);
    const std::vector<double> f{U(rng), U(rng), U(rng)};
    const double tot = f[0] + f[1] + f[2];
    const auto p = proportional_pieces(size, f);
    CHECK(p[0] + p[1] + p[2] == size);
    auto err = [&](std::int64_t a, std::int64_t b, std::int64_t c) {
      const std::int64_t v[3] = {a, b, c};
      double e = 0;
      for (int i = 0; i < 3; ++i) e = std::max(e, std::abs(static_cast<double>(v[i]) - size * f[i] / tot));
      return e;
    };
    double best = 1e9;
    for (std::int64_t a = 0; a <= size; ++a)
      for (std::int64_t b = 0; a + b <= size; ++b) best = std::min(best, err(a, b, size - a - b));
    CHECK(err(p[0], p[1], p[2]) <= best + 1e-12);
    for (int i = 0; i < 3; ++i) {
      CHECK(static_cast<double>(p[i]) >= std::floor(size * f[i] / tot) - 1e-9);
      CHECK(static_cast<double>(p[i]) <= std::ceil(size * f[i] / tot) + 1e-9);
    }
  }
  CHECK_THROWS_AS(proportional_pieces(3, {0, 0}), Error);
  CHECK_THROWS_AS(proportional_pieces(3, {}), Error);
  CHECK_THROWS_AS(proportional_pieces(3, {-1, 2}), Error);
}

TEST_CASE("hetero: acceptance — data parallel 8 V100-32GB + 8 P100-16GB, BERT-large") {
  const cluster::Cluster c = v100_p100();
  const ModelProfile p = bert_large_128();
  std::vector<int> ids(16);
  for (int i = 0; i < 16; ++i) ids[static_cast<std::size_t>(i)] = i;
  // The baseline: the same batch on every GPU, the largest a P100 holds (Whale's baseline runs
  // every replica at one batch size).
  std::int64_t k = 1;
  while (p.peak_memory(static_cast<double>(k + 1)) <= c.device(8).spec.memory_bytes) ++k;
  // 44 since the preset carries BERT's dropout 0.1 (48 without): the probabilities' dropout output
  // is saved beside the softmax's, 16 heads · 128² · 4 B = 1 MiB per sample and layer more.
  CHECK(k == 44);
  const std::int64_t B = 16 * k;
  const DpEvaluation even = evaluate_data_parallel(p, c, ids, even_units(B, 16));
  const HeteroShares s = balance_data_parallel(p, c, ids, B);
  const DpEvaluation bal = evaluate_data_parallel(p, c, ids, s.units);
  MESSAGE(p.to_string());
  MESSAGE("even:     " << even.to_string());
  MESSAGE("balanced: " << bal.to_string() << " ratio " << bal.throughput / even.throughput);
  CHECK(even.fits);
  CHECK(bal.fits);
  std::int64_t sum = 0;
  for (auto u : s.units) sum += u;
  CHECK(sum == B);
  CHECK(s.units[0] > s.units[8]);  // V100s take more
  // The cost model's ceiling: with per-sample times τ_i (roofline, secant around the shares)
  // perfectly divisible work gives Σ_i 1/τ_i samples/s against N/τ_max for the even split;
  // for V100-SXM2 vs P100-PCIE on BERT-large τ_P/τ_V = 1.63, so the ceiling is ≈ 1.316.
  double rate = 0, slowest = 0;
  for (int id : ids) {
    const double tau = (p.time(2.0 * k, c.device(id)) - p.time(static_cast<double>(k), c.device(id))) / k;
    rate += 1 / tau;
    slowest = std::max(slowest, tau);
  }
  const double ceiling = rate * slowest / 16;
  const double ratio = bal.throughput / even.throughput;
  MESSAGE("ratio " << ratio << ", ceiling " << ceiling);
  CHECK(ceiling == doctest::Approx(1.316).epsilon(0.005));
  CHECK(ratio <= ceiling);
  CHECK(ratio >= 0.985 * ceiling);  // integer shares and the fixed optimizer/bucket times cost < 1.5%
  // The target (Whale reports 1.3-1.4x): 1.306 at the batch the P100 holds (44/GPU).
  CHECK(ratio >= 1.3);
  // Without overlapping the all-reduce the gain is smaller but still there.
  DataParallelOptions no;
  no.overlap_grad_sync = false;
  const DpEvaluation bal_no = evaluate_data_parallel(p, c, ids, s.units, no);
  const double r2 = bal_no.throughput / evaluate_data_parallel(p, c, ids, even_units(B, 16), no).throughput;
  MESSAGE("no overlap ratio " << r2);
  CHECK(r2 > 1.1);
  // The step by hand: every replica runs optimizer + forward + backward between two all-reduces
  // (ModelProfile::time is all three), the all-reduce waits for the longest of those periods. A
  // barrier after the optimizer (slowest optimizer + slowest compute) would cost more here: the
  // V100s have the longer forward + backward, the P100s the longer optimizer step.
  double period = 0;
  for (int id : ids)
    period =
        std::max(period, p.time(static_cast<double>(s.units[static_cast<std::size_t>(id)]), c.device(id)));
  CHECK(bal_no.step_time == doctest::Approx(period + bal_no.allreduce).epsilon(1e-12));
}

TEST_CASE("hetero: acceptance — pipeline on 4 V100 + 4 P100, BERT-large") {
  const cluster::Cluster c = v100_p100();
  const ModelProfile p = bert_large_128();
  PipelineOptions o;
  o.micro_batch = 8;
  o.num_micro = 16;
  // P100s listed first: the balancer must still put the V100s (32 GB) on the early stages.
  const std::vector<int> ids{8, 9, 10, 11, 0, 1, 2, 3};
  const PipelineEvaluation bal = balance_pipeline(p, c, ids, o);
  CHECK(bal.device_order == std::vector<int>{0, 1, 2, 3, 8, 9, 10, 11});
  const PipelineEvaluation even =
      evaluate_pipeline(p, c, bal.device_order, even_layers(p.num_layers(), 8), o);
  MESSAGE("even:     " << even.to_string());
  MESSAGE("balanced: " << bal.to_string() << " ratio " << bal.throughput / even.throughput);
  CHECK(bal.fits);
  CHECK(even.fits);
  CHECK(bal.throughput >= 1.15 * even.throughput);
  int sum = 0;
  for (int l : bal.layers) sum += l;
  CHECK(sum == 24);
  CHECK(bal.layers[0] >= bal.layers[4]);
  CHECK_THROWS_AS(evaluate_pipeline(p, c, bal.device_order, {24}, o), Error);
  CHECK_THROWS_AS(balance_pipeline(p, c, {0, 0}, o), Error);
}

TEST_CASE("hetero: pipeline with nested data parallelism (Whale's 4 stages x 2 replicas on 4+4)") {
  const cluster::Cluster c = v100_p100();
  const ModelProfile p = bert_large_128();
  PipelineOptions o;
  o.micro_batch = 8, o.num_micro = 16, o.replicas = 2;
  const PipelineEvaluation bal = balance_pipeline(p, c, {8, 9, 10, 11, 0, 1, 2, 3}, o);
  // Stages of two same-kind devices: V100 pairs on stages 0-1, P100 pairs on 2-3.
  CHECK(bal.device_order == std::vector<int>{0, 1, 2, 3, 8, 9, 10, 11});
  CHECK(bal.layers.size() == 4);
  const PipelineEvaluation even = evaluate_pipeline(p, c, bal.device_order, even_layers(24, 4), o);
  MESSAGE("4x2 even " << even.to_string() << "\n    balanced " << bal.to_string() << " ratio "
                      << bal.throughput / even.throughput);
  CHECK(bal.fits);
  CHECK(bal.throughput >= 1.15 * even.throughput);
  // Replication adds the stage gradient all-reduce: one replica's throughput is less than half.
  PipelineOptions one = o;
  one.replicas = 1;
  const PipelineEvaluation single = evaluate_pipeline(p, c, {0, 2, 8, 10}, bal.layers, one);
  CHECK(bal.throughput < 2 * single.throughput);
  CHECK(bal.throughput > single.throughput);
  CHECK_THROWS_AS(evaluate_pipeline(p, c, {0, 1, 2}, {24}, o), Error);
}
