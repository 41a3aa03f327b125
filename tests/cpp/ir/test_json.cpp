// JSON round trips (exact, including training graphs) and every kind of malformed input.
#include <doctest/doctest.h>

#include <functional>
#include <nlohmann/json.hpp>

#include "weft/core/error.hpp"
#include "weft/ir/autodiff.hpp"
#include "weft/ir/json.hpp"

using namespace weft::ir;
using nlohmann::json;

namespace {

// A forward graph that uses every forward kind except opaque (added separately).
Graph zoo() {
  Graph g("zoo");
  auto x = g.input("x", {2, 3, 4});
  auto w = g.parameter("w", {4, 6});
  auto gm = g.parameter("gamma", {6});
  auto bt = g.parameter("beta", {6});
  auto h = g.layer_norm(g.matmul(x, w), gm, bt, 1e-6);
  h = g.unary(UnaryFn::Scale, g.unary(UnaryFn::Gelu, h), "scaled", 0.1234567890123);
  auto r = g.reshape(h, {2, 3, 2, 3});
  auto t = g.transpose(r, {0, 2, 1, 3});
  auto c = g.concat({g.slice(t, 1, 0, 1), g.slice(t, 1, 1, 2)}, 1);
  auto s = g.softmax(g.reduce(ReduceFn::Max, c, {3}), -1);
  auto table = g.parameter("table", {7, 3}, weft::DType::BF16);
  auto ids = g.input("ids", {2, 2}, weft::DType::I32);
  auto e = g.embedding(table, ids);
  auto lg = g.einsum("bnh,bsh->bns", {s, g.unary(UnaryFn::Exp, g.reduce(ReduceFn::Mean, t, {3}))});
  auto lab = g.input("labels", {2, 2}, weft::DType::I64);
  auto img = g.input("img", {1, 2, 6, 6});
  auto k = g.parameter("k", {3, 2, 3, 3});
  auto p = g.pool2d(ReduceFn::Max, g.conv2d(img, k, 2, 1), 2, 1, 0);
  auto loss =
      g.add(g.cross_entropy(lg, lab),
            g.reduce(ReduceFn::Sum, g.binary(BinaryFn::Div, p, g.constant("two", {1})), {0, 1, 2, 3}));
  g.set_loss(loss);
  g.mark_output(e);
  return g;
}

std::string mutate(const std::string& text, const std::function<void(json&)>& f) {
  json j = json::parse(text);
  f(j);
  return j.dump();
}

}  // namespace

TEST_CASE("JSON round trip is exact for forward and training graphs") {
  Graph g = zoo();
  g.validate();
  std::string s = graph_to_json(g);
  Graph back = graph_from_json(s);
  CHECK(back == g);
  CHECK(graph_to_json(back) == s);
  CHECK(graph_from_json(graph_to_json(g, 2)) == g);
  Graph t = build_training_graph(g);
  Graph tb = graph_from_json(graph_to_json(t));
  CHECK(tb == t);
  REQUIRE(tb.grad(*tb.find_tensor("w")).has_value());
  CHECK(tb.grad(*tb.find_tensor("w")) == t.grad(*t.find_tensor("w")));
  // A loaded graph keeps building without name clashes.
  REQUIRE(tb.has_op_name("einsum_0"));
  auto y = tb.matmul(*tb.find_tensor("x"), *tb.find_tensor("w"));
  CHECK(tb.op(tb.tensor(y).producer).name == "einsum_1");
  tb.validate();
}

TEST_CASE("malformed JSON is a weft::Error naming the path") {
  std::string s = graph_to_json(zoo());
  auto err = [](const std::string& text, const char* part) {
    CHECK_THROWS_WITH_AS(graph_from_json(text), doctest::Contains(part), weft::Error);
  };
  err("{not json", "not valid JSON");
  err("[1,2]", "$: expected an object");
  err(mutate(s, [](json& j) { j["format"] = "other"; }), "$.format");
  err(mutate(s, [](json& j) { j.erase("tensors"); }), "missing field 'tensors'");
  err(mutate(s, [](json& j) { j["tensors"][0]["dtype"] = "f7"; }), "$.tensors[0].dtype: unknown dtype 'f7'");
  err(mutate(s, [](json& j) { j["tensors"][1]["role"] = "weight"; }),
      "$.tensors[1].role: unknown tensor role");
  err(mutate(s,
             [](json& j) {
               j["tensors"][0]["shape"] = {2, "3"};
             }),
      "$.tensors[0].shape[1]: expected an integer");
  err(mutate(s, [](json& j) { j["tensors"][0]["shape"] = {2, 0, 4}; }), "non-positive");
  err(mutate(s, [](json& j) { j["ops"][0]["kind"] = "matmul"; }), "unknown op kind 'matmul'");
  err(mutate(s, [](json& j) { j["ops"][0]["kind"] = "matmul"; }), "$.ops[0]");
  err(mutate(s, [](json& j) { j["ops"][2]["attrs"]["unary"] = "swish"; }), "unknown unary function 'swish'");
  err(mutate(s, [](json& j) { j["ops"][1]["attrs"]["bogus"] = 1; }), "unknown attribute");
  err(mutate(s, [](json& j) { j["ops"][0]["inputs"][0] = 999; }), "tensor id 999 does not exist (dangling");
  err(mutate(s, [](json& j) { j["outputs"].push_back(-5); }), "$.outputs[1]");
  err(mutate(s, [](json& j) { j["loss"] = 0; }), "$.loss: loss 'x' is not a scalar");
}

TEST_CASE("JSON with wrong shapes, tampered index maps or cycles is rejected by validation") {
  std::string s = graph_to_json(zoo());
  // The matmul's output claims a wrong shape.
  auto t1 = mutate(s, [](json& j) {
    int out = j["ops"][0]["outputs"][0];
    j["tensors"][out]["shape"] = {2, 3, 7};
  });
  CHECK_THROWS_WITH_AS(graph_from_json(t1), doctest::Contains("but the op makes"), weft::Error);
  // Tampered index map: a factor made parallel.
  auto t2 = mutate(s, [](json& j) { j["ops"][0]["index_map"]["factors"][2]["kind"] = "parallel"; });
  CHECK_THROWS_WITH_AS(graph_from_json(t2), doctest::Contains("stored index map"), weft::Error);
  auto t3 = mutate(s, [](json& j) { j["ops"][0]["index_map"]["inputs"][0][0] = {42}; });
  CHECK_THROWS_WITH_AS(graph_from_json(t3), doctest::Contains("factor id 42 out of range"), weft::Error);
  // A cycle: a -> b -> a.
  Graph c("cyc");
  auto x = c.input("x", {2});
  auto a = c.unary(UnaryFn::Relu, x, "a");
  auto b = c.unary(UnaryFn::Exp, a, "b");
  auto t4 = mutate(graph_to_json(c), [&](json& j) { j["ops"][0]["inputs"][0] = b; });
  CHECK_THROWS_WITH_AS(graph_from_json(t4), doctest::Contains("cycle"), weft::Error);
  // Dangling producer and a tensor written twice.
  auto t5 = mutate(graph_to_json(c), [&](json& j) { j["tensors"][a]["producer"] = 9; });
  CHECK_THROWS_WITH_AS(graph_from_json(t5), doctest::Contains("op id 9 does not exist"), weft::Error);
  auto t6 = mutate(graph_to_json(c), [&](json& j) { j["ops"][1]["outputs"][0] = a; });
  CHECK_THROWS_WITH_AS(graph_from_json(t6), doctest::Contains("records producer"), weft::Error);
  auto t7 = mutate(graph_to_json(c), [&](json& j) { j["ops"][1]["name"] = "a"; });
  CHECK_THROWS_WITH_AS(graph_from_json(t7), doctest::Contains("used twice"), weft::Error);
}
