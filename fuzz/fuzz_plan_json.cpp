// Plan JSON reader: any text gives a plan (that round-trips), or weft::Error.
#include "fuzz_target.hpp"
#include "weft/plan/plan.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return weft::fuzz::run_one(data, size, [](std::string_view text) {
    const auto p = weft::plan::Plan::from_json(text);
    (void)weft::plan::Plan::from_json(p.to_json());
    (void)p.summary();
  });
}
