// Cross-mesh resharding benchmarks:
//   table2      the paper's nine multi-host cases: simulated time of send/recv, local all-gather
//               (Alpa) and broadcast + load balance, each over the lower bound
//   one_to_many one sender GPU, 1 GiB, receiver meshes (1,1) .. (4,2)
//   random      1000 random joint problems (up to 8+8 hosts, 2-D/3-D meshes, uneven and strided
//               specs, 1-3 tensors): mean and worst ratio to the lower bound, planning time
//   throughput  CPU executor on a 256 MiB reshard vs a plain memcpy of the same bytes
// Usage: weft_bench_reshard [table2|one_to_many|random|throughput|all] [--json] [--cases N]
// Model: NIC bandwidth 1 GiB/s per host and direction, so times read in seconds per GiB.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>
#include <random>
#include <string>

#include "weft/cluster/device_mesh.hpp"
#include "weft/exec/cpu_executor.hpp"
#include "weft/reshard/decompose.hpp"
#include "weft/reshard/plan.hpp"
#include "weft/sharding/sharding_spec.hpp"

using namespace weft;
using namespace weft::reshard;
using cluster::DeviceMesh;
using sharding::ShardingSpec;

namespace {

bool g_json = false;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

void emit(const std::string& bench, const std::string& cs, const std::string& metric, double value,
          const std::string& unit, const std::string& baseline) {
  if (g_json)
    fmt::print("{{\"bench\":\"{}\",\"case\":\"{}\",\"metric\":\"{}\",\"value\":{},\"unit\":\"{}\",\"baseline\":\"{}\"}}\n",
               bench, cs, metric, value, unit, baseline);
}

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

ReshardPlan plan_with(const ReshardProblem& p, Strategy s, Balancer b, uint64_t seed = 0) {
  PlanOptions o;
  o.strategy = s;
  o.balancer = b;
  o.seed = seed;
  return plan(p, o);
}

void table2() {
  const std::vector<int64_t> shape{1024, 1024, 512};
  struct C {
    const char *src, *dst;
    std::vector<int64_t> sm, dm;
  };
  std::vector<C> cases = {{"S0RR", "S0RR", {2, 4}, {2, 4}},  {"RRR", "S0RR", {2, 4}, {2, 4}},
                          {"RS0R", "S0RR", {2, 4}, {2, 4}},  {"RS01R", "S01RR", {2, 4}, {2, 4}},
                          {"S1RR", "S0RR", {2, 4}, {2, 4}},  {"S0RR", "S0RR", {2, 4}, {3, 4}},
                          {"S1RR", "RRR", {1, 4}, {2, 4}},   {"RRR", "RRR", {2, 3}, {3, 2}},
                          {"RS0R", "RRS0", {2, 4}, {2, 4}}};
  if (!g_json)
    fmt::print("Table 2 (tensor 1024x1024x512 f32 = 2 GiB; NIC 1 GiB/s; times in s)\n{:<6}{:>6}{:>8}{:>10}{:>10}{:>10}"
               "{:>10}{:>9}{:>9}{:>9}{:>10}\n",
               "case", "tasks", "LB", "send/recv", "local-AG", "bcast+LB", "bcast+LF", "SR/LB", "LAG/LB", "BC/LB",
               "worst-seed");
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const C& c = cases[i];
    int64_t ns = c.sm[0] * c.sm[1], nd = c.dm[0] * c.dm[1];
    std::vector<int> si(ns), di(nd);
    std::iota(si.begin(), si.end(), 0);
    std::iota(di.begin(), di.end(), static_cast<int>(ns));
    DeviceMesh sm(c.sm, si), dm(c.dm, di);
    auto ss = ShardingSpec::parse_alpa(c.src, shape, c.sm);
    auto ds = i == 5 ? ShardingSpec::parse("S(0) R", shape, c.dm, true) : ShardingSpec::parse_alpa(c.dst, shape, c.dm);
    auto p = make_problem({TensorReshard(shape, DType::F32, ss, sm, ds, dm)}, HostMap::mesh_rows({sm, dm}, kGiB));
    double lb = lower_bound(p).value;
    double sr = plan_with(p, Strategy::SendRecv, Balancer::LargestFirst).completion_time;
    double lag = plan_with(p, Strategy::LocalAllGather, Balancer::LargestFirst).completion_time;
    double lf = plan_with(p, Strategy::Broadcast, Balancer::LargestFirst).completion_time;
    double bc = 0, worst = 0;
    for (uint64_t seed = 0; seed < 10; ++seed) {
      double t = plan_with(p, Strategy::Broadcast, Balancer::Best, seed).completion_time;
      if (seed == 0) bc = t;
      worst = std::max(worst, t / lb);
    }
    std::string cs = fmt::format("case{}", i + 1);
    if (!g_json)
      fmt::print("{:<6}{:>6}{:>8.3f}{:>10.3f}{:>10.3f}{:>10.3f}{:>10.3f}{:>9.3f}{:>9.3f}{:>9.3f}{:>10.3f}\n", cs,
                 p.tasks.size(), lb, sr, lag, bc, lf, sr / lb, lag / lb, bc / lb, worst);
    emit("reshard_table2", cs, "send_recv_ratio", sr / lb, "x", "lower_bound");
    emit("reshard_table2", cs, "local_allgather_ratio", lag / lb, "x", "lower_bound");
    emit("reshard_table2", cs, "broadcast_best_ratio", bc / lb, "x", "lower_bound");
    emit("reshard_table2", cs, "broadcast_largest_first_ratio", lf / lb, "x", "lower_bound");
    emit("reshard_table2", cs, "broadcast_best_worst_seed_ratio", worst, "x", "lower_bound");
  }
}

void one_to_many() {
  const std::vector<int64_t> shape{1024, 1024, 256};  // 1 GiB f32
  if (!g_json)
    fmt::print("\n1 -> m (1 GiB from one GPU; times in s)\n{:<8}{:>10}{:>10}{:>10}{:>10}{:>8}\n", "mesh", "send/recv",
               "local-AG", "global-AG", "bcast", "LB");
  for (auto [A, B] : std::vector<std::pair<int, int>>{{1, 1}, {1, 2}, {1, 3}, {1, 4}, {2, 2}, {3, 2}, {4, 2}}) {
    DeviceMesh sm({1, 1}, {0});
    std::vector<int> ids(A * B);
    std::iota(ids.begin(), ids.end(), 1);
    DeviceMesh dm({A, B}, ids);
    auto p = make_problem({TensorReshard(shape, DType::F32, ShardingSpec::replicated(shape, {1, 1}), sm,
                                         ShardingSpec::replicated(shape, {A, B}), dm)},
                          HostMap::mesh_rows({sm, dm}, kGiB));
    double lb = lower_bound(p).value;
    double sr = plan_with(p, Strategy::SendRecv, Balancer::Best).completion_time;
    double lag = plan_with(p, Strategy::LocalAllGather, Balancer::Best).completion_time;
    double gag = plan_with(p, Strategy::GlobalAllGather, Balancer::Best).completion_time;
    double bc = plan_with(p, Strategy::Broadcast, Balancer::Best).completion_time;
    std::string cs = fmt::format("({},{})", A, B);
    if (!g_json) fmt::print("{:<8}{:>10.3f}{:>10.3f}{:>10.3f}{:>10.3f}{:>8.3f}\n", cs, sr, lag, gag, bc, lb);
    emit("reshard_1tom", cs, "send_recv_ratio", sr / lb, "x", "lower_bound");
    emit("reshard_1tom", cs, "local_allgather_ratio", lag / lb, "x", "lower_bound");
    emit("reshard_1tom", cs, "global_allgather_ratio", gag / lb, "x", "lower_bound");
    emit("reshard_1tom", cs, "broadcast_ratio", bc / lb, "x", "lower_bound");
  }
}

// A random mesh over `hosts` hosts of `per` devices each, 2-D (hosts, per) or 3-D (h1, h2, per)
// or (hosts, a, b) with a*b = per.
DeviceMesh random_mesh(std::mt19937& rng, int hosts, int per, int first) {
  std::vector<int> ids(hosts * per);
  std::iota(ids.begin(), ids.end(), first);
  std::vector<int64_t> shape{hosts, per};
  if (rng() % 2) {
    if (hosts % 2 == 0 && hosts > 2 && rng() % 2)
      shape = {2, hosts / 2, per};
    else if (per % 2 == 0 && per > 2)
      shape = {hosts, 2, per / 2};
  }
  return DeviceMesh(shape, ids);
}

void random_cases(int n) {
  std::mt19937 rng(12345);
  const int per_choice[] = {1, 2, 4};
  const int64_t dims[] = {24, 48, 60, 64, 96, 100, 128};
  double sum = 0, worst = 0, sum_lf = 0, plan_time = 0, max_time = 0;
  int at_bound = 0;
  std::string worst_desc;
  for (int i = 0; i < n; ++i) {
    int hs = 1 + static_cast<int>(rng() % 8), hd = 1 + static_cast<int>(rng() % 8);
    int gs = per_choice[rng() % 3], gd = per_choice[rng() % 3];
    DeviceMesh sm = random_mesh(rng, hs, gs, 0), dm = random_mesh(rng, hd, gd, hs * gs);
    std::map<int, int> dh;
    for (int d = 0; d < hs * gs; ++d) dh[d] = d / gs;
    for (int d = 0; d < hd * gd; ++d) dh[hs * gs + d] = hs + d / gd;
    HostMap hm(dh, {}, kGiB);
    int ntensors = 1 + static_cast<int>(rng() % 3);
    std::vector<TensorReshard> ts;
    for (int k = 0; k < ntensors; ++k) {
      int rank = 2 + static_cast<int>(rng() % 2);
      std::vector<int64_t> shape;
      for (int d = 0; d < rank; ++d) shape.push_back(dims[rng() % 7]);
      auto pick = [&](const DeviceMesh& m) {
        sharding::EnumerateOptions eo;
        eo.partial = false;
        eo.allow_padding = rng() % 3 == 0;
        eo.strided = !eo.allow_padding;
        auto specs = sharding::enumerate_specs(shape, m.shape(), eo);
        return specs[rng() % specs.size()];
      };
      ts.emplace_back(shape, DType::F32, pick(sm), sm, pick(dm), dm);
    }
    auto p = make_problem(ts, hm);
    PlanOptions o;
    o.seed = static_cast<uint64_t>(i);
    o.dfs_node_limit = 20000;
    double t0 = now();
    auto pl = plan(p, o);
    double dt = now() - t0;
    plan_time += dt;
    max_time = std::max(max_time, dt);
    double r = pl.ratio();
    sum += r;
    at_bound += r <= 1 + 1e-9;
    sum_lf += plan_with(p, Strategy::Broadcast, Balancer::LargestFirst).ratio();
    if (r > worst) {
      worst = r;
      worst_desc = fmt::format("#{}: {} tasks, {}+{} hosts, {} tensors, {} -> {}, by {}", i, p.tasks.size(), hs, hd,
                               ntensors, sm.to_string(), dm.to_string(), pl.balancer_used);
    }
  }
  if (!g_json) {
    fmt::print("\nRandom joint problems ({} cases): broadcast + best balancer\n", n);
    fmt::print("  mean ratio to lower bound  {:.4f}   (largest-first alone: {:.4f})\n", sum / n, sum_lf / n);
    fmt::print("  at the bound               {} / {}\n", at_bound, n);
    fmt::print("  worst ratio                {:.4f}   {}\n", worst, worst_desc);
    fmt::print("  planning time              mean {:.2f} ms, max {:.1f} ms\n", 1e3 * plan_time / n, 1e3 * max_time);
  }
  emit("reshard_random", fmt::format("{}cases", n), "mean_ratio", sum / n, "x", "lower_bound");
  emit("reshard_random", fmt::format("{}cases", n), "worst_ratio", worst, "x", "lower_bound");
  emit("reshard_random", fmt::format("{}cases", n), "largest_first_mean_ratio", sum_lf / n, "x", "lower_bound");
  emit("reshard_random", fmt::format("{}cases", n), "mean_planning_time", 1e3 * plan_time / n, "ms", "");
}

void throughput() {
  // 256 MiB f32 (8192 x 8192): S01 R on a (2,4) mesh -> R S01 on another (2,4) mesh: 64 unit
  // tasks, every destination row a 4 KiB run gathered from 8 sources.
  const std::vector<int64_t> shape{8192, 8192};
  std::vector<int> si(8), di(8);
  std::iota(si.begin(), si.end(), 0);
  std::iota(di.begin(), di.end(), 8);
  DeviceMesh sm({2, 4}, si), dm({2, 4}, di);
  auto ss = ShardingSpec::parse_alpa("S01R", shape, {2, 4}), ds = ShardingSpec::parse_alpa("RS01", shape, {2, 4});
  auto p = make_problem({TensorReshard(shape, DType::F32, ss, sm, ds, dm)}, HostMap::mesh_rows({sm, dm}, kGiB));
  auto pl = plan(p);
  auto src = exec::DistributedTensor::from_spec(shape, DType::F32, ss, sm);
  auto dst = exec::DistributedTensor::from_spec(shape, DType::F32, ds, dm);
  std::vector<std::byte> g(static_cast<std::size_t>(8192) * 8192 * 4);
  for (std::size_t i = 0; i < g.size(); i += 4096) g[i] = static_cast<std::byte>(i >> 12);
  src.scatter_from(g.data(), g.size());
  const double bytes = static_cast<double>(g.size());
  auto best_of = [](int reps, auto&& f) {
    double b = 1e300;
    for (int r = 0; r < reps; ++r) {
      double t0 = now();
      f();
      b = std::min(b, now() - t0);
    }
    return b;
  };
  std::vector<std::byte> out(g.size());
  std::memset(out.data(), 1, out.size());
  double t_memcpy = best_of(5, [&] { std::memcpy(out.data(), g.data(), g.size()); });
  double t_direct = best_of(5, [&] { exec::run(pl, {&src}, {&dst}, {false}); });
  int bad = dst.mismatches(g.data(), g.size());
  double t_staged = best_of(5, [&] { exec::run(pl, {&src}, {&dst}, {true}); });
  bad += dst.mismatches(g.data(), g.size());
  auto gbs = [&](double t) { return bytes / t / 1e9; };
  if (!g_json) {
    fmt::print("\nCPU executor, 256 MiB reshard S01R (2,4) -> RS01 (2,4), 64 unit tasks, {} worker threads\n",
               pl.order.size() / 2);
    fmt::print("  memcpy            {:7.2f} GB/s\n", gbs(t_memcpy));
    fmt::print("  executor direct   {:7.2f} GB/s  ({:.0f}% of memcpy)\n", gbs(t_direct), 100 * t_memcpy / t_direct);
    fmt::print("  executor staged   {:7.2f} GB/s  ({:.0f}% of memcpy)\n", gbs(t_staged), 100 * t_memcpy / t_staged);
    fmt::print("  mismatching destination devices: {}\n", bad);
  }
  emit("reshard_exec", "256MiB", "memcpy_throughput", gbs(t_memcpy), "GB/s", "");
  emit("reshard_exec", "256MiB", "direct_throughput", gbs(t_direct), "GB/s", "memcpy");
  emit("reshard_exec", "256MiB", "direct_vs_memcpy", t_memcpy / t_direct, "x", "memcpy");
  emit("reshard_exec", "256MiB", "staged_vs_memcpy", t_memcpy / t_staged, "x", "memcpy");
}

}  // namespace

int main(int argc, char** argv) {
  std::string what = "all";
  int n = 1000;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--json")
      g_json = true;
    else if (a == "--cases" && i + 1 < argc)
      n = std::stoi(argv[++i]);
    else
      what = a;
  }
  if (what == "table2" || what == "all") table2();
  if (what == "one_to_many" || what == "all") one_to_many();
  if (what == "random" || what == "all") random_cases(n);
  if (what == "throughput" || what == "all") throughput();
  return 0;
}
