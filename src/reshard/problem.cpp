// Regions (products of interval unions), the device -> host map and problem validation.
#include "weft/reshard/problem.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "weft/cluster/cluster.hpp"
#include "weft/cluster/device_mesh.hpp"
#include "weft/core/error.hpp"

namespace weft::reshard {

namespace {
int64_t count(const std::vector<Interval>& v) {
  int64_t n = 0;
  for (const auto& i : v) n += i.size();
  return n;
}
std::vector<Interval> intersect_dim(const std::vector<Interval>& a, const std::vector<Interval>& b) {
  std::vector<Interval> out;
  std::size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    int64_t lo = std::max(a[i].begin, b[j].begin), hi = std::min(a[i].end, b[j].end);
    if (lo < hi) {
      if (!out.empty() && out.back().end == lo)
        out.back().end = hi;  // keep adjacent pieces merged, as tiles are
      else
        out.push_back({lo, hi});
    }
    if (a[i].end < b[j].end)
      ++i;
    else
      ++j;
  }
  return out;
}
}  // namespace

std::vector<int64_t> Region::extents() const {
  std::vector<int64_t> e;
  for (const auto& d : dims) e.push_back(count(d));
  return e;
}
int64_t Region::num_elements() const {
  int64_t n = 1;
  for (const auto& d : dims) n *= count(d);
  return n;
}
bool Region::empty() const { return num_elements() == 0; }
bool Region::contains(const Region& o) const {
  if (o.rank() != rank()) return false;
  for (int d = 0; d < rank(); ++d)
    if (count(intersect_dim(dims[d], o.dims[d])) != count(o.dims[d])) return false;
  return true;
}
std::string Region::to_string() const {
  std::string s;
  for (const auto& d : dims) {
    s += "[";
    for (std::size_t i = 0; i < d.size(); ++i)
      s += fmt::format("{}{}:{}", i ? "," : "", d[i].begin, d[i].end);
    s += "]";
  }
  return s.empty() ? "[]" : s;
}

Region full_region(const std::vector<int64_t>& shape) {
  Region r;
  for (int64_t n : shape) {
    WEFT_CHECK(n >= 0, "full_region: negative dim size {}", n);
    r.dims.push_back(n > 0 ? std::vector<Interval>{{0, n}} : std::vector<Interval>{});
  }
  return r;
}
Region region_of(const sharding::Tile& tile) { return Region{tile.dims}; }

Region intersect(const Region& a, const Region& b) {
  WEFT_CHECK(a.rank() == b.rank(), "intersect: regions of rank {} and {}", a.rank(), b.rank());
  Region r;
  for (int d = 0; d < a.rank(); ++d) r.dims.push_back(intersect_dim(a.dims[d], b.dims[d]));
  return r;
}

std::vector<Region> split_region(const Region& r, int k) {
  WEFT_CHECK(k >= 1, "split_region: k = {} < 1", k);
  std::vector<Region> parts(k, r);
  if (r.rank() == 0 || k == 1) return parts;  // rank 0: every part is the geometry-free whole
  auto ext = r.extents();
  int dim = static_cast<int>(std::max_element(ext.begin(), ext.end()) - ext.begin());
  int64_t n = ext[dim];
  // Part i takes indices [floor(i*n/k), floor((i+1)*n/k)) of the dim's index sequence.
  for (int i = 0; i < k; ++i) {
    int64_t lo = i * n / k, hi = (i + 1) * n / k, pos = 0;
    std::vector<Interval> sel;
    for (const auto& iv : r.dims[dim]) {
      int64_t a = std::max(lo, pos), b = std::min(hi, pos + iv.size());
      if (a < b) sel.push_back({iv.begin + (a - pos), iv.begin + (b - pos)});
      pos += iv.size();
    }
    parts[i].dims[dim] = sel;
  }
  return parts;
}

HostMap::HostMap(std::map<int, int> device_host, std::map<int, double> host_bandwidth,
                 double default_bandwidth)
    : dev_(std::move(device_host)), bw_(std::move(host_bandwidth)), default_bw_(default_bandwidth) {
  WEFT_CHECK(default_bw_ > 0, "HostMap: default bandwidth {} must be positive", default_bw_);
  for (auto [d, h] : dev_) WEFT_CHECK(d >= 0 && h >= 0, "HostMap: negative id (device {}, host {})", d, h);
  for (auto [h, b] : bw_) WEFT_CHECK(b > 0, "HostMap: host {} has non-positive bandwidth {}", h, b);
}

HostMap HostMap::devices_per_host(const std::vector<int>& devices, int per_host, double bandwidth) {
  WEFT_CHECK(per_host >= 1, "HostMap::devices_per_host: {} devices per host", per_host);
  std::map<int, int> m;
  for (int d : devices) {
    WEFT_CHECK(d >= 0, "HostMap::devices_per_host: negative device {}", d);
    m[d] = d / per_host;
  }
  return HostMap(m, {}, bandwidth);
}

HostMap HostMap::mesh_rows(const std::vector<cluster::DeviceMesh>& meshes, double bandwidth) {
  std::map<int, int> m;
  int next = 0;
  for (const auto& mesh : meshes) {
    int64_t last = mesh.ndim() ? mesh.shape().back() : 1;
    const auto& ids = mesh.device_ids();
    for (std::size_t i = 0; i < ids.size(); ++i) {
      int h = next + static_cast<int>(static_cast<int64_t>(i) / last);
      auto [it, fresh] = m.emplace(ids[i], h);
      WEFT_CHECK(fresh || it->second == h, "HostMap::mesh_rows: device {} lies on two different mesh rows",
                 ids[i]);
    }
    next += static_cast<int>(static_cast<int64_t>(ids.size()) / std::max<int64_t>(last, 1));
  }
  return HostMap(m, {}, bandwidth);
}

HostMap HostMap::from_cluster(const cluster::Cluster& c) {
  std::map<int, int> m;
  std::map<int, double> bw;
  for (const auto& d : c.devices()) m[d.id] = d.node;
  for (int n = 0; n < c.num_nodes(); ++n) bw[n] = c.nic(n).bandwidth;
  return HostMap(m, bw);
}

int HostMap::host_of(int device) const {
  auto it = dev_.find(device);
  WEFT_CHECK(it != dev_.end(), "HostMap: device {} has no host", device);
  return it->second;
}
double HostMap::bandwidth(int host) const {
  auto it = bw_.find(host);
  return it == bw_.end() ? default_bw_ : it->second;
}
std::vector<int> HostMap::hosts() const {
  std::set<int> s;
  for (auto [d, h] : dev_) s.insert(h);
  return {s.begin(), s.end()};
}
std::vector<int> HostMap::devices() const {
  std::vector<int> v;
  for (auto [d, h] : dev_) v.push_back(d);
  return v;
}
std::string HostMap::to_string() const {
  std::string s = "HostMap{";
  bool first = true;
  for (int h : hosts()) {
    s += fmt::format("{}h{}:[", first ? "" : " ", h);
    bool f2 = true;
    for (auto [d, hh] : dev_)
      if (hh == h) {
        s += fmt::format("{}{}", f2 ? "" : ",", d);
        f2 = false;
      }
    s += fmt::format("]@{:g}", bandwidth(h));
    first = false;
  }
  return s + "}";
}

std::string UnitTask::to_string() const {
  return fmt::format("UnitTask(t{} {} {}B senders={} receivers={})", tensor, region.to_string(), bytes,
                     fmt::join(senders, ","), fmt::join(receivers, ","));
}

void ReshardProblem::validate() const {
  for (std::size_t i = 0; i < tasks.size(); ++i) {
    const auto& t = tasks[i];
    WEFT_CHECK(!t.senders.empty(), "unit task {} has no candidate sender", i);
    WEFT_CHECK(!t.receivers.empty(), "unit task {} has no receiver", i);
    WEFT_CHECK(t.bytes >= 0, "unit task {} has negative size {}", i, t.bytes);
    WEFT_CHECK(std::is_sorted(t.senders.begin(), t.senders.end()) &&
                   std::adjacent_find(t.senders.begin(), t.senders.end()) == t.senders.end(),
               "unit task {}: senders must be sorted and distinct", i);
    WEFT_CHECK(std::is_sorted(t.receivers.begin(), t.receivers.end()) &&
                   std::adjacent_find(t.receivers.begin(), t.receivers.end()) == t.receivers.end(),
               "unit task {}: receivers must be sorted and distinct", i);
    for (int d : t.senders) WEFT_CHECK(hosts.contains(d), "unit task {}: sender device {} has no host", i, d);
    for (int d : t.receivers)
      WEFT_CHECK(hosts.contains(d), "unit task {}: receiver device {} has no host", i, d);
    if (!tensors.empty()) {
      WEFT_CHECK(t.tensor >= 0 && t.tensor < static_cast<int>(tensors.size()),
                 "unit task {}: tensor {} unknown", i, t.tensor);
      WEFT_CHECK(t.region.rank() == static_cast<int>(tensors[t.tensor].shape.size()),
                 "unit task {}: region rank {} != tensor rank {}", i, t.region.rank(),
                 tensors[t.tensor].shape.size());
    }
  }
}

}  // namespace weft::reshard
