#include <doctest/doctest.h>

#include <set>

#include "weft/core/error.hpp"
#include "weft/sharding/sharding_spec.hpp"

using namespace weft::sharding;

TEST_CASE("invalid specs raise clear errors") {
  auto msg = [](auto f) {
    try {
      f();
    } catch (const weft::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  // axis used twice: impossible by construction (one placement per axis), but the count is checked
  CHECK(msg([] {
          ShardingSpec({8}, {2, 2}, {Placement::shard(0)});
        }).find("one per mesh axis") != std::string::npos);
  CHECK(msg([] { ShardingSpec({8}, {2}, {Placement::shard(0, 3)}); }).find("does not divide") !=
        std::string::npos);
  CHECK(msg([] { ShardingSpec({8}, {2}, {Placement::shard(1)}); }).find("out of range") != std::string::npos);
  CHECK(msg([] { ShardingSpec({6}, {4}, {Placement::shard(0)}); }).find("not divisible") !=
        std::string::npos);
  CHECK(msg([] {
          ShardingSpec({8}, {2, 2}, {Placement::shard(0, 2), Placement::shard(0, 2)});
        }).find("overlap") != std::string::npos);
  CHECK(
      msg([] {
        ShardingSpec({8}, {2, 2}, {Placement::partial(ReduceKind::Sum), Placement::partial(ReduceKind::Max)});
      }).find("mix") != std::string::npos);
  CHECK(msg([] {
          ShardingSpec::parse("S(0) Q", {8}, {2, 2});
        }).find("unknown placement") != std::string::npos);
  CHECK(msg([] { ShardingSpec::parse("S(0)", {8}, {2, 2}); }).find("2-D mesh") != std::string::npos);
  CHECK_NOTHROW(ShardingSpec({6}, {4}, {Placement::shard(0)}, true));
  // "S(0) S(0)" in mesh-axis order is the same as parse("S0... alpa"): nested block
  CHECK(ShardingSpec::parse_alpa("S01R", {8, 4}, {2, 2}) == ShardingSpec::parse("S(0) S(0)", {8, 4}, {2, 2}));
  CHECK(ShardingSpec::parse_alpa("S10R", {8, 4}, {2, 2}) ==
        ShardingSpec::parse("S(0,2) S(0,4)", {8, 4}, {2, 2}));
}

TEST_CASE("notations: weft, Alpa, DTensor, JAX") {
  auto s = ShardingSpec::parse("[Shard(1), Replicate()]", {8, 4}, {2, 2});
  CHECK(s.to_string() == "S(1) R");
  CHECK(s.to_alpa() == "RS0");
  CHECK(s.to_dtensor() == "[Shard(1), Replicate()]");
  CHECK(s.to_jax() == "P(None, 'x')");
  auto t = ShardingSpec::parse("S(0,2) S(0,4)", {8, 4}, {2, 2});  // TP major on axis 1, FSDP minor on axis 0
  CHECK(t.to_alpa() == "S10R");
  CHECK(t.to_jax({"dp", "tp"}) == "P(('tp', 'dp'), None)");
  CHECK(t.to_dtensor() == "[_StridedShard(dim=0, split_factor=2), Shard(0)]");
  auto p = ShardingSpec::parse("P(max) S(1,1)", {8, 4}, {2, 2});
  CHECK(p.to_string() == "P(max) S(1,1)");
  CHECK(p.to_dtensor() == "[Partial('max'), _StridedShard(dim=1, split_factor=2)]");
  CHECK_THROWS_AS(p.to_alpa(), weft::Error);
  CHECK_THROWS_AS(p.to_jax(), weft::Error);
  CHECK(std::hash<ShardingSpec>{}(s) ==
        std::hash<ShardingSpec>{}(ShardingSpec::parse("S(1,2) R", {8, 4}, {2, 2})));
}

TEST_CASE("enumeration: Rhino's 16 specs for 256x256 on 4 devices, brute-force count on small cases") {
  CHECK(enumerate_specs({256, 256}, {4}).size() == 16);
  EnumerateOptions block;
  block.strided = false;
  CHECK(enumerate_specs({256, 256}, {4}, block).size() == 4);
  // Brute force: every (placement per axis) with any stride in 0..N, deduplicated by validity.
  const std::vector<int64_t> shape{4, 6}, mesh{2, 2};
  std::set<ShardingSpec> bf;
  std::vector<Placement> opts{Placement::replicate(), Placement::partial()};
  for (int d = 0; d < 2; ++d)
    for (int64_t s = 1; s <= 6; ++s) opts.push_back(Placement::shard(d, s));
  for (auto& a : opts)
    for (auto& b : opts) try {
        bf.insert(ShardingSpec(shape, mesh, {a, b}));
      } catch (const weft::Error&) {
      }
  auto e = enumerate_specs(shape, mesh);
  CHECK(std::set<ShardingSpec>(e.begin(), e.end()) == bf);
  CHECK(e.size() == bf.size());
}

TEST_CASE("reduced: every partial axis becomes replicated, shards and strides stay") {
  const auto p = ShardingSpec::parse("P(sum) S(1,4)", {8, 16}, {2, 4});
  CHECK(p.reduced() == ShardingSpec::parse("R S(1,4)", {8, 16}, {2, 4}));
  CHECK(!p.reduced().has_partial());
  const auto m = ShardingSpec::parse("S(0) P(max)", {8, 16}, {2, 4});
  CHECK(m.reduced().to_string() == "S(0) R");
  const auto whole = ShardingSpec::parse("S(0) S(1)", {8, 16}, {2, 4});
  CHECK(whole.reduced() == whole);
}
