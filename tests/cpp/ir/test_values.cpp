// The values a model carries: set_value's checks, value files (safetensors) read and written
// byte-exactly, JSON round trips inline and with a sidecar, and copies (autodiff) keeping them.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>

#include "weft/core/error.hpp"
#include "weft/ir/autodiff.hpp"
#include "weft/ir/json.hpp"
#include "weft/ir/value_file.hpp"

using namespace weft::ir;
namespace fs = std::filesystem;

namespace {

// x [2, 3] @ w [3, 4] + bias [4] scaled by the constant eps-like `c` [1]; a buffer `pos` [4].
Graph small(TensorId* w, TensorId* c, TensorId* pos, TensorId* ids) {
  Graph g("values");
  auto x = g.input("x", {2, 3});
  *w = g.parameter("w", {3, 4});
  *c = g.constant("c", {1});
  *pos = g.buffer("pos", {4});
  *ids = g.constant("bucket", {2, 2}, weft::DType::I64);
  auto y = g.add(g.mul(g.matmul(x, *w), *c), *pos);
  g.set_loss(g.reduce(ReduceFn::Sum, y, {0, 1}));
  return g;
}

fs::path temp(const char* name) {
  return fs::temp_directory_path() / (std::string("weft_test_values_") + name);
}

}  // namespace

TEST_CASE("values: set_value checks the leaf, the shape and integrality") {
  TensorId w, c, pos, ids;
  Graph g = small(&w, &c, &pos, &ids);
  g.set_value(w, HostTensor{{3, 4}, std::vector<double>(12, 0.5)});
  CHECK(g.value(w) != nullptr);
  CHECK(g.value(c) == nullptr);
  CHECK_THROWS_WITH_AS(g.set_value(w, HostTensor{{4, 3}, std::vector<double>(12, 0)}),
                       doctest::Contains("value of 'w': shape [4, 3], the tensor has [3, 4]"), weft::Error);
  CHECK_THROWS_WITH_AS(g.set_value(ids, HostTensor{{2, 2}, {0, 1, 2.5, 3}}),
                       doctest::Contains("2.5 is not an integer"), weft::Error);
  CHECK_THROWS_WITH_AS(g.set_value(*g.find_tensor("x"), HostTensor{{2, 3}, std::vector<double>(6, 0)}),
                       doctest::Contains("'x' (input) cannot carry a value"), weft::Error);
  CHECK_THROWS_WITH_AS(g.set_value(*g.loss(), HostTensor{{}, {1}}), doctest::Contains("computed by an op"),
                       weft::Error);
  g.set_value(ids, HostTensor{{2, 2}, {0, 1, -1, 3}});  // a bucket id of -1 is a value, not a guess
  CHECK(g.value(ids)->data->data[2] == -1);
  // Copies (autodiff's training graph) share the value; the content compares equal.
  Graph step = build_training_graph(g, {});
  REQUIRE(step.value(w) != nullptr);
  CHECK(step.value(w)->data == g.value(w)->data);
  CHECK(step.tensor(pos).role == Role::Buffer);
}

TEST_CASE("values: a value file is read and written exactly, in every dtype safetensors names") {
  // Hand-written file: F32 [2] = {1.5, -2}, BF16 [1] = 0x3FC0 (1.5), I32 [2] = {-1, 7}, BOOL [1].
  const fs::path p = temp("hand.safetensors");
  std::string header =
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"BF16","shape":[1],"data_offsets":[8,10]},)"
      R"("c":{"dtype":"I32","shape":[2],"data_offsets":[10,18]},"d":{"dtype":"BOOL","shape":[1],"data_offsets":[18,19]},)"
      R"("__metadata__":{"format":"pt"}})";
  {
    std::ofstream f(p, std::ios::binary);
    const std::uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) f.put(static_cast<char>((n >> (8 * i)) & 0xff));
    f << header;
    const float a[2] = {1.5f, -2.f};
    f.write(reinterpret_cast<const char*>(a), 8);
    f.put(static_cast<char>(0xC0)).put(static_cast<char>(0x3F));  // bf16 1.5, little-endian
    const std::int32_t c[2] = {-1, 7};
    f.write(reinterpret_cast<const char*>(c), 8);
    f.put(1);
  }
  CHECK(read_value(p.string(), "a").data == std::vector<double>{1.5, -2});
  CHECK(read_value(p.string(), "b").data == std::vector<double>{1.5});
  CHECK(read_value(p.string(), "c").data == std::vector<double>{-1, 7});
  CHECK(read_value(p.string(), "d").data == std::vector<double>{1});
  CHECK(read_value_file_header(p.string()).at("a").shape == std::vector<std::int64_t>{2});
  CHECK_THROWS_WITH_AS(read_value(p.string(), "zz"),
                       doctest::Contains("has no tensor 'zz' (it has 4 tensors: a, b, c, d)"), weft::Error);
  // Written: F64 and I64, bit-exact (an awkward double, a NaN, -inf, a large integer).
  const fs::path q = temp("written.safetensors");
  HostTensor f{{2, 2},
               {0.1234567890123456789, std::nan(""), -std::numeric_limits<double>::infinity(), 1e-310}};
  HostTensor i{{3}, {-1, 0, 9007199254740991.0}};
  write_value_file(q.string(), {{"f", {f, weft::DType::F32}}, {"i", {i, weft::DType::I64}}});
  const HostTensor f2 = read_value(q.string(), "f");
  CHECK(f2.shape == f.shape);
  CHECK(f2.data[0] == f.data[0]);
  CHECK(std::isnan(f2.data[1]));
  CHECK(f2.data[2] == f.data[2]);
  CHECK(f2.data[3] == f.data[3]);
  CHECK(read_value(q.string(), "i") == i);
  CHECK(read_value_file_header(q.string()).at("i").dtype == "I64");
  // Not a value file.
  const fs::path r = temp("bad.safetensors");
  {
    std::ofstream(r, std::ios::binary) << "\x05\0\0\0\0\0\0\0{oops";
  }
  CHECK_THROWS_AS(read_value_file_header(r.string()), weft::Error);
  fs::remove(p), fs::remove(q), fs::remove(r);
}

TEST_CASE("values: JSON round trip, inline and with a sidecar value file") {
  TensorId w, c, pos, ids;
  Graph g = small(&w, &c, &pos, &ids);
  std::vector<double> wv;
  for (int k = 0; k < 12; ++k) wv.push_back(1.0 / (k + 3));
  g.set_value(w, HostTensor{{3, 4}, wv});
  g.set_value(c, HostTensor{{1}, {-std::numeric_limits<double>::infinity()}});
  g.set_value(pos, HostTensor{{4}, {0.1, 0.2, 0.3, 1e300}});
  g.set_value(ids, HostTensor{{2, 2}, {0, 1, -1, 3}});
  g.set_seed_parameters(false);
  // Inline: every number exact, -inf as "-inf".
  const std::string text = graph_to_json(g);
  CHECK(text.find("\"-inf\"") != std::string::npos);
  Graph back = graph_from_json(text);
  CHECK(back == g);
  CHECK(!back.seed_parameters());
  // A sidecar for values of more than 4 elements (w: 12), named relative to the JSON's folder.
  const fs::path dir = temp("dir");
  fs::create_directories(dir);
  JsonValueOptions vo;
  vo.inline_limit = 4, vo.sidecar_path = (dir / "m.values.safetensors").string(),
  vo.sidecar_ref = "m.values.safetensors";
  const std::string text2 = graph_to_json(g, -1, vo);
  CHECK(text2.find("\"value_file\":\"m.values.safetensors\"") != std::string::npos);
  Graph back2 = graph_from_json(text2, dir.string());
  REQUIRE(back2.value(w) != nullptr);
  CHECK(!back2.value(w)->in_memory());
  CHECK(back2.value(w)->load() == *g.value(w)->data);
  CHECK(back2.value(pos)->in_memory());
  CHECK(*back2.value(pos)->data == *g.value(pos)->data);
  // Without the folder the relative file is not found: the error names it.
  Graph lost = graph_from_json(text2);
  CHECK_THROWS_WITH_AS((void)lost.value(w)->load(), doctest::Contains("m.values.safetensors"), weft::Error);
  // A value of the wrong length is refused with its JSON path.
  std::string broken = text;
  broken.replace(broken.find("0.1,0.2,0.3"), 11, "0.1,0.2");
  CHECK_THROWS_WITH_AS(graph_from_json(broken), doctest::Contains("$.tensors[3].value"), weft::Error);
  fs::remove_all(dir);
}
