#include <doctest/doctest.h>

#include <set>

#include "weft/cluster/alpha_beta.hpp"
#include "weft/cluster/cluster.hpp"
#include "weft/cluster/device_mesh.hpp"
#include "weft/core/error.hpp"

using namespace weft::cluster;
using weft::DType;

TEST_CASE("presets carry the datasheet numbers and JSON round trips") {
  Cluster m8 = Cluster::preset("M8", 2);
  CHECK(m8.num_devices() == 16);
  CHECK(m8.num_nodes() == 2);
  CHECK(m8.node_of(9) == 1);
  CHECK(m8.device(3).spec.peak(DType::F16) == doctest::Approx(125e12));
  CHECK(m8.device(3).spec.memory_bytes == doctest::Approx(32.0 * (1 << 30)));
  CHECK(m8.nic(0).bandwidth == doctest::Approx(12.5e9));              // 100 Gb/s
  CHECK_THROWS_AS(m8.device(0).spec.peak(DType::BF16), weft::Error);  // V100 has no bf16
  for (const auto& name : Cluster::preset_names()) {
    Cluster c = Cluster::preset(name, 2);
    CHECK(Cluster::from_json(c.to_json()) == c);
  }
  CHECK(Cluster::preset("DGX-A100").nic(0).bandwidth == doctest::Approx(200e9));
  CHECK(Cluster::preset("H100").device(0).spec.peak(DType::BF16) == doctest::Approx(989e12));
  CHECK_THROWS_AS(Cluster::preset("TPUv4"), weft::Error);
  CHECK_THROWS_AS(Cluster::preset("M8", 0), weft::Error);
  CHECK_THROWS_AS(Cluster::from_json("{\"nodes\": [{\"preset\": \"M8\", \"count\": 0}]}"), weft::Error);
  CHECK_THROWS_AS(Cluster::from_json("not json"), weft::Error);
  CHECK(Cluster::from_json("{\"nodes\": [{\"preset\": \"M8\", \"count\": 2}]}") == m8);
}

TEST_CASE("heterogeneous concat: 4 nodes of M8 + 2 nodes of P100") {
  Cluster h = Cluster::concat(Cluster::preset("M8", 4), Cluster::preset("P100", 2));
  CHECK(h.num_devices() == 48);
  CHECK_FALSE(h.homogeneous());
  CHECK(h.device(32).spec.kind == "P100-PCIE-16GB");
  CHECK(h.node_of(47) == 5);
  CHECK(h.to_string() == "Cluster(4x M8[8x V100-SXM2-32GB] + 2x P100[8x P100-PCIE-16GB])");
  CHECK(h.devices_of_node(5).front() == 40);
}

TEST_CASE("DeviceMesh: views, coords, iota form, errors") {
  DeviceMesh m = DeviceMesh::iota({2, 8});
  CHECK(m.size() == 16);
  CHECK(m.device_at({1, 3}) == 11);
  CHECK(m.coord_of(11) == std::vector<int64_t>{1, 3});
  CHECK(m.is_iota());
  CHECK(m.to_string() == "Mesh[x=2,y=8](0..15)");
  DeviceMesh v = m.reshape({4, 4});
  CHECK(v.device_at({3, 0}) == 12);
  DeviceMesh t({2, 2}, {0, 2, 1, 3});  // transposed iota
  CHECK(t.is_iota());
  CHECK(t.iota_perm() == std::vector<int>{1, 0});
  DeviceMesh irr({2, 2}, {5, 0, 9, 3});
  CHECK_FALSE(irr.is_iota());
  CHECK(irr.to_string() == "Mesh[x=2,y=2]{5,0,9,3}");
  CHECK(m.group_along({1, 3}, 0) == std::vector<int>{3, 11});
  CHECK(std::hash<DeviceMesh>{}(m) == std::hash<DeviceMesh>{}(DeviceMesh::iota({2, 8})));
  CHECK_FALSE(m == v);
  CHECK_THROWS_AS(DeviceMesh({2, 2}, {0, 1, 1, 2}), weft::Error);
  CHECK_THROWS_AS(DeviceMesh({2, 2}, {0, 1, 2}), weft::Error);
  CHECK_THROWS_AS(m.coord_of(99), weft::Error);
  CHECK_THROWS_AS(m.device_at({2, 0}), weft::Error);
}

TEST_CASE("axis_links: intra-node axis vs node-crossing axis with NIC sharing") {
  Cluster c = Cluster::preset("M8", 2);
  auto L = axis_links(c, DeviceMesh::iota({2, 8}));
  // axis 0 crosses nodes: 8 groups (one per GPU), each pushes one flow through each NIC.
  CHECK(L[0].crosses_nodes);
  CHECK(L[0].nodes_on_axis == 2);
  CHECK(L[0].devices_per_node_on_axis == 1);
  CHECK(L[0].inter_beta == doctest::Approx(8 / 12.5e9));
  CHECK(L[0].intra_beta == 0);
  CHECK_FALSE(L[1].crosses_nodes);
  CHECK(L[1].beta == doctest::Approx(1 / 130e9));
  CHECK(L[1].inter_beta == 0);
  // 1x16: one group of 16 spans 2 nodes with 8 on each; one flow per NIC.
  auto F = axis_links(c, DeviceMesh::iota({16}));
  CHECK(F[0].devices_per_node_on_axis == 8);
  CHECK(F[0].inter_beta == doctest::Approx(1 / 12.5e9));
  CHECK(F[0].beta == doctest::Approx(1 / 12.5e9));
  // 4x4: axis 0 groups {0,4,8,12}: m=2, g=2; 4 groups touch each node.
  auto Q = axis_links(c, DeviceMesh::iota({4, 4}));
  CHECK(Q[0].devices_per_node_on_axis == 2);
  CHECK(Q[0].nodes_on_axis == 2);
  CHECK(Q[0].inter_beta == doctest::Approx(4 / 12.5e9));
  CHECK_THROWS_AS(axis_links(Cluster::preset("M8", 1), DeviceMesh::iota({2, 8})), weft::Error);
}

TEST_CASE("collective closed forms (1e-9 relative)") {
  const double a = 5e-6, b = 1 / 100e9, B = 1 << 26;
  for (int n : {1, 2, 4, 8}) {
    AxisLink l = flat_link(n, a, b);
    CHECK(all_reduce_time(l, B) ==
          doctest::Approx(n > 1 ? 2.0 * (n - 1) / n * B * b + 2.0 * (n - 1) * a : 0).epsilon(1e-9));
    CHECK(all_gather_time(l, B) ==
          doctest::Approx(n > 1 ? (n - 1.0) / n * B * b + (n - 1.0) * a : 0).epsilon(1e-9));
    CHECK(reduce_scatter_time(l, B) == doctest::Approx(all_gather_time(l, B)).epsilon(1e-9));
    CHECK(all_to_all_time(l, B) ==
          doctest::Approx(n > 1 ? (n - 1.0) / n * B * b + (n - 1.0) * a : 0).epsilon(1e-9));
  }
  // Hierarchical, 4x4 view of 2x M8: m = 2, g = 2.
  auto Q = axis_links(Cluster::preset("M8", 2), DeviceMesh::iota({4, 4}));
  const AxisLink& h = Q[0];
  const double bi = 1 / 130e9, bo = 4 / 12.5e9, ai = 5e-6, ao = 10e-6;
  CHECK(all_reduce_time(h, B) ==
        doctest::Approx(2 * 0.5 * B * bi + 2 * ai + 2 * 0.5 * B * bo + 2 * ao).epsilon(1e-9));
  CHECK(all_gather_time(h, B) == doctest::Approx(0.5 * B * bi + ai + 0.5 * B * bo + ao).epsilon(1e-9));
  CHECK(all_to_all_time(h, B) ==
        doctest::Approx(1.0 / 4 * B * bi + 2.0 * 2 / 4 * B * bo + 3 * ao).epsilon(1e-9));
  CHECK(p2p_time(h, B) == doctest::Approx(ao + B * bo).epsilon(1e-9));
  CHECK_THROWS_AS(all_reduce_time(h, -1), weft::Error);
}
