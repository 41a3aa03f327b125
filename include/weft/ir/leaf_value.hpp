#pragma once
// The value a leaf of a model carries: a Parameter's initial weights, a Buffer's state (running
// statistics, position tables), a Constant known at import (a causal mask, an eps, bucket ids).
// Values are part of the model (Graph::set_value): every executor reads them, none invents them.
//
// A value is held in memory (shared, so copying a graph — autodiff, rebatching, lowering — costs
// nothing) or named in a value file (a safetensors file and the key in it; ir/value_file.hpp),
// read when an executor needs it: a meta-device import stays allocation-free, and a rank of the
// torch runtime reads only what its tiles need.
#include <memory>
#include <string>

#include "weft/ir/host_tensor.hpp"

namespace weft::ir {

struct LeafValue {
  std::shared_ptr<const HostTensor> data;  // in memory; null when file-backed
  std::string file;                        // a safetensors file (absolute, or as given)
  std::string key;                         // the tensor's key in `file`

  bool in_memory() const { return data != nullptr; }
  // The whole value (read from the file when file-backed).
  HostTensor load() const;
  bool operator==(const LeafValue& o) const;
};

}  // namespace weft::ir
