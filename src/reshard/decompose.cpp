// Decomposition of a cross-mesh resharding into unit tasks: group source devices by identical
// tile and destination devices by identical tile; each pair of groups whose tiles intersect is
// one unit task (region = intersection, senders = source group, receivers = destination group).
// Source tiles partition the tensor (no Partial), so the unit tasks of one destination tile
// partition that tile: every element a receiver needs arrives exactly once.
#include "weft/reshard/decompose.hpp"

#include <algorithm>

#include "weft/core/error.hpp"

namespace weft::reshard {

TensorReshard::TensorReshard(std::vector<int64_t> shape, DType dtype, sharding::ShardingSpec src_spec,
                             cluster::DeviceMesh src_mesh, sharding::ShardingSpec dst_spec,
                             cluster::DeviceMesh dst_mesh)
    : shape_(std::move(shape)),
      dtype_(dtype),
      src_spec_(std::move(src_spec)),
      src_mesh_(std::move(src_mesh)),
      dst_spec_(std::move(dst_spec)),
      dst_mesh_(std::move(dst_mesh)) {
  for (int64_t n : shape_) WEFT_CHECK(n >= 1, "reshard: tensor dims must be positive, got {}", n);
  WEFT_CHECK(src_spec_.tensor_shape() == shape_,
             "reshard: source spec {} is for a tensor of shape [{}], not [{}]", src_spec_.to_string(),
             fmt::join(src_spec_.tensor_shape(), ","), fmt::join(shape_, ","));
  WEFT_CHECK(dst_spec_.tensor_shape() == shape_,
             "reshard: destination spec {} is for a tensor of shape [{}], not [{}]", dst_spec_.to_string(),
             fmt::join(dst_spec_.tensor_shape(), ","), fmt::join(shape_, ","));
  WEFT_CHECK(src_spec_.mesh_shape() == src_mesh_.shape(),
             "reshard: source spec is for mesh [{}] but the mesh is {}",
             fmt::join(src_spec_.mesh_shape(), ","), src_mesh_.to_string());
  WEFT_CHECK(dst_spec_.mesh_shape() == dst_mesh_.shape(),
             "reshard: destination spec is for mesh [{}] but the mesh is {}",
             fmt::join(dst_spec_.mesh_shape(), ","), dst_mesh_.to_string());
  WEFT_CHECK(!src_spec_.has_partial() && !dst_spec_.has_partial(),
             "reshard: Partial layouts ({} -> {}) need a reduction, which cross-mesh resharding does not do",
             src_spec_.to_string(), dst_spec_.to_string());
  auto distinct = [](const std::vector<int>& ids) {
    std::vector<int> s = ids;
    std::sort(s.begin(), s.end());
    return std::adjacent_find(s.begin(), s.end()) == s.end();
  };
  WEFT_CHECK(distinct(src_mesh_.device_ids()), "reshard: source mesh {} lists a device twice",
             src_mesh_.to_string());
  WEFT_CHECK(distinct(dst_mesh_.device_ids()), "reshard: destination mesh {} lists a device twice",
             dst_mesh_.to_string());
}

int64_t TensorReshard::bytes() const {
  int64_t n = dtype_size(dtype_);
  for (int64_t d : shape_) n *= d;
  return n;
}

std::map<int, Region> tiles_by_device(const sharding::ShardingSpec& spec, const cluster::DeviceMesh& mesh) {
  std::map<int, Region> out;
  for (int d : mesh.device_ids()) out[d] = region_of(sharding::tile_of(spec, mesh.coord_of(d)));
  return out;
}

namespace {
struct Group {
  Region tile;
  std::vector<int> devices;
};
std::vector<Group> group_tiles(const std::map<int, Region>& tiles) {
  std::vector<Group> groups;
  for (const auto& [dev, r] : tiles) {  // map order: by device id, so groups come sorted
    if (r.empty()) continue;            // uneven specs: a device may hold nothing
    auto it = std::find_if(groups.begin(), groups.end(), [&r = r](const Group& g) { return g.tile == r; });
    if (it == groups.end())
      groups.push_back({r, {dev}});
    else
      it->devices.push_back(dev);
  }
  return groups;
}
}  // namespace

std::vector<UnitTask> decompose(const TensorReshard& t, int tensor) {
  auto src = group_tiles(tiles_by_device(t.src_spec(), t.src_mesh()));
  auto dst = group_tiles(tiles_by_device(t.dst_spec(), t.dst_mesh()));
  const int64_t esize = dtype_size(t.dtype());
  std::vector<UnitTask> out;
  for (const auto& dg : dst)
    for (const auto& sg : src) {
      Region r = intersect(dg.tile, sg.tile);
      if (r.empty()) continue;
      out.push_back(UnitTask{tensor, r, r.num_elements() * esize, sg.devices, dg.devices});
    }
  return out;
}

ReshardProblem make_problem(const std::vector<TensorReshard>& tensors, const HostMap& hosts) {
  ReshardProblem p;
  p.hosts = hosts;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    for (const auto* mesh : {&t.src_mesh(), &t.dst_mesh()})
      for (int d : mesh->device_ids())
        WEFT_CHECK(hosts.contains(d), "reshard: device {} of mesh {} (tensor {}) is not in the host map", d,
                   mesh->to_string(), i);
    p.tensors.push_back({t.shape(), t.dtype()});
    auto ts = decompose(t, static_cast<int>(i));
    p.tasks.insert(p.tasks.end(), ts.begin(), ts.end());
  }
  p.validate();
  return p;
}

}  // namespace weft::reshard
