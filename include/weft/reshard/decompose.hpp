#pragma once
// From sharding specs on meshes to unit tasks: one per (destination tile ∩ source tile) with a
// non-empty intersection. Tiles are grouped by equality first, so replicas of a tile share one
// unit task (senders = all holders of the source tile, receivers = all holders of the
// destination tile). Partial (unreduced) layouts are rejected: moving them needs a reduction.
#include <cstdint>
#include <map>
#include <vector>

#include "weft/cluster/device_mesh.hpp"
#include "weft/core/dtype.hpp"
#include "weft/reshard/problem.hpp"
#include "weft/sharding/sharding_spec.hpp"

namespace weft::reshard {

// One tensor crossing a stage boundary. Validated in the constructor: both specs must describe
// `shape`, each spec's mesh shape must equal its mesh's shape, no Partial placement.
class TensorReshard {
 public:
  TensorReshard(std::vector<int64_t> shape, DType dtype, sharding::ShardingSpec src_spec,
                cluster::DeviceMesh src_mesh, sharding::ShardingSpec dst_spec, cluster::DeviceMesh dst_mesh);
  const std::vector<int64_t>& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  const sharding::ShardingSpec& src_spec() const { return src_spec_; }
  const sharding::ShardingSpec& dst_spec() const { return dst_spec_; }
  const cluster::DeviceMesh& src_mesh() const { return src_mesh_; }
  const cluster::DeviceMesh& dst_mesh() const { return dst_mesh_; }
  int64_t bytes() const;  // whole tensor

 private:
  std::vector<int64_t> shape_;
  DType dtype_;
  sharding::ShardingSpec src_spec_;
  cluster::DeviceMesh src_mesh_;
  sharding::ShardingSpec dst_spec_;
  cluster::DeviceMesh dst_mesh_;
};

// Device id -> its tile (as a Region) of a spec on a mesh; devices with an empty tile included.
std::map<int, Region> tiles_by_device(const sharding::ShardingSpec& spec, const cluster::DeviceMesh& mesh);

// Unit tasks of one tensor (tensor index `tensor` written into each task), ordered by destination
// tile (first holder's id) then source tile.
std::vector<UnitTask> decompose(const TensorReshard& t, int tensor = 0);

// Joint problem of several tensors crossing the same boundary. Every device of every mesh must
// be in `hosts` (throws weft::Error naming the device otherwise).
ReshardProblem make_problem(const std::vector<TensorReshard>& tensors, const HostMap& hosts);

}  // namespace weft::reshard
