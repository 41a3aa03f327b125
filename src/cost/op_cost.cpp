// Roofline compute cost of an IR op under a factor split (formulas in op_cost.hpp).
#include "weft/cost/op_cost.hpp"

#include <algorithm>

#include "weft/core/error.hpp"
#include "weft/cost/gemm_shape.hpp"
#include "weft/ir/op_rules.hpp"

namespace weft::cost {

DType compute_dtype(const ir::Graph& g, const ir::Op& op) {
  for (ir::TensorId t : op.outputs)
    if (is_floating(g.tensor(t).dtype)) return g.tensor(t).dtype;
  for (ir::TensorId t : op.inputs)
    if (is_floating(g.tensor(t).dtype)) return g.tensor(t).dtype;
  return DType::F32;
}

double roofline_time(double flops, double bytes, const cluster::DeviceSpec& device, DType dtype,
                     const GemmShape* gemm) {
  double peak = 0;
  DType priced = dtype;
  auto it = device.peak_flops.find(dtype);
  if (it != device.peak_flops.end()) {
    peak = it->second;
  } else if (auto f = device.peak_flops.find(DType::F32); f != device.peak_flops.end()) {
    peak = f->second;
    priced = DType::F32;
  }
  WEFT_CHECK(peak > 0, "roofline: device '{}' has no peak FLOP/s for {}", device.kind, dtype_name(dtype));
  WEFT_CHECK(device.memory_bandwidth > 0, "roofline: device '{}' has no memory bandwidth", device.kind);
  const cluster::MatmulEfficiency& me = device.matmul(priced);
  const double eff = gemm ? me.at(gemm->parallel(), gemm->k) : me.ceiling;
  const bool runs = flops > 0 || bytes > 0;  // a launch costs its overhead
  return std::max(flops / (peak * eff), bytes / (device.memory_bandwidth * device.memory_efficiency)) +
         (runs ? device.kernel_overhead : 0.0);
}

namespace {
double shards_of(const ir::IndexMap& m, const std::vector<ir::DimFactors>& dims,
                 const std::vector<std::int64_t>& fs) {
  double s = 1;
  for (const auto& d : dims)
    for (int f : d) s *= static_cast<double>(fs[f]);
  (void)m;
  return s;
}
}  // namespace

double local_tensor_bytes(const ir::Graph& g, const ir::Op& op, bool is_output, int index,
                          const std::vector<std::int64_t>& fs) {
  const auto& m = op.index_map;
  WEFT_CHECK(fs.size() == m.factors.size(), "op_cost: {} factor shards for op '{}' with {} factors",
             fs.size(), op.name, m.factors.size());
  const auto& ids = is_output ? op.outputs : op.inputs;
  const auto& dims = is_output ? m.outputs : m.inputs;
  WEFT_CHECK(index >= 0 && index < static_cast<int>(ids.size()), "op_cost: bad tensor index {}", index);
  return static_cast<double>(g.tensor(ids[index]).bytes()) / shards_of(m, dims[index], fs);
}

OpCost op_cost(const ir::Graph& g, const ir::Op& op, const cluster::DeviceSpec& device,
               const std::vector<std::int64_t>& fs, const std::vector<std::int64_t>& stride) {
  const auto& m = op.index_map;
  WEFT_CHECK(fs.size() == m.factors.size(), "op_cost: {} factor shards for op '{}' with {} factors",
             fs.size(), op.name, m.factors.size());
  for (auto s : fs) WEFT_CHECK(s >= 1, "op_cost: factor shards must be >= 1 (op '{}')", op.name);
  OpCost c;
  double work = 1;
  for (int f : m.work_factors) work *= static_cast<double>(fs[f]);
  c.flops = m.flops() / work;
  // A causal fused attention split along its queries (context parallelism) waits for its busiest
  // tile: the last one's queries keep the most keys.
  if (op.kind == ir::OpKind::Attention || op.kind == ir::OpKind::AttentionGrad)
    for (std::size_t f = 0; f < m.factors.size(); ++f)
      if (m.factors[f].name == "s" && fs[f] > 1)
        c.flops *= ir::attention_tile_imbalance(op, fs[f], f < stride.size() ? stride[f] : 0);
  for (int i = 0; i < static_cast<int>(op.inputs.size()); ++i)
    c.bytes += local_tensor_bytes(g, op, false, i, fs);
  for (int i = 0; i < static_cast<int>(op.outputs.size()); ++i)
    c.bytes += local_tensor_bytes(g, op, true, i, fs);
  std::vector<double> local(m.factors.size());
  for (std::size_t f = 0; f < local.size(); ++f)
    local[f] = static_cast<double>(m.factors[f].size) / static_cast<double>(fs[f]);
  const auto gemm = gemm_shape(op, local);
  c.time = roofline_time(c.flops, c.bytes, device, compute_dtype(g, op), gemm ? &*gemm : nullptr);
  return c;
}

OpCost op_cost_fractional(const ir::Graph& g, const ir::Op& op, const cluster::DeviceSpec& device,
                          const std::vector<double>& frac) {
  const auto& m = op.index_map;
  WEFT_CHECK(frac.size() == m.factors.size(), "op_cost: {} factor fractions for op '{}' with {} factors",
             frac.size(), op.name, m.factors.size());
  for (double f : frac)
    WEFT_CHECK(f >= 0 && f <= 1, "op_cost: factor fractions must be in [0, 1] (op '{}', got {})", op.name, f);
  OpCost c;
  if (std::find(frac.begin(), frac.end(), 0.0) != frac.end()) return c;
  auto held = [&](const std::vector<ir::DimFactors>& dims) {
    double p = 1;
    for (const auto& d : dims)
      for (int f : d) p *= frac[static_cast<std::size_t>(f)];
    return p;
  };
  double work = 1;
  for (int f : m.work_factors) work *= frac[static_cast<std::size_t>(f)];
  c.flops = m.flops() * work;
  for (std::size_t i = 0; i < op.inputs.size(); ++i)
    c.bytes += static_cast<double>(g.tensor(op.inputs[i]).bytes()) * held(m.inputs[i]);
  for (std::size_t i = 0; i < op.outputs.size(); ++i)
    c.bytes += static_cast<double>(g.tensor(op.outputs[i]).bytes()) * held(m.outputs[i]);
  std::vector<double> local(m.factors.size());
  for (std::size_t f = 0; f < local.size(); ++f) local[f] = static_cast<double>(m.factors[f].size) * frac[f];
  const auto gemm = gemm_shape(op, local);
  c.time = roofline_time(c.flops, c.bytes, device, compute_dtype(g, op), gemm ? &*gemm : nullptr);
  return c;
}

}  // namespace weft::cost
