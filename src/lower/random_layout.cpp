// Random valid layouts (lower.hpp): stress tests of the lowering and the executors.
#include "weft/lower/lower.hpp"
#include "weft/sharding/sharding_spec.hpp"
#include "weft/spmd/strategy.hpp"

namespace weft::lower {

SpmdLayout random_layout(const ir::Graph& g, const std::vector<std::int64_t>& mesh, std::uint32_t seed) {
  std::uint64_t state = seed * 0x9E3779B97F4A7C15ULL + 1;
  auto next = [&](std::size_t n) {  // a small LCG: the same layouts on every platform
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<std::size_t>((state >> 33) % n);
  };
  SpmdLayout l;
  for (const auto& op : g.ops()) {
    auto st = spmd::enumerate_strategies(g, op, mesh);
    l.op_axes.push_back(st[next(st.size())].axes);
  }
  sharding::EnumerateOptions eo;
  eo.partial = false;
  for (ir::TensorId t = 0; t < static_cast<ir::TensorId>(g.tensors().size()); ++t) {
    const auto& info = g.tensor(t);
    if (info.producer != ir::kNoOp) continue;
    auto specs = sharding::enumerate_specs(info.shape, mesh, eo);
    l.leaf_specs.emplace(t, specs[next(specs.size())]);
  }
  return l;
}

}  // namespace weft::lower
