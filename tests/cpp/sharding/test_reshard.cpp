// Resharding plans executed by an in-memory data mover on real arrays: each device keeps its
// local buffer (local shape, addressed through local_index/global_index); a collective along axis
// a only reads buffers of devices in the same axis-a group, and only elements those devices hold.
// The final buffers must equal what spec B says each device holds (sums of partial terms
// included). Also: reshape propagation (Rhino's [4,2] -> [8] and the fused QKV example).
#include <doctest/doctest.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <map>
#include <random>

#include "mesh_coords.hpp"
#include "weft/cluster/alpha_beta.hpp"
#include "weft/cluster/cluster.hpp"
#include "weft/core/error.hpp"
#include "weft/sharding/reshape.hpp"
#include "weft/sharding/reshard.hpp"
#include "weft/sharding/tile.hpp"

using namespace weft::sharding;
using weft::cluster::AxisLink;

namespace {

using Coord = std::vector<int64_t>;

std::vector<Coord> coords_of(const std::vector<int64_t>& mesh) { return weft::test::mesh_coords(mesh); }

struct Dist {  // per device: local buffer in row-major local order
  ShardingSpec spec;
  std::map<Coord, std::vector<double>> buf;
};

int64_t flat(const std::vector<int64_t>& shape, const std::vector<int64_t>& idx) {
  int64_t f = 0;
  for (std::size_t d = 0; d < shape.size(); ++d) f = f * shape[d] + idx[d];
  return f;
}

// Visits every global multi-index of the device's tile with its local flat offset.
void for_tile(const ShardingSpec& s, const Coord& c,
              const std::function<void(const std::vector<int64_t>&, int64_t)>& f) {
  Tile t = tile_of(s, c);
  auto ls = t.local_shape();
  std::vector<std::vector<int64_t>> idx;
  for (int d = 0; d < s.rank(); ++d) idx.push_back(t.indices(d));
  std::vector<int64_t> li(static_cast<std::size_t>(s.rank()), 0), g(static_cast<std::size_t>(s.rank()));
  std::function<void(int)> rec = [&](int d) {
    if (d == s.rank()) {
      f(g, flat(ls, li));
      return;
    }
    for (std::size_t i = 0; i < idx[static_cast<std::size_t>(d)].size(); ++i) {
      li[static_cast<std::size_t>(d)] = static_cast<int64_t>(i);
      g[static_cast<std::size_t>(d)] = idx[static_cast<std::size_t>(d)][i];
      rec(d + 1);
    }
  };
  rec(0);
}

// Reads element g from a device through local_index (-1 => not held).
bool read(const Dist& x, const Coord& c, const std::vector<int64_t>& g, double* out) {
  std::vector<int64_t> li;
  for (int d = 0; d < x.spec.rank(); ++d) {
    int64_t l = local_index(x.spec, c, d, g[static_cast<std::size_t>(d)]);
    if (l < 0) return false;
    li.push_back(l);
  }
  *out = x.buf.at(c)[static_cast<std::size_t>(flat(tile_of(x.spec, c).local_shape(), li))];
  return true;
}

double identity(ReduceKind r) {
  return r == ReduceKind::Sum ? 0.0 : -std::numeric_limits<double>::infinity();
}

// Distributes a full tensor under spec s; partial terms are random and sum (max) to the value.
Dist scatter(const ShardingSpec& s, const std::vector<double>& full, std::mt19937& rng) {
  Dist x{s, {}};
  std::uniform_real_distribution<double> u(-1, 1);
  const ReduceKind red = s.reduce_kind().value_or(ReduceKind::Sum);
  for (const auto& c : coords_of(s.mesh_shape())) {
    Tile t = tile_of(s, c);
    std::vector<double> b(static_cast<std::size_t>(t.num_elements()));
    for_tile(s, c, [&](const std::vector<int64_t>& g, int64_t l) {
      const double v = full[static_cast<std::size_t>(flat(s.tensor_shape(), g))];
      if (!t.partial) {
        b[static_cast<std::size_t>(l)] = v;
      } else if (red == ReduceKind::Max) {
        b[static_cast<std::size_t>(l)] = t.partial_index == 0 ? v : v - 1 - std::abs(u(rng));
      } else {  // term i: deterministic pseudo-random pieces whose sum is v
        std::mt19937 r2(static_cast<unsigned>(flat(s.tensor_shape(), g) * 7919 + 13));
        double acc = 0, mine = 0;
        for (int i = 0; i < t.partial_count; ++i) {
          double piece =
              i + 1 < t.partial_count ? std::uniform_real_distribution<double>(-1, 1)(r2) : v - acc;
          acc += piece;
          if (i == t.partial_index) mine = piece;
        }
        b[static_cast<std::size_t>(l)] = mine;
      }
    });
    x.buf[c] = std::move(b);
  }
  return x;
}

// Executes one step; throws if the data a device needs is not inside its axis group.
Dist execute(const Dist& x, const ReshardStep& st) {
  REQUIRE(st.from == x.spec);
  Dist y{st.to, {}};
  const ReduceKind red = st.from.reduce_kind().value_or(st.to.reduce_kind().value_or(ReduceKind::Sum));
  for (const auto& c : coords_of(st.to.mesh_shape())) {
    Tile t = tile_of(st.to, c);
    std::vector<double> b(static_cast<std::size_t>(t.num_elements()));
    std::vector<Coord> group;
    for (int64_t i = 0; i < st.to.mesh_shape()[static_cast<std::size_t>(st.axis)]; ++i) {
      Coord q = c;
      q[static_cast<std::size_t>(st.axis)] = i;
      group.push_back(q);
    }
    for_tile(st.to, c, [&](const std::vector<int64_t>& g, int64_t l) {
      double v = 0;
      switch (st.kind) {
        case CollectiveKind::LocalSlice: REQUIRE(read(x, c, g, &v)); break;
        case CollectiveKind::LocalPartial:
          REQUIRE(read(x, c, g, &v));
          if (c[static_cast<std::size_t>(st.axis)] != 0 && red == ReduceKind::Sum) v = 0;
          break;
        case CollectiveKind::AllGather:
        case CollectiveKind::AllToAll: {
          bool found = false;
          for (const auto& q : group) found = found || read(x, q, g, &v);
          REQUIRE(found);
          break;
        }
        case CollectiveKind::AllReduce:
        case CollectiveKind::ReduceScatter: {
          v = identity(red);
          for (const auto& q : group) {
            double w = 0;
            REQUIRE(read(x, q, g, &w));
            v = red == ReduceKind::Sum ? v + w : std::max(v, w);
          }
          break;
        }
      }
      b[static_cast<std::size_t>(l)] = v;
    });
    y.buf[c] = std::move(b);
  }
  return y;
}

// Checks device buffers against the full tensor: non-partial exact; partial reduce to the value.
void check_holds(const Dist& x, const std::vector<double>& full) {
  const ReduceKind red = x.spec.reduce_kind().value_or(ReduceKind::Sum);
  const auto pa = x.spec.partial_axes();
  for (const auto& c : coords_of(x.spec.mesh_shape())) {
    bool lead = true;
    for (int a : pa) lead = lead && c[static_cast<std::size_t>(a)] == 0;
    if (!lead) continue;
    for_tile(x.spec, c, [&](const std::vector<int64_t>& g, int64_t) {
      // reduce over all devices that differ from c only on partial axes
      double acc = identity(red);
      std::function<void(std::size_t, Coord)> rec = [&](std::size_t i, Coord q) {
        if (i == pa.size()) {
          double w = 0;
          REQUIRE(read(x, q, g, &w));
          acc = red == ReduceKind::Sum ? acc + w : std::max(acc, w);
          return;
        }
        for (int64_t j = 0; j < x.spec.mesh_shape()[static_cast<std::size_t>(pa[i])]; ++j) {
          q[static_cast<std::size_t>(pa[i])] = j;
          rec(i + 1, q);
        }
      };
      if (pa.empty()) {
        REQUIRE(read(x, c, g, &acc));
      } else {
        rec(0, c);
      }
      CHECK(acc ==
            doctest::Approx(full[static_cast<std::size_t>(flat(x.spec.tensor_shape(), g))]).epsilon(1e-12));
    });
  }
}

std::vector<AxisLink> links_for(const std::vector<int64_t>& mesh) {
  std::vector<AxisLink> l;
  for (std::size_t a = 0; a < mesh.size(); ++a)
    l.push_back(weft::cluster::flat_link(static_cast<int>(mesh[a]), 1e-5 * static_cast<double>(a + 1),
                                         1e-9 * static_cast<double>(a + 1)));
  return l;
}

}  // namespace

TEST_CASE("every resharding plan, executed on real arrays, turns A into B exactly") {
  std::mt19937 rng(7);
  const bool san = std::getenv("WEFT_SANITIZED") != nullptr;
  struct Case {
    std::vector<int64_t> shape, mesh;
  };
  const std::vector<Case> cases{
      {{8, 4}, {2, 2}}, {{12}, {2, 3}}, {{4, 6, 4}, {2, 2}}, {{8, 8}, {4}}, {{4, 4, 2}, {2, 1, 2}}};
  int executed = 0;
  for (const auto& cs : cases) {
    auto all = enumerate_specs(cs.shape, cs.mesh);
    ReshardPlanner planner(links_for(cs.mesh), 4);
    std::vector<double> full(1);
    int64_t n = 1;
    for (int64_t x : cs.shape) n *= x;
    full.resize(static_cast<std::size_t>(n));
    for (auto& v : full) v = std::uniform_real_distribution<double>(-3, 3)(rng);
    const int pairs = san ? 15 : 80;
    for (int i = 0; i < pairs; ++i) {
      const ShardingSpec& A = all[rng() % all.size()];
      const ShardingSpec& B = all[rng() % all.size()];
      CAPTURE(A.to_string());
      CAPTURE(B.to_string());
      const ReshardPlan& p = planner.plan(A, B);
      Dist x = scatter(A, full, rng);
      double t = 0;
      for (const auto& st : p.steps) {
        x = execute(x, st);
        t += st.time;
      }
      CHECK(x.spec == B);
      check_holds(x, full);
      CHECK(t == doctest::Approx(p.time));
      if (A == B) CHECK(p.steps.empty());
      ++executed;
    }
  }
  CHECK(executed > 0);
}

TEST_CASE("packed search and spec-by-spec search find the same optimal times") {
  std::mt19937 rng(3);
  const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> cases{
      {{8, 8}, {2, 2}}, {{16, 4}, {2, 2}}, {{8, 12}, {2, 3}}, {{8, 4, 4}, {2, 1, 2}}, {{4, 8}, {4}}};
  for (const auto& [shape, mesh] : cases) {
    auto specs = enumerate_specs(shape, mesh);
    ReshardOptions slow;
    slow.packed = false;
    ReshardPlanner pf(links_for(mesh), 4), ps(links_for(mesh), 4, slow);
    for (int i = 0; i < 40; ++i) {
      const auto& a = specs[rng() % specs.size()];
      const auto& b = specs[rng() % specs.size()];
      CAPTURE(a.to_string());
      CAPTURE(b.to_string());
      const auto& x = pf.plan(a, b);
      const auto& y = ps.plan(a, b);
      CHECK(x.time == doctest::Approx(y.time).epsilon(1e-12));
      CHECK(x.steps.size() == y.steps.size());
    }
  }
}

TEST_CASE("resharding picks the textbook collectives and their costs") {
  auto links = links_for({4});
  const auto& l = links[0];
  auto S = [](const char* t) { return ShardingSpec::parse(t, {64, 32}, {4}); };
  ReshardPlanner p(links, 2);
  const double B_full = 64 * 32 * 2.0, B_q = B_full / 4;
  // P -> R: one all-reduce (cheaper than reduce-scatter + all-gather only in latency terms: equal β).
  auto ar = p.plan(S("P(sum)"), S("R"));
  REQUIRE(ar.steps.size() == 1);
  CHECK(ar.steps[0].kind == CollectiveKind::AllReduce);
  CHECK(ar.time == doctest::Approx(weft::cluster::all_reduce_time(l, B_full)).epsilon(1e-9));
  auto rs = p.plan(S("P(sum)"), S("S(1)"));
  REQUIRE(rs.steps.size() == 1);
  CHECK(rs.steps[0].kind == CollectiveKind::ReduceScatter);
  auto ag = p.plan(S("S(0)"), S("R"));
  REQUIRE(ag.steps.size() == 1);
  CHECK(ag.steps[0].kind == CollectiveKind::AllGather);
  CHECK(ag.time == doctest::Approx(3.0 / 4 * B_full * l.beta + 3 * l.alpha).epsilon(1e-9));
  auto a2a = p.plan(S("S(0)"), S("S(1,1)"));  // block rows -> cyclic columns
  REQUIRE(a2a.steps.size() == 1);
  CHECK(a2a.steps[0].kind == CollectiveKind::AllToAll);
  CHECK(a2a.time == doctest::Approx(3.0 / 4 * B_q * l.beta + 3 * l.alpha).epsilon(1e-9));
  auto sl = p.plan(S("R"), S("S(0,2)"));
  REQUIRE(sl.steps.size() == 1);
  CHECK(sl.time == 0);
  CHECK(p.cache_size() == 5);
  p.plan(S("R"), S("S(0,2)"));
  CHECK(p.searches() == 5);  // cached
  CHECK_THROWS_AS(p.plan(S("R"), ShardingSpec::parse("R", {64, 32}, {2, 2})), weft::Error);
}

TEST_CASE("reshape propagation: Rhino's [4,2]->[8] and fused QKV") {
  // [4,2] sharded on dim 1 over 2 devices, reshaped to [8]: cyclic, no communication.
  auto r = propagate_reshape(ShardingSpec::parse("S(1)", {4, 2}, {2}), {8});
  REQUIRE(r.ok());
  CHECK(*r.spec == ShardingSpec::parse("S(0,1)", {8}, {2}));
  // Element sets agree through the flat index.
  for (int64_t c = 0; c < 2; ++c) {
    auto in = tile_of(ShardingSpec::parse("S(1)", {4, 2}, {2}), {c});
    std::vector<int64_t> flat_in;
    for (int64_t i : in.indices(0))
      for (int64_t j : in.indices(1)) flat_in.push_back(i * 2 + j);
    std::sort(flat_in.begin(), flat_in.end());
    CHECK(tile_of(*r.spec, {c}).indices(0) == flat_in);
  }
  // Fused QKV [h, 3h] viewed as [h, 3, h]; Megatron shards heads (block on the last dim).
  const int64_t h = 16, k = 4;
  auto q = propagate_reshape(ShardingSpec::parse("R S(2)", {h, 3, h}, {2, k}), {h, 3 * h});
  REQUIRE(q.ok());
  CHECK(q.spec->placement(1) == Placement::shard(1, h / k));
  auto cols = tile_of(*q.spec, {0, 1}).indices(1);  // device 1: Q, K, V columns [4,8) of each
  CHECK(cols == std::vector<int64_t>{4, 5, 6, 7, 20, 21, 22, 23, 36, 37, 38, 39});
  // Not possible: [8] block on 4 -> [2,4] needs the digit (2, radix 4) to straddle dims.
  auto no = propagate_reshape(ShardingSpec::parse("S(0)", {8}, {4}), {2, 4});
  CHECK_FALSE(no.ok());
  CHECK(no.reason.find("straddles") != std::string::npos);
  CHECK_THROWS_AS(propagate_reshape(ShardingSpec::parse("S(0)", {8}, {4}), {3, 3}), weft::Error);
}

TEST_CASE("reshape propagation agrees with brute force on random shapes") {
  std::mt19937 rng(99);
  int ok = 0, total = 0;
  const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> shapes{
      {{4, 6}, {24}},      {{4, 6}, {2, 12}}, {{4, 6}, {8, 3}},
      {{2, 3, 4}, {6, 4}}, {{24}, {2, 3, 4}}, {{6, 4}, {4, 6}}};
  for (const auto& [in, out] : shapes) {
    for (const auto& s : enumerate_specs(in, {2, 2})) {
      auto r = propagate_reshape(s, out);
      ++total;
      // Brute force: does some spec on `out` hold, on every device, exactly the same flat elements?
      auto flat_set = [](const ShardingSpec& x, const std::vector<int64_t>& c) {
        Tile t = tile_of(x, c);
        std::vector<int64_t> f{0};
        for (int d = 0; d < x.rank(); ++d) {
          std::vector<int64_t> nf;
          for (int64_t p : f)
            for (int64_t i : t.indices(d))
              nf.push_back(p * x.tensor_shape()[static_cast<std::size_t>(d)] + i);
          f = nf;
        }
        std::sort(f.begin(), f.end());
        return f;
      };
      bool exists = false;
      for (const auto& o : enumerate_specs(out, {2, 2})) {
        bool same = o.partial_axes() == s.partial_axes();
        for (int a = 0; a < 2 && same; ++a)
          if ((o.placement(a).kind == Placement::Replicate) != (s.placement(a).kind == Placement::Replicate))
            same = false;
        for (int64_t c0 = 0; c0 < 2 && same; ++c0)
          for (int64_t c1 = 0; c1 < 2 && same; ++c1) same = flat_set(o, {c0, c1}) == flat_set(s, {c0, c1});
        if (same) {
          exists = true;
          if (r.ok()) CHECK(*r.spec == o);
        }
      }
      CHECK(exists == r.ok());
      ok += r.ok();
    }
  }
  CHECK(ok > 0);
  CHECK(ok < total);
}
