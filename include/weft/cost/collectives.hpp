#pragma once
// Collectives per mesh axis under the α-β model. The closed forms live in
// weft/cluster/alpha_beta.hpp (so that weft::sharding can use them without depending on cost);
// this header names them for the cost model and applies a Calibration.
//   ring all-reduce 2(n-1)/n·B·β + 2(n-1)α; all-gather / reduce-scatter (n-1)/n·B·β + (n-1)α;
//   all-to-all (n-1)/n·B·β + (n-1)α; point-to-point α + B·β; hierarchical when the axis spans
//   nodes (see alpha_beta.hpp).
#include <string_view>
#include <vector>

#include "weft/cluster/alpha_beta.hpp"
#include "weft/cluster/cluster.hpp"
#include "weft/cost/calibration.hpp"

namespace weft::cost {

using cluster::all_gather_time;
using cluster::all_reduce_time;
using cluster::all_to_all_time;
using cluster::p2p_time;
using cluster::reduce_scatter_time;

enum class Collective { AllReduce, AllGather, ReduceScatter, AllToAll, P2P };
Collective parse_collective(std::string_view name);  // "all-reduce", "all_gather", ...

// Time of one collective of `bytes` (per device; all-gather: bytes after, reduce-scatter: before)
// along one mesh axis, with calibration applied.
double collective_time(Collective c, const cluster::AxisLink& link, double bytes,
                       const Calibration& cal = {});

// The α-β per axis of a mesh on a cluster, calibrated.
std::vector<cluster::AxisLink> calibrated_axis_links(const cluster::Cluster& c, const cluster::DeviceMesh& m,
                                                     const Calibration& cal = {});

}  // namespace weft::cost
