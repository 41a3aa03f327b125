#pragma once
// Deterministic values of a training step's leaves, a pure function of (seed, tensor, step,
// global element index) through the counter-based Philox generator (core/random.hpp), so a
// device initialises its shard locally and gets exactly the slice of the global value, whatever
// the plan (Rhino §6.3). Parameters: 0.1·N(0,1), layer-norm / batch-norm scales (names ending in
// ".gamma") 1 + 0.1·N(0,1); optimizer states 0, but a master copy (ir::master_copy) its
// parameter's value; float inputs N(0,1) drawn anew every step; integer
// inputs (ids, labels) uniform in [0, n) with n the rows / classes of the op that reads them;
// constants 1 (the loss seed) or N(0,1).
#include <cstdint>
#include <vector>

#include "weft/ir/graph.hpp"

namespace weft::exec {

class LeafValues {
 public:
  LeafValues(const ir::Graph& g, std::uint64_t seed);
  // Element `index` (row-major in the global tensor) of leaf `t` at step `step` (1-based).
  double value(ir::TensorId t, int step, std::int64_t index) const;

 private:
  const ir::Graph& g_;
  std::uint64_t seed_;
  std::vector<std::int64_t> int_range_;  // per tensor: the bound of an integer leaf (0 = not one)
  std::vector<std::uint64_t> key_;
  std::vector<ir::TensorId> master_of_;  // per tensor: the parameter a master copy mirrors (-1)
};

}  // namespace weft::exec
