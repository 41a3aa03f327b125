#pragma once
// A small reference interpreter: executes a graph on real numbers (f64 whatever the dtype) with
// plain loops. It is the oracle for autodiff and, later, for distributed execution.
#include <map>
#include <vector>

#include "weft/ir/graph.hpp"

namespace weft::ir {

struct HostTensor {
  Shape shape;
  std::vector<double> data;  // row-major
  std::int64_t numel() const;
};

// Runs every op in topological order. `feeds` must give every Input, Parameter, Constant and
// OptimizerState leaf. Returns the value of every tensor (indexed by TensorId).
std::vector<HostTensor> interpret(const Graph& g, const std::map<TensorId, HostTensor>& feeds);

}  // namespace weft::ir
