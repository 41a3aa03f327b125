// Sharding spec parser: the first bytes choose a tensor shape and a mesh, the rest is the spec
// text; a parsed spec prints as text that parses back to it.
#include <string>
#include <vector>

#include "fuzz_target.hpp"
#include "weft/sharding/sharding_spec.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 4) return 0;
  std::vector<std::int64_t> shape, mesh;
  for (int i = 0; i < (data[0] & 3) + 1 && 1 + i < 4; ++i) shape.push_back(1 + data[1 + i] % 24);
  mesh = {1 + data[3] % 4, 1 + (data[3] >> 4) % 4};
  return weft::fuzz::run_one(data + 4, size - 4, [&](std::string_view text) {
    const auto s = weft::sharding::ShardingSpec::parse(text, shape, mesh);
    // What it prints parses back to the same spec.
    if (!(weft::sharding::ShardingSpec::parse(s.to_string(), shape, mesh) == s)) std::abort();
  });
}
