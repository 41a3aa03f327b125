#pragma once
// JSON save/load of a graph. Loading validates (weft::Error with the JSON path of the problem).
#include <string>
#include <string_view>

#include "weft/ir/graph.hpp"

namespace weft::ir {

// Where the values a graph carries (Graph::set_value) go. In memory, a value of at most
// `inline_limit` elements is written inline ("value": [...], non-finite numbers as "nan", "inf",
// "-inf"); a larger one goes to the value file `sidecar_path` (safetensors, written by
// graph_to_json, one file for all of them), named in the JSON as `sidecar_ref` (typically its
// name relative to the JSON file) with the tensor's name as its key. Without a sidecar every
// value is inline. A file-backed value stays a reference to its own file ("value_file",
// "value_key").
struct JsonValueOptions {
  std::int64_t inline_limit = 4096;
  std::string sidecar_path;  // empty: everything inline
  std::string sidecar_ref;   // empty: sidecar_path
};

std::string graph_to_json(const Graph& g, int indent = -1, const JsonValueOptions& values = {});
// `base_dir`: the folder relative "value_file" paths are resolved against (the JSON file's).
Graph graph_from_json(std::string_view text, const std::string& base_dir = {});

}  // namespace weft::ir
