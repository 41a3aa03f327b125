#pragma once
// DeviceMesh: an N-D logical view of a set of devices, like XLA's tile assignment. Stored compactly
// as iota(n) -> reshape(reshape_dims) -> transpose(perm) + offset when the device order has that
// form, as an explicit row-major list otherwise. Immutable value type: comparable, hashable,
// printable in one line.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "weft/cluster/collective_factors.hpp"

namespace weft::cluster {

class Cluster;

class DeviceMesh {
 public:
  // device_ids in row-major order of `shape`; must be distinct and non-negative; product of shape
  // must equal their count. axis_names default to "x","y","z","w",... (or "a0","a1",.. past 4).
  DeviceMesh(std::vector<int64_t> shape, std::vector<int> device_ids,
             std::vector<std::string> axis_names = {});
  // Devices first, first+1, ... in row-major order.
  static DeviceMesh iota(std::vector<int64_t> shape, int first = 0, std::vector<std::string> axis_names = {});

  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t size() const;
  const std::vector<int64_t>& shape() const { return shape_; }
  const std::vector<std::string>& axis_names() const { return names_; }
  int axis_index(const std::string& name) const;  // throws when unknown
  const std::vector<int>& device_ids() const { return ids_; }
  int device_at(const std::vector<int64_t>& coord) const;  // throws on a bad coordinate
  std::vector<int64_t> coord_of(int device_id) const;      // throws if not in mesh
  bool contains(int device_id) const;
  // The devices that share all coordinates with `coord` except along `axis` (in axis order).
  std::vector<int> group_along(const std::vector<int64_t>& coord, int axis) const;
  // Same devices, another logical shape (row-major order kept): 2x8 -> 4x4 -> 1x16.
  DeviceMesh reshape(std::vector<int64_t> new_shape, std::vector<std::string> axis_names = {}) const;

  // Compact form: true when ids == offset + transpose(reshape(iota, reshape_dims), perm).
  bool is_iota() const { return iota_; }
  const std::vector<int64_t>& iota_reshape_dims() const { return iota_dims_; }
  const std::vector<int>& iota_perm() const { return iota_perm_; }

  std::string to_string() const;  // "Mesh[x=2,y=8](0..15)" or "Mesh[x=2,y=2]{0,2,1,3}"
  bool operator==(const DeviceMesh& o) const {
    return shape_ == o.shape_ && ids_ == o.ids_ && names_ == o.names_;
  }
  std::size_t hash() const;

 private:
  std::vector<int64_t> shape_;
  std::vector<int> ids_;
  std::vector<std::string> names_;
  bool iota_ = false;
  std::vector<int64_t> iota_dims_;
  std::vector<int> iota_perm_;
};

// α (latency, s) and β (s/byte) of one mesh axis: the worst over the axis' device groups.
// When the axis crosses nodes, the inter-node part uses the NIC bandwidth divided by the number
// of concurrent flows through one NIC (the axis groups that have members on that node).
struct AxisLink {
  double alpha = 0;                        // per-step latency of a flat ring along the axis (bottleneck hop)
  double beta = 0;                         // s/byte of the bottleneck hop of a flat ring along the axis
  bool crosses_nodes = false;              // the axis' groups span more than one node
  int devices_per_node_on_axis = 1;        // m: members of one group on one node
  int nodes_on_axis = 1;                   // g: nodes one group spans (n = m*g)
  double intra_alpha = 0, intra_beta = 0;  // hop inside a node (0 when m == 1)
  double inter_alpha = 0, inter_beta = 0;  // hop between nodes, NIC sharing included (0 when g == 1)
  int size = 1;                            // n: devices in one group
  CollectiveFactors factors;               // of the intra-node hop (largest over the axis' nodes)
  bool operator==(const AxisLink&) const = default;
};

std::vector<AxisLink> axis_links(const Cluster& cluster, const DeviceMesh& mesh);

}  // namespace weft::cluster

template <>
struct std::hash<weft::cluster::DeviceMesh> {
  std::size_t operator()(const weft::cluster::DeviceMesh& m) const noexcept { return m.hash(); }
};
