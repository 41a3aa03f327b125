// Program JSON reader: any text gives a program that passes check(), or weft::Error.
#include "fuzz_target.hpp"
#include "weft/lower/program.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return weft::fuzz::run_one(data, size, [](std::string_view text) {
    const auto p = weft::lower::Program::from_json(text);
    weft::lower::check(p);
    (void)p.to_json();
  });
}
