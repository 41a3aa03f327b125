#pragma once
// Counter-based random numbers: Philox4x32-10 (Salmon et al., SC'11; as in Random123, JAX, PyTorch).
//
// Why counter-based: distributed parameter initialisation must give every shard exactly the slice of
// the global initialisation, whatever the plan (Rhino §6.3). So each value is a pure function of
// (seed, key, global element index) -- no generator state, no draw order, no global state -- and a
// device can initialise any subset of elements on its own and agree bit-for-bit with any other plan.
#include <array>
#include <cstdint>
#include <span>
#include <string_view>

namespace weft {

using Philox4x32 = std::array<std::uint32_t, 4>;

// The Philox4x32 bijection with 10 rounds: one 128-bit counter block -> 128 random bits.
Philox4x32 philox4x32_10(Philox4x32 counter, std::array<std::uint32_t, 2> key);

// FNV-1a 64 of the bytes of `name` (e.g. a parameter name -> stream key); stable across platforms/runs.
std::uint64_t stable_key(std::string_view name);

// Value number `index` of stream (seed, key):
//   counter = {lo32(index), hi32(index), lo32(key), hi32(key)}, philox key = {lo32(seed), hi32(seed)}.
double uniform01(std::uint64_t seed, std::uint64_t key, std::uint64_t index);  // in [0, 1), 53 bits (words 0,1)
// Standard normal by Box-Muller: u1 in (0, 1] from words 0,1, u2 in [0, 1) from words 2,3, cos branch.
double normal01(std::uint64_t seed, std::uint64_t key, std::uint64_t index);

// out[i] = scale * normal01(seed, key, first + i * step), for a contiguous run of a shard's elements.
void fill_normal(std::span<double> out, std::uint64_t seed, std::uint64_t key, std::uint64_t first,
                 std::uint64_t step = 1, double scale = 1.0);

}  // namespace weft
