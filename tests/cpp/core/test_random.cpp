#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "weft/core/random.hpp"

using weft::Philox4x32;

TEST_CASE("philox4x32-10 matches the Random123 known-answer vectors") {
  CHECK(weft::philox4x32_10({0, 0, 0, 0}, {0, 0}) ==
        Philox4x32{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u});
  CHECK(weft::philox4x32_10({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu}) ==
        Philox4x32{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu});
  CHECK(weft::philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u}) ==
        Philox4x32{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u});
}

TEST_CASE("stable_key is FNV-1a 64") {
  CHECK(weft::stable_key("") == 0xcbf29ce484222325ull);
  CHECK(weft::stable_key("a") == 0xaf63dc4c8601ec8cull);
  CHECK(weft::stable_key("w1") != weft::stable_key("w2"));
}

TEST_CASE("values are pure functions of (seed, key, index)") {
  const std::uint64_t key = weft::stable_key("layer0.weight");
  for (std::uint64_t i : {0ull, 1ull, 12345ull, (1ull << 40) + 7}) {
    CHECK(weft::uniform01(7, key, i) == weft::uniform01(7, key, i));
    CHECK(weft::normal01(7, key, i) == weft::normal01(7, key, i));
    CHECK(weft::uniform01(7, key, i) != weft::uniform01(8, key, i));        // seed matters
    CHECK(weft::uniform01(7, key, i) != weft::uniform01(7, key + 1, i));    // key matters
    CHECK(weft::uniform01(7, key, i) != weft::uniform01(7, key, i + 1));    // index matters
    CHECK(weft::normal01(7, key, i) != weft::normal01(7, key ^ (1ull << 32), i));  // high key word matters
  }
}

TEST_CASE("a shard filled locally equals the slice of the global fill") {
  const std::uint64_t seed = 42, key = weft::stable_key("embed");
  std::vector<double> global(64);
  weft::fill_normal(global, seed, key, 0, 1, 0.02);
  for (std::size_t i = 0; i < global.size(); ++i) CHECK(global[i] == 0.02 * weft::normal01(seed, key, i));
  std::vector<double> shard(16);
  weft::fill_normal(shard, seed, key, 32);
  for (std::size_t i = 0; i < shard.size(); ++i) CHECK(0.02 * shard[i] == global[32 + i]);
  std::vector<double> strided(8);  // every 8th element: a column of an 8x8 row-major matrix
  weft::fill_normal(strided, seed, key, 3, 8, 0.02);
  for (std::size_t i = 0; i < strided.size(); ++i) CHECK(strided[i] == global[3 + 8 * i]);
}

TEST_CASE("uniform01 lies in [0, 1) with mean 1/2") {
  constexpr int n = 100000;
  double sum = 0;
  bool in_range = true;
  for (int i = 0; i < n; ++i) {
    const double u = weft::uniform01(1, 2, static_cast<std::uint64_t>(i));
    in_range = in_range && u >= 0.0 && u < 1.0;
    sum += u;
  }
  CHECK(in_range);
  CHECK(std::abs(sum / n - 0.5) < 0.01);
}

TEST_CASE("normal01 has mean 0 and variance 1") {
  constexpr int n = 100000;
  double sum = 0, sum_sq = 0;
  bool finite = true;
  for (int i = 0; i < n; ++i) {
    const double z = weft::normal01(3, 4, static_cast<std::uint64_t>(i));
    finite = finite && std::isfinite(z);
    sum += z;
    sum_sq += z * z;
  }
  const double mean = sum / n;
  CHECK(finite);
  CHECK(std::abs(mean) < 0.02);
  CHECK(std::abs(sum_sq / n - mean * mean - 1.0) < 0.02);
}
