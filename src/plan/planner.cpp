// The planner (controller): training graph + cluster -> the fastest plan that fits in memory.
//
// Cost of a stage. The training graph is cut into L blocks (pipeline::group_layers). For a block b
// and a logical mesh m, an SPMD search on the block's own graph (pipeline::extract_stage) gives
// per micro-batch: compute and communication time, split into forward F_b, backward B_b (W_b of
// it the weight gradients) and update U_b by op phase; static memory S_b (parameters + their
// gradients + optimizer states under the chosen specs), activation memory A_b (forward tensors
// read by the backward, per in-flight micro-batch) and the transient rest of the SPMD peak. The
// stage of blocks i..j on m then costs
//     t(i, j, m) = Σ_{b=i..j} (F_b + B_b),   memory(i, j, m, s) = Σ S_b + f(s)·Σ A_b + max transient,
// with f(s) the peak in-flight micro-batches of a stage that has s − 1 stages after it (1F1B:
// min(s, M); GPipe: M; eager 1F1B: min(2s − 1, M)). Results are cached by (block structure,
// mesh links, variant): identical layers are solved once. Two variants per (block, mesh): the
// fastest SPMD plan (no memory limit) and a lean one (memory limit: the block's share of usable); a
// stage takes the fastest variant whose memory fits.
//
// Stage partition (Alpa §5.2 with the stage position): with M micro-batches a pipeline of stage
// times t_1..t_S has latency ≈ Σ t_s + (M − 1)·max t_s. For each bound t_max (distinct stage
// costs, ascending, thinned to a geometric grid) the DP
//     G(s, k, d) = min_{j >= k, m: |m| <= d, t(k, j, m) <= t_max, memory(k, j, m, s) fits}
//                      t(k, j, m) + G(s − 1, j + 1, d − |m|),     G(0, L, 0) = 0,
// gives the least Σ t for every stage count s using exactly the D devices (s counts the stages
// from k to the end, so the in-flight count of a stage is known when it is placed — the reason
// this DP keeps s where pipeline::partition_dp does not). The best (t_max, s) per stage count
// is a candidate; so are the equal-block partitions on every submesh size that divides D
// (Megatron-like shapes). SPMD only = one stage on the whole cluster.
//
// Every candidate is materialised: stages placed on devices (pipeline::assign_submeshes),
// tensors crossing stages resharded by the reshard planner (simulated time = send time), the
// schedule simulated (sim::simulate). The lowest simulated step time wins.
#include "weft/plan/planner.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <set>
#include <thread>
#include <tuple>
#include <unordered_map>

#include "planner_detail.hpp"
#include "weft/cluster/alpha_beta.hpp"
#include "weft/cluster/device_mesh.hpp"
#include "weft/core/error.hpp"
#include "weft/cost/memory.hpp"
#include "weft/cost/op_cost.hpp"
#include "weft/pipeline/grouping.hpp"
#include "weft/pipeline/partition.hpp"
#include "weft/pipeline/submesh.hpp"
#include "weft/plan/rebatch.hpp"
#include "weft/reshard/decompose.hpp"
#include "weft/reshard/plan.hpp"
#include "weft/sharding/reshard.hpp"
#include "weft/sharding/sharding_spec.hpp"
#include "weft/spmd/search.hpp"

namespace weft::plan {

namespace detail {

double exposed_overlap(const PlanOptions& o, double comm, double window, double unit) {
  if (!o.overlap_grad_sync || comm <= 0) return comm;
  return std::max(comm * std::clamp(unit, 0.0, 1.0), comm - window);
}

double exposed_grad_sync(const PlanOptions& o, double sync, double grad_bytes, double backward) {
  return exposed_overlap(o, sync, backward, grad_bytes > 0 ? o.grad_bucket_bytes / grad_bytes : 1.0);
}

std::string mesh_text(const std::vector<std::int64_t>& shape) {
  return fmt::format("({})", fmt::join(shape, ","));
}

const BlockCost& Context::block_cost(int b, std::int64_t bs, const MeshOption& m, int variant,
                                     int forced_dp) {
  const AtBatch& ab = blocks_at(bs);
  const auto key = std::make_tuple(ab.keys[b], m.key, variant, forced_dp);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  if (out_of_time()) {
    BlockCost bc;
    bc.error = fmt::format("not searched: the planning time limit of {} s was reached", opt_.time_limit_s);
    return cache.emplace(key, std::move(bc)).first->second;
  }
  const double t0 = now_s();
  BlockCost bc = search_block(b, ab, m, variant, forced_dp, scratch);
  spmd_seconds += now_s() - t0;
  ++spmd_solves;
  return cache.emplace(key, std::move(bc)).first->second;
}

int Context::num_threads() const {
  if (opt_.threads > 0) return opt_.threads;
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

void Context::prefetch_block_costs(const std::vector<BlockRequest>& requests) {
  // The missing ones, each key once, in request order (the order does not change any result).
  using Key = std::tuple<int, int, int, int>;
  std::vector<std::pair<Key, const BlockRequest*>> todo;
  std::set<Key> seen;
  for (const auto& r : requests) {
    const AtBatch& ab = blocks_at(r.bs);  // built here, on the planning thread
    const Key key{ab.keys[r.block], r.mesh->key, r.variant, r.forced_dp};
    if (cache.count(key) || !seen.insert(key).second) continue;
    todo.emplace_back(key, &r);
  }
  const int T = std::min<int>(num_threads(), static_cast<int>(todo.size()));
  if (T <= 1) {
    for (const auto& [key, r] : todo) (void)block_cost(r->block, r->bs, *r->mesh, r->variant, r->forced_dp);
    return;
  }
  // Workers take the next request from a shared counter; each writes its own slot and its own
  // scratch caches, reads the Context (const) and stops taking work at the deadline or a cancel.
  std::vector<std::optional<BlockCost>> out(todo.size());
  std::vector<double> seconds(todo.size(), 0.0);
  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex error_mu;
  auto work = [&]() {
    SearchScratch sc;
    for (;;) {
      const std::size_t i = next.fetch_add(1);
      if (i >= todo.size() || failed.load() || stop.stop_requested()) return;
      const BlockRequest& r = *todo[i].second;
      try {
        const double t0 = now_s();
        out[i] = search_block(r.block, at_batch.at(r.bs), *r.mesh, r.variant, r.forced_dp, sc);
        seconds[i] = now_s() - t0;
      } catch (...) {
        std::lock_guard lock(error_mu);
        if (!error) error = std::current_exception();
        failed.store(true);
        return;
      }
    }
  };
  {
    std::vector<std::jthread> pool;
    for (int t = 0; t < T; ++t) pool.emplace_back(work);
  }
  if (error) std::rethrow_exception(error);
  stop.throw_if_cancelled("make_plan");
  for (std::size_t i = 0; i < todo.size(); ++i) {
    if (!out[i]) continue;  // the deadline came first: block_cost says so when asked
    spmd_seconds += seconds[i];
    ++spmd_solves;
    cache.emplace(todo[i].first, std::move(*out[i]));
  }
}

BlockCost Context::search_block(int b, const AtBatch& ab, const MeshOption& m, int variant, int forced_dp,
                                SearchScratch& sc) const {
  BlockCost bc;
  const auto& sg = ab.blocks[b];
  const ir::Graph& bg = sg.graph;
  // A cheap lower bound first: state bytes and one micro-batch's saved activations cannot shrink
  // below full / devices (a stage holding the block keeps at least one micro-batch in flight).
  // With ZeRO across replicas the state may spread further, over the replicas' devices too.
  const double lb = min_bytes(ab, b, b, 1, false, c_.num_devices() / static_cast<int>(m.mesh.size())) /
                    static_cast<double>(m.mesh.size());
  // A mesh mixing kinds may split unevenly: only the mean memory bounds it.
  double cap = usable(m.mesh);
  if (mixed(m.mesh)) {
    cap = 0;
    for (int d : m.mesh.device_ids()) cap += usable_of_device(d) / static_cast<double>(m.mesh.size());
  }
  if (lb > cap && variant != kUnboundedVariant) {
    bc.error = fmt::format(
        "block {} needs >= {:.3g} GB/device on {} devices (parameter state {:.3g} GB and one micro-batch's "
        "saved activations {:.3g} GB in all)",
        b, lb / 1e9, m.mesh.size(), block_state_bytes[b] / 1e9, ab.act_bytes[b] / 1e9);
    return bc;
  }
  spmd::SearchOptions so;
  so.level = opt_.spmd_level == SpmdLevel::O3 ? spmd::Level::O3 : spmd::Level::O2;
  so.time_limit_s = opt_.spmd_time_limit_s;
  so.relative_gap = opt_.spmd_relative_gap;
  so.shared_resharding = opt_.shared_resharding;
  // The lean variant's budget: the block's share of the usable memory in proportion to its lower
  // bound (state + one micro-batch of saved activations) among all blocks — the shares of the
  // model's blocks sum to the device, and a block with a large embedding or loss gets the room
  // its live set needs (an even usable / L refused one-stage layouts that fit; issue 22).
  const double need_all = min_bytes(ab, 0, L() - 1, 1, true);
  const double share = need_all > 0 ? min_bytes(ab, b, b, 1, true) / need_all : 1.0 / std::max(1, L());
  so.memory_limit = variant != 1 ? -1.0 : usable(m.mesh) * share;
  so.strided_candidates = false;
  so.reshard_cache = sc.reshard_cache;
  so.stop = stop;
  if (mixed(m.mesh)) so.device = mesh_spec(m.mesh);  // an uneven split: re-priced per device later
  if (forced_dp > 0) {
    // The block's boundary in one layout: its inputs fixed to it, its results read by other
    // blocks resharded to it inside the block (so consecutive blocks agree and pass tensors
    // without resharding between them).
    const bool two_d = m.mesh.ndim() == 2;
    auto canonical = [&](const ir::TensorInfo& t) -> std::string {
      if (forced_dp > 1 && t.shape[0] % forced_dp == 0) return two_d ? "S(0) R" : "S(0)";
      return two_d ? "R R" : "R";
    };
    for (const auto& t : bg.tensors()) {
      if (t.producer != ir::kNoOp || is_state_leaf(t) || t.rank() < 1) continue;
      if (t.role == ir::Role::Constant || t.role == ir::Role::Buffer) continue;
      if (bg.consumers(bg.find_tensor(t.name).value()).empty()) continue;
      so.fixed_specs[t.name] = canonical(t);
    }
    for (ir::TensorId t : bg.outputs()) {
      const auto& info = bg.tensor(t);
      if (info.producer == ir::kNoOp || info.rank() < 1) continue;
      const ir::TensorId orig = sg.original_tensor[t];
      bool read_elsewhere = false;
      for (ir::OpId c : g_.consumers(orig))
        read_elsewhere = read_elsewhere || (grouping.block_of_op[c] >= 0 && grouping.block_of_op[c] != b);
      if (read_elsewhere) so.output_specs[info.name] = canonical(info);
    }
  }
  try {
    spmd::SpmdPlan p = spmd::spmd_search(bg, c_, m.mesh, so);
    bc.ok = true;
    const auto& dev = mesh_spec(m.mesh);
    double f = 0, bw = 0, w = 0, u = 0;
    std::vector<double> op_time(bg.ops().size(), 0.0);
    bc.split_factor.assign(bg.ops().size(), -1);
    bc.axes.resize(bg.ops().size());
    for (ir::OpId o = 0; o < static_cast<ir::OpId>(bg.ops().size()); ++o) {
      bc.axes[o] = p.op_strategies[o].axes;
      WEFT_ASSERT(static_cast<int>(bc.axes[o].size()) == m.mesh.ndim(),
                  "an SPMD strategy without one assignment per mesh axis");
      bc.split_factor[o] = p.op_strategies[o].axes.empty() ? -1 : p.op_strategies[o].axes[0].factor;
      const double t = cost::op_cost(bg, bg.op(o), dev, p.op_strategies[o].factor_shards).time;
      op_time[o] = t;
      const ir::OpId orig = sg.original_op[o];
      switch (phase[orig]) {
        case pipeline::OpPhase::Forward: f += t; break;
        case pipeline::OpPhase::Backward:
          bw += t;
          if (weight_grad_op[orig]) w += t;
          break;
        case pipeline::OpPhase::Update: u += t; break;
      }
    }
    // The gradient synchronisation: the resharding into the update ops' gradient operands
    // (a partial or batch-split gradient all-reduced / reduce-scattered to the parameter's
    // layout). With micro-batches it runs once per step on the accumulated gradient, so it is
    // moved out of the per-micro-batch time into the update.
    double grad_sync = 0;
    {
      for (ir::OpId o = 0; o < static_cast<ir::OpId>(bg.ops().size()); ++o) {
        if (phase[sg.original_op[o]] != pipeline::OpPhase::Update) continue;
        const auto& op = bg.op(o);
        for (std::size_t i = 0; i < op.inputs.size(); ++i) {
          const ir::TensorId t = op.inputs[i];
          const auto& info = bg.tensor(t);
          if (info.role != ir::Role::Gradient || !p.tensor_specs[t]) continue;
          const auto& from = *p.tensor_specs[t];
          const auto& to = p.op_strategies[o].inputs[i];
          if (from == to) continue;
          grad_sync += reshard_planner_in(sc, m.key, m.mesh, dtype_size(info.dtype)).plan(from, to).time;
        }
      }
    }
    const double total = f + bw + u;
    const double comm = std::max(0.0, p.comm_time - grad_sync);
    // Communication follows the compute it serves (no per-edge phase in the SPMD report).
    const double cf = total > 0 ? f / total : 1.0, cb = total > 0 ? bw / total : 0.0,
                 cu = total > 0 ? u / total : 0.0;
    bc.fwd = f + comm * cf;
    bc.bwd = bw + comm * cb;
    bc.wgt = w + (bw > 0 ? comm * cb * (w / bw) : 0.0);
    bc.upd = u + comm * cu + grad_sync;
    bc.grad_sync = grad_sync;
    bc.fwd_compute = f;
    bc.bwd_compute = bw;
    bc.wgt_compute = w;
    bc.upd_compute = u;
    bc.compute = f + bw;
    bc.comm = comm * (cf + cb);
    const int nt = static_cast<int>(bg.tensors().size());
    bc.spec.assign(nt, "");
    bc.local_bytes.assign(nt, 0.0);
    for (int t = 0; t < nt; ++t) {
      const auto& info = bg.tensor(t);
      if (t < static_cast<int>(p.tensor_specs.size()) && p.tensor_specs[t]) {
        bc.spec[t] = p.tensor_specs[t]->to_string();
        bc.local_bytes[t] =
            static_cast<double>(p.tensor_specs[t]->max_local_elements()) * dtype_size(info.dtype);
      } else {
        bc.local_bytes[t] = static_cast<double>(info.bytes());
      }
    }
    // Saved activations: forward results (and boundary inputs) that a backward op reads.
    const std::vector<char> saved = saved_activations(sg);
    bc.mem_class.assign(nt, BlockCost::kNone);
    for (int t = 0; t < nt; ++t) {
      const auto& info = bg.tensor(t);
      if (is_state_leaf(info)) {
        // A parameter counts twice (it and its gradient), an optimizer state once.
        bc.mem_class[t] = info.role == ir::Role::Parameter ? BlockCost::kParam : BlockCost::kOptState;
        bc.static_mem += bc.local_bytes[t] * (info.role == ir::Role::Parameter ? 2.0 : 1.0);
        (info.role == ir::Role::Parameter ? bc.param_mem : bc.opt_mem) += bc.local_bytes[t];
      } else if (saved[t]) {
        bc.mem_class[t] = BlockCost::kActivation;
        bc.act_mem += bc.local_bytes[t];
      }
    }
    bc.transient = std::max(0.0, p.peak_memory - bc.static_mem - bc.act_mem);
    {
      // Where the peak is: at an update (the new value and states beside the old ones) or not.
      const cost::Liveness lv = cost::liveness(bg, false);
      const std::vector<double> at = cost::live_bytes(lv, bc.local_bytes);
      double upd_peak = 0, rest_peak = 0;
      for (std::size_t q = 0; q < at.size(); ++q) {
        double& peak = phase[sg.original_op[lv.order[q]]] == pipeline::OpPhase::Update ? upd_peak : rest_peak;
        peak = std::max(peak, at[q]);
      }
      bc.upd_excess = std::clamp(upd_peak - bc.static_mem - bc.act_mem, 0.0, bc.transient);
      bc.rest_excess = std::clamp(rest_peak - bc.static_mem - bc.act_mem, 0.0, bc.transient);
    }
    // What the recomputation modes keep and re-make (recompute.cpp).
    const RecomputeSets rs = recompute_sets(bg, forward_ops(sg), saved);
    for (int t = 0; t < nt; ++t) {
      if (rs.checkpoint[t]) bc.checkpoint_mem += bc.local_bytes[t];
      if (saved[t] && bg.tensor(t).producer != ir::kNoOp) bc.full_remake += bc.local_bytes[t];
    }
    for (const auto& r : rs.regions) {
      double dropped = 0;
      for (ir::TensorId t : r.dropped) dropped += bc.local_bytes[t];
      for (ir::OpId o : r.ops) bc.sel_time += op_time[o];
      bc.sel_mem += dropped;
      bc.sel_peak = std::max(bc.sel_peak, dropped);
    }
  } catch (const InternalError&) {
    throw;
  } catch (const Error& e) {
    bc.ok = false;
    bc.error = e.what();
  }
  return bc;
}

// ---------------------------------------------------------------- mesh options

std::vector<std::int64_t> canonical_logical(std::vector<std::int64_t> s) {
  if (s.size() == 2 && s[0] == 1) return {s[1]};
  if (s.size() == 2 && s[1] == 1) return {s[0]};
  return s;
}

std::vector<int> canonical_devices(const cluster::Cluster& c, const pipeline::SubmeshShape& s) {
  std::vector<int> ids;
  for (int n = 0; n < s.nodes; ++n) {
    auto d = c.devices_of_node(n);
    ids.insert(ids.end(), d.begin(), d.begin() + s.devices_per_node);
  }
  return ids;
}

std::vector<MeshOption> meshes_on(Context& ctx, const pipeline::SubmeshShape& s,
                                  const std::vector<int>& ids) {
  const auto& o = ctx.opt_;
  const int G = ctx.c_.nodes()[static_cast<std::size_t>(ctx.c_.node_of(ids.front()))].num_devices;
  std::vector<MeshOption> out;
  std::set<std::vector<std::int64_t>> seen;
  for (auto ls : pipeline::logical_mesh_shapes(s)) {
    auto cl = canonical_logical(ls);
    if (cl.size() == 2 && !o.two_d_meshes) continue;
    // Minor axis inside a node (consecutive devices), like Megatron's tensor-parallel groups.
    if (cl.size() == 2 && (G % cl[1]) != 0) continue;
    if (!seen.insert(cl).second) continue;
    cluster::DeviceMesh mesh(cl, ids);
    out.push_back({s, cl, mesh, ctx.mesh_key(mesh)});
  }
  // 1-D first, then the 2-D shapes with the largest minor axis (tensor parallel inside a node).
  std::stable_sort(out.begin(), out.end(), [](const MeshOption& a, const MeshOption& b) {
    if (a.logical.size() != b.logical.size()) return a.logical.size() < b.logical.size();
    return a.logical.back() > b.logical.back();
  });
  if (o.max_logical_shapes > 0 && static_cast<int>(out.size()) > o.max_logical_shapes)
    out.erase(out.begin() + o.max_logical_shapes, out.end());
  return out;
}

// Up to this many nodes every whole-node count is a submesh; beyond, the counts that are a power
// of two or divide the node count (PlanOptions::all_node_counts).
constexpr int kAllNodeCountsUpTo = 8;

std::vector<SubmeshOptions> make_mesh_options(Context& ctx) {
  const auto& c = ctx.c_;
  const auto& o = ctx.opt_;
  const int G = c.nodes()[0].num_devices;
  const int N = static_cast<int>(c.nodes().size());
  std::vector<SubmeshOptions> out;
  for (const auto& s : pipeline::submesh_shapes(c)) {
    const bool whole = s.devices_per_node == G;
    const bool pow2 = (s.nodes & (s.nodes - 1)) == 0;
    if (o.whole_nodes_only && !whole) continue;
    if (o.power_of_two_nodes && whole && !pow2) continue;
    if (whole && !o.all_node_counts && N > kAllNodeCountsUpTo && !pow2 && N % s.nodes != 0) continue;
    SubmeshOptions so{s, meshes_on(ctx, s, canonical_devices(c, s))};
    if (!so.meshes.empty()) out.push_back(std::move(so));
  }
  return out;
}

// ---------------------------------------------------------------- stage costs and candidates

double Context::crossing_time(const Crossing& x, std::int64_t bs, const MeshOption& m, int variant,
                              int forced_dp) {
  const int bp = grouping.block_of_op[x.producer], bc = grouping.block_of_op[x.consumer];
  const BlockCost& pc = block_cost(bp, bs, m, variant, forced_dp);
  const BlockCost& cc = block_cost(bc, bs, m, variant, forced_dp);
  if (!pc.ok || !cc.ok) return 0;
  const AtBatch& ab = blocks_at(bs);
  const std::string& name = g_.tensor(x.tensor).name;
  const auto& pg = ab.blocks[bp].graph;
  const auto& cg = ab.blocks[bc].graph;
  const auto ip = pg.find_tensor(name), ic = cg.find_tensor(name);
  WEFT_ASSERT(ip && ic, "a tensor crossing blocks is missing from their graphs");
  // Keyed by structure (identical layers share it): blocks, tensor slots, mesh, variant.
  const std::vector<std::int64_t> key{bs, m.key, variant, forced_dp, ab.keys[bp], ab.keys[bc], *ip, *ic};
  auto it = crossing_cost.find(key);
  if (it != crossing_cost.end()) return it->second;
  const auto& info = pg.tensor(*ip);
  auto spec = [&](const std::string& text) {
    return text.empty() ? sharding::ShardingSpec::replicated(info.shape, m.mesh.shape())
                        : sharding::ShardingSpec::parse(text, info.shape, m.mesh.shape());
  };
  const auto from = spec(pc.spec[*ip]);
  const auto to = spec(cc.spec[*ic]);
  const double t =
      from == to ? 0.0 : reshard_planner(m.key, m.mesh, dtype_size(info.dtype)).plan(from, to).time;
  return crossing_cost.emplace(key, t).first->second;
}

sharding::ReshardPlanner& Context::reshard_planner_in(SearchScratch& sc, int mesh_key,
                                                      const cluster::DeviceMesh& mesh, int elem) const {
  auto it = sc.reshard_planners.find({mesh_key, elem});
  if (it == sc.reshard_planners.end()) {
    sharding::ReshardOptions ro;
    ro.strided_intermediates = false;
    it = sc.reshard_planners
             .emplace(std::make_pair(mesh_key, elem),
                      sharding::ReshardPlanner(cluster::axis_links(c_, mesh), elem, ro))
             .first;
  }
  return it->second;
}

Context::InternalReshard Context::internal_reshard(int first, int last, std::int64_t bs, const MeshOption& m,
                                                   int variant, int forced_dp) {
  // The crossings sorted by their lower block, costed lazily (a block pair is priced only when a
  // stage holding both is asked for: no SPMD search is started for blocks the caller never uses).
  auto& tab = crossing_tables[{bs, m.key, variant, forced_dp}];
  if (tab.start.empty()) {
    std::vector<int> idx(crossings.size());
    std::iota(idx.begin(), idx.end(), 0);
    auto lo = [&](int i) {
      return std::min(grouping.block_of_op[crossings[i].producer],
                      grouping.block_of_op[crossings[i].consumer]);
    };
    std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return lo(a) < lo(b); });
    tab.order = idx;
    tab.time.assign(idx.size(), -1.0);
    tab.start.assign(static_cast<std::size_t>(L()) + 1, static_cast<int>(idx.size()));
    for (int k = static_cast<int>(idx.size()) - 1; k >= 0; --k) tab.start[lo(idx[k])] = k;
    for (int b = L() - 1; b >= 0; --b) tab.start[b] = std::min(tab.start[b], tab.start[b + 1]);
  }
  InternalReshard r;
  for (int k = tab.start[first]; k < static_cast<int>(tab.order.size()); ++k) {
    const Crossing& x = crossings[tab.order[k]];
    const int bp = grouping.block_of_op[x.producer], bc = grouping.block_of_op[x.consumer];
    if (std::min(bp, bc) > last) break;
    if (std::max(bp, bc) > last) continue;
    if (tab.time[k] < 0) tab.time[k] = crossing_time(x, bs, m, variant, forced_dp);
    switch (phase[x.producer]) {
      case pipeline::OpPhase::Forward: r.fwd += tab.time[k]; break;
      case pipeline::OpPhase::Backward: r.bwd += tab.time[k]; break;
      case pipeline::OpPhase::Update: r.upd += tab.time[k]; break;
    }
  }
  return r;
}

StageAgg aggregate(Context& ctx, int first, int last, std::int64_t bs, const MeshOption& m, int variant,
                   int forced_dp) {
  StageAgg a;
  for (int b = first; b <= last; ++b) {
    const BlockCost& bc = ctx.block_cost(b, bs, m, variant, forced_dp);
    if (!bc.ok) {
      a.error = bc.error;
      return a;
    }
    a.fwd += bc.fwd;
    a.bwd += bc.bwd;
    a.wgt += bc.wgt;
    a.upd += bc.upd;
    a.grad_sync += bc.grad_sync;
    a.compute += bc.compute;
    a.comm += bc.comm;
    a.static_mem += bc.static_mem;
    a.act_mem += bc.act_mem;
    a.transient = std::max(a.transient, bc.transient);
    a.fwd_compute += bc.fwd_compute;
    a.checkpoint_mem += bc.checkpoint_mem;
    a.sel_mem += bc.sel_mem;
    a.sel_time += bc.sel_time;
    a.param_mem += bc.param_mem;
    a.opt_mem += bc.opt_mem;
    a.max_block_param = std::max(a.max_block_param, bc.param_mem);
    a.upd_excess = std::max(a.upd_excess, bc.upd_excess);
    a.rest_excess = std::max(a.rest_excess, bc.rest_excess);
    a.upd_compute += bc.upd_compute;
    a.full_transient = std::max(a.full_transient, bc.transient + bc.full_remake);
    a.blk_act.push_back(bc.act_mem);
    a.blk_ckpt.push_back(bc.checkpoint_mem);
    a.blk_fwd.push_back(bc.fwd);
    a.blk_fwd_compute.push_back(bc.fwd_compute);
    a.blk_remake.push_back(bc.transient + bc.full_remake);
    a.blk_param.push_back(bc.param_mem);
    a.sel_transient = std::max(a.sel_transient, bc.transient + bc.sel_peak);
  }
  // Tensors passed between the stage's blocks: each block's SPMD plan chose its own layout.
  const Context::InternalReshard r = ctx.internal_reshard(first, last, bs, m, variant, forced_dp);
  a.fwd += r.fwd;
  a.bwd += r.bwd;
  a.upd += r.upd;
  a.comm += r.fwd + r.bwd;
  a.between_blocks = r.fwd + r.bwd + r.upd;
  a.ok = true;
  return a;
}

double stage_memory(const StageAgg& a, int inflight) {
  return a.static_mem + inflight * a.act_mem + a.transient;
}

// Best (mesh, variant, boundary mode) of a stage on a submesh (see planner_detail.hpp).
std::optional<StageChoice> best_stage(Context& ctx, const std::vector<MeshOption>& meshes, int first,
                                      int last, int sub, std::int64_t bs, int M, int inflight, int forced_dp,
                                      std::string* why, int replicas) {
  std::optional<StageChoice> best;
  double best_share = kInf;  // M·(F + B) + update of `best`
  if (meshes.empty()) return best;
  const int n = static_cast<int>(meshes[0].mesh.size());
  const double usable = ctx.usable(meshes[0].mesh);
  // Quick reject, before any SPMD search: state bytes (over the replicas where ZeRO may shard them)
  // and the in-flight micro-batches' saved activations cannot shrink below full / devices.
  const double need = ctx.min_bytes(ctx.blocks_at(bs), first, last, inflight, false, replicas) / n;
  // The replica options: (ZeRO level, links of its shard groups); one replica: none.
  std::vector<std::pair<int, const ReplicaLinks*>> sharding;
  if (replicas > 1)
    for (int level : zero_levels(ctx.opt_, replicas))
      for (int z : level == 0 ? std::vector<int>{replicas} : shard_groups(ctx.c_, ctx.opt_, replicas, n))
        sharding.emplace_back(level, &ctx.canonical_replica_links(n, replicas, z));
  if (need > usable) {
    if (why)
      *why = fmt::format("needs >= {:.3g} GB/device (parameter state and {} micro-batch(es) of activations)",
                         need / 1e9, inflight);
    return best;
  }
  for (int mi = 0; mi < static_cast<int>(meshes.size()); ++mi) {
    // Free boundaries (each block picks the layouts of what it passes on; the stage pays the
    // resharding between blocks) and, on several devices, agreed ones (every block's inputs and
    // passed-on results batch-sharded on mesh axis 0 where the batch divides, else replicated).
    // Agreed boundaries only add constraints and costs to every block's SPMD objective, so when
    // free boundaries fit and reshard nothing between the blocks they are skipped (exact for one
    // micro-batch, where a stage's share of the step is that objective; a heuristic beyond).
    std::vector<int> boundary{forced_dp};
    if (forced_dp == 0 && meshes[mi].mesh.size() > 1)
      boundary.push_back(static_cast<int>(meshes[mi].mesh.shape()[0]));
    bool free_is_best = false;
    // Per variant the recomputation modes cheapest first (none, selective, full): the first that
    // fits is that variant's best; the lean variant is still tried when the fast one needs a
    // recomputation (keeping its activations may beat recomputing the fast layout's).
    const std::vector<Recompute> modes = recompute_modes(ctx.opt_.recompute);
    const bool kept_may_fit =
        ctx.min_bytes(ctx.blocks_at(bs), first, last, inflight, true, replicas) / n <= usable;
    for (int f : boundary)
      for (int v = 0; v < 2 && !(f != forced_dp && free_is_best); ++v) {
        const StageAgg plain = aggregate(ctx, first, last, bs, meshes[mi], v, f);
        if (!plain.ok) {
          if (why) *why = plain.error;
          continue;
        }
        // Every (recomputation, ZeRO level) pair: the fastest that fits. Without replicas the first
        // mode that fits is the fastest (recomputation only adds time); with them a ZeRO level that
        // moves more bytes may lose to a recomputation under a lighter level.
        const std::size_t options = std::max<std::size_t>(1, sharding.size());
        auto keep_if_faster = [&](const StageAgg& a, double mem) {
          const double t = a.fwd + a.bwd;
          const double share = M * t + a.upd;
          if (!best || share < best_share) {
            best = StageChoice{
                first,           last,       sub, mi, v, f, t, mem, a.recompute, a.zero, a.zero_group,
                a.recompute_set, a.zero3_set};
            best_share = share;
          }
        };
        auto consider = [&](const StageAgg& rc, std::size_t zi) {  // true when it fits
          const StageAgg a = sharding.empty() ? rc
                                              : with_replicas(rc, sharding[zi].first, *sharding[zi].second,
                                                              rc.param_mem, ctx.opt_);
          const double mem = stage_memory(a, inflight);
          if (mem > usable) {
            if (why)
              *why = fmt::format("needs {:.3g} GB/device > {:.3g} GB usable{}{}", mem / 1e9, usable / 1e9,
                                 modes.size() > 1 || rc.recompute != Recompute::None
                                     ? fmt::format(" (recompute {})", recompute_name(rc.recompute))
                                     : std::string(),
                                 sharding.empty() ? std::string() : fmt::format(" (ZeRO-{})", a.zero));
            return false;
          }
          keep_if_faster(a, mem);
          return true;
        };
        auto consider_mixed = [&](const StageAgg& rc, int level, const std::vector<int>& set,
                                  const ReplicaLinks& links) {
          const StageAgg a = with_mixed_zero(rc, level, set, links, rc.param_mem, ctx.opt_);
          const double mem = stage_memory(a, inflight);
          if (mem > usable) return false;
          keep_if_faster(a, mem);
          return true;
        };
        bool fits_as_is = false;
        for (Recompute mode : modes) {
          const StageAgg rc = recomputed(plain, mode);
          bool fitted = false;
          for (std::size_t zi = 0; zi < options; ++zi) fitted = consider(rc, zi) || fitted;
          if (!fitted) continue;
          fits_as_is = fits_as_is || mode == Recompute::None;
          if (sharding.empty()) break;
        }
        // With recompute=auto, when every activation does not fit: full recomputation of only as
        // many blocks as needed (per ZeRO option the fewest that fit: each more block costs its forward).
        const int nb = static_cast<int>(plain.blk_act.size());
        if (ctx.opt_.recompute == Recompute::Auto && !fits_as_is && nb >= 2) {
          const std::vector<int> order = recompute_order(plain, inflight);
          for (std::size_t zi = 0; zi < options; ++zi)
            for (int k = 1; k < nb; ++k)
              if (consider(recomputed_blocks(plain, std::vector<int>(order.begin(), order.begin() + k)), zi))
                break;
        }
        // With zero=auto: ZeRO-3 on some blocks only, level 1 or 2 on the rest (per shard grouping,
        // per recomputation mode): the fewest blocks, most parameter bytes first, that fit —
        // between a level that does not fit and ZeRO-3 everywhere, which gathers every block.
        if (ctx.opt_.zero < 0 && nb >= 2)
          for (Recompute mode : modes) {
            const StageAgg rc = recomputed(plain, mode);
            const std::vector<int> order = zero3_order(rc);
            for (const auto& [level, links] : sharding) {
              if (level != 1 && level != 2) continue;
              for (int k = 1; k < nb; ++k) {
                const std::vector<int> set(order.begin(), order.begin() + k);
                if (consider_mixed(rc, level, set, *links)) break;
              }
            }
          }
        // The lean variant is worth its memory-limited search only if some layout could hold every
        // activation (the bound without recomputation fits); else it would recompute as well. With
        // ZeRO options across replicas, not when the fast variant fits under one of them: the lean
        // search shards the state inside the mesh against a budget that assumes it replicated across
        // the replicas, which ZeRO already relieves (GPT-3 175B on 128 nodes: 75 -> 32 s of planning).
        if (!fits_as_is && !(v == 0 && best && (!kept_may_fit || !sharding.empty()))) continue;
        if (fits_as_is) free_is_best = f == forced_dp && v == 0 && plain.between_blocks <= 0;
        break;  // the fast variant fits without recomputation: the lean one is not faster
      }
  }
  return best;
}

// The DP described at the top of the file over the devices of one replica (D = N / dp); returns
// the best candidate per stage count.
std::vector<std::optional<StageDpPath>> stage_dp(Context& ctx, const StageDpInput& in) {
  const int L = in.L, S_max = in.S_max, P = in.positions, Q = static_cast<int>(in.width.size());
  // Tables with j innermost (the DP's inner loop): the choice, its time (+∞ = no fit) and the
  // suffix minimum over j' >= j of the time (the inner loop stops once it exceeds t_max).
  auto ti = [&](int s, int k, int q, int j) {
    return ((static_cast<std::size_t>(s - 1) * L + k) * Q + static_cast<std::size_t>(q)) * L + j;
  };
  const std::size_t tsz = static_cast<std::size_t>(S_max) * L * Q * L;
  std::vector<const StageChoice*> table(tsz, nullptr);
  std::vector<double> time(tsz, kInf), suffix(tsz, kInf);
  std::vector<double> all_costs;
  const int pairs = L * (L + 1) / 2;
  int done = 0;
  // Every stage cost the DP can read: s − 1 more stages need s − 1 more blocks, and a stage that
  // does not fit with s in flight does not fit with more.
  for (int k = 0; k < L; ++k)
    for (int j = k; j < L; ++j, ++done) {
      ctx.progress("spmd", 0.05 + 0.6 * done / std::max(1, pairs),
                   fmt::format("{}: stage costs of blocks {}-{} ({} SPMD searches so far)", in.what, k, j,
                               ctx.spmd_solves));
      for (int q = 0; q < Q; ++q)
        for (int s = 1; s <= S_max && L - 1 - j >= s - 1; ++s) {
          const StageChoice* c = in.cost(s, k, j, q);
          if (!c) break;
          table[ti(s, k, q, j)] = c;
          time[ti(s, k, q, j)] = c->time;
          all_costs.push_back(c->time);
        }
    }
  for (int s = 1; s <= S_max; ++s)
    for (int k = 0; k < L; ++k)
      for (int q = 0; q < Q; ++q) {
        double run = kInf;
        for (int j = L - 1; j >= k; --j) suffix[ti(s, k, q, j)] = run = std::min(run, time[ti(s, k, q, j)]);
      }
  std::sort(all_costs.begin(), all_costs.end());
  all_costs.erase(std::unique(all_costs.begin(), all_costs.end()), all_costs.end());
  // Thin to a geometric grid (ratio 1.02) and at most 64 bounds: T within ~2% of the DP optimum.
  std::vector<double> bounds;
  for (double t : all_costs)
    if (bounds.empty() || t > bounds.back() * 1.02) bounds.push_back(t);
  if (!all_costs.empty() && bounds.back() != all_costs.back()) bounds.push_back(all_costs.back());
  if (bounds.size() > 64) {
    std::vector<double> thin;
    for (std::size_t i = 0; i < 64; ++i) thin.push_back(bounds[i * (bounds.size() - 1) / 63]);
    bounds = thin;
  }
  std::vector<std::optional<StageDpPath>> best(static_cast<std::size_t>(S_max) + 1);
  // G(s, k, pos) with k innermost: the inner loop reads G(s − 1, j + 1, next) for consecutive j.
  const std::size_t gsz = static_cast<std::size_t>(S_max + 1) * (P + 1) * (L + 1);
  auto gi = [&](int s, int k, int pos) {
    return (static_cast<std::size_t>(s) * (P + 1) + static_cast<std::size_t>(pos)) * (L + 1) + k;
  };
  std::vector<double> G(gsz);
  std::vector<int> cj(gsz), cq(gsz);
  for (double tmax : bounds) {
    double worst = 0;
    for (int s = 1; s <= S_max; ++s)
      worst = std::max(worst,
                       best[static_cast<std::size_t>(s)] ? best[static_cast<std::size_t>(s)]->proxy : kInf);
    if (in.M * tmax >= worst) break;  // no partition with this max can beat any stage count's best
    if (ctx.out_of_time() &&
        (ctx.past_grace() || std::any_of(best.begin(), best.end(), [](const auto& b) { return b.has_value(); })))
      break;  // the deadline: keep the partitions found so far
    std::fill(G.begin(), G.end(), kInf);
    for (int pos = in.end_anywhere ? 1 : P; pos <= P; ++pos) G[gi(0, L, pos)] = 0;
    for (int s = 1; s <= S_max; ++s)
      for (int pos = 0; pos < P; ++pos)
        for (int k = L - 1; k >= 0; --k) {
          double bv = kInf;
          int bj = -1, bq = -1;
          for (int q : in.options_at[static_cast<std::size_t>(pos)]) {
            const int next = pos + in.width[static_cast<std::size_t>(q)];
            if (next > P) continue;
            const std::size_t row = ti(s, k, q, 0);
            const double* rest = &G[gi(s - 1, 0, next)];
            for (int j = k; j < L; ++j) {
              if (suffix[row + static_cast<std::size_t>(j)] > tmax) break;
              const double t = time[row + static_cast<std::size_t>(j)];
              if (t > tmax) continue;
              const double v = t + rest[j + 1];
              if (v < bv) bv = v, bj = j, bq = q;
            }
          }
          G[gi(s, k, pos)] = bv;
          cj[gi(s, k, pos)] = bj;
          cq[gi(s, k, pos)] = bq;
        }
    for (int s = 1; s <= S_max; ++s) {
      const double sum = G[gi(s, 0, 0)];
      if (sum == kInf) continue;
      const double T = sum + (in.M - 1) * tmax;
      auto& b = best[static_cast<std::size_t>(s)];
      if (b && T >= b->proxy) continue;
      StageDpPath path;
      path.proxy = T;
      for (int k = 0, pos = 0, ss = s; ss > 0; --ss) {
        const int j = cj[gi(ss, k, pos)], q = cq[gi(ss, k, pos)];
        path.stages.push_back({k, j, q, table[ti(ss, k, q, j)]});
        pos += in.width[static_cast<std::size_t>(q)];
        k = j + 1;
      }
      b = std::move(path);
    }
  }
  return best;
}

double pipeline_proxy(const std::vector<StageChoice>& stages, int M) {
  double sum = 0, mx = 0;
  for (const auto& st : stages) sum += st.time, mx = std::max(mx, st.time);
  return sum + (M - 1) * mx;
}

Candidate candidate_of(const StageDpPath& path, std::string strategy, int M, int dp, std::int64_t bs) {
  Candidate cand;
  cand.strategy = std::move(strategy);
  cand.M = M;
  cand.dp = dp;
  cand.bs = bs;
  cand.proxy = path.proxy;
  for (const auto& st : path.stages) cand.stages.push_back(*st.choice);
  return cand;
}

// Every block's SPMD search that the stage DPs of make_plan will read (the fast variant with free
// block boundaries, on each logical mesh of each submesh a replica can hold, at each micro-batch
// size), run on every core before the DPs ask for them one by one.
void prefetch_stage_costs(Context& ctx, const std::vector<SubmeshOptions>& subs,
                          const std::vector<ReplicaConfig>& configs) {
  const auto& o = ctx.opt_;
  std::vector<Context::BlockRequest> reqs;
  for (const auto [M, d] : configs) {
    const int D = ctx.c_.num_devices() / d;
    const std::int64_t bs = ctx.global_batch / (static_cast<std::int64_t>(M) * d);
    for (const auto& sub : subs) {
      const int n = sub.shape.num_devices();
      if (n > D || (!o.pipeline && n != D)) continue;
      for (const auto& mesh : sub.meshes)
        for (int b = 0; b < ctx.L(); ++b) reqs.push_back({b, bs, &mesh, 0, 0});
    }
  }
  ctx.progress("spmd", 0.05,
               fmt::format("SPMD searches of {} blocks on {} thread(s)", ctx.L(), ctx.num_threads()));
  ctx.prefetch_block_costs(reqs);
}

// The stage DP's best partition per stage count of one (M, dp). relaxed: a lower bound instead —
// every stage priced at the sum of its blocks' unconstrained layouts (the prefetched fast variant
// with free boundaries, no resharding between blocks, the best logical mesh) and memory checked
// only by the state + activation bound; no SPMD search beyond the prefetched ones runs.
std::vector<Candidate> partition_candidates(Context& ctx, const std::vector<SubmeshOptions>& subs, int M,
                                            int dp, bool relaxed = false) {
  const int L = ctx.L();
  const int D = ctx.c_.num_devices() / dp;
  const std::int64_t bs = ctx.global_batch / (static_cast<std::int64_t>(M) * dp);
  std::vector<int> usable_subs;
  for (int m = 0; m < static_cast<int>(subs.size()); ++m)
    if (subs[m].shape.num_devices() <= D) usable_subs.push_back(m);
  if (usable_subs.empty()) return {};
  int unit = 0;
  for (int m : usable_subs) unit = std::gcd(unit, subs[m].shape.num_devices());
  if (D % unit) return {};
  int S_max = std::min(L, D / subs[usable_subs.front()].shape.num_devices());
  if (ctx.opt_.max_stages > 0) S_max = std::min(S_max, ctx.opt_.max_stages);
  if (!ctx.opt_.pipeline) S_max = 1;
  S_max = std::max(S_max, 1);
  // Positions are device units used so far; any submesh fits at any position (the placement is
  // made afterwards by pipeline::replicate_pipeline), so every option is open everywhere.
  StageDpInput in;
  in.L = L;
  in.S_max = S_max;
  in.positions = D / unit;
  in.M = M;
  const int NS = static_cast<int>(subs.size());
  for (int m = 0; m < NS; ++m) in.width.push_back(subs[m].shape.num_devices() / unit);
  in.options_at.assign(static_cast<std::size_t>(in.positions), usable_subs);
  in.what = fmt::format("{}M={} dp={}", relaxed ? "bound " : "", M, dp);
  std::map<std::tuple<int, int, int, int>, std::optional<StageChoice>> memo;  // (k, j, m, in-flight)
  // The relaxed stage: Σ over its blocks of the fast variant's F + B on the best logical mesh, plus
  // the recomputation the memory bound forces (the cheapest allowed mode whose bound fits), at the
  // device's best speed over all its devices — no layout recomputes faster.
  auto relaxed_stage = [&](int k, int j, int m, int inf) -> std::optional<StageChoice> {
    const auto& meshes = subs[m].meshes;
    if (meshes.empty()) return std::nullopt;
    const auto& ab = ctx.blocks_at(bs);
    const double n = static_cast<double>(meshes[0].mesh.size()), usable = ctx.usable(meshes[0].mesh);
    auto need = [&](const std::vector<double>& act) {
      double b = 0;
      for (int x = k; x <= j; ++x) b += ctx.state_bound(x, dp) + inf * act[static_cast<std::size_t>(x)];
      return b;
    };
    std::optional<double> extra_flops;
    for (Recompute mode : recompute_modes(ctx.opt_.recompute)) {
      const auto& act = mode == Recompute::Full        ? ab.act_bytes_ckpt
                        : mode == Recompute::Selective ? ab.act_bytes_sel
                                                       : ab.act_bytes_kept;
      if (need(act) / n > usable) continue;
      double f = 0;
      for (int x = k; x <= j && mode != Recompute::None; ++x)
        f += (mode == Recompute::Full ? ab.fwd_flops : ab.sel_flops)[static_cast<std::size_t>(x)];
      extra_flops = f;
      break;
    }
    if (!extra_flops) return std::nullopt;
    const auto& spec = ctx.mesh_spec(meshes[0].mesh);
    const double extra = *extra_flops / (n * peak_or_f32(spec, ctx.dtype_) * spec.matmul(ctx.dtype_).ceiling);
    std::optional<StageChoice> best;
    for (int mi = 0; mi < static_cast<int>(meshes.size()); ++mi) {
      double t = extra;
      bool ok = true;
      for (int b = k; b <= j && ok; ++b) {
        const BlockCost& bc = ctx.block_cost(b, bs, meshes[mi], 0, 0);
        ok = bc.ok;
        t += bc.fwd + bc.bwd;
      }
      if (ok && (!best || t < best->time)) best = StageChoice{k, j, m, mi, 0, 0, t, need(ab.act_bytes)};
    }
    return best;
  };
  in.cost = [&](int s, int k, int j, int m) -> const StageChoice* {
    if (S_max == 1 && (subs[m].shape.num_devices() != D || k != 0 || j != L - 1)) return nullptr;
    if (std::find(usable_subs.begin(), usable_subs.end(), m) == usable_subs.end()) return nullptr;
    const int inf = in_flight(ctx.opt_.schedule, s, M, ctx.opt_.schedule_k);
    auto it = memo.find({k, j, m, inf});
    if (it == memo.end())
      it = memo.emplace(std::make_tuple(k, j, m, inf),
                        relaxed ? relaxed_stage(k, j, m, inf)
                                : best_stage(ctx, subs[m].meshes, k, j, m, bs, M, inf, 0, nullptr, dp))
               .first;
    return it->second ? &*it->second : nullptr;
  };
  std::vector<Candidate> out;
  const auto paths = stage_dp(ctx, in);
  for (int s = 1; s <= S_max; ++s)
    if (paths[static_cast<std::size_t>(s)])
      out.push_back(candidate_of(*paths[static_cast<std::size_t>(s)],
                                 s == 1 ? (dp == 1 ? "spmd" : "spmd x data parallel") : "pipeline", M, dp,
                                 bs));
  return out;
}

// Contiguous split of blocks into p groups minimising the max group FLOPs (exact DP).
std::vector<std::pair<int, int>> balanced_split(const pipeline::LayerGrouping& gr, int p) {
  const int L = static_cast<int>(gr.blocks.size());
  std::vector<double> pre(L + 1, 0);
  for (int b = 0; b < L; ++b) pre[b + 1] = pre[b] + gr.blocks[b].compute_flops();
  std::vector<std::vector<double>> F(p + 1, std::vector<double>(L + 1, kInf));
  std::vector<std::vector<int>> arg(p + 1, std::vector<int>(L + 1, -1));
  F[0][0] = 0;
  for (int s = 1; s <= p; ++s)
    for (int e = s; e <= L; ++e)
      for (int b = s - 1; b < e; ++b) {
        const double v = std::max(F[s - 1][b], pre[e] - pre[b]);
        if (v < F[s][e]) F[s][e] = v, arg[s][e] = b;
      }
  std::vector<std::pair<int, int>> out(p);
  int e = L;
  for (int s = p; s >= 1; --s) {
    const int b = arg[s][e];
    out[s - 1] = {b, e - 1};
    e = b;
  }
  return out;
}

// ---------------------------------------------------------------- materialisation

sharding::ShardingSpec parse_spec_or_replicated(const std::string& text,
                                                const std::vector<std::int64_t>& shape,
                                                const std::vector<std::int64_t>& mesh) {
  if (text.empty()) return sharding::ShardingSpec::replicated(shape, mesh);
  // A partial result is reduced before it leaves its stage: what crosses is the reduced layout.
  return sharding::ShardingSpec::parse(text, shape, mesh).reduced();
}

DType graph_compute_dtype(const ir::Graph& g) {
  double best = -1;
  DType dt = DType::F32;
  for (const auto& op : g.ops())
    if (op.flops() > best) best = op.flops(), dt = cost::compute_dtype(g, op);
  return dt;
}

Built materialise_in_place(Context& ctx, const std::vector<SubmeshOptions>& subs, const Candidate& cand,
                           reshard::Balancer balancer) {
  const ir::Graph& g = ctx.g_;
  const auto& c = ctx.c_;
  const auto& opt = ctx.opt_;
  Built out;
  Plan& p = out.plan;
  p.model = g.name();
  p.graph_fingerprint = ir::graph_fingerprint(g);
  p.cluster = c.to_string();
  p.strategy = cand.strategy;
  p.schedule = opt.schedule;
  p.schedule_k = opt.schedule_k;
  p.schedule_v = opt.schedule_v;
  p.num_microbatches = cand.M;
  p.microbatch_size = cand.bs;
  p.data_parallel = cand.dp;
  p.num_blocks = ctx.L();
  p.memory_limit = ctx.usable_memory;
  const int S = static_cast<int>(cand.stages.size());
  const int dp = cand.dp;
  if (opt.schedule == "interleaved" && cand.M < S && opt.schedule_v > 1) {
    out.note = fmt::format("interleaved needs at least as many micro-batches ({}) as stages ({})", cand.M, S);
    return out;
  }
  // Devices: explicit (baselines) or the pipeline replicated and placed by the pipeline module.
  std::vector<std::vector<int>> all_devs(S), rep0(S);
  std::vector<const MeshOption*> mopt(S);
  if (!cand.devices.empty()) {
    for (int s = 0; s < S; ++s) {
      all_devs[s] = cand.devices[s];
      mopt[s] = &cand.meshes[s];
      rep0[s] = cand.meshes[s].mesh.device_ids();
    }
  } else {
    std::vector<pipeline::SubmeshShape> shapes;
    for (const auto& st : cand.stages) shapes.push_back(subs[st.submesh].shape);
    const auto rp = pipeline::replicate_pipeline(c, shapes);
    WEFT_ASSERT(rp.replicas == dp, "replica count differs from the candidate's");
    for (int s = 0; s < S; ++s) {
      mopt[s] = &subs[cand.stages[s].submesh].meshes[cand.stages[s].mesh];
      rep0[s] = rp.placements[0][s].device_ids;
      for (int r = 0; r < dp; ++r)
        all_devs[s].insert(all_devs[s].end(), rp.placements[r][s].device_ids.begin(),
                           rp.placements[r][s].device_ids.end());
    }
  }
  std::vector<cluster::DeviceMesh> meshes;  // per stage, replica 0
  std::vector<int> block_stage(ctx.L(), -1);
  for (int s = 0; s < S; ++s) {
    meshes.emplace_back(mopt[s]->logical, rep0[s]);
    for (int b = cand.stages[s].first; b <= cand.stages[s].last; ++b) block_stage[b] = s;
  }
  std::vector<int> stage_of_op(g.ops().size(), -1);
  for (ir::OpId o = 0; o < static_cast<ir::OpId>(g.ops().size()); ++o) {
    const int b = ctx.grouping.block_of_op[o];
    stage_of_op[o] = b >= 0 ? block_stage[b] : S - 1;
  }
  const auto& ab = ctx.blocks_at(cand.bs);
  struct InStage {
    const BlockCost* cost;
    int index;                        // tensor index in the block graph
    std::vector<std::int64_t> shape;  // at the micro-batch size
  };
  std::vector<std::map<std::string, InStage>> tensor_in_stage(S);
  for (int s = 0; s < S; ++s) {
    const auto& st = cand.stages[s];
    Stage stage;
    stage.index = s;
    stage.first_block = st.first;
    stage.last_block = st.last;
    stage.devices = all_devs[s];
    stage.mesh_shape = mopt[s]->logical;
    if (dp > 1) stage.mesh_shape.insert(stage.mesh_shape.begin(), dp);
    const StageAgg plain = aggregate(ctx, st.first, st.last, cand.bs, *mopt[s], st.variant, st.forced_dp);
    WEFT_ASSERT(plain.ok, "a chosen stage has a failed block cost");
    StageAgg a = !st.recompute_set.empty() ? recomputed_blocks(plain, st.recompute_set)
                                           : recomputed(plain, st.recompute);
    stage.recompute = std::string(recompute_name(a.recompute));
    // Some blocks only: in the grouping's own numbering (what the lowering's units are).
    for (int b : a.recompute_set)
      stage.recompute_blocks.push_back(ctx.original_block[static_cast<std::size_t>(st.first + b)]);
    std::sort(stage.recompute_blocks.begin(), stage.recompute_blocks.end());
    stage.forward_time = a.fwd;
    stage.backward_time = a.bwd;
    stage.weight_time = a.wgt;
    stage.optimizer_time = a.upd;
    stage.compute_time = a.compute;
    stage.comm_time = a.comm;
    stage.static_memory = a.static_mem;
    stage.activation_memory = a.act_mem;
    stage.transient_memory = a.transient;
    // The layouts for lowering, on the SPMD mesh (replica 0's): every op of the stage's blocks
    // (an op is in one block) by its id in the micro-batch graph, and every leaf of the training
    // graph the stage reads with the spec of the first block that reads it.
    std::vector<std::pair<ir::OpId, OpLayout>> layouts;
    std::map<std::string, std::string> leaf_spec;
    for (int b = st.first; b <= st.last; ++b) {
      const BlockCost& bc = ctx.block_cost(b, cand.bs, *mopt[s], st.variant, st.forced_dp);
      const auto& sg = ab.blocks[b];
      const auto& bg = sg.graph;
      for (int t = 0; t < static_cast<int>(bg.tensors().size()); ++t) {
        const auto& info = bg.tensor(t);
        tensor_in_stage[s].emplace(info.name, InStage{&bc, t, info.shape});
        if (info.role == ir::Role::Parameter && info.producer == ir::kNoOp)
          stage.params.push_back(
              {info.name, info.shape, (dp > 1 ? "R " : "") + bc.spec[t], bc.local_bytes[t]});
      }
      WEFT_ASSERT(bc.axes.size() == bg.ops().size(), "a block cost without the ops' layouts");
      for (ir::OpId o = 0; o < static_cast<ir::OpId>(bg.ops().size()); ++o) {
        OpLayout ol;
        ol.op = bg.op(o).name;
        for (const auto& ax : bc.axes[o]) {
          ol.factors.push_back(ax.factor);
          ol.inner_strides.push_back(ax.inner_stride);
        }
        layouts.emplace_back(sg.original_op[o], std::move(ol));
        for (ir::TensorId t : bg.op(o).inputs) {
          if (g.tensor(sg.original_tensor[t]).producer != ir::kNoOp) continue;
          const auto& info = bg.tensor(t);
          if (leaf_spec.count(info.name)) continue;
          std::string spec = bc.spec[t];
          if (spec.empty())
            spec = sharding::ShardingSpec::replicated(info.shape, mopt[s]->mesh.shape()).to_string();
          leaf_spec.emplace(info.name, std::move(spec));
        }
      }
    }
    std::sort(layouts.begin(), layouts.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
    for (std::size_t i = 0; i < layouts.size(); ++i) {
      WEFT_ASSERT(i == 0 || layouts[i - 1].first != layouts[i].first, "an op in two blocks of a stage");
      stage.op_layouts.push_back(std::move(layouts[i].second));
    }
    for (auto& [name, spec] : leaf_spec) stage.leaf_specs.push_back({name, std::move(spec)});
    // Stable: a parameter read by several blocks (a tied embedding) keeps the first block's spec,
    // as leaf_specs does.
    std::stable_sort(stage.params.begin(), stage.params.end(),
                     [](const ParamSpec& x, const ParamSpec& y) { return x.name < y.name; });
    stage.params.erase(std::unique(stage.params.begin(), stage.params.end(),
                                   [](const ParamSpec& x, const ParamSpec& y) { return x.name == y.name; }),
                       stage.params.end());
    // Gradient synchronisation once per step: inside the stage's mesh (a.grad_sync) and, with
    // data-parallel replicas, one all-reduce across them. With overlap (bucketed, as DDP / Horovod /
    // Megatron's overlap_grad_reduce) it runs during the last micro-batch's backward, bucket by
    // bucket: exposed = max(sync of one bucket, sync − backward); without, all of it is exposed.
    // With ZeRO (StageChoice::zero) the replicas shard the states instead (zero.cpp), priced here
    // on the placed devices.
    double grad_bytes = 0;
    for (const auto& pr : stage.params) grad_bytes += pr.bytes_per_device;
    const int zero = dp > 1 ? st.zero : 0, group = zero > 0 ? st.zero_group : dp;
    a = zero > 0 && !st.zero3_set.empty()
            ? with_mixed_zero(a, zero, st.zero3_set, replica_links(c, all_devs[s], dp, group), grad_bytes,
                              opt)
            : with_replicas(a, zero, replica_links(c, all_devs[s], dp, group), grad_bytes, opt);
    stage.zero = a.zero;
    stage.zero_group = a.zero_group;
    stage.replica = a.replica;
    for (int b : a.zero3_set)  // in the grouping's own numbering, as recompute_blocks
      stage.zero_blocks.push_back(ctx.original_block[static_cast<std::size_t>(st.first + b)]);
    std::sort(stage.zero_blocks.begin(), stage.zero_blocks.end());
    stage.forward_time = a.fwd;
    stage.backward_time = a.bwd;
    stage.weight_time = std::min(a.wgt, a.bwd);
    stage.optimizer_time = a.upd;
    stage.comm_time = a.comm;
    stage.static_memory = a.static_mem;
    stage.transient_memory = a.transient;
    for (ir::OpId o = 0; o < static_cast<ir::OpId>(g.ops().size()); ++o)
      if (stage_of_op[o] == s) stage.ops.push_back(g.op(o).name);
    p.stages.push_back(std::move(stage));
  }
  // Cross-stage tensors: read in stage b, produced in stage a != b (within one replica). Per
  // micro-batch, except a gradient contribution that only a parameter's gradient sum reads on b
  // (a tied embedding's other use): accumulated on a and sent once per step, before b's update —
  // and a tied parameter's new value, sent once per step from the stage that updates it to the
  // other stages that read it. The lowering (lower::lower_pipeline) moves exactly these.
  struct Crossing {
    ir::TensorId tensor;
    sharding::ShardingSpec src, dst;
    bool refresh;
  };
  std::map<std::tuple<int, int, bool>, std::vector<Crossing>> pairs;  // (from, to, once per step)
  std::vector<std::set<ir::TensorId>> seen(S);
  const auto sums = pipeline::gradient_sums_into_update(g);
  const auto readers = g.consumer_index();
  auto once_per_step = [&](ir::TensorId t, int b) {
    for (ir::OpId r : readers[t])
      if (stage_of_op[r] == b && !sums[r]) return false;
    return true;
  };
  // A partial result (its block left the sum to its consumers) is reduced on its own stage's mesh
  // before it leaves: per micro-batch in the producing stage's forward / backward, or once per
  // step for an accumulated gradient sent once per step (as the transfer below).
  auto reduce_time = [&](int a, const std::string& text, const std::vector<std::int64_t>& shape, DType dt) {
    if (text.empty()) return 0.0;
    const auto from = sharding::ShardingSpec::parse(text, shape, meshes[a].shape());
    if (!from.has_partial()) return 0.0;
    const auto to = parse_spec_or_replicated(text, shape, meshes[a].shape());
    return ctx.reshard_planner(ctx.mesh_key(meshes[a]), meshes[a], dtype_size(dt)).plan(from, to).time;
  };
  for (ir::OpId o = 0; o < static_cast<ir::OpId>(g.ops().size()); ++o) {
    const int b = stage_of_op[o];
    for (ir::TensorId t : g.op(o).inputs) {
      const auto& info = g.tensor(t);
      if (info.producer == ir::kNoOp) continue;
      const int a = stage_of_op[info.producer];
      if (a == b || !seen[b].insert(t).second) continue;
      auto src_it = tensor_in_stage[a].find(info.name);
      auto dst_it = tensor_in_stage[b].find(info.name);
      WEFT_ASSERT(src_it != tensor_in_stage[a].end() && dst_it != tensor_in_stage[b].end(),
                  "a cross-stage tensor is missing from its stage graphs");
      const auto& shape = src_it->second.shape;
      const std::string& src_text = src_it->second.cost->spec[src_it->second.index];
      auto src = parse_spec_or_replicated(src_text, shape, meshes[a].shape());
      auto dst =
          parse_spec_or_replicated(dst_it->second.cost->spec[dst_it->second.index], shape, meshes[b].shape());
      const bool once = once_per_step(t, b);
      pairs[{a, b, once}].push_back({t, src, dst, false});
      if (const double red = reduce_time(a, src_text, shape, info.dtype); red > 0) {
        if (once) {
          p.stages[b].optimizer_time += red;
        } else {
          auto& st = p.stages[a];
          (b > a ? st.forward_time : st.backward_time) += red;
          st.comm_time += red;
        }
      }
    }
  }
  // Tied parameters: the update's stage sends the new value to every other stage reading the leaf.
  for (ir::OpId o = 0; o < static_cast<ir::OpId>(g.ops().size()); ++o) {
    if (ctx.phase[o] != pipeline::OpPhase::Update) continue;
    const int u = stage_of_op[o];
    for (ir::TensorId t : g.op(o).inputs) {
      const auto& info = g.tensor(t);
      if (info.producer != ir::kNoOp || info.role != ir::Role::Parameter) continue;
      std::set<int> others;
      for (ir::OpId r : readers[t])
        if (stage_of_op[r] != u) others.insert(stage_of_op[r]);
      auto spec_in = [&](int s) {
        for (const auto& l : p.stages[s].leaf_specs)
          if (l.tensor == info.name) return parse_spec_or_replicated(l.spec, info.shape, meshes[s].shape());
        return sharding::ShardingSpec::replicated(info.shape, meshes[s].shape());
      };
      for (int v : others) pairs[{u, v, true}].push_back({t, spec_in(u), spec_in(v), true});
    }
  }
  const auto hosts = reshard::HostMap::from_cluster(c);
  reshard::PlanOptions ro;
  ro.balancer = balancer;
  ro.time_limit_s = 0.5;
  ro.dfs_node_limit = 20000;
  ro.greedy_restarts = 4;
  p.send_time.assign(std::max(0, S - 1), 0.0);
  p.boundary_bytes.assign(std::max(0, S - 1), 0.0);
  std::vector<double> fwd_time(std::max(0, S - 1), 0.0), bwd_time(std::max(0, S - 1), 0.0);
  for (auto& [key, list] : pairs) {
    const auto [a, b, once] = key;
    std::vector<reshard::TensorReshard> trs;
    double total_bytes = 0;
    for (const auto& x : list) {
      const auto& info = g.tensor(x.tensor);
      trs.emplace_back(x.src.tensor_shape(), info.dtype, x.src, meshes[a], x.dst, meshes[b]);
      total_bytes += static_cast<double>(trs.back().bytes());
    }
    const double joint = reshard::plan(reshard::make_problem(trs, hosts), ro).completion_time;
    for (std::size_t i = 0; i < list.size(); ++i) {
      const auto& info = g.tensor(list[i].tensor);
      CrossTensor ct;
      ct.name = info.name;
      ct.from_stage = a;
      ct.to_stage = b;
      ct.shape = trs[i].shape();
      ct.dtype = std::string(dtype_name(info.dtype));
      ct.bytes = trs[i].bytes();
      ct.src_spec = list[i].src.to_string();
      ct.dst_spec = list[i].dst.to_string();
      ct.per_step = once;
      ct.refresh = list[i].refresh;
      // Each tensor alone (for the report); the joint plan's time is what the pipeline pays.
      auto one = reshard::plan(reshard::make_problem({trs[i]}, hosts), ro);
      ct.reshard_time = one.completion_time;
      ct.lower_bound = one.bound.value;
      ct.reshard_summary = one.summary();
      p.cross_tensors.push_back(std::move(ct));
    }
    if (once) {
      // Once per step, before b's update (a gradient contribution, or after a's update, a tied
      // parameter's new value: charged to b's update too).
      p.stages[b].optimizer_time += joint;
    } else if (b > a) {
      fwd_time[b - 1] += joint;  // (a skip connection: its last hop lands on the boundary before b)
      p.boundary_bytes[b - 1] += total_bytes;
    } else {
      bwd_time[b] += joint;  // the gradient's last hop lands on the boundary after b
    }
  }
  for (int i = 0; i + 1 < S; ++i) p.send_time[i] = std::max(fwd_time[i], bwd_time[i]);
  // Memory per device under the schedule, then the simulation.
  const schedule::Schedule sched = schedule_of(p);
  const auto inflight = sched.peak_in_flight_device();
  double peak = 0;
  std::string over;  // the first stage over its devices' usable memory
  for (int s = 0; s < S; ++s) {
    auto& st = p.stages[s];
    st.in_flight = inflight[s];
    // A chunk of an interleaved / V schedule holds 1/v of the stage's activations (as pipeline_of).
    st.peak_memory = st.static_memory + st.in_flight * st.activation_memory / sched.virtual_stages() +
                     st.transient_memory;
    peak = std::max(peak, st.peak_memory);
    double usable = kInf;
    for (int d : st.devices) usable = std::min(usable, ctx.usable_of_device(d));
    if (over.empty() && st.peak_memory > usable * (1 + 1e-9))
      over = fmt::format("stage {}: peak {:.3g} GB/device > {:.3g} GB usable", s, st.peak_memory / 1e9,
                         usable / 1e9);
    for (int d : st.devices) {
      p.devices_used.push_back(d);
      p.device_memory.push_back(st.peak_memory);
    }
  }
  const sim::SimResult r = resimulate(p);
  p.step_time = r.step_time;
  p.bubble_fraction = r.bubble_fraction;
  p.peak_memory = peak;
  const double samples =
      static_cast<double>(p.num_microbatches) * static_cast<double>(p.microbatch_size) * dp;
  p.throughput = p.step_time > 0 ? samples / p.step_time : 0;
  double model_flops = 0;
  for (ir::OpId o = 0; o < static_cast<ir::OpId>(g.ops().size()); ++o)
    if (ctx.phase[o] != pipeline::OpPhase::Update) model_flops += g.op(o).flops();
  // The graph is the global batch: its forward + backward FLOPs are one step's model FLOPs.
  p.model_flops = model_flops;
  const DType dt = ctx.dtype_;
  p.cluster_peak_flops = 0;
  for (int d : p.devices_used) {
    const auto& spec = c.device(d).spec;
    p.cluster_peak_flops += peak_or_f32(spec, dt);
  }
  p.mfu = p.step_time > 0 ? p.model_flops / (p.step_time * p.cluster_peak_flops) : 0;
  out.feasible = over.empty();
  if (!out.feasible) out.note = over;
  return out;
}

void Context::reorder_blocks(const std::vector<int>& order) {
  const int n = L();
  WEFT_ASSERT(static_cast<int>(order.size()) == n, "reorder_blocks: not a permutation of the blocks");
  std::vector<int> new_of(static_cast<std::size_t>(n), -1);
  for (int i = 0; i < n; ++i) new_of[static_cast<std::size_t>(order[static_cast<std::size_t>(i)])] = i;
  auto permute = [&](auto& v) {
    auto old = v;
    for (int i = 0; i < n; ++i)
      v[static_cast<std::size_t>(i)] = old[static_cast<std::size_t>(order[static_cast<std::size_t>(i)])];
  };
  permute(grouping.blocks);
  permute(block_state_bytes);
  permute(block_param_bytes);
  permute(original_block);
  crossing_tables.clear();  // indexed by block; the structural crossing_cost stays valid
  for (auto& b : grouping.block_of_op)
    if (b >= 0) b = new_of[static_cast<std::size_t>(b)];
  grouping.crossing_bytes.clear();
  for (auto& [bs, ab] : at_batch) {
    permute(ab.blocks);
    permute(ab.keys);
    permute(ab.act_bytes);
    permute(ab.act_bytes_kept);
    permute(ab.act_bytes_sel);
    permute(ab.act_bytes_ckpt);
    permute(ab.sel_flops);
    permute(ab.fwd_flops);
  }
}

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

Built materialise(Context& ctx, const std::vector<SubmeshOptions>& subs, const Candidate& cand,
                  reshard::Balancer balancer) {
  // A candidate found in a stage-ILP block order is materialised in that order.
  BlockOrderScope scope(ctx, cand.block_order);
  return materialise_in_place(ctx, subs, cand, balancer);
}

std::vector<std::vector<int>> ilp_block_orders(Context& ctx, int max_stages) {
  const int L = ctx.L();
  if (L < 3) return {};
  // The DAG of the blocks: compute = the block's forward + backward FLOPs, values = forward
  // activations made in one block and read in others.
  const pipeline::PartitionDag ops = pipeline::dag_from_graph(ctx.g_);
  pipeline::PartitionDag dag;
  for (const auto& b : ctx.grouping.blocks) dag.compute.push_back(b.compute_flops());
  bool chain = true;
  for (const auto& v : ops.values) {
    const int a = ctx.grouping.block_of_op[ops.op_of_node[static_cast<std::size_t>(v.producer)]];
    std::vector<int> cons;
    for (int c : v.consumers) {
      const int b = ctx.grouping.block_of_op[ops.op_of_node[static_cast<std::size_t>(c)]];
      if (b != a && std::find(cons.begin(), cons.end(), b) == cons.end()) cons.push_back(b);
    }
    if (a < 0 || cons.empty()) continue;
    for (int b : cons) chain = chain && b == a + 1;
    dag.values.push_back({a, cons, v.bytes});
  }
  if (chain) return {};  // every contiguous cut is already in the DP's space
  std::vector<std::vector<int>> out;
  for (int S = 2; S <= std::min(L, max_stages); ++S) {
    // The tightest balance tolerance that has a solution (coarse blocks rarely balance within 10%).
    pipeline::IlpPartition part;
    for (double eps : {0.1, 0.25, 0.5}) {
      pipeline::IlpPartitionOptions io;
      io.num_stages = S;
      io.epsilon = eps;
      io.time_limit_s = std::min(5.0, ctx.opt_.spmd_time_limit_s * 2);
      try {
        part = pipeline::partition_dag_ilp(dag, io);
      } catch (const Error&) {
        continue;  // the bounds show no ε-balanced partition with S stages exists
      }
      if (part.has_solution()) break;
    }
    if (!part.has_solution()) continue;
    std::vector<int> order(static_cast<std::size_t>(L));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int x, int y) {
      return part.stage_of_node[static_cast<std::size_t>(x)] <
             part.stage_of_node[static_cast<std::size_t>(y)];
    });
    bool identity = true;
    for (int i = 0; i < L; ++i) identity = identity && order[static_cast<std::size_t>(i)] == i;
    if (!identity && std::find(out.begin(), out.end(), order) == out.end()) out.push_back(order);
  }
  return out;
}

std::string layout_text(const Plan& p) {
  std::string s = fmt::format("M={} dp={} {} stage{}:", p.num_microbatches, p.data_parallel, p.num_stages(),
                              p.num_stages() == 1 ? "" : "s");
  for (const auto& st : p.stages)
    s += fmt::format(" [{}-{}]@{}", st.first_block, st.last_block, mesh_text(st.mesh_shape));
  return s;
}

void validate_options(const PlanOptions& o, const cluster::Cluster& c) {
  static const std::set<std::string> kinds{"1f1b",  "gpipe",          "kfkb", "eager_1f1b", "interleaved",
                                           "zb_h1", "zb_interleaved", "zbv",  "kfkb_interleaved"};
  WEFT_CHECK(kinds.count(o.schedule),
             "make_plan: unknown schedule '{}' (1f1b, gpipe, kfkb, eager_1f1b, interleaved, zb_h1, "
             "zb_interleaved, zbv, kfkb_interleaved)",
             o.schedule);
  WEFT_CHECK(o.num_microbatches >= 0, "make_plan: num_microbatches must be >= 0 (0 = auto; got {})",
             o.num_microbatches);
  WEFT_CHECK(o.num_blocks >= 0, "make_plan: num_blocks must be >= 0 (got {})", o.num_blocks);
  WEFT_CHECK(o.max_stages >= 0, "make_plan: max_stages must be >= 0 (got {})", o.max_stages);
  WEFT_CHECK(o.max_data_parallel >= 0, "make_plan: max_data_parallel must be >= 0 (got {})",
             o.max_data_parallel);
  WEFT_CHECK(o.schedule_k >= 1 && o.schedule_v >= 1, "make_plan: schedule_k and schedule_v must be >= 1");
  WEFT_CHECK(o.spmd_time_limit_s > 0 && o.time_limit_s > 0, "make_plan: time limits must be > 0");
  WEFT_CHECK(o.memory_fraction > 0 && o.memory_fraction <= 1, "make_plan: memory_fraction must be in (0, 1]");
  WEFT_CHECK(o.memory_limit >= 0, "make_plan: memory_limit must be >= 0 (0 = the device's memory)");
  WEFT_CHECK(o.zero >= -1 && o.zero <= 3, "make_plan: zero must be -1 (auto) or a ZeRO level 0..3 (got {})",
             o.zero);
  WEFT_CHECK(o.grad_bucket_bytes > 0, "make_plan: grad_bucket_bytes must be > 0 (got {})",
             o.grad_bucket_bytes);
  WEFT_CHECK(c.num_devices() >= 1, "make_plan: the cluster has no device");
}

double usable_memory_of(const PlanOptions& o, const cluster::Cluster& c) {
  double mem = kInf;
  for (const auto& d : c.devices()) mem = std::min(mem, d.spec.memory_bytes);
  if (o.memory_limit > 0) mem = o.memory_limit;
  return mem * o.memory_fraction;
}

int auto_blocks(const ir::Graph& g, const PlanOptions& o) {
  if (o.num_blocks > 0) return o.num_blocks;
  int fwd = 0;
  for (auto ph : pipeline::classify_ops(g))
    if (ph == pipeline::OpPhase::Forward) ++fwd;
  return std::max(1, std::min(fwd, 16));
}

void check_total_memory(const Context& ctx) {
  const auto& c = ctx.c_;
  const double need = model_state_bytes(ctx.g_);
  double have = 0;
  for (const auto& d : c.devices()) have += ctx.usable_of_device(d.id);
  if (need > have)
    fail(
        "make_plan: the model cannot fit: its parameters, gradients and optimizer states need {:.4g} GB, "
        "the cluster has {:.4g} GB usable ({} devices, {:.4g} GB on the smallest): {:.4g} GB missing",
        need / 1e9, have / 1e9, c.num_devices(), ctx.usable_memory / 1e9, (need - have) / 1e9);
}

// Micro-batch counts to try: the given one, or the powers of two dividing the batch (auto).
std::vector<int> microbatch_counts(const PlanOptions& o, std::int64_t B) {
  if (o.num_microbatches > 0) {
    WEFT_CHECK(B % o.num_microbatches == 0, "make_plan: the batch {} is not divisible by num_microbatches {}",
               B, o.num_microbatches);
    return {o.num_microbatches};
  }
  std::vector<int> out;
  for (std::int64_t m = 1; m <= B && (o.max_microbatches <= 0 || m <= o.max_microbatches); m *= 2)
    if (B % m == 0) out.push_back(static_cast<int>(m));
  return out;
}

bool replica_may_fit(Context& ctx, std::int64_t bs, int D, bool kept) {
  return ctx.min_bytes(ctx.blocks_at(bs), 0, ctx.L() - 1, 1, kept, ctx.c_.num_devices() / D) / D <=
         ctx.usable_memory;
}

std::vector<ReplicaConfig> replica_configs(Context& ctx, const std::vector<int>& Ms, int* pruned) {
  // With recompute=auto, the pairs that fit only by recomputing (a replica cannot hold one
  // micro-batch's activations otherwise) are searched only when no pair fits without: each one
  // costs the SPMD searches of its micro-batch size, for a plan that rarely wins (fewer
  // micro-batches: a larger bubble). GPT-39B on 64 V100 planned in 126 s with them, 8 s without,
  // to the same plan. Stages inside the searched pairs still recompute where that pays.
  std::vector<ReplicaConfig> out;
  int left_out = 0;
  for (bool kept : {ctx.opt_.recompute == Recompute::Auto, false}) {
    out.clear();
    left_out = 0;
    for (int M : Ms)
      for (int d : dp_degrees(ctx.opt_, ctx.c_, ctx.global_batch / M)) {
        const std::int64_t bs = ctx.global_batch / (static_cast<std::int64_t>(M) * d);
        if (!ctx.rebatch_note(bs).empty()) continue;  // the batch stays whole (search_space says why)
        if (!ctx.opt_.bound_search || replica_may_fit(ctx, bs, ctx.c_.num_devices() / d, kept))
          out.push_back({M, d});
        else
          ++left_out;
      }
    if (!out.empty()) break;
  }
  if (pruned) *pruned = left_out;
  return out;
}

std::vector<int> dp_degrees(const PlanOptions& o, const cluster::Cluster& c, std::int64_t per_mb) {
  std::vector<int> out;
  const int N = c.num_devices();
  for (int d = 1; d <= N; ++d) {
    if (N % d || per_mb % d) continue;
    if (o.max_data_parallel > 0 && d > o.max_data_parallel) continue;
    if (!o.pipeline && d != 1 && d != N) continue;
    out.push_back(d);
  }
  return out;
}

Context make_context(const ir::Graph& g, const cluster::Cluster& c, const PlanOptions& o, double start,
                     bool layout_evaluation) {
  validate_options(o, c);
  Context ctx(g, c, o, start);
  ctx.usable_memory = usable_memory_of(o, c);
  // Fail fast, before any search (a layout evaluation asked for an infeasible plan prices it anyway).
  if (!(layout_evaluation && o.allow_infeasible)) check_total_memory(ctx);
  (void)batch_size(g);
  return ctx;
}

Context given_shares_context(const ir::Graph& g, const cluster::Cluster& c, const PlanOptions& o,
                             double start, int M, std::size_t shares, const char* who, const char* what) {
  Context ctx = make_context(g, c, o, start);
  ctx.init_blocks(auto_blocks(g, o));
  WEFT_CHECK(M >= 1 && ctx.global_batch % M == 0, "{}: the batch {} is not divisible by {} micro-batches",
             who, ctx.global_batch, M);
  WEFT_CHECK(static_cast<int>(shares) == c.num_devices(),
             "{}: {} {} for {} devices (one per device, in id order)", who, shares, what, c.num_devices());
  return ctx;
}

// Blocks first..last on `mesh` at their unconstrained layouts (the fast variant searched without
// the memory-bound shortcut) with no memory check: how a layout evaluation asked for an infeasible
// plan (PlanOptions::allow_infeasible) prices a stage that fits nowhere; materialise then marks the
// plan infeasible with the memory it needs.
std::optional<StageChoice> unconstrained_stage(Context& ctx, const MeshOption& mesh, int first, int last,
                                               std::int64_t bs, int inflight, int forced_dp,
                                               int replicas = 1) {
  // With recompute=auto the layout is priced as it would run where it fits: without recomputation;
  // with zero=auto likewise at ZeRO level 0.
  const Recompute mode = ctx.opt_.recompute == Recompute::Auto ? Recompute::None : ctx.opt_.recompute;
  StageAgg a = recomputed(aggregate(ctx, first, last, bs, mesh, kUnboundedVariant, forced_dp), mode);
  if (!a.ok) return std::nullopt;
  if (replicas > 1)
    a = with_replicas(a, std::max(0, ctx.opt_.zero),
                      ctx.canonical_replica_links(static_cast<int>(mesh.mesh.size()), replicas, replicas),
                      a.param_mem, ctx.opt_);
  return StageChoice{first,
                     last,
                     0,
                     0,
                     kUnboundedVariant,
                     forced_dp,
                     a.fwd + a.bwd,
                     stage_memory(a, inflight),
                     a.recompute,
                     a.zero,
                     a.zero_group};
}

// A layout evaluation's result: the plan, or with allow_infeasible the plan marked infeasible.
Plan evaluated(Built b, const Context& ctx, double start, const std::string& what) {
  if (!b.feasible) {
    WEFT_CHECK(ctx.opt_.allow_infeasible && !b.plan.stages.empty(), "{}: {}", what, b.note);
    b.plan.feasible = false;
    b.plan.infeasible_reason = b.note;
  }
  b.plan.search_status = ctx.timed_out ? "timeout" : "complete";
  b.plan.plan_seconds = now_s() - start;
  return std::move(b.plan);
}

Built megatron_build(Context& ctx, const MegatronLayout& lay, int M) {
  const auto& c = ctx.c_;
  const int N = c.num_devices();
  Built b;
  b.plan.strategy = "megatron " + lay.to_string();
  WEFT_CHECK(lay.t >= 1 && lay.p >= 1 && lay.d >= 1 && lay.t * lay.p * lay.d == N,
             "megatron layout {}: t·p·d must equal the {} devices", lay.to_string(), N);
  if (lay.p > ctx.L()) {
    b.note = fmt::format("{} stages but only {} blocks", lay.p, ctx.L());
    return b;
  }
  if (ctx.global_batch % (static_cast<std::int64_t>(M) * lay.d) != 0) {
    b.note = fmt::format("batch {} not divisible by M·d = {}", ctx.global_batch, M * lay.d);
    return b;
  }
  if (const auto& why = ctx.rebatch_note(ctx.global_batch / (static_cast<std::int64_t>(M) * lay.d));
      !why.empty()) {
    b.note = fmt::format("the batch cannot be split into {} × {}: {}", M, lay.d, why);
    return b;
  }
  Candidate cand;
  cand.strategy = b.plan.strategy;
  cand.M = M;
  cand.dp = lay.d;
  cand.bs = ctx.global_batch / (static_cast<std::int64_t>(M) * lay.d);
  const int per = N / lay.p;  // devices of a stage: d replicas × t
  const auto split = balanced_split(ctx.grouping, lay.p);
  for (int s = 0; s < lay.p; ++s) {
    std::vector<int> ids(per);
    std::iota(ids.begin(), ids.end(), s * per);  // Megatron's rank order: t fastest, then d, then p
    std::vector<int> rep0(ids.begin(), ids.begin() + lay.t);
    cluster::DeviceMesh mesh({lay.t}, rep0);
    cand.meshes.push_back({pipeline::SubmeshShape(1, lay.t), {lay.t}, mesh, ctx.mesh_key(mesh)});
    cand.devices.push_back(ids);
    // The tensor-parallel group's inputs are replicated (Megatron): forced_dp = 1.
    const int inf = in_flight(ctx.opt_.schedule, lay.p - s, M, ctx.opt_.schedule_k);
    std::string why;
    auto sc = best_stage(ctx, {cand.meshes.back()}, split[s].first, split[s].second, 0, cand.bs, M, inf, 1,
                         &why, lay.d);
    if (!sc && ctx.opt_.allow_infeasible)
      sc = unconstrained_stage(ctx, cand.meshes.back(), split[s].first, split[s].second, cand.bs, inf, 1,
                               lay.d);
    if (!sc) {
      b.note = fmt::format("stage {}: {}", s, why);
      return b;
    }
    cand.stages.push_back(*sc);
  }
  return materialise(ctx, {}, cand, reshard::Balancer::LargestFirst);
}

Alternative alternative_of(const Built& b) {
  Alternative a;
  a.strategy = b.plan.strategy;
  a.layout = b.plan.stages.empty() ? "" : layout_text(b.plan);
  a.feasible = b.feasible;
  a.step_time = b.feasible ? b.plan.step_time : 0;
  a.peak_memory = b.plan.peak_memory;
  a.note = b.note;
  return a;
}

void sort_alternatives(std::vector<Alternative>& alts, int max_n, bool summarise_infeasible) {
  std::stable_sort(alts.begin(), alts.end(), [](const Alternative& x, const Alternative& y) {
    if (x.feasible != y.feasible) return x.feasible;
    return x.step_time < y.step_time;
  });
  // The DP and the equal-block enumeration can reach the same layout: list it once.
  std::set<std::tuple<std::string, double, bool>> seen;
  std::erase_if(alts, [&](const Alternative& a) {
    const bool baseline = a.strategy.find("(baseline)") != std::string::npos;
    return a.feasible && !a.layout.empty() && !seen.insert({a.layout, a.step_time, baseline}).second;
  });
  if (summarise_infeasible) {
    // The candidates that do not fit, as one last row: how many, per reason (the note with its
    // numbers blanked, one example each).
    std::map<std::string, std::pair<int, std::string>> reasons;
    int n = 0;
    std::erase_if(alts, [&](const Alternative& a) {
      if (a.feasible) return false;
      std::string key;
      for (char ch : a.note) {
        const bool digit = std::isdigit(static_cast<unsigned char>(ch)) || ch == '.';
        if (!digit || key.empty() || key.back() != '#') key += digit ? '#' : ch;
      }
      auto& r = reasons[key];
      if (r.first++ == 0) r.second = a.strategy + " " + a.layout + ": " + a.note;
      ++n;
      return true;
    });
    if (max_n > 0 && static_cast<int>(alts.size()) >= max_n)
      alts.resize(static_cast<std::size_t>(std::max(0, max_n - (n > 0))));
    if (n > 0) {
      Alternative row;
      row.strategy = "infeasible";
      row.layout = fmt::format("{} candidate{}", n, n == 1 ? "" : "s");
      row.feasible = false;
      std::vector<std::pair<int, std::string>> by_count;
      for (auto& [key, r] : reasons) by_count.push_back(r);
      std::stable_sort(by_count.begin(), by_count.end(),
                       [](const auto& x, const auto& y) { return x.first > y.first; });
      for (const auto& [k, example] : by_count)
        row.note += fmt::format("{}{} x (e.g. {})", row.note.empty() ? "" : "; ", k, example);
      alts.push_back(std::move(row));
    }
    return;
  }
  if (max_n > 0 && static_cast<int>(alts.size()) > max_n) alts.resize(static_cast<std::size_t>(max_n));
}

// The first t devices of the cluster as a 1-D tensor-parallel mesh: Megatron's stage meshes all
// have its key (same shape, kind and links), so its block costs serve every stage.
MeshOption megatron_mesh(Context& ctx, int t) {
  std::vector<int> ids(static_cast<std::size_t>(t));
  std::iota(ids.begin(), ids.end(), 0);
  cluster::DeviceMesh mesh({t}, ids);
  return {pipeline::SubmeshShape(1, t), {t}, mesh, ctx.mesh_key(mesh)};
}

// Every Megatron layout × micro-batch count; the best first.
std::pair<std::optional<Built>, std::vector<Alternative>> megatron_all(Context& ctx) {
  std::optional<Built> best;
  std::vector<Alternative> alts;
  const auto& o = ctx.opt_;
  const auto layouts = megatron_layouts(ctx.c_, std::min(ctx.L(), o.max_stages > 0 ? o.max_stages : ctx.L()));
  const auto Ms = microbatch_counts(o, ctx.global_batch);
  // The user's limits bound the baselines too.
  auto allowed = [&](const MegatronLayout& lay) {
    return !(o.max_data_parallel > 0 && lay.d > o.max_data_parallel) && !(!o.pipeline && lay.p > 1) &&
           !(o.max_stages > 0 && lay.p > o.max_stages);
  };
  // The memory bound of make_plan's pairs, on the layout's replica (t·p devices); a batch that M·d
  // does not divide is left to megatron_build's note.
  // With recompute=auto, as make_plan's pairs: the counts that fit only by recomputing are tried
  // for a layout only when none fits without.
  auto may_fit_as = [&](const MegatronLayout& lay, int M, bool kept) {
    const std::int64_t per = static_cast<std::int64_t>(M) * lay.d;
    return ctx.global_batch % per != 0 || !ctx.rebatch_note(ctx.global_batch / per).empty() ||
           replica_may_fit(ctx, ctx.global_batch / per, lay.t * lay.p, kept);  // else megatron_build's note
  };
  // A layout that fits only by recomputing is tried at its two largest micro-batch counts (the
  // smallest micro-batches: Megatron's choice when memory binds); each count costs SPMD searches.
  auto may_fit = [&](const MegatronLayout& lay, int M) {
    if (o.recompute != Recompute::Auto) return may_fit_as(lay, M, false);
    std::vector<int> fit_kept, fit_any;
    for (int m : Ms) {
      const std::int64_t per = static_cast<std::int64_t>(m) * lay.d;
      if (ctx.global_batch % per) continue;
      if (may_fit_as(lay, m, true)) fit_kept.push_back(m);
      if (may_fit_as(lay, m, false)) fit_any.push_back(m);
    }
    const std::int64_t per = static_cast<std::int64_t>(M) * lay.d;
    if (ctx.global_batch % per) return true;  // left to megatron_build's note
    if (!fit_kept.empty()) return std::find(fit_kept.begin(), fit_kept.end(), M) != fit_kept.end();
    std::sort(fit_any.rbegin(), fit_any.rend());
    if (fit_any.size() > 2) fit_any.resize(2);
    return std::find(fit_any.begin(), fit_any.end(), M) != fit_any.end();
  };
  {
    // Their SPMD searches on every core first (tensor-parallel meshes, inputs replicated).
    std::vector<MeshOption> meshes;
    for (const auto& lay : layouts) meshes.push_back(megatron_mesh(ctx, lay.t));
    std::vector<Context::BlockRequest> reqs;
    for (std::size_t li = 0; li < layouts.size(); ++li)
      for (int M : Ms) {
        const auto& lay = layouts[li];
        const std::int64_t per = static_cast<std::int64_t>(M) * lay.d;
        if (!allowed(lay) || lay.p > ctx.L() || ctx.global_batch % per ||
            !ctx.rebatch_note(ctx.global_batch / per).empty() || !may_fit(lay, M))
          continue;
        for (int b = 0; b < ctx.L(); ++b) reqs.push_back({b, ctx.global_batch / per, &meshes[li], 0, 1});
      }
    if (!ctx.out_of_time()) ctx.prefetch_block_costs(reqs);
  }
  std::size_t i = 0;
  for (const auto& lay : layouts)
    for (int M : Ms) {
      if (!allowed(lay)) continue;
      if (!may_fit(lay, M)) continue;
      if (ctx.out_of_time() && (best || ctx.past_grace())) break;
      ctx.progress("baseline", static_cast<double>(i++) / (layouts.size() * Ms.size()),
                   fmt::format("{} M={}", lay.to_string(), M));
      if (lay.p == 1 && M > 1 && Ms.size() > 1 && M != Ms.front()) {
        // a 1-stage layout gains nothing from more micro-batches except memory: still tried
      }
      Built b = megatron_build(ctx, lay, M);
      if (b.plan.stages.empty() && !b.note.empty() && b.note.find("divisible") != std::string::npos) continue;
      alts.push_back(alternative_of(b));
      if (b.feasible && (!best || b.plan.step_time < best->plan.step_time)) best = std::move(b);
    }
  return {std::move(best), std::move(alts)};
}

}  // namespace detail

using namespace detail;

double model_state_bytes(const ir::Graph& g) {
  double b = 0;
  for (const auto& t : g.tensors())
    if (is_state_leaf(t)) b += static_cast<double>(t.bytes()) * (t.role == ir::Role::Parameter ? 2.0 : 1.0);
  return b;
}

std::string MegatronLayout::to_string() const { return fmt::format("t={} p={} d={}", t, p, d); }

std::vector<MegatronLayout> megatron_layouts(const cluster::Cluster& c, int max_p) {
  const int N = c.num_devices();
  const int G = c.nodes().empty() ? 1 : c.nodes()[0].num_devices;
  std::vector<MegatronLayout> out;
  for (int t = 1; t <= G; ++t) {
    if (G % t || N % t) continue;
    for (int p = 1; p <= N / t; ++p) {
      if ((N / t) % p) continue;
      if (max_p > 0 && p > max_p) continue;
      out.push_back({t, p, N / (t * p)});
    }
  }
  return out;
}

Plan megatron_plan(const ir::Graph& g, const cluster::Cluster& c, const MegatronLayout& layout,
                   const PlanOptions& o) {
  const double start = now_s();
  Context ctx = make_context(g, c, o, start, true);
  ctx.init_blocks(auto_blocks(g, o));
  const auto Ms = microbatch_counts(o, ctx.global_batch);
  std::optional<Built> best, closest;  // closest: the infeasible one with the least peak memory
  std::string why;
  for (int M : Ms) {
    Built b = megatron_build(ctx, layout, M);
    if (b.feasible && (!best || b.plan.step_time < best->plan.step_time)) {
      best = std::move(b);
    } else if (!b.feasible) {
      why = b.note;
      if (!b.plan.stages.empty() && (!closest || b.plan.peak_memory < closest->plan.peak_memory))
        closest = std::move(b);
    }
  }
  if (!best && ctx.opt_.allow_infeasible && closest)
    return evaluated(std::move(*closest), ctx, start, "megatron layout " + layout.to_string());
  WEFT_CHECK(best.has_value(), "megatron layout {} does not fit: {}", layout.to_string(), why);
  return evaluated(std::move(*best), ctx, start, "megatron layout " + layout.to_string());
}

Plan layout_plan(const ir::Graph& g, const cluster::Cluster& c, const std::vector<StageLayout>& layout, int M,
                 const PlanOptions& o) {
  const double start = now_s();
  Context ctx = make_context(g, c, o, start, true);
  ctx.init_blocks(auto_blocks(g, o));
  WEFT_CHECK(M >= 1 && ctx.global_batch % M == 0,
             "layout_plan: the batch {} is not divisible by {} micro-batches", ctx.global_batch, M);
  WEFT_CHECK(!layout.empty(), "layout_plan: no stage");
  const int S = static_cast<int>(layout.size());
  Candidate cand;
  cand.strategy = "layout";
  cand.M = M;
  cand.dp = 1;
  cand.bs = ctx.global_batch / M;
  std::set<int> used;
  int next = 0;
  for (int s = 0; s < S; ++s) {
    const auto& st = layout[static_cast<std::size_t>(s)];
    WEFT_CHECK(
        st.first_block == next && st.last_block >= st.first_block && st.last_block < ctx.L(),
        "layout_plan: stage {} covers blocks {}-{}; expected a range starting at block {} within the {} "
        "blocks",
        s, st.first_block, st.last_block, next, ctx.L());
    next = st.last_block + 1;
    WEFT_CHECK(!st.devices.empty(), "layout_plan: stage {} has no device", s);
    std::set<int> nodes;
    for (int d : st.devices) {
      WEFT_CHECK(d >= 0 && d < c.num_devices(), "layout_plan: stage {}: device {} is not in the cluster", s,
                 d);
      WEFT_CHECK(used.insert(d).second, "layout_plan: device {} is used by two stages", d);
      nodes.insert(c.node_of(d));
    }
    const int n = static_cast<int>(st.devices.size());
    std::vector<std::int64_t> logical = st.mesh.empty() ? std::vector<std::int64_t>{n} : st.mesh;
    cluster::DeviceMesh mesh(canonical_logical(logical), st.devices);  // validates the shape
    const int nn = static_cast<int>(nodes.size());
    const pipeline::SubmeshShape shape(nn, n % nn == 0 ? n / nn : n);
    cand.meshes.push_back({shape, mesh.shape(), mesh, ctx.mesh_key(mesh)});
    cand.devices.push_back(st.devices);
    std::string why;
    const int inf = in_flight(o.schedule, S - s, M, o.schedule_k);
    auto sc = best_stage(ctx, {cand.meshes.back()}, st.first_block, st.last_block, 0, cand.bs, M, inf, 0, &why);
    if (!sc && o.allow_infeasible)
      sc = unconstrained_stage(ctx, cand.meshes.back(), st.first_block, st.last_block, cand.bs, inf, 0);
    WEFT_CHECK(sc.has_value(), "layout_plan: stage {} (blocks {}-{} on {} devices) does not fit: {}", s,
               st.first_block, st.last_block, n, why);
    cand.stages.push_back(*sc);
  }
  WEFT_CHECK(next == ctx.L(), "layout_plan: the stages cover blocks 0-{} of {}", next - 1, ctx.L());
  return evaluated(materialise(ctx, {}, cand, reshard::Balancer::Best), ctx, start, "layout_plan");
}

Plan best_megatron_plan(const ir::Graph& g, const cluster::Cluster& c, const PlanOptions& o) {
  const double start = now_s();
  Context ctx = make_context(g, c, o, start);
  ctx.init_blocks(auto_blocks(g, o));
  auto [best, alts] = megatron_all(ctx);
  WEFT_CHECK(best.has_value(), "no Megatron-style layout fits in memory ({} tried; first: {})", alts.size(),
             alts.empty() ? std::string("none") : alts.front().note);
  sort_alternatives(alts, o.max_alternatives);
  best->plan.alternatives = std::move(alts);
  best->plan.search_status = ctx.timed_out ? "timeout" : "complete";
  best->plan.plan_seconds = now_s() - start;
  return best->plan;
}

// Why micro-batch sizes were left out: the graph could not be cut to them (rebatch_note), so the
// plan keeps larger micro-batches, or the whole batch (M = d = 1).
std::string kept_batch_text(const Context& ctx) {
  std::vector<std::int64_t> sizes;
  std::string why;
  for (const auto& [bs, note] : ctx.rebatch_notes)
    if (!note.empty()) {
      sizes.push_back(bs);
      why = note;
    }
  if (sizes.empty()) return {};
  return fmt::format("; micro-batches of {} samples left out (the batch {} cannot be split that way): {}",
                     fmt::join(sizes, ", "), ctx.global_batch, why);
}

// The search space of a homogeneous make_plan, rule by rule, for Plan::search_space.
std::string search_space_text(const Context& ctx, const std::vector<SubmeshOptions>& subs,
                              const std::vector<int>& Ms, std::size_t configs, int pruned, int bounded) {
  const auto& o = ctx.opt_;
  std::size_t meshes = 0;
  for (const auto& s : subs) meshes += s.meshes.size();
  std::string ms = Ms.size() <= 4
                       ? fmt::format("{}", fmt::join(Ms, ","))
                       : fmt::format("{},{},...,{} ({} counts)", Ms[0], Ms[1], Ms.back(), Ms.size());
  const std::string ms_rule =
      o.num_microbatches > 0 ? std::string("given")
      : o.max_microbatches > 0
          ? fmt::format("auto: powers of two dividing the batch, <= {}", o.max_microbatches)
          : std::string("auto: powers of two dividing the batch");
  const int nodes = static_cast<int>(ctx.c_.nodes().size());
  const std::string node_rule =
      o.whole_nodes_only ? "whole nodes" : "node slices and whole nodes";
  const std::string count_rule =
      o.power_of_two_nodes ? ", power-of-two nodes"
      : (!o.all_node_counts && nodes > kAllNodeCountsUpTo)
          ? fmt::format(", node counts that are powers of two or divide {} (auto)", nodes)
          : "";
  return fmt::format(
      "{} blocks ({}); micro-batches {} ({}); {} (micro-batches, replicas) pairs in the order of a lower bound, "
      "{} of them skipped (bound >= the best step found), {} left out by the memory bound (state + one "
      "micro-batch of activations over a replica's devices); {} submeshes / {} "
      "logical meshes ({}{}{}{}); stages <= {}; replicas {}; {} candidates simulated at most; schedule {}; "
      "Megatron baseline {}; {} thread(s)",
      ctx.L(), o.num_blocks > 0 ? "given" : "auto: min(forward ops, 16)", ms, ms_rule, configs, bounded, pruned,
      subs.size(), meshes, node_rule, count_rule, o.two_d_meshes ? ", 2-D meshes" : ", 1-D meshes",
      o.max_logical_shapes > 0 ? fmt::format(", <= {} shapes per submesh", o.max_logical_shapes) : "",
      o.pipeline ? (o.max_stages > 0 ? std::to_string(o.max_stages) : std::string("blocks"))
                 : std::string("1"),
      o.max_data_parallel > 0 ? fmt::format("<= {}", o.max_data_parallel) : std::string("any"),
      o.max_simulated, o.schedule, o.compare_megatron ? "on" : "off", ctx.num_threads()) +
         kept_batch_text(ctx);
}

namespace {

// contenders (when given): up to kTraceContenders more feasible plans, fastest first after the
// returned one (each at its simulated step on the full-bandwidth network), for re-ranking under a
// bandwidth trace.
constexpr std::size_t kTraceContenders = 6;
Plan make_plan_fixed(const ir::Graph& g, const cluster::Cluster& c, const PlanOptions& o,
                     std::vector<Plan>* contenders = nullptr) {
  const double start = now_s();
  Context ctx = make_context(g, c, o, start);
  ctx.progress("grouping", 0.0, "layer grouping");
  ctx.init_blocks(auto_blocks(g, o));
  if (!c.homogeneous()) {
    Plan p = make_hetero_plan(ctx);
    p.search_status = ctx.timed_out ? "timeout" : "complete";
    p.plan_seconds = now_s() - start;
    ctx.progress("done", 1.0, fmt::format("{} SPMD searches in {:.2f} s", ctx.spmd_solves, ctx.spmd_seconds));
    return p;
  }
  auto subs = make_mesh_options(ctx);
  WEFT_CHECK(!subs.empty(), "make_plan: no submesh left by the search limits");
  const auto Ms = microbatch_counts(o, ctx.global_batch);
  int pruned = 0;
  const auto configs = replica_configs(ctx, Ms, &pruned);
  if (configs.empty()) {
    // Every pair left out by the bound: name the least demanding one (most micro-batches the graph
    // can be cut into, one replica).
    std::int64_t bs = ctx.global_batch;
    bool any_cut = false;
    for (int M : Ms)
      if (ctx.rebatch_note(ctx.global_batch / M).empty()) bs = ctx.global_batch / M, any_cut = true;
    if (!any_cut && !Ms.empty()) {  // not memory: the graph cannot be cut into any of these counts
      const std::string why = ctx.rebatch_note(ctx.global_batch / Ms.front());
      fail("make_plan: the batch {} cannot be split into {} micro-batches: {}", ctx.global_batch,
           fmt::join(Ms, " or "), why);
    }
    const auto& ab = ctx.blocks_at(bs);
    const double state = ctx.min_bytes(ab, 0, ctx.L() - 1, 0), act = ctx.min_bytes(ab, 0, ctx.L() - 1, 1) - state;
    fail("make_plan: the model cannot fit: with {} micro-batches of {} samples and one replica over all {} "
         "devices, parameter state {:.4g} GB plus one micro-batch of saved activations {:.4g} GB need "
         ">= {:.4g} GB per device, {:.4g} GB usable",
         ctx.global_batch / bs, bs, c.num_devices(), state / 1e9, act / 1e9,
         (state + act) / c.num_devices() / 1e9, ctx.usable_memory / 1e9);
  }
  prefetch_stage_costs(ctx, subs, configs);
  // Branch and bound over the (M, replicas) pairs: each pair's relaxed stage DP (unconstrained
  // layouts, no memory-limited SPMD search) bounds its pipeline latency proxy, which bounds its
  // step from below; pairs are searched in the order of their bounds, the best candidate of each
  // is simulated, and a pair whose bound is not below the best simulated step so far is not
  // searched (the memory-limited searches of hopeless pairs were most of the planning time).
  std::vector<std::pair<double, ReplicaConfig>> by_bound;
  for (const auto& rc : configs) {
    double lb = kInf;
    for (const auto& cand : partition_candidates(ctx, subs, rc.M, rc.dp, true)) lb = std::min(lb, cand.proxy);
    by_bound.emplace_back(lb, rc);
  }
  std::stable_sort(by_bound.begin(), by_bound.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<ReplicaConfig> searched;
  double best_step = kInf;  // the best simulated step so far
  int bounded = 0;
  std::vector<Candidate> cands;
  for (const auto& [lb, rc] : by_bound) {
    // The DP's bounds grid is geometric (ratio 1.02): its proxy is within 2% of the relaxation's optimum.
    if (o.bound_search && (lb / 1.02 >= best_step || lb == kInf)) {
      ++bounded;
      continue;
    }
    searched.push_back(rc);
    const int M = rc.M, d = rc.dp;
    auto cs = partition_candidates(ctx, subs, M, d);
    if (!cs.empty() && !ctx.out_of_time()) {
      const auto top = std::min_element(cs.begin(), cs.end(),
                                        [](const Candidate& a, const Candidate& b) { return a.proxy < b.proxy; });
      Built b = materialise(ctx, subs, *top, reshard::Balancer::LargestFirst);
      if (b.feasible) best_step = std::min(best_step, b.plan.step_time);
    }
    cands.insert(cands.end(), cs.begin(), cs.end());
    // Equal-block partitions on every submesh size that divides the replica (Megatron-like).
    if (!o.uniform_partitions || !o.pipeline) continue;
    const int D = c.num_devices() / d;
    const std::int64_t bs = ctx.global_batch / (static_cast<std::int64_t>(M) * d);
    for (int si = 0; si < static_cast<int>(subs.size()); ++si) {
      const int n = subs[si].shape.num_devices();
      if (n > D || D % n) continue;
      const int p = D / n;
      if (p < 2 || p > ctx.L() || (o.max_stages > 0 && p > o.max_stages)) continue;
      const auto split = balanced_split(ctx.grouping, p);
      Candidate cand;
      cand.strategy = "pipeline (equal blocks)";
      cand.M = M;
      cand.dp = d;
      cand.bs = bs;
      bool ok = true;
      for (int s = 0; s < p && ok; ++s) {
        auto sc = best_stage(ctx, subs[si].meshes, split[s].first, split[s].second, si, bs, M,
                             in_flight(o.schedule, p - s, M, o.schedule_k), 0, nullptr, d);
        if (!sc)
          ok = false;
        else
          cand.stages.push_back(*sc);
      }
      if (!ok) continue;
      cand.proxy = pipeline_proxy(cand.stages, M);
      cands.push_back(std::move(cand));
    }
  }
  // Rhino's stage ILP on a non-linear block DAG (skip connections): block orders whose contiguous
  // cuts the grouping's order does not contain, and the stage DP again over each (no new SPMD
  // search: block costs are cached by structure).
  if (o.pipeline && o.stage_ilp) {
    ctx.progress("partition", 0.66, "stage ILP block orders");
    for (const auto& order : ilp_block_orders(ctx, o.max_stages > 0 ? o.max_stages : c.num_devices())) {
      BlockOrderScope scope(ctx, order);
      for (const auto [M, d] : searched)
        for (auto& cand : partition_candidates(ctx, subs, M, d)) {
          if (cand.stages.size() < 2) continue;  // one stage: the same as in the grouping's order
          cand.strategy = "pipeline (ILP order)";
          cand.block_order = order;
          cands.push_back(std::move(cand));
        }
    }
  }
  ctx.progress("simulate", 0.7, fmt::format("simulating {} candidates", cands.size()));
  std::vector<Alternative> alts;
  std::optional<Built> best;
  std::optional<Candidate> best_cand;
  // Simulate the candidates, cheapest proxy first; materialising all of them is what costs (the
  // resharding plans), so only the best few per (M, dp) by proxy are simulated.
  std::stable_sort(cands.begin(), cands.end(),
                   [](const Candidate& a, const Candidate& b) { return a.proxy < b.proxy; });
  const std::size_t max_sim = static_cast<std::size_t>(std::max(1, o.max_simulated));
  std::vector<Plan> runners;  // the fastest feasible plans (contenders), kept when asked for
  auto keep = [&](const Plan& q) {
    if (!contenders) return;
    runners.push_back(q);
    std::stable_sort(runners.begin(), runners.end(),
                     [](const Plan& x, const Plan& y) { return x.step_time < y.step_time; });
    if (runners.size() > kTraceContenders + 1) runners.pop_back();
  };
  for (std::size_t i = 0; i < cands.size() && i < max_sim; ++i) {
    if (ctx.out_of_time() && (best || ctx.past_grace())) break;
    Built b = materialise(ctx, subs, cands[i], reshard::Balancer::LargestFirst);
    alts.push_back(alternative_of(b));
    if (b.feasible) keep(b.plan);
    if (b.feasible && (!best || b.plan.step_time < best->plan.step_time)) {
      best = std::move(b);
      best_cand = cands[i];
    }
  }
  // The Megatron-style layouts are points of the search space too (equal blocks, tensor-parallel
  // groups inside a node, replicated pipelines, the group's inputs replicated): they compete.
  bool mega_won = false;
  if (o.compare_megatron && !ctx.out_of_time()) {
    auto [mb, malts] = megatron_all(ctx);
    for (auto& a : malts) {
      a.strategy += " (baseline)";
      alts.push_back(a);
    }
    if (mb && mb->feasible) keep(mb->plan);
    if (mb && mb->feasible && (!best || mb->plan.step_time < best->plan.step_time)) {
      best = std::move(mb);
      mega_won = true;
    }
  }
  if (!best) {
    sort_alternatives(alts, 0, false);
    std::string why;
    for (std::size_t i = 0; i < std::min<std::size_t>(4, alts.size()); ++i)
      why += fmt::format("\n  {} {}: {}", alts[i].strategy, alts[i].layout, alts[i].note);
    if (ctx.timed_out)
      fail(
          "make_plan: no plan found within the time limit of {} s for {} on {} (raise time_limit or narrow "
          "the search: num_blocks, whole_nodes_only, power_of_two_nodes, max_logical_shapes, "
          "num_microbatches); candidates so far:{}",
          o.time_limit_s, g.name(), c.to_string(), why.empty() ? std::string(" none") : why);
    fail("make_plan: no plan fits in {:.4g} GB per device for {} on {}; closest candidates:{}",
         ctx.usable_memory / 1e9, g.name(), c.to_string(), why);
  }
  // The winner with the best resharding plans (skipped at the deadline: the largest-first plans
  // it was simulated with stand).
  ctx.progress("simulate", 0.97, "final resharding plans");
  if (!mega_won && !ctx.out_of_time()) {
    Built fin = materialise(ctx, subs, *best_cand, reshard::Balancer::Best);
    if (fin.feasible && fin.plan.step_time <= best->plan.step_time) best = std::move(fin);
  }
  sort_alternatives(alts, o.max_alternatives);
  Plan p = std::move(best->plan);
  p.alternatives = std::move(alts);
  p.search_space = search_space_text(ctx, subs, Ms, configs.size(), pruned, bounded);
  p.search_status = ctx.timed_out ? "timeout" : "complete";
  if (contenders) {  // the others, without the winner's own largest-first version
    const std::string winner = layout_text(p);
    for (auto& q : runners)
      if (contenders->size() < kTraceContenders && !(layout_text(q) == winner && q.num_microbatches == p.num_microbatches &&
                                                      q.data_parallel == p.data_parallel))
        contenders->push_back(std::move(q));
  }
  p.plan_seconds = now_s() - start;
  ctx.progress("done", 1.0, fmt::format("{} SPMD searches in {:.2f} s", ctx.spmd_solves, ctx.spmd_seconds));
  return p;
}

}  // namespace

// The fixed-schedule search, then (with a bandwidth trace or schedule "adaptive") Ada-Grouper's
// policy: the layout is planned under 1F1B, whose in-flight memory is the frontier's k = 1 point;
// the fastest plans of that search (up to 1 + kTraceContenders, full-bandwidth steps) are
// re-ranked by their policy's mean step over the trace, so a busy network can change the layout
// (fewer or cheaper stage boundaries), not only the k per window.
Plan make_plan(const ir::Graph& g, const cluster::Cluster& c, const PlanOptions& o) {
  if (o.schedule != "adaptive" && !o.bandwidth_trace) return make_plan_fixed(g, c, o);
  check_adaptive_options(o.adaptive);  // bad options fail before any search
  PlanOptions fixed = o;
  if (o.schedule == "adaptive") fixed.schedule = "1f1b";
  std::vector<Plan> contenders;
  Plan p = make_plan_fixed(g, c, fixed, &contenders);
  const double t0 = now_s();
  const cluster::BandwidthTrace trace = o.bandwidth_trace.value_or(cluster::BandwidthTrace{});
  p.adaptive = adaptive_policy(p, trace, o.adaptive);
  const std::string first = layout_text(p);
  const double first_step = p.adaptive->step;
  int ranked = 1;
  for (Plan& q : contenders) {
    if (o.stop.cancelled()) break;
    AdaptivePolicy pol;
    try {
      pol = adaptive_policy(q, trace, o.adaptive);
    } catch (const InternalError&) {
      throw;
    } catch (const Error&) {
      continue;  // no kFkB point of this layout fits: not a contender under the trace
    }
    ++ranked;
    if (pol.step < p.adaptive->step * (1 - 1e-9)) {
      q.alternatives = std::move(p.alternatives);
      q.search_space = std::move(p.search_space);
      q.search_status = p.search_status;
      q.plan_seconds = p.plan_seconds;
      q.adaptive = std::move(pol);
      p = std::move(q);
    }
  }
  p.search_space += fmt::format(
      "; under the bandwidth trace: the {} fastest plans re-ranked by their policy's mean step ({}: {:.4g} s{})",
      ranked, layout_text(p) == first ? "the full-bandwidth best kept" : "changed from " + first,
      p.adaptive->step, layout_text(p) == first ? "" : fmt::format(" against {:.4g} s", first_step));
  p.plan_seconds += now_s() - t0;
  return p;
}

}  // namespace weft::plan
