// links_from_cluster: pipeline link d = intra-node link if devices d and d+1 share a node, else
// the bottleneck NIC pair: bandwidth min(nic_a, nic_b), latency max(lat_a, lat_b).
#include <algorithm>

#include "weft/cluster/cluster.hpp"
#include "weft/core/error.hpp"
#include "weft/sim/simulator.hpp"

namespace weft::sim {

std::vector<LinkSpec> links_from_cluster(const cluster::Cluster& c, const std::vector<int>& ids,
                                         const cluster::BandwidthTrace& trace, bool wrap) {
  WEFT_CHECK(!ids.empty(), "links_from_cluster: need at least one device");
  for (int id : ids)
    WEFT_CHECK(id >= 0 && id < c.num_devices(),
               "links_from_cluster: device {} not in the cluster ({} devices)", id, c.num_devices());
  std::vector<LinkSpec> out;
  const std::size_t n = ids.size();
  const std::size_t count = wrap ? n : n - 1;
  for (std::size_t d = 0; d < count; ++d) {
    const int a = ids[d], b = ids[(d + 1) % n];
    const int na = c.node_of(a), nb = c.node_of(b);
    LinkSpec l;
    if (na == nb) {
      l.bandwidth = c.intra_link(na).bandwidth;
      l.latency = c.intra_link(na).latency;
    } else {
      l.bandwidth = std::min(c.nic(na).bandwidth, c.nic(nb).bandwidth);
      l.latency = std::max(c.nic(na).latency, c.nic(nb).latency);
    }
    l.trace = trace;
    out.push_back(std::move(l));
  }
  return out;
}

}  // namespace weft::sim
