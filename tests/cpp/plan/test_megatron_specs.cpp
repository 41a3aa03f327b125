// Megatron's tensor-parallel roles recognised from a graph's structure (plan::megatron_specs) and
// megatron_plan forcing them: specs checked by hand on the zoo GPT, an MLP and a conv net.
#include <doctest/doctest.h>

#include <map>
#include <string>

#include "weft/cluster/cluster.hpp"
#include "weft/core/error.hpp"
#include "weft/ir/autodiff.hpp"
#include "weft/models/models.hpp"
#include "weft/plan/megatron_specs.hpp"
#include "weft/plan/planner.hpp"
#include "weft/sharding/sharding_spec.hpp"

using namespace weft;
using plan::MegatronRole;

namespace {

ir::Graph tiny_gpt(std::int64_t layers = 2, std::int64_t batch = 4) {
  models::GptConfig c;
  c.name = "gpt-tiny";
  c.layers = layers;
  c.hidden = 64;
  c.heads = 4;
  c.seq = 8;
  c.vocab = 128;
  c.batch = batch;
  return ir::build_training_graph(models::gpt(c));
}

cluster::Cluster one_node(int gpus) {
  auto n = cluster::Cluster::preset("M8", 1).nodes()[0];
  n.num_devices = gpus;
  return cluster::Cluster({n});
}

// The optimizer states an update op keeps beside `param`.
std::vector<std::string> states_of(const ir::Graph& g, const std::string& param) {
  std::vector<std::string> out;
  for (const auto& op : g.ops()) {
    if (op.kind != ir::OpKind::AdamUpdate || g.tensor(op.inputs[0]).name != param) continue;
    for (std::size_t i = 2; i < op.inputs.size(); ++i) out.push_back(g.tensor(op.inputs[i]).name);
  }
  return out;
}

// An MLP on inputs [8, 16]: `linears` linears with ReLU between them, the last one's 16 outputs
// the cross-entropy's classes.
ir::Graph mlp(int linears) {
  ir::Graph g("mlp");
  ir::TensorId x = g.input("x", {8, 16});
  const ir::TensorId labels = g.input("labels", {8}, DType::I32);
  for (int i = 0; i < linears; ++i) {
    const std::string p = "fc" + std::to_string(i + 1);
    x = g.matmul(x, g.parameter(p + ".w", {16, 16}), p + ".matmul");
    x = g.add(x, g.parameter(p + ".b", {16}), p);
    if (i + 1 < linears) x = g.unary(ir::UnaryFn::Relu, x, p + ".relu");
  }
  g.set_loss(g.cross_entropy(x, labels, "loss"));
  return ir::build_training_graph(g);
}

}  // namespace

TEST_CASE("megatron_specs: the zoo GPT's column, row and vocabulary splits, by hand") {
  const auto g = tiny_gpt();
  for (int t : {2, 4}) {
    const auto ms = plan::megatron_specs(g, t);
    CAPTURE(t);
    CHECK(ms.recognised);
    auto role = [&](const std::string& n) { return ms.params.at(n).role; };
    auto spec = [&](const std::string& n) { return ms.params.at(n).spec; };
    // The fused QKV W[h, 3h] (output features viewed as [3, heads, d]) split part by part: each
    // device its heads of Q, K and V — stride h/t on dim 1 (its own spec written out below).
    const std::string qkv = t == 2 ? "S(1,32)" : "S(1,16)";
    CHECK(sharding::ShardingSpec::parse(qkv, {64, 192}, {t}) ==
          sharding::ShardingSpec({64, 192}, {t}, {sharding::Placement::shard(1, 64 / t)}));
    for (int l = 0; l < 2; ++l) {
      const std::string p = "h" + std::to_string(l);
      CHECK(role(p + ".attn.qkv.w") == MegatronRole::Column);
      CHECK(ms.params.at(p + ".attn.qkv.w").dim == 1);
      CHECK(ms.params.at(p + ".attn.qkv.w").stride == 64 / t);
      CHECK(spec(p + ".attn.qkv.w") == qkv);
      CHECK(role(p + ".attn.qkv.b") == MegatronRole::ColumnBias);
      CHECK(spec(p + ".attn.qkv.b") == (t == 2 ? "S(0,32)" : "S(0,16)"));
      CHECK(role(p + ".mlp.fc1.w") == MegatronRole::Column);
      CHECK(spec(p + ".mlp.fc1.w") == "S(1)");  // [h, 4h]: output features are dim 1
      CHECK(spec(p + ".mlp.fc1.b") == "S(0)");
      CHECK(role(p + ".attn.proj.w") == MegatronRole::Row);
      CHECK(spec(p + ".attn.proj.w") == "S(0)");  // [h, h]: input features are dim 0
      CHECK(role(p + ".attn.proj.b") == MegatronRole::RowBias);
      CHECK(spec(p + ".attn.proj.b") == "R");
      CHECK(role(p + ".mlp.fc2.w") == MegatronRole::Row);
      CHECK(spec(p + ".mlp.fc2.w") == "S(0)");
      CHECK(spec(p + ".mlp.fc2.b") == "R");
      for (const char* ln : {".ln1.gamma", ".ln1.beta", ".ln2.gamma", ".ln2.beta"}) {
        CHECK(role(p + ln) == MegatronRole::Replicated);
        CHECK(spec(p + ln) == "R");
      }
    }
    // The token table, tied with the logits: vocabulary-parallel.
    CHECK(role("wte") == MegatronRole::VocabEmbedding);
    CHECK(spec("wte") == "S(0)");
    CHECK(role("wpe") == MegatronRole::Replicated);
    CHECK(spec("ln_f.gamma") == "R");
    // Every parameter and its Adam moments are fixed, at one spec.
    for (const auto& [name, p] : ms.params) {
      CHECK(ms.fixed.at(name) == p.spec);
      const auto st = states_of(g, name);
      CHECK(st.size() == 2);
      for (const auto& s : st) CHECK(ms.fixed.at(s) == p.spec);
    }
    CHECK(ms.count(MegatronRole::Column) == 4);
    CHECK(ms.count(MegatronRole::Row) == 4);
    // What the ops make in Megatron's layout: the column results split as their output features
    // (QKV part by part), the heads through the attention, partial sums out of the rows and the
    // vocabulary-parallel embedding, the logits split along the vocabulary.
    auto result = [&](const std::string& n) { return ms.results.at(n); };
    CHECK(result("h0.attn.qkv.matmul") == (t == 2 ? "S(2,32)" : "S(2,16)"));  // [b, s, 3h]
    CHECK(result("h0.attn.qkv_heads") == "S(3)");                             // [b, s, 3, heads, d]
    CHECK(result("h0.attn.scores") == "S(1)");                                // [b, heads, s, s]
    CHECK(result("h0.attn.context_merged") == "S(2)");                        // [b, s, h]: the heads
    CHECK(result("h0.attn.proj.matmul") == "P(sum)");
    CHECK(result("h0.mlp.gelu") == "S(2)");
    CHECK(result("h0.mlp.fc2.matmul") == "P(sum)");
    CHECK(result("embed.tokens") == "P(sum)");
    CHECK(result("logits") == "S(2)");
    CHECK(ms.results.count("h0.res1") == 0);  // the residual stream is the search's (replicated)
    CHECK(ms.results.count("h0.ln1") == 0);
    // The gradients the updates read are at their parameters' specs; a block boundary in the
    // attention or at the logits carries the split, and the tied embedding's two contributions too.
    for (const auto& op : g.ops())
      if (op.kind == ir::OpKind::AdamUpdate && ms.params.at(g.tensor(op.inputs[0]).name).dim >= 0)
        CHECK(ms.results.at(g.tensor(op.inputs[1]).name) == ms.params.at(g.tensor(op.inputs[0]).name).spec);
    CHECK(ms.boundaries.at("h0.attn.scores") == "S(1)");
    CHECK(ms.boundaries.at("logits") == "S(2)");
    CHECK(ms.boundaries.count("h0.res1") == 0);
    int wte_terms = 0;
    for (const auto& [name, spec] : ms.boundaries)
      if (const auto id = g.find_tensor(name);
          id && g.tensor(*id).shape == std::vector<std::int64_t>{128, 64}) {
        CHECK(spec == "S(0)");
        ++wte_terms;
      }
    CHECK(wte_terms >= 3);  // the sum and its two terms
    for (const auto& [name, spec] : ms.results) CHECK(ms.fixed.at(name) == spec);
  }
  // t = 1: the roles, no split.
  const auto one = plan::megatron_specs(g, 1);
  CHECK(one.params.at("h0.attn.qkv.w").role == MegatronRole::Column);
  CHECK(one.params.at("h0.attn.qkv.w").spec == "R");
  // A t the heads' dim does not divide (h = 64, t = 3): the attention and MLP groups stay replicated.
  const auto three = plan::megatron_specs(g, 3);
  CHECK(three.params.at("h0.attn.qkv.w").spec == "R");
  CHECK(!three.params.at("h0.attn.qkv.w").note.empty());
  CHECK(three.params.at("h0.attn.proj.w").spec == "R");
  CHECK_THROWS_AS(plan::megatron_specs(g, 0), Error);
}

TEST_CASE("megatron_specs: an MLP is column then row; a third linear before the loss is the head") {
  const auto two = plan::megatron_specs(mlp(2), 2);
  CHECK(two.recognised);
  CHECK(two.params.at("fc1.w").role == MegatronRole::Column);
  CHECK(two.params.at("fc1.w").spec == "S(1)");
  CHECK(two.params.at("fc1.b").spec == "S(0)");
  CHECK(two.params.at("fc2.w").role == MegatronRole::Row);
  CHECK(two.params.at("fc2.w").spec == "S(0)");
  CHECK(two.params.at("fc2.b").role == MegatronRole::RowBias);
  CHECK(two.params.at("fc2.b").spec == "R");
  const auto three = plan::megatron_specs(mlp(3), 2);
  CHECK(three.params.at("fc3.w").role == MegatronRole::VocabHead);
  CHECK(three.params.at("fc3.w").spec == "S(1)");  // its 16 classes
  CHECK(three.params.at("fc3.b").role == MegatronRole::VocabHeadBias);
  CHECK(three.params.at("fc3.b").spec == "S(0)");
  // A lone linear into the loss is the head; nothing else is recognised in a conv net.
  CHECK(plan::megatron_specs(mlp(1), 2).params.at("fc1.w").role == MegatronRole::VocabHead);
  models::UNetConfig u;
  u.base_channels = 4;
  u.depth = 1;
  u.image = 8;
  u.batch = 2;
  const auto unet = plan::megatron_specs(ir::build_training_graph(models::unet(u)), 2);
  CHECK_FALSE(unet.recognised);
  for (const auto& [name, p] : unet.params) CHECK(p.role == MegatronRole::Replicated);
  CHECK(unet.summary().find("no Megatron roles") != std::string::npos);
}

TEST_CASE("megatron_plan: the stages carry Megatron's specs; a conv net says it searched freely") {
  const auto g = tiny_gpt(2, 8);
  const auto c = one_node(4);
  plan::PlanOptions o;
  o.num_microbatches = 2;
  o.num_blocks = 4;
  for (const plan::MegatronLayout lay :
       {plan::MegatronLayout{2, 2, 1}, plan::MegatronLayout{4, 1, 1}, plan::MegatronLayout{2, 1, 2}}) {
    CAPTURE(lay.to_string());
    const auto p = plan::megatron_plan(g, c, lay, o);
    CHECK(p.strategy == "megatron " + lay.to_string());
    const auto ms = plan::megatron_specs(g, lay.t);
    int seen = 0;
    for (const auto& st : p.stages) {
      for (const auto& pr : st.params) {
        CAPTURE(pr.name);
        CHECK(pr.spec == (lay.d > 1 ? "R " : "") + ms.params.at(pr.name).spec);
        ++seen;
      }
      // The optimizer states the stage reads follow their parameter.
      for (const auto& leaf : st.leaf_specs)
        if (ms.fixed.count(leaf.tensor)) CHECK(leaf.spec == ms.fixed.at(leaf.tensor));
    }
    CHECK(seen >= static_cast<int>(ms.params.size()));
  }
  // (make_plan's (t, p, d) baseline sweep and best_megatron_plan keep the searched layouts per
  // block: Megatron's fixed splits are megatron_plan's; see plan.md, Megatron baselines.)
  // No role in a conv net: the free search, said in the strategy.
  models::UNetConfig u;
  u.base_channels = 4;
  u.depth = 1;
  u.image = 8;
  u.batch = 4;
  const auto unet = ir::build_training_graph(models::unet(u));
  const auto pu = plan::megatron_plan(unet, c, {2, 1, 2}, plan::PlanOptions{});
  CHECK(pu.strategy.find("no Megatron roles recognised") != std::string::npos);
  // t = 1: nothing to force, nothing said.
  CHECK(plan::megatron_plan(unet, c, {1, 2, 2}, plan::PlanOptions{}).strategy == "megatron t=1 p=2 d=2");
}
