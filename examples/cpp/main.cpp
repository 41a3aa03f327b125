// Uses weft as a library from another CMake project (find_package(weft) -> weft::weft): builds
// a GPT from the model zoo, turns it into a training step, and shards one weight on a 2x8 mesh.
#include <fmt/format.h>

#include "weft/cluster/cluster.hpp"
#include "weft/cluster/device_mesh.hpp"
#include "weft/ir/autodiff.hpp"
#include "weft/models/models.hpp"
#include "weft/sharding/sharding_spec.hpp"
#include "weft/sharding/tile.hpp"

int main() {
  using namespace weft;
  ir::Graph fwd = models::gpt_preset("GPT-350M", /*batch=*/8);
  ir::Graph step = ir::build_training_graph(fwd);
  fmt::print("{}: {} ops in the training step, {:.1f}M parameters, {:.2f} TFLOPs per step\n", fwd.name(),
             step.ops().size(), static_cast<double>(fwd.num_params()) / 1e6, ir::training_flops(fwd) / 1e12);

  cluster::Cluster c = cluster::Cluster::preset("M8", 2);
  fmt::print("{}\n", c.to_string());

  // The fused QKV weight [h, 3h] split on its columns over the 8 GPUs of a node, with Megatron's
  // per-device Q/K/V blocks kept together (stride h/8); device 3's tile, in global indices.
  const int64_t h = 1024;
  auto spec = sharding::ShardingSpec::parse("R S(1,128)", {h, 3 * h}, {2, 8});
  sharding::Tile t = sharding::tile_of(spec, {0, 3});
  auto local = t.local_shape();
  fmt::print("QKV weight {} (DTensor: {}): device (0,3) holds a {}x{} tile\n", spec.to_string(), spec.to_dtensor(),
             local[0], local[1]);
  return 0;
}
