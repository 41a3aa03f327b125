// Deterministic leaf values (see init.hpp).
#include "weft/exec/init.hpp"

#include <algorithm>
#include <string>

#include "weft/core/error.hpp"
#include "weft/core/random.hpp"
#include "weft/ir/autodiff.hpp"

namespace weft::exec {

LeafValues::LeafValues(const ir::Graph& g, std::uint64_t seed) : g_(g), seed_(seed) {
  int_range_.assign(g.tensors().size(), 0);
  master_of_.assign(g.tensors().size(), -1);
  for (const auto& t : g.tensors()) key_.push_back(stable_key(t.name));
  for (const auto& op : g.ops()) {
    // A master copy starts as its parameter: mixed-precision training copies the weights once.
    if (ir::TensorId m = ir::master_copy(op); m >= 0) master_of_[static_cast<std::size_t>(m)] = op.inputs[0];
    auto bound = [&](std::size_t input, std::int64_t n) {
      if (op.inputs.size() > input) int_range_[static_cast<std::size_t>(op.inputs[input])] = n;
    };
    switch (op.kind) {
      case ir::OpKind::Embedding: bound(1, g.tensor(op.inputs[0]).shape[0]); break;
      case ir::OpKind::EmbeddingGrad: bound(0, op.attrs.ints[0]); break;
      case ir::OpKind::CrossEntropy:
      case ir::OpKind::CrossEntropyGrad: bound(1, g.tensor(op.inputs[0]).shape.back()); break;
      default: break;
    }
  }
}

double LeafValues::value(ir::TensorId t, int step, std::int64_t index) const {
  const auto& info = g_.tensor(t);
  const auto i = static_cast<std::uint64_t>(index);
  const std::uint64_t key = key_[static_cast<std::size_t>(t)];
  switch (info.role) {
    case ir::Role::Parameter: {
      const double n = normal01(seed_, key, i);
      const bool scale = info.name.size() > 6 && info.name.ends_with(".gamma");
      return scale ? 1 + 0.1 * n : 0.1 * n;
    }
    case ir::Role::OptimizerState: {
      const ir::TensorId p = master_of_[static_cast<std::size_t>(t)];
      return p >= 0 ? value(p, step, index) : 0;
    }
    case ir::Role::Constant:
      if (g_.loss() && g_.grad_of(t) == g_.loss()) return 1;
      return normal01(seed_, key, i);
    default: break;
  }
  // Inputs: a fresh draw every step (the step mixed into the stream key).
  const std::uint64_t skey = key ^ (0x9E3779B97F4A7C15ULL * static_cast<std::uint64_t>(step));
  if (!is_floating(info.dtype)) {
    const std::int64_t n = int_range_[static_cast<std::size_t>(t)];
    WEFT_CHECK(n > 0, "input '{}' is an integer tensor that no embedding or cross-entropy reads: give its values",
               info.name);
    auto v = static_cast<std::int64_t>(uniform01(seed_, skey, i) * static_cast<double>(n));
    return static_cast<double>(std::min(v, n - 1));
  }
  return normal01(seed_, skey, i);
}

}  // namespace weft::exec
