// Model zoo: every preset's forward graph survives a JSON round trip exactly.
#include <doctest/doctest.h>

#include <cstdlib>
#include <set>
#include <string>

#include "weft/ir/json.hpp"
#include "weft/models/models.hpp"

using namespace weft;

TEST_CASE("models: JSON round trip is exact for every preset") {
  // Under the sanitizers (5-10x slower) only the smallest preset of each family.
  const bool sanitized = std::getenv("WEFT_SANITIZED") != nullptr;
  const std::set<std::string> small{"GPT-Medium", "MoE-8E-380M", "WR-1.3B",
                                    "UNet-33M",   "VGG19",       "BERT-large"};
  for (const auto& p : models::presets()) {
    if (sanitized && !small.count(p.name)) continue;
    CAPTURE(p.name);
    ir::Graph g = models::build_preset(p.name, 2, DType::BF16);
    ir::Graph back = ir::graph_from_json(ir::graph_to_json(g));
    CHECK(back == g);
    CHECK(back.num_params() == g.num_params());
    CHECK(back.flops() == g.flops());
  }
}
