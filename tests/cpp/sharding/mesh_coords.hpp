#pragma once
// Test helper: every coordinate of a mesh in row-major order (an enumeration independent of
// DeviceMesh, so the brute-force oracles do not lean on the code they check).
#include <cstddef>
#include <cstdint>
#include <vector>

namespace weft::test {

inline std::vector<std::vector<int64_t>> mesh_coords(const std::vector<int64_t>& mesh) {
  std::vector<std::vector<int64_t>> out;
  std::vector<int64_t> c(mesh.size(), 0);
  while (true) {
    out.push_back(c);
    int i = static_cast<int>(mesh.size()) - 1;
    for (; i >= 0; --i) {
      if (++c[static_cast<std::size_t>(i)] < mesh[static_cast<std::size_t>(i)]) break;
      c[static_cast<std::size_t>(i)] = 0;
    }
    if (i < 0) break;
  }
  return out;
}

}  // namespace weft::test
