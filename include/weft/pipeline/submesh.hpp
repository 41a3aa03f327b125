#pragma once
// Submesh choice for pipeline stages (Alpa §5.2): a stage runs on a submesh that is either
// whole nodes (n x G, n = 1..N) or a power-of-two slice of one node (1x1, 1x2, 1x4, ... < G);
// each submesh has several 2-D logical views for the SPMD search (all factor pairs of its size).
// Alpa's tiling condition: the stages' submeshes must cover the cluster exactly; leftover
// capacity is used by replicating the whole pipeline data-parallel.
#include <cstdint>
#include <string>
#include <vector>

#include "weft/cluster/cluster.hpp"
#include "weft/cluster/device_mesh.hpp"

namespace weft::pipeline {

struct SubmeshShape {
  int nodes = 1;             // n
  int devices_per_node = 1;  // m (== G for whole nodes, a power of two < G for a slice)
  SubmeshShape() = default;
  SubmeshShape(int nodes, int devices_per_node);  // weft::Error unless both >= 1
  int num_devices() const { return nodes * devices_per_node; }
  bool operator==(const SubmeshShape&) const = default;
  auto operator<=>(const SubmeshShape&) const = default;
  std::string to_string() const;  // "2x8"
};

// Slices 1x1, 1x2, 1x4, ... (powers of two below G), then n x G for n = 1..N, in that order
// (ascending device count). weft::Error when the nodes do not all have the same device count.
std::vector<SubmeshShape> submesh_shapes(const cluster::Cluster& cluster);

// Every 2-D logical shape (a, b) with a*b = the submesh's device count, a ascending:
// 2x8 -> 1x16, 2x8, 4x4, 8x2, 16x1. Devices are laid out row-major in (node, local gpu) order.
std::vector<std::vector<std::int64_t>> logical_mesh_shapes(const SubmeshShape& shape);

// One stage's concrete devices.
struct SubmeshPlacement {
  SubmeshShape shape;
  std::vector<int> device_ids;  // row-major (node, local index) order
  // The devices as a mesh of the given logical shape (default: nodes x devices_per_node).
  cluster::DeviceMesh mesh(std::vector<std::int64_t> logical_shape = {}) const;
  bool operator==(const SubmeshPlacement&) const = default;
  std::string to_string() const;
};

// Places the stages' submeshes on disjoint devices covering the whole cluster exactly: whole-node
// submeshes first on consecutive nodes, slices packed into the remaining nodes largest first,
// each slice on an aligned block of a node. Returned in the order of `stages`. weft::Error when
// a shape is not one of submesh_shapes(cluster) or they cannot tile the cluster (device count
// differs or the slices do not pack), naming the numbers.
std::vector<SubmeshPlacement> assign_submeshes(const cluster::Cluster& cluster,
                                               const std::vector<SubmeshShape>& stages);

// Data-parallel replicas of one pipeline: replicas = devices / (devices of one pipeline); the
// replicas' placements are disjoint and together cover the cluster. weft::Error when the pipeline's
// device count does not divide the cluster's or the replicas cannot be tiled.
struct ReplicatedPipeline {
  int replicas = 1;
  std::vector<std::vector<SubmeshPlacement>> placements;  // [replica][stage]
  bool operator==(const ReplicatedPipeline&) const = default;
};
ReplicatedPipeline replicate_pipeline(const cluster::Cluster& cluster,
                                      const std::vector<SubmeshShape>& stages);

}  // namespace weft::pipeline
