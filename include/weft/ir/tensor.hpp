#pragma once
// A tensor of the IR: shape, element type and the role it plays in a training step.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "weft/core/dtype.hpp"

namespace weft::ir {

using TensorId = std::int32_t;
using OpId = std::int32_t;
inline constexpr OpId kNoOp = -1;

// Leaves: Input (fed per step: data, labels), Parameter (trained), Buffer (state that is not
// trained: running statistics, position tables; a module's named buffers), Constant (a value known
// at import: a folded mask, an eps, bucket ids; autodiff's dloss seed). Parameters, Buffers and
// Constants carry their values (Graph::set_value).
enum class Role : std::uint8_t { Input, Parameter, Activation, Gradient, OptimizerState, Constant, Buffer };

std::string_view role_name(Role r);
Role parse_role(std::string_view name);  // throws weft::Error on an unknown name

struct TensorInfo {
  std::string name;
  std::vector<std::int64_t> shape;
  DType dtype = DType::F32;
  Role role = Role::Activation;
  OpId producer = kNoOp;  // the op that writes it; kNoOp for inputs, parameters, constants

  std::int64_t numel() const;
  std::int64_t bytes() const;  // numel × element size; weft::Error on overflow
  int rank() const { return static_cast<int>(shape.size()); }
  bool operator==(const TensorInfo&) const = default;
};

}  // namespace weft::ir
