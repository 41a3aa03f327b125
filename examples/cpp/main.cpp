// Uses weft as a library from another CMake project.
#include <fmt/format.h>

#include "weft/core/dtype.hpp"

int main() {
  fmt::print("bf16 is {} bytes\n", weft::dtype_size(weft::DType::BF16));
  return 0;
}
