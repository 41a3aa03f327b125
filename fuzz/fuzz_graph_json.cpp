// Graph JSON reader: any text gives a graph that validates, or weft::Error.
#include "fuzz_target.hpp"
#include "weft/ir/json.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return weft::fuzz::run_one(data, size, [](std::string_view text) {
    auto g = weft::ir::graph_from_json(text);
    g.validate();
    (void)g.flops();
    (void)g.num_params();
    (void)weft::ir::graph_to_json(g);
  });
}
