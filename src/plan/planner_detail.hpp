#pragma once
// Internals of the planner shared by its translation units: the homogeneous search (planner.cpp
// its driver, planner_context.cpp the per-block costs, stage_dp.cpp the stage search,
// materialise.cpp plans from candidates, megatron.cpp the Megatron baselines and layout_plan,
// planner_report.cpp the text), heterogeneous clusters (hetero_planner.cpp, uneven_split.cpp),
// recomputation (recompute.cpp) and ZeRO (zero.cpp). Not installed: the public API is
// weft/plan/planner.hpp.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "weft/cluster/cluster.hpp"
#include "weft/cluster/device_mesh.hpp"
#include "weft/core/error.hpp"
#include "weft/core/stop_token.hpp"
#include "weft/ir/autodiff.hpp"
#include "weft/ir/graph.hpp"
#include "weft/pipeline/grouping.hpp"
#include "weft/pipeline/submesh.hpp"
#include "weft/plan/megatron_specs.hpp"
#include "weft/plan/plan.hpp"
#include "weft/plan/planner.hpp"
#include "weft/plan/rebatch.hpp"
#include "weft/reshard/plan.hpp"
#include "weft/sharding/reshard.hpp"
#include "weft/spmd/search.hpp"

namespace weft::plan::detail {

inline constexpr double kInf = std::numeric_limits<double>::infinity();

// The dtype of the graph's largest op (MFU and the slowest kind of a mixed mesh use its peak).
DType graph_compute_dtype(const ir::Graph& g);
// Peak FLOP/s of a device in `dt`, or in f32 when it lists no peak for `dt`.
inline double peak_or_f32(const cluster::DeviceSpec& s, DType dt) {
  return s.peak_flops.count(dt) ? s.peak(dt) : s.peak(DType::F32);
}

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

using ir::is_state_leaf;

// Peak in-flight micro-batches of a stage with `s` stages from it to the end (itself included).
inline int in_flight(const std::string& schedule, int s, int M, int k) {
  if (schedule == "gpipe") return M;
  if (schedule == "eager_1f1b") return std::min(M, 2 * s - 1);
  if (schedule == "kfkb" || schedule == "kfkb_interleaved") return std::min(M, s * std::max(1, k));
  // 1f1b, zb_h1, interleaved, zb_interleaved, zbv, dualpipev (per device in whole-stage activations,
  // approximately; materialisation charges the schedule's exact peaks)
  return std::min(M, s);
}

// ---------------------------------------------------------------- per-block SPMD costs

// SPMD search variants of a block: 0 the fastest layout (no memory limit; a block whose state
// and activations cannot fit the mesh is rejected before searching), 1 a lean one (memory limit
// the block's share of usable memory), kUnboundedVariant the fastest without the rejection (allow_infeasible layouts).
constexpr int kUnboundedVariant = 2;

// The boundary mode of a block search (block_cost's forced_dp, StageChoice::forced_dp): 0 free
// boundaries; d >= 1 agreed ones (inputs and passed-on results batch-split over d on mesh axis 0,
// replicated for d = 1); kMegatronTp Megatron's tensor parallelism on a 1-D mesh of t devices:
// replicated boundaries and every parameter (and its optimizer states) at Megatron's fixed spec
// (megatron_specs.hpp) instead of a free search.
constexpr int kMegatronTp = -1;

struct BlockCost {
  bool ok = false;
  std::string error;
  double fwd = 0, bwd = 0, wgt = 0, upd = 0;  // per micro-batch (upd: per step)
  double grad_sync = 0;                       // the part of upd that synchronises gradients
  double compute = 0, comm = 0;
  double static_mem = 0, act_mem = 0, transient = 0;
  std::vector<std::string> spec;    // per tensor of the block graph: spec text ("" = none)
  std::vector<double> local_bytes;  // per tensor of the block graph
  // Per parameter leaf of the block (tensor order): its local bytes — ZeRO's collectives are
  // bucketed by them as the lowering buckets them (zero.cpp, lower.md step 5).
  std::vector<double> param_tensor_bytes;
  // Per op of the block graph: the chosen strategy's factor and inner stride per mesh axis (what
  // a Plan's Stage::op_layouts records for lowering).
  std::vector<std::vector<spmd::AxisAssign>> axes;
  // For re-pricing an uneven split (uneven_split.cpp): the compute part of fwd/bwd/wgt/upd (the
  // rest is communication), per op the factor mesh axis 0 splits (-1: replicated on it), per
  // tensor how it counts in memory.
  double fwd_compute = 0, bwd_compute = 0, wgt_compute = 0, upd_compute = 0;
  std::vector<int> split_factor;
  enum MemClass : std::uint8_t { kNone, kParam, kOptState, kActivation };
  std::vector<std::uint8_t> mem_class;
  // Activation recomputation (recompute.cpp): per device, the forward inputs full recomputation
  // keeps (checkpoint_mem), and for selective recomputation the saved bytes it drops (sel_mem),
  // the largest one attention core's share of them (sel_peak: re-made during its backward) and
  // the forward time of the ops it runs again (sel_time, compute only).
  // full_remake: the saved results of the block's own ops (what a full recomputation re-makes
  // while the block's backward runs).
  double checkpoint_mem = 0, full_remake = 0, sel_mem = 0, sel_peak = 0, sel_time = 0;
  // Per device: the parameter bytes, their gradients' as held (in f32 under mixed precision:
  // state_bytes_factor) and the optimizer-state bytes (master copy and moments) of static_mem =
  // param_mem + grad_mem + opt_mem (ZeRO across replicas, zero.cpp).
  double param_mem = 0, grad_mem = 0, opt_mem = 0;
  // The transient split by where it peaks: at an optimizer update (its new state beside the old:
  // a shard of it under ZeRO) and anywhere else; transient = max of the two.
  double upd_excess = 0, rest_excess = 0;
};

// What a block could recompute (recompute.cpp): `checkpoint` marks the block graph's leaves a
// full recomputation keeps (activations and inputs its forward ops read); each region is one
// attention core for selective recomputation — a forward contraction of two activations, the
// same-shape forward ops after it and the contraction that reads them — with the saved tensors it
// drops (not the last contraction's result).
struct RecomputeSets {
  std::vector<char> checkpoint;  // per tensor of the block graph
  struct Region {
    std::vector<ir::OpId> ops;           // forward ops run again (the closing contraction included)
    std::vector<ir::TensorId> dropped;   // saved tensors no longer kept
  };
  std::vector<Region> regions;
};
// forward_op: per op of the block graph; saved: Context::saved_activations of the block.
RecomputeSets recompute_sets(const ir::Graph& block, const std::vector<char>& forward_op,
                             const std::vector<char>& saved);
// The modes a stage may use under the option (Auto: none, selective, full, cheapest first).
std::vector<Recompute> recompute_modes(Recompute option);

// The data-parallel replicas of a stage (zero.cpp): `replicas` copies of an n-device mesh, the
// states sharded over groups of `group` consecutive replicas (group = replicas: full sharding;
// 1 < group < replicas: hybrid), with the links of a group's ring and of the ring across groups.
struct ReplicaLinks {
  int replicas = 1, group = 1;
  cluster::AxisLink in_group, across_groups;
};
// devices: the stage's devices replica-major (replicas × n).
ReplicaLinks replica_links(const cluster::Cluster& c, const std::vector<int>& devices, int replicas,
                           int group);
// The shard groups worth trying for `replicas` copies of an n-device stage on the cluster: every
// replica (full sharding) and, with PlanOptions::hybrid_sharding, the replicas of one node when a
// node holds more than one and fewer than all.
std::vector<int> shard_groups(const cluster::Cluster& c, const PlanOptions& o, int replicas, int n);
// The ZeRO levels a stage may use under the option (-1: 0..3; else the one given; 0 with one
// replica).
std::vector<int> zero_levels(const PlanOptions& o, int replicas);

struct MeshOption {
  pipeline::SubmeshShape submesh;
  std::vector<std::int64_t> logical;  // 1-D when one axis would be 1
  cluster::DeviceMesh mesh;           // canonical placement (first nodes / first devices)
  int key = 0;                        // interned: shape + α-β of the axes + device kind
};

class Context {
 public:
  Context(const ir::Graph& g, const cluster::Cluster& c, const PlanOptions& o, double start)
      : g_(g),
        c_(c),
        opt_(o),
        start_(start),
        dtype_(graph_compute_dtype(g)),
        stop(o.stop.within(o.time_limit_s - (now_s() - start))) {}

  const ir::Graph& g_;
  const cluster::Cluster& c_;
  const PlanOptions& opt_;
  double start_;
  DType dtype_;              // graph_compute_dtype(g_)
  double usable_memory = 0;  // min over the cluster's devices (homogeneous: every device's)
  // Usable bytes of one device (PlanOptions::memory_limit or its own memory, × memory_fraction),
  // and of a mesh (its smallest device): heterogeneous clusters have one per device kind.
  double usable_of_device(int id) const { return plan::usable_memory(opt_, c_.device(id).spec); }
  // How the usable memory of the tightest device came about (messages: "usable X = (C − R
  // reserve) × f").
  std::string usable_text() const;
  double usable(const cluster::DeviceMesh& m) const {
    double u = kInf;
    for (int d : m.device_ids()) u = std::min(u, usable_of_device(d));
    return u;
  }
  int M = 1;
  std::vector<pipeline::OpPhase> phase;
  std::vector<char> weight_grad_op;  // backward op producing a parameter's gradient
  pipeline::LayerGrouping grouping;
  int layers = 0;               // > 0: the blocks are the model's repeated layers (init_blocks' layer_blocks)
  std::vector<int> block_cuts;  // init_blocks' cuts (Plan::block_cuts)
  pipeline::RepeatedLayers repeated;  // the model's, where init_layout_blocks found them (messages)
  std::int64_t global_batch = 1;
  struct AtBatch {
    std::vector<pipeline::StageGraph> blocks;
    std::vector<int> keys;  // interned block structures
    // Per block: Σ full bytes of the tensors it saves for the backward (one micro-batch) under
    // the recomputation mode that keeps the fewest (saved_activation_bytes); / devices it bounds
    // BlockCost::act_mem (or what a recomputation keeps of it) from below.
    std::vector<double> act_bytes;
    std::vector<double> act_bytes_kept;  // the same without recomputation (the SPMD search's view)
    // Per block, for the relaxed stage bound: the saved bytes under selective / full
    // recomputation, and the FLOPs each re-runs (the attention cores; the whole forward).
    std::vector<double> act_bytes_sel, act_bytes_ckpt, sel_flops, fwd_flops;
    // block_key under kMegatronTp per (the block's first original op, mesh key): stable when
    // reorder_blocks renumbers the blocks.
    mutable std::map<std::pair<ir::OpId, int>, int> megatron_keys;
  };
  std::map<std::int64_t, AtBatch> at_batch;  // per micro-batch size (per replica)
  // Why the graph cannot run at a micro-batch size (plan::rebatch_obstacle; empty: it can). A
  // batch that lives in a Constant leaf (per-sample values) cannot be cut: such a graph keeps its
  // batch whole (M = d = 1), and the plan's search_space says why.
  std::map<std::int64_t, std::string> rebatch_notes;
  const std::string& rebatch_note(std::int64_t bs) {
    auto it = rebatch_notes.find(bs);
    if (it == rebatch_notes.end())
      it = rebatch_notes.emplace(bs, bs == batch_size(g_) ? std::string() : rebatch_obstacle(g_, bs)).first;
    return it->second;
  }
  std::vector<double> block_state_bytes;     // Σ full bytes of params, their grads as held + states
  std::vector<double> block_param_bytes;     // Σ full bytes of params
  std::vector<double> block_grad_bytes;      // Σ full bytes of their gradients as held (state_bytes_factor)
  std::vector<int> original_block;           // per block: its index in the grouping's own order
  // (block_key, mesh, variant, forced)
  std::map<std::tuple<int, int, int, int>, BlockCost> cache;
  std::unordered_map<std::string, int> interned;
  int intern(const std::string& k) {
    return interned.emplace(k, static_cast<int>(interned.size())).first->second;
  }
  int spmd_solves = 0;
  double spmd_seconds = 0;
  // The caches one SPMD search of a block writes: resharding times (the same spec pairs recur
  // across blocks, variants, boundary modes and meshes with equal links) and resharding planners
  // per (mesh key, element size). The Context's own serve the planning thread; each worker of a
  // parallel prefetch has its own (the values are deterministic, so results do not depend on
  // which cache priced them).
  struct SearchScratch {
    std::shared_ptr<spmd::ReshardCache> reshard_cache = spmd::make_reshard_cache();
    std::map<std::pair<int, int>, sharding::ReshardPlanner> reshard_planners;  // (mesh key, elem)
  };
  SearchScratch scratch;
  // The planning deadline (time_limit_s from the start, and the caller's PlanOptions::stop) and
  // whether it cut the search short (Plan::search_status).
  StopToken stop;
  mutable bool timed_out = false;

  // Tensors made in one block and read in another (the producer's and the consumer's SPMD plans
  // choose their layouts independently): a stage holding both pays the resharding between them.
  struct Crossing {
    ir::TensorId tensor;
    ir::OpId producer;
    ir::OpId consumer;  // one reader per consuming block
  };
  // Built by init_blocks; blocks are looked up through grouping.block_of_op at use, so the list
  // stays valid when reorder_blocks renumbers the blocks.
  std::vector<Crossing> crossings;
  // Resharding inside one stage of blocks first..last on mesh m (every block with the same variant
  // and forced_dp): per phase of the producing op, seconds per micro-batch (update: per step).
  struct InternalReshard {
    double fwd = 0, bwd = 0, upd = 0;
  };
  InternalReshard internal_reshard(int first, int last, std::int64_t bs, const MeshOption& m, int variant,
                                   int forced_dp);
  double crossing_time(const Crossing& x, std::int64_t bs, const MeshOption& m, int variant, int forced_dp);
  struct CrossingTable {
    std::vector<int> order;    // crossing indices by lower block
    std::vector<double> time;  // per position of order, seconds (< 0: not priced yet)
    std::vector<int> start;    // per block b: first position whose lower block is >= b
  };
  std::map<std::tuple<std::int64_t, int, int, int>, CrossingTable>
      crossing_tables;                                        // (bs, mesh, variant, forced)
  std::map<std::vector<std::int64_t>, double> crossing_cost;  // structural key -> seconds
  // The resharding planner of a mesh (interned mesh_key: its shape, kinds and links) and an
  // element size, strided intermediates off as in the SPMD search; kept for the whole run.
  sharding::ReshardPlanner& reshard_planner(int mesh_key, const cluster::DeviceMesh& mesh, int elem) {
    return reshard_planner_in(scratch, mesh_key, mesh, elem);
  }
  sharding::ReshardPlanner& reshard_planner_in(SearchScratch& sc, int mesh_key,
                                               const cluster::DeviceMesh& mesh, int elem) const;

  int L() const { return static_cast<int>(grouping.blocks.size()); }

  // Megatron's roles and fixed specs of the graph on t devices (megatron_specs), made on the
  // planning thread (megatron_for) before any search of the parallel prefetch reads them.
  std::map<int, MegatronSpecs> megatron;
  const MegatronSpecs& megatron_for(int t) {
    auto it = megatron.find(t);
    if (it == megatron.end()) it = megatron.emplace(t, megatron_specs(g_, t, opt_.sequence_parallel)).first;
    return it->second;
  }
  // The boundary mode of Megatron's t-device stages: kMegatronTp where the graph has Megatron
  // roles and t > 1, else replicated boundaries with a free search (1).
  int megatron_mode(int t) { return t > 1 && megatron_for(t).recognised ? kMegatronTp : 1; }
  // The fixed specs of block b's graph (its tensors' names) under kMegatronTp on m.
  std::map<std::string, std::string> megatron_fixed(const pipeline::StageGraph& sg,
                                                    const MeshOption& m) const;
  // The structure part of the block-cost cache key: the block's interned structure, or under
  // kMegatronTp its structure with its fixed specs (identical layers may be forced differently).
  int block_key(const AtBatch& ab, int b, const MeshOption& m, int forced_dp) {
    if (forced_dp != kMegatronTp) return ab.keys[b];
    (void)megatron_for(static_cast<int>(m.mesh.size()));
    const auto& sg = ab.blocks[b];
    const auto memo = std::make_pair(sg.original_op.empty() ? -1 : sg.original_op.front(), m.key);
    auto it = ab.megatron_keys.find(memo);
    if (it != ab.megatron_keys.end()) return it->second;
    std::string k = fmt::format("megatron|{}|", ab.keys[b]);
    for (const auto& [name, spec] : megatron_fixed(sg, m))
      k += fmt::format("{}={};", *sg.graph.find_tensor(name), spec);
    return ab.megatron_keys.emplace(memo, intern(k)).first->second;
  }

  // Renumbers the blocks: new block i is old block order[i] (a permutation that keeps every
  // forward edge from a lower to a higher block; the stage ILP's orders do). Block costs are
  // cached by structure, so no SPMD search is repeated; LayerGrouping::crossing_bytes is not
  // maintained (the planner does not read it).
  void reorder_blocks(const std::vector<int>& order);

  // True once the planning deadline has passed (the search then wraps up with what it has: no new
  // SPMD search, no more candidates simulated, the best plan so far marked "timeout"); throws
  // weft::Cancelled when the caller cancelled.
  bool out_of_time() const {
    stop.throw_if_cancelled("make_plan");
    if (!stop.expired()) return false;
    timed_out = true;
    return true;
  }
  // Past the deadline by half the limit plus 0.5 s: a plan must be returned now or never
  // (the limit's contract: within 1.5 × time_limit_s + 0.5 s).
  bool past_grace() const { return now_s() - start_ > 1.5 * opt_.time_limit_s + 0.5; }
  void progress(const std::string& phase_name, double f, const std::string& msg) const {
    if (opt_.progress) opt_.progress({phase_name, std::clamp(f, 0.0, 1.0), msg});
  }

  // The blocks: num_blocks cut anywhere (pipeline::group_layers), or at the given cuts of the
  // forward order only; `layer_blocks`: the blocks are the model's repeated layers, one each
  // (Context::layers then counts them; errors and splits speak of layers).
  void init_blocks(int num_blocks, const std::vector<int>& cuts = {}, bool layer_blocks = false) {
    layers = layer_blocks ? num_blocks : 0;
    block_cuts = cuts;
    phase = pipeline::classify_ops(g_);
    weight_grad_op.assign(g_.ops().size(), 0);
    for (ir::OpId o = 0; o < static_cast<ir::OpId>(g_.ops().size()); ++o) {
      if (phase[o] != pipeline::OpPhase::Backward) continue;
      for (ir::TensorId t : g_.op(o).outputs) {
        auto of = g_.grad_of(t);
        if (of && g_.tensor(*of).role == ir::Role::Parameter && g_.tensor(*of).producer == ir::kNoOp)
          weight_grad_op[o] = 1;
      }
    }
    grouping = pipeline::group_layers(g_, num_blocks, cuts);
    crossings.clear();
    for (ir::TensorId t = 0; t < static_cast<ir::TensorId>(g_.tensors().size()); ++t) {
      const ir::OpId p = g_.tensor(t).producer;
      if (p == ir::kNoOp || grouping.block_of_op[p] < 0) continue;
      std::set<int> seen;
      for (ir::OpId c : g_.consumers(t)) {
        const int b = grouping.block_of_op[c];
        if (b >= 0 && b != grouping.block_of_op[p] && seen.insert(b).second) crossings.push_back({t, p, c});
      }
    }
    global_batch = batch_size(g_);
    block_state_bytes.clear();
    block_param_bytes.clear();
    block_grad_bytes.clear();
    original_block.assign(grouping.blocks.size(), 0);
    for (std::size_t b = 0; b < original_block.size(); ++b) original_block[b] = static_cast<int>(b);
    const auto& ab = blocks_at(global_batch);
    for (const auto& bg : ab.blocks) {
      double sb = 0, pb = 0, gb = 0;
      for (ir::TensorId i = 0; i < static_cast<ir::TensorId>(bg.graph.tensors().size()); ++i) {
        const auto& t = bg.graph.tensor(i);
        const double factor = state_bytes_factor(bg.graph, i);
        sb += static_cast<double>(t.bytes()) * factor;
        if (is_state_leaf(t) && t.role == ir::Role::Parameter) {
          pb += static_cast<double>(t.bytes());
          gb += static_cast<double>(t.bytes()) * (factor - 1);
        }
      }
      block_state_bytes.push_back(sb);
      block_param_bytes.push_back(pb);
      block_grad_bytes.push_back(gb);
    }
  }

  // The blocks' graphs at a micro-batch size (op ids of a rebatched graph equal the original's,
  // so the grouping applies unchanged).
  const AtBatch& blocks_at(std::int64_t bs) {
    auto it = at_batch.find(bs);
    if (it != at_batch.end()) return it->second;
    AtBatch ab;
    const ir::Graph gb = bs == batch_size(g_) ? g_ : rebatch(g_, bs);
    for (const auto& b : grouping.blocks) {
      ab.blocks.push_back(pipeline::extract_stage_mapped(gb, b.ops));
      ab.keys.push_back(intern(structure_key(ab.blocks.back().graph)));
      ab.act_bytes.push_back(saved_activation_bytes(ab.blocks.back(), opt_.recompute));
      ab.act_bytes_kept.push_back(saved_activation_bytes(ab.blocks.back(), Recompute::None));
      ab.act_bytes_sel.push_back(saved_activation_bytes(ab.blocks.back(), Recompute::Selective));
      ab.act_bytes_ckpt.push_back(saved_activation_bytes(ab.blocks.back(), Recompute::Full));
      const auto& sg = ab.blocks.back();
      const auto fwd = forward_ops(sg);
      double ff = 0, sf = 0;
      for (std::size_t o = 0; o < fwd.size(); ++o)
        if (fwd[o]) ff += sg.graph.op(static_cast<ir::OpId>(o)).flops();
      for (const auto& r : recompute_sets(sg.graph, fwd, saved_activations(sg)).regions)
        for (ir::OpId o : r.ops) sf += sg.graph.op(o).flops();
      ab.fwd_flops.push_back(ff);
      ab.sel_flops.push_back(sf);
    }
    return at_batch.emplace(bs, std::move(ab)).first->second;
  }

  // Whether tensor t of a block graph is a saved activation: read by a backward op and a forward
  // result, a boundary activation or an input (what search_block counts in BlockCost::act_mem).
  std::vector<char> saved_activations(const pipeline::StageGraph& sg) const {
    const ir::Graph& bg = sg.graph;
    const int nt = static_cast<int>(bg.tensors().size());
    std::vector<char> read_by_bwd(nt, 0), saved(nt, 0);
    for (ir::OpId o = 0; o < static_cast<ir::OpId>(bg.ops().size()); ++o)
      if (phase[sg.original_op[o]] == pipeline::OpPhase::Backward)
        for (ir::TensorId t : bg.op(o).inputs) read_by_bwd[t] = 1;
    for (int t = 0; t < nt; ++t) {
      const auto& info = bg.tensor(t);
      if (!read_by_bwd[t] || is_state_leaf(info)) continue;
      const bool fwd_result =
          info.producer != ir::kNoOp && phase[sg.original_op[info.producer]] == pipeline::OpPhase::Forward;
      const bool boundary_act = info.producer == ir::kNoOp && info.role == ir::Role::Activation;
      const bool input = info.producer == ir::kNoOp && info.role == ir::Role::Input;
      saved[t] = fwd_result || boundary_act || input;
    }
    return saved;
  }
  // The lower bound on what blocks first..last hold in all (full bytes, before any sharding):
  // parameter state plus `inflight` micro-batches of saved activations. Over n devices no layout
  // stores less than this / n per device (the memory bound of the defaults, plan.md).
  // kept = true: the activations without recomputation (what an SPMD search's peak holds).
  // replicas: the stage's data-parallel replicas, over which the ZeRO levels PlanOptions::zero
  // allows may shard the state (zero.hpp; the bound takes the level that keeps the least).
  double min_bytes(const AtBatch& ab, int first, int last, int inflight, bool kept = false,
                   int replicas = 1) const {
    double s = 0;
    for (int b = first; b <= last; ++b)
      s += state_bound(b, replicas) + inflight * (kept ? ab.act_bytes_kept[b] : ab.act_bytes[b]);
    return s;
  }
  double state_bound(int b, int replicas) const {
    if (replicas <= 1) return block_state_bytes[b];
    const double P = block_param_bytes[b], G = block_grad_bytes[b], O = block_state_bytes[b] - P - G;
    double best = block_state_bytes[b];
    for (int level : zero_levels(opt_, replicas))
      best = std::min(best, zero_memory(level, P, O, replicas, 0, 25e6, G).state());
    return best;
  }
  // Links of the replicas of an n-device stage at a canonical placement (replica r on devices
  // r·n .. r·n + n − 1: the first nodes), for the stage DP, where placement is not known yet;
  // materialise prices the placed devices.
  const ReplicaLinks& canonical_replica_links(int n, int replicas, int group) {
    auto key = std::make_tuple(n, replicas, group);
    auto it = replica_link_cache.find(key);
    if (it != replica_link_cache.end()) return it->second;
    std::vector<int> ids(static_cast<std::size_t>(n) * replicas);
    for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int>(i);
    return replica_link_cache.emplace(key, replica_links(c_, ids, replicas, group)).first->second;
  }
  std::map<std::tuple<int, int, int>, ReplicaLinks> replica_link_cache;
  std::vector<char> forward_ops(const pipeline::StageGraph& sg) const {
    std::vector<char> fwd(sg.graph.ops().size(), 0);
    for (std::size_t o = 0; o < fwd.size(); ++o)
      fwd[o] = phase[sg.original_op[o]] == pipeline::OpPhase::Forward;
    return fwd;
  }
  // The fewest saved-activation bytes (full sizes) the block keeps per in-flight micro-batch under
  // the recomputation modes `option` allows.
  double saved_activation_bytes(const pipeline::StageGraph& sg, Recompute option) const {
    const auto saved = saved_activations(sg);
    const RecomputeSets sets = recompute_sets(sg.graph, forward_ops(sg), saved);
    auto bytes = [&](std::size_t t) {
      return static_cast<double>(sg.graph.tensor(static_cast<ir::TensorId>(t)).bytes());
    };
    double kept = 0, checkpoints = 0, dropped = 0;
    for (std::size_t t = 0; t < saved.size(); ++t) {
      if (saved[t]) kept += bytes(t);
      if (sets.checkpoint[t]) checkpoints += bytes(t);
    }
    for (const auto& r : sets.regions)
      for (ir::TensorId t : r.dropped) dropped += bytes(static_cast<std::size_t>(t));
    double least = kInf;
    for (Recompute m : recompute_modes(option))
      least = std::min(least, m == Recompute::Full ? checkpoints : m == Recompute::Selective ? kept - dropped : kept);
    return least;
  }

  // Structure of a block graph without names: kinds, attributes, shapes, dtypes, roles, wiring.
  static std::string structure_key(const ir::Graph& bg) {
    std::string k;
    k.reserve(bg.ops().size() * 64);
    for (const auto& t : bg.tensors())
      k += fmt::format("t{}:{}:{}:{};", fmt::join(t.shape, ","), dtype_name(t.dtype), ir::role_name(t.role),
                       t.producer);
    for (const auto& op : bg.ops()) {
      const auto& a = op.attrs;
      k += fmt::format("o{}|{}|{}|{}|{}|{}|{}|{}|{}|{}>{};", ir::op_kind_name(op.kind), a.equation,
                       static_cast<int>(a.unary), static_cast<int>(a.binary), static_cast<int>(a.reduce),
                       fmt::join(a.axes, ","), fmt::join(a.ints, ","), a.scalar, fmt::join(a.scalars, ","),
                       fmt::join(op.inputs, ","), fmt::join(op.outputs, ","));
    }
    for (auto t : bg.outputs()) k += fmt::format("out{};", t);
    if (bg.loss()) k += fmt::format("loss{};", *bg.loss());
    return k;
  }

  int mesh_key(const cluster::DeviceMesh& mesh) { return intern("mesh|" + mesh_text_key(mesh)); }
  // The device the SPMD search prices a mesh's ops on: its kind, or on a mesh mixing kinds (an
  // uneven split, re-priced per device afterwards) the kind with the lowest peak FLOP/s.
  const cluster::DeviceSpec& mesh_spec(const cluster::DeviceMesh& mesh) const {
    const cluster::DeviceSpec* best = &c_.device(mesh.device_ids()[0]).spec;
    for (int id : mesh.device_ids()) {
      const auto& s = c_.device(id).spec;
      if (peak_or_f32(s, dtype_) < peak_or_f32(*best, dtype_)) best = &s;
    }
    return *best;
  }
  bool mixed(const cluster::DeviceMesh& mesh) const {
    for (int id : mesh.device_ids())
      if (c_.device(id).spec.kind != c_.device(mesh.device_ids()[0]).spec.kind) return true;
    return false;
  }
  std::string mesh_text_key(const cluster::DeviceMesh& mesh) const {
    std::string kinds = c_.device(mesh.device_ids()[0]).spec.kind;
    if (mixed(mesh))
      for (int id : mesh.device_ids()) kinds += "," + c_.device(id).spec.kind;
    std::string k = fmt::format("{}|{}|", fmt::join(mesh.shape(), "x"), kinds);
    for (const auto& l : cluster::axis_links(c_, mesh))
      k += fmt::format("{:.6g},{:.6g},{:.6g},{:.6g},{},{};", l.intra_alpha, l.intra_beta, l.inter_alpha,
                       l.inter_beta, l.devices_per_node_on_axis, l.nodes_on_axis);
    return k;
  }

  // variant 0: fastest; 1: lean (memory limit: the block's share of usable memory). forced_dp > 1: the inputs
  // and boundary tensors are forced batch-sharded on mesh axis 0 (Megatron-style data parallel).
  const BlockCost& block_cost(int b, std::int64_t bs, const MeshOption& m, int variant, int forced_dp = 0);
  // The SPMD search of block b at the batch of `ab` on mesh m (what block_cost caches): reads the
  // Context, writes only `sc` — so prefetch_block_costs can run many at once.
  BlockCost search_block(int b, const AtBatch& ab, const MeshOption& m, int variant, int forced_dp,
                         SearchScratch& sc) const;
  // Fills the cache for every request not in it yet, the SPMD searches spread over
  // PlanOptions::threads threads (each search is a pure function of its block and mesh, so the
  // cache — and the plan — is the same for any thread count). Stops early at the deadline.
  struct BlockRequest {
    int block = 0;
    std::int64_t bs = 1;
    const MeshOption* mesh = nullptr;
    int variant = 0;
    int forced_dp = 0;
  };
  void prefetch_block_costs(const std::vector<BlockRequest>& requests);
  int num_threads() const;
};

struct SubmeshOptions {
  pipeline::SubmeshShape shape;
  std::vector<MeshOption> meshes;
};

struct StageChoice {
  int first = 0, last = 0;
  int submesh = 0;  // index into the submesh options
  int mesh = 0;     // index into its meshes
  int variant = 0;
  int forced_dp = 0;
  double time = 0;  // F + B per micro-batch
  double memory = 0;
  Recompute recompute = Recompute::None;
  int zero = 0, zero_group = 1;    // ZeRO level across the replicas, replicas per shard group
  std::vector<int> recompute_set;  // Full on these blocks only (offsets; recomputed_per_block); empty = all
  std::vector<int> zero3_set;      // ZeRO-3 on these blocks only, `zero` on the rest (with_mixed_zero)
  std::vector<int> selective_set;  // Selective on these blocks (offsets; recomputed_per_block)
};

struct Candidate {
  std::string strategy;
  int M = 1;            // micro-batches
  int dp = 1;           // replicas of the pipeline
  std::int64_t bs = 1;  // samples per micro-batch per replica
  std::vector<StageChoice> stages;
  // Explicit placement (baselines): per stage all devices (replica-major) and the per-replica mesh.
  std::vector<std::vector<int>> devices;
  std::vector<MeshOption> meshes;
  double proxy = 0;              // Σ t + (M − 1) max t
  std::vector<int> block_order;  // blocks renumbered by a stage-ILP order (empty: the grouping's)
};

// A stage's parameter tensors in the order of the parameters (their bytes), with the greedy bucket
// counts the ZeRO / data-parallel pricing asks for (zero.cpp's bucketed): the same few questions
// are asked for every level and placement of the stage, so each answer is kept (the object lives
// in one search thread: the aggregate that made it and its copies).
struct ParamTensors {
  std::vector<double> bytes;
  double sum = 0;
  // Greedy buckets of at least `cap` bytes over the tensors scaled by k, in order or reversed.
  int buckets(double k, double cap, bool reverse) const;

 private:
  struct Count {
    double k, cap;
    bool reverse;
    int n;
  };
  mutable std::vector<Count> counts_;
};

struct StageAgg {
  bool ok = false;
  std::string error;
  double fwd = 0, bwd = 0, wgt = 0, upd = 0, compute = 0, comm = 0, grad_sync = 0;
  double static_mem = 0, act_mem = 0, transient = 0;
  double between_blocks = 0;  // the resharding between the stage's blocks (included above)
  // For recomputed(): Σ of the blocks' forward compute, checkpoint and selective figures, and the
  // peak transient while one block (full) or one attention core (selective) is re-made.
  double fwd_compute = 0, checkpoint_mem = 0, sel_mem = 0, sel_time = 0;
  double full_transient = 0, sel_transient = 0;
  Recompute recompute = Recompute::None;
  // For with_replicas(): Σ of the blocks' parameter and optimizer-state bytes, the largest block's
  // parameter bytes (ZeRO-3's gathered working set and overlap unit) and the update's compute.
  double param_mem = 0, grad_mem = 0, opt_mem = 0, max_block_param = 0, upd_compute = 0;
  double upd_excess = 0, rest_excess = 0;  // the blocks' largest (BlockCost)
  int zero = 0, zero_group = 1;  // ZeRO level across the replicas, replicas per shard group
  ReplicaComm replica;           // with_replicas(): the collectives above, for the simulator's streams
  // Per block of the stage (first..last), for full recomputation of some blocks only
  // (recomputed_blocks): its saved activations, what full recomputation keeps of them, its forward
  // time (compute part apart) and its transient while it is re-made.
  std::vector<double> blk_act, blk_ckpt, blk_fwd, blk_fwd_compute, blk_remake;
  // Per block, for selective recomputation of some blocks only (recomputed_per_block): the saved
  // bytes its attention cores drop, their forward time (compute) and its transient while one of
  // them is re-made (BlockCost's transient + sel_peak).
  std::vector<double> blk_sel_mem, blk_sel_time, blk_sel_remake;
  std::vector<double> blk_param;   // per block: its parameter bytes (ZeRO-3 on some blocks only)
  // The blocks' parameter leaves' bytes (BlockCost::param_tensor_bytes), shared: with_replicas
  // copies a stage's aggregate for every level and placement it prices.
  std::shared_ptr<const ParamTensors> param_tensors;
  std::vector<int> recompute_set;  // Full on these blocks only (offsets from the first); empty = every block
  std::vector<int> zero3_set;      // ZeRO-3 on these blocks, `zero` on the others (offsets); empty = none
  std::vector<int> selective_set;  // Selective on these blocks only (offsets), with recompute_set or alone
};
// The stage under a recomputation mode (None: unchanged): Full adds one forward of the stage to
// the backward (its compute and its collectives) and keeps only the checkpoints; Selective adds
// the attention cores' forward compute and drops their saved results.
StageAgg recomputed(const StageAgg& a, Recompute mode);
// A mode per block (offsets from the stage's first block; disjoint sets, not both empty): `full`
// keep only their checkpoints and re-make their forward in the backward (Megatron's "block"
// method), `selective` drop their attention cores' saved results and re-make those cores, the
// others keep their activations. Exact sums of the blocks' figures: B grows by the full blocks'
// forward and the selective blocks' cores' forward, the saved bytes drop by theirs; the transient
// is the largest re-make above one micro-batch's share (the blocks behind the re-made one have
// freed theirs). recompute is Full when any block is, else Selective.
StageAgg recomputed_per_block(const StageAgg& a, std::vector<int> full, std::vector<int> selective);
// Full on some blocks only (`set` a proper subset), the others none.
StageAgg recomputed_blocks(const StageAgg& a, std::vector<int> set);
// The blocks in the order the planner adds them to the set: the most peak bytes saved first with
// `inflight` micro-batches in flight (their activations less their checkpoints, less the transient
// their re-make adds), then the cheaper forward. The planner takes the shortest prefix that fits.
std::vector<int> recompute_order(const StageAgg& a, int inflight);
// The blocks with attention cores in the order the planner makes them selective (a heuristic): the
// most peak bytes saved per second of re-made forward first, each priced alone (with `inflight`
// micro-batches in flight: its dropped bytes less what its re-make adds to the transient), then
// the lower offset.
std::vector<int> selective_order(const StageAgg& a, int inflight);

// The stage (one replica's costs, after recomputed()) with its replicas: the gradient
// synchronisation across them and, at ZeRO `level` over l.group replicas, the sharded states
// (static memory, working set) and the collectives that move them, overlapped with the compute
// they serve (PlanOptions::overlap_grad_sync). upd then holds the exposed synchronisation;
// grad_bytes: the stage's gradient bytes per device (its distinct parameters).
StageAgg with_replicas(const StageAgg& a, int level, const ReplicaLinks& l, double grad_bytes,
                       const PlanOptions& o);
// Per-block levels: ZeRO-3 on the blocks of `set3` (offsets from the stage's first block), `base`
// (1 or 2) on the others. Each cost is the two uniform levels' mixed by the set's share f of the
// stage's parameter bytes — state, traffic and exposed collectives follow the parameters:
// x = x(base) + f·(x(3) − x(base)) — and the working set is the larger of base's and ZeRO-3's
// for the set's largest block.
StageAgg with_mixed_zero(const StageAgg& a, int base, const std::vector<int>& set3, const ReplicaLinks& l,
                         double grad_bytes, const PlanOptions& o);
// The blocks in the order the planner moves them to ZeRO-3: the most parameter bytes first (the
// most state saved per block; an embedding or LM head before the layers), then the lower offset.
std::vector<int> zero3_order(const StageAgg& a);

struct Built {
  Plan plan;
  bool feasible = false;
  std::string note;
};

std::vector<std::int64_t> canonical_logical(std::vector<std::int64_t> s);
// The logical meshes of a submesh on the given devices (1-D, and 2-D with the minor axis inside a
// node when PlanOptions::two_d_meshes), in the order the search tries them.
std::vector<MeshOption> meshes_on(Context& ctx, const pipeline::SubmeshShape& s, const std::vector<int>& ids);
// Up to this many nodes every whole-node count is a submesh; beyond, the counts that are a power
// of two or divide the node count (PlanOptions::all_node_counts).
inline constexpr int kAllNodeCountsUpTo = 8;
std::vector<SubmeshOptions> make_mesh_options(Context& ctx);
StageAgg aggregate(Context& ctx, int first, int last, std::int64_t bs, const MeshOption& m, int variant,
                   int forced_dp);
double stage_memory(const StageAgg& a, int inflight);
// Best (mesh, variant, boundary mode) of a stage among `meshes` (one submesh's logical meshes)
// for a given in-flight count, by its share of a step of M micro-batches, M·(F + B) + update
// (StageChoice::time stays F + B per micro-batch); nullopt when nothing fits.
// StageChoice::submesh = `sub`, ::mesh = index in meshes.
// replicas: the stage's data-parallel replicas (their gradient synchronisation and the ZeRO levels
// PlanOptions::zero allows, StageChoice::zero; priced at the canonical placement).
std::optional<StageChoice> best_stage(Context& ctx, const std::vector<MeshOption>& meshes, int first,
                                      int last, int sub, std::int64_t bs, int M, int inflight,
                                      int forced_dp = 0, std::string* why = nullptr, int replicas = 1);
// The stage DP shared by the homogeneous and the heterogeneous searches (the math is at the top of
// planner.cpp). Positions 0..positions: a stage placed at `pos` with option q takes width[q]
// positions (homogeneous: device units of a submesh, usable anywhere; heterogeneous: devices of
// the kind order, the placements that start there). For every bound t_max on the stage time (the
// distinct stage costs on a 2% geometric grid, at most 64)
//     G(s, k, pos) = min_{j >= k, q open at pos, t(s, k, j, q) <= t_max} t(s, k, j, q) + G(s − 1, j + 1, pos
//     + width[q])
// with G(0, L, pos) = 0 at pos = positions (or at every pos >= 1 with end_anywhere); the best
// Σ t + (M − 1)·t_max per stage count s = 1..S_max is returned with its stages.
struct StageDpInput {
  int L = 0, S_max = 1, positions = 0, M = 1;
  std::vector<std::vector<int>> options_at;  // per position: the options that may start there
  std::vector<int> width;                    // per option
  bool end_anywhere = false;                 // false: the stages use every position
  // Blocks k..j on option q as a stage with s stages from it to the end; nullptr = does not fit.
  // Called once per (s, k, j, q) the DP can use; the pointee must outlive the returned paths.
  std::function<const StageChoice*(int s, int k, int j, int q)> cost;
  std::string what;  // for progress messages
};
struct StageDpPath {
  struct Step {
    int first = 0, last = 0, option = 0;
    const StageChoice* choice = nullptr;
  };
  double proxy = 0;  // Σ t + (M − 1)·t_max
  std::vector<Step> stages;
};
std::vector<std::optional<StageDpPath>> stage_dp(Context& ctx, const StageDpInput& in);  // index = s
// Σ t + (M − 1)·max t over the stages: the pipeline latency proxy candidates are ranked by.
double pipeline_proxy(const std::vector<StageChoice>& stages, int M);
// The candidate of a DP path (its stages' choices; placement left to the caller).
Candidate candidate_of(const StageDpPath& path, std::string strategy, int M, int dp, std::int64_t bs);
std::vector<std::pair<int, int>> balanced_split(const pipeline::LayerGrouping& gr, int p);
Built materialise(Context& ctx, const std::vector<SubmeshOptions>& subs, const Candidate& cand,
                  reshard::Balancer balancer);
// Applies a block order for the lifetime of the scope (restored on exit, exceptions included).
class BlockOrderScope {
 public:
  BlockOrderScope(Context& ctx, const std::vector<int>& order) : ctx_(ctx), inverse_(order.size()) {
    for (std::size_t i = 0; i < order.size(); ++i)
      inverse_[static_cast<std::size_t>(order[i])] = static_cast<int>(i);
    if (!order.empty()) ctx_.reorder_blocks(order);
  }
  ~BlockOrderScope() {
    if (!inverse_.empty()) ctx_.reorder_blocks(inverse_);
  }
  BlockOrderScope(const BlockOrderScope&) = delete;
  BlockOrderScope& operator=(const BlockOrderScope&) = delete;

 private:
  Context& ctx_;
  std::vector<int> inverse_;
};
// Block orders from Rhino's stage ILP (pipeline::partition_dag_ilp on the DAG of the blocks' forward
// activations, one solve per stage count 2..max_stages): blocks sorted by (ILP stage,
// index), the orders that differ from the grouping's. Empty for a chain of blocks.
std::vector<std::vector<int>> ilp_block_orders(Context& ctx, int max_stages);
std::string layout_text(const Plan& p);
Alternative alternative_of(const Built& b);
// Best first, each layout once, at most max_n rows (0: all); with summarise_infeasible the
// candidates that do not fit become one last row ("infeasible", "N candidates", counts per reason).
void sort_alternatives(std::vector<Alternative>& alts, int max_n, bool summarise_infeasible = true);
// layout_evaluation: megatron_plan / layout_plan (with allow_infeasible the total-memory check is skipped).
Context make_context(const ir::Graph& g, const cluster::Cluster& c, const PlanOptions& o, double start,
                     bool layout_evaluation = false);
// make_context + blocks for the plans of given per-device shares (data_parallel_plan, split_plan):
// checks that M divides the batch and that there is one share per device.
Context given_shares_context(const ir::Graph& g, const cluster::Cluster& c, const PlanOptions& o,
                             double start, int M, std::size_t shares, const char* who, const char* what);
int auto_blocks(const ir::Graph& g, const PlanOptions& o);
// The blocks of a layout evaluation that asks for a pipeline depth (megatron_plan): the given
// num_blocks, else one block per repeated layer (pipeline::repeated_layers), so that every depth
// dividing the layer count splits the layers equally; a model without repeated layers that make
// at least half of its forward ops, or a depth beyond them, gets auto_blocks.
void init_layout_blocks(Context& ctx, const PlanOptions& o, int depth);
std::vector<int> microbatch_counts(const PlanOptions& o, std::int64_t B);
// Replica counts a step of M micro-batches of per_mb samples can use (PlanOptions limits).
std::vector<int> dp_degrees(const PlanOptions& o, const cluster::Cluster& c, std::int64_t per_mb);
// The (micro-batch count, data-parallel degree) pairs of a homogeneous make_plan: every M of
// microbatch_counts with every degree of dp_degrees, less those no layout can fit (the lower
// bound of replica_may_fit); `pruned` counts the pairs left out.
struct ReplicaConfig {
  int M = 1, dp = 1;
};
std::vector<ReplicaConfig> replica_configs(Context& ctx, const std::vector<int>& Ms, int* pruned = nullptr);
// False when a replica of D devices cannot hold the model: parameter state plus one
// micro-batch (of bs samples) of saved activations, over D devices, exceeds a device's usable
// memory (every stage keeps at least one micro-batch in flight; no layout stores less than
// full / devices).
// kept = true: the bound without recomputation (every saved activation kept).
bool replica_may_fit(Context& ctx, std::int64_t bs, int D, bool kept = false);
// Every block's SPMD search the stage DPs of make_plan will read for these pairs, run on every
// core first (Context::prefetch_block_costs).
void prefetch_stage_costs(Context& ctx, const std::vector<SubmeshOptions>& subs,
                          const std::vector<ReplicaConfig>& configs);
// The stage DP's best partition per stage count of one (M, dp); relaxed: a lower bound instead
// (the prefetched unconstrained layouts, memory by the state + activation bound only).
std::vector<Candidate> partition_candidates(Context& ctx, const std::vector<SubmeshOptions>& subs, int M,
                                            int dp, bool relaxed = false);
// Every Megatron layout × micro-batch count the options allow (megatron.cpp): the best that fits
// and a row per layout tried.
std::pair<std::optional<Built>, std::vector<Alternative>> megatron_all(Context& ctx);
// The search space of a homogeneous make_plan, rule by rule, for Plan::search_space.
// The micro-batch sizes the graph cannot be cut to (Context::rebatch_notes) and the last reason.
std::pair<std::vector<std::int64_t>, std::string> batch_sizes_left_out(const Context& ctx);
std::string search_space_text(const Context& ctx, const std::vector<SubmeshOptions>& subs,
                              const std::vector<int>& Ms, std::size_t configs, int pruned, int bounded);

// Heterogeneous clusters (hetero_planner.cpp).
Plan make_hetero_plan(Context& ctx);

// Communication of `comm` seconds run alongside `window` seconds of the compute it serves, in
// pieces of `unit` of it (a bucket, a block; clamped to [0, 1]): what stays exposed,
// max(one piece, comm − window) with PlanOptions::overlap_grad_sync, else all of it.
double exposed_overlap(const PlanOptions& o, double comm, double window, double unit);
// The gradient synchronisation a stage exposes after its last backward: exposed_overlap in
// grad_bucket_bytes pieces.
double exposed_grad_sync(const PlanOptions& o, double sync, double grad_bytes, double backward);
// The training loop's per-step all-reduce of PlanOptions::step_allreduce_bytes over every device
// in `devices` (a ring over them; 0 for one device or 0 bytes), charged to each stage's update.
double step_allreduce_time(const cluster::Cluster& c, const PlanOptions& o, std::vector<int> devices);

// Whale's `split` over mixed GPUs (uneven_split.cpp has the model): blocks first..last as one SPMD
// stage on the 1-D mesh m, device i holding the fraction fraction[i] of every split factor.
struct UnevenStage {
  bool ok = false;
  std::string error;
  std::vector<double> fraction;  // normalised, per device of the mesh
  double fwd = 0, bwd = 0, wgt = 0, upd = 0, grad_sync = 0, compute = 0, comm = 0;  // per micro-batch
  std::vector<double> memory;  // per device of the mesh: static + in-flight × activations + transient
  std::vector<double> static_mem, act_mem, transient;  // per device of the mesh, its parts
};
UnevenStage uneven_stage(Context& ctx, int first, int last, std::int64_t bs, const MeshOption& m, int variant,
                         const std::vector<double>& fraction, int inflight);
// Algorithm 1 on the per-kind affine model of uneven_stage; empty (and *why) when nothing fits.
std::vector<double> balanced_fractions(Context& ctx, int first, int last, std::int64_t bs,
                                       const MeshOption& m, int variant, int M, int inflight,
                                       std::string* why);
// The whole graph as one uneven-split stage on m with M micro-batches (the lean SPMD variant when
// the fast one does not fit): a plan with Plan::split_fraction set.
Built split_build(Context& ctx, const MeshOption& m, int M, const std::vector<double>& fraction,
                  const std::string& strategy);
MeshOption whole_cluster_mesh(Context& ctx);  // 1-D over every device, id order

}  // namespace weft::plan::detail
