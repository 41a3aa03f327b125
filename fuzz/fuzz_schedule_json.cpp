// Schedule JSON reader: any text gives a valid schedule, or weft::Error.
#include <string>

#include "fuzz_target.hpp"
#include "weft/schedule/schedule.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return weft::fuzz::run_one(data, size, [](std::string_view text) {
    const auto s = weft::schedule::Schedule::from_json(std::string(text));
    (void)weft::schedule::Schedule::from_json(s.to_json());
  });
}
