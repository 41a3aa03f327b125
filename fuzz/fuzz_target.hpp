#pragma once
// The contract every fuzz target checks: bad input ends in weft::Error (a user error, with a
// message); an InternalError (a broken invariant), any other exception, a crash, a hang or a
// sanitizer report is a bug. LLVMFuzzerTestOneInput is libFuzzer's entry point.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "weft/core/error.hpp"

namespace weft::fuzz {

template <typename F>
int run_one(const std::uint8_t* data, std::size_t size, F&& body) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    body(text);
  } catch (const InternalError&) {
    std::abort();  // a weft invariant broke: report it
  } catch (const Error&) {
    // bad input, reported with a message: the expected outcome
  }
  return 0;
}

}  // namespace weft::fuzz
