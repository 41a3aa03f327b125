#pragma once
// Cross-mesh resharding, the abstract problem: unit tasks over devices plus the device -> host map.
// A unit task is one (destination tile ∩ source tile) region of one tensor: its candidate senders
// are every source device holding that source tile, its receivers every destination device that
// holds that destination tile. Planning (plan.hpp) only needs this description; decompose.hpp
// builds it from sharding specs and meshes.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "weft/core/dtype.hpp"
#include "weft/sharding/tile.hpp"

namespace weft::cluster {
class Cluster;
class DeviceMesh;
}  // namespace weft::cluster

namespace weft::reshard {

using sharding::Interval;

// A product region of a tensor: per dim, sorted disjoint [begin, end) intervals of global indices
// (a union of blocks when a spec is strided). rank 0 = "no geometry" (abstract tasks).
struct Region {
  std::vector<std::vector<Interval>> dims;

  int rank() const { return static_cast<int>(dims.size()); }
  std::vector<int64_t> extents() const;  // per dim, number of indices
  int64_t num_elements() const;          // 1 for rank 0
  bool empty() const;                    // some dim holds no index
  bool contains(const Region& o) const;  // o ⊆ this (same rank)
  std::string to_string() const;         // "[0:4,8:12][0:16]"
  bool operator==(const Region&) const = default;
};

Region full_region(const std::vector<int64_t>& shape);
Region region_of(const sharding::Tile& tile);
Region intersect(const Region& a, const Region& b);
// k disjoint parts covering r (some possibly empty), cut along the dim with the most indices,
// in index order, sizes differing by at most one index.
std::vector<Region> split_region(const Region& r, int k);

// Which host each device sits on and each host's NIC bandwidth (bytes/s per direction; links are
// full duplex). The GPUs of a host share its NIC; transfers inside a host are free in the model.
class HostMap {
 public:
  HostMap() = default;
  // Throws weft::Error on a negative device or host id or a non-positive bandwidth. Hosts not in
  // host_bandwidth get default_bandwidth.
  explicit HostMap(std::map<int, int> device_host, std::map<int, double> host_bandwidth = {},
                   double default_bandwidth = 1.0);
  // Host of device d = d / devices_per_host, for the given devices.
  static HostMap devices_per_host(const std::vector<int>& devices, int devices_per_host,
                                  double bandwidth = 1.0);
  // The papers' convention: each row of a mesh (all coordinates but the last axis) is a host.
  // Hosts are numbered 0,1,.. over the meshes in order; a device listed twice must land on the
  // same host (throws otherwise).
  static HostMap mesh_rows(const std::vector<cluster::DeviceMesh>& meshes, double bandwidth = 1.0);
  // Node of each device and the node's NIC bandwidth, from a Cluster.
  static HostMap from_cluster(const cluster::Cluster& c);

  int host_of(int device) const;  // throws weft::Error when unknown
  bool contains(int device) const { return dev_.count(device) != 0; }
  double bandwidth(int host) const;
  std::vector<int> hosts() const;  // sorted
  std::vector<int> devices() const;
  const std::map<int, int>& device_host() const { return dev_; }
  std::string to_string() const;
  bool operator==(const HostMap&) const = default;

 private:
  std::map<int, int> dev_;
  std::map<int, double> bw_;
  double default_bw_ = 1.0;
};

struct UnitTask {
  int tensor = 0;              // index of the tensor in a joint plan
  Region region;               // global indices moved (rank 0 for abstract tasks)
  int64_t bytes = 0;           // region elements * dtype size
  std::vector<int> senders;    // candidate sender devices: every holder of the source tile, sorted
  std::vector<int> receivers;  // devices that need the region, sorted
  bool operator==(const UnitTask&) const = default;
  std::string to_string() const;
};

struct TensorInfo {
  std::vector<int64_t> shape;
  DType dtype = DType::F32;
  bool operator==(const TensorInfo&) const = default;
};

struct ReshardProblem {
  std::vector<UnitTask> tasks;
  HostMap hosts;
  std::vector<TensorInfo> tensors;  // may be empty for abstract problems
  // Throws weft::Error when a task names a device the host map lacks, has no sender or
  // receiver, or a negative size.
  void validate() const;
};

}  // namespace weft::reshard
