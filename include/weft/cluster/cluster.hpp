#pragma once
// A cluster: devices (kind, peak FLOP/s per dtype, memory, memory bandwidth) grouped in nodes; one
// intra-node link per node (NVLink/PCIe, per-GPU bandwidth) and one NIC per node whose bandwidth
// is shared by all GPUs of the node that talk across nodes at the same time. Heterogeneous
// clusters (nodes of different kinds) are first-class: concat() joins clusters.
// Units: FLOP/s, bytes, bytes/s, seconds.
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "weft/cluster/collective_factors.hpp"
#include "weft/cluster/efficiency.hpp"
#include "weft/core/dtype.hpp"

namespace weft::cluster {

struct DeviceSpec {
  std::string kind;                    // "V100-SXM2-32GB", ...
  std::map<DType, double> peak_flops;  // dense peak per dtype (tensor cores where the kind has them)
  double memory_bytes = 0;             // HBM capacity
  double memory_bandwidth = 0;         // HBM bandwidth, bytes/s
  double kernel_overhead = 0;          // seconds added to every op (kernel launch); 0 for datasheets
  // The efficiency model (efficiency.hpp): per dtype, the matmul efficiency against GEMM shape;
  // a dtype without an entry runs at the datasheet peak. Presets carry measured defaults.
  std::map<DType, MatmulEfficiency> matmul_efficiency;
  double memory_efficiency = 1.0;  // fraction of memory_bandwidth memory-bound ops reach (0, 1]
  double peak(DType t) const;      // throws weft::Error when the dtype has no entry
  const MatmulEfficiency& matmul(DType t) const;  // the dtype's entry, else the datasheet {1, 0, 0}
  // The same device at 100% of its datasheet: no efficiency model, no kernel overhead.
  DeviceSpec datasheet() const;
  bool operator==(const DeviceSpec&) const = default;
};

struct Device {
  int id = 0;    // global id, 0..n-1, in node order
  int node = 0;  // node index
  DeviceSpec spec;
  bool operator==(const Device&) const = default;
};

struct LinkSpec {
  double bandwidth = 0;  // bytes/s (per direction)
  double latency = 0;    // seconds
  bool operator==(const LinkSpec&) const = default;
};

// One node: its GPUs share `nic` (aggregate bandwidth of all the node's NICs) to other nodes;
// `intra` is the GPU-to-GPU link inside the node (per GPU pair / ring hop).
struct NodeSpec {
  std::string name;  // preset name or free text
  int num_devices = 0;
  DeviceSpec device;
  LinkSpec intra;
  LinkSpec nic;
  CollectiveFactors collective_factors;  // of the intra-node link
  bool operator==(const NodeSpec&) const = default;
};

class Cluster {
 public:
  Cluster() = default;
  explicit Cluster(std::vector<NodeSpec> nodes);  // validates (positive sizes, bandwidths)

  // Presets (see docs/modules/cluster.md for numbers and sources): "M8", "S1", "p3.8xlarge",
  // "DGX-A100", "H100", "H200", "P100", "T4". Throws weft::Error on an unknown name or nodes < 1.
  static Cluster preset(std::string_view name, int nodes = 1);
  // The most devices a cluster may have (2^20): more is refused with a clear error, not an
  // allocation failure.
  static constexpr std::int64_t kMaxDevices = std::int64_t{1} << 20;
  static std::vector<std::string> preset_names();
  static Cluster concat(const Cluster& a, const Cluster& b);  // nodes of a, then nodes of b
  static Cluster from_json(std::string_view json_text);
  std::string to_json() const;
  // Every device at its datasheet (DeviceSpec::datasheet): the cost model before efficiencies,
  // for comparisons and for figures derived by hand from peaks.
  Cluster datasheet() const;

  const std::vector<Device>& devices() const { return devices_; }
  const std::vector<NodeSpec>& nodes() const { return nodes_; }
  int num_devices() const { return static_cast<int>(devices_.size()); }
  int num_nodes() const { return static_cast<int>(nodes_.size()); }
  const Device& device(int id) const;  // throws on a bad id
  int node_of(int device_id) const;
  const LinkSpec& intra_link(int node) const;
  const LinkSpec& nic(int node) const;
  // Devices of one node, by global id.
  std::vector<int> devices_of_node(int node) const;
  bool homogeneous() const;
  std::string to_string() const;  // one line, e.g. "Cluster(2x M8[8x V100-SXM2-32GB])"

  bool operator==(const Cluster& o) const { return nodes_ == o.nodes_; }

 private:
  std::vector<NodeSpec> nodes_;
  std::vector<Device> devices_;
};

}  // namespace weft::cluster
