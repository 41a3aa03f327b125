#pragma once
// Resharding on one mesh: the cheapest sequence of single-axis collectives that turns spec A into
// spec B (same tensor, same mesh), under the α-β model of each mesh axis.
//
// Search: Dijkstra over specs (strides included). From a spec, along mesh axis a (size > 1):
//   Shard(d,s) -> R            all-gather        all_gather_time(B_after)
//   Shard(d,s) -> Shard(d',s') all-to-all        all_to_all_time(B)
//   P          -> R            all-reduce        all_reduce_time(B)
//   P          -> Shard(d',s') reduce-scatter    reduce_scatter_time(B_before)
//   R          -> Shard(d',s') local slice       0
//   R          -> P            local (keep the value on coordinate 0, identity elsewhere)   0
// B = bytes of the (padded) local tile: max_local_elements × element size. Each of these is
// realizable inside the groups of axis a alone, for any strides (the union of a group's tiles is
// the tile with a's digit removed). Ties on time are broken by fewer steps; results are
// deterministic. The search stops with weft::Error past max_states.
#include <cstddef>
#include <string>
#include <unordered_map>
#include <vector>

#include "weft/cluster/device_mesh.hpp"
#include "weft/sharding/sharding_spec.hpp"

namespace weft::sharding {

enum class CollectiveKind { AllGather, ReduceScatter, AllReduce, AllToAll, LocalSlice, LocalPartial };
const char* collective_name(CollectiveKind k);  // "all-gather", ...

struct ReshardStep {
  CollectiveKind kind;
  int axis;
  ShardingSpec from, to;
  double bytes;                   // per device: B as defined above
  double time;                    // seconds
  std::string to_string() const;  // "all-gather@1: S(0) S(1) -> S(0) R (4096 B, 1.2e-05 s)"
};

struct ReshardPlan {
  std::vector<ReshardStep> steps;
  double time = 0;  // sum of step times
  std::string to_string() const;
};

struct ReshardOptions {
  std::size_t max_states = 200000;    // search budget (states settled)
  bool strided_intermediates = true;  // intermediate specs may use any stride (else block + A/B strides)
  // Use the packed-state search (same graph and result, no ShardingSpec built in the loop) when
  // neither spec allows padding, strided_intermediates is on and the mesh has <= 8 axes.
  bool packed = true;
};

// Plans with caching; one planner per (mesh axis links, element size). Not thread-safe.
class ReshardPlanner {
 public:
  ReshardPlanner(std::vector<cluster::AxisLink> links, int element_bytes, ReshardOptions opt = {});
  const ReshardPlan& plan(const ShardingSpec& from, const ShardingSpec& to);  // cached
  std::size_t cache_size() const { return cache_.size(); }
  std::size_t searches() const { return searches_; }

 private:
  struct PairHash {
    std::size_t operator()(const std::pair<ShardingSpec, ShardingSpec>& p) const noexcept {
      return p.first.hash() * 31 + p.second.hash();
    }
  };
  ReshardPlan search(const ShardingSpec& from, const ShardingSpec& to) const;
  std::vector<cluster::AxisLink> links_;
  int elem_;
  ReshardOptions opt_;
  std::unordered_map<std::pair<ShardingSpec, ShardingSpec>, ReshardPlan, PairHash> cache_;
  std::size_t searches_ = 0;
};

// One-shot helper (no cache).
ReshardPlan reshard_on_mesh(const ShardingSpec& from, const ShardingSpec& to,
                            const std::vector<cluster::AxisLink>& links, int element_bytes,
                            const ReshardOptions& opt = {});

}  // namespace weft::sharding
