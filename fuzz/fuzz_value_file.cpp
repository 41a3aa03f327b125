// Value file (safetensors) reader: any bytes give a header whose every tensor reads back, or
// weft::Error naming the file. The reader takes a path, so each input is written to a file first.
#include <unistd.h>

#include <fstream>
#include <string>

#include "fuzz_target.hpp"
#include "weft/ir/value_file.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string path = "/tmp/weft_fuzz_value_file_" + std::to_string(::getpid()) + ".safetensors";
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  return weft::fuzz::run_one(data, size, [](std::string_view) {
    for (const auto& [key, entry] : weft::ir::read_value_file_header(path)) {
      const auto t = weft::ir::read_value(path, key);
      if (static_cast<std::int64_t>(t.data.size()) != t.numel()) std::abort();
    }
  });
}
