// Bandwidth trace JSON reader: any text gives a valid trace whose queries are finite, or weft::Error.
#include <cmath>
#include <string>

#include "fuzz_target.hpp"
#include "weft/cluster/bandwidth_trace.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return weft::fuzz::run_one(data, size, [](std::string_view text) {
    const auto t = weft::cluster::BandwidthTrace::from_json(std::string(text));
    const double end = t.finish_time(0.5, 1.0, 1.0);
    if (!(end >= 0.5) || std::isnan(end)) std::abort();
  });
}
