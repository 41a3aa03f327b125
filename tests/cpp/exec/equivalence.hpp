#pragma once
// Shared by the equivalence tests: tiny zoo models, lowering a search's plan, and the distance
// between a distributed run and the single-device reference.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "weft/cluster/cluster.hpp"
#include "weft/exec/program_executor.hpp"
#include "weft/ir/autodiff.hpp"
#include "weft/lower/lower.hpp"
#include "weft/models/models.hpp"
#include "weft/sharding/sharding_spec.hpp"
#include "weft/spmd/search.hpp"
#include "weft/spmd/strategy.hpp"

namespace weft::test {

// One M8 node (8 V100-32GB): the cluster the lowering tests place their meshes on.
inline const cluster::Cluster& m8() {
  static const auto c = cluster::Cluster::preset("M8", 1);
  return c;
}

// The tiny GPT's training step: Adam, or SGD with lr 0.1 (f32 tests: Adam's first steps amplify
// rounding where a gradient is near zero).
inline ir::Graph tiny_gpt(std::int64_t batch = 4, bool sgd = false) {
  models::GptConfig c;
  c.layers = 2, c.hidden = 64, c.heads = 4, c.seq = 8, c.vocab = 128, c.batch = batch;
  ir::TrainOptions to;
  if (sgd) to.optimizer = ir::Optimizer::Sgd, to.lr = 0.1;
  return ir::build_training_graph(models::gpt(c), to);
}

// The tiny GPT in f16 with f32 master weights (the default for half types): Adam, or SGD with
// momentum 0.9 and lr 0.1. (The executor stores every float in its own dtype, f64 or f32: the
// f16 parameter is the master copy's value.)
inline ir::Graph tiny_gpt_mixed(std::int64_t batch = 4, bool sgd = false) {
  models::GptConfig c;
  c.layers = 2, c.hidden = 64, c.heads = 4, c.seq = 8, c.vocab = 128, c.batch = batch;
  c.dtype = DType::F16;
  ir::TrainOptions to;
  if (sgd) to.optimizer = ir::Optimizer::Sgd, to.lr = 0.1, to.momentum = 0.9;
  return ir::build_training_graph(models::gpt(c), to);
}

// Tiny MoE (4 experts, top-2), U-Net (skip connections), Wide-ResNet-50 and BERT, batch 2.
inline std::vector<std::pair<std::string, ir::Graph>> tiny_zoo(std::int64_t batch = 2) {
  std::vector<std::pair<std::string, ir::Graph>> models;
  {
    models::MoeConfig c;
    c.layers = 2, c.hidden = 32, c.heads = 4, c.ffn = 64, c.experts = 4, c.seq = 8, c.vocab = 64,
    c.batch = batch;
    models.emplace_back("MoE", ir::build_training_graph(models::moe(c)));
  }
  {
    models::UNetConfig c;
    c.base_channels = 4, c.depth = 2, c.in_channels = 2, c.classes = 2, c.image = 8, c.batch = batch;
    models.emplace_back("U-Net", ir::build_training_graph(models::unet(c)));
  }
  {
    models::WideResNetConfig c;
    c.layers = 50, c.channels = 4, c.width_factor = 2, c.classes = 8, c.image = 32, c.batch = batch;
    models.emplace_back("Wide-ResNet", ir::build_training_graph(models::wide_resnet(c)));
  }
  {
    models::BertConfig c;
    c.layers = 2, c.hidden = 32, c.heads = 4, c.seq = 8, c.vocab = 64, c.batch = batch;
    models.emplace_back("BERT", ir::build_training_graph(models::bert(c)));
  }
  return models;
}

// max |a − b| / max |b| over a tensor (0 when both are zero).
inline double rel_diff(const ir::HostTensor& a, const ir::HostTensor& b) {
  REQUIRE(a.shape == b.shape);
  double d = 0, m = 0;
  for (std::size_t i = 0; i < a.data.size(); ++i) {
    d = std::max(d, std::abs(a.data[i] - b.data[i]));
    m = std::max(m, std::abs(b.data[i]));
  }
  return m > 0 ? d / m : d;
}

// The largest relative difference over the losses, parameters and gradients of two runs.
inline double max_rel_diff(const exec::ExecutionResult& a, const exec::ExecutionResult& ref,
                           std::string* worst = nullptr) {
  double w = 0;
  auto note = [&](double d, const std::string& what) {
    if (d > w) {
      w = d;
      if (worst) *worst = what;
    }
  };
  REQUIRE(a.losses.size() == ref.losses.size());
  for (std::size_t s = 0; s < a.losses.size(); ++s)
    note(std::abs(a.losses[s] - ref.losses[s]) / std::abs(ref.losses[s]), "loss " + std::to_string(s));
  REQUIRE(a.parameters.size() == ref.parameters.size());
  for (const auto& [n, v] : ref.parameters) note(rel_diff(a.parameters.at(n), v), "parameter " + n);
  REQUIRE(a.gradients.size() == ref.gradients.size());
  for (const auto& [n, v] : ref.gradients) note(rel_diff(a.gradients.at(n), v), "gradient " + n);
  return w;
}

// Every op a random valid strategy and every leaf a random (non-partial) spec on `mesh`.
inline lower::SpmdLayout random_layout(const ir::Graph& g, const std::vector<std::int64_t>& mesh,
                                       std::uint32_t seed) {
  return lower::random_layout(g, mesh, seed);
}

inline spmd::SearchOptions quick_search() {
  spmd::SearchOptions o;
  o.level = spmd::Level::O2;
  o.memory_limit = -1;
  o.time_limit_s = 20;
  return o;
}

}  // namespace weft::test
