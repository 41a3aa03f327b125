#pragma once
// The values of a training step's leaves, as every executor reads them.
//
// A value the model carries (ir::Graph::set_value: a Parameter's weights, a Buffer, a Constant)
// is used as it is — in memory, or read from its value file. Nothing is guessed: a Buffer or a
// Constant without a value, or a Parameter without one in a graph whose parameters are not
// seeded (an imported module's), is an error naming every such leaf, raised when LeafValues is
// made (before anything runs). The exceptions are autodiff's dloss seed (1) and what follows.
//
// Seeded values are a pure function of (seed, tensor, step, global element index) through the
// counter-based Philox generator (core/random.hpp), so a device initialises its shard locally and
// gets exactly the slice of the global value, whatever the plan (Rhino §6.3):
// - Parameters without a value, where allowed (graphs built in code — the zoo —, or
//   `seed_all_parameters`, the user's init="seed"), get the initialisers a torch user would
//   recognise: norm scales (a LayerNorm's gamma, names ending ".gamma") 1, other vectors
//   (biases) 0, matrices and higher 0.02·N(0,1) (GPT-2's normal(0, 0.02));
// - optimizer states 0, but a master copy (ir::master_copy) its parameter's value;
// - Inputs without a fed value (synthetic data): float inputs N(0,1) drawn anew every step;
//   integer inputs (ids, labels) uniform in [0, n) with n the rows / classes of the op that
//   reads them.
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "weft/ir/graph.hpp"

namespace weft::exec {

// The leaves of `g` that need a value and have none (see above), in tensor order.
std::vector<std::string> leaves_without_values(const ir::Graph& g, bool seed_all_parameters = false);

// weft::Error unless `name` is an Input leaf of `g`; the message lists the graph's Inputs.
void check_input_name(const ir::Graph& g, const std::string& name, std::string_view who);

class LeafValues {
 public:
  // weft::Error listing leaves_without_values(g, seed_all_parameters) when there are any.
  LeafValues(const ir::Graph& g, std::uint64_t seed, bool seed_all_parameters = false);
  // Element `index` (row-major in the global tensor) of leaf `t` at step `step` (1-based). A
  // file-backed value is read once and kept (thread-safe).
  double value(ir::TensorId t, int step, std::int64_t index) const;
  // The elements `index` of leaf `t` into `out`. A file-backed value not already kept is read for
  // this call only (a rank holds its tile, not the tensor).
  void values(ir::TensorId t, int step, std::span<const std::int64_t> index, double* out) const;

 private:
  const ir::HostTensor* kept(ir::TensorId t) const;  // an in-memory or already-read value, or null
  const ir::Graph& g_;
  std::uint64_t seed_;
  std::vector<std::int64_t> int_range_;  // per tensor: the bound of an integer leaf (0 = not one)
  std::vector<std::uint64_t> key_;
  std::vector<ir::TensorId> master_of_;  // per tensor: the parameter a master copy mirrors (-1)
  std::vector<char> unit_scale_;         // per tensor: a norm scale (seeded as ones)
  mutable std::mutex mu_;
  mutable std::map<ir::TensorId, std::shared_ptr<const ir::HostTensor>> read_;  // file-backed, read
};

}  // namespace weft::exec
