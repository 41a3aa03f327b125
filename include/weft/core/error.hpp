#pragma once
// weft::Error is the one exception type for bad input (Python: ValueError). InternalError marks a
// broken invariant inside weft (Python: RuntimeError). WEFT_CHECK builds the message with fmt.
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace weft {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

class InternalError : public Error {
 public:
  explicit InternalError(const std::string& what) : Error("internal error: " + what) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace weft

// Throws weft::Error with a formatted message when cond is false.
#define WEFT_CHECK(cond, ...)                        \
  do {                                               \
    if (!(cond)) ::weft::fail(__VA_ARGS__);          \
  } while (0)

#define WEFT_ASSERT(cond, msg)                                                           \
  do {                                                                                   \
    if (!(cond)) throw ::weft::InternalError(std::string(__FILE__) + ":" +               \
                                             std::to_string(__LINE__) + ": " + (msg));   \
  } while (0)
