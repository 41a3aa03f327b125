// Strategy enumeration from index maps (rules in strategy.hpp).
#include "weft/spmd/strategy.hpp"

#include <fmt/format.h>

#include <numeric>

#include "weft/core/error.hpp"
#include "weft/ir/op_rules.hpp"

namespace weft::spmd {

using sharding::Placement;
using sharding::ShardingSpec;

std::string OpStrategy::describe(const ir::IndexMap& map, const std::vector<std::string>& names) const {
  std::vector<std::string> parts;
  for (std::size_t a = 0; a < axes.size(); ++a) {
    if (axes[a].factor < 0) continue;
    const auto& f = map.factors[axes[a].factor];
    std::string an = a < names.size() ? names[a] : std::to_string(a);
    if (axes[a].inner_stride > 0)
      parts.push_back(fmt::format("{}/{}:{}", f.name, axes[a].inner_stride, an));
    else
      parts.push_back(fmt::format("{}:{}", f.name, an));
  }
  return parts.empty() ? "R" : fmt::format("{}", fmt::join(parts, " "));
}

namespace {

// Spec of one tensor (dims = its factor lists) under the assignment; nullopt when invalid.
std::optional<ShardingSpec> tensor_spec(const ir::IndexMap& m, const std::vector<ir::DimFactors>& dims,
                                        const std::vector<std::int64_t>& shape,
                                        const std::vector<std::int64_t>& mesh,
                                        const std::vector<AxisAssign>& axes, bool is_output) {
  std::vector<Placement> pl(mesh.size());
  for (std::size_t a = 0; a < mesh.size(); ++a) {
    const int f = axes[a].factor;
    if (f < 0) continue;
    int dim = -1, pos = -1, count = 0;
    for (int d = 0; d < static_cast<int>(dims.size()); ++d)
      for (int i = 0; i < static_cast<int>(dims[d].size()); ++i)
        if (dims[d][i] == f) dim = d, pos = i, ++count;
    if (count > 1) return std::nullopt;  // a factor twice in one tensor (diagonal): not splittable
    if (count == 0) {
      const auto& fac = m.factors[f];
      if (is_output && fac.kind == ir::FactorKind::Reduction)
        pl[a] = Placement::partial(fac.reduce == ir::ReduceKind::Max ? sharding::ReduceKind::Max
                                                                     : sharding::ReduceKind::Sum);
      continue;
    }
    std::int64_t minor = 1;
    for (std::size_t i = pos + 1; i < dims[dim].size(); ++i) minor *= m.factors[dims[dim][i]].size;
    std::int64_t stride;
    if (axes[a].inner_stride > 0) {
      stride = axes[a].inner_stride * minor;
    } else {
      std::int64_t k = 1;  // default nesting: axes on f up to and including a, in mesh order
      for (std::size_t b = 0; b <= a; ++b)
        if (axes[b].factor == f && axes[b].inner_stride == 0) k *= mesh[b];
      stride = m.factors[f].size / k * minor;
    }
    pl[a] = Placement::shard(dim, stride);
  }
  try {
    return ShardingSpec(shape, mesh, std::move(pl));
  } catch (const Error&) {
    return std::nullopt;
  }
}

}  // namespace

std::optional<OpStrategy> make_strategy(const ir::Graph& g, const ir::Op& op,
                                        const std::vector<std::int64_t>& mesh,
                                        const std::vector<AxisAssign>& axes) {
  const auto& m = op.index_map;
  WEFT_CHECK(axes.size() == mesh.size(), "make_strategy: {} axis assignments for a {}-axis mesh", axes.size(),
             mesh.size());
  OpStrategy s;
  s.axes = axes;
  s.factor_shards.assign(m.factors.size(), 1);
  s.factor_stride.assign(m.factors.size(), 0);
  std::vector<int> explicit_count(m.factors.size(), 0), default_count(m.factors.size(), 0);
  for (std::size_t a = 0; a < mesh.size(); ++a) {
    const int f = axes[a].factor;
    if (f < 0) continue;
    if (f >= static_cast<int>(m.factors.size()) || mesh[a] == 1) return std::nullopt;
    if (m.factors[f].kind == ir::FactorKind::NeedReplication) return std::nullopt;
    s.factor_shards[f] *= mesh[a];
    (axes[a].inner_stride > 0 ? explicit_count : default_count)[f]++;
    if (axes[a].inner_stride > 0) s.factor_stride[f] = axes[a].inner_stride;
    if (axes[a].inner_stride > 0 && (m.factors[f].size % (axes[a].inner_stride * mesh[a]) != 0))
      return std::nullopt;
  }
  for (std::size_t f = 0; f < m.factors.size(); ++f) {
    if (m.factors[f].size % s.factor_shards[f] != 0) return std::nullopt;
    if (explicit_count[f] > 1 || (explicit_count[f] == 1 && default_count[f] > 0)) return std::nullopt;
  }
  for (std::size_t i = 0; i < op.inputs.size(); ++i) {
    auto sp = tensor_spec(m, m.inputs[i], g.tensor(op.inputs[i]).shape, mesh, axes, false);
    if (!sp) return std::nullopt;
    s.inputs.push_back(std::move(*sp));
  }
  for (std::size_t i = 0; i < op.outputs.size(); ++i) {
    auto sp = tensor_spec(m, m.outputs[i], g.tensor(op.outputs[i]).shape, mesh, axes, true);
    if (!sp) return std::nullopt;
    s.outputs.push_back(std::move(*sp));
  }
  return s;
}

std::vector<OpStrategy> enumerate_strategies(const ir::Graph& g, const ir::Op& op,
                                             const std::vector<std::int64_t>& mesh) {
  const int nf = static_cast<int>(op.index_map.factors.size());
  std::vector<AxisAssign> cur(mesh.size());
  std::vector<OpStrategy> out;
  // Odometer over (factor or -1) per axis; axes of size 1 stay -1.
  std::vector<int> idx(mesh.size(), -1);
  while (true) {
    for (std::size_t a = 0; a < mesh.size(); ++a) cur[a] = {idx[a], 0};
    if (auto s = make_strategy(g, op, mesh, cur)) out.push_back(std::move(*s));
    std::size_t a = 0;
    for (; a < mesh.size(); ++a) {
      if (mesh[a] == 1) continue;
      if (++idx[a] < nf) break;
      idx[a] = -1;
    }
    if (a == mesh.size()) break;
  }
  // A causal attention split by its queries: the cyclic variant beside the block one.
  const std::size_t defaults = out.size();
  for (std::size_t i = 0; i < defaults; ++i) {
    const std::vector<AxisAssign> axes = out[i].axes;  // a copy: out grows below
    const std::vector<std::int64_t> shards = out[i].factor_shards;
    for (std::size_t a = 0; a < axes.size(); ++a) {
      const int f = axes[a].factor;
      if (f < 0 || op.index_map.factors[static_cast<std::size_t>(f)].name != "s" ||
          shards[static_cast<std::size_t>(f)] != mesh[a] ||
          ir::attention_tile_imbalance(op, mesh[a]) <= 1.0)
        continue;
      std::vector<AxisAssign> cyclic = axes;
      cyclic[a].inner_stride = 1;
      if (auto s = make_strategy(g, op, mesh, cyclic)) out.push_back(std::move(*s));
    }
  }
  return out;
}

std::optional<OpStrategy> restride_to(const ir::Graph& g, const ir::Op& op,
                                      const std::vector<std::int64_t>& mesh, const OpStrategy& base,
                                      bool is_output, int index, const ShardingSpec& target) {
  const auto& m = op.index_map;
  const auto& dims = is_output ? m.outputs[index] : m.inputs[index];
  std::vector<AxisAssign> axes = base.axes;
  for (std::size_t a = 0; a < mesh.size(); ++a) {
    const auto& want = target.per_axis()[a];
    const int f = axes[a].factor;
    if (want.kind != Placement::Shard) {
      // Only strides may change: the kind of placement must already agree.
      continue;
    }
    if (f < 0) return std::nullopt;
    // Which dim/position holds f in this tensor?
    int dim = -1, pos = -1;
    for (int d = 0; d < static_cast<int>(dims.size()); ++d)
      for (int i = 0; i < static_cast<int>(dims[d].size()); ++i)
        if (dims[d][i] == f) dim = d, pos = i;
    if (dim != want.dim) return std::nullopt;
    std::int64_t minor = 1;
    for (std::size_t i = pos + 1; i < dims[dim].size(); ++i) minor *= m.factors[dims[dim][i]].size;
    if (want.stride % minor != 0) return std::nullopt;
    axes[a].inner_stride = want.stride / minor;
  }
  // Canonicalise: an explicit stride equal to the default one is the default.
  for (std::size_t a = 0; a < mesh.size(); ++a)
    if (axes[a].factor >= 0 && axes[a].inner_stride > 0) {
      int count = 0;
      for (std::size_t b = 0; b < mesh.size(); ++b) count += axes[b].factor == axes[a].factor;
      if (count == 1 && axes[a].inner_stride * mesh[a] == m.factors[axes[a].factor].size)
        axes[a].inner_stride = 0;
    }
  auto s = make_strategy(g, op, mesh, axes);
  if (!s) return std::nullopt;
  const auto& got = is_output ? s->outputs[index] : s->inputs[index];
  if (!(got == target)) return std::nullopt;
  return s;
}

}  // namespace weft::spmd
