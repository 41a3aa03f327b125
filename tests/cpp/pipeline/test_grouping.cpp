// Layer grouping and stage extraction: exhaustive oracle over cut positions, attachment of
// backward/update ops, and an end-to-end interpreter oracle (a tiny GPT run as two stages equals
// the whole training step).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <set>

#include "weft/core/error.hpp"
#include "weft/ir/autodiff.hpp"
#include "weft/ir/interpreter.hpp"
#include "weft/models/models.hpp"
#include "weft/pipeline/grouping.hpp"

using namespace weft;
using namespace weft::pipeline;
using ir::OpId;
using ir::TensorId;

namespace {

// Independent recomputation of group_layers' objective for K − 1 ascending cut positions (in
// 1..n−1 of the forward order; pos: an op's position): (largest block compute, bytes crossing cuts).
std::pair<double, std::int64_t> brute_score(const ir::Graph& g, const std::vector<OpPhase>& phase,
                                            const std::vector<OpId>& owner, const std::vector<int>& pos,
                                            const std::vector<int>& cuts, int K) {
  auto block_of = [&](int p) {
    return static_cast<int>(std::upper_bound(cuts.begin(), cuts.end(), p) - cuts.begin());
  };
  std::vector<double> w(static_cast<std::size_t>(K), 0);
  for (OpId o = 0; o < static_cast<OpId>(g.ops().size()); ++o)
    if (phase[o] != OpPhase::Update) w[static_cast<std::size_t>(block_of(pos[owner[o]]))] += g.op(o).flops();
  std::int64_t cut = 0;
  for (TensorId t = 0; t < static_cast<TensorId>(g.tensors().size()); ++t) {
    const auto& ti = g.tensor(t);
    if (ti.producer == ir::kNoOp || phase[ti.producer] != OpPhase::Forward) continue;
    int last = -1;
    for (OpId c : g.consumers(t))
      if (phase[c] == OpPhase::Forward) last = std::max(last, block_of(pos[c]));
    if (last > block_of(pos[ti.producer])) cut += ti.bytes() * (last - block_of(pos[ti.producer]));
  }
  return {*std::max_element(w.begin(), w.end()), cut};
}

// group_layers' order on scores: less max block compute (relative 1e-12), then fewer cut bytes.
bool better(const std::pair<double, std::int64_t>& s, const std::pair<double, std::int64_t>& best) {
  return s.first < best.first * (1 - 1e-12) ||
         (s.first <= best.first * (1 + 1e-12) && s.second < best.second);
}

ir::Graph tiny_gpt(int layers, ir::Optimizer opt = ir::Optimizer::Adam) {
  models::GptConfig c;
  c.layers = layers, c.hidden = 4, c.heads = 2, c.seq = 3, c.vocab = 5, c.batch = 2;
  ir::TrainOptions t;
  t.optimizer = opt;
  return ir::build_training_graph(models::gpt(c), t);
}

// An MLP chain of identical layers x -> relu(x W_i) -> ... -> sum -> loss.
ir::Graph mlp_chain(int layers, std::int64_t width = 16) {
  ir::Graph g("chain");
  TensorId x = g.input("x", {8, width});
  for (int i = 0; i < layers; ++i) {
    TensorId w = g.parameter("w" + std::to_string(i), {width, width});
    x = g.unary(ir::UnaryFn::Relu, g.matmul(x, w, "mm" + std::to_string(i)), "relu" + std::to_string(i));
  }
  TensorId s = g.reduce(ir::ReduceFn::Sum, x, {0, 1}, "loss");
  g.set_loss(s);
  ir::TrainOptions t;
  t.optimizer = ir::Optimizer::Sgd;
  return ir::build_training_graph(g, t);
}

}  // namespace

TEST_CASE("pipeline: classify_ops and owner_forward_op on a training graph") {
  ir::Graph g = tiny_gpt(1);
  auto phase = classify_ops(g);
  auto owner = owner_forward_op(g);
  REQUIRE(phase.size() == g.ops().size());
  std::map<std::string, OpId> by_name;
  for (OpId o = 0; o < static_cast<OpId>(g.ops().size()); ++o) by_name[g.op(o).name] = o;
  int fwd = 0, bwd = 0, upd = 0;
  for (OpId o = 0; o < static_cast<OpId>(g.ops().size()); ++o) {
    const auto& name = g.op(o).name;
    CHECK(owner[o] != ir::kNoOp);
    CHECK(phase[owner[o]] == OpPhase::Forward);
    if (phase[o] == OpPhase::Forward) {
      ++fwd;
      CHECK(owner[o] == o);
      CHECK(name.rfind("d:", 0) != 0);
    } else if (phase[o] == OpPhase::Update) {
      ++upd;
      CHECK(name.rfind("adam:", 0) == 0);
      // The update sits with the parameter's first forward reader.
      TensorId p = g.op(o).inputs[0];
      OpId first = ir::kNoOp;
      for (OpId c : g.consumers(p))
        if (phase[c] == OpPhase::Forward) {
          first = c;
          break;
        }
      CHECK(owner[o] == first);
    } else {
      ++bwd;
      CHECK(name.rfind("d:", 0) == 0);
      // "d:<forward op>/<what>" belongs to that forward op.
      auto slash = name.find('/');
      if (slash != std::string::npos && by_name.count(name.substr(2, slash - 2)))
        CHECK(owner[o] == by_name[name.substr(2, slash - 2)]);
    }
  }
  CHECK(fwd > 10);
  CHECK(bwd > fwd);
  CHECK(upd == static_cast<int>(std::count_if(g.tensors().begin(), g.tensors().end(), [](const auto& t) {
          return t.role == ir::Role::Parameter && t.producer == ir::kNoOp;
        })));
}

TEST_CASE("pipeline: group_layers equals exhaustive enumeration of cut positions") {
  for (int layers : {1, 2}) {
    ir::Graph g = tiny_gpt(layers);
    auto phase = classify_ops(g);
    auto owner = owner_forward_op(g);
    for (int K : {1, 2, 3}) {
      LayerGrouping lg = group_layers(g, K);
      REQUIRE(static_cast<int>(lg.blocks.size()) == K);
      const auto& order = lg.forward_order;
      const int n = static_cast<int>(order.size());
      std::vector<int> pos(g.ops().size(), -1);
      for (int i = 0; i < n; ++i) pos[order[i]] = i;
      // Independent recomputation of (max compute, cut bytes) of a cut vector.
      auto score = [&](const std::vector<int>& cuts) { return brute_score(g, phase, owner, pos, cuts, K); };
      std::pair<double, std::int64_t> best{std::numeric_limits<double>::infinity(), 0};
      std::vector<int> cuts;
      std::function<void(int)> rec = [&](int from) {
        if (static_cast<int>(cuts.size()) == K - 1) {
          if (const auto s = score(cuts); better(s, best)) best = s;
          return;
        }
        for (int p = from; p <= n - 1; ++p) {
          cuts.push_back(p);
          rec(p + 1);
          cuts.pop_back();
        }
      };
      rec(1);
      CAPTURE(layers);
      CAPTURE(K);
      CHECK(lg.max_block_flops() == doctest::Approx(best.first).epsilon(1e-12));
      CHECK(lg.cut_bytes() == best.second);
      // The blocks cover every op once; forward ops are contiguous runs of the order.
      std::vector<int> seen(g.ops().size(), 0);
      std::vector<OpId> concat;
      double total = 0;
      std::int64_t params = 0;
      for (int b = 0; b < K; ++b) {
        const auto& blk = lg.blocks[b];
        CHECK(!blk.forward_ops.empty());
        concat.insert(concat.end(), blk.forward_ops.begin(), blk.forward_ops.end());
        for (OpId o : blk.ops) {
          ++seen[o];
          CHECK(lg.block_of_op[o] == b);
        }
        total += blk.forward_flops + blk.backward_flops + blk.update_flops;
        params += blk.param_bytes;
      }
      CHECK(concat == order);
      for (int s : seen) CHECK(s == 1);
      CHECK(total == doctest::Approx(g.flops()).epsilon(1e-12));
      CHECK(params == g.param_bytes());
    }
  }
}

TEST_CASE("pipeline: a chain of identical layers groups one layer per block") {
  ir::Graph g = mlp_chain(4);
  LayerGrouping lg = group_layers(g, 4);
  REQUIRE(lg.blocks.size() == 4);
  for (int b = 0; b < 4; ++b) {
    const auto& blk = lg.blocks[b];
    std::set<std::string> names;
    for (OpId o : blk.forward_ops) names.insert(g.op(o).name);
    CHECK(names.count("mm" + std::to_string(b)) == 1);
    CHECK(names.count("relu" + std::to_string(b)) == 1);
    // Matmul forward 2·8·16·16, backward two matmuls of the same size.
    CHECK(blk.forward_flops >= 2.0 * 8 * 16 * 16);
    // Layer 0 needs no gradient of the input x: one backward matmul (dW) instead of two.
    CHECK(blk.backward_flops >= (b == 0 ? 1 : 2) * 2.0 * 8 * 16 * 16);
    CHECK(blk.param_bytes == 16 * 16 * 4);
    if (b < 3) CHECK(blk.boundary_bytes == 8 * 16 * 4);  // one activation to the next layer
  }
  // Layers 1 and 2 are identical blocks (layer 0 has no dx, the last also holds the loss).
  CHECK(lg.blocks[0].compute_flops() < lg.blocks[1].compute_flops());
  CHECK(lg.blocks[1].compute_flops() == doctest::Approx(lg.blocks[2].compute_flops()));
  CHECK(lg.cut_bytes() == 3 * 8 * 16 * 4);
  CHECK(lg.ops_of_range(0, 3).size() == g.ops().size());
  CHECK_THROWS_AS(lg.ops_of_range(2, 1), Error);
  CHECK_THROWS_AS(lg.ops_of_range(0, 4), Error);
  CHECK_THROWS_AS(group_layers(g, 0), Error);
  CHECK_THROWS_AS(group_layers(g, 1000), Error);
  CHECK(!lg.to_string().empty());
}

TEST_CASE("pipeline: extract_stage runs a tiny GPT as two stages to the whole step's result") {
  ir::Graph g = tiny_gpt(2);
  LayerGrouping lg = group_layers(g, 2);
  auto phase = classify_ops(g);
  // Three pieces in execution order: block 0 forward, block 1 (forward + backward + updates),
  // block 0 backward + updates.
  std::vector<OpId> a_fwd, a_rest;
  for (OpId o : lg.blocks[0].ops) (phase[o] == OpPhase::Forward ? a_fwd : a_rest).push_back(o);
  std::vector<std::vector<OpId>> pieces{a_fwd, lg.blocks[1].ops, a_rest};
  // Whole-graph reference.
  std::mt19937_64 gen(11);
  std::uniform_real_distribution<double> u(-0.5, 0.5);
  std::map<TensorId, ir::HostTensor> feeds;
  for (TensorId t = 0; t < static_cast<TensorId>(g.tensors().size()); ++t) {
    const auto& ti = g.tensor(t);
    if (ti.producer != ir::kNoOp) continue;
    if (ti.role == ir::Role::Constant && g.grad_of(t)) continue;  // the dloss seed
    ir::HostTensor h{ti.shape, {}};
    for (std::int64_t i = 0; i < ti.numel(); ++i)
      h.data.push_back(ti.dtype == DType::I32                ? static_cast<double>((i * 3 + 1) % 5)
                       : ti.role == ir::Role::OptimizerState ? std::abs(u(gen))
                                                             : u(gen));
    feeds[t] = h;
  }
  auto whole = ir::interpret(g, feeds);
  std::map<TensorId, ir::HostTensor> known = feeds;  // by original id
  for (const auto& ops : pieces) {
    StageGraph st = extract_stage_mapped(g, ops);
    REQUIRE_NOTHROW(st.graph.validate());
    CHECK(st.original_op.size() == ops.size());
    std::map<TensorId, ir::HostTensor> f;
    for (TensorId t = 0; t < static_cast<TensorId>(st.graph.tensors().size()); ++t) {
      const auto& ti = st.graph.tensor(t);
      if (ti.producer != ir::kNoOp) continue;
      TensorId orig = st.original_tensor[t];
      // Received tensors: activations become Inputs, gradients stay Gradients.
      if (g.tensor(orig).producer != ir::kNoOp) {
        CHECK((ti.role == ir::Role::Input || ti.role == g.tensor(orig).role));
        REQUIRE(known.count(orig) == 1);  // made by an earlier piece
      }
      if (known.count(orig)) f[t] = known[orig];
    }
    auto vals = ir::interpret(st.graph, f);
    for (TensorId t = 0; t < static_cast<TensorId>(vals.size()); ++t) known[st.original_tensor[t]] = vals[t];
  }
  // Every tensor of the step was computed by some piece, equal to the whole-graph value.
  int compared = 0;
  for (TensorId t = 0; t < static_cast<TensorId>(g.tensors().size()); ++t) {
    if (!known.count(t)) continue;
    REQUIRE(known[t].data.size() == whole[t].data.size());
    for (std::size_t i = 0; i < whole[t].data.size(); ++i) {
      CHECK(std::isfinite(whole[t].data[i]));
      CHECK(known[t].data[i] == doctest::Approx(whole[t].data[i]).epsilon(1e-12));
    }
    ++compared;
  }
  CHECK(compared == static_cast<int>(g.tensors().size()));
  // The loss stays the loss of the stage that makes it.
  StageGraph last = extract_stage_mapped(g, lg.blocks[1].ops);
  REQUIRE(last.graph.loss().has_value());
  CHECK(last.original_tensor[*last.graph.loss()] == *g.loss());
  CHECK_THROWS_AS(extract_stage(g, {}), Error);
  CHECK_THROWS_AS(extract_stage(g, {0, 0}), Error);
  CHECK_THROWS_AS(extract_stage(g, {static_cast<OpId>(g.ops().size())}), Error);
}

TEST_CASE("pipeline: structural_hash identifies stages cut from identical layers") {
  ir::Graph g = mlp_chain(4);
  LayerGrouping lg = group_layers(g, 4);
  std::vector<ir::Graph> st;
  for (int b = 0; b < 4; ++b) st.push_back(extract_stage(g, lg.blocks[b].ops));
  // Blocks 1 and 2 are the same layer (different names, ids and tensors); 0 has no dx, 3 the loss.
  CHECK(st[1].op(0).name != st[2].op(0).name);
  CHECK(structurally_equal(st[1], st[2]));
  CHECK(structural_hash(st[1]) == structural_hash(st[2]));
  CHECK(!structurally_equal(st[0], st[1]));
  CHECK(!structurally_equal(st[2], st[3]));
  CHECK(structural_hash(st[0]) != structural_hash(st[1]));
  // Ranges of identical blocks too: [1, 2] vs itself only (no other range of two middle layers).
  CHECK(structurally_equal(extract_stage(g, lg.ops_of_range(1, 2)), extract_stage(g, lg.ops_of_range(1, 2))));
  CHECK(
      !structurally_equal(extract_stage(g, lg.ops_of_range(0, 1)), extract_stage(g, lg.ops_of_range(1, 2))));
  // A different width is a different structure.
  ir::Graph h = mlp_chain(4, 8);
  LayerGrouping lh = group_layers(h, 4);
  CHECK(!structurally_equal(extract_stage(h, lh.blocks[1].ops), st[1]));
  // GPT: two middle transformer layers, extracted by op-name prefix, are structurally equal.
  ir::Graph gpt = tiny_gpt(4);  // h1 and h2 are middle layers (h3 feeds the final LN only)
  auto layer_ops = [&](const std::string& prefix) {
    auto owner = owner_forward_op(gpt);
    std::vector<OpId> ops;
    for (OpId o = 0; o < static_cast<OpId>(gpt.ops().size()); ++o)
      if (gpt.op(owner[o]).name.rfind(prefix, 0) == 0) ops.push_back(o);
    return ops;
  };
  auto l1 = layer_ops("h1."), l2 = layer_ops("h2.");
  REQUIRE(l1.size() > 10);
  CHECK(l1.size() == l2.size());
  CHECK(structurally_equal(extract_stage(gpt, l1), extract_stage(gpt, l2)));
  CHECK(structural_hash(extract_stage(gpt, l1)) == structural_hash(extract_stage(gpt, l2)));
  auto l12 = l1;
  l12.insert(l12.end(), l2.begin(), l2.end());
  std::sort(l12.begin(), l12.end());
  CHECK(!structurally_equal(extract_stage(gpt, l12), extract_stage(gpt, l1)));
}

TEST_CASE("pipeline: group_layers at allowed cuts equals exhaustive enumeration of those cuts") {
  // The same lexicographic objective (max block compute, then cut bytes), recomputed by hand over
  // every choice of K − 1 cuts among the allowed positions only.
  ir::Graph g = tiny_gpt(2);
  const auto phase = classify_ops(g);
  const auto owner = owner_forward_op(g);
  const auto order = group_layers(g, 1).forward_order;
  const int n = static_cast<int>(order.size());
  std::vector<int> pos(g.ops().size(), -1);
  for (int i = 0; i < n; ++i) pos[order[i]] = i;
  std::mt19937 rng(7);
  for (int trial = 0; trial < 12; ++trial) {
    std::vector<int> allowed;
    for (int p = 1; p < n; ++p)
      if (rng() % 4 == 0) allowed.push_back(p);
    if (allowed.size() < 3) continue;
    for (int K : {1, 2, 3, 4}) {
      auto score = [&](const std::vector<int>& cuts) { return brute_score(g, phase, owner, pos, cuts, K); };
      std::pair<double, std::int64_t> best{std::numeric_limits<double>::infinity(), 0};
      std::vector<int> cuts;
      std::function<void(std::size_t)> rec = [&](std::size_t from) {
        if (static_cast<int>(cuts.size()) == K - 1) {
          if (const auto s = score(cuts); better(s, best)) best = s;
          return;
        }
        for (std::size_t i = from; i < allowed.size(); ++i) {
          cuts.push_back(allowed[i]);
          rec(i + 1);
          cuts.pop_back();
        }
      };
      rec(0);
      CAPTURE(trial);
      CAPTURE(K);
      const LayerGrouping lg = group_layers(g, K, allowed);
      REQUIRE(static_cast<int>(lg.blocks.size()) == K);
      CHECK(lg.max_block_flops() == doctest::Approx(best.first).epsilon(1e-12));
      CHECK(lg.cut_bytes() == best.second);
      for (int b = 1; b < K; ++b) {  // every cut is an allowed one
        const int start = pos[lg.blocks[b].forward_ops.front()];
        CHECK(std::find(allowed.begin(), allowed.end(), start) != allowed.end());
      }
    }
  }
  CHECK_THROWS_AS(group_layers(g, 5, {3, 9, 20}), Error);  // 4 runs between 3 cuts
  CHECK_THROWS_AS(group_layers(g, 2, {0}), Error);
  CHECK_THROWS_AS(group_layers(g, 2, {n}), Error);
}

TEST_CASE("pipeline: repeated_layers finds a GPT's layers and a chain's, one block each") {
  for (int layers : {2, 3, 5}) {
    const ir::Graph g = tiny_gpt(layers);
    const RepeatedLayers rl = repeated_layers(g);
    CAPTURE(layers);
    REQUIRE(rl.count == layers);
    REQUIRE(static_cast<int>(rl.starts.size()) == layers);
    const LayerGrouping lg = group_by_layers(g, rl);
    REQUIRE(static_cast<int>(lg.blocks.size()) == layers);
    // By the zoo's names: block i holds exactly layer i's forward ops ("h<i>."), the embedding
    // rides with the first layer, the final norm, the LM head and the loss with the last; a layer
    // is the zoo's 25 forward ops of a pre-LN block (ln1 .. res2, from its op list).
    for (int b = 0; b < layers; ++b) {
      int own = 0;
      for (OpId o : lg.blocks[b].forward_ops) {
        const std::string& name = g.op(o).name;
        if (name.rfind("h", 0) == 0 && name.find('.') != std::string::npos) {
          CHECK(name.substr(0, name.find('.')) == "h" + std::to_string(b));
          ++own;
        } else {
          CHECK((b == 0 ? name.rfind("embed", 0) == 0 : b == layers - 1));
        }
      }
      CHECK(own == 25);
    }
    CHECK(rl.period == 25);
  }
  // A chain whose first layer reads the model's input (an Input leaf, not a forward result).
  const ir::Graph chain = mlp_chain(4);
  const RepeatedLayers rc = repeated_layers(chain);
  CHECK(rc.count == 4);
  CHECK(rc.period == 2);
  CHECK(rc.starts == std::vector<int>{0, 2, 4, 6});
  // One layer: nothing repeats.
  CHECK(repeated_layers(mlp_chain(1)).count == 0);
}
