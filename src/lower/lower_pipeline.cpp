// Lowering of pipeline stages to per-rank programs (see lower.hpp). One SPMD stage (lower_spmd) is
// the pipeline of one stage.
//
// Per stage the ops are lowered once into phase templates — F (forward), B (backward, or only the
// input gradients under a split schedule), W (the weight gradients, split schedules), U (the
// update, once per step) — over template buffers. Each rank then runs its stage's schedule order
// (F/B/W of micro-batch m), every phase instantiated with micro-batch m's own copies of the
// per-micro-batch buffers (activations of several micro-batches are in flight under 1F1B), then U.
// Cross-stage tensors go by Send/Recv, planned by the reshard module (one joint plan per stage pair
// and phase pair, per replica) from the producer's layout (partial sums reduced on its mesh first)
// to the consumer's.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <set>

#include "buckets_and_frees.hpp"
#include "weft/core/error.hpp"
#include "weft/ir/autodiff.hpp"
#include "weft/ir/kernels.hpp"
#include "weft/lower/lower.hpp"
#include "weft/pipeline/grouping.hpp"
#include "weft/reshard/decompose.hpp"
#include "weft/schedule/schedule.hpp"
#include "weft/sharding/reshard.hpp"

namespace weft::lower {

namespace {

using sharding::Placement;
using sharding::ShardingSpec;

enum Phase : int { kF = 0, kB = 1, kW = 2, kU = 3 };
constexpr std::array<const char*, 4> kPhaseName{"forward", "backward", "weight-gradient", "update"};

InstrKind kind_of(sharding::CollectiveKind k) {
  switch (k) {
    case sharding::CollectiveKind::AllGather: return InstrKind::AllGather;
    case sharding::CollectiveKind::ReduceScatter: return InstrKind::ReduceScatter;
    case sharding::CollectiveKind::AllReduce: return InstrKind::AllReduce;
    case sharding::CollectiveKind::AllToAll: return InstrKind::AllToAll;
    case sharding::CollectiveKind::LocalSlice: return InstrKind::LocalSlice;
    case sharding::CollectiveKind::LocalPartial: return InstrKind::LocalPartial;
  }
  throw InternalError("collective kind");
}

// The spec of a per-token statistics tensor of logits laid out as `logits` (the class dim removed;
// the axes that split it replicate the statistics); `extra` appends an unsharded trailing dim.
ShardingSpec stats_spec(const ShardingSpec& logits, std::int64_t extra) {
  const int v = logits.rank() - 1;
  std::vector<std::int64_t> shape(logits.tensor_shape().begin(), logits.tensor_shape().end() - 1);
  if (extra > 0) shape.push_back(extra);
  std::vector<Placement> pl;
  for (const auto& p : logits.per_axis())
    pl.push_back(p.kind == Placement::Shard && p.dim == v ? Placement::replicate() : p);
  return ShardingSpec(shape, logits.mesh_shape(), pl);
}

std::vector<std::vector<std::int64_t>> flat_region(const reshard::Region& r) {
  std::vector<std::vector<std::int64_t>> out;
  for (const auto& d : r.dims) {
    std::vector<std::int64_t> iv;
    for (const auto& i : d) {
      iv.push_back(i.begin);
      iv.push_back(i.end);
    }
    out.push_back(std::move(iv));
  }
  return out;
}

// An instruction of a phase template.
struct Tmpl {
  Instr i;
  int only_device = -1;   // Send / Recv: the one device (of the stage) that runs it
  bool acc_slot = false;  // copy into the accumulator on the phase's first run, accumulate after
  ir::OpId unit_op = -1;  // a ZeRO-3 parameter gather: the op it serves (its recompute unit's)
};

// A tensor made in one stage and read in another (per micro-batch, or once per step for the
// refreshed copy of a tied parameter).
struct Crossing {
  ir::TensorId tensor = -1;
  int from = 0, to = 0;
  Phase send_phase = kF, recv_phase = kF;
  ShardingSpec src, dst;  // on the SPMD meshes
  int dst_buffer = -1;    // the template buffer it arrives in (stage `to`)
  bool refresh = false;   // a tied parameter's new value, into the receiver's leaf
};

class PipelineLowering {
 public:
  PipelineLowering(const ir::Graph& g, const cluster::Cluster& c, const std::vector<PipelineStage>& stages,
                   const std::vector<CrossStageSpec>& cross, const PipelineOptions& opt)
      : g_(g), c_(c), in_(stages), cross_in_(cross), opt_(opt) {}

  Program run() {
    g_.validate();
    S_ = static_cast<int>(in_.size());
    M_ = opt_.microbatches;
    dp_ = opt_.replicas;
    WEFT_CHECK(S_ >= 1, "lowering: no stages");
    WEFT_CHECK(dp_ >= 1 && M_ >= 1, "lowering: replicas ({}) and micro-batches ({}) must be >= 1", dp_, M_);
    accumulate_ = M_ > 1 || dp_ > 1;
    if (!opt_.split_fraction.empty()) {
      WEFT_CHECK(S_ == 1 && dp_ == 1 && in_[0].mesh.ndim() == 1 &&
                     static_cast<std::int64_t>(opt_.split_fraction.size()) == in_[0].mesh.size(),
                 "lowering: an uneven split needs one stage on a 1-D mesh and one fraction per device ({} "
                 "fractions, "
                 "{} stages, mesh {})",
                 opt_.split_fraction.size(), S_, in_[0].mesh.shape());
      double sum = 0;
      for (double f : opt_.split_fraction) {
        WEFT_CHECK(f >= 0, "lowering: a negative split fraction {}", f);
        sum += f;
      }
      WEFT_CHECK(sum > 0, "lowering: the split fractions sum to {}", sum);
    }
    const auto& shares = opt_.replica_microbatch;
    if (!shares.empty()) {
      WEFT_CHECK(static_cast<int>(shares.size()) == dp_, "lowering: {} replica shares for {} replicas",
                 shares.size(), dp_);
      for (auto b : shares)
        WEFT_CHECK(b >= 1, "lowering: a replica share of {} samples (each must be >= 1)", b);
      WEFT_CHECK(*std::max_element(shares.begin(), shares.end()) == batch_of(g_),
                 "lowering: the graph's batch {} must be the largest replica share {}", batch_of(g_),
                 *std::max_element(shares.begin(), shares.end()));
    }
    p_.graph = g_;
    setup_stages();
    // Logical stage s runs on the device group the schedule's placement gives it: s mod D (D
    // groups, S = D·v: the interleaved schedules when v > 1).
    const int D = static_cast<int>(group_mesh_.size());
    WEFT_CHECK(S_ % D == 0, "lowering: {} stages on {} device groups: every group must hold as many stages",
               S_, D);
    const bool chunked = opt_.schedule == "interleaved" || opt_.schedule == "zb_interleaved" ||
                         opt_.schedule == "kfkb_interleaved" || schedule::v_shaped(opt_.schedule);
    WEFT_CHECK(S_ == D || chunked,
               "lowering: several stages per device group need an interleaved schedule (interleaved, "
               "zb_interleaved, kfkb_interleaved) or a V one (zbv, dualpipev), not '{}'",
               opt_.schedule);
    sched_ = std::make_unique<schedule::Schedule>(
        schedule::make_schedule(opt_.schedule, D, M_, opt_.schedule_k, S_ / D));
    for (int s = 0; s < S_; ++s)
      WEFT_CHECK(group_of_stage_[static_cast<std::size_t>(s)] == sched_->device_of(s),
                 "lowering: stage {} runs on device group {}, the {} schedule puts it on group {}", s,
                 group_of_stage_[static_cast<std::size_t>(s)], opt_.schedule, sched_->device_of(s));
    classify();
    find_crossings();
    plan_transfers();
    plan_zero();
    for (auto [out, leaf] : ir::updated_states(g_)) state_leaf_.emplace(out, leaf);
    for (int s = 0; s < S_; ++s) make_leaves(s);
    for (int s = 0; s < S_; ++s) lower_stage(s);
    results();
    instantiate();
    check(p_);
    return std::move(p_);
  }

 private:
  struct StageCtx {
    cluster::DeviceMesh mesh;
    int lead = 0;  // 1 when the mesh has a replica axis
    std::vector<std::int64_t> spmd_shape;
    std::vector<cluster::AxisLink> links;
    std::map<int, sharding::ReshardPlanner> planners;
    std::map<ir::TensorId, std::vector<std::pair<ShardingSpec, int>>> layouts;
    std::array<std::vector<Tmpl>, 4> tmpl;
    std::map<ir::TensorId, int> leaves;             // leaf tensor -> its buffer
    std::vector<std::pair<ir::TensorId, int>> acc;  // accumulated tensor -> accumulator
    std::vector<ir::OpId> ops;                      // topological order
    std::vector<int> inputs;                        // Input leaf buffers (loaded per micro-batch)
  };

  // ---------- setup ----------
  void setup_stages() {
    stage_of_op_.assign(g_.ops().size(), -1);
    std::set<int> devices;
    int rank = 0;
    for (int s = 0; s < S_; ++s) {
      const auto& ps = in_[static_cast<std::size_t>(s)];
      StageCtx st{ps.mesh, 0, {}, cluster::axis_links(c_, ps.mesh), {}, {}, {}, {}, {}, {}, {}};
      const auto& shape = ps.mesh.shape();
      WEFT_CHECK(dp_ == 1 || (!shape.empty() && shape[0] == dp_),
                 "lowering: with {} replicas stage {}'s mesh must start with a replica axis of {}, it is {}",
                 dp_, s, dp_, shape);
      st.lead = dp_ > 1 ? 1 : 0;
      st.spmd_shape.assign(shape.begin() + st.lead, shape.end());
      WEFT_CHECK(ps.layout.op_axes.size() == g_.ops().size(),
                 "lowering: stage {}'s layout has {} op assignments, the graph {} ops", s,
                 ps.layout.op_axes.size(), g_.ops().size());
      WEFT_CHECK(ps.zero_level.empty() || ps.zero_level.size() == g_.ops().size(),
                 "lowering: stage {}'s ZeRO levels list {} ops, the graph has {}", s, ps.zero_level.size(),
                 g_.ops().size());
      WEFT_CHECK(ps.zero_unit.empty() || ps.zero_unit.size() == g_.ops().size(),
                 "lowering: stage {}'s ZeRO units list {} ops, the graph has {}", s, ps.zero_unit.size(),
                 g_.ops().size());
      WEFT_CHECK(ps.recompute_unit.empty() || ps.recompute_unit.size() == g_.ops().size(),
                 "lowering: stage {}'s recompute units list {} ops, the graph has {}", s, ps.recompute_unit.size(),
                 g_.ops().size());
      for (ir::OpId o : ps.ops) {
        WEFT_CHECK(o >= 0 && o < static_cast<ir::OpId>(g_.ops().size()), "lowering: stage {} lists op id {}",
                   s, o);
        WEFT_CHECK(stage_of_op_[static_cast<std::size_t>(o)] < 0, "lowering: op '{}' is in stages {} and {}",
                   g_.op(o).name, stage_of_op_[static_cast<std::size_t>(o)], s);
        stage_of_op_[static_cast<std::size_t>(o)] = s;
      }
      // The device group of the stage: a new one, or (interleaved) the one holding its devices.
      int grp = -1;
      for (int g = 0; g < static_cast<int>(group_mesh_.size()); ++g)
        if (group_mesh_[static_cast<std::size_t>(g)] == ps.mesh) grp = g;
      if (grp < 0) {
        grp = static_cast<int>(group_mesh_.size());
        group_mesh_.push_back(ps.mesh);
        StageMesh sm;
        sm.shape = shape;
        sm.replicas = dp_;
        sm.microbatches = M_;
        sm.microbatch_size = batch_of(g_);
        sm.schedule = opt_.schedule;
        sm.replica_microbatch = opt_.replica_microbatch;
        sm.split_fraction = opt_.split_fraction;
        for (int d : ps.mesh.device_ids()) {
          WEFT_CHECK(
              devices.insert(d).second,
              "lowering: device {} is in two stages with different meshes (a device group runs its stages on "
              "one mesh)",
              d);
          rank_of_device_[d] = rank;
          sm.ranks.push_back(rank++);
        }
        p_.stages.push_back(std::move(sm));
      }
      group_of_stage_.push_back(grp);
      st_.push_back(std::move(st));
    }
    for (ir::OpId o = 0; o < static_cast<ir::OpId>(g_.ops().size()); ++o)
      WEFT_CHECK(stage_of_op_[static_cast<std::size_t>(o)] >= 0, "lowering: op '{}' is in no stage",
                 g_.op(o).name);
    for (ir::OpId o : g_.topo_order())
      st_[static_cast<std::size_t>(stage_of_op_[static_cast<std::size_t>(o)])].ops.push_back(o);
  }

  // Phase of every op: forward, backward, update; under a split schedule the backward ops that
  // make weight gradients (a tensor that is the gradient of a parameter leaf) and feed nothing but
  // weight gradients and updates of their own stage run in W.
  void classify() {
    readers_ = g_.consumer_index();
    const auto ph = pipeline::classify_ops(g_);
    phase_.assign(g_.ops().size(), kF);
    for (std::size_t o = 0; o < ph.size(); ++o)
      phase_[o] = ph[o] == pipeline::OpPhase::Forward ? kF : ph[o] == pipeline::OpPhase::Backward ? kB : kU;
    // A parameter's gradient sum that adds a contribution made on another stage runs once per step,
    // in the update phase, on the contributions accumulated over the micro-batches (the contribution
    // crosses once per step, as the planner charges it and as Megatron syncs tied embeddings).
    const auto sums = pipeline::gradient_sums_into_update(g_);
    deferred_.assign(g_.ops().size(), 0);
    for (ir::OpId o : g_.topo_order()) {
      if (!sums[static_cast<std::size_t>(o)]) continue;
      bool defer = false;
      for (ir::TensorId t : g_.op(o).inputs) {
        const ir::OpId p = g_.tensor(t).producer;
        defer = defer || (p != ir::kNoOp && (stage_of_op_[static_cast<std::size_t>(p)] !=
                                                 stage_of_op_[static_cast<std::size_t>(o)] ||
                                             deferred_[static_cast<std::size_t>(p)]));
      }
      if (!defer) continue;
      deferred_[static_cast<std::size_t>(o)] = 1;
      phase_[static_cast<std::size_t>(o)] = kU;
    }
    if (!sched_->split_backward()) return;
    for (ir::OpId o = 0; o < static_cast<ir::OpId>(g_.ops().size()); ++o) {
      if (phase_[static_cast<std::size_t>(o)] != kB) continue;
      for (ir::TensorId t : g_.op(o).outputs) {
        auto of = g_.grad_of(t);
        if (of && g_.tensor(*of).role == ir::Role::Parameter && g_.tensor(*of).producer == ir::kNoOp)
          phase_[static_cast<std::size_t>(o)] = kW;
      }
    }
    for (bool changed = true; changed;) {
      changed = false;
      for (ir::OpId o = 0; o < static_cast<ir::OpId>(g_.ops().size()); ++o) {
        if (phase_[static_cast<std::size_t>(o)] != kW) continue;
        bool keep = true;
        for (ir::TensorId t : g_.op(o).outputs)
          for (ir::OpId r : readers_[static_cast<std::size_t>(t)]) {
            const bool same_stage =
                stage_of_op_[static_cast<std::size_t>(r)] == stage_of_op_[static_cast<std::size_t>(o)];
            const Phase rp = phase_[static_cast<std::size_t>(r)];
            // A weight gradient may feed W ops and updates of its stage, or a once-per-step sum.
            keep = keep && ((same_stage && (rp == kW || rp == kU)) || deferred_[static_cast<std::size_t>(r)]);
          }
        if (!keep) {
          phase_[static_cast<std::size_t>(o)] = kB;
          changed = true;
        }
      }
    }
  }

  const ShardingSpec* given_cross(ir::TensorId t, int a, int b, bool src) const {
    for (const auto& c : cross_in_)
      if (c.tensor == t && c.from_stage == a && c.to_stage == b) return src ? &c.src_spec : &c.dst_spec;
    return nullptr;
  }

  ShardingSpec leaf_spec(int s, ir::TensorId t) const {
    const auto& ls = in_[static_cast<std::size_t>(s)].layout.leaf_specs;
    auto it = ls.find(t);
    const auto& spmd = st_[static_cast<std::size_t>(s)].spmd_shape;
    ShardingSpec spec = it != ls.end() ? it->second : ShardingSpec::replicated(g_.tensor(t).shape, spmd);
    WEFT_CHECK(
        spec.tensor_shape() == g_.tensor(t).shape && spec.mesh_shape() == spmd,
        "lowering: the spec of leaf '{}' is for shape {} on mesh {}, the tensor is {} on stage {}'s mesh {}",
        g_.tensor(t).name, spec.tensor_shape(), spec.mesh_shape(), g_.tensor(t).shape, s, spmd);
    return spec;
  }

  // The strategy of op o on its stage's mesh (replicated along the replica axis).
  spmd::OpStrategy strategy(ir::OpId o) const {
    const int s = stage_of_op_[static_cast<std::size_t>(o)];
    const auto& st = st_[static_cast<std::size_t>(s)];
    const ir::Op& op = g_.op(o);
    auto axes = in_[static_cast<std::size_t>(s)].layout.op_axes[static_cast<std::size_t>(o)];
    WEFT_CHECK(axes.size() == st.spmd_shape.size(),
               "lowering: op '{}' has {} axis assignments, the SPMD mesh {} axes", op.name, axes.size(),
               st.spmd_shape.size());
    const bool partial_sum = st.lead > 0 && deferred_[static_cast<std::size_t>(o)] && accumulate_;
    if (st.lead > 0 && !partial_sum) {
      auto z = zero_axis_.find(o);
      axes.insert(axes.begin(), z != zero_axis_.end() ? z->second : spmd::AxisAssign{});
    }
    auto strat = spmd::make_strategy(g_, op, partial_sum ? st.spmd_shape : st.mesh.shape(), axes);
    WEFT_CHECK(strat.has_value(), "lowering: the layout of op '{}' is not a valid strategy on mesh {}",
               op.name, st.mesh.shape());
    if (partial_sum) {  // a sum of the replicas' partial means stays one: P(sum) on the replica axis
      for (auto& sp : strat->inputs) sp = widen(st, sp, Placement::partial());
      for (auto& sp : strat->outputs) sp = widen(st, sp, Placement::partial());
    }
    return *strat;
  }

  // On the replica axis: a once-per-step gradient crosses as the replicas' partial means.
  Placement replica_placement(const Crossing& c) const {
    return !c.refresh && c.send_phase == kU && accumulate_ ? Placement::partial() : Placement::replicate();
  }

  ShardingSpec narrow(const StageCtx& st, const ShardingSpec& s) const {  // drop the replica axis
    if (st.lead == 0) return s;
    std::vector<Placement> pl(s.per_axis().begin() + 1, s.per_axis().end());
    return ShardingSpec(s.tensor_shape(), st.spmd_shape, pl);
  }
  ShardingSpec widen(const StageCtx& st, const ShardingSpec& s,
                     Placement replica = Placement::replicate()) const {
    if (st.lead == 0) return s;
    std::vector<Placement> pl{replica};
    pl.insert(pl.end(), s.per_axis().begin(), s.per_axis().end());
    return ShardingSpec(s.tensor_shape(), st.mesh.shape(), pl);
  }

  void find_crossings() {
    std::map<std::pair<ir::TensorId, int>, std::size_t> index;
    for (ir::OpId o : g_.topo_order()) {
      const int b = stage_of_op_[static_cast<std::size_t>(o)];
      const Phase rp = phase_[static_cast<std::size_t>(o)];
      for (ir::TensorId t : g_.op(o).inputs) {
        const ir::OpId prod = g_.tensor(t).producer;
        if (prod == ir::kNoOp) continue;
        const int a = stage_of_op_[static_cast<std::size_t>(prod)];
        if (a == b) continue;
        auto [it, fresh] = index.emplace(std::pair{t, b}, crossings_.size());
        if (!fresh) {
          auto& c = crossings_[it->second];
          c.recv_phase = std::min(c.recv_phase, rp);
          continue;
        }
        const Phase sp = phase_[static_cast<std::size_t>(prod)];
        const auto& sa = st_[static_cast<std::size_t>(a)];
        const auto& sb = st_[static_cast<std::size_t>(b)];
        // The producer's layout of t, reduced, unless the caller fixed the specs.
        const auto& outs = g_.op(prod).outputs;
        const auto k = static_cast<std::size_t>(std::find(outs.begin(), outs.end(), t) - outs.begin());
        ShardingSpec src = narrow(sa, strategy(prod).outputs[k]).reduced();
        if (const auto* s = given_cross(t, a, b, true)) src = s->reduced();
        ShardingSpec dst = src.mesh_shape() == sb.spmd_shape
                               ? src
                               : ShardingSpec::replicated(g_.tensor(t).shape, sb.spmd_shape);
        if (const auto* d = given_cross(t, a, b, false)) dst = d->reduced();
        WEFT_CHECK(src.tensor_shape() == g_.tensor(t).shape && src.mesh_shape() == sa.spmd_shape &&
                       dst.tensor_shape() == g_.tensor(t).shape && dst.mesh_shape() == sb.spmd_shape,
                   "lowering: the specs of '{}' from stage {} to stage {} do not fit its shape {} and the "
                   "meshes {} / {}",
                   g_.tensor(t).name, a, b, g_.tensor(t).shape, sa.spmd_shape, sb.spmd_shape);
        crossings_.push_back({t, a, b, sp, rp, src, dst, -1, false});
      }
    }
    for (auto& c : crossings_) {
      // Read only once per step (by the update phase): accumulated where it is made, sent once.
      if (c.recv_phase == kU) c.send_phase = kU;
      WEFT_CHECK(
          c.send_phase <= c.recv_phase &&
              (c.send_phase != c.recv_phase || c.send_phase == kW || (c.send_phase == kF) == (c.from < c.to)),
          "lowering: '{}' goes from the {} of stage {} to the {} of stage {}, against the pipeline's order",
          g_.tensor(c.tensor).name, kPhaseName[c.send_phase], c.from, kPhaseName[c.recv_phase], c.to);
    }
    // Tied parameters: a state leaf read by several stages is updated in the stage of its update
    // op; the others receive the new value at the end of the step.
    for (auto [out, leaf] : ir::updated_states(g_)) {
      const ir::OpId upd = g_.tensor(out).producer;
      const int u = stage_of_op_[static_cast<std::size_t>(upd)];
      std::set<int> readers;
      for (ir::OpId r : readers_[static_cast<std::size_t>(leaf)])
        readers.insert(stage_of_op_[static_cast<std::size_t>(r)]);
      for (int v : readers)
        if (v != u)
          crossings_.push_back({leaf, u, v, kU, kU, leaf_spec(u, leaf), leaf_spec(v, leaf), -1, true});
    }
    // Stages on the same device group (ZB-V's stages D−1 and D, a tied parameter read by a group's
    // two stages) hand tensors over like any others: the resharding plan between the two layouts
    // of the same devices sends each rank's missing elements, to itself when it holds them
    // (a local copy; the executors deliver a message to its own sender).
    // The buffers they arrive in: the first layout of the tensor on the receiving stage (the
    // replicas' partial means of a once-per-step gradient stay partial).
    for (auto& c : crossings_) {
      auto& sb = st_[static_cast<std::size_t>(c.to)];
      if (c.refresh) continue;  // a refresh lands in the leaf itself (made with the leaves)
      c.dst_buffer = buffer(c.to, c.tensor, widen(sb, c.dst, replica_placement(c)), c.recv_phase != kU);
      sb.layouts[c.tensor].emplace_back(specs_.back(), c.dst_buffer);
    }
  }

  // One joint resharding plan per (stage pair, phase pair) and replica; each of its transfers
  // becomes a Send on the sender and a Recv on every receiver.
  struct Transfer {
    int crossing;
    int sender_device;
    std::vector<int> receiver_devices;
    std::vector<std::vector<std::int64_t>> region;
    int tag;
  };
  void plan_transfers() {
    const auto hosts = reshard::HostMap::from_cluster(c_);
    std::map<std::tuple<int, int, int, int>, std::vector<int>> groups;
    for (int k = 0; k < static_cast<int>(crossings_.size()); ++k) {
      const auto& c = crossings_[static_cast<std::size_t>(k)];
      groups[{c.from, c.to, c.send_phase, c.recv_phase}].push_back(k);
    }
    // Replica r's devices of stage s (its mesh is replica-major) as a mesh of the SPMD shape.
    auto replica_mesh = [&](int s, int r) {
      const auto& st = st_[static_cast<std::size_t>(s)];
      const auto& ids = st.mesh.device_ids();
      const auto n = static_cast<std::ptrdiff_t>(ids.size() / static_cast<std::size_t>(dp_));
      return cluster::DeviceMesh(st.spmd_shape,
                                 std::vector<int>(ids.begin() + r * n, ids.begin() + (r + 1) * n));
    };
    for (const auto& [key, list] : groups) {
      const int a = std::get<0>(key), b = std::get<1>(key);
      for (int r = 0; r < dp_; ++r) {
        const cluster::DeviceMesh ra = replica_mesh(a, r), rb = replica_mesh(b, r);
        std::vector<reshard::TensorReshard> trs;
        for (int k : list) {
          const auto& c = crossings_[static_cast<std::size_t>(k)];
          trs.emplace_back(g_.tensor(c.tensor).shape, g_.tensor(c.tensor).dtype, c.src, ra, c.dst, rb);
        }
        const auto plan = reshard::plan(reshard::make_problem(trs, hosts), opt_.transfers);
        for (const auto& op : plan.ops) {
          WEFT_CHECK(
              !op.from_destination,
              "lowering: the transfer strategy {} relays through receivers; use send_recv or broadcast",
              reshard::to_string(opt_.transfers.strategy));
          if (op.receivers.empty()) continue;
          transfers_.push_back({list[static_cast<std::size_t>(op.tensor)], op.sender, op.receivers,
                                flat_region(op.region), next_tag_++});
        }
      }
    }
  }

  // ---------- buffers and layouts ----------
  int buffer(int s, ir::TensorId t, const ShardingSpec& spec, bool per_mb, const std::string& label = {}) {
    Buffer b;
    const std::string text = spec.to_string();
    const std::string base = t >= 0 ? g_.tensor(t).name : label;
    b.tensor = t;
    b.shape = spec.tensor_shape();
    b.spec = text;
    b.element_bytes = t >= 0 ? static_cast<int>(dtype_size(g_.tensor(t).dtype)) : 4;
    b.stage = group_of_stage_[static_cast<std::size_t>(s)];  // the program's stage: the device group
    b.name = S_ > 1 ? fmt::format("{}@{}:s{}", base, text, s) : base + "@" + text;
    for (int k = 2; names_.count(b.name); ++k) b.name = fmt::format("{}@{}#{}", base, text, k);
    names_.insert(b.name);
    p_.buffers.push_back(std::move(b));
    specs_.push_back(spec);
    per_mb_.push_back(per_mb ? 1 : 0);
    return static_cast<int>(p_.buffers.size()) - 1;
  }
  // A buffer made by the phase being lowered (per micro-batch unless it is the update's).
  int made(int s, ir::TensorId t, const ShardingSpec& spec, const std::string& label = {}) {
    const int b = buffer(s, t, spec, phase_now_ != kU, label);
    if (t >= 0) st_[static_cast<std::size_t>(s)].layouts[t].emplace_back(spec, b);
    return b;
  }
  int produced(int s, ir::TensorId t) const {
    return st_[static_cast<std::size_t>(s)].layouts.at(t).front().second;
  }

  void emit(int s, Instr i, int only_device = -1, bool acc_slot = false, ir::OpId unit_op = -1) {
    st_[static_cast<std::size_t>(s)].tmpl[static_cast<std::size_t>(phase_now_)].push_back(
        {std::move(i), only_device, acc_slot, unit_op});
  }

  sharding::ReshardPlanner& planner(StageCtx& st, int element_bytes) {
    auto it = st.planners.find(element_bytes);
    if (it == st.planners.end())
      it = st.planners.emplace(element_bytes, sharding::ReshardPlanner(st.links, element_bytes)).first;
    return it->second;
  }

  // The buffer of `t` in `spec` on stage s, resharding from its first layout there when needed.
  int layout(int s, ir::TensorId t, const ShardingSpec spec) {  // by value: callers pass specs_ elements
    auto& st = st_[static_cast<std::size_t>(s)];
    auto lit = st.layouts.find(t);
    WEFT_ASSERT(lit != st.layouts.end(),
                fmt::format("tensor '{}' has no layout on stage {}", g_.tensor(t).name, s));
    for (const auto& [sp, b] : lit->second)
      if (sp == spec) return b;
    return reshard(s, t, lit->second.front().second, spec, true);
  }
  // Buffer `cur` (a value of `t`) resharded to `spec` by the planner's cheapest sequence; with
  // `shared` each step's buffer is a layout of t that later reads reuse (a partial mean is not).
  // With `into` the last step writes that buffer (of `spec`), a copy when no step is needed.
  int reshard(int s, ir::TensorId t, int cur, const ShardingSpec spec, bool shared, int into = -1) {
    auto& st = st_[static_cast<std::size_t>(s)];
    const ShardingSpec from = specs_[static_cast<std::size_t>(cur)];
    const auto& plan = planner(st, static_cast<int>(dtype_size(g_.tensor(t).dtype))).plan(from, spec);
    if (into >= 0 && plan.steps.empty()) {
      Instr i;
      i.kind = InstrKind::Copy;
      i.in = {cur};
      i.out = {into};
      emit(s, std::move(i));
      return into;
    }
    for (std::size_t k = 0; k < plan.steps.size(); ++k) {
      const auto& step = plan.steps[k];
      const bool last_into = into >= 0 && k + 1 == plan.steps.size();
      int next = -1;
      if (shared && !last_into)
        for (const auto& [sp, b] : st.layouts.at(t))
          if (sp == step.to) next = b;
      if (next < 0) {
        next = last_into ? into : shared ? made(s, t, step.to) : buffer(s, t, step.to, phase_now_ != kU);
        Instr i;
        i.kind = kind_of(step.kind);
        i.axis = step.axis;
        i.in = {cur};
        i.out = {next};
        if (auto r = step.from.reduce_kind(); r && *r == sharding::ReduceKind::Max) i.reduce = ReduceOp::Max;
        // A ZeRO-3 gather belongs to the op it serves: re-made with that op's unit.
        emit(s, std::move(i), -1, false, zero_param_.count({s, t}) ? serving_ : -1);
      }
      cur = next;
    }
    WEFT_ASSERT(specs_[static_cast<std::size_t>(cur)] == spec,
                fmt::format("resharding plan of '{}' from {} to {} ends in {} ({})", g_.tensor(t).name,
                            from.to_string(), spec.to_string(),
                            specs_[static_cast<std::size_t>(cur)].to_string(), plan.to_string()));
    return cur;
  }

  // ZeRO across the replicas (PipelineStage::zero): the replica-axis factor of each optimizer
  // update and the sharded spec of the optimizer states it reads, on the stage's whole mesh;
  // from level 2 the spec its gradient is accumulated in (reduce-scattered per micro-batch), at
  // level 3 the spec its parameter is stored in (gathered before each use, freed after).
  void plan_zero() {
    const bool by_share = !opt_.replica_microbatch.empty();
    for (int s = 0; s < S_; ++s) {
      const auto& ps = in_[static_cast<std::size_t>(s)];
      const auto& st = st_[static_cast<std::size_t>(s)];
      auto level_of = [&](ir::OpId o) {
        return ps.zero_level.empty() ? ps.zero : ps.zero_level[static_cast<std::size_t>(o)];
      };
      if (st.lead == 0 ||
          std::none_of(st.ops.begin(), st.ops.end(), [&](ir::OpId o) { return level_of(o) > 0; }))
        continue;
      auto optimizer_state = [&](ir::TensorId t) {
        const auto& info = g_.tensor(t);
        return info.producer == ir::kNoOp && ir::is_state_leaf(info) && info.role != ir::Role::Parameter;
      };
      auto parameter = [&](ir::TensorId t) {
        const auto& info = g_.tensor(t);
        return info.producer == ir::kNoOp && info.role == ir::Role::Parameter;
      };
      // Read on this stage only: a tied parameter (or a gradient summed on another stage) keeps
      // ZeRO-1's replicated form, since its cross-stage transfers are per replica.
      auto only_here = [&](ir::TensorId t) {
        const auto& rs = readers_[static_cast<std::size_t>(t)];
        return std::all_of(rs.begin(), rs.end(),
                           [&](ir::OpId r) { return stage_of_op_[static_cast<std::size_t>(r)] == s; });
      };
      for (ir::OpId o : st.ops) {
        if (phase_[static_cast<std::size_t>(o)] != kU || deferred_[static_cast<std::size_t>(o)]) continue;
        const ir::Op& op = g_.op(o);
        const int level = level_of(o);
        if (level <= 0 || (std::none_of(op.inputs.begin(), op.inputs.end(), optimizer_state) &&
                           (level < 2 || std::none_of(op.inputs.begin(), op.inputs.end(), parameter))))
          continue;
        const auto& axes = ps.layout.op_axes[static_cast<std::size_t>(o)];
        for (const auto& cand : spmd::enumerate_strategies(g_, op, st.mesh.shape())) {
          if (cand.axes[0].factor < 0 ||
              !std::equal(cand.axes.begin() + 1, cand.axes.end(), axes.begin(), axes.end()))
            continue;
          zero_axis_[o] = cand.axes[0];
          break;
        }
        if (!zero_axis_.count(o)) continue;  // no factor divides along the replica axis: a replicated update
        const auto strat = strategy(o);
        for (std::size_t i = 0; i < op.inputs.size(); ++i) {
          const ir::TensorId t = op.inputs[i];
          const auto& info = g_.tensor(t);
          if (optimizer_state(t)) zero_leaf_.insert_or_assign({s, t}, strat.inputs[i]);
          if (level >= 3 && parameter(t) && only_here(t)) {
            zero_leaf_.insert_or_assign({s, t}, strat.inputs[i]);
            zero_param_.insert({s, t});
          }
          // A gradient made on this stage's micro-batches (uneven replica shares weight each
          // replica's mean before the sum, so they keep the whole accumulator).
          if (level >= 2 && !by_share && info.role == ir::Role::Gradient && info.producer != ir::kNoOp &&
              stage_of_op_[static_cast<std::size_t>(info.producer)] == s &&
              phase_[static_cast<std::size_t>(info.producer)] != kU && only_here(t) && accumulated_early(t))
            zero_grad_.insert_or_assign({s, t}, strat.inputs[i]);
        }
      }
    }
  }

  // ---------- one stage ----------
  // Leaves read by stage s: one buffer each in its spec (parameters and optimizer states persist,
  // inputs are loaded per micro-batch, constants filled each step).
  void make_leaves(int s) {
    auto& st = st_[static_cast<std::size_t>(s)];
    std::vector<char> read(g_.tensors().size(), 0);
    for (ir::OpId o : st.ops)
      for (ir::TensorId t : g_.op(o).inputs) read[static_cast<std::size_t>(t)] = 1;
    for (ir::TensorId t = 0; t < static_cast<ir::TensorId>(g_.tensors().size()); ++t) {
      const auto& info = g_.tensor(t);
      if (info.producer != ir::kNoOp || !read[static_cast<std::size_t>(t)]) continue;
      // An input holds one micro-batch: each micro-batch in flight has its own copy.
      auto z = zero_leaf_.find({s, t});  // an optimizer state sharded along the replica axis (ZeRO)
      const int b = buffer(s, t, z != zero_leaf_.end() ? z->second : widen(st, leaf_spec(s, t)),
                           info.role == ir::Role::Input);
      st.layouts[t].emplace_back(specs_.back(), b);
      st.leaves[t] = b;
      p_.leaf_buffers.push_back(b);
      if (info.role == ir::Role::Input) st.inputs.push_back(b);
    }
  }

  void lower_stage(int s) {
    auto& st = st_[static_cast<std::size_t>(s)];
    const auto& inputs = st.inputs;
    // What the update reads from the micro-batches (gradients), and the loss: accumulated.
    // (A once-per-step gradient sum on another stage reads it too: it is accumulated here and
    // crosses once.)
    auto& acc_set = acc_set_;
    acc_set.clear();
    if (accumulate_) {
      for (ir::OpId o = 0; o < static_cast<ir::OpId>(g_.ops().size()); ++o) {
        if (phase_[static_cast<std::size_t>(o)] != kU) continue;
        for (ir::TensorId t : g_.op(o).inputs) {
          const ir::OpId prod = g_.tensor(t).producer;
          if (prod == ir::kNoOp || phase_[static_cast<std::size_t>(prod)] == kU ||
              stage_of_op_[static_cast<std::size_t>(prod)] != s)
            continue;
          WEFT_CHECK(g_.tensor(t).role == ir::Role::Gradient,
                     "lowering: the update reads '{}' ({}) from the micro-batches; only gradients can be "
                     "accumulated",
                     g_.tensor(t).name, ir::role_name(g_.tensor(t).role));
          acc_set.insert(t);
        }
      }
      if (auto loss = g_.loss();
          loss && stage_of_op_[static_cast<std::size_t>(g_.tensor(*loss).producer)] == s)
        acc_set.insert(*loss);
    }
    for (Phase ph : {kF, kB, kW}) {
      phase_now_ = ph;
      // ZeRO-3: each phase gathers its parameters afresh (per micro-batch, freed after their last
      // use there), so no gathered copy lives from the forward to the backward.
      for (auto& [t, ls] : st.layouts)
        if (zero_param_.count({s, t})) ls.erase(ls.begin() + 1, ls.end());
      recv(s, ph, false);  // what arrives from other stages, first
      if (ph == kF)
        for (int b : inputs) {
          Instr i;
          i.kind = InstrKind::LoadInput;
          i.out = {b};
          i.microbatch = 0;
          emit(s, std::move(i));
        }
      for (ir::OpId o : st.ops)
        if (phase_[static_cast<std::size_t>(o)] == ph) lower_op(s, o);
      send(s, ph, false);
      for (ir::TensorId t : acc_set)  // (what only the update reads: accumulated where it is made)
        if (phase_[static_cast<std::size_t>(g_.tensor(t).producer)] == ph && !accumulated_early(t))
          accumulate(s, t);
    }
    phase_now_ = kU;
    // The mean over micro-batches and replicas (uneven shares: each replica's mean weighted by its
    // share of the samples, b_r / Σb, applied by the executor from the stage's shares).
    const bool by_share = !opt_.replica_microbatch.empty();
    const double scale = 1.0 / (static_cast<double>(M_) * (by_share ? 1 : dp_));
    for (auto [t, acc] : st.acc) {
      if (zero_grad_.count({s, t})) {  // the mean already
        st.layouts[t] = {{specs_[static_cast<std::size_t>(acc)], acc}};
        continue;
      }
      const ShardingSpec spec = st.lead > 0
                                    ? specs_[static_cast<std::size_t>(acc)].with_axis(0, Placement::partial())
                                    : specs_[static_cast<std::size_t>(acc)];
      const int mean = buffer(s, t, spec, false);
      if (st.lead > 0 && g_.tensor(t).role == ir::Role::Gradient) grad_means_.insert(mean);
      Instr i;
      i.kind = InstrKind::Scale;
      i.in = {acc};
      i.out = {mean};
      i.scale = scale;
      i.by_share = by_share;
      emit(s, std::move(i));
      st.layouts[t] = {{spec, mean}};  // the update reads the mean of the step
    }
    send(s, kU, false);  // once-per-step gradient contributions, both ways
    recv(s, kU, false);
    for (ir::OpId o : st.ops)
      if (phase_[static_cast<std::size_t>(o)] == kU) lower_op(s, o);
    // The loop-carried edges: each updated state is resharded to its leaf's layout and copied in.
    // (An update made in the leaf's layout wrote the leaf itself; a sharded one — ZeRO-1/2's new
    // parameter — is gathered straight into it.)
    for (auto [out, leaf_t] : ir::updated_states(g_)) {
      if (stage_of_op_[static_cast<std::size_t>(g_.tensor(out).producer)] != s) continue;
      const int leaf = st.leaves.at(leaf_t);
      const int from = st.layouts.at(out).front().second;
      if (from != leaf) reshard(s, out, from, specs_[static_cast<std::size_t>(leaf)], false, leaf);
    }
    send(s, kU, true);  // tied parameters: the new value to the other stages' copies
    recv(s, kU, true);
  }

  // A value only update phases read is accumulated right after the op that makes it (as a
  // framework's .grad accumulation does), so each micro-batch's whole gradient never lives at once.
  bool accumulated_early(ir::TensorId t) const {
    const auto& rs = readers_[static_cast<std::size_t>(t)];
    return std::all_of(rs.begin(), rs.end(),
                       [&](ir::OpId r) { return phase_[static_cast<std::size_t>(r)] == kU; });
  }

  // Micro-batch m's value of t (made in this phase) into its per-step accumulator: copied on the
  // first micro-batch, added after. A ZeRO-2/3 gradient goes right after the op that makes it:
  // its share of the replicas' mean (P on the replica axis), reduce-scattered into the update's
  // shard and accumulated there, so the whole gradient lives only until then.
  void accumulate(int s, ir::TensorId t) {
    auto& st = st_[static_cast<std::size_t>(s)];
    int src = produced(s, t);
    if (auto z = zero_grad_.find({s, t}); z != zero_grad_.end()) {
      const int part =
          buffer(s, t, specs_[static_cast<std::size_t>(src)].with_axis(0, Placement::partial()), true);
      Instr sc;
      sc.kind = InstrKind::Scale;
      sc.in = {src};
      sc.out = {part};
      sc.scale = 1.0 / (static_cast<double>(M_) * dp_);
      emit(s, std::move(sc));
      src = reshard(s, t, part, z->second, false);
    }
    const int acc = buffer(s, t, specs_[static_cast<std::size_t>(src)], false);
    Instr i;
    i.kind = InstrKind::Copy;
    i.in = {src};
    i.out = {acc};
    emit(s, std::move(i), -1, true);
    st.acc.emplace_back(t, acc);
  }

  // An update's result: written into its state's leaf when it is made in the leaf's layout and no
  // other update-phase op of the stage reads the leaf (the forward and backward ran before: the
  // optimizer steps in place), else a new buffer.
  int updated_in_place(int s, ir::TensorId out, const ShardingSpec& spec) {
    auto& st = st_[static_cast<std::size_t>(s)];
    const auto state = state_leaf_.find(out);
    if (state == state_leaf_.end()) return made(s, out, spec);
    const auto lit = st.leaves.find(state->second);
    const auto& rs = readers_[static_cast<std::size_t>(state->second)];
    const ir::OpId upd = g_.tensor(out).producer;
    if (lit == st.leaves.end() || specs_[static_cast<std::size_t>(lit->second)] != spec ||
        std::any_of(rs.begin(), rs.end(), [&](ir::OpId r) {
          return r != upd && phase_[static_cast<std::size_t>(r)] == kU &&
                 stage_of_op_[static_cast<std::size_t>(r)] == s;
        }))
      return made(s, out, spec);
    st.layouts[out].emplace_back(spec, lit->second);
    return lit->second;
  }

  // The Recvs of stage s in phase ph: each receiving device's part of each transfer into it.
  void recv(int s, Phase ph, bool refresh) {
    for (const auto& tr : transfers_) {
      const auto& c = crossings_[static_cast<std::size_t>(tr.crossing)];
      if (c.to != s || c.recv_phase != ph || c.refresh != refresh) continue;
      for (int d : tr.receiver_devices) {
        Instr i;
        i.kind = InstrKind::Recv;
        i.out = {refresh ? st_[static_cast<std::size_t>(s)].leaves.at(c.tensor) : c.dst_buffer};
        i.group = {tr.sender_device};
        i.tag = tr.tag;
        i.region = tr.region;
        emit(s, std::move(i), d);
      }
    }
  }

  // The Sends of what stage s made in phase ph for other stages: the tensor in its source layout
  // (a partial sum reduced on this mesh first), region by region as the transfer plan says.
  void send(int s, Phase ph, bool refresh) {
    auto& st = st_[static_cast<std::size_t>(s)];
    std::map<int, int> src_buffer;  // crossing -> its buffer here
    for (const auto& tr : transfers_) {
      const auto& c = crossings_[static_cast<std::size_t>(tr.crossing)];
      if (c.from != s || c.send_phase != ph || c.refresh != refresh) continue;
      auto it = src_buffer.find(tr.crossing);
      if (it == src_buffer.end())
        it = src_buffer
                 .emplace(tr.crossing, refresh ? st.leaves.at(c.tensor)
                                               : layout(s, c.tensor, widen(st, c.src, replica_placement(c))))
                 .first;
      Instr i;
      i.kind = InstrKind::Send;
      i.in = {it->second};
      i.out = {refresh ? st_[static_cast<std::size_t>(c.to)].leaves.at(c.tensor) : c.dst_buffer};
      i.group = tr.receiver_devices;
      i.tag = tr.tag;
      i.region = tr.region;
      emit(s, std::move(i), tr.sender_device);
    }
  }

  void lower_op(int s, ir::OpId o) {
    lower_op_body(s, o);
    if (phase_now_ != kU)
      for (ir::TensorId t : g_.op(o).outputs)
        if (acc_set_.count(t) && accumulated_early(t)) accumulate(s, t);
  }
  void lower_op_body(int s, ir::OpId o) {
    const ir::Op& op = g_.op(o);
    WEFT_CHECK(op.kind != ir::OpKind::Opaque, "lowering: op '{}' is opaque and cannot be executed", op.name);
    const auto strat = strategy(o);
    std::vector<int> in;
    serving_ = o;
    for (std::size_t i = 0; i < op.inputs.size(); ++i) in.push_back(layout(s, op.inputs[i], strat.inputs[i]));
    serving_ = -1;
    const bool ce = op.kind == ir::OpKind::CrossEntropy || op.kind == ir::OpKind::CrossEntropyGrad;
    std::vector<int> vocab_axes;
    if (ce) vocab_axes = strat.inputs[0].axes_of_dim(strat.inputs[0].rank() - 1);
    if (!ce || vocab_axes.empty()) {
      Instr i;
      i.kind = InstrKind::Compute;
      i.op = o;
      i.in = in;
      for (std::size_t k = 0; k < op.outputs.size(); ++k)
        i.out.push_back(phase_now_ == kU ? updated_in_place(s, op.outputs[k], strat.outputs[k])
                                         : made(s, op.outputs[k], strat.outputs[k]));
      emit(s, std::move(i));
      return;
    }
    // Vocab-parallel cross-entropy: per-token max and (Σ exp, target logit) over the whole class
    // dim by all-reduces along the axes that split it, then the local loss / gradient.
    const ShardingSpec& lg = strat.inputs[0];
    auto stat_step = [&](InstrKind kind, const std::vector<int>& ins, const ShardingSpec& spec, ReduceOp red,
                         const std::string& label) {
      int b = made(s, -1, spec, op.name + "." + label);
      Instr i;
      i.kind = kind;
      i.op = o;
      i.in = ins;
      i.out = {b};
      emit(s, std::move(i));
      for (int a : vocab_axes) {
        int nb = made(s, -1, spec, op.name + "." + label + ".reduced");
        Instr r;
        r.kind = InstrKind::AllReduce;
        r.axis = a;
        r.in = {b};
        r.out = {nb};
        r.reduce = red;
        r.internal = true;
        emit(s, std::move(r));
        b = nb;
      }
      return b;
    };
    int row_max = stat_step(InstrKind::CeRowMax, {in[0]}, stats_spec(lg, 0), ReduceOp::Max, "row_max");
    std::vector<int> st_in{in[0], in[1], row_max};
    if (ir::cross_entropy_weighted(op)) st_in.push_back(in.back());  // the class weights
    int sum_target = stat_step(InstrKind::CeSumTarget, st_in, stats_spec(lg, ir::ce_stat_width(op)),
                               ReduceOp::Sum, "sum_target");
    Instr i;
    i.kind = op.kind == ir::OpKind::CrossEntropy ? InstrKind::CeLoss : InstrKind::CeGrad;
    i.op = o;
    i.axes = vocab_axes;
    i.in = in;
    i.in.push_back(row_max);
    i.in.push_back(sum_target);
    const int out = made(s, op.outputs[0], strat.outputs[0]);
    i.out = {out};
    emit(s, std::move(i));
  }

  // The step's results: the loss (mean over micro-batches and replicas), each parameter's leaf
  // (on the stage that updates it) and its gradient.
  void results() {
    if (auto loss = g_.loss())
      p_.loss = produced(stage_of_op_[static_cast<std::size_t>(g_.tensor(*loss).producer)], *loss);
    std::map<ir::TensorId, int> updated_in;
    for (auto [out, leaf] : ir::updated_states(g_))
      updated_in[leaf] = stage_of_op_[static_cast<std::size_t>(g_.tensor(out).producer)];
    for (int s = 0; s < S_; ++s)
      for (const auto& [t, b] : st_[static_cast<std::size_t>(s)].leaves) {
        const auto& info = g_.tensor(t);
        if (info.role != ir::Role::Parameter) continue;
        auto u = updated_in.find(t);
        if (!p_.parameters.count(info.name) || (u != updated_in.end() && u->second == s))
          p_.parameters[info.name] = b;
        auto grad = g_.grad(t);
        if (!grad || g_.tensor(*grad).producer == ir::kNoOp) continue;
        const int gs = stage_of_op_[static_cast<std::size_t>(g_.tensor(*grad).producer)];
        p_.gradients[info.name] = produced(gs, *grad);
      }
  }

  // ---------- per-rank programs ----------
  // Micro-batch m's copy of a template buffer (the template buffer itself for m = 0 and for
  // buffers that live across micro-batches).
  int inst(int b, int m) {
    if (m == 0 || !per_mb_[static_cast<std::size_t>(b)]) return b;
    auto [it, fresh] = inst_.emplace(std::pair{b, m}, -1);
    if (fresh) {
      Buffer copy = p_.buffers[static_cast<std::size_t>(b)];
      copy.name += fmt::format("/m{}", m);
      p_.buffers.push_back(std::move(copy));
      template_of_[static_cast<int>(p_.buffers.size()) - 1] = b;
      specs_.push_back(specs_[static_cast<std::size_t>(b)]);
      per_mb_.push_back(1);
      it->second = static_cast<int>(p_.buffers.size()) - 1;
    }
    return it->second;
  }

  // One list per stage, shared by its ranks: the schedule's order of phases, each phase with
  // micro-batch m's buffers; a transfer runs on its one rank (on_rank), a collective on the group
  // of each rank along its axis.
  void instantiate() {
    std::set<int> keep(p_.leaf_buffers.begin(), p_.leaf_buffers.end());
    if (p_.loss >= 0) keep.insert(p_.loss);
    for (const auto& [n, b] : p_.gradients) keep.insert(b);
    p_.ranks.resize(rank_of_device_.size());
    for (int grp = 0; grp < static_cast<int>(group_mesh_.size()); ++grp) {
      std::vector<Instr> list;
      std::map<std::pair<int, int>, bool> ran;  // (stage, phase) -> ran before
      auto run_phase = [&](int s, Phase ph, int m, std::vector<Instr>* into = nullptr) {
        std::vector<Instr>& list_out = into ? *into : list;
        const auto& st = st_[static_cast<std::size_t>(s)];
        const bool first = !ran[{s, ph}];
        ran[{s, ph}] = true;
        for (const auto& t : st.tmpl[static_cast<std::size_t>(ph)]) {
          Instr i = t.i;
          for (int& b : i.in) b = inst(b, m);
          for (int& b : i.out) b = inst(b, m);
          if (t.acc_slot && !first) {
            i.kind = InstrKind::Accumulate;
            i.in = {i.out[0], i.in[0]};
          }
          if (i.kind == InstrKind::LoadInput ||
              (i.kind == InstrKind::Compute && g_.op(i.op).kind == ir::OpKind::Dropout))
            i.microbatch = m;  // a dropout's mask counts the samples of earlier micro-batches
          if (is_transfer(i.kind)) {
            i.tag = i.tag * M_ + m;
            i.on_rank = rank_of_device_.at(t.only_device);
            for (int& g : i.group) g = rank_of_device_.at(g);
          }
          list_out.push_back(std::move(i));
        }
      };
      // Recomputation, one unit (a block: full; an attention core: selective) at a time: the
      // forward instructions of a unit (without transfers and loads; only per-micro-batch results —
      // the loss accumulated over the micro-batches is made once) run again for micro-batch m right
      // before the first backward instruction of m that reads one of that unit's results. What a
      // unit reads from outside it is not re-made, so it stays held from the forward (the
      // checkpoints); add_frees frees every other forward result at its last use before its re-make.
      std::map<std::pair<int, int>, std::set<int>> replayed;  // (stage, micro-batch) -> units re-made
      auto replay_block = [&](int s, int m, int blk, std::vector<Instr>& into) {
        const auto& st = st_[static_cast<std::size_t>(s)];
        const auto& bo = in_[static_cast<std::size_t>(s)].recompute_unit;
        int cur = -1;
        for (const auto& t : st.tmpl[static_cast<std::size_t>(kF)]) {
          if (t.i.op >= 0) cur = bo[static_cast<std::size_t>(t.i.op)];
          if ((t.unit_op >= 0 ? bo[static_cast<std::size_t>(t.unit_op)] : cur) != blk) continue;
          if (is_transfer(t.i.kind) || t.i.kind == InstrKind::LoadInput || t.acc_slot) continue;
          bool per_mb = !t.i.out.empty();
          for (int b : t.i.out) per_mb = per_mb && per_mb_[static_cast<std::size_t>(b)];
          if (!per_mb) continue;
          Instr i = t.i;
          for (int& b : i.in) b = inst(b, m);
          for (int& b : i.out) b = inst(b, m);
          if (i.kind == InstrKind::Compute && g_.op(i.op).kind == ir::OpKind::Dropout) i.microbatch = m;
          into.push_back(std::move(i));
        }
      };
      // Per instruction of `list`: the run of one phase (or one re-made unit) it is in, for the
      // ZeRO-3 gathers' units (bucket_zero3_gathers).
      std::vector<int> seg;
      int next_seg = 0;
      auto mark = [&] {
        if (seg.size() < list.size()) seg.resize(list.size(), next_seg++);
      };
      for (const auto& op : sched_->device_order(grp)) {
        const Phase ph = op.kind == schedule::OpKind::F   ? kF
                         : op.kind == schedule::OpKind::B ? kB
                                                          : kW;
        const int s = op.stage, m = op.micro;
        if (ph == kF || in_[static_cast<std::size_t>(s)].recompute_unit.empty()) {
          run_phase(s, ph, m);
          mark();
          continue;
        }
        const int bw_seg = next_seg++;
        std::vector<Instr> bw;
        run_phase(s, ph, m, &bw);
        const auto& made = forward_block_of_buffer(s);
        auto& done = replayed[{s, m}];
        for (auto& i : bw) {
          for (int b : i.in) {  // b is an instance of micro-batch m (or a per-step buffer)
            auto it = made.find(template_of(b));
            if (it != made.end() && done.insert(it->second).second) {
              replay_block(s, m, it->second, list);
              mark();
            }
          }
          list.push_back(std::move(i));
          seg.push_back(bw_seg);
        }
      }
      // The group's update phases (its stages: s mod D interleaved, the V for ZB-V), merged so that
      // a recv from a rank of this group follows its send: with ZB-V the first and last stages share
      // group 0, and a tied embedding's gradient contribution and refreshed value go both ways
      // between their update phases on the same ranks.
      std::vector<std::vector<Instr>> upd;
      for (int s = 0; s < S_; ++s)
        if (group_of_stage_[static_cast<std::size_t>(s)] == grp) run_phase(s, kU, 0, &upd.emplace_back());
      std::set<int> group_ranks, sent;
      for (int d : group_mesh_[static_cast<std::size_t>(grp)].device_ids()) group_ranks.insert(rank_of_device_.at(d));
      auto ready = [&](const Instr& i) {
        return i.kind != InstrKind::Recv || !group_ranks.count(i.group.at(0)) || sent.count(i.tag);
      };
      std::vector<std::size_t> at(upd.size(), 0);
      for (bool left = true; left;) {
        left = false;
        bool moved = false;
        for (std::size_t q = 0; q < upd.size(); ++q) {
          for (; at[q] < upd[q].size() && ready(upd[q][at[q]]); ++at[q]) {
            if (upd[q][at[q]].kind == InstrKind::Send) sent.insert(upd[q][at[q]].tag);
            list.push_back(std::move(upd[q][at[q]]));
            moved = true;
          }
          left = left || at[q] < upd[q].size();
        }
        WEFT_ASSERT(!left || moved, "lowering: the update phases of a device group wait on each other");
      }
      mark();
      // Buckets (PipelineOptions::grad_bucket_bytes): ZeRO-3's gathers per unit, ZeRO-2/3's
      // per-micro-batch reduce-scatters, the replicas' gradient syncs (all-reduces; ZeRO-1's
      // reduce-scatters), ZeRO-1/2's end-of-step gathers; ids unique in the list.
      int next_bucket = 0;
      if (opt_.grad_bucket_bytes > 0) {
        std::set<int> sharded;
        for (auto [st, t] : zero_param_) sharded.insert(st_[static_cast<std::size_t>(st)].leaves.at(t));
        bucket_zero3_gathers(list, seg, sharded, [this](ir::OpId o) { return unit_of(o); }, next_bucket);
      }
      // (Both move instructions inside a run only, so `seg` still holds for the reduce-scatters.)
      bucket_zero_reduce_scatters(list, seg, opt_.grad_bucket_bytes, specs_, p_.buffers, next_bucket);
      bucket_gradient_syncs(list, opt_.grad_bucket_bytes, grad_means_, specs_, p_.buffers, next_bucket);
      bucket_zero_step_gathers(list, opt_.grad_bucket_bytes,
                               std::set<int>(p_.leaf_buffers.begin(), p_.leaf_buffers.end()), specs_,
                               p_.buffers, next_bucket);
      add_frees(list, keep);
      auto code = std::make_shared<std::vector<Instr>>(std::move(list));
      const auto& mesh = group_mesh_[static_cast<std::size_t>(grp)];
      for (int d : mesh.device_ids()) {
        RankProgram& rp = p_.ranks[static_cast<std::size_t>(rank_of_device_.at(d))];
        rp.rank = rank_of_device_.at(d);
        rp.device = d;
        rp.stage = grp;
        rp.coord = mesh.coord_of(d);
        rp.code = code;
      }
    }
  }

  // Per template buffer a stage's forward makes in a recompute unit (not received, not loaded):
  // the unit whose forward instructions make it (an instruction without an op: the unit of the
  // last op before it; -1 before any). A result read by the forward of another unit (or of no
  // unit) is a checkpoint: held from the forward, never the trigger of a re-make.
  const std::map<int, int>& forward_block_of_buffer(int s) {
    auto [it, fresh] = made_by_block_.try_emplace(s);
    if (!fresh) return it->second;
    const auto& bo = in_[static_cast<std::size_t>(s)].recompute_unit;
    int cur = -1;
    std::set<int> checkpoints;
    for (const auto& t : st_[static_cast<std::size_t>(s)].tmpl[static_cast<std::size_t>(kF)]) {
      if (t.i.op >= 0) cur = bo[static_cast<std::size_t>(t.i.op)];
      const int unit = t.unit_op >= 0 ? bo[static_cast<std::size_t>(t.unit_op)] : cur;
      for (int b : t.i.in)
        if (auto m = it->second.find(b); m != it->second.end() && m->second != unit) checkpoints.insert(b);
      if (unit < 0 || is_transfer(t.i.kind) || t.i.kind == InstrKind::LoadInput || t.acc_slot) continue;
      for (int b : t.i.out)
        if (per_mb_[static_cast<std::size_t>(b)]) it->second.emplace(b, unit);
    }
    for (int b : checkpoints) it->second.erase(b);
    return it->second;
  }
  // The FSDP unit of an op (PipelineStage::zero_unit of its stage; the op itself without units).
  long long unit_of(ir::OpId o) const {
    const int s = stage_of_op_[static_cast<std::size_t>(o)];
    const auto& zu = in_[static_cast<std::size_t>(s)].zero_unit;
    const long long u = zu.empty() ? o : zu[static_cast<std::size_t>(o)];
    return (static_cast<long long>(s) << 32) + u;
  }
  // The template buffer of a micro-batch instance (itself for micro-batch 0 and per-step buffers).
  int template_of(int b) const {
    auto it = template_of_.find(b);
    return it == template_of_.end() ? b : it->second;
  }

  static std::int64_t batch_of(const ir::Graph& g) {
    for (const auto& t : g.tensors())
      if (t.role == ir::Role::Input && t.producer == ir::kNoOp && t.rank() >= 1) return t.shape[0];
    return 0;
  }

  const ir::Graph& g_;
  const cluster::Cluster& c_;
  const std::vector<PipelineStage>& in_;
  const std::vector<CrossStageSpec>& cross_in_;
  PipelineOptions opt_;
  int S_ = 1, M_ = 1, dp_ = 1;
  bool accumulate_ = false;
  std::map<ir::OpId, spmd::AxisAssign> zero_axis_;                  // update op -> its replica-axis split
  std::map<std::pair<int, ir::TensorId>, ShardingSpec> zero_leaf_;  // (stage, state leaf) -> sharded spec
  std::map<std::pair<int, ir::TensorId>, ShardingSpec> zero_grad_;  // (stage, gradient) -> its accumulator's
  std::set<std::pair<int, ir::TensorId>> zero_param_;               // ZeRO-3: parameters stored sharded
  std::map<ir::TensorId, ir::TensorId> state_leaf_;                 // an update's new state -> its leaf
  std::set<ir::TensorId> acc_set_;  // the stage being lowered: accumulated tensors
  std::set<int> grad_means_;        // the replicas' gradient means (P on the replica axis) to all-reduce
  ir::OpId serving_ = -1;           // the op whose operands are resharded now
  std::unique_ptr<schedule::Schedule> sched_;
  std::vector<int> stage_of_op_;
  std::vector<Phase> phase_;
  std::vector<char> deferred_;                  // per op: a gradient sum run once per step (phase U)
  std::vector<std::vector<ir::OpId>> readers_;  // per tensor: the ops reading it
  Phase phase_now_ = kF;
  std::vector<StageCtx> st_;
  std::map<int, int> rank_of_device_;
  std::vector<cluster::DeviceMesh> group_mesh_;  // per device group (the program's stages)
  std::vector<int> group_of_stage_;              // per (logical) stage
  std::vector<Crossing> crossings_;
  std::vector<Transfer> transfers_;
  int next_tag_ = 0;
  Program p_;
  std::vector<ShardingSpec> specs_;  // per buffer
  std::vector<char> per_mb_;         // per buffer: one copy per micro-batch
  std::map<std::pair<int, int>, int> inst_;
  std::map<int, int> template_of_;             // micro-batch instance -> its template buffer
  std::map<int, std::map<int, int>> made_by_block_;  // per stage: forward_block_of_buffer
  std::set<std::string> names_;
};

}  // namespace

reshard::PlanOptions default_transfer_options() {
  reshard::PlanOptions o;
  o.strategy = reshard::Strategy::Broadcast;
  o.balancer = reshard::Balancer::LargestFirst;
  return o;
}

Program lower_pipeline(const ir::Graph& g, const cluster::Cluster& cluster,
                       const std::vector<PipelineStage>& stages, const std::vector<CrossStageSpec>& cross,
                       const PipelineOptions& options) {
  Program p = PipelineLowering(g, cluster, stages, cross, options).run();
  p.graph_fingerprint = ir::graph_fingerprint(p.graph);
  return p;
}

}  // namespace weft::lower
