// lower::verify: the Program as a contract between planning and running (program.hpp,
// docs/modules/lower.md "Verification"). Every check is on the program as it is (a JSON from
// anywhere), never on how it was made.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "simulate.hpp"
#include "weft/core/dtype.hpp"
#include "weft/core/error.hpp"
#include "weft/ir/autodiff.hpp"
#include "weft/ir/kernels.hpp"
#include "weft/lower/lower.hpp"
#include "weft/lower/program.hpp"
#include "weft/pipeline/grouping.hpp"
#include "weft/plan/rebatch.hpp"
#include "weft/sharding/sharding_spec.hpp"
#include "weft/spmd/strategy.hpp"

namespace weft::lower {

namespace {

using sharding::Placement;
using sharding::ReduceKind;
using sharding::ShardingSpec;

constexpr std::int64_t kMaxElements = std::int64_t{1} << 48;  // per buffer (far above any device)

std::string placement_text(const ShardingSpec& s, int axis) {
  return s.placement(axis).to_string();
}

ReduceOp reduce_op_of(ReduceKind k) { return k == ReduceKind::Max ? ReduceOp::Max : ReduceOp::Sum; }
const char* reduce_name(ReduceOp r) { return r == ReduceOp::Sum ? "sum" : "max"; }

class Verifier {
 public:
  explicit Verifier(const Program& p) : p_(p), g_(p.graph) {}

  void run() {
    fingerprint();
    graph();
    stages();
    buffers();
    for (auto [out, leaf] : ir::updated_states(g_)) state_leaf_[out] = leaf;
    instructions();
    buckets();
    results();
    hazards();
  }

 private:
  const Program& p_;
  const ir::Graph& g_;
  std::vector<ShardingSpec> specs_;          // per buffer, parsed on its stage mesh
  std::vector<ShardingSpec> norm_;           // the same with every axis of size 1 replicated
  std::map<ir::TensorId, ir::TensorId> state_leaf_;  // updated state -> its leaf
  std::vector<char> written_;                // per buffer: some instruction writes it
  std::map<int, std::string> freed_;         // buffer -> an instruction that frees it
  std::map<std::tuple<ir::OpId, int, std::vector<std::string>>, bool> strategy_ok_;
  std::map<std::pair<ir::OpId, int>, std::vector<spmd::OpStrategy>> strategies_;
  std::vector<char> gradient_sums_;  // per op: a gradient sum deferred into the update (computed once needed)

  int nb() const { return static_cast<int>(p_.buffers.size()); }
  const Buffer& buf(int b) const { return p_.buffers[static_cast<std::size_t>(b)]; }
  const StageMesh& stage(int s) const { return p_.stages[static_cast<std::size_t>(s)]; }

  void fingerprint() {
    if (p_.graph_fingerprint.empty()) return;
    const std::string fp = ir::graph_fingerprint(g_);
    WEFT_CHECK(fp == p_.graph_fingerprint,
               "program: its graph '{}' has fingerprint {}, the program was lowered for a graph with "
               "fingerprint {} (the graph was replaced or changed: re-plan and lower for this graph)",
               g_.name(), fp, p_.graph_fingerprint);
  }

  void graph() {
    try {
      g_.validate();
    } catch (const Error& e) {
      fail("program: its graph is not valid: {}", e.what());
    }
  }

  void stages() {
    const int nr = p_.num_ranks();
    WEFT_CHECK(nr >= 1, "program: it has no ranks");
    WEFT_CHECK(!p_.stages.empty(), "program: it has no stages");
    std::int64_t batch = -1;
    try {
      batch = plan::batch_size(g_);
    } catch (const Error&) {  // no Input of rank >= 1: nothing to compare the micro-batch size with
    }
    std::vector<int> stage_of(static_cast<std::size_t>(nr), -1);
    for (int s = 0; s < static_cast<int>(p_.stages.size()); ++s) {
      const auto& st = stage(s);
      WEFT_CHECK(!st.shape.empty(), "program: stage {} has an empty mesh shape", s);
      std::int64_t n = 1;
      for (auto d : st.shape) {
        WEFT_CHECK(d >= 1 && d <= nr, "program: stage {}'s mesh {} has an axis of size {}", s, st.shape, d);
        n *= d;
        WEFT_CHECK(n <= nr, "program: stage {}'s mesh {} has more positions than the program's {} ranks", s,
                   st.shape, nr);
      }
      WEFT_CHECK(n == static_cast<std::int64_t>(st.ranks.size()),
                 "program: stage {}'s mesh {} has {} positions, its rank list {}", s, st.shape, n, st.ranks.size());
      WEFT_CHECK(st.replicas >= 1, "program: stage {}: replicas must be >= 1, got {}", s, st.replicas);
      WEFT_CHECK(st.replicas == 1 || st.shape[0] == st.replicas,
                 "program: stage {}: {} replicas, but its mesh {} has {} positions on the replica axis 0", s,
                 st.replicas, st.shape, st.shape[0]);
      WEFT_CHECK(st.microbatches >= 1, "program: stage {}: micro-batches must be >= 1, got {}", s,
                 st.microbatches);
      WEFT_CHECK(st.microbatch_size >= 1, "program: stage {}: microbatch_size must be >= 1, got {}", s,
                 st.microbatch_size);
      WEFT_CHECK(batch < 0 || st.microbatch_size == batch,
                 "program: stage {}: microbatch_size {} differs from its graph's batch {}", s, st.microbatch_size,
                 batch);
      WEFT_CHECK(st.replicas == stage(0).replicas && st.microbatches == stage(0).microbatches,
                 "program: stage {} runs {} replicas x {} micro-batches, stage 0 {} x {}", s, st.replicas,
                 st.microbatches, stage(0).replicas, stage(0).microbatches);
      if (!st.replica_microbatch.empty()) {
        WEFT_CHECK(static_cast<int>(st.replica_microbatch.size()) == st.replicas,
                   "program: stage {} has {} replica shares for {} replicas", s, st.replica_microbatch.size(),
                   st.replicas);
        std::int64_t mx = 0;
        for (auto b : st.replica_microbatch) {
          WEFT_CHECK(b >= 1, "program: stage {}: a replica share of {} samples (must be >= 1)", s, b);
          mx = std::max(mx, b);
        }
        WEFT_CHECK(mx == st.microbatch_size, "program: stage {}: the largest replica share {} is not microbatch_size {}",
                   s, mx, st.microbatch_size);
      }
      if (!st.split_fraction.empty()) {
        WEFT_CHECK(st.shape.size() == 1 && st.split_fraction.size() == st.ranks.size(),
                   "program: stage {}: an uneven split needs a 1-D mesh and one fraction per position, the "
                   "mesh is {} with {} fractions",
                   s, st.shape, st.split_fraction.size());
        double sum = 0;
        for (double f : st.split_fraction) {
          WEFT_CHECK(std::isfinite(f) && f > 0 && f <= 1, "program: stage {}: split fraction {} not in (0, 1]", s, f);
          sum += f;
        }
        WEFT_CHECK(std::abs(sum - 1) < 1e-6, "program: stage {}: split fractions sum to {}, not 1", s, sum);
      }
      for (std::size_t pos = 0; pos < st.ranks.size(); ++pos) {
        const int r = st.ranks[pos];
        WEFT_CHECK(r >= 0 && r < nr, "program: stage {} lists rank {}, the program has {} ranks", s, r, nr);
        WEFT_CHECK(stage_of[static_cast<std::size_t>(r)] < 0, "program: rank {} is listed twice by the stages", r);
        stage_of[static_cast<std::size_t>(r)] = s;
        const auto& rp = p_.ranks[static_cast<std::size_t>(r)];
        WEFT_CHECK(rp.stage == s, "program: stage {} lists rank {}, which says it is on stage {}", s, r, rp.stage);
        WEFT_CHECK(rp.coord.size() == st.shape.size(),
                   "program: rank {}'s coordinate {} is not on its stage mesh {}", r, rp.coord, st.shape);
        std::int64_t idx = 0;
        for (std::size_t d = 0; d < st.shape.size(); ++d) {
          WEFT_CHECK(rp.coord[d] >= 0 && rp.coord[d] < st.shape[d],
                     "program: rank {}'s coordinate {} is outside its stage mesh {}", r, rp.coord, st.shape);
          idx = idx * st.shape[d] + rp.coord[d];
        }
        WEFT_CHECK(idx == static_cast<std::int64_t>(pos),
                   "program: rank {} at coordinate {} is at position {} of stage {}'s rank list, not {}", r,
                   rp.coord, pos, s, idx);
      }
    }
    for (int r = 0; r < nr; ++r) {
      WEFT_CHECK(p_.ranks[static_cast<std::size_t>(r)].rank == r, "program: ranks[{}] says it is rank {}", r,
                 p_.ranks[static_cast<std::size_t>(r)].rank);
      WEFT_CHECK(stage_of[static_cast<std::size_t>(r)] >= 0, "program: rank {} is in no stage's rank list", r);
    }
  }

  void buffers() {
    const auto nt = static_cast<ir::TensorId>(g_.tensors().size());
    for (int b = 0; b < nb(); ++b) {
      const auto& x = buf(b);
      WEFT_CHECK(x.stage >= 0 && x.stage < static_cast<int>(p_.stages.size()),
                 "program: buffer {} '{}' lives on stage {}, the program has {} stages", b, x.name, x.stage,
                 p_.stages.size());
      WEFT_CHECK(x.tensor >= -1 && x.tensor < nt, "program: buffer {} '{}' names tensor id {}, which does not exist",
                 b, x.name, x.tensor);
      WEFT_CHECK(x.element_bytes == 1 || x.element_bytes == 2 || x.element_bytes == 4 || x.element_bytes == 8,
                 "program: buffer {} '{}' has element_bytes {} (1, 2, 4 or 8)", b, x.name, x.element_bytes);
      std::int64_t n = 1;
      for (auto d : x.shape) {
        WEFT_CHECK(d >= 1 && d <= kMaxElements, "program: buffer {} '{}' has shape {}: a dim of {}", b, x.name,
                   x.shape, d);
        n *= d;
        WEFT_CHECK(n <= kMaxElements, "program: buffer {} '{}' has shape {}: more than 2^48 elements", b, x.name,
                   x.shape);
      }
      if (x.tensor >= 0) {
        const auto& t = g_.tensor(x.tensor);
        WEFT_CHECK(x.shape == t.shape, "program: buffer {} '{}' has shape {}, its tensor '{}' {}", b, x.name, x.shape,
                   t.name, t.shape);
        WEFT_CHECK(x.element_bytes == static_cast<int>(dtype_size(t.dtype)),
                   "program: buffer {} '{}' has element_bytes {}, its tensor '{}' is {} ({} bytes)", b, x.name,
                   x.element_bytes, t.name, dtype_name(t.dtype), dtype_size(t.dtype));
      }
      const auto& st = stage(x.stage);
      try {
        specs_.push_back(ShardingSpec::parse(x.spec, x.shape, st.shape));
      } catch (const Error& e) {
        fail("program: buffer {} '{}': spec '{}' is not a tiling of shape {} on stage {}'s mesh {}: {}", b, x.name,
             x.spec, x.shape, x.stage, st.shape, e.what());
      }
      norm_.push_back(normalized(specs_.back()));
      if (!st.split_fraction.empty())
        WEFT_CHECK(specs_.back().is_block(), "program: buffer {} '{}': an uneven split needs block shards, not {}", b,
                   x.name, x.spec);
    }
  }

  // On a mesh axis of size 1 every placement is the whole tensor (one tile): R, S(d) and P(sum)
  // there are the same layout (a random leaf spec may say S(0) on a one-device stage).
  static ShardingSpec normalized(const ShardingSpec& x) {
    auto pl = x.per_axis();
    bool changed = false;
    for (std::size_t a = 0; a < pl.size(); ++a)
      if (x.mesh_shape()[a] == 1 && pl[a].kind != Placement::Replicate) {
        pl[a] = Placement::replicate();
        changed = true;
      }
    return changed ? ShardingSpec(x.tensor_shape(), x.mesh_shape(), pl) : x;
  }

  // Whether `b` is a buffer of tensor t, or of t's leaf when t is an updated state (the update
  // writes its leaf in place / a copy carries the new value into it).
  bool of_tensor(int b, ir::TensorId t) const {
    const auto bt = buf(b).tensor;
    if (bt == t) return true;
    auto it = state_leaf_.find(t);
    return it != state_leaf_.end() && it->second == bt;
  }
  bool same_value(int a, int b) const {  // two buffers of one tensor (or a state and its leaf)
    const auto ta = buf(a).tensor, tb = buf(b).tensor;
    if (ta == tb) return true;
    if (ta < 0 || tb < 0) return false;
    return of_tensor(b, ta) || of_tensor(a, tb);
  }

  const std::vector<spmd::OpStrategy>& strategies(ir::OpId o, int s, bool spmd_mesh) {
    auto key = std::pair{o, spmd_mesh ? -1 - s : s};
    auto it = strategies_.find(key);
    if (it == strategies_.end())
      it = strategies_.emplace(key, spmd::enumerate_strategies(g_, g_.op(o), mesh_of(s, spmd_mesh))).first;
    return it->second;
  }
  // Stage s's mesh, or its SPMD mesh (without the replica axis 0).
  std::vector<std::int64_t> mesh_of(int s, bool spmd_mesh) const {
    const auto& m = stage(s).shape;
    return spmd_mesh ? std::vector<std::int64_t>(m.begin() + 1, m.end()) : m;
  }
  // Whether the buffers' specs are the operand / result layouts of a strategy of the op on stage
  // s's mesh (inner strides as the planner's candidates make them). A gradient sum deferred into
  // the update (pipeline::gradient_sums_into_update) adds the replicas' partial means: a strategy
  // on the SPMD mesh with P(sum) on the replica axis for every operand and result (sums are linear).
  bool is_strategy(ir::OpId o, int s, const std::vector<int>& ins, const std::vector<int>& outs) {
    // Keyed by the specs (the micro-batches' copies of an op share them), not the buffer ids.
    std::vector<std::string> key_specs;
    for (int b : ins) key_specs.push_back(buf(b).spec);
    key_specs.emplace_back("->");
    for (int b : outs) key_specs.push_back(buf(b).spec);
    auto key = std::tuple{o, s, std::move(key_specs)};
    auto it = strategy_ok_.find(key);
    if (it != strategy_ok_.end()) return it->second;
    bool ok = strategy_on(o, s, ins, outs, false);
    if (!ok && stage(s).replicas > 1 && stage(s).shape.size() >= 2) {
      if (gradient_sums_.empty()) gradient_sums_ = pipeline::gradient_sums_into_update(g_);
      if (gradient_sums_.at(static_cast<std::size_t>(o))) {
        try {
          ok = strategy_on(o, s, ins, outs, true);
        } catch (const Error&) {  // a spec that has no SPMD-mesh form: not this variant
          ok = false;
        }
      }
    }
    strategy_ok_.emplace(key, ok);
    return ok;
  }
  bool strategy_on(ir::OpId o, int s, const std::vector<int>& ins, const std::vector<int>& outs, bool partial_sum) {
    const auto full = stage(s).shape;
    auto widen = [&](const ShardingSpec& x) {
      if (!partial_sum) return x;
      std::vector<Placement> pl{Placement::partial()};
      pl.insert(pl.end(), x.per_axis().begin(), x.per_axis().end());
      return ShardingSpec(x.tensor_shape(), full, pl);
    };
    auto matches = [&](const spmd::OpStrategy& c) {
      for (std::size_t k = 0; k < ins.size(); ++k)
        if (!(normalized(widen(c.inputs[k])) == norm_[static_cast<std::size_t>(ins[k])])) return false;
      for (std::size_t k = 0; k < outs.size(); ++k)
        if (!(normalized(widen(c.outputs[k])) == norm_[static_cast<std::size_t>(outs[k])])) return false;
      return true;
    };
    // The target of a restride: the buffer's spec, on the SPMD mesh when widened.
    auto target = [&](int b) {
      const auto& x = norm_[static_cast<std::size_t>(b)];
      if (!partial_sum) return x;
      return ShardingSpec(x.tensor_shape(), mesh_of(s, true),
                          std::vector<Placement>(x.per_axis().begin() + 1, x.per_axis().end()));
    };
    // Equal but for strides (what a restride can change): the same placement kinds, dims, reductions.
    auto kinds_match = [&](const spmd::OpStrategy& c) {
      auto same = [&](const ShardingSpec& x, int b) {
        const auto& y = norm_[static_cast<std::size_t>(b)];
        const auto w = normalized(widen(x));
        for (int a = 0; a < w.mesh_ndim(); ++a) {
          const auto &p = w.placement(a), &q = y.placement(a);
          if (p.kind != q.kind || p.dim != q.dim || (p.kind == Placement::Partial && p.reduce != q.reduce))
            return false;
        }
        return true;
      };
      for (std::size_t k = 0; k < ins.size(); ++k)
        if (!same(c.inputs[k], ins[k])) return false;
      for (std::size_t k = 0; k < outs.size(); ++k)
        if (!same(c.outputs[k], outs[k])) return false;
      return true;
    };
    const ir::Op& op = g_.op(o);
    const auto mesh = mesh_of(s, partial_sum);
    for (const auto& c : strategies(o, s, partial_sum)) {
      if (c.inputs.size() != ins.size() || c.outputs.size() != outs.size()) return false;
      if (!kinds_match(c)) continue;
      if (matches(c)) return true;
      // A strided variant: restride to one result or operand, then compare all.
      for (std::size_t k = 0; k < outs.size(); ++k) {
        auto v = spmd::restride_to(g_, op, mesh, c, true, static_cast<int>(k), target(outs[k]));
        if (v && matches(*v)) return true;
      }
      for (std::size_t k = 0; k < ins.size(); ++k) {
        auto v = spmd::restride_to(g_, op, mesh, c, false, static_cast<int>(k), target(ins[k]));
        if (v && matches(*v)) return true;
      }
    }
    return false;
  }

  std::string specs_text(const std::vector<int>& ids) const {
    std::vector<std::string> v;
    for (int b : ids) v.push_back(buf(b).spec);
    return fmt::format("{}", fmt::join(v, ", "));
  }

  void instructions() {
    written_.assign(static_cast<std::size_t>(nb()), 0);
    std::vector<char> ran(g_.ops().size(), 0);
    const auto nops = static_cast<ir::OpId>(g_.ops().size());
    std::set<std::pair<const std::vector<Instr>*, int>> done;  // (list, stage) verified
    for (int r = 0; r < p_.num_ranks(); ++r) {
      const auto& rp = p_.ranks[static_cast<std::size_t>(r)];
      const auto& ins = rp.instrs();
      const int s = rp.stage;
      const auto& st = stage(s);
      const int ndim = static_cast<int>(st.shape.size());
      // Rank-specific: explicit collective groups are the mesh's group along the axis.
      for (int k = 0; k < static_cast<int>(ins.size()); ++k) {
        const Instr& i = ins[static_cast<std::size_t>(k)];
        if (!rp.runs(i)) continue;
        for (int b : i.out)
          if (b >= 0 && b < nb() && i.kind != InstrKind::Free) written_[static_cast<std::size_t>(b)] = 1;
        if (i.kind == InstrKind::Free)
          for (int b : i.in)
            if (b >= 0 && b < nb() && !freed_.count(b)) freed_.emplace(b, p_.describe(r, k));
        if (is_collective(i.kind) && !i.group.empty() && i.axis >= 0 && i.axis < ndim) {
          WEFT_CHECK(std::find(i.group.begin(), i.group.end(), r) != i.group.end(),
                     "program: {}: the rank is not in its own group", p_.describe(r, k));
          WEFT_CHECK(i.group == p_.group_along(r, i.axis),
                     "program: {}: its group {} is not the rank's group {} along mesh axis {}", p_.describe(r, k),
                     i.group, p_.group_along(r, i.axis), i.axis);
        }
      }
      if (!done.emplace(&ins, s).second) continue;
      std::map<int, ReduceOp> stat_reduce;  // statistics buffer -> how its all-reduce must combine it
      for (int k = 0; k < static_cast<int>(ins.size()); ++k) {
        const Instr& i = ins[static_cast<std::size_t>(k)];
        auto what = [&] { return p_.describe(r, k); };
        for (int b : i.in)
          WEFT_CHECK(b >= 0 && b < nb(), "program: {} reads buffer id {} (out of range)", what(), b);
        for (int b : i.out)
          WEFT_CHECK(b >= 0 && b < nb(), "program: {} writes buffer id {} (out of range)", what(), b);
        auto count = [&](std::size_t n_in, std::size_t n_out) {
          WEFT_CHECK(i.in.size() == n_in && i.out.size() == n_out,
                     "program: {}: a {} reads {} and writes {} buffers, not {} and {}", what(),
                     instr_kind_name(i.kind), n_in, n_out, i.in.size(), i.out.size());
        };
        // Buffers live on the stage of the rank that touches them (a send's output: the receivers').
        for (int b : i.in)
          WEFT_CHECK(buf(b).stage == s, "program: {}: buffer '{}' lives on stage {}, the rank on stage {}", what(),
                     buf(b).name, buf(b).stage, s);
        if (i.kind != InstrKind::Send)
          for (int b : i.out)
            WEFT_CHECK(buf(b).stage == s, "program: {}: buffer '{}' lives on stage {}, the rank on stage {}",
                       what(), buf(b).name, buf(b).stage, s);
        auto op_of = [&](std::initializer_list<ir::OpKind> kinds) -> const ir::Op& {
          WEFT_CHECK(i.op >= 0 && i.op < nops, "program: {}: op id {} does not exist (the graph has {} ops)", what(),
                     i.op, nops);
          const ir::Op& op = g_.op(i.op);
          WEFT_CHECK(kinds.size() == 0 || std::find(kinds.begin(), kinds.end(), op.kind) != kinds.end(),
                     "program: {}: a {} cannot run op '{}' (a {})", what(), instr_kind_name(i.kind), op.name,
                     ir::op_kind_name(op.kind));
          WEFT_CHECK(op.kind != ir::OpKind::Opaque, "program: {}: op '{}' is opaque and cannot run", what(), op.name);
          ran[static_cast<std::size_t>(i.op)] = 1;
          return op;
        };
        auto operand = [&](int b, ir::TensorId t, const ir::Op& op, const char* role, std::size_t k2) {
          WEFT_CHECK(buf(b).tensor == t, "program: {}: {} {} of op '{}' is tensor '{}', the buffer '{}' holds {}",
                     what(), role, k2, op.name, g_.tensor(t).name, buf(b).name,
                     buf(b).tensor >= 0 ? fmt::format("'{}'", g_.tensor(buf(b).tensor).name)
                                        : std::string("statistics"));
        };
        auto stat = [&](int b) {
          WEFT_CHECK(buf(b).tensor < 0, "program: {}: buffer '{}' must be a statistics buffer (tensor -1)", what(),
                     buf(b).name);
        };
        // Fields a kind does not use keep their defaults where the executor would still read them:
        // an op id (only computes and cross-entropy steps run one) and the one rank that runs an
        // instruction (only transfers run on one rank; any other runs on every rank of the stage).
        const bool runs_op = i.kind == InstrKind::Compute || i.kind == InstrKind::CeRowMax ||
                             i.kind == InstrKind::CeSumTarget || i.kind == InstrKind::CeLoss ||
                             i.kind == InstrKind::CeGrad;
        WEFT_CHECK(runs_op || i.op == -1, "program: {}: a {} runs no op, it names op {}", what(),
                   instr_kind_name(i.kind), i.op);
        WEFT_CHECK(is_transfer(i.kind) || i.on_rank == -1,
                   "program: {}: only a transfer runs on one rank, this {} names on_rank {}", what(),
                   instr_kind_name(i.kind), i.on_rank);
        auto axis_ok = [&](int a) {
          WEFT_CHECK(a >= 0 && a < ndim, "program: {}: mesh axis {} of a {}-axis stage mesh", what(), a, ndim);
        };
        switch (i.kind) {
          case InstrKind::Compute: {
            const ir::Op& op = op_of({});
            count(op.inputs.size(), op.outputs.size());
            for (std::size_t q = 0; q < op.inputs.size(); ++q) operand(i.in[q], op.inputs[q], op, "operand", q);
            for (std::size_t q = 0; q < op.outputs.size(); ++q)
              WEFT_CHECK(of_tensor(i.out[q], op.outputs[q]),
                         "program: {}: result {} of op '{}' is tensor '{}', the buffer '{}' holds another", what(), q,
                         op.name, g_.tensor(op.outputs[q]).name, buf(i.out[q]).name);
            WEFT_CHECK(i.microbatch >= -1 && i.microbatch < st.microbatches,
                       "program: {}: micro-batch {} of {}", what(), i.microbatch, st.microbatches);
            WEFT_CHECK(is_strategy(i.op, s, i.in, i.out),
                       "program: {}: the layouts ({}) -> ({}) are not a strategy of op '{}' on the mesh {} (wrong "
                       "tiles)",
                       what(), specs_text(i.in), specs_text(i.out), op.name, st.shape);
            break;
          }
          case InstrKind::CeRowMax: {
            const ir::Op& op = op_of({ir::OpKind::CrossEntropy, ir::OpKind::CrossEntropyGrad});
            count(1, 1);
            operand(i.in[0], op.inputs.at(0), op, "operand", 0);
            stat(i.out[0]);
            stat_reduce[i.out[0]] = ReduceOp::Max;
            break;
          }
          case InstrKind::CeSumTarget: {
            const ir::Op& op = op_of({ir::OpKind::CrossEntropy, ir::OpKind::CrossEntropyGrad});
            WEFT_CHECK(op.inputs.size() >= 2, "program: {}: op '{}' has no labels", what(), op.name);
            const bool weighted = ir::cross_entropy_weighted(op);
            count(weighted ? 4 : 3, 1);
            operand(i.in[0], op.inputs[0], op, "operand", 0);
            operand(i.in[1], op.inputs[1], op, "operand", 1);
            stat(i.in[2]);
            if (weighted) operand(i.in[3], op.inputs.back(), op, "operand", op.inputs.size() - 1);
            stat(i.out[0]);
            const std::int64_t width = ir::ce_stat_width(op);
            WEFT_CHECK(!buf(i.out[0]).shape.empty() && buf(i.out[0]).shape.back() == width,
                       "program: {}: the statistics '{}' of op '{}' have shape {}, {} per token expected",
                       what(), buf(i.out[0]).name, op.name, buf(i.out[0]).shape, width);
            stat_reduce[i.out[0]] = ReduceOp::Sum;
            break;
          }
          case InstrKind::CeLoss:
          case InstrKind::CeGrad: {
            const ir::Op& op = op_of({i.kind == InstrKind::CeLoss ? ir::OpKind::CrossEntropy
                                                                  : ir::OpKind::CrossEntropyGrad});
            const std::size_t n = op.inputs.size();
            WEFT_CHECK(n >= 2 && op.outputs.size() == 1, "program: {}: op '{}' is not a cross-entropy of logits and labels",
                       what(), op.name);
            count(n + 2, 1);
            for (std::size_t q = 0; q < n; ++q) operand(i.in[q], op.inputs[q], op, "operand", q);
            stat(i.in[n]);
            stat(i.in[n + 1]);
            operand(i.out[0], op.outputs[0], op, "result", 0);
            WEFT_CHECK(!i.axes.empty(), "program: {}: a vocab-parallel step names no mesh axes", what());
            for (int a : i.axes) axis_ok(a);
            const std::vector<int> ops_in(i.in.begin(), i.in.begin() + static_cast<std::ptrdiff_t>(n));
            WEFT_CHECK(is_strategy(i.op, s, ops_in, i.out),
                       "program: {}: the layouts ({}) -> ({}) are not a strategy of op '{}' on the mesh {} (wrong "
                       "tiles)",
                       what(), specs_text(ops_in), specs_text(i.out), op.name, st.shape);
            break;
          }
          case InstrKind::AllReduce:
          case InstrKind::AllGather:
          case InstrKind::ReduceScatter:
          case InstrKind::AllToAll:
          case InstrKind::LocalSlice:
          case InstrKind::LocalPartial: {
            count(1, 1);
            axis_ok(i.axis);
            const int a = i.in[0], b = i.out[0];
            WEFT_CHECK(same_value(a, b) && buf(a).shape == buf(b).shape && buf(a).element_bytes == buf(b).element_bytes,
                       "program: {}: '{}' and '{}' are not layouts of one tensor", what(), buf(a).name, buf(b).name);
            const auto& from = specs_[static_cast<std::size_t>(a)];
            const auto& to = specs_[static_cast<std::size_t>(b)];
            const Placement& pf = from.placement(i.axis);
            const Placement& pt = to.placement(i.axis);
            if (i.internal) {  // vocab-parallel statistics: the same spec, combined by the statistic's rule
              WEFT_CHECK(i.kind == InstrKind::AllReduce && buf(a).tensor < 0 && from == to,
                         "program: {}: an internal collective is an all-reduce of a statistics buffer", what());
              auto it = stat_reduce.find(a);
              WEFT_CHECK(it != stat_reduce.end(), "program: {}: '{}' is not a cross-entropy statistic made before",
                         what(), buf(a).name);
              WEFT_CHECK(it->second == i.reduce, "program: {}: the statistic '{}' is combined by {}, not {}", what(),
                         buf(a).name, reduce_name(it->second), reduce_name(i.reduce));
              stat_reduce[b] = i.reduce;
              break;
            }
            WEFT_CHECK(buf(a).tensor >= 0, "program: {}: a resharding collective of a statistics buffer", what());
            if (st.shape[static_cast<std::size_t>(i.axis)] == 1) {  // one position: the step can only copy
              WEFT_CHECK(norm_[static_cast<std::size_t>(a)] == norm_[static_cast<std::size_t>(b)],
                         "program: {}: a {} along mesh axis {} (of size 1) moves nothing, but '{}' and '{}' are "
                         "different layouts",
                         what(), instr_kind_name(i.kind), i.axis, buf(a).name, buf(b).name);
              break;
            }
            auto need = [&](bool ok, const char* rule) {
              WEFT_CHECK(ok, "program: {}: a {} on mesh axis {} goes {}, the buffers go {} -> {} there", what(),
                         instr_kind_name(i.kind), i.axis, rule, placement_text(from, i.axis),
                         placement_text(to, i.axis));
            };
            switch (i.kind) {
              case InstrKind::AllReduce:
                need(pf.kind == Placement::Partial && pt.kind == Placement::Replicate, "P -> R");
                break;
              case InstrKind::ReduceScatter:
                need(pf.kind == Placement::Partial && pt.kind == Placement::Shard, "P -> S");
                break;
              case InstrKind::AllGather:
                need(pf.kind == Placement::Shard && pt.kind == Placement::Replicate, "S -> R");
                break;
              case InstrKind::AllToAll:
                need(pf.kind == Placement::Shard && pt.kind == Placement::Shard, "S -> S");
                break;
              case InstrKind::LocalSlice:
                need(pf.kind == Placement::Replicate && pt.kind == Placement::Shard, "R -> S");
                break;
              default:
                need(pf.kind == Placement::Replicate && pt.kind == Placement::Partial, "R -> P");
                WEFT_CHECK(i.reduce == ReduceOp::Sum || pt.reduce == ReduceKind::Max,
                           "program: {}: a max local partial into {}", what(), placement_text(to, i.axis));
                break;
            }
            if (i.kind == InstrKind::AllReduce || i.kind == InstrKind::ReduceScatter)
              WEFT_CHECK(reduce_op_of(pf.reduce) == i.reduce,
                         "program: {}: '{}' is {} on mesh axis {}: it is reduced by {}, not {}", what(), buf(a).name,
                         placement_text(from, i.axis), i.axis, reduce_name(reduce_op_of(pf.reduce)),
                         reduce_name(i.reduce));
            break;
          }
          case InstrKind::Copy:
            count(1, 1);
            WEFT_CHECK(same_value(i.in[0], i.out[0]) && norm_[static_cast<std::size_t>(i.in[0])] ==
                                                            norm_[static_cast<std::size_t>(i.out[0])],
                       "program: {}: a copy between '{}' and '{}' (another tensor or layout)", what(),
                       buf(i.in[0]).name, buf(i.out[0]).name);
            break;
          case InstrKind::Free:
            WEFT_CHECK(!i.in.empty() && i.out.empty(), "program: {}: a free names the buffers it frees as inputs",
                       what());
            break;
          case InstrKind::LoadInput: {
            count(0, 1);
            const auto t = buf(i.out[0]).tensor;
            WEFT_CHECK(t >= 0 && g_.tensor(t).role == ir::Role::Input && g_.tensor(t).producer == ir::kNoOp,
                       "program: {}: '{}' is not an Input leaf", what(), buf(i.out[0]).name);
            WEFT_CHECK(i.microbatch >= 0 && i.microbatch < st.microbatches,
                       "program: {}: micro-batch {} does not exist (the stage runs {} per step)", what(), i.microbatch,
                       st.microbatches);
            break;
          }
          case InstrKind::Accumulate:
            count(2, 1);
            WEFT_CHECK(i.out[0] == i.in[0] && buf(i.in[0]).tensor == buf(i.in[1]).tensor &&
                           norm_[static_cast<std::size_t>(i.in[0])] == norm_[static_cast<std::size_t>(i.in[1])],
                       "program: {}: an accumulation adds two layouts of one tensor into the first", what());
            break;
          case InstrKind::Scale:
            count(1, 1);
            WEFT_CHECK(std::isfinite(i.scale), "program: {}: scale {} is not finite", what(), i.scale);
            {  // the mean over micro-batches and replicas (by share: the share is applied at run time)
              const double want =
                  1.0 / (static_cast<double>(st.microbatches) * (i.by_share ? 1.0 : static_cast<double>(st.replicas)));
              WEFT_CHECK(std::abs(i.scale - want) <= 1e-9 * want,
                         "program: {}: scale {} is not the mean over {} micro-batches{} (1/{})", what(), i.scale,
                         st.microbatches, i.by_share ? "" : fmt::format(" x {} replicas", st.replicas), 1.0 / want);
            }
            WEFT_CHECK(buf(i.in[0]).tensor == buf(i.out[0]).tensor && buf(i.in[0]).shape == buf(i.out[0]).shape,
                       "program: {}: a scale between '{}' and '{}' (another tensor)", what(), buf(i.in[0]).name,
                       buf(i.out[0]).name);
            WEFT_CHECK(!i.by_share || !st.replica_microbatch.empty(),
                       "program: {}: a scale by replica share on a stage without shares", what());
            break;
          case InstrKind::Send:
          case InstrKind::Recv: {
            const bool send = i.kind == InstrKind::Send;
            count(send ? 1 : 0, 1);
            if (send) {
              WEFT_CHECK(same_value(i.in[0], i.out[0]) && buf(i.in[0]).shape == buf(i.out[0]).shape,
                         "program: {}: sends '{}' into '{}' (another tensor)", what(), buf(i.in[0]).name,
                         buf(i.out[0]).name);
              for (int q : i.group)
                WEFT_CHECK(q >= 0 && q < p_.num_ranks() && p_.ranks[static_cast<std::size_t>(q)].stage == buf(i.out[0]).stage,
                           "program: {}: receiver rank {} is not on stage {} of '{}'", what(), q, buf(i.out[0]).stage,
                           buf(i.out[0]).name);
            }
            break;
          }
        }
      }
    }
    for (ir::OpId o = 0; o < nops; ++o)
      WEFT_CHECK(ran[static_cast<std::size_t>(o)], "program: op '{}' of its graph is run by no rank", g_.op(o).name);
  }

  // Per rank, in order: what a rank reads is the value the lowering meant. A buffer is written once
  // in each of its lives (a write while it holds a value — a duplicated instruction — is refused),
  // but for an accumulator (a copy of the first micro-batch's gradient, then one accumulate per
  // further micro-batch, each addend once: microbatches − 1 accumulates, all before the
  // accumulator is read) and receives (several may fill one buffer). A leaf is written at most
  // once a step besides receives (its update, or the copy / collective that carries the new value
  // in), and no op reads it after that. An Input leaf holds nothing until a load-input fills it.
  void hazards() const {
    std::vector<char> live(static_cast<std::size_t>(nb()), 0), leaf(static_cast<std::size_t>(nb()), 0),
        rewritten(static_cast<std::size_t>(nb()), 0);
    std::vector<int> accumulated(static_cast<std::size_t>(nb()), 0);
    std::vector<char> added(static_cast<std::size_t>(nb()), 0), is_acc(static_cast<std::size_t>(nb()), 0);
    for (int r = 0; r < p_.num_ranks(); ++r) {
      const auto& rp = p_.ranks[static_cast<std::size_t>(r)];
      for (const auto& i : rp.instrs())
        if (i.kind == InstrKind::Accumulate) is_acc[static_cast<std::size_t>(i.out[0])] = 1;
    }
    for (int r = 0; r < p_.num_ranks(); ++r) {
      const auto& rp = p_.ranks[static_cast<std::size_t>(r)];
      const auto& st = stage(rp.stage);
      const auto& ins = rp.instrs();
      std::fill(live.begin(), live.end(), 0);
      std::fill(leaf.begin(), leaf.end(), 0);
      std::fill(rewritten.begin(), rewritten.end(), 0);
      std::fill(accumulated.begin(), accumulated.end(), 0);
      std::fill(added.begin(), added.end(), 0);
      std::vector<char> input(static_cast<std::size_t>(nb()), 0);
      for (int b : p_.leaf_buffers) {  // an Input leaf is filled (and freed) like any buffer
        const bool in = g_.tensor(buf(b).tensor).role == ir::Role::Input;
        input[static_cast<std::size_t>(b)] = in;
        leaf[static_cast<std::size_t>(b)] = !in;
        live[static_cast<std::size_t>(b)] = !in;
      }
      for (int k = 0; k < static_cast<int>(ins.size()); ++k) {
        const Instr& i = ins[static_cast<std::size_t>(k)];
        if (!rp.runs(i)) continue;
        auto what = [&] { return p_.describe(r, k); };
        if (i.kind == InstrKind::Free) {
          for (int b : i.in) live[static_cast<std::size_t>(b)] = 0;
          continue;
        }
        if (i.kind != InstrKind::Recv)
          for (int b : i.in) {
            WEFT_CHECK(live[static_cast<std::size_t>(b)] || !input[static_cast<std::size_t>(b)],
                       "program: {} reads the Input '{}' before a load-input fills it", what(), buf(b).name);
            const bool op_reads = i.kind == InstrKind::Compute || i.kind == InstrKind::CeRowMax ||
                                  i.kind == InstrKind::CeSumTarget || i.kind == InstrKind::CeLoss ||
                                  i.kind == InstrKind::CeGrad;
            WEFT_CHECK(!(op_reads && rewritten[static_cast<std::size_t>(b)]),
                       "program: {} reads the leaf '{}' after this step already wrote its new value", what(),
                       buf(b).name);
            if (is_acc[static_cast<std::size_t>(b)] && i.kind != InstrKind::Accumulate)
              WEFT_CHECK(accumulated[static_cast<std::size_t>(b)] == st.microbatches - 1,
                         "program: {} reads the accumulator '{}' after {} of its {} accumulations", what(),
                         buf(b).name, accumulated[static_cast<std::size_t>(b)], st.microbatches - 1);
          }
        if (i.kind == InstrKind::Send) continue;
        if (i.kind == InstrKind::Accumulate) {
          const int acc = i.out[0], add = i.in[1];
          WEFT_CHECK(!added[static_cast<std::size_t>(add)], "program: {} adds '{}' into '{}' a second time", what(),
                     buf(add).name, buf(acc).name);
          added[static_cast<std::size_t>(add)] = 1;
          WEFT_CHECK(++accumulated[static_cast<std::size_t>(acc)] <= st.microbatches - 1,
                     "program: {}: more accumulations into '{}' than the {} micro-batches after the first", what(),
                     buf(acc).name, st.microbatches - 1);
          continue;
        }
        for (int b : i.out) {
          const auto x = static_cast<std::size_t>(b);
          if (i.kind == InstrKind::Recv) {
            live[x] = 1;
            continue;
          }
          if (leaf[x]) {
            WEFT_CHECK(!rewritten[x], "program: {} writes the leaf '{}' a second time this step", what(), buf(b).name);
            rewritten[x] = 1;
          } else {
            WEFT_CHECK(!live[x], "program: {} writes '{}', which already holds a value (not freed since)", what(),
                       buf(b).name);
          }
          live[x] = 1;
        }
      }
      for (int b = 0; b < nb(); ++b)
        if (is_acc[static_cast<std::size_t>(b)] && buf(b).stage == rp.stage)
          WEFT_CHECK(accumulated[static_cast<std::size_t>(b)] == st.microbatches - 1,
                     "program: rank {} accumulates into '{}' {} times, not {} (micro-batches − 1)", r, buf(b).name,
                     accumulated[static_cast<std::size_t>(b)], st.microbatches - 1);
    }
  }

  // A bucket is one collective at run time: its collectives are adjacent in a list (a bucket id is
  // one run), of one kind — all-reduces (gradient buckets), reduce-scatters or all-gathers (ZeRO's)
  // —, on one axis and group with one reduce op, and resharding edges (not a statistic inside an op).
  void buckets() const {
    std::set<const std::vector<Instr>*> seen;
    for (int r = 0; r < p_.num_ranks(); ++r) {
      const auto& ins = p_.ranks[static_cast<std::size_t>(r)].instrs();
      if (!seen.insert(&ins).second) continue;
      std::set<int> closed;
      for (int k = 0; k < static_cast<int>(ins.size()); ++k) {
        const Instr& i = ins[static_cast<std::size_t>(k)];
        if (i.bucket < 0) continue;
        auto what = [&] { return p_.describe(r, k); };
        WEFT_CHECK(
            (i.kind == InstrKind::AllReduce || i.kind == InstrKind::ReduceScatter ||
             i.kind == InstrKind::AllGather) &&
                !i.internal,
            "program: {}: only resharding all-reduces are bucketed, and reduce-scatters and all-gathers",
            what());
        WEFT_CHECK(!closed.count(i.bucket),
                   "program: {}: bucket {} is split (its collectives must be adjacent)", what(), i.bucket);
        const bool opens = k == 0 || ins[static_cast<std::size_t>(k - 1)].bucket != i.bucket;
        if (!opens) {
          const Instr& first = ins[static_cast<std::size_t>(k - 1)];
          WEFT_CHECK(first.kind == i.kind && first.axis == i.axis && first.group == i.group &&
                         first.reduce == i.reduce,
                     "program: {}: another kind, axis, group or reduce op than the rest of bucket {}", what(),
                     i.bucket);
        }
        const bool closes =
            k + 1 == static_cast<int>(ins.size()) || ins[static_cast<std::size_t>(k + 1)].bucket != i.bucket;
        if (closes) closed.insert(i.bucket);
      }
    }
  }

  // The step's results and the leaves stay held to the end of the step: never freed.
  void not_freed(int b, const char* what) const {
    auto it = freed_.find(b);
    WEFT_CHECK(it == freed_.end(), "program: {} frees '{}', {} (held to the end of the step)", it->second,
               buf(b).name, what);
  }

  void results() {
    auto in_range = [&](int b) { return b >= 0 && b < nb(); };
    std::vector<char> leaf(static_cast<std::size_t>(nb()), 0);
    for (int b : p_.leaf_buffers) {
      WEFT_CHECK(in_range(b), "program: leaf buffer id {} out of range", b);
      const auto t = buf(b).tensor;
      WEFT_CHECK(t >= 0 && g_.tensor(t).producer == ir::kNoOp, "program: leaf buffer '{}' is not a leaf tensor's",
                 buf(b).name);
      WEFT_CHECK(!leaf[static_cast<std::size_t>(b)], "program: leaf buffer '{}' is listed twice", buf(b).name);
      not_freed(b, "a leaf");
      leaf[static_cast<std::size_t>(b)] = 1;
    }
    const auto loss = g_.loss();
    if (loss) {
      WEFT_CHECK(in_range(p_.loss), "program: its graph has a loss ('{}'), the program reports loss buffer {}",
                 g_.tensor(*loss).name, p_.loss);
      WEFT_CHECK(buf(p_.loss).tensor == *loss, "program: the loss buffer '{}' is not of the loss tensor '{}'",
                 buf(p_.loss).name, g_.tensor(*loss).name);
      WEFT_CHECK(written_[static_cast<std::size_t>(p_.loss)],
                 "program: the loss buffer '{}' is written by no instruction", buf(p_.loss).name);
      not_freed(p_.loss, "the loss");
    } else {
      WEFT_CHECK(p_.loss == -1, "program: its graph has no loss, the program reports loss buffer {}", p_.loss);
    }
    for (const auto& [name, b] : p_.parameters) {
      WEFT_CHECK(in_range(b), "program: parameter '{}' has no buffer ({})", name, b);
      const auto t = g_.find_tensor(name);
      WEFT_CHECK(t && g_.tensor(*t).role == ir::Role::Parameter && g_.tensor(*t).producer == ir::kNoOp,
                 "program: parameter '{}' is not a Parameter leaf of its graph", name);
      WEFT_CHECK(buf(b).tensor == *t, "program: parameter '{}' reports buffer '{}' of another tensor", name,
                 buf(b).name);
      WEFT_CHECK(leaf[static_cast<std::size_t>(b)] || written_[static_cast<std::size_t>(b)],
                 "program: parameter '{}' reports buffer '{}', which is neither a leaf nor written", name, buf(b).name);
      not_freed(b, "a parameter's");
    }
    for (const auto& [name, b] : p_.gradients) {
      WEFT_CHECK(in_range(b), "program: the gradient of '{}' has no buffer ({})", name, b);
      const auto t = g_.find_tensor(name);
      const auto grad = t ? g_.grad(*t) : std::nullopt;
      WEFT_CHECK(grad.has_value(), "program: reports a gradient of '{}', which has none in its graph", name);
      WEFT_CHECK(buf(b).tensor == *grad, "program: the gradient of '{}' reports buffer '{}' of another tensor", name,
                 buf(b).name);
      WEFT_CHECK(written_[static_cast<std::size_t>(b)], "program: the gradient of '{}' ('{}') is written by no instruction",
                 name, buf(b).name);
      not_freed(b, "a gradient");
    }
  }
};

}  // namespace

void verify(const Program& p) {
  Verifier(p).run();
  check_dataflow(p);
  check_microbatches(p);
}

void verify(const Program& p, const ir::Graph& graph) {
  const std::string fp = ir::graph_fingerprint(graph);
  const std::string own = p.graph_fingerprint.empty() ? ir::graph_fingerprint(p.graph) : p.graph_fingerprint;
  WEFT_CHECK(fp == own || fp == p.step_fingerprint,
             "program: it was lowered for a graph with fingerprint {}{}, this graph '{}' has {}", own,
             p.step_fingerprint.empty() ? std::string() : fmt::format(" (training step {})", p.step_fingerprint),
             graph.name(), fp);
  verify(p);
}

void check_against_plan(const Program& p, const plan::Plan& plan) {
  if (!plan.graph_fingerprint.empty()) {
    const std::string step = p.step_fingerprint.empty() ? p.graph_fingerprint : p.step_fingerprint;
    WEFT_CHECK(step.empty() || step == plan.graph_fingerprint,
               "program: it was lowered for a training step with fingerprint {}, the plan was made for {}",
               step, plan.graph_fingerprint);
  }
  WEFT_CHECK(p.stages.size() == plan.stages.size(), "program: {} stages, the plan has {}", p.stages.size(),
             plan.stages.size());
  // The replicas that run (uneven shares: a device with no share is left out) and their shares,
  // empty when every replica runs the plan's micro-batch size (lower records even shares or not).
  auto uneven = [&](const std::vector<std::int64_t>& all) {
    std::vector<std::int64_t> v;
    for (std::int64_t s : all)
      if (s > 0) v.push_back(s);
    if (std::all_of(v.begin(), v.end(), [&](std::int64_t s) { return s == plan.microbatch_size; })) v.clear();
    return v;
  };
  const std::vector<std::int64_t> shares = uneven(plan.replica_microbatch);
  const int replicas =
      plan.replica_microbatch.empty()
          ? plan.data_parallel
          : static_cast<int>(std::count_if(plan.replica_microbatch.begin(), plan.replica_microbatch.end(),
                                           [](std::int64_t s) { return s > 0; }));
  for (std::size_t s = 0; s < p.stages.size(); ++s) {
    const StageMesh& st = p.stages[s];
    WEFT_CHECK(st.microbatches == plan.num_microbatches,
               "program: stage {} runs {} micro-batches, the plan {}", s, st.microbatches,
               plan.num_microbatches);
    WEFT_CHECK(st.microbatch_size == plan.microbatch_size,
               "program: stage {} runs micro-batches of {} samples, the plan {}", s, st.microbatch_size,
               plan.microbatch_size);
    WEFT_CHECK(st.replicas == replicas, "program: stage {} has {} replicas, the plan {}", s, st.replicas,
               replicas);
    WEFT_CHECK(uneven(st.replica_microbatch) == shares,
               "program: stage {}'s replica shares {} are not the plan's {}", s, st.replica_microbatch,
               shares);
    if (plan.stages.size() > 1)
      WEFT_CHECK(st.schedule == plan.schedule, "program: stage {} follows schedule '{}', the plan '{}'", s,
                 st.schedule, plan.schedule);
    std::set<int> have, want;
    for (int r : st.ranks)
      if (r >= 0 && r < p.num_ranks()) have.insert(p.ranks[static_cast<std::size_t>(r)].device);
    for (int d : plan.stages[s].devices) want.insert(d);
    WEFT_CHECK(std::includes(want.begin(), want.end(), have.begin(), have.end()) &&
                   (have == want || !plan.replica_microbatch.empty()),
               "program: stage {} runs on devices {}, the plan's stage {} on {}", s, have, s, want);
  }
}

void verify(const Program& p, const ir::Graph& step, const plan::Plan& plan) {
  verify(p, step);
  check_against_plan(p, plan);
}

}  // namespace weft::lower
