#include "weft/core/json_reader.hpp"

#include <fmt/format.h>

#include <cmath>

namespace weft {

JsonReader::json JsonReader::parse(std::string_view text) const {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {  // syntax errors and numbers out of double's range alike
    fail("{}: not valid JSON: {}", what_, e.what());
  }
}

void JsonReader::bad(const std::string& path, std::string_view problem) const {
  fail("{}: {}: {}", what_, path, problem);
}

const JsonReader::json& JsonReader::object(const json& j, const std::string& path) const {
  if (!j.is_object()) bad(path, "expected an object, got " + j.dump());
  return j;
}

const JsonReader::json& JsonReader::array(const json& j, const std::string& path) const {
  if (!j.is_array()) bad(path, "expected an array, got " + j.dump());
  return j;
}

const JsonReader::json& JsonReader::at(const json& obj, std::string_view key, const std::string& path) const {
  const json& o = object(obj, path);
  auto it = o.find(std::string(key));
  if (it == o.end()) bad(join(path, key), "missing field");
  return *it;
}

std::int64_t JsonReader::integer(const json& v, const std::string& path, std::int64_t lo,
                                 std::uint64_t hi) const {
  if (v.is_number_unsigned()) {
    const auto u = v.get<std::uint64_t>();
    if (u > hi) bad(path, fmt::format("{} is out of range (at most {})", u, hi));
    return static_cast<std::int64_t>(u);
  }
  if (!v.is_number_integer()) bad(path, "expected an integer, got " + v.dump());
  const auto s = v.get<std::int64_t>();
  if (s < lo || (s > 0 && static_cast<std::uint64_t>(s) > hi))
    bad(path, fmt::format("{} is out of range [{}, {}]", s, lo, hi));
  return s;
}

double JsonReader::number(const json& v, const std::string& path) const {
  if (!v.is_number()) bad(path, "expected a number, got " + v.dump());
  const double d = v.get<double>();
  if (!std::isfinite(d)) bad(path, "expected a finite number");
  return d;
}

double JsonReader::positive(const json& obj, std::string_view key, const std::string& path,
                            bool allow_zero) const {
  const double d = field<double>(obj, key, path);
  if (allow_zero ? d < 0 : d <= 0)
    bad(join(path, key), fmt::format("must be {} 0, got {}", allow_zero ? ">=" : ">", d));
  return d;
}

}  // namespace weft
