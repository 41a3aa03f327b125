// DeviceMesh value type and the α-β parameters of each mesh axis.
//
// axis_links: for mesh axis a of size n, the devices that differ only in coordinate a form a group
// (all groups run a collective at the same time). For each group: g = nodes it touches, m = most
// members on one node. Intra-node hop: α = link latency, β = 1/link bandwidth (worst node).
// Inter-node hop: every group with a member on node v pushes one flow through v's NIC (a ring
// crosses each node boundary once), so with f_v such groups β_inter = f_v / nic_bandwidth(v)
// (worst node) — this is how the NIC is shared by the node's GPUs. The flat-ring bottleneck is
// the larger of the two.
#include "weft/cluster/device_mesh.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>

#include "weft/cluster/cluster.hpp"
#include "weft/core/error.hpp"

namespace weft::cluster {
namespace {

std::vector<std::string> default_names(std::size_t n) {
  static const char* k[] = {"x", "y", "z", "w"};
  std::vector<std::string> r;
  for (std::size_t i = 0; i < n; ++i) r.push_back(n <= 4 ? k[i] : fmt::format("a{}", i));
  return r;
}

int64_t product(const std::vector<int64_t>& v) {
  int64_t p = 1;
  for (int64_t x : v) p *= x;
  return p;
}

}  // namespace

DeviceMesh::DeviceMesh(std::vector<int64_t> shape, std::vector<int> device_ids,
                       std::vector<std::string> axis_names)
    : shape_(std::move(shape)), ids_(std::move(device_ids)), names_(std::move(axis_names)) {
  WEFT_CHECK(!shape_.empty(), "a device mesh needs at least one axis");
  for (int64_t s : shape_)
    WEFT_CHECK(s >= 1, "mesh axis sizes must be >= 1 (got {})", fmt::join(shape_, "x"));
  WEFT_CHECK(product(shape_) == static_cast<int64_t>(ids_.size()),
             "mesh shape {} holds {} devices but {} device ids were given", fmt::join(shape_, "x"),
             product(shape_), ids_.size());
  std::set<int> seen;
  for (int id : ids_) {
    WEFT_CHECK(id >= 0, "device ids must be >= 0 (got {})", id);
    WEFT_CHECK(seen.insert(id).second, "device id {} appears twice in the mesh", id);
  }
  if (names_.empty()) names_ = default_names(shape_.size());
  WEFT_CHECK(names_.size() == shape_.size(), "{} axis names for a {}-D mesh", names_.size(), shape_.size());
  std::set<std::string> nm(names_.begin(), names_.end());
  WEFT_CHECK(nm.size() == names_.size(), "mesh axis names must be distinct");
  // Compact form: ids == offset + transpose(iota reshaped to shape[perm^-1], perm) for some axis
  // permutation perm (ndim <= 5 tried exhaustively).
  const int offset = *std::min_element(ids_.begin(), ids_.end());
  if (*std::max_element(ids_.begin(), ids_.end()) - offset + 1 == static_cast<int>(ids_.size()) &&
      ndim() <= 5) {
    std::vector<int> perm(shape_.size());
    std::iota(perm.begin(), perm.end(), 0);
    do {
      // source dims: dims[perm[i]] = shape[i]; element at mesh coord c is iota index of the
      // source coord sc with sc[perm[i]] = c[i].
      std::vector<int64_t> dims(shape_.size());
      for (std::size_t i = 0; i < perm.size(); ++i) dims[static_cast<std::size_t>(perm[i])] = shape_[i];
      std::vector<int64_t> c(shape_.size(), 0);
      bool ok = true;
      for (std::size_t flat = 0; flat < ids_.size() && ok; ++flat) {
        std::vector<int64_t> sc(shape_.size());
        for (std::size_t i = 0; i < perm.size(); ++i) sc[static_cast<std::size_t>(perm[i])] = c[i];
        int64_t idx = 0;
        for (std::size_t i = 0; i < dims.size(); ++i) idx = idx * dims[i] + sc[i];
        ok = ids_[flat] == offset + idx;
        for (int i = ndim() - 1; i >= 0; --i) {
          auto u = static_cast<std::size_t>(i);
          if (++c[u] < shape_[u]) break;
          c[u] = 0;
        }
      }
      if (ok) {
        iota_ = true;
        iota_dims_ = dims;
        iota_perm_ = perm;
        break;
      }
    } while (std::next_permutation(perm.begin(), perm.end()));
  }
}

DeviceMesh DeviceMesh::iota(std::vector<int64_t> shape, int first, std::vector<std::string> axis_names) {
  WEFT_CHECK(first >= 0, "first device id must be >= 0");
  int64_t n = 1;
  for (int64_t s : shape) {
    WEFT_CHECK(s >= 1, "mesh axis sizes must be >= 1");
    n *= s;
  }
  std::vector<int> ids(static_cast<std::size_t>(n));
  std::iota(ids.begin(), ids.end(), first);
  return DeviceMesh(std::move(shape), std::move(ids), std::move(axis_names));
}

int64_t DeviceMesh::size() const { return static_cast<int64_t>(ids_.size()); }

int DeviceMesh::axis_index(const std::string& name) const {
  for (int i = 0; i < ndim(); ++i)
    if (names_[static_cast<std::size_t>(i)] == name) return i;
  fail("mesh has no axis named '{}' (axes: {})", name, fmt::join(names_, ","));
}

int DeviceMesh::device_at(const std::vector<int64_t>& coord) const {
  WEFT_CHECK(coord.size() == shape_.size(), "coordinate has {} entries for a {}-D mesh", coord.size(),
             ndim());
  int64_t idx = 0;
  for (std::size_t i = 0; i < coord.size(); ++i) {
    WEFT_CHECK(coord[i] >= 0 && coord[i] < shape_[i], "mesh coordinate {} out of range on axis {} (size {})",
               coord[i], i, shape_[i]);
    idx = idx * shape_[i] + coord[i];
  }
  return ids_[static_cast<std::size_t>(idx)];
}

std::vector<int64_t> DeviceMesh::coord_of(int device_id) const {
  auto it = std::find(ids_.begin(), ids_.end(), device_id);
  WEFT_CHECK(it != ids_.end(), "device {} is not in mesh {}", device_id, to_string());
  int64_t idx = it - ids_.begin();
  std::vector<int64_t> c(shape_.size());
  for (int i = ndim() - 1; i >= 0; --i) {
    auto u = static_cast<std::size_t>(i);
    c[u] = idx % shape_[u];
    idx /= shape_[u];
  }
  return c;
}

bool DeviceMesh::contains(int device_id) const {
  return std::find(ids_.begin(), ids_.end(), device_id) != ids_.end();
}

std::vector<int> DeviceMesh::group_along(const std::vector<int64_t>& coord, int axis) const {
  WEFT_CHECK(axis >= 0 && axis < ndim(), "mesh axis {} out of range for a {}-D mesh", axis, ndim());
  std::vector<int64_t> c = coord;
  std::vector<int> r;
  for (int64_t i = 0; i < shape_[static_cast<std::size_t>(axis)]; ++i) {
    c[static_cast<std::size_t>(axis)] = i;
    r.push_back(device_at(c));
  }
  return r;
}

DeviceMesh DeviceMesh::reshape(std::vector<int64_t> new_shape, std::vector<std::string> axis_names) const {
  WEFT_CHECK(product(new_shape) == size(), "cannot view a mesh of {} devices as {}", size(),
             fmt::join(new_shape, "x"));
  return DeviceMesh(std::move(new_shape), ids_, std::move(axis_names));
}

std::string DeviceMesh::to_string() const {
  std::vector<std::string> ax;
  for (std::size_t i = 0; i < shape_.size(); ++i) ax.push_back(fmt::format("{}={}", names_[i], shape_[i]));
  const bool plain = iota_ && std::is_sorted(iota_perm_.begin(), iota_perm_.end());
  if (plain) return fmt::format("Mesh[{}]({}..{})", fmt::join(ax, ","), ids_.front(), ids_.back());
  return fmt::format("Mesh[{}]{{{}}}", fmt::join(ax, ","), fmt::join(ids_, ","));
}

std::size_t DeviceMesh::hash() const {
  std::size_t h = 0x9e3779b97f4a7c15ULL;
  auto mix = [&h](std::size_t v) { h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2); };
  for (int64_t s : shape_) mix(static_cast<std::size_t>(s));
  for (int id : ids_) mix(static_cast<std::size_t>(id));
  for (const auto& n : names_) mix(std::hash<std::string>{}(n));
  return h;
}

std::vector<AxisLink> axis_links(const Cluster& cluster, const DeviceMesh& mesh) {
  for (int id : mesh.device_ids())
    WEFT_CHECK(id < cluster.num_devices(), "mesh device {} is not in the cluster ({} devices)", id,
               cluster.num_devices());
  std::vector<AxisLink> out;
  const std::size_t nd = mesh.shape().size();
  for (int a = 0; a < mesh.ndim(); ++a) {
    AxisLink L;
    L.size = static_cast<int>(mesh.shape()[static_cast<std::size_t>(a)]);
    // Enumerate groups: iterate over all coords with coord[a] == 0.
    std::vector<std::vector<int>> groups;
    std::vector<int64_t> c(nd, 0);
    for (int64_t flat = 0; flat < mesh.size(); ++flat) {
      if (c[static_cast<std::size_t>(a)] == 0) groups.push_back(mesh.group_along(c, a));
      for (int i = static_cast<int>(nd) - 1; i >= 0; --i) {
        auto u = static_cast<std::size_t>(i);
        if (++c[u] < mesh.shape()[u]) break;
        c[u] = 0;
      }
    }
    std::map<int, int> flows;  // node -> groups touching it that span several nodes
    bool intra_seen = false;
    for (const auto& g : groups) {
      std::map<int, int> per_node;
      for (int d : g) per_node[cluster.node_of(d)]++;
      L.nodes_on_axis = std::max(L.nodes_on_axis, static_cast<int>(per_node.size()));
      for (auto& [node, cnt] : per_node) {
        L.devices_per_node_on_axis = std::max(L.devices_per_node_on_axis, cnt);
        if (cnt > 1) {
          const LinkSpec& l = cluster.intra_link(node);
          L.intra_alpha = std::max(L.intra_alpha, l.latency);
          L.intra_beta = std::max(L.intra_beta, 1.0 / l.bandwidth);
          // The slowest node's factors (a ring waits for its slowest hop).
          const CollectiveFactors& f = cluster.nodes()[static_cast<std::size_t>(node)].collective_factors;
          CollectiveFactors& a = L.factors;
          if (!intra_seen) a = f;
          intra_seen = true;
          a.all_reduce = std::max(a.all_reduce, f.all_reduce);
          a.all_gather = std::max(a.all_gather, f.all_gather);
          a.reduce_scatter = std::max(a.reduce_scatter, f.reduce_scatter);
          a.all_to_all = std::max(a.all_to_all, f.all_to_all);
          a.p2p = std::max(a.p2p, f.p2p);
        }
        if (per_node.size() > 1) flows[node]++;
      }
    }
    if (L.size == 1) L.devices_per_node_on_axis = 1;
    for (auto& [node, f] : flows) {
      const LinkSpec& l = cluster.nic(node);
      L.inter_alpha = std::max(L.inter_alpha, l.latency);
      L.inter_beta = std::max(L.inter_beta, f / l.bandwidth);
    }
    L.crosses_nodes = L.nodes_on_axis > 1;
    L.alpha = std::max(L.intra_alpha, L.inter_alpha);
    L.beta = std::max(L.intra_beta, L.inter_beta);
    out.push_back(L);
  }
  return out;
}

}  // namespace weft::cluster
