// Submesh shapes (Alpa §5.2) and their placement on a cluster.
//
// Alpa restricts a stage's submesh to (1, 2^k) slices of one node (2^k < G) or (n, G) whole
// nodes, because such a set of submeshes can always tile an N x G cluster when their sizes add up
// to N·G (with G a power of two): placing the whole-node submeshes first and then the slices in
// descending size, first fit, each slice lands on an offset that is a multiple of its size (the
// buddy argument: every size divides every larger one), so no node is left fragmented.
#include "weft/pipeline/submesh.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "weft/core/error.hpp"

namespace weft::pipeline {

SubmeshShape::SubmeshShape(int n, int m) : nodes(n), devices_per_node(m) {
  WEFT_CHECK(n >= 1 && m >= 1, "SubmeshShape {}x{}: both sizes must be >= 1", n, m);
}

std::string SubmeshShape::to_string() const { return fmt::format("{}x{}", nodes, devices_per_node); }

namespace {
int devices_per_node_of(const cluster::Cluster& c) {
  WEFT_CHECK(c.num_nodes() >= 1, "submesh shapes: the cluster has no node");
  int g = c.nodes()[0].num_devices;
  for (const auto& n : c.nodes())
    WEFT_CHECK(n.num_devices == g,
               "submesh shapes: nodes have different device counts ({} and {}); Alpa's submeshes need "
               "equal nodes",
               g, n.num_devices);
  return g;
}
}  // namespace

std::vector<SubmeshShape> submesh_shapes(const cluster::Cluster& c) {
  const int g = devices_per_node_of(c);
  std::vector<SubmeshShape> out;
  for (int m = 1; m < g; m *= 2) out.emplace_back(1, m);
  for (int n = 1; n <= c.num_nodes(); ++n) out.emplace_back(n, g);
  return out;
}

std::vector<std::vector<std::int64_t>> logical_mesh_shapes(const SubmeshShape& s) {
  const std::int64_t d = s.num_devices();
  std::vector<std::vector<std::int64_t>> out;
  for (std::int64_t a = 1; a <= d; ++a)
    if (d % a == 0) out.push_back({a, d / a});
  return out;
}

cluster::DeviceMesh SubmeshPlacement::mesh(std::vector<std::int64_t> logical_shape) const {
  if (logical_shape.empty()) logical_shape = {shape.nodes, shape.devices_per_node};
  std::int64_t prod = 1;
  for (auto x : logical_shape) {
    WEFT_CHECK(x >= 1, "submesh {}: logical shape has a non-positive size", shape.to_string());
    prod *= x;
  }
  WEFT_CHECK(prod == static_cast<std::int64_t>(device_ids.size()),
             "submesh {}: logical shape of {} devices for {} devices", shape.to_string(), prod,
             device_ids.size());
  return cluster::DeviceMesh(std::move(logical_shape), device_ids);
}

std::string SubmeshPlacement::to_string() const {
  std::string ids;
  for (std::size_t i = 0; i < device_ids.size(); ++i) ids += (i ? "," : "") + std::to_string(device_ids[i]);
  return fmt::format("Submesh({} on {{{}}})", shape.to_string(), ids);
}

std::vector<SubmeshPlacement> assign_submeshes(const cluster::Cluster& c,
                                               const std::vector<SubmeshShape>& stages) {
  const int g = devices_per_node_of(c);
  const int nn = c.num_nodes();
  WEFT_CHECK(!stages.empty(), "assign_submeshes: no stage");
  long total = 0;
  for (const auto& s : stages) {
    bool whole = s.devices_per_node == g && s.nodes >= 1 && s.nodes <= nn;
    bool slice =
        s.nodes == 1 && s.devices_per_node < g && (s.devices_per_node & (s.devices_per_node - 1)) == 0;
    WEFT_CHECK(whole || slice,
               "assign_submeshes: {} is not a submesh of this cluster ({} nodes x {}): whole nodes n x {} "
               "or a power-of-two slice 1 x m < {}",
               s.to_string(), nn, g, g, g);
    total += s.num_devices();
  }
  WEFT_CHECK(total == c.num_devices(), "assign_submeshes: the stages use {} devices, the cluster has {}",
             total, c.num_devices());
  std::vector<SubmeshPlacement> out(stages.size());
  int next_node = 0;
  for (std::size_t i = 0; i < stages.size(); ++i) {
    if (stages[i].devices_per_node != g) continue;
    out[i].shape = stages[i];
    for (int n = 0; n < stages[i].nodes; ++n) {
      auto ids = c.devices_of_node(next_node + n);
      out[i].device_ids.insert(out[i].device_ids.end(), ids.begin(), ids.end());
    }
    next_node += stages[i].nodes;
  }
  std::vector<std::size_t> slices;
  for (std::size_t i = 0; i < stages.size(); ++i)
    if (stages[i].devices_per_node != g) slices.push_back(i);
  std::stable_sort(slices.begin(), slices.end(), [&](std::size_t a, std::size_t b) {
    return stages[a].devices_per_node > stages[b].devices_per_node;
  });
  std::vector<int> used(nn, 0);
  for (std::size_t i : slices) {
    const int m = stages[i].devices_per_node;
    int node = next_node;
    while (node < nn && g - used[node] < m) ++node;
    WEFT_CHECK(node < nn,
               "assign_submeshes: the slices do not pack into the {} remaining nodes of {} devices",
               nn - next_node, g);
    auto ids = c.devices_of_node(node);
    out[i].shape = stages[i];
    out[i].device_ids.assign(ids.begin() + used[node], ids.begin() + used[node] + m);
    used[node] += m;
  }
  return out;
}

ReplicatedPipeline replicate_pipeline(const cluster::Cluster& c, const std::vector<SubmeshShape>& stages) {
  WEFT_CHECK(!stages.empty(), "replicate_pipeline: no stage");
  long per = 0;
  for (const auto& s : stages) per += s.num_devices();
  WEFT_CHECK(per >= 1 && c.num_devices() % per == 0,
             "replicate_pipeline: a pipeline of {} devices does not divide the cluster's {} devices", per,
             c.num_devices());
  ReplicatedPipeline r;
  r.replicas = static_cast<int>(c.num_devices() / per);
  std::vector<SubmeshShape> all;
  for (int k = 0; k < r.replicas; ++k) all.insert(all.end(), stages.begin(), stages.end());
  auto placed = assign_submeshes(c, all);
  for (int k = 0; k < r.replicas; ++k)
    r.placements.emplace_back(placed.begin() + static_cast<long>(k * stages.size()),
                              placed.begin() + static_cast<long>((k + 1) * stages.size()));
  return r;
}

}  // namespace weft::pipeline
