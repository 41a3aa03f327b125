#pragma once
// Shared by the equivalence tests: tiny zoo models, lowering a search's plan, and the distance
// between a distributed run and the single-device reference.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "weft/cluster/cluster.hpp"
#include "weft/exec/program_executor.hpp"
#include "weft/ir/autodiff.hpp"
#include "weft/lower/lower.hpp"
#include "weft/models/models.hpp"
#include "weft/spmd/search.hpp"

namespace weft::test {

inline ir::Graph tiny_gpt(std::int64_t batch = 4) {
  models::GptConfig c;
  c.layers = 2, c.hidden = 64, c.heads = 4, c.seq = 8, c.vocab = 128, c.batch = batch;
  return ir::build_training_graph(models::gpt(c));
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
inline double max_rel_diff(const exec::ExecutionResult& a, const exec::ExecutionResult& ref, std::string* worst = nullptr) {
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

inline spmd::SearchOptions quick_search() {
  spmd::SearchOptions o;
  o.level = spmd::Level::O2;
  o.memory_limit = -1;
  o.time_limit_s = 20;
  return o;
}

}  // namespace weft::test
