// DTensor placements (to_dtensor / parse) against an independent model of DTensor's sharding:
// placements applied in mesh order, Shard(d) = torch.chunk of the piece left by earlier axes,
// _StridedShard(d, f) = torch.chunk into f runs, each chunked into k, shard i = chunk i of every
// run concatenated (torch/distributed/tensor/placement_types.py, _StridedShard._split_tensor).
#include <doctest/doctest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "mesh_coords.hpp"
#include "weft/core/error.hpp"
#include "weft/sharding/sharding_spec.hpp"
#include "weft/sharding/tile.hpp"

using namespace weft::sharding;

namespace {

struct DTensorShard {
  int dim = -1;        // -1: Replicate or Partial (no split)
  int64_t factor = 1;  // _StridedShard split factor (1: Shard)
};

// The placement words of a to_dtensor() text, read with sscanf (independent of weft's parser).
std::vector<DTensorShard> read_words(const std::string& text) {
  std::vector<DTensorShard> out;
  std::size_t i = 0;
  while ((i = text.find_first_not_of("[, ", i)) != std::string::npos && text[i] != ']') {
    const std::size_t end = text.find(')', i);
    const std::string word = text.substr(i, end - i + 1);
    DTensorShard w;
    int d = 0;
    long long f = 0;
    if (std::sscanf(word.c_str(), "_StridedShard(dim=%d, split_factor=%lld)", &d, &f) == 2) {
      w = {d, f};
    } else if (std::sscanf(word.c_str(), "Shard(%d)", &d) == 1) {
      w = {d, 1};
    }
    out.push_back(w);
    i = end + 1;
  }
  return out;
}

// torch.chunk(n items, k): chunks of ceil(n/k); the last ones smaller or empty.
std::vector<std::vector<int64_t>> chunk(const std::vector<int64_t>& v, int64_t k) {
  const auto n = static_cast<int64_t>(v.size());
  const int64_t size = (n + k - 1) / k;
  std::vector<std::vector<int64_t>> out(static_cast<std::size_t>(k));
  for (int64_t i = 0; i < n; ++i)
    out[static_cast<std::size_t>(i / size)].push_back(v[static_cast<std::size_t>(i)]);
  return out;
}

// Global indices of `dim` that DTensor gives the device at `coord`.
std::vector<int64_t> dtensor_indices(const std::vector<DTensorShard>& words, const std::vector<int64_t>& mesh,
                                     const std::vector<int64_t>& coord, int dim, int64_t n) {
  std::vector<int64_t> piece;
  for (int64_t e = 0; e < n; ++e) piece.push_back(e);
  for (std::size_t a = 0; a < words.size(); ++a) {
    if (words[a].dim != dim) continue;
    std::vector<int64_t> mine;
    for (const auto& run : chunk(piece, words[a].factor)) {
      const auto part = chunk(run, mesh[a])[static_cast<std::size_t>(coord[a])];
      mine.insert(mine.end(), part.begin(), part.end());
    }
    piece = mine;
  }
  return piece;
}

std::string message(const std::string& text, std::vector<int64_t> shape, std::vector<int64_t> mesh) {
  try {
    ShardingSpec::parse(text, std::move(shape), std::move(mesh));
  } catch (const weft::Error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("to_dtensor means what DTensor does, and parse reads it back, for every spec of small cases") {
  struct Case {
    std::vector<int64_t> shape, mesh;
    bool padding;
  };
  const std::vector<Case> cases = {{{8, 4}, {2, 2}, false}, {{16}, {2, 4}, false},    {{12}, {2, 3}, false},
                                   {{8}, {2, 2, 2}, false}, {{24}, {2, 3, 2}, false}, {{6, 4}, {3, 2}, false},
                                   {{6}, {4}, true},        {{5, 4}, {2, 2}, true}};
  int checked = 0, refused = 0;
  for (const auto& c : cases) {
    EnumerateOptions o;
    o.allow_padding = c.padding;
    for (const auto& spec : enumerate_specs(c.shape, c.mesh, o)) {
      std::string text;
      try {
        text = spec.to_dtensor();
      } catch (const weft::Error&) {
        CHECK(spec.is_padded());  // only uneven dims may be refused
        ++refused;
        continue;
      }
      const auto words = read_words(text);
      REQUIRE(words.size() == c.mesh.size());
      for (const auto& coord : weft::test::mesh_coords(c.mesh)) {
        const Tile t = tile_of(spec, coord);
        for (int d = 0; d < spec.rank(); ++d)
          CHECK_MESSAGE(
              t.indices(d) == dtensor_indices(words, c.mesh, coord, d, c.shape[static_cast<std::size_t>(d)]),
              spec.to_string() << " -> " << text);
      }
      CHECK_MESSAGE(ShardingSpec::parse(text, c.shape, c.mesh, c.padding) == spec, spec.to_string()
                                                                                       << " -> " << text);
      ++checked;
    }
  }
  CHECK(checked > 400);
  CHECK(refused > 0);  // the uneven nested / strided ones
}

TEST_CASE("parse reads DTensor's own repr and str of placements") {
  const auto fsdp_tp = ShardingSpec::parse("S(0,2) S(0,4)", {8, 4}, {2, 2});
  CHECK(ShardingSpec::parse("[_StridedShard(dim=0, sf=2), Shard(dim=0)]", {8, 4}, {2, 2}) == fsdp_tp);
  CHECK(ShardingSpec::parse("[_S(0, 2), S(0)]", {8, 4}, {2, 2}) == fsdp_tp);
  CHECK(ShardingSpec::parse("(_StridedShard(dim=0, sf=2), Shard(dim=0))", {8, 4}, {2, 2}) ==
        fsdp_tp);  // a tuple
  CHECK(ShardingSpec::parse(" (Shard(dim=1),) ", {8, 4}, {2}) == ShardingSpec::parse("S(1)", {8, 4}, {2}));
  CHECK(ShardingSpec::parse("[Partial(sum), _StridedShard(dim=1, split_factor=2)]", {8, 4}, {2, 2}) ==
        ShardingSpec::parse("P(sum) S(1,1)", {8, 4}, {2, 2}));
  // A split factor on a size-1 axis or f = 1 changes nothing.
  CHECK(ShardingSpec::parse("[_StridedShard(dim=0, sf=1)]", {8}, {4}) ==
        ShardingSpec::parse("S(0)", {8}, {4}));
  CHECK(ShardingSpec::parse("[_StridedShard(dim=0, sf=3), Shard(0)]", {8}, {1, 4}) ==
        ShardingSpec::parse("S(0) S(0)", {8}, {1, 4}));
}

TEST_CASE("DTensor placements weft cannot say are refused with the reason") {
  // Axis 1 takes single elements of the pieces {0,1,4,5} / {2,3,6,7}: two digits of the dim.
  CHECK(message("[_StridedShard(dim=0, sf=2), Shard(0)]", {8}, {2, 4}).find("no single digit") !=
        std::string::npos);
  CHECK(message("[_StridedShard(dim=0, sf=3)]", {8}, {2}).find("does not divide") != std::string::npos);
  CHECK(message("[_StridedShard(dim=0, sf=2)]", {9}, {2}).find("uneven") != std::string::npos);
  CHECK(message("[_StridedShard(dim=0, sf=2), S(0,1)]", {8}, {2, 2}).find("one notation") !=
        std::string::npos);
  CHECK(message("[_StridedShard(dim=0)]", {8}, {2}).find("split factor") != std::string::npos);
}
