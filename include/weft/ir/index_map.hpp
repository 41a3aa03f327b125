#pragma once
// The index map of an op: every dimension of every operand and result is the product of factors,
// major to minor (einsum letters generalised, like Shardy's op sharding rules). Everything the
// solvers need — which dims can be split without communication, which splits leave a partial
// result, strides through reshapes, FLOPs — derives from this one description.
//
//   factor kinds: Parallel        appears in a result; splitting it splits the work, no comm.
//                 Reduction       splitting it leaves a partial result (sum or max) that a
//                                 collective must resolve, in every result it does not appear
//                                 in; a result that carries it is split along it (fused
//                                 attention's backward: dq split by the queries, dk and dv
//                                 partial sums over them).
//                 NeedReplication cannot be split without a halo/exchange (conv spatial dims,
//                                 the normalised dim of softmax/layer-norm, concat axis, ...).
//   A dim whose factor list is empty has size 1 (a broadcast dim).
//   Sharding a factor that is not the major one of its dim is Rhino's strided sharding, with
//   stride = (factor size / shards) × Π(sizes of the factors minor to it in that dim).
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace weft::ir {

enum class FactorKind : std::uint8_t { Parallel, Reduction, NeedReplication };
enum class ReduceKind : std::uint8_t { None, Sum, Max };

std::string_view factor_kind_name(FactorKind k);
std::string_view reduce_kind_name(ReduceKind k);

struct Factor {
  std::string name;  // einsum letter or a derived name ("h.0"); unique within the map
  std::int64_t size = 1;
  FactorKind kind = FactorKind::Parallel;
  ReduceKind reduce = ReduceKind::None;  // for Reduction factors: how partial results combine
  bool operator==(const Factor&) const = default;
};

using DimFactors = std::vector<int>;  // factor ids of one tensor dim, major to minor

struct IndexMap {
  std::vector<Factor> factors;
  std::vector<std::vector<DimFactors>> inputs;   // [operand][dim] -> factors
  std::vector<std::vector<DimFactors>> outputs;  // [result][dim] -> factors
  // FLOPs = flops_per_point × Π sizes of work_factors (the loop nest that does the arithmetic;
  // a conv's input spatial factors are not in it, an embedding lookup does no arithmetic).
  double flops_per_point = 0;
  std::vector<int> work_factors;

  std::int64_t iteration_points() const;  // Π sizes of work_factors
  double flops() const { return flops_per_point * static_cast<double>(iteration_points()); }
  // Size of a dim = product of its factors' sizes.
  std::int64_t dim_size(const DimFactors& d) const;
  // Where a factor appears: (is_output, tensor index, dim, position within the dim).
  struct Use {
    bool output;
    int tensor, dim, pos;
  };
  std::vector<Use> uses(int factor) const;
  // "bs(h:n,d),(h:n,d)f->bsf"-like one-line form for dumps.
  std::string to_string() const;
  bool operator==(const IndexMap&) const = default;
};

}  // namespace weft::ir
