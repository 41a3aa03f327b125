#pragma once
// Row-major strides of a shape: the executors' flat-index arithmetic (one definition for the
// program layout, the program executor and the cross-entropy valid fractions).
#include <cstddef>
#include <cstdint>
#include <vector>

namespace weft::exec::detail {

inline std::vector<std::int64_t> strides_of(const std::vector<std::int64_t>& s) {
  std::vector<std::int64_t> st(s.size(), 1);
  for (std::size_t i = s.size(); i-- > 1;) st[i - 1] = st[i] * s[i];
  return st;
}

}  // namespace weft::exec::detail
