// The tiles, rank graphs and per-instruction numbers of a lowered program (program_layout.hpp).
#include "weft/exec/program_layout.hpp"

#include <algorithm>
#include <numeric>

#include "row_major.hpp"
#include "weft/core/error.hpp"
#include "weft/pipeline/hetero.hpp"
#include "weft/plan/rebatch.hpp"
#include "weft/sharding/tile.hpp"

namespace weft::exec {

using detail::strides_of;

TileIndex make_tile(const sharding::ShardingSpec& spec, const std::vector<std::int64_t>& coord,
                    const std::vector<double>& fraction) {
  auto tile = sharding::tile_of(spec, coord);
  TileIndex t;
  t.local_shape = tile.local_shape();
  t.partial_index = tile.partial_index;
  t.partial_count = tile.partial_count;
  std::vector<int> uneven_dim(static_cast<std::size_t>(spec.rank()), 0);
  if (!fraction.empty())
    for (const auto& p : spec.per_axis())
      if (p.kind == sharding::Placement::Shard) {
        WEFT_CHECK(spec.mesh_ndim() == 1 && spec.is_block(),
                   "an uneven split needs block shards on a 1-D mesh, the spec is {}", spec.to_string());
        uneven_dim[static_cast<std::size_t>(p.dim)] = 1;
      }
  for (int d = 0; d < spec.rank(); ++d) {
    if (uneven_dim[static_cast<std::size_t>(d)]) {
      const auto pieces =
          pipeline::proportional_pieces(spec.tensor_shape()[static_cast<std::size_t>(d)], fraction);
      std::int64_t begin = 0;
      for (std::int64_t q = 0; q < coord.at(0); ++q) begin += pieces[static_cast<std::size_t>(q)];
      std::vector<std::int64_t> idx(static_cast<std::size_t>(pieces[static_cast<std::size_t>(coord[0])]));
      std::iota(idx.begin(), idx.end(), begin);
      t.local_shape[static_cast<std::size_t>(d)] = static_cast<std::int64_t>(idx.size());
      t.global.push_back(std::move(idx));
    } else {
      t.global.push_back(tile.indices(d));
    }
    std::vector<std::int64_t> loc(static_cast<std::size_t>(spec.tensor_shape()[static_cast<std::size_t>(d)]),
                                  -1);
    for (std::size_t i = 0; i < t.global.back().size(); ++i)
      loc[static_cast<std::size_t>(t.global.back()[i])] = static_cast<std::int64_t>(i);
    t.local.push_back(std::move(loc));
  }
  t.strides = strides_of(t.local_shape);
  return t;
}

ProgramLayout::ProgramLayout(const lower::Program& p) : p_(p) {
  const int nr = p.num_ranks();
  for (const auto& b : p.buffers) {
    WEFT_CHECK(b.stage >= 0 && b.stage < static_cast<int>(p.stages.size()),
               "buffer '{}' lives on stage {}, the program has {} stages", b.name, b.stage, p.stages.size());
    const auto& mesh = p.stages[static_cast<std::size_t>(b.stage)].shape;
    specs_.push_back(sharding::ShardingSpec::parse(b.spec, b.shape, mesh));
  }
  // Uneven data parallelism: each replica runs the program's graph at its own share.
  rank_graph_.assign(static_cast<std::size_t>(nr), &p.graph);
  share_.assign(static_cast<std::size_t>(nr), 0);
  for (int r = 0; r < nr; ++r) {
    const auto& rp = p.ranks[static_cast<std::size_t>(r)];
    const auto& st = p.stages.at(static_cast<std::size_t>(rp.stage));
    if (st.replica_microbatch.empty()) continue;
    const std::int64_t replica = st.replicas > 1 ? rp.coord.at(0) : 0;
    WEFT_CHECK(replica < static_cast<std::int64_t>(st.replica_microbatch.size()),
               "stage {} has {} replica shares, rank {} is replica {}", rp.stage,
               st.replica_microbatch.size(), r, replica);
    const std::int64_t b = st.replica_microbatch[static_cast<std::size_t>(replica)];
    share_[static_cast<std::size_t>(r)] = b;
    if (b == st.microbatch_size) continue;
    auto it = graphs_.find(b);
    if (it == graphs_.end()) it = graphs_.emplace(b, plan::rebatch(p.graph, b)).first;
    rank_graph_[static_cast<std::size_t>(r)] = &it->second;
  }
  tiles_.resize(p.buffers.size());
  for (auto& per : tiles_) per.resize(static_cast<std::size_t>(nr));
}

const TileIndex& ProgramLayout::tile(int b, int r) const {
  WEFT_CHECK(b >= 0 && b < static_cast<int>(p_.buffers.size()) && r >= 0 && r < p_.num_ranks(),
             "tile: buffer {} of {} / rank {} of {} out of range", b, p_.buffers.size(), r, p_.num_ranks());
  const auto& buf = p_.buffers[static_cast<std::size_t>(b)];
  const auto& rp = p_.ranks[static_cast<std::size_t>(r)];
  WEFT_CHECK(rp.stage == buf.stage, "buffer '{}' lives on stage {}, not on rank {}'s", buf.name, buf.stage,
             r);
  std::lock_guard lock(mu_);
  auto& slot = tiles_[static_cast<std::size_t>(b)][static_cast<std::size_t>(r)];
  if (slot) return *slot;
  // A replica with its own graph holds the buffer's spec over its own shape.
  const ir::Graph& g = graph_of(r);
  const auto& st = p_.stages[static_cast<std::size_t>(rp.stage)];
  ir::Shape shape = buf.shape;
  if (buf.tensor >= 0)
    shape = g.tensor(buf.tensor).shape;
  else if (&g != &p_.graph && !shape.empty() && shape[0] == st.microbatch_size)  // per-sample statistics
    shape[0] = share(r);
  slot = std::make_unique<TileIndex>(make_tile(shape == buf.shape
                                                   ? specs_[static_cast<std::size_t>(b)]
                                                   : sharding::ShardingSpec::parse(buf.spec, shape, st.shape),
                                               rp.coord, st.split_fraction));
  return *slot;
}

std::int64_t ProgramLayout::samples_per_microbatch(const lower::StageMesh& st) {
  std::int64_t n = 0;
  for (auto b : st.replica_microbatch) n += b;
  return st.replica_microbatch.empty() ? st.microbatch_size * st.replicas : n;
}

std::int64_t ProgramLayout::global_batch() const {
  const auto& st = p_.stages.front();
  return samples_per_microbatch(st) * st.microbatches;
}

std::vector<std::int64_t> ProgramLayout::rows_read(int r) const {
  WEFT_CHECK(r >= 0 && r < p_.num_ranks(), "rows_read: rank {} of {}", r, p_.num_ranks());
  const std::int64_t batch = global_batch();
  std::vector<char> read(static_cast<std::size_t>(std::max<std::int64_t>(batch, 0)), 0);
  const auto& rp = p_.ranks[static_cast<std::size_t>(r)];
  for (const auto& i : rp.instrs()) {
    if (i.kind != lower::InstrKind::LoadInput || !rp.runs(i)) continue;
    const int b = i.out.at(0);
    const auto& t = tile(b, r);
    const auto shape = global_input_shape(p_.buffers[static_cast<std::size_t>(b)].tensor);
    if (t.global.empty() || shape.empty() || shape[0] != batch) {  // not per sample: every row
      std::fill(read.begin(), read.end(), 1);
      break;
    }
    const std::int64_t off = load_offset(r, i);
    for (std::int64_t g : t.global[0]) {
      WEFT_CHECK(g + off >= 0 && g + off < batch, "rank {} loads sample {} of a batch of {}", r, g + off,
                 batch);
      read[static_cast<std::size_t>(g + off)] = 1;
    }
  }
  std::vector<std::int64_t> rows;
  for (std::int64_t k = 0; k < batch; ++k)
    if (read[static_cast<std::size_t>(k)]) rows.push_back(k);
  return rows;
}

ir::Shape ProgramLayout::global_input_shape(ir::TensorId t) const {
  ir::Shape s = p_.graph.tensor(t).shape;
  const auto& st = p_.stages.front();
  if (!s.empty() && st.microbatch_size > 0 && s[0] == st.microbatch_size)
    s[0] = samples_per_microbatch(st) * st.microbatches;
  return s;
}

ir::KernelContext ProgramLayout::kernel_context(int r, const lower::Instr& i, int step) const {
  const ir::Graph& graph = graph_of(r);
  const ir::Op& op = graph.op(i.op);
  ir::KernelContext ctx;
  for (int b : i.out) ctx.out_shapes.push_back(tile(b, r).local_shape);
  ctx.step = step;
  auto global_shape = [&](ir::TensorId t) -> const ir::Shape& { return graph.tensor(t).shape; };
  switch (op.kind) {
    case ir::OpKind::Reduce: {
      double n = 1;
      const auto& s = global_shape(op.inputs[0]);
      for (int a : op.attrs.axes)
        n *= static_cast<double>(s[static_cast<std::size_t>(a < 0 ? a + static_cast<int>(s.size()) : a)]);
      ctx.mean_count = n;
      break;
    }
    case ir::OpKind::Embedding:
      ctx.vocab_index = tile(i.in[0], r).global[0];
      ctx.vocab_size = global_shape(op.inputs[0])[0];
      break;
    case ir::OpKind::EmbeddingGrad:
      ctx.vocab_index = tile(i.out[0], r).global[0];
      ctx.vocab_size = global_shape(op.outputs[0])[0];
      break;
    case ir::OpKind::CrossEntropy:
    case ir::OpKind::CrossEntropyGrad: {
      const auto& lg = global_shape(op.inputs[0]);
      ctx.vocab_index = tile(i.in[0], r).global.back();
      ctx.vocab_size = lg.back();
      double n = 1;
      for (std::size_t d = 0; d + 1 < lg.size(); ++d) n *= static_cast<double>(lg[d]);
      ctx.tokens = n;
      break;
    }
    case ir::OpKind::Dropout: {
      const auto& t = tile(i.out[0], r);
      ctx.element_index = t.global;
      ctx.element_shape = global_shape(op.outputs[0]);
      if (op.attrs.axes == std::vector<int>{0} && i.microbatch >= 0) {
        const std::int64_t off = sample_offset(r, i.microbatch);
        for (auto& s : ctx.element_index[0]) s += off;
      }
      break;
    }
    case ir::OpKind::Attention:
    case ir::OpKind::AttentionGrad:
      // A causal mask compares global positions: a split query sequence starts past 0.
      if (op.attrs.ints.at(0) != 0) ctx.element_index = tile(i.out[0], r).global;
      break;
    default: break;
  }
  return ctx;
}

std::int64_t ProgramLayout::sample_offset(int r, int microbatch) const {
  const auto& rp = p_.ranks[static_cast<std::size_t>(r)];
  const auto& st = p_.stages[static_cast<std::size_t>(rp.stage)];
  const std::int64_t replica = st.replicas > 1 ? rp.coord.at(0) : 0;
  std::int64_t before = replica * st.microbatch_size;  // samples of this micro-batch's earlier replicas
  if (!st.replica_microbatch.empty()) {
    before = 0;
    for (std::int64_t q = 0; q < replica; ++q) before += st.replica_microbatch[static_cast<std::size_t>(q)];
  }
  return static_cast<std::int64_t>(microbatch) * samples_per_microbatch(st) + before;
}

std::int64_t ProgramLayout::load_offset(int r, const lower::Instr& i) const {
  const auto& st = p_.stages[static_cast<std::size_t>(p_.ranks[static_cast<std::size_t>(r)].stage)];
  const auto& info = p_.graph.tensor(p_.buffers.at(static_cast<std::size_t>(i.out.at(0))).tensor);
  return info.rank() >= 1 && info.shape[0] == st.microbatch_size ? sample_offset(r, i.microbatch) : 0;
}

double ProgramLayout::scale_factor(int r, const lower::Instr& i) const {
  double f = i.scale;
  if (i.by_share) {  // this replica's share of the samples
    const auto& st = p_.stages[static_cast<std::size_t>(p_.ranks[static_cast<std::size_t>(r)].stage)];
    WEFT_CHECK(!st.replica_microbatch.empty(), "a scale by share on a stage without replica shares");
    f *= static_cast<double>(share(r)) / static_cast<double>(samples_per_microbatch(st));
  }
  return f;
}

bool ProgramLayout::contributes(int r, const lower::Instr& i) const {
  bool contribute = true;
  for (int a : i.axes)
    contribute =
        contribute && p_.ranks[static_cast<std::size_t>(r)].coord.at(static_cast<std::size_t>(a)) == 0;
  return contribute;
}

}  // namespace weft::exec
