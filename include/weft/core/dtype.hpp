#pragma once
// Element types of tensors. Shared by the IR (tensor bytes), the cluster (peak FLOP/s per dtype)
// and the sharding/resharding code (bytes moved).
#include <cstdint>
#include <string>
#include <string_view>

namespace weft {

enum class DType : std::uint8_t { F32, F16, BF16, F64, I32, I64, Bool };

int dtype_size(DType t);                       // bytes per element
std::string_view dtype_name(DType t);          // "f32", "bf16", ...
DType parse_dtype(std::string_view name);      // throws weft::Error on an unknown name
bool is_floating(DType t);

}  // namespace weft
