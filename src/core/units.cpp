// Adaptive units for sizes, times and work (units.hpp).
#include "weft/core/units.hpp"

#include <fmt/format.h>

#include <array>
#include <cmath>
#include <string>
#include <utility>

namespace weft {

namespace {

// x in the largest of `units` (factor, name; ascending) it is at least 1 of, with `digits`
// significant digits; one unit up when rounding reaches the next power (999.7 kB is "1 MB", not
// "1e+03 kB").
template <std::size_t N>
std::string scaled(double x, const std::array<std::pair<double, const char*>, N>& units, int digits) {
  if (!std::isfinite(x)) return fmt::format("{} {}", x, units[0].second);
  if (x == 0) return fmt::format("0 {}", units[0].second);
  std::size_t u = 0;
  while (u + 1 < N && std::abs(x) >= units[u + 1].first) ++u;
  std::string text = fmt::format("{:.{}g}", x / units[u].first, digits);
  if (u + 1 < N && std::abs(std::stod(text)) >= units[u + 1].first / units[u].first)
    text = fmt::format("{:.{}g}", x / units[++u].first, digits);
  return fmt::format("{} {}", text, units[u].second);
}

}  // namespace

std::string format_bytes(double bytes) {
  static constexpr std::array<std::pair<double, const char*>, 6> units{
      {{1, "B"}, {1e3, "kB"}, {1e6, "MB"}, {1e9, "GB"}, {1e12, "TB"}, {1e15, "PB"}}};
  if (std::isfinite(bytes) && std::abs(bytes) < 1e3) return fmt::format("{:.0f} B", bytes);
  return scaled(bytes, units, 3);
}

std::string format_seconds(double seconds) {
  static constexpr std::array<std::pair<double, const char*>, 5> units{
      {{1e-9, "ns"}, {1e-6, "µs"}, {1e-3, "ms"}, {1, "s"}, {60, "min"}}};
  if (!std::isfinite(seconds)) return fmt::format("{} s", seconds);
  if (seconds == 0) return "0 s";
  return scaled(seconds, units, 4);
}

std::string format_flops(double flops, bool per_second) {
  static constexpr std::array<std::pair<double, const char*>, 7> units{{{1, "FLOP"},
                                                                        {1e3, "kFLOP"},
                                                                        {1e6, "MFLOP"},
                                                                        {1e9, "GFLOP"},
                                                                        {1e12, "TFLOP"},
                                                                        {1e15, "PFLOP"},
                                                                        {1e18, "EFLOP"}}};
  return scaled(flops, units, 3) + (per_second ? "/s" : "");
}

}  // namespace weft
