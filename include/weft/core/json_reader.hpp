#pragma once
// Typed reads from JSON with the path of the offending field in every error: the one reader of
// every weft JSON format (cluster, plan, program, schedule, bandwidth trace, calibration), so that
// each names its bad field ("Plan JSON: $.stages[2].devices[0]: expected an integer, got 1.5")
// and checks the same things: integers are integers in range (8.5 is not 8), numbers are finite,
// a parse error (including a number out of double's range) is a weft::Error, never a crash.
#include <cstdint>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "weft/core/error.hpp"

namespace weft {

namespace json_detail {
template <typename T>
struct is_string_map : std::false_type {};
template <typename U>
struct is_string_map<std::map<std::string, U>> : std::true_type {};
}  // namespace json_detail

class JsonReader {
 public:
  using json = nlohmann::json;
  // `what` names the format in every error ("Plan JSON"); a string literal (it is not copied).
  constexpr explicit JsonReader(std::string_view what) : what_(what) {}

  // The parsed document (weft::Error "<what>: not valid JSON: ..." on any syntax or range error).
  json parse(std::string_view text) const;

  [[noreturn]] void bad(const std::string& path, std::string_view problem) const;
  const json& object(const json& j, const std::string& path) const;
  const json& array(const json& j, const std::string& path) const;
  // obj[key], which must exist; the returned value's path is path + "." + key.
  const json& at(const json& obj, std::string_view key, const std::string& path) const;

  // A value of type T: integers (int, std::int64_t, ...) must be integral JSON numbers within T's
  // range; floating point values finite numbers; strings strings; vectors arrays of such values.
  template <typename T>
  T get(const json& v, const std::string& path) const {
    if constexpr (std::is_same_v<T, bool>) {
      if (!v.is_boolean()) bad(path, "expected true or false, got " + v.dump());
      return v.template get<bool>();
    } else if constexpr (std::is_integral_v<T>) {
      return static_cast<T>(integer(v, path, std::numeric_limits<T>::min(), std::numeric_limits<T>::max()));
    } else if constexpr (std::is_floating_point_v<T>) {
      return static_cast<T>(number(v, path));
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (!v.is_string()) bad(path, "expected a string, got " + v.dump());
      return v.template get<std::string>();
    } else {
      return get_vector<T>(v, path);
    }
  }

  template <typename T>
  T field(const json& obj, std::string_view key, const std::string& path) const {
    return get<T>(at(obj, key, path), join(path, key));
  }
  template <typename T>
  T field_or(const json& obj, std::string_view key, const std::string& path, T fallback) const {
    const json& o = object(obj, path);
    auto it = o.find(std::string(key));
    return it == o.end() ? fallback : get<T>(*it, join(path, key));
  }
  // A number field that must be > 0 (or >= 0 with allow_zero).
  double positive(const json& obj, std::string_view key, const std::string& path,
                  bool allow_zero = false) const;

  static std::string join(const std::string& path, std::string_view key) {
    return path + "." + std::string(key);
  }
  static std::string index(const std::string& path, std::size_t i) {
    return path + "[" + std::to_string(i) + "]";
  }

 private:
  std::int64_t integer(const json& v, const std::string& path, std::int64_t lo, std::uint64_t hi) const;
  double number(const json& v, const std::string& path) const;
  template <typename V>
  V get_vector(const json& v, const std::string& path) const {
    if constexpr (json_detail::is_string_map<V>::value) {
      V out;
      for (auto it = object(v, path).begin(); it != v.end(); ++it)
        out.emplace(it.key(), get<typename V::mapped_type>(it.value(), join(path, it.key())));
      return out;
    } else {
      return get_list<V>(v, path);
    }
  }
  template <typename V>
  V get_list(const json& v, const std::string& path) const {
    static_assert(std::is_same_v<V, std::vector<typename V::value_type>>,
                  "JsonReader::get: unsupported type");
    const json& a = array(v, path);
    V out;
    out.reserve(a.size());
    for (std::size_t i = 0; i < a.size(); ++i)
      out.push_back(get<typename V::value_type>(a[i], index(path, i)));
    return out;
  }
  std::string_view what_;
};

}  // namespace weft
