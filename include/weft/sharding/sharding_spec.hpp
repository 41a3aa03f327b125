#pragma once
// ShardingSpec: how a tensor is laid out on a device mesh. One Placement per mesh axis:
//   Shard(dim, stride)  the axis splits tensor dim `dim`; `stride` = consecutive elements of the
//                       dim (counted in GLOBAL elements) that go to one shard before moving on;
//   Replicate           every device along the axis holds the same data;
//   Partial(sum|max)    devices along the axis hold terms whose sum (max) is the value.
//
// Convention (docs/modules/sharding.md has the full text): for a dim of (padded) size N and the
// mesh axes i = 1..m sharding it with k_i shards and strides s_i, device coordinate c_i holds
// element e iff  floor(e / s_i) mod k_i == c_i  for every i. This is the factor view: the dim is a
// mixed-radix number and axis i owns the digit of radix k_i at place value s_i. Valid iff, with
// the axes sorted by stride (major = largest), s_i * k_i divides N and every major stride is a
// multiple of s_j * k_j of every axis j minor to it. The order "major to minor" is therefore
// carried by the strides themselves; s = N/k (one axis) is block sharding, s = 1 cyclic.
// stride 0 in the constructor means "block": the zero-stride axes of a dim become the major
// digits, nested in mesh-axis order (the first such axis is the most major). Strides are stored
// resolved (never 0), so S(0) and S(0,stride=N/k) are the same spec.
//
// Uneven dims (allow_padding): the dim is padded at the end to N' = ceil(N/K)*K, K = product of
// the shard counts on it; all the math above runs on N' and indices >= N are dropped. For one
// axis in block mode this is torch.chunk / DTensor's rule (chunk size ceil(N/k), last chunks
// smaller or empty). Padding elements always sit at the end of each local buffer, so local
// offsets of real elements stay 0..local_size-1. Without allow_padding an uneven dim is an error.
//
// Text notation (to_string / parse), one token per mesh axis separated by spaces:
//   "S(0)"  "S(1,2)" (stride 2)  "R"  "P(sum)"  "P(max)"   e.g. "S(0) R P(sum)".
// Strides are printed only for a dim whose strides differ from the default block nesting.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace weft::sharding {

enum class ReduceKind { Sum, Max };

struct Placement {
  enum Kind { Replicate, Shard, Partial } kind = Replicate;
  int dim = -1;
  int64_t stride = 0;  // 0 = block (max stride); resolved in ShardingSpec
  ReduceKind reduce = ReduceKind::Sum;

  static Placement replicate() { return {}; }
  static Placement shard(int dim, int64_t stride = 0) { return {Shard, dim, stride, ReduceKind::Sum}; }
  static Placement partial(ReduceKind r = ReduceKind::Sum) { return {Partial, -1, 0, r}; }
  bool operator==(const Placement&) const = default;
  std::string to_string() const;  // "S(0)", "S(0,4)", "R", "P(sum)"
};

class ShardingSpec {
 public:
  ShardingSpec(std::vector<int64_t> tensor_shape, std::vector<int64_t> mesh_shape,
               std::vector<Placement> per_axis, bool allow_padding = false);
  // The same without exceptions: nullopt when invalid (used in search loops).
  static std::optional<ShardingSpec> try_make(std::vector<int64_t> tensor_shape,
                                              std::vector<int64_t> mesh_shape,
                                              std::vector<Placement> per_axis, bool allow_padding = false);
  // Fully replicated spec.
  static ShardingSpec replicated(std::vector<int64_t> tensor_shape, std::vector<int64_t> mesh_shape);
  // Parses the notation above; also accepts "Shard(0)", "Replicate()", "Partial()" / "Partial(max)",
  // DTensor's strided shards ("_StridedShard(dim=0, split_factor=2)", torch's "sf=" and "_S(0, 2)"
  // forms, read with DTensor's sequential mesh-order semantics: what to_dtensor writes) and an
  // optional "[...]" or "(...)" with commas.
  static ShardingSpec parse(std::string_view text, std::vector<int64_t> tensor_shape,
                            std::vector<int64_t> mesh_shape, bool allow_padding = false);
  // Alpa/GSPMD per-tensor-dim notation for meshes of up to 2 axes, e.g. "S0R", "RS1", "S01R",
  // "S10R" (axis 1 major), "RR". Block shards only, no partial (throws otherwise).
  static ShardingSpec parse_alpa(std::string_view text, std::vector<int64_t> tensor_shape,
                                 std::vector<int64_t> mesh_shape);
  std::string to_string() const;
  std::string to_alpa() const;  // throws weft::Error when strided, partial or mesh ndim > 2
  // PyTorch DTensor placements as text: "[Shard(0), Replicate(), Partial('sum')]", strided axes
  // as "_StridedShard(dim=0, split_factor=f)" (DTensor's sequential mesh-order semantics).
  std::string to_dtensor() const;
  // JAX PartitionSpec as text: "P(('x', 'y'), None)"; throws when strided or partial.
  std::string to_jax(const std::vector<std::string>& axis_names = {}) const;

  const std::vector<int64_t>& tensor_shape() const { return shape_; }
  const std::vector<int64_t>& mesh_shape() const { return mesh_; }
  const std::vector<Placement>& per_axis() const { return axes_; }  // strides resolved
  const Placement& placement(int axis) const;
  int rank() const { return static_cast<int>(shape_.size()); }
  int mesh_ndim() const { return static_cast<int>(mesh_.size()); }
  bool allow_padding() const { return padding_; }

  // Mesh axes that shard `dim`, major (largest stride) first.
  std::vector<int> axes_of_dim(int dim) const;
  int64_t num_shards(int dim) const;   // product of the shard counts on dim
  int64_t padded_size(int dim) const;  // N' (== N when even)
  bool is_padded() const;              // some dim has N' != N
  bool is_replicated() const;          // no Shard and no Partial
  bool has_partial() const;
  std::vector<int> partial_axes() const;
  int64_t partial_count() const;                  // product of the partial axes' sizes (1 if none)
  std::optional<ReduceKind> reduce_kind() const;  // of the partial axes (all equal), if any
  // True when every sharded dim is in default block nesting (expressible as plain Shard/P spec).
  bool is_block() const;
  int64_t max_local_elements() const;  // ceil-based local element count (the largest device)
  // The same spec with placement of `axis` replaced (result validated).
  ShardingSpec with_axis(int axis, Placement p) const;
  // The value after its reduction: every partial axis replicated (the spec itself when none is).
  ShardingSpec reduced() const;

  bool operator==(const ShardingSpec& o) const {
    return shape_ == o.shape_ && mesh_ == o.mesh_ && axes_ == o.axes_ && padding_ == o.padding_;
  }
  bool operator<(const ShardingSpec& o) const;
  std::size_t hash() const;

 private:
  struct Unchecked {};
  ShardingSpec(Unchecked, std::vector<int64_t> s, std::vector<int64_t> m, std::vector<Placement> p, bool pad)
      : shape_(std::move(s)), mesh_(std::move(m)), axes_(std::move(p)), padding_(pad) {}
  std::vector<int64_t> shape_;
  std::vector<int64_t> mesh_;
  std::vector<Placement> axes_;
  bool padding_ = false;
};

// Every valid spec of `tensor_shape` on `mesh_shape` (each axis: R, P(reduce) if requested, or
// Shard(d, s) for every valid stride s), deterministic order. max_specs guards against blow-up
// (throws weft::Error when exceeded). Rhino's count: [256,256] on a 1-D mesh of 4 gives 16.
struct EnumerateOptions {
  bool strided = true;         // all strides, or block only
  bool partial = true;         // include P(sum)
  bool allow_padding = false;  // uneven dims (block only)
  std::size_t max_specs = 1000000;
};
std::vector<ShardingSpec> enumerate_specs(const std::vector<int64_t>& tensor_shape,
                                          const std::vector<int64_t>& mesh_shape,
                                          const EnumerateOptions& opt = {});

}  // namespace weft::sharding

template <>
struct std::hash<weft::sharding::ShardingSpec> {
  std::size_t operator()(const weft::sharding::ShardingSpec& s) const noexcept { return s.hash(); }
};
