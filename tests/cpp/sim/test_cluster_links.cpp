#include <doctest/doctest.h>

#include "weft/cluster/cluster.hpp"
#include "weft/core/error.hpp"
#include "weft/sim/simulator.hpp"

using namespace weft;

TEST_CASE("links_from_cluster: intra-node link inside a node, bottleneck NIC across nodes") {
  cluster::NodeSpec a;
  a.name = "a";
  a.num_devices = 2;
  a.device.kind = "gpu";
  a.device.peak_flops[DType::F32] = 1e12;
  a.device.memory_bytes = 1e9;
  a.device.memory_bandwidth = 1e11;
  a.intra = {100e9, 1e-6};
  a.nic = {10e9, 5e-6};
  cluster::NodeSpec b = a;
  b.name = "b";
  b.nic = {4e9, 8e-6};
  cluster::Cluster c({a, b});
  auto links = sim::links_from_cluster(c, {0, 1, 2, 3});
  REQUIRE(links.size() == 3);
  CHECK(links[0].bandwidth == 100e9);
  CHECK(links[0].latency == 1e-6);
  CHECK(links[1].bandwidth == 4e9);  // node a -> node b: the slower NIC
  CHECK(links[1].latency == 8e-6);
  CHECK(links[2].bandwidth == 100e9);
  auto w = sim::links_from_cluster(c, {0, 2}, cluster::BandwidthTrace::constant(0.5), true);
  REQUIRE(w.size() == 2);
  CHECK(w[1].bandwidth == 4e9);
  CHECK(w[1].trace == cluster::BandwidthTrace::constant(0.5));
  CHECK_THROWS_AS(sim::links_from_cluster(c, {0, 9}), weft::Error);
  // usable by the simulator
  sim::Pipeline p;
  p.stages.push_back(sim::StageSpec{.forward_time = 1e-3, .backward_time = 2e-3, .activation_bytes = 4e6});
  p.links = links;
  auto r = sim::simulate(schedule::one_f_one_b(4, 4), p);
  CHECK_FALSE(r.deadlock);
  CHECK(r.step_time > 7 * 3e-3);
}
