// Closed-form α-β collective times (see alpha_beta.hpp for the formulas and their assumptions).
#include "weft/cluster/alpha_beta.hpp"

#include <algorithm>

#include "weft/core/error.hpp"

namespace weft::cluster {
namespace {

struct P {
  double n, m, g;
};
P parts(const AxisLink& l, double bytes) {
  WEFT_CHECK(bytes >= 0, "collective size must be >= 0 bytes (got {})", bytes);
  WEFT_CHECK(l.size >= 1 && l.devices_per_node_on_axis >= 1 && l.nodes_on_axis >= 1,
             "axis link needs size, devices_per_node_on_axis, nodes_on_axis >= 1");
  return {static_cast<double>(l.size), static_cast<double>(l.devices_per_node_on_axis),
          static_cast<double>(l.nodes_on_axis)};
}

}  // namespace

double all_reduce_time(const AxisLink& l, double B) {
  auto [n, m, g] = parts(l, B);
  if (n <= 1) return 0;
  return 2 * (m - 1) / m * B * l.intra_beta * l.factors.all_reduce + 2 * (m - 1) * l.intra_alpha +
         2 * (g - 1) / g * B * l.inter_beta + 2 * (g - 1) * l.inter_alpha;
}

namespace {
// All-gather and reduce-scatter: the same ring, each with its own intra-node factor.
double ring_half(const AxisLink& l, double B, double factor) {
  auto [n, m, g] = parts(l, B);
  if (n <= 1) return 0;
  return (m - 1) / m * B * l.intra_beta * factor + (m - 1) * l.intra_alpha + (g - 1) / g * B * l.inter_beta +
         (g - 1) * l.inter_alpha;
}
}  // namespace

double all_gather_time(const AxisLink& l, double B) { return ring_half(l, B, l.factors.all_gather); }

double reduce_scatter_time(const AxisLink& l, double B) { return ring_half(l, B, l.factors.reduce_scatter); }

double all_to_all_time(const AxisLink& l, double B) {
  auto [n, m, g] = parts(l, B);
  if (n <= 1) return 0;
  return (m - 1) / n * B * l.intra_beta * l.factors.all_to_all + m * (n - m) / n * B * l.inter_beta +
         (n - 1) * std::max(l.intra_alpha, l.inter_alpha);
}

double p2p_time(const AxisLink& l, double B) {
  parts(l, B);
  // The bottleneck hop: the factor applies when it is the intra-node one.
  return l.alpha + B * l.beta * (l.crosses_nodes ? 1.0 : l.factors.p2p);
}

AxisLink flat_link(int n, double alpha, double beta) {
  WEFT_CHECK(n >= 1 && alpha >= 0 && beta >= 0, "flat_link needs n >= 1, alpha >= 0, beta >= 0");
  AxisLink l;
  l.size = n;
  l.devices_per_node_on_axis = n;
  l.nodes_on_axis = 1;
  l.alpha = l.intra_alpha = n > 1 ? alpha : 0;
  l.beta = l.intra_beta = n > 1 ? beta : 0;
  return l;
}

}  // namespace weft::cluster
