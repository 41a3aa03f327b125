#pragma once
// JSON save/load of a graph. Loading validates (weft::Error with the JSON path of the problem).
#include <string>
#include <string_view>

#include "weft/ir/graph.hpp"

namespace weft::ir {

std::string graph_to_json(const Graph& g, int indent = -1);
Graph graph_from_json(std::string_view text);

}  // namespace weft::ir
