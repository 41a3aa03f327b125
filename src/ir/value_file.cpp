// Value files in the safetensors format (see value_file.hpp).
#include "weft/ir/value_file.hpp"

#include <fmt/format.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "weft/core/error.hpp"
#include "weft/ir/leaf_value.hpp"

namespace weft::ir {
namespace {

using json = nlohmann::json;
static_assert(std::endian::native == std::endian::little, "value files are little-endian; so is this host");

int dtype_bytes(const std::string& dt) {
  if (dt == "F64" || dt == "I64" || dt == "U64") return 8;
  if (dt == "F32" || dt == "I32" || dt == "U32") return 4;
  if (dt == "F16" || dt == "BF16" || dt == "I16" || dt == "U16") return 2;
  if (dt == "I8" || dt == "U8" || dt == "BOOL") return 1;
  return 0;
}

double half_to_double(std::uint16_t h) {
  const int sign = (h >> 15) & 1, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  double v;
  if (exp == 0)
    v = std::ldexp(static_cast<double>(man), -24);
  else if (exp == 31)
    v = man ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  else
    v = std::ldexp(static_cast<double>(man | 0x400), exp - 25);
  return sign ? -v : v;
}

template <typename T>
T load_as(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

double element(const std::string& dt, const char* p) {
  if (dt == "F64") return load_as<double>(p);
  if (dt == "F32") return load_as<float>(p);
  if (dt == "F16") return half_to_double(load_as<std::uint16_t>(p));
  if (dt == "BF16") return std::bit_cast<float>(static_cast<std::uint32_t>(load_as<std::uint16_t>(p)) << 16);
  if (dt == "I64") return static_cast<double>(load_as<std::int64_t>(p));
  if (dt == "U64") return static_cast<double>(load_as<std::uint64_t>(p));
  if (dt == "I32") return load_as<std::int32_t>(p);
  if (dt == "U32") return load_as<std::uint32_t>(p);
  if (dt == "I16") return load_as<std::int16_t>(p);
  if (dt == "U16") return load_as<std::uint16_t>(p);
  if (dt == "I8") return load_as<std::int8_t>(p);
  return static_cast<unsigned char>(*p);  // U8, BOOL
}

std::uint64_t header_size(std::ifstream& in, const std::string& path) {
  unsigned char b[8];
  in.read(reinterpret_cast<char*>(b), 8);
  WEFT_CHECK(in.gcount() == 8, "value file '{}': shorter than a safetensors header", path);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | b[i];
  return n;
}

}  // namespace

std::map<std::string, ValueFileEntry> read_value_file_header(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  WEFT_CHECK(in.good(), "value file '{}' cannot be opened", path);
  in.seekg(0, std::ios::end);
  const auto file_size = static_cast<std::uint64_t>(in.tellg());
  in.seekg(0);
  const std::uint64_t n = header_size(in, path);
  WEFT_CHECK(n <= file_size - 8 && n < (std::uint64_t{1} << 31),
             "value file '{}': header of {} bytes in a file of {} (not a safetensors file)", path, n,
             file_size);
  std::string text(n, '\0');
  in.read(text.data(), static_cast<std::streamsize>(n));
  json h = json::parse(text, nullptr, false);
  WEFT_CHECK(h.is_object(), "value file '{}': the header is not a JSON object (not a safetensors file)",
             path);
  const std::uint64_t data_size = file_size - 8 - n;
  std::map<std::string, ValueFileEntry> out;
  for (auto item = h.begin(); item != h.end(); ++item) {
    const std::string key = item.key();  // (a named copy: lambdas cannot capture a structured binding)
    json& e = item.value();
    if (key == "__metadata__") continue;
    auto bad = [&](const char* what) { fail("value file '{}': entry '{}': {}", path, key, what); };
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets"))
      bad("missing fields");
    if (!e["dtype"].is_string() || !e["shape"].is_array() || !e["data_offsets"].is_array() ||
        e["data_offsets"].size() != 2)
      bad("malformed fields");
    ValueFileEntry v;
    v.dtype = e["dtype"].get<std::string>();
    const int eb = dtype_bytes(v.dtype);
    if (eb == 0) fail("value file '{}': entry '{}': unsupported dtype {}", path, key, v.dtype);
    std::int64_t numel = 1;
    for (const auto& s : e["shape"]) {
      if (!s.is_number_integer() || s.get<std::int64_t>() < 0)
        bad("a shape entry is not a non-negative integer");
      v.shape.push_back(s.get<std::int64_t>());
      WEFT_CHECK(v.shape.back() == 0 || numel <= (std::int64_t{1} << 50) / v.shape.back(),
                 "value file '{}': entry '{}': too many elements", path, key);
      numel *= v.shape.back();
    }
    if (!e["data_offsets"][0].is_number_unsigned() || !e["data_offsets"][1].is_number_unsigned())
      bad("data_offsets are not non-negative integers");
    v.begin = e["data_offsets"][0].get<std::int64_t>();
    v.end = e["data_offsets"][1].get<std::int64_t>();
    if (v.begin > v.end || static_cast<std::uint64_t>(v.end) > data_size)
      bad("data_offsets outside the file's data");
    if (v.end - v.begin != numel * eb) bad("data_offsets do not match its shape and dtype");
    out.emplace(key, std::move(v));
  }
  return out;
}

HostTensor read_value(const std::string& path, const std::string& key) {
  const auto header = read_value_file_header(path);
  auto it = header.find(key);
  if (it == header.end()) {
    std::string keys;
    int shown = 0;
    for (const auto& [k, e] : header) {
      if (shown++ == 8) {
        keys += ", ...";
        break;
      }
      keys += (keys.empty() ? "" : ", ") + k;
    }
    fail("value file '{}' has no tensor '{}' (it has {} tensors: {})", path, key, header.size(), keys);
  }
  const ValueFileEntry& e = it->second;
  std::ifstream in(path, std::ios::binary);
  const std::uint64_t n = header_size(in, path);
  in.seekg(static_cast<std::streamoff>(8 + n + static_cast<std::uint64_t>(e.begin)));
  std::vector<char> bytes(static_cast<std::size_t>(e.end - e.begin));
  in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  WEFT_CHECK(in.gcount() == static_cast<std::streamsize>(bytes.size()), "value file '{}': '{}' is truncated",
             path, key);
  HostTensor t{e.shape, {}};
  const int eb = dtype_bytes(e.dtype);
  t.data.resize(bytes.size() / static_cast<std::size_t>(eb));
  for (std::size_t i = 0; i < t.data.size(); ++i)
    t.data[i] = element(e.dtype, bytes.data() + i * static_cast<std::size_t>(eb));
  return t;
}

void write_value_file(const std::string& path,
                      const std::map<std::string, std::pair<HostTensor, DType>>& values) {
  json header = json::object();
  std::int64_t offset = 0;
  for (const auto& [key, v] : values) {
    const std::int64_t bytes = v.first.numel() * 8;
    WEFT_CHECK(static_cast<std::int64_t>(v.first.data.size()) == v.first.numel(),
               "write_value_file: '{}' has {} values for shape {}", key, v.first.data.size(),
               v.first.numel());
    header[key] = {{"dtype", is_floating(v.second) ? "F64" : "I64"},
                   {"shape", v.first.shape},
                   {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  while ((text.size() + 8) % 8) text += ' ';  // the data section 8-byte aligned, as safetensors writes it
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  WEFT_CHECK(out.good(), "write_value_file: cannot write '{}'", path);
  std::uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const auto& [key, v] : values) {
    for (double x : v.first.data) {
      char b[8];
      if (is_floating(v.second))
        std::memcpy(b, &x, 8);
      else {
        const auto i = static_cast<std::int64_t>(x);
        std::memcpy(b, &i, 8);
      }
      out.write(b, 8);
    }
  }
  WEFT_CHECK(out.good(), "write_value_file: writing '{}' failed", path);
}

HostTensor LeafValue::load() const {
  if (data) return *data;
  WEFT_CHECK(!file.empty(), "a leaf value with neither data nor a file");
  return read_value(file, key);
}

bool LeafValue::operator==(const LeafValue& o) const {
  if (in_memory() != o.in_memory()) return false;
  if (in_memory()) return data == o.data || *data == *o.data;
  return file == o.file && key == o.key;
}

}  // namespace weft::ir
