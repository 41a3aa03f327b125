#pragma once
// A dense tensor of real numbers on the host: the interpreter's and the executors' values, and the
// values a model carries (ir::LeafValue). f64 whatever the tensor's dtype; integer tensors (ids,
// labels, bucket tables) hold integral doubles.
#include <cstdint>
#include <vector>

namespace weft::ir {

struct HostTensor {
  std::vector<std::int64_t> shape;
  std::vector<double> data;  // row-major
  std::int64_t numel() const;
  bool operator==(const HostTensor&) const = default;
};

}  // namespace weft::ir
