#include "weft/ir/index_map.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "weft/core/error.hpp"
#include "weft/ir/tensor.hpp"

namespace weft::ir {

std::int64_t TensorInfo::numel() const {
  std::int64_t n = 1;
  for (auto s : shape)
    WEFT_CHECK(!__builtin_mul_overflow(n, s, &n), "tensor '{}': shape {} has more than 2^63 elements", name,
               fmt::format("{}", fmt::join(shape, "x")));
  return n;
}

std::int64_t TensorInfo::bytes() const {
  std::int64_t b = 0;
  WEFT_CHECK(!__builtin_mul_overflow(numel(), static_cast<std::int64_t>(dtype_size(dtype)), &b),
             "tensor '{}': its bytes exceed 2^63", name);
  return b;
}

std::int64_t IndexMap::iteration_points() const {
  std::int64_t n = 1;
  for (int f : work_factors) n *= factors[f].size;
  return n;
}

std::int64_t IndexMap::dim_size(const DimFactors& d) const {
  std::int64_t n = 1;
  for (int f : d) n *= factors[f].size;
  return n;
}

std::vector<IndexMap::Use> IndexMap::uses(int factor) const {
  std::vector<Use> out;
  auto scan = [&](const std::vector<std::vector<DimFactors>>& ts, bool is_out) {
    for (std::size_t t = 0; t < ts.size(); ++t)
      for (std::size_t d = 0; d < ts[t].size(); ++d)
        for (std::size_t p = 0; p < ts[t][d].size(); ++p)
          if (ts[t][d][p] == factor)
            out.push_back({is_out, static_cast<int>(t), static_cast<int>(d), static_cast<int>(p)});
  };
  scan(inputs, false);
  scan(outputs, true);
  return out;
}

std::string IndexMap::to_string() const {
  auto dim = [&](const DimFactors& d) {
    if (d.size() == 1) return factors[d[0]].name;
    std::string s = "(";
    for (std::size_t i = 0; i < d.size(); ++i) s += (i ? "," : "") + factors[d[i]].name;
    return s + ")";
  };
  auto tensors = [&](const std::vector<std::vector<DimFactors>>& ts) {
    std::string s;
    for (std::size_t t = 0; t < ts.size(); ++t) {
      if (t) s += ",";
      s += "[";
      for (std::size_t d = 0; d < ts[t].size(); ++d) s += (d ? " " : "") + dim(ts[t][d]);
      s += "]";
    }
    return s;
  };
  std::string s = tensors(inputs) + "->" + tensors(outputs);
  std::string red;
  for (const auto& f : factors) {
    if (f.kind == FactorKind::Reduction) red += fmt::format(" {}:{}", f.name, reduce_kind_name(f.reduce));
    if (f.kind == FactorKind::NeedReplication) red += fmt::format(" {}:rep", f.name);
  }
  return red.empty() ? s : s + " |" + red;
}

}  // namespace weft::ir
