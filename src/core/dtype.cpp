#include "weft/core/dtype.hpp"

#include "weft/core/error.hpp"

namespace weft {

int dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F16: return 2;
    case DType::BF16: return 2;
    case DType::F64: return 8;
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::Bool: return 1;
  }
  throw InternalError("unknown dtype");
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
    case DType::F64: return "f64";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
    case DType::Bool: return "bool";
  }
  throw InternalError("unknown dtype");
}

DType parse_dtype(std::string_view name) {
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::F64, DType::I32, DType::I64, DType::Bool})
    if (dtype_name(t) == name) return t;
  fail("unknown dtype '{}' (expected one of f32, f16, bf16, f64, i32, i64, bool)", name);
}

bool is_floating(DType t) {
  return t == DType::F32 || t == DType::F16 || t == DType::BF16 || t == DType::F64;
}

}  // namespace weft
