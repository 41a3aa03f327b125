// Figures for people: a size, a time or an amount of work with the unit that keeps three
// significant digits visible (a tiny model's step is 478 µs, not "0.0005 s"; its memory 497 kB,
// not "0.000497 GB"). Python's weft._units does the same for the Python displays.
#pragma once

#include <string>

namespace weft {

// Bytes in decimal units, 3 significant digits: "0 B", "512 B", "1.5 kB", "497 MB", "30.9 GB".
std::string format_bytes(double bytes);
// Seconds, 4 significant digits: "0 s", "850 ns", "478.3 µs", "1.59 ms", "12.3 s", "2.5 min".
std::string format_seconds(double seconds);
// Floating-point operations, 3 significant digits: "41.6 MFLOP", "3.2 TFLOP" (per_second: "FLOP/s").
std::string format_flops(double flops, bool per_second = false);

}  // namespace weft
