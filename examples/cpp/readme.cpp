#include <fmt/core.h>

#include "weft/cluster/cluster.hpp"
#include "weft/ir/autodiff.hpp"
#include "weft/models/models.hpp"
#include "weft/plan/planner.hpp"

int main() {
  auto step = weft::ir::build_training_graph(weft::models::gpt_preset("GPT-2.7B", 16, weft::DType::F16));
  auto cluster = weft::cluster::Cluster::preset("M8", 2);
  auto plan = weft::plan::make_plan(step, cluster, {});
  fmt::print("{}\n", plan.summary());
}
