// Tests of plan::rebatch on graphs that carry the batch as a literal in an op's attributes (a class
// token broadcast over the batch and concatenated with the patches, timm's qkv reshape and permute,
// a batch folded into rows), and of its refusals.
#include <doctest/doctest.h>

#include <string>

#include "weft/core/error.hpp"
#include "weft/ir/autodiff.hpp"
#include "weft/ir/graph.hpp"
#include "weft/plan/rebatch.hpp"

using namespace weft;

namespace {

constexpr std::int64_t kPatches = 3, kTokens = kPatches + 1, kHidden = 8, kHeads = 2, kHeadDim = 4;

// A ViT-like attention score at batch B, every batch-sized attribute written with B as a model
// written for one batch size has it: the class token expanded to [B, 1, h], the fused qkv reshaped
// to [B, N, 3, heads, d] and permuted to [3, B, heads, N, d], q and k sliced off that axis and
// reshaped to [B, heads, N, d], the scores folded into rows [B·heads·N, N].
ir::Graph vit_like(std::int64_t B) {
  ir::Graph g("vit-like");
  const auto x = g.input("patches", {B, kPatches, kHidden});
  const auto cls = g.parameter("cls", {1, 1, kHidden});
  ir::OpAttrs expand;
  expand.ints = {B, 1, kHidden};
  const auto tok = g.add_op(ir::OpKind::BroadcastTo, {cls}, expand, "cls.expand")[0];
  const auto seq = g.concat({tok, x}, 1, "cat");
  const auto w = g.parameter("qkv.w", {kHidden, 3 * kHidden});
  const auto qkv = g.einsum("bnh,hk->bnk", {seq, w}, "qkv");
  const auto r = g.reshape(qkv, {B, kTokens, 3, kHeads, kHeadDim}, "qkv.reshape");
  const auto p = g.transpose(r, {2, 0, 3, 1, 4}, "qkv.permute");
  const auto q = g.reshape(g.slice(p, 0, 0, 1, "q.slice"), {B, kHeads, kTokens, kHeadDim}, "q");
  const auto k = g.reshape(g.slice(p, 0, 1, 2, "k.slice"), {B, kHeads, kTokens, kHeadDim}, "k");
  const auto s = g.einsum("bhnd,bhmd->bhnm", {q, k}, "scores");
  const auto rows = g.reshape(s, {B * kHeads * kTokens, kTokens}, "rows");
  g.set_loss(g.reduce(ir::ReduceFn::Mean, g.unary(ir::UnaryFn::Square, rows, "sq"), {0, 1}, "loss"));
  return g;
}

}  // namespace

TEST_CASE("rebatch: a graph with the batch as a literal equals the graph built at the smaller batch") {
  const auto big = ir::build_training_graph(vit_like(8));
  CHECK(plan::batch_size(big) == 8);
  // (not batch 1: there the expand widens nothing, and autodiff sums the class token's gradient over
  // no dim, a legitimately different graph)
  for (std::int64_t nb : {2, 4}) {
    CAPTURE(nb);
    CHECK(plan::rebatch(big, nb) == ir::build_training_graph(vit_like(nb)));
  }
  // and back up: batch 2 -> 8 (an uneven replica share larger than the micro-batch)
  CHECK(plan::rebatch(ir::build_training_graph(vit_like(2)), 8) == big);
}

TEST_CASE("rebatch: batch_dims follows the batch through reshapes, permutes and broadcasts") {
  const auto g = ir::build_training_graph(vit_like(8));
  const auto bd = plan::batch_dims(g);
  auto at = [&](const char* name) { return bd.at(static_cast<std::size_t>(*g.find_tensor(name))); };
  CHECK(at("patches") == plan::BatchDim{0, 1});
  CHECK(at("cls") == plan::BatchDim{});  // the parameter keeps its shape
  CHECK(at("qkv.reshape") == plan::BatchDim{0, 1});
  CHECK(at("qkv.permute") == plan::BatchDim{1, 1});          // [3, B, heads, N, d]
  CHECK(at("rows") == plan::BatchDim{0, kHeads * kTokens});  // [B·heads·N, N]
  CHECK(at("loss") == plan::BatchDim{});
  // the expanded class token holds the batch (reached back from the concat), its gradient does not
  CHECK(at("cls.expand") == plan::BatchDim{0, 1});
  const auto cls = *g.find_tensor("cls");
  int grads = 0;
  for (ir::TensorId t = 0; t < static_cast<ir::TensorId>(g.tensors().size()); ++t)
    if (g.tensor(t).role == ir::Role::Gradient && g.grad_of(t) == cls) {
      CHECK(bd.at(static_cast<std::size_t>(t)) == plan::BatchDim{});
      ++grads;
    }
  CHECK(grads == 1);
}

TEST_CASE("rebatch: a batch that lives in a constant, or a slice of the batch, is refused by name") {
  {
    ir::Graph g("mask");
    const auto x = g.input("x", {4, 6});
    const auto w = g.parameter("w", {6, 6});
    const auto mask = g.constant("attention_mask", {4, 6});  // per-sample values: ones(B, N) in HF
    const auto y = g.binary(ir::BinaryFn::Mul, g.einsum("bi,ij->bj", {x, w}, "mm"), mask, "masked");
    g.set_loss(g.reduce(ir::ReduceFn::Mean, y, {0, 1}, "loss"));
    const auto step = ir::build_training_graph(g);
    const std::string why = plan::rebatch_obstacle(step, 2);
    CHECK(why.find("attention_mask") != std::string::npos);
    CHECK(why.find("Constant") != std::string::npos);
    CHECK_THROWS_WITH_AS(plan::rebatch(step, 2), doctest::Contains("cannot change batch 4 -> 2"), Error);
    CHECK(plan::rebatch_obstacle(step, 4).empty());
  }
  {
    ir::Graph g("first-samples");
    const auto x = g.input("x", {4, 6});
    const auto w = g.parameter("w", {6, 6});
    const auto y = g.slice(g.einsum("bi,ij->bj", {x, w}, "mm"), 0, 0, 2, "first");
    g.set_loss(g.reduce(ir::ReduceFn::Mean, y, {0, 1}, "loss"));
    CHECK(plan::rebatch_obstacle(ir::build_training_graph(g), 2).find("slices along the batch") !=
          std::string::npos);
  }
}
