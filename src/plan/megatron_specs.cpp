// Megatron's tensor-parallel roles of a graph's parameters, from its structure (megatron_specs.hpp
// has the rules).
#include "weft/plan/megatron_specs.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <numeric>
#include <optional>
#include <vector>

#include "weft/core/error.hpp"
#include "weft/ir/autodiff.hpp"
#include "weft/pipeline/grouping.hpp"
#include "weft/sharding/sharding_spec.hpp"
#include "weft/spmd/strategy.hpp"

namespace weft::plan {

namespace {

using ir::OpId;
using ir::TensorId;

bool is_param_leaf(const ir::TensorInfo& t) {
  return t.role == ir::Role::Parameter && t.producer == ir::kNoOp;
}
bool is_leaf(const ir::TensorInfo& t) { return t.producer == ir::kNoOp; }

// A forward einsum reading a 2-D Parameter leaf (the weight) and an activation: the weight's dim
// whose factor survives into the result (output features) and the contracted one (input features),
// from the op's index map.
struct WeightMatmul {
  OpId op = ir::kNoOp;
  TensorId weight = -1, x = -1, y = -1;
  int out_dim = -1, in_dim = -1;  // dims of the weight
  int result_dim = -1;            // the dim of y that is exactly the output-feature factor (-1: none)
  std::int64_t out_size = 0, in_size = 0;
};

std::optional<WeightMatmul> weight_matmul(const ir::Graph& g, OpId o) {
  const auto& op = g.op(o);
  if (op.kind != ir::OpKind::Einsum || op.inputs.size() != 2 || op.outputs.size() != 1) return std::nullopt;
  int wi = -1;
  for (int i = 0; i < 2; ++i) {
    const auto& t = g.tensor(op.inputs[static_cast<std::size_t>(i)]);
    if (is_param_leaf(t) && t.rank() == 2) {
      if (wi >= 0) return std::nullopt;  // two weights: not a layer's matmul
      wi = i;
    }
  }
  if (wi < 0 || is_param_leaf(g.tensor(op.inputs[static_cast<std::size_t>(1 - wi)]))) return std::nullopt;
  const auto& m = op.index_map;
  const auto& wdims = m.inputs[static_cast<std::size_t>(wi)];
  const auto& xdims = m.inputs[static_cast<std::size_t>(1 - wi)];
  if (wdims.size() != 2) return std::nullopt;
  auto in_tensor = [](const std::vector<ir::DimFactors>& dims, int f) {
    for (const auto& d : dims)
      if (std::find(d.begin(), d.end(), f) != d.end()) return true;
    return false;
  };
  WeightMatmul w;
  w.op = o;
  w.weight = op.inputs[static_cast<std::size_t>(wi)];
  w.x = op.inputs[static_cast<std::size_t>(1 - wi)];
  w.y = op.outputs[0];
  for (int d = 0; d < 2; ++d) {
    if (wdims[static_cast<std::size_t>(d)].size() != 1) return std::nullopt;
    const int f = wdims[static_cast<std::size_t>(d)][0];
    const auto& fac = m.factors[static_cast<std::size_t>(f)];
    if (fac.kind == ir::FactorKind::Reduction && fac.reduce == ir::ReduceKind::Sum && in_tensor(xdims, f)) {
      if (w.in_dim >= 0) return std::nullopt;
      w.in_dim = d;
    } else if (fac.kind == ir::FactorKind::Parallel && in_tensor(m.outputs[0], f) && !in_tensor(xdims, f)) {
      if (w.out_dim >= 0) return std::nullopt;
      w.out_dim = d;
    }
  }
  if (w.in_dim < 0 || w.out_dim < 0) return std::nullopt;
  const auto& wt = g.tensor(w.weight);
  w.out_size = wt.shape[static_cast<std::size_t>(w.out_dim)];
  w.in_size = wt.shape[static_cast<std::size_t>(w.in_dim)];
  const int f = wdims[static_cast<std::size_t>(w.out_dim)][0];
  for (std::size_t r = 0; r < m.outputs[0].size(); ++r)
    if (m.outputs[0][r] == ir::DimFactors{f}) w.result_dim = static_cast<int>(r);
  return w;
}

enum class Status : std::uint8_t { Candidate, Column, Row };

struct Analysis {
  const ir::Graph& g;
  std::vector<pipeline::OpPhase> phase;
  std::vector<std::vector<OpId>> readers;

  explicit Analysis(const ir::Graph& graph)
      : g(graph), phase(pipeline::classify_ops(graph)), readers(graph.consumer_index()) {}

  std::vector<OpId> forward_readers(TensorId t) const {
    std::vector<OpId> out;
    for (OpId c : readers[static_cast<std::size_t>(t)])
      if (phase[static_cast<std::size_t>(c)] == pipeline::OpPhase::Forward) out.push_back(c);
    return out;
  }
  // The 1-D Parameter added to y as a bias over y's last dim (of size n), if one is.
  std::optional<std::pair<OpId, TensorId>> bias_of(TensorId y, int result_dim, std::int64_t n) const {
    if (result_dim < 0 || result_dim != g.tensor(y).rank() - 1) return std::nullopt;
    for (OpId c : forward_readers(y)) {
      const auto& op = g.op(c);
      if (op.kind != ir::OpKind::Binary || op.attrs.binary != ir::BinaryFn::Add || op.inputs.size() != 2)
        continue;
      const TensorId other = op.inputs[0] == y ? op.inputs[1] : op.inputs[0];
      const auto& b = g.tensor(other);
      if (is_param_leaf(b) && b.rank() == 1 && b.shape[0] == n) return std::make_pair(c, other);
    }
    return std::nullopt;
  }
  // A fused projection: its result (after its bias) cut into k equal parts along the output
  // features — a reshape [..., F] -> [..., k, c, ...] whose k axis is sliced (the zoo's and the
  // torch importer's split), or slices of the dim itself. Returns k (1: not fused).
  std::int64_t fused_parts(const WeightMatmul& w) const {
    const auto& yi = g.tensor(w.y);
    const int r = yi.rank();
    if (w.result_dim != r - 1) return 1;
    TensorId y = w.y;
    if (auto b = bias_of(w.y, w.result_dim, w.out_size)) y = g.op(b->first).outputs[0];
    const std::int64_t F = w.out_size;
    std::vector<std::pair<std::int64_t, std::int64_t>> slices;
    for (OpId c : forward_readers(y)) {
      const auto& op = g.op(c);
      if (op.kind == ir::OpKind::Reshape) {
        const auto& s = g.tensor(op.outputs[0]).shape;
        if (static_cast<int>(s.size()) <= r || !std::equal(s.begin(), s.begin() + (r - 1), yi.shape.begin()))
          continue;
        const std::int64_t k = s[static_cast<std::size_t>(r - 1)];
        const std::int64_t rest =
            std::accumulate(s.begin() + r, s.end(), std::int64_t{1}, std::multiplies<>());
        if (k < 2 || k * rest != F) continue;
        for (OpId sc : forward_readers(op.outputs[0]))
          if (g.op(sc).kind == ir::OpKind::Slice && !g.op(sc).attrs.axes.empty() &&
              g.op(sc).attrs.axes[0] == r - 1)
            return k;
      } else if (op.kind == ir::OpKind::Slice && !op.attrs.axes.empty() &&
                 (op.attrs.axes[0] == r - 1 || op.attrs.axes[0] == -1) && op.attrs.ints.size() >= 2) {
        slices.emplace_back(op.attrs.ints[0], op.attrs.ints[1]);
      }
    }
    if (slices.size() < 2) return 1;
    std::sort(slices.begin(), slices.end());
    const std::int64_t c = slices[0].second - slices[0].first;
    if (c <= 0 || F % c != 0 || static_cast<std::int64_t>(slices.size()) != F / c) return 1;
    for (std::size_t i = 0; i < slices.size(); ++i)
      if (slices[i].first != static_cast<std::int64_t>(i) * c || slices[i].second != slices[i].first + c)
        return 1;
    return F / c;
  }
  // The LM head: y reaches the loss's logits through shape-only ops (reshapes keeping the last
  // dim, element-wise ops with a leaf, dropout), the output features as the classes.
  bool reaches_logits(const WeightMatmul& w) const {
    TensorId t = w.y;
    if (w.result_dim != g.tensor(t).rank() - 1) return false;
    for (int step = 0; step < 16; ++step) {
      const auto rs = forward_readers(t);
      for (OpId c : rs)
        if (g.op(c).kind == ir::OpKind::CrossEntropy && g.op(c).inputs[0] == t)
          return g.tensor(t).shape.back() == w.out_size;
      if (rs.size() != 1) return false;
      const auto& op = g.op(rs[0]);
      if (op.outputs.size() != 1) return false;
      bool shape_only = false;
      switch (op.kind) {
        case ir::OpKind::Reshape: shape_only = g.tensor(op.outputs[0]).shape.back() == w.out_size; break;
        case ir::OpKind::Unary:
        case ir::OpKind::Dropout:
        case ir::OpKind::Cast: shape_only = true; break;
        case ir::OpKind::Binary:
          shape_only = op.inputs.size() == 2 &&
                       is_leaf(g.tensor(op.inputs[0] == t ? op.inputs[1] : op.inputs[0])) &&
                       g.tensor(op.outputs[0]).shape == g.tensor(t).shape;
          break;
        default: break;
      }
      if (!shape_only) return false;
      t = op.outputs[0];
    }
    return false;
  }
};

// A gradient summed from contributions (a tied embedding's, an activation read twice): each
// backward Add of gradients, from the last back, as (sum, term) for every term of the sum's shape,
// so that a spec given to a sum reaches the terms of the sums before it.
template <class Visit>
void for_summed_gradient_terms(const ir::Graph& g, const Analysis& an, Visit&& visit) {
  const auto order = g.topo_order();
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const auto& op = g.op(*it);
    if (an.phase[static_cast<std::size_t>(*it)] != pipeline::OpPhase::Backward ||
        op.kind != ir::OpKind::Binary || op.attrs.binary != ir::BinaryFn::Add || op.outputs.size() != 1)
      continue;
    for (TensorId in : op.inputs) {
      const auto& info = g.tensor(in);
      if (info.role == ir::Role::Gradient && info.producer != ir::kNoOp &&
          info.shape == g.tensor(op.outputs[0]).shape)
        visit(op.outputs[0], in);
    }
  }
}

std::string spec_text(const ir::TensorInfo& t, int dim, std::int64_t stride, int tp) {
  if (dim < 0 || tp <= 1) return "R";
  const auto s = sharding::ShardingSpec::try_make(t.shape, {tp}, {sharding::Placement::shard(dim, stride)});
  return s ? s->to_string() : std::string();
}

std::string partial_text(const ir::TensorInfo& t, int tp) {
  return sharding::ShardingSpec(t.shape, {tp}, {sharding::Placement::partial()}).to_string();
}

}  // namespace

std::string_view megatron_role_name(MegatronRole r) {
  switch (r) {
    case MegatronRole::Column: return "column";
    case MegatronRole::ColumnBias: return "column_bias";
    case MegatronRole::Row: return "row";
    case MegatronRole::RowBias: return "row_bias";
    case MegatronRole::VocabEmbedding: return "vocab_embedding";
    case MegatronRole::VocabHead: return "vocab_head";
    case MegatronRole::VocabHeadBias: return "vocab_head_bias";
    case MegatronRole::Replicated: return "replicated";
  }
  return "replicated";
}

int MegatronSpecs::count(MegatronRole r) const {
  int n = 0;
  for (const auto& [name, p] : params) n += p.role == r ? 1 : 0;
  return n;
}

std::string MegatronSpecs::summary() const {
  if (!recognised) return fmt::format("no Megatron roles recognised ({} parameters)", params.size());
  std::vector<std::string> parts;
  for (MegatronRole r : {MegatronRole::Column, MegatronRole::ColumnBias, MegatronRole::Row,
                         MegatronRole::RowBias, MegatronRole::VocabEmbedding, MegatronRole::VocabHead,
                         MegatronRole::VocabHeadBias, MegatronRole::Replicated})
    if (const int n = count(r)) parts.push_back(fmt::format("{} {}", n, megatron_role_name(r)));
  int kept = 0;
  for (const auto& [name, p] : params) kept += p.note.empty() ? 0 : 1;
  return fmt::format(
      "Megatron roles (t={}): {}{}", t, fmt::join(parts, ", "),
      kept ? fmt::format("; {} kept replicated (t does not divide them)", kept) : std::string());
}

MegatronSpecs megatron_specs(const ir::Graph& g, int t, bool sequence_parallel) {
  WEFT_CHECK(t >= 1, "megatron_specs: t must be >= 1, got {}", t);
  const Analysis an(g);
  MegatronSpecs out;
  out.t = t;
  out.sequence_parallel = sequence_parallel;
  const auto& tensors = g.tensors();

  // 1. The weight matmuls in topological order, each with the weight matmuls its activation
  //    depends on since the last layer norm (the open set of every forward tensor).
  std::vector<WeightMatmul> mms;
  std::vector<Status> status;
  std::vector<std::vector<int>> upstream;
  std::vector<std::vector<int>> open(tensors.size());
  for (OpId o : g.topo_order()) {
    if (an.phase[static_cast<std::size_t>(o)] != pipeline::OpPhase::Forward) continue;
    const auto& op = g.op(o);
    if (auto w = weight_matmul(g, o)) {
      const int idx = static_cast<int>(mms.size());
      const std::vector<int>& U = open[static_cast<std::size_t>(w->x)];
      const bool row = !U.empty() && std::all_of(U.begin(), U.end(), [&](int u) {
        return status[static_cast<std::size_t>(u)] != Status::Row;
      });
      if (row)
        for (int u : U) status[static_cast<std::size_t>(u)] = Status::Column;
      status.push_back(row ? Status::Row : Status::Candidate);
      upstream.push_back(row ? U : std::vector<int>{});
      open[static_cast<std::size_t>(w->y)] = {idx};
      mms.push_back(*w);
      continue;
    }
    if (op.kind == ir::OpKind::LayerNorm) continue;  // a norm cuts the chain: its results stay empty
    std::vector<int> u;
    for (TensorId in : op.inputs) {
      const auto& s = open[static_cast<std::size_t>(in)];
      std::vector<int> merged;
      std::set_union(u.begin(), u.end(), s.begin(), s.end(), std::back_inserter(merged));
      u = std::move(merged);
    }
    for (TensorId r : op.outputs) open[static_cast<std::size_t>(r)] = u;
  }
  const int n = static_cast<int>(mms.size());

  // 2. Splits per matmul: columns part by part when fused; a group (a row and its columns) whose
  //    dims t does not divide stays replicated, to a fixpoint (a column of a dropped row, a row
  //    of a dropped column).
  std::vector<std::int64_t> parts(static_cast<std::size_t>(n), 1);
  std::vector<char> split(static_cast<std::size_t>(n), 0);
  for (int i = 0; i < n; ++i) {
    const auto& w = mms[static_cast<std::size_t>(i)];
    if (status[static_cast<std::size_t>(i)] == Status::Column) {
      parts[static_cast<std::size_t>(i)] = an.fused_parts(w);
      split[static_cast<std::size_t>(i)] = (w.out_size / parts[static_cast<std::size_t>(i)]) % t == 0;
    } else if (status[static_cast<std::size_t>(i)] == Status::Row) {
      split[static_cast<std::size_t>(i)] = w.in_size % t == 0;
    }
  }
  for (bool changed = true; changed;) {
    changed = false;
    for (int i = 0; i < n; ++i) {
      if (status[static_cast<std::size_t>(i)] != Status::Row || !split[static_cast<std::size_t>(i)]) continue;
      for (int u : upstream[static_cast<std::size_t>(i)])
        if (!split[static_cast<std::size_t>(u)]) split[static_cast<std::size_t>(i)] = 0, changed = true;
    }
    for (int i = 0; i < n; ++i) {
      if (status[static_cast<std::size_t>(i)] != Status::Column || !split[static_cast<std::size_t>(i)])
        continue;
      bool partner = false;
      for (int r = 0; r < n; ++r)
        if (status[static_cast<std::size_t>(r)] == Status::Row && split[static_cast<std::size_t>(r)]) {
          const auto& U = upstream[static_cast<std::size_t>(r)];
          partner = partner || std::find(U.begin(), U.end(), i) != U.end();
        }
      if (!partner) split[static_cast<std::size_t>(i)] = 0, changed = true;
    }
  }

  // 3. Proposals per parameter: (role, dim, stride, split?). A parameter read in two roles that
  //    disagree on the split stays replicated.
  struct Proposal {
    MegatronRole role;
    int dim;
    std::int64_t stride;
    bool ok;
    std::string why;
  };
  std::map<TensorId, std::vector<Proposal>> proposals;
  const std::string indivisible = fmt::format("t={} does not divide the split dim", t);
  // The token embedding: the largest table an embedding op reads (position and token-type tables
  // are smaller and stay replicated, as Megatron keeps them).
  TensorId table = -1;
  for (OpId o = 0; o < static_cast<OpId>(g.ops().size()); ++o) {
    const auto& op = g.op(o);
    if (an.phase[static_cast<std::size_t>(o)] != pipeline::OpPhase::Forward ||
        op.kind != ir::OpKind::Embedding)
      continue;
    const auto& tb = g.tensor(op.inputs[0]);
    if (is_param_leaf(tb) && tb.rank() == 2 && (table < 0 || tb.shape[0] > g.tensor(table).shape[0]))
      table = op.inputs[0];
  }
  if (table >= 0) {
    const bool ok = g.tensor(table).shape[0] % t == 0;
    proposals[table].push_back({MegatronRole::VocabEmbedding, 0, 0, ok, ok ? "" : indivisible});
  }
  for (int i = 0; i < n; ++i) {
    const auto& w = mms[static_cast<std::size_t>(i)];
    const Status st = status[static_cast<std::size_t>(i)];
    const bool ok = split[static_cast<std::size_t>(i)] != 0;
    std::optional<MegatronRole> bias_role;
    int bias_dim = 0;
    std::int64_t stride = 0;
    if (st == Status::Column) {
      const std::int64_t k = parts[static_cast<std::size_t>(i)];
      stride = k > 1 && ok ? w.out_size / k / t : 0;
      proposals[w.weight].push_back({MegatronRole::Column, w.out_dim, stride, ok, ok ? "" : indivisible});
      bias_role = MegatronRole::ColumnBias;
    } else if (st == Status::Row) {
      proposals[w.weight].push_back({MegatronRole::Row, w.in_dim, 0, ok, ok ? "" : indivisible});
      bias_role = MegatronRole::RowBias;
      bias_dim = -1;
    } else if (an.reaches_logits(w)) {
      const bool v = w.out_size % t == 0;
      proposals[w.weight].push_back({MegatronRole::VocabHead, w.out_dim, 0, v, v ? "" : indivisible});
      bias_role = MegatronRole::VocabHeadBias;
      if (!v) bias_dim = -1;
    }
    if (!bias_role) continue;
    if (auto b = an.bias_of(w.y, w.result_dim, w.out_size)) {
      const bool split_bias = bias_dim == 0 && (st != Status::Column || ok);
      proposals[b->second].push_back({*bias_role, split_bias ? 0 : -1, split_bias ? stride : 0, true, ""});
    }
  }

  // 4. Per parameter: its role and spec.
  for (TensorId tid = 0; tid < static_cast<TensorId>(tensors.size()); ++tid) {
    const auto& info = tensors[static_cast<std::size_t>(tid)];
    if (!is_param_leaf(info)) continue;
    MegatronParam p;
    auto it = proposals.find(tid);
    if (it != proposals.end()) {
      const auto& ps = it->second;
      const Proposal& first = ps.front();
      p.role = first.role;
      bool agree = true;
      for (const auto& q : ps)
        agree = agree && q.dim == first.dim && q.stride == first.stride && q.ok == first.ok;
      // A tied embedding read as the LM head too: the embedding's role names it.
      for (const auto& q : ps)
        if (q.role == MegatronRole::VocabEmbedding) p.role = q.role;
      if (!agree) {
        p.note = "read in Megatron roles that split it differently";
      } else if (!first.ok) {
        p.note = first.why;
      } else if (first.dim >= 0) {
        p.dim = first.dim;
        p.stride = first.stride;
        p.spec = spec_text(info, p.dim, p.stride, t);
        if (p.spec.empty()) {  // not a valid spec on t devices
          p.spec = "R";
          p.dim = -1;
          p.stride = 0;
          p.note = indivisible;
        }
      }
      if (p.role != MegatronRole::Replicated && p.role != MegatronRole::ColumnBias &&
          p.role != MegatronRole::RowBias && p.role != MegatronRole::VocabHeadBias)
        out.recognised = true;
    }
    if (t <= 1) p.spec = "R";
    out.params.emplace(info.name, std::move(p));
  }

  // 5. The results of the split matmuls and of the vocabulary-parallel embedding.
  if (t > 1) {
    for (int i = 0; i < n; ++i) {
      const auto& w = mms[static_cast<std::size_t>(i)];
      const auto& p = out.params.at(g.tensor(w.weight).name);
      if (p.dim < 0 || w.result_dim < 0) continue;
      const auto& y = g.tensor(w.y);
      std::string spec;
      if (p.dim == w.in_dim)
        spec = partial_text(y, t);  // row-parallel: partial sums
      else if (p.dim == w.out_dim)
        spec = spec_text(y, w.result_dim, p.stride, t);  // column-parallel or the LM head
      if (!spec.empty()) out.results.emplace(y.name, spec);
    }
    for (OpId o = 0; o < static_cast<OpId>(g.ops().size()); ++o) {
      const auto& op = g.op(o);
      if (an.phase[static_cast<std::size_t>(o)] != pipeline::OpPhase::Forward ||
          op.kind != ir::OpKind::Embedding || op.inputs[0] != table ||
          out.params.at(g.tensor(table).name).dim != 0)
        continue;
      out.results.emplace(g.tensor(op.outputs[0]).name, partial_text(g.tensor(op.outputs[0]), t));
    }
  }

  // 6. The activations between a split column and its row: the column's split carried forward op
  //    by op (an op reading split operands takes its first strategy that reads them as they are,
  //    its parameters at their specs and anything else replicated), then their gradients.
  if (t > 1) {
    std::vector<char> inside(tensors.size(), 0);
    for (std::size_t x = 0; x < tensors.size(); ++x)
      for (int u : open[x])
        if (status[static_cast<std::size_t>(u)] == Status::Column && split[static_cast<std::size_t>(u)])
          inside[x] = 1;
    const std::vector<std::int64_t> mesh{t};
    std::map<TensorId, sharding::ShardingSpec> known;
    for (int i = 0; i < n; ++i) {
      const auto& w = mms[static_cast<std::size_t>(i)];
      auto it = out.results.find(g.tensor(w.y).name);
      if (status[static_cast<std::size_t>(i)] == Status::Column && it != out.results.end())
        known.emplace(w.y, sharding::ShardingSpec::parse(it->second, g.tensor(w.y).shape, mesh));
    }
    auto wanted = [&](TensorId in) -> std::optional<sharding::ShardingSpec> {
      if (auto k = known.find(in); k != known.end()) return k->second;
      const auto& info = g.tensor(in);
      if (is_param_leaf(info))
        return sharding::ShardingSpec::parse(out.params.at(info.name).spec, info.shape, mesh);
      return sharding::ShardingSpec::replicated(info.shape, mesh);
    };
    for (OpId o : g.topo_order()) {
      const auto& op = g.op(o);
      if (an.phase[static_cast<std::size_t>(o)] != pipeline::OpPhase::Forward || weight_matmul(g, o))
        continue;
      bool reads_split = false, makes_inside = false;
      for (TensorId in : op.inputs) reads_split = reads_split || known.count(in);
      for (TensorId r : op.outputs) makes_inside = makes_inside || inside[static_cast<std::size_t>(r)];
      if (!reads_split || !makes_inside) continue;
      std::vector<sharding::ShardingSpec> want;
      for (TensorId in : op.inputs) want.push_back(*wanted(in));
      auto matches = [&](const spmd::OpStrategy& st) {
        for (std::size_t i = 0; i < want.size(); ++i)
          if (!(st.inputs[i] == want[i])) return false;
        return true;
      };
      std::optional<spmd::OpStrategy> pick;
      for (const auto& st : spmd::enumerate_strategies(g, op, mesh)) {
        if (matches(st)) {
          pick = st;
          break;
        }
        // a strided operand (a fused projection's parts): the same split with its inner stride
        for (std::size_t i = 0; i < want.size() && !pick; ++i)
          if (!want[i].is_block())
            if (auto v = spmd::restride_to(g, op, mesh, st, false, static_cast<int>(i), want[i]);
                v && matches(*v))
              pick = v;
        if (pick) break;
      }
      if (!pick) continue;  // the split stops here: the search decides the rest
      for (std::size_t k = 0; k < op.outputs.size(); ++k) {
        const auto& spec = pick->outputs[k];
        if (!inside[static_cast<std::size_t>(op.outputs[k])] || spec.has_partial() || spec.is_replicated())
          continue;
        known.emplace(op.outputs[k], spec);
      }
    }
    for (const auto& [x, spec] : known)
      out.results.emplace(tensors[static_cast<std::size_t>(x)].name, spec.to_string());
    // The boundaries: split (not partial) results, their gradients, split parameters' gradients.
    std::map<TensorId, std::string> split_at;
    for (TensorId x = 0; x < static_cast<TensorId>(tensors.size()); ++x) {
      const auto& info = tensors[static_cast<std::size_t>(x)];
      if (auto it = out.results.find(info.name);
          it != out.results.end() && it->second.find("P(") == std::string::npos)
        split_at.emplace(x, it->second);
      else if (is_param_leaf(info) && out.params.at(info.name).dim >= 0)
        split_at.emplace(x, out.params.at(info.name).spec);
    }
    for (TensorId x = 0; x < static_cast<TensorId>(tensors.size()); ++x) {
      const auto& info = tensors[static_cast<std::size_t>(x)];
      auto it = split_at.find(x);
      if (it != split_at.end() && !is_param_leaf(info)) {
        out.boundaries.emplace(info.name, it->second);
        continue;
      }
      const auto of = g.grad_of(x);
      if (!of || info.producer == ir::kNoOp || info.role != ir::Role::Gradient ||
          info.shape != tensors[static_cast<std::size_t>(*of)].shape)
        continue;
      if (auto jt = split_at.find(*of); jt != split_at.end()) out.boundaries.emplace(info.name, jt->second);
    }
    // A gradient summed from contributions (a tied embedding's, an activation read twice): its
    // terms carry its split too.
    for_summed_gradient_terms(g, an, [&](TensorId sum, TensorId term) {
      if (auto b = out.boundaries.find(g.tensor(sum).name); b != out.boundaries.end())
        out.boundaries.emplace(g.tensor(term).name, std::string(b->second));
    });
  }

  // 7. Sequence parallelism (Korthikanti et al., MLSys 2023): the residual stream from a partial
  //    result (a row-parallel matmul's, the vocabulary-parallel embedding's) up to the next weight
  //    matmul — bias adds, dropout, residual adds, layer norms, element-wise ops — split along its
  //    token dim (the one before the hidden dim of a rank >= 3 activation) over the t devices. The
  //    search then resolves each partial sum by a reduce-scatter instead of an all-reduce, and a
  //    column-parallel matmul all-gathers its input; what the region saves for the backward is 1/t.
  if (t > 1 && sequence_parallel) {
    std::vector<char> region(tensors.size(), 0);
    for (TensorId x = 0; x < static_cast<TensorId>(tensors.size()); ++x)
      if (auto it = out.results.find(tensors[static_cast<std::size_t>(x)].name);
          it != out.results.end() && it->second.find("P(") != std::string::npos &&
          tensors[static_cast<std::size_t>(x)].rank() >= 3)
        region[static_cast<std::size_t>(x)] = 1;  // a seed: resolved into the region, not itself split
    for (OpId o : g.topo_order()) {
      const auto& op = g.op(o);
      if (an.phase[static_cast<std::size_t>(o)] != pipeline::OpPhase::Forward || weight_matmul(g, o) ||
          op.outputs.size() != 1)
        continue;
      if (op.kind != ir::OpKind::Unary && op.kind != ir::OpKind::Binary && op.kind != ir::OpKind::Dropout &&
          op.kind != ir::OpKind::LayerNorm)
        continue;
      const TensorId y = op.outputs[0];
      const auto& info = tensors[static_cast<std::size_t>(y)];
      bool reads_region = false;
      for (TensorId in : op.inputs)
        reads_region = reads_region || (region[static_cast<std::size_t>(in)] &&
                                        tensors[static_cast<std::size_t>(in)].shape == info.shape);
      const int dim = info.rank() - 2;
      if (!reads_region || info.rank() < 3 || info.shape[static_cast<std::size_t>(dim)] % t != 0 ||
          out.results.count(info.name))
        continue;
      region[static_cast<std::size_t>(y)] = 1;
      const std::string spec = spec_text(info, dim, 0, t);
      out.sequence.emplace(info.name, spec);
      out.results.emplace(info.name, spec);
      out.boundaries.emplace(info.name, spec);
    }
    // Their gradients keep the split (the backward's partial input gradients of the column
    // matmuls reduce-scattered, as Megatron's backward does, not all-reduced), the terms of a
    // gradient summed from several readers too.
    std::map<TensorId, std::string> grad_spec;
    for (TensorId x = 0; x < static_cast<TensorId>(tensors.size()); ++x) {
      const auto& info = tensors[static_cast<std::size_t>(x)];
      const auto of = g.grad_of(x);
      if (!of || info.producer == ir::kNoOp || info.role != ir::Role::Gradient) continue;
      auto it = out.sequence.find(tensors[static_cast<std::size_t>(*of)].name);
      if (it != out.sequence.end() && info.shape == tensors[static_cast<std::size_t>(*of)].shape)
        grad_spec.emplace(x, it->second);
    }
    // A matmul's input gradient stays free: it is made as partial sums (the column's weight split
    // contracted) and reduce-scattered on the way to its reader; fixed split along the tokens, the
    // matmul would have to gather its weight to make it.
    auto from_matmul = [&](TensorId x) {
      const auto p = tensors[static_cast<std::size_t>(x)].producer;
      return p != ir::kNoOp && g.op(p).kind == ir::OpKind::Einsum;
    };
    for_summed_gradient_terms(g, an, [&](TensorId sum, TensorId term) {
      if (auto it = grad_spec.find(sum); it != grad_spec.end())
        grad_spec.emplace(term, std::string(it->second));
    });
    for (const auto& [x, spec] : grad_spec) {
      if (from_matmul(x)) continue;
      const auto& name = tensors[static_cast<std::size_t>(x)].name;
      out.sequence.emplace(name, spec);
      out.results.emplace(name, spec);
      out.boundaries.emplace(name, spec);
    }
    // The backward mirrors the forward as Megatron's does: a partial result's gradient is the
    // all-gathered (replicated) one its matmul's backward reads, and the gradients of the
    // activations between a column and its row keep the column's split (a search left free
    // would split them along the tokens too and pay all-to-alls and weight all-gathers).
    for (TensorId x = 0; x < static_cast<TensorId>(tensors.size()); ++x) {
      const auto& info = tensors[static_cast<std::size_t>(x)];
      const auto of = g.grad_of(x);
      if (!of || info.producer == ir::kNoOp || info.role != ir::Role::Gradient ||
          info.shape != tensors[static_cast<std::size_t>(*of)].shape || out.results.count(info.name))
        continue;
      const auto& fwd = tensors[static_cast<std::size_t>(*of)];
      if (region[static_cast<std::size_t>(*of)] && !out.sequence.count(fwd.name))
        out.results.emplace(info.name, "R");  // a seed's gradient
      else if (auto b = out.boundaries.find(info.name); b != out.boundaries.end() && !is_param_leaf(fwd))
        out.results.emplace(info.name, b->second);
    }
  }

  // 8. The fixed specs: the parameters, the optimizer states kept beside them (an update op's state
  //    leaves of the parameter's shape), the gradients the updates read, the results above.
  for (const auto& [name, p] : out.params) out.fixed.emplace(name, p.spec);
  for (const auto& op : g.ops()) {
    if (op.kind != ir::OpKind::AdamUpdate && op.kind != ir::OpKind::SgdUpdate) continue;
    const auto& param = g.tensor(op.inputs[0]);
    auto it = out.params.find(param.name);
    if (!is_param_leaf(param) || it == out.params.end()) continue;
    for (std::size_t i = 1; i < op.inputs.size(); ++i) {
      const auto& s = g.tensor(op.inputs[i]);
      if (ir::is_state_leaf(s) && s.shape == param.shape) out.fixed.emplace(s.name, it->second.spec);
    }
    const auto& grad = g.tensor(op.inputs[1]);
    if (t > 1 && it->second.dim >= 0 && grad.producer != ir::kNoOp && grad.shape == param.shape)
      out.results.emplace(grad.name, it->second.spec);
  }
  for (const auto& [name, spec] : out.results) out.fixed.emplace(name, spec);
  return out;
}

}  // namespace weft::plan
