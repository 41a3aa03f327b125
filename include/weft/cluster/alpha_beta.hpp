#pragma once
// α-β time of collectives along one mesh axis (closed forms; weft::cost re-exports them).
// n = devices on the axis, m = of them per node, g = nodes (n = m g); αi/βi the intra-node hop,
// αo/βo the inter-node hop (βo already includes NIC sharing, see axis_links). Flat ring inside a
// node (g = 1); hierarchical when the axis spans nodes — all of them reduce to the flat ring when
// g = 1 or m = 1:
//   all_reduce(B)     = 2(m-1)/m·B·βi + 2(m-1)αi + 2(g-1)/g·B·βo + 2(g-1)αo
//   all_gather(B_out) = (m-1)/m·B·βi + (m-1)αi + (g-1)/g·B·βo + (g-1)αo   (B = bytes after)
//   reduce_scatter(B_in) = same as all_gather with B = bytes before
//   all_to_all(B)     = (m-1)/n·B·βi + m(n-m)/n·B·βo + (n-1)·max(αi, αo)  (B = bytes per device)
//   p2p(B)            = α + B·β of the axis' bottleneck hop
// With g = 1 these are the textbook ring forms 2(n-1)/n·B·β + 2(n-1)α and (n-1)/n·B·β + (n-1)α.
#include "weft/cluster/device_mesh.hpp"

namespace weft::cluster {

double all_reduce_time(const AxisLink& l, double bytes);
double all_gather_time(const AxisLink& l, double bytes_out);
double reduce_scatter_time(const AxisLink& l, double bytes_in);
double all_to_all_time(const AxisLink& l, double bytes);
double p2p_time(const AxisLink& l, double bytes);
// An AxisLink for a flat ring of n devices inside one node.
AxisLink flat_link(int n, double alpha, double beta);

}  // namespace weft::cluster
