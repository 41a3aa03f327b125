// Cluster JSON reader: any text gives a valid cluster (that round-trips), or weft::Error.
#include "fuzz_target.hpp"
#include "weft/cluster/cluster.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return weft::fuzz::run_one(data, size, [](std::string_view text) {
    const auto c = weft::cluster::Cluster::from_json(text);
    if (!(weft::cluster::Cluster::from_json(c.to_json()) == c)) std::abort();
  });
}
