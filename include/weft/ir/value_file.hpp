#pragma once
// Value files in the safetensors format (https://huggingface.co/docs/safetensors): an 8-byte
// little-endian header length, a JSON header {key: {"dtype", "shape", "data_offsets": [begin,
// end]}, "__metadata__"?: {...}}, then the raw little-endian bytes. The format the field shares
// (torch, Hugging Face, safetensors.numpy), so a user's `model.safetensors` is a value file as
// it is. Reading converts any of F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL to doubles;
// writing stores F64 (float leaves) or I64 (integer leaves), exactly.
#include <map>
#include <string>
#include <vector>

#include "weft/core/dtype.hpp"
#include "weft/ir/host_tensor.hpp"

namespace weft::ir {

struct ValueFileEntry {
  std::string dtype;  // the safetensors dtype name ("F32", "BF16", ...)
  std::vector<std::int64_t> shape;
  std::int64_t begin = 0, end = 0;  // byte range in the data section
};

// The header of a value file: key -> entry. weft::Error naming the file when it is not one.
std::map<std::string, ValueFileEntry> read_value_file_header(const std::string& path);
// One tensor of a value file as doubles (weft::Error naming the file and the key).
HostTensor read_value(const std::string& path, const std::string& key);
// Writes `values` (key -> tensor, with the dtype each is stored in: integer dtypes as I64, the
// rest as F64) to `path`, replacing it.
void write_value_file(const std::string& path,
                      const std::map<std::string, std::pair<HostTensor, DType>>& values);

}  // namespace weft::ir
