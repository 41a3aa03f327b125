#include <doctest/doctest.h>

#include "weft/core/dtype.hpp"
#include "weft/core/error.hpp"

TEST_CASE("dtype names round trip and sizes are right") {
  using weft::DType;
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::F64, DType::I32, DType::I64, DType::Bool})
    CHECK(weft::parse_dtype(weft::dtype_name(t)) == t);
  CHECK(weft::dtype_size(DType::BF16) == 2);
  CHECK(weft::dtype_size(DType::I64) == 8);
  CHECK_THROWS_AS(weft::parse_dtype("f8"), weft::Error);
}
