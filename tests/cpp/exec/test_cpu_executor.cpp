// Tests of the CPU reference executor: region copies against an element-by-element oracle, and
// the property test — random shapes, meshes, specs (strided and uneven), host maps, strategies
// and balancers, executed and compared with slicing the global tensor.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>

#include "weft/cluster/device_mesh.hpp"
#include "weft/core/error.hpp"
#include "weft/exec/cpu_executor.hpp"
#include "weft/reshard/decompose.hpp"
#include "weft/reshard/plan.hpp"
#include "weft/sharding/sharding_spec.hpp"

using namespace weft;
using namespace weft::exec;
using cluster::DeviceMesh;
using reshard::Region;
using sharding::ShardingSpec;

namespace {

bool sanitized() { return std::getenv("WEFT_SANITIZED") != nullptr; }

std::vector<int64_t> indices(const std::vector<reshard::Interval>& d) {
  std::vector<int64_t> v;
  for (const auto& iv : d)
    for (int64_t i = iv.begin; i < iv.end; ++i) v.push_back(i);
  return v;
}

// Global tensor whose every element's bytes encode its flat index (distinct for < 2^(8*es)).
std::vector<std::byte> make_global(const std::vector<int64_t>& shape, DType dt) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  const int es = dtype_size(dt);
  std::vector<std::byte> g(static_cast<std::size_t>(n * es));
  for (int64_t i = 0; i < n; ++i) {
    uint64_t v = static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ULL + 12345;
    std::memcpy(g.data() + i * es, &v, static_cast<std::size_t>(std::min(es, 8)));
  }
  return g;
}

Region random_strided_region(std::mt19937& rng, const std::vector<int64_t>& shape) {
  Region r;
  for (int64_t n : shape) {
    std::vector<reshard::Interval> d;
    for (int64_t i = 0; i < n; ++i)
      if (rng() % 3 != 0) {
        if (!d.empty() && d.back().end == i)
          d.back().end = i + 1;
        else
          d.push_back({i, i + 1});
      }
    if (d.empty()) d.push_back({0, 1});
    r.dims.push_back(d);
  }
  return r;
}

std::vector<int64_t> random_mesh_shape(std::mt19937& rng) {
  int nd = 1 + static_cast<int>(rng() % 3);
  std::vector<int64_t> m;
  int64_t total = 1;
  for (int i = 0; i < nd; ++i) {
    int64_t s = 1 + static_cast<int64_t>(rng() % 3);
    if (total * s > 8) s = 1;
    total *= s;
    m.push_back(s);
  }
  return m;
}

}  // namespace

TEST_CASE("copy_region, pack, unpack agree with an element-by-element copy") {
  std::mt19937 rng(3);
  for (int iter = 0; iter < 200; ++iter) {
    int rank = 1 + iter % 3;
    std::vector<int64_t> shape;
    for (int d = 0; d < rank; ++d) shape.push_back(1 + static_cast<int64_t>(rng() % 7));
    Region st = random_strided_region(rng, shape), dt = random_strided_region(rng, shape);
    Region reg = reshard::intersect(st, dt);
    if (reg.empty()) continue;
    const int es = 1 + static_cast<int>(rng() % 4);
    std::vector<std::byte> src(static_cast<std::size_t>(st.num_elements() * es));
    for (auto& b : src) b = static_cast<std::byte>(rng() & 0xff);
    std::vector<std::byte> dst(static_cast<std::size_t>(dt.num_elements() * es), std::byte{0}), want = dst;
    // Oracle: walk every element of the region, local offsets by position in the tiles' index lists.
    std::vector<std::vector<int64_t>> si, di, ri;
    for (int d = 0; d < rank; ++d) {
      si.push_back(indices(st.dims[d]));
      di.push_back(indices(dt.dims[d]));
      ri.push_back(indices(reg.dims[d]));
    }
    std::vector<std::size_t> c(rank, 0);
    while (true) {
      int64_t so = 0, dof = 0;
      for (int d = 0; d < rank; ++d) {
        int64_t g = ri[d][c[d]];
        so = so * static_cast<int64_t>(si[d].size()) +
             (std::find(si[d].begin(), si[d].end(), g) - si[d].begin());
        dof = dof * static_cast<int64_t>(di[d].size()) +
              (std::find(di[d].begin(), di[d].end(), g) - di[d].begin());
      }
      std::memcpy(want.data() + dof * es, src.data() + so * es, static_cast<std::size_t>(es));
      int d = rank - 1;
      while (d >= 0 && ++c[d] == ri[d].size()) c[d--] = 0;
      if (d < 0) break;
    }
    copy_region(src.data(), st, dst.data(), dt, reg, es);
    CHECK(dst == want);
    std::vector<std::byte> dst2(dst.size(), std::byte{0});
    unpack(pack(src.data(), st, reg, es), dst2.data(), dt, reg, es);
    CHECK(dst2 == want);
  }
  Region t{{{{0, 4}}}}, outside{{{{2, 6}}}};
  std::vector<std::byte> a(4), b(4);
  CHECK_THROWS_AS(copy_region(a.data(), t, b.data(), t, outside, 1), Error);
}

TEST_CASE("executor: Figure 2 task 1 moves the right bytes, staged and direct") {
  DeviceMesh ma({2, 2}, {0, 1, 2, 3}), mb({2, 2}, {4, 5, 6, 7});
  auto s1 = ShardingSpec::parse_alpa("S01R", {4, 4}, {2, 2}),
       s2 = ShardingSpec::parse_alpa("S0R", {4, 4}, {2, 2});
  reshard::TensorReshard t({4, 4}, DType::F32, s1, ma, s2, mb);
  auto p = reshard::make_problem({t}, reshard::HostMap::mesh_rows({ma, mb}));
  auto pl = reshard::plan(p);
  auto g = make_global({4, 4}, DType::F32);
  for (bool staged : {false, true}) {
    auto src = DistributedTensor::from_spec({4, 4}, DType::F32, s1, ma);
    auto dst = DistributedTensor::from_spec({4, 4}, DType::F32, s2, mb);
    src.scatter_from(g.data(), g.size());
    CHECK(src.mismatches(g.data(), g.size()) == 0);
    CHECK(dst.mismatches(g.data(), g.size()) == 4);
    ExecStats st = run(pl, {&src}, {&dst}, {staged});
    CHECK(dst.mismatches(g.data(), g.size()) == 0);
    // Each of the two receiver hosts takes in its 2x4 half (32 bytes) once over its NIC; each
    // source host sends its two rows once (broadcast to one host).
    CHECK(st.bytes_received.at(2) == 32);
    CHECK(st.bytes_received.at(3) == 32);
    CHECK(st.bytes_sent.at(0) == 32);
    CHECK(st.bytes_sent.at(1) == 32);
    CHECK(st.bytes_written == 64 * 2);  // every destination device gets its 32 bytes
    CHECK(dst.local_shape(4) == std::vector<int64_t>{2, 4});
  }
}

TEST_CASE("property: random reshards (strided, uneven, all strategies and balancers) match slicing") {
  std::mt19937 rng(2024);
  const int cases = sanitized() ? 250 : 1000;
  const reshard::Strategy strategies[] = {reshard::Strategy::Broadcast, reshard::Strategy::SendRecv,
                                          reshard::Strategy::LocalAllGather,
                                          reshard::Strategy::GlobalAllGather};
  const reshard::Balancer balancers[] = {reshard::Balancer::Best, reshard::Balancer::Naive,
                                         reshard::Balancer::LargestFirst, reshard::Balancer::RandomGreedy,
                                         reshard::Balancer::Dfs};
  const DType dtypes[] = {DType::F32, DType::F16, DType::I64, DType::Bool};
  int mismatched = 0, strided = 0, padded = 0, ran = 0;
  for (int i = 0; i < cases; ++i) {
    int rank = 1 + static_cast<int>(rng() % 3);
    std::vector<int64_t> shape;
    for (int d = 0; d < rank; ++d) shape.push_back(1 + static_cast<int64_t>(rng() % (rank == 3 ? 6 : 9)));
    auto pick_spec = [&](const std::vector<int64_t>& mesh) {
      sharding::EnumerateOptions eo;
      eo.partial = false;
      eo.allow_padding = rng() % 3 == 0;
      eo.strided = !eo.allow_padding;
      auto specs = sharding::enumerate_specs(shape, mesh, eo);
      REQUIRE(!specs.empty());
      return specs[rng() % specs.size()];
    };
    auto sm_shape = random_mesh_shape(rng), dm_shape = random_mesh_shape(rng);
    int64_t ns = 1, nd = 1;
    for (auto s : sm_shape) ns *= s;
    for (auto s : dm_shape) nd *= s;
    std::vector<int> pool(24);
    std::iota(pool.begin(), pool.end(), 0);
    std::shuffle(pool.begin(), pool.end(), rng);
    std::vector<int> sids(pool.begin(), pool.begin() + ns);
    // Destination devices usually disjoint from the source's, sometimes the same ones.
    std::vector<int> dids = rng() % 5 == 0 && nd <= ns
                                ? std::vector<int>(pool.begin(), pool.begin() + nd)
                                : std::vector<int>(pool.begin() + ns, pool.begin() + ns + nd);
    DeviceMesh sm(sm_shape, sids), dm(dm_shape, dids);
    ShardingSpec ss = pick_spec(sm_shape), ds = pick_spec(dm_shape);
    strided += !ss.is_block() || !ds.is_block();
    padded += ss.is_padded() || ds.is_padded();
    DType dt = dtypes[i % 4];
    reshard::TensorReshard t(shape, dt, ss, sm, ds, dm);
    std::vector<int> all(pool.begin(), pool.end());
    auto hosts = reshard::HostMap::devices_per_host(all, 1 + static_cast<int>(rng() % 4));
    auto p = reshard::make_problem({t}, hosts);
    reshard::PlanOptions o;
    o.strategy = strategies[i % 4];
    o.balancer = balancers[(i / 4) % 5];
    o.seed = static_cast<uint64_t>(i);
    o.dfs_node_limit = 2000;
    o.greedy_restarts = 4;
    auto pl = reshard::plan(p, o);
    auto g = make_global(shape, dt);
    auto src = DistributedTensor::from_spec(shape, dt, ss, sm);
    auto dst = DistributedTensor::from_spec(shape, dt, ds, dm);
    src.scatter_from(g.data(), g.size());
    ExecStats st = run(pl, {&src}, {&dst}, {i % 2 == 1});
    int bad = dst.mismatches(g.data(), g.size());
    if (bad) {
      CAPTURE(ss.to_string());
      CAPTURE(ds.to_string());
      CAPTURE(pl.summary());
      CHECK(bad == 0);
    }
    mismatched += bad != 0;
    CHECK(st.bytes_received == pl.nic_bytes_received());
    CHECK(st.bytes_sent == pl.nic_bytes_sent());
    ++ran;
  }
  CHECK(ran == cases);
  CHECK(mismatched == 0);
  CHECK(strided > cases / 10);  // the generator really covers strided and uneven layouts
  CHECK(padded > cases / 20);
  MESSAGE("property cases: " << ran << ", strided: " << strided << ", padded: " << padded);
}

TEST_CASE("executor: bad input is a clear error") {
  DeviceMesh ma({1, 2}, {0, 1}), mb({1, 2}, {2, 3});
  auto s = ShardingSpec::parse_alpa("S1R", {4, 4}, {1, 2});
  reshard::TensorReshard t({4, 4}, DType::F32, s, ma, s, mb);
  auto pl = reshard::plan(reshard::make_problem({t}, reshard::HostMap::mesh_rows({ma, mb})));
  auto src = DistributedTensor::from_spec({4, 4}, DType::F32, s, ma);
  auto wrong_dtype = DistributedTensor::from_spec({4, 4}, DType::F16, s, mb);
  CHECK_THROWS_WITH_AS(run(pl, {&src}, {&wrong_dtype}), doctest::Contains("dtype"), Error);
  auto s8 = ShardingSpec::parse_alpa("S1R", {4, 8}, {1, 2});
  auto wrong_shape = DistributedTensor::from_spec({4, 8}, DType::F32, s8, mb);
  CHECK_THROWS_WITH_AS(run(pl, {&src}, {&wrong_shape}), doctest::Contains("shape"), Error);
  auto missing = DistributedTensor::from_spec({4, 4}, DType::F32, s, ma);  // devices 0,1, not 2,3
  CHECK_THROWS_AS(run(pl, {&src}, {&missing}), Error);
  std::vector<std::byte> small(3);
  CHECK_THROWS_AS(src.scatter_from(small.data(), small.size()), Error);
  CHECK_THROWS_AS(DistributedTensor({4}, DType::F32, {{0, Region{{{{0, 5}}}}}}), Error);
  CHECK_THROWS_AS(run(pl, {}, {}), Error);
}
