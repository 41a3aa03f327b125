#pragma once
// Exact tile math: which global indices one device holds under a ShardingSpec, and the map
// between local and global indices, per tensor dim. See sharding_spec.hpp for the convention:
// element e of dim d is on the device with coordinate c iff floor(e/s_i) mod k_i == c_i for every
// mesh axis i sharding d. Local offset of e = e with those digits removed (majors first), which
// keeps global order inside a device; padding (allow_padding) only ever sits at the end.
#include <cstdint>
#include <string>
#include <vector>

#include "weft/sharding/sharding_spec.hpp"

namespace weft::sharding {

struct Interval {
  int64_t begin = 0, end = 0;  // [begin, end) of global indices
  int64_t size() const { return end - begin; }
  bool operator==(const Interval&) const = default;
};

struct Tile {
  std::vector<std::vector<Interval>> dims;  // per tensor dim, sorted disjoint, adjacent ones merged
  bool partial = false;                     // some mesh axis is Partial
  int partial_index = 0;                    // which term of the reduction this device holds
  int partial_count = 1;                    // number of terms (product of partial axis sizes)
  std::vector<int64_t> local_shape() const;
  int64_t num_elements() const;
  // Global indices held along one dim, ascending (== local order).
  std::vector<int64_t> indices(int dim) const;
  std::string to_string() const;
};

Tile tile_of(const ShardingSpec& spec, const std::vector<int64_t>& mesh_coord);

// Local index (0 <= local < local_shape[dim]) -> global index along `dim`. Throws when out of range.
int64_t global_index(const ShardingSpec& spec, const std::vector<int64_t>& mesh_coord, int dim,
                     int64_t local);
// Global index -> local index on this device, or -1 when the device does not hold it.
int64_t local_index(const ShardingSpec& spec, const std::vector<int64_t>& mesh_coord, int dim,
                    int64_t global);
// The mesh coordinate along each sharding axis of `dim` that holds global index g (per mesh
// axis; -1 for axes that do not shard dim).
std::vector<int64_t> owner_coords(const ShardingSpec& spec, int dim, int64_t global);
// Local element count along dim on the device (exact, padding excluded).
int64_t local_size(const ShardingSpec& spec, const std::vector<int64_t>& mesh_coord, int dim);

}  // namespace weft::sharding
