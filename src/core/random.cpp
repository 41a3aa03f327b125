#include "weft/core/random.hpp"

#include <cmath>
#include <numbers>

namespace weft {

namespace {

constexpr std::uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;  // round multipliers
constexpr std::uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;  // Weyl key increments
constexpr double k2Pow53Inv = 1.0 / 9007199254740992.0;        // 2^-53

std::uint32_t lo32(std::uint64_t x) { return static_cast<std::uint32_t>(x); }
std::uint32_t hi32(std::uint64_t x) { return static_cast<std::uint32_t>(x >> 32); }

Philox4x32 block(std::uint64_t seed, std::uint64_t key, std::uint64_t index) {
  return philox4x32_10({lo32(index), hi32(index), lo32(key), hi32(key)}, {lo32(seed), hi32(seed)});
}

// Top 53 bits of the 64-bit word (hi:lo) as an integer in [0, 2^53).
std::uint64_t bits53(std::uint32_t lo, std::uint32_t hi) {
  return ((static_cast<std::uint64_t>(hi) << 32) | lo) >> 11;
}

}  // namespace

Philox4x32 philox4x32_10(Philox4x32 c, std::array<std::uint32_t, 2> k) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k[0] += kW0;
      k[1] += kW1;
    }
    const std::uint64_t p0 = static_cast<std::uint64_t>(kM0) * c[0];
    const std::uint64_t p1 = static_cast<std::uint64_t>(kM1) * c[2];
    c = {hi32(p1) ^ c[1] ^ k[0], lo32(p1), hi32(p0) ^ c[3] ^ k[1], lo32(p0)};
  }
  return c;
}

std::uint64_t stable_key(std::string_view name) {
  std::uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a 64 offset basis
  for (unsigned char b : name) {
    h ^= b;
    h *= 0x100000001b3ull;  // FNV-1a 64 prime
  }
  return h;
}

double uniform01(std::uint64_t seed, std::uint64_t key, std::uint64_t index) {
  const Philox4x32 r = block(seed, key, index);
  return static_cast<double>(bits53(r[0], r[1])) * k2Pow53Inv;
}

double normal01(std::uint64_t seed, std::uint64_t key, std::uint64_t index) {
  const Philox4x32 r = block(seed, key, index);
  const double u1 = static_cast<double>(bits53(r[0], r[1]) + 1) * k2Pow53Inv;  // (0, 1]: log is finite
  const double u2 = static_cast<double>(bits53(r[2], r[3])) * k2Pow53Inv;      // [0, 1)
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

void fill_normal(std::span<double> out, std::uint64_t seed, std::uint64_t key, std::uint64_t first,
                 std::uint64_t step, double scale) {
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = scale * normal01(seed, key, first + i * step);
}

}  // namespace weft
