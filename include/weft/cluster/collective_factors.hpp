#pragma once
// cluster::CollectiveFactors: per collective, how a backend's implementation compares with the
// ring its α-β closed form assumes (alpha_beta.hpp), on a node's intra-node link.

namespace weft::cluster {

// Per collective, a multiplier of the bandwidth term of its α-β closed form inside a node
// (alpha_beta.hpp): what a backend's implementation costs against the ring it is priced as. 1 =
// the ring (every preset). `weft calibrate` sets them for the local host from the collectives it
// timed: gloo's reduce_scatter_tensor, for one, runs over an all-reduce and costs several times
// the ring's reduce-scatter.
struct CollectiveFactors {
  double all_reduce = 1, all_gather = 1, reduce_scatter = 1, all_to_all = 1, p2p = 1;
  bool operator==(const CollectiveFactors&) const = default;
  bool is_unit() const { return *this == CollectiveFactors{}; }
};

}  // namespace weft::cluster
