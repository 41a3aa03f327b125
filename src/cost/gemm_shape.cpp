// GEMM shape of an op from its index map (rules in gemm_shape.hpp).
#include "weft/cost/gemm_shape.hpp"

#include <algorithm>

namespace weft::cost {

namespace {
bool holds(const std::vector<ir::DimFactors>& dims, int f) {
  return std::any_of(dims.begin(), dims.end(),
                     [f](const ir::DimFactors& d) { return std::find(d.begin(), d.end(), f) != d.end(); });
}
}  // namespace

std::optional<GemmShape> gemm_shape(const ir::Op& op, const std::vector<double>& size) {
  using K = ir::OpKind;
  const bool gemm_kind =
      op.kind == K::Einsum || op.kind == K::Conv2d || op.kind == K::Conv2dGradInput || op.kind == K::Conv2dGradWeight;
  const auto& m = op.index_map;
  if (!gemm_kind || m.inputs.size() != 2 || m.outputs.empty()) return std::nullopt;
  GemmShape s;
  bool contracted = false;
  for (int f : m.work_factors) {
    const double x = size[static_cast<std::size_t>(f)];
    const bool a = holds(m.inputs[0], f), b = holds(m.inputs[1], f), c = holds(m.outputs[0], f);
    if (!c) {
      s.k *= x;
      contracted = true;
    } else if (a && b) {
      s.batch *= x;
    } else if (b) {
      s.n *= x;
    } else {
      s.m *= x;
    }
  }
  if (!contracted) return std::nullopt;
  return s;
}

}  // namespace weft::cost
