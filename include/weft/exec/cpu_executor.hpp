#pragma once
// CPU reference executor of a resharding plan: every device is a buffer in memory (its tile as a
// dense row-major array of the tile's local shape, indices in global order), one worker thread
// plays each host and performs, in the plan's order, the ops that deliver to that host's devices,
// moving real bytes (strided regions are gathered/scattered run by run). It proves a plan right:
// after run() every destination device holds exactly its tile of the global tensor.
#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "weft/core/dtype.hpp"
#include "weft/reshard/plan.hpp"
#include "weft/reshard/problem.hpp"

namespace weft::cluster {
class DeviceMesh;
}
namespace weft::sharding {
class ShardingSpec;
}

namespace weft::exec {

using reshard::Region;

// A tensor distributed over devices: tiles (global index regions) and one buffer per device.
class DistributedTensor {
 public:
  // Zero-filled buffers. Throws weft::Error when a tile's rank differs from the shape's or lies
  // outside it.
  DistributedTensor(std::vector<int64_t> shape, DType dtype, std::map<int, Region> tiles);
  // The layout of `spec` on `mesh` (zero-filled).
  static DistributedTensor from_spec(std::vector<int64_t> shape, DType dtype,
                                     const sharding::ShardingSpec& spec, const cluster::DeviceMesh& mesh);
  // Fills every device's buffer from a dense row-major global array of shape() (global_bytes
  // must be exactly num_elements * dtype size).
  void scatter_from(const void* global, std::size_t global_bytes);

  const std::vector<int64_t>& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  const std::map<int, Region>& tiles() const { return tiles_; }
  const Region& tile(int device) const;  // throws when the device holds no buffer
  std::vector<int64_t> local_shape(int device) const;
  std::vector<std::byte>& buffer(int device);
  const std::vector<std::byte>& buffer(int device) const;
  // Number of devices whose buffer differs from the slice of `global` (row-major, shape()).
  int mismatches(const void* global, std::size_t global_bytes) const;

 private:
  std::vector<int64_t> shape_;
  DType dtype_;
  std::map<int, Region> tiles_;
  std::map<int, std::vector<std::byte>> buffers_;
};

// Copies `region` (global indices, contained in both tiles) from a buffer laid out as src_tile to
// a buffer laid out as dst_tile; contiguous runs are moved with memcpy. Throws weft::Error when
// the region is not inside both tiles.
void copy_region(const std::byte* src, const Region& src_tile, std::byte* dst, const Region& dst_tile,
                 const Region& region, int64_t elem_size);
// The same copy as byte runs (offsets and lengths in bytes), for device-side pack/unpack kernels.
struct CopyRun {
  int64_t src = 0, dst = 0, len = 0;
  bool operator==(const CopyRun&) const = default;
};
std::vector<CopyRun> copy_runs(const Region& src_tile, const Region& dst_tile, const Region& region,
                               int64_t elem_size);
// Packs a region into a dense buffer (row-major over the region's local shape) and back.
std::vector<std::byte> pack(const std::byte* src, const Region& src_tile, const Region& region,
                            int64_t elem_size);
void unpack(const std::vector<std::byte>& packed, std::byte* dst, const Region& dst_tile,
            const Region& region, int64_t elem_size);

struct CpuExecOptions {
  bool staged = false;  // pack each op into a message buffer and unpack it (as a wire would);
                        // otherwise copy source runs straight into destination runs
};

struct ExecStats {
  std::map<int, int64_t> bytes_sent;      // per host, across its NIC (a broadcast counts once)
  std::map<int, int64_t> bytes_received;  // per host, across its NIC
  int64_t bytes_local = 0;                // copied inside hosts
  int64_t bytes_written = 0;              // into destination buffers in all
  double seconds = 0;                     // wall time of run()
};

// Runs a plan: src[i] / dst[i] are tensor i of the plan's problem. Throws weft::Error when a
// tensor's shape or dtype differs from the plan's, or a device of an op has no buffer.
ExecStats run(const reshard::ReshardPlan& plan, const std::vector<const DistributedTensor*>& src,
              const std::vector<DistributedTensor*>& dst, const CpuExecOptions& opt = {});

}  // namespace weft::exec
