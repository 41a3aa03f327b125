// Executors read the values a model carries, never a guess: a leaf without a needed value is
// refused by name before anything runs; given values (in memory or in a value file) are what both
// the CPU executor and the one-device reference start from; seeded parameters follow torch's
// initialisers per role.
#include <doctest/doctest.h>

#include <filesystem>

#include "equivalence.hpp"
#include "weft/core/error.hpp"
#include "weft/exec/init.hpp"
#include "weft/ir/value_file.hpp"

using namespace weft;

namespace {

// A two-layer MLP with a bias, a LayerNorm, a constant scale and a buffer added to the hidden
// state: [8, 6] -> [8, 6] -> sum of squares.
ir::Graph mlp(bool with_values) {
  ir::Graph g("mlp");
  auto x = g.input("x", {8, 6});
  auto w1 = g.parameter("w1", {6, 6});
  auto b1 = g.parameter("b1", {6});
  auto gamma = g.parameter("ln.weight", {6});
  auto beta = g.parameter("ln.bias", {6});
  auto scale = g.constant("scale", {1});
  auto pos = g.buffer("pos", {6});
  auto h = g.add(g.add(g.matmul(x, w1), b1), pos);
  h = g.mul(g.unary(ir::UnaryFn::Tanh, g.layer_norm(h, gamma, beta)), scale);
  g.set_loss(g.reduce(ir::ReduceFn::Mean, g.unary(ir::UnaryFn::Square, h), {0, 1}));
  if (with_values) {
    g.set_seed_parameters(false);
    auto fill = [&](ir::TensorId t, double a) {
      ir::HostTensor v{g.tensor(t).shape, {}};
      for (std::int64_t k = 0; k < v.numel(); ++k)
        v.data.push_back(a * std::sin(0.7 * static_cast<double>(k) + a));
      g.set_value(t, v);
    };
    fill(w1, 0.5), fill(b1, 0.1), fill(gamma, 1.0), fill(beta, 0.2), fill(pos, 0.3);
    g.set_value(scale, ir::HostTensor{{1}, {1.7}});
  }
  return g;
}

}  // namespace

TEST_CASE("exec values: a leaf that needs a value and has none is refused by name") {
  auto g = mlp(false);
  // Built in code: parameters may be seeded, but the constant and the buffer have no value.
  CHECK_THROWS_WITH_AS(
      exec::LeafValues(g, 0),
      doctest::Contains("2 leaves need a value and have none: 'scale' (constant), 'pos' (buffer)"), Error);
  g.set_value(*g.find_tensor("scale"), ir::HostTensor{{1}, {2.0}});
  g.set_value(*g.find_tensor("pos"), ir::HostTensor{{6}, std::vector<double>(6, 0.0)});
  CHECK_NOTHROW(exec::LeafValues(g, 0));
  // An imported module's parameters are its own: none is seeded unless asked.
  g.set_seed_parameters(false);
  CHECK_THROWS_WITH_AS(exec::LeafValues(g, 0), doctest::Contains("'w1' (parameter)"), Error);
  CHECK_NOTHROW(exec::LeafValues(g, 0, /*seed_all_parameters=*/true));
  const auto step = ir::build_training_graph(g, {});
  exec::ExecuteOptions eo;
  CHECK_THROWS_WITH_AS(exec::execute_reference(step, eo), doctest::Contains("'b1' (parameter)"), Error);
  auto prog =
      lower::lower_spmd(step, test::m8(), cluster::DeviceMesh::iota({2}), test::random_layout(step, {2}, 5u));
  CHECK_THROWS_WITH_AS(exec::execute_program(prog, eo), doctest::Contains("'w1' (parameter)"), Error);
  // inputs= naming a leaf that is not an Input lists the Inputs.
  eo.seed_all_parameters = true;
  eo.inputs["w1"] = ir::HostTensor{{6, 6}, std::vector<double>(36, 0.0)};
  CHECK_THROWS_WITH_AS(
      exec::execute_reference(step, eo),
      doctest::Contains("inputs['w1'] is not an Input leaf of the graph (it is a parameter) (its Inputs: x"),
      Error);
}

TEST_CASE("exec values: seeded parameters follow torch's initialisers per role") {
  auto g = mlp(false);
  g.set_value(*g.find_tensor("scale"), ir::HostTensor{{1}, {2.0}});
  g.set_value(*g.find_tensor("pos"), ir::HostTensor{{6}, std::vector<double>(6, 0.0)});
  exec::LeafValues v(g, 3);
  double sum2 = 0;
  for (int k = 0; k < 36; ++k) sum2 += std::pow(v.value(*g.find_tensor("w1"), 1, k), 2);
  CHECK(std::sqrt(sum2 / 36) == doctest::Approx(0.02).epsilon(0.35));  // normal(0, 0.02)
  for (int k = 0; k < 6; ++k) {
    CHECK(v.value(*g.find_tensor("b1"), 1, k) == 0);         // a bias: zeros
    CHECK(v.value(*g.find_tensor("ln.weight"), 1, k) == 1);  // a LayerNorm's scale: ones
    CHECK(v.value(*g.find_tensor("ln.bias"), 1, k) == 0);
  }
}

TEST_CASE("exec values: the given values are what every executor starts from, in memory or in a file") {
  const auto g = mlp(true);
  const auto step = ir::build_training_graph(g, {});
  exec::ExecuteOptions eo;
  const auto ref = exec::execute_reference(step, eo);
  // The forward of step 1 by hand from the values (interpret with the same feeds) is the first loss.
  exec::LeafValues lv(step, 0);
  std::map<ir::TensorId, ir::HostTensor> feeds;
  for (ir::TensorId t = 0; t < static_cast<ir::TensorId>(g.tensors().size()); ++t) {
    const auto& info = g.tensor(t);
    if (info.producer != ir::kNoOp) continue;
    ir::HostTensor h{info.shape, {}};
    const std::int64_t n = info.numel();
    for (std::int64_t k = 0; k < n; ++k)
      h.data.push_back(info.role == ir::Role::Input ? lv.value(t, 1, k)
                                                    : g.value(t)->data->data[static_cast<std::size_t>(k)]);
    feeds[t] = h;
  }
  const auto fwd = ir::interpret(g, feeds);
  CHECK(ref.losses[0] == doctest::Approx(fwd[static_cast<std::size_t>(*g.loss())].data[0]).epsilon(1e-14));
  // Distributed (a random layout on 2 and 4 ranks) equals the reference.
  for (std::int64_t n : {2, 4}) {
    auto prog = lower::lower_spmd(step, test::m8(), cluster::DeviceMesh::iota({n}),
                                  test::random_layout(step, {n}, 11u));
    CHECK(test::max_rel_diff(exec::execute_program(prog, eo), ref) < 1e-12);
  }
  // The same values from a value file: the same run, bit for bit.
  const auto path = (std::filesystem::temp_directory_path() / "weft_test_leaf_values.safetensors").string();
  std::map<std::string, std::pair<ir::HostTensor, DType>> file;
  for (const auto& [t, v] : g.values()) file[g.tensor(t).name] = {*v.data, g.tensor(t).dtype};
  ir::write_value_file(path, file);
  auto g2 = g;
  for (const auto& [t, v] : g.values()) g2.set_value_file(t, path, g.tensor(t).name);
  const auto step2 = ir::build_training_graph(g2, {});
  const auto ref2 = exec::execute_reference(step2, eo);
  CHECK(test::max_rel_diff(ref2, ref) == 0);
  auto prog = lower::lower_spmd(step2, test::m8(), cluster::DeviceMesh::iota({2, 2}),
                                test::random_layout(step2, {2, 2}, 7u));
  CHECK(test::max_rel_diff(exec::execute_program(prog, eo), ref) < 1e-12);
  // A file whose tensor has another shape is refused, naming it.
  ir::write_value_file(path, {{"w1", {ir::HostTensor{{36}, std::vector<double>(36, 0.0)}, DType::F32}}});
  auto g3 = g;
  g3.set_value_file(*g3.find_tensor("w1"), path, "w1");
  const std::string why = "the value of 'w1' in '" + path + "' (key 'w1') has shape [36]";
  CHECK_THROWS_WITH_AS(exec::execute_reference(ir::build_training_graph(g3, {}), eo),
                       doctest::Contains(why.c_str()), Error);
  std::filesystem::remove(path);
}
