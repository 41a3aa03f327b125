// Submesh shapes, logical views, placement (tiling) and data-parallel replication.
#include <doctest/doctest.h>

#include <algorithm>
#include <set>

#include "weft/cluster/cluster.hpp"
#include "weft/core/error.hpp"
#include "weft/pipeline/submesh.hpp"

using namespace weft;
using namespace weft::pipeline;

TEST_CASE("pipeline: submesh_shapes are Alpa's slices and whole nodes") {
  auto c = cluster::Cluster::preset("M8", 2);  // 2 nodes x 8 GPUs
  auto s = submesh_shapes(c);
  std::vector<SubmeshShape> want{{1, 1}, {1, 2}, {1, 4}, {1, 8}, {2, 8}};
  CHECK(s == want);
  CHECK(s[4].num_devices() == 16);
  CHECK(s[4].to_string() == "2x8");
  CHECK_THROWS_AS(SubmeshShape(0, 8), Error);
  auto single = submesh_shapes(cluster::Cluster::preset("M8", 1));
  CHECK(single.size() == 4);
}

TEST_CASE("pipeline: logical_mesh_shapes are every factor pair") {
  auto v = logical_mesh_shapes(SubmeshShape(2, 8));
  std::vector<std::vector<std::int64_t>> want{{1, 16}, {2, 8}, {4, 4}, {8, 2}, {16, 1}};
  CHECK(v == want);
  CHECK(logical_mesh_shapes(SubmeshShape(1, 1)) == std::vector<std::vector<std::int64_t>>{{1, 1}});
  // Brute force: count of divisors of 24 (1x... no: 3 nodes x 8).
  auto w = logical_mesh_shapes(SubmeshShape(3, 8));
  int divisors = 0;
  for (int a = 1; a <= 24; ++a) divisors += 24 % a == 0;
  CHECK(static_cast<int>(w.size()) == divisors);
  for (const auto& sh : w) CHECK(sh[0] * sh[1] == 24);
}

TEST_CASE("pipeline: assign_submeshes tiles the cluster exactly") {
  auto c = cluster::Cluster::preset("M8", 3);  // 24 devices
  // 1x8 + 1x4 + 1x2 + 1x1 + 1x1 + 1x8 = 24
  std::vector<SubmeshShape> st{{1, 1}, {1, 8}, {1, 4}, {1, 2}, {1, 1}, {1, 8}};
  auto p = assign_submeshes(c, st);
  REQUIRE(p.size() == st.size());
  std::set<int> all;
  for (std::size_t i = 0; i < p.size(); ++i) {
    CHECK(p[i].shape == st[i]);
    CHECK(static_cast<int>(p[i].device_ids.size()) == st[i].num_devices());
    std::set<int> nodes;
    for (int d : p[i].device_ids) {
      CHECK(all.insert(d).second);  // disjoint
      nodes.insert(c.node_of(d));
    }
    CHECK(static_cast<int>(nodes.size()) == st[i].nodes);  // a slice stays in one node
    // Slices are aligned: the first local index is a multiple of the slice size.
    if (st[i].nodes == 1 && st[i].devices_per_node < 8)
      CHECK(p[i].device_ids[0] % st[i].devices_per_node == 0);
  }
  CHECK(all.size() == 24);
  auto mesh = p[1].mesh();
  CHECK(mesh.shape() == std::vector<std::int64_t>{1, 8});
  CHECK(p[1].mesh({2, 4}).shape() == std::vector<std::int64_t>{2, 4});
  CHECK_THROWS_AS(p[1].mesh({3, 3}), Error);
  // Errors: wrong total, a shape that is not a submesh, slices that cannot pack.
  CHECK_THROWS_AS(assign_submeshes(c, {{1, 8}, {1, 8}}), Error);
  CHECK_THROWS_AS(assign_submeshes(c, {{1, 3}, {1, 8}, {1, 8}, {1, 5}}), Error);
  CHECK_THROWS_AS(assign_submeshes(c, {{2, 4}, {1, 8}, {1, 8}}), Error);
}

TEST_CASE("pipeline: replicate_pipeline fills the cluster with copies of one pipeline") {
  auto c = cluster::Cluster::preset("M8", 4);    // 32 devices
  std::vector<SubmeshShape> st{{1, 4}, {1, 4}};  // one pipeline of 8 devices
  auto r = replicate_pipeline(c, st);
  CHECK(r.replicas == 4);
  REQUIRE(r.placements.size() == 4);
  std::set<int> all;
  for (const auto& rep : r.placements) {
    REQUIRE(rep.size() == 2);
    for (const auto& sp : rep)
      for (int d : sp.device_ids) CHECK(all.insert(d).second);
  }
  CHECK(all.size() == 32);
  CHECK_THROWS_AS(replicate_pipeline(c, {{1, 8}, {1, 4}}), Error);  // 12 does not divide 32
}
