// Collective times per mesh axis with calibration (closed forms in cluster/alpha_beta.hpp).
#include "weft/cost/collectives.hpp"

#include <string>

#include "weft/core/error.hpp"

namespace weft::cost {

Collective parse_collective(std::string_view name) {
  std::string n(name);
  for (char& c : n)
    if (c == '_') c = '-';
  if (n == "all-reduce" || n == "allreduce") return Collective::AllReduce;
  if (n == "all-gather" || n == "allgather") return Collective::AllGather;
  if (n == "reduce-scatter" || n == "reducescatter") return Collective::ReduceScatter;
  if (n == "all-to-all" || n == "alltoall") return Collective::AllToAll;
  if (n == "p2p" || n == "send") return Collective::P2P;
  fail("unknown collective '{}' (all-reduce, all-gather, reduce-scatter, all-to-all, p2p)", name);
}

double collective_time(Collective c, const cluster::AxisLink& link0, double bytes, const Calibration& cal) {
  const cluster::AxisLink link = cal.apply(link0);
  switch (c) {
    case Collective::AllReduce: return all_reduce_time(link, bytes);
    case Collective::AllGather: return all_gather_time(link, bytes);
    case Collective::ReduceScatter: return reduce_scatter_time(link, bytes);
    case Collective::AllToAll: return all_to_all_time(link, bytes);
    case Collective::P2P: return p2p_time(link, bytes);
  }
  throw InternalError("unknown collective kind");
}

std::vector<cluster::AxisLink> calibrated_axis_links(const cluster::Cluster& c, const cluster::DeviceMesh& m,
                                                     const Calibration& cal) {
  auto l = cluster::axis_links(c, m);
  for (auto& x : l) x = cal.apply(x);
  return l;
}

}  // namespace weft::cost
