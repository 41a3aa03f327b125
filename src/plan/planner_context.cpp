// The planner's Context (planner_detail.hpp) beyond its header: the SPMD search of one block on one
// logical mesh and its cache (block_cost, search_block, the parallel prefetch_block_costs), the
// candidate logical meshes of every submesh (make_mesh_options), the resharding of tensors passed
// between the blocks of one stage (crossings, internal_reshard) and the block renumbering of a
// stage-ILP order (reorder_blocks).
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <set>
#include <thread>
#include <tuple>

#include "planner_detail.hpp"
#include "weft/cluster/device_mesh.hpp"
#include "weft/core/error.hpp"
#include "weft/core/units.hpp"
#include "weft/cost/memory.hpp"
#include "weft/cost/op_cost.hpp"
#include "weft/pipeline/grouping.hpp"
#include "weft/pipeline/submesh.hpp"
#include "weft/sharding/reshard.hpp"
#include "weft/sharding/sharding_spec.hpp"
#include "weft/spmd/search.hpp"

namespace weft::plan::detail {

DType graph_compute_dtype(const ir::Graph& g) {
  double best = -1;
  DType dt = DType::F32;
  for (const auto& op : g.ops())
    if (op.flops() > best) best = op.flops(), dt = cost::compute_dtype(g, op);
  return dt;
}

const BlockCost& Context::block_cost(int b, std::int64_t bs, const MeshOption& m, int variant,
                                     int forced_dp) {
  const AtBatch& ab = blocks_at(bs);
  const auto key = std::make_tuple(block_key(ab, b, m, forced_dp), m.key, variant, forced_dp);
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
    const Key key{block_key(ab, r.block, *r.mesh, r.forced_dp), r.mesh->key, r.variant, r.forced_dp};
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
        "block {} needs >= {}/device on {} devices (parameter state {} and one micro-batch's "
        "saved activations {} in all)",
        b, format_bytes(lb), m.mesh.size(), format_bytes(block_state_bytes[b]),
        format_bytes(ab.act_bytes[b]));
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
  // A block of scalar ops only (a summed loss's `scale` and its gradient, which the grouping may
  // cut off) has nothing to split: it runs replicated on its stage instead of refusing the mesh.
  so.require_split = std::any_of(bg.tensors().begin(), bg.tensors().end(),
                                 [](const ir::TensorInfo& t) { return t.rank() >= 1; });
  so.reshard_cache = sc.reshard_cache;
  so.stop = stop;
  if (mixed(m.mesh)) so.device = mesh_spec(m.mesh);  // an uneven split: re-priced per device later
  if (forced_dp == kMegatronTp) {
    // Megatron's layout: its parameters and their optimizer states at fixed specs, a fused
    // projection split part by part (strided: the search then needs the strided candidates that
    // carry that split to the matmul and through the reshape to the heads).
    so.fixed_specs = megatron_fixed(sg, m);
    for (const auto& [name, text] : so.fixed_specs)
      if (!sharding::ShardingSpec::parse(text, bg.tensor(*bg.find_tensor(name)).shape, m.mesh.shape())
               .is_block())
        so.strided_candidates = true;
  }
  if (forced_dp > 0 || forced_dp == kMegatronTp) {
    // The block's boundary in one layout: its inputs fixed to it, its results read by other
    // blocks resharded to it inside the block (so consecutive blocks agree and pass tensors
    // without resharding between them).
    const bool two_d = m.mesh.ndim() == 2;
    // Under Megatron's layout a boundary tensor it splits (inside the attention or the MLP, the
    // logits, a tied embedding's gradient contribution) has that split, not the replicated one.
    const std::map<std::string, std::string>* between =
        forced_dp == kMegatronTp ? &megatron.at(static_cast<int>(m.mesh.size())).boundaries : nullptr;
    auto canonical_at = [&](ir::TensorId t) -> std::string {
      const auto& info = bg.tensor(t);
      if (between) {
        auto it = between->find(g_.tensor(sg.original_tensor[static_cast<std::size_t>(t)]).name);
        if (it != between->end()) return it->second;
      }
      if (forced_dp > 1 && info.shape[0] % forced_dp == 0) return two_d ? "S(0) R" : "S(0)";
      return two_d ? "R R" : "R";
    };
    for (const auto& t : bg.tensors()) {
      if (t.producer != ir::kNoOp || is_state_leaf(t) || t.rank() < 1 || so.fixed_specs.count(t.name))
        continue;
      if (t.role == ir::Role::Constant || t.role == ir::Role::Buffer) continue;
      const ir::TensorId id = bg.find_tensor(t.name).value();
      if (bg.consumers(id).empty()) continue;
      so.fixed_specs[t.name] = canonical_at(id);
    }
    for (ir::TensorId t : bg.outputs()) {
      const auto& info = bg.tensor(t);
      if (info.producer == ir::kNoOp || info.rank() < 1) continue;
      const ir::TensorId orig = sg.original_tensor[t];
      bool read_elsewhere = false;
      for (ir::OpId c : g_.consumers(orig))
        read_elsewhere = read_elsewhere || (grouping.block_of_op[c] >= 0 && grouping.block_of_op[c] != b);
      if (read_elsewhere) so.output_specs[info.name] = canonical_at(t);
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
      const double t =
          cost::op_cost(bg, bg.op(o), dev, p.op_strategies[o].factor_shards, p.op_strategies[o].factor_stride)
              .time;
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
    // The search's peak holds each gradient in the graph's dtype; a gradient held wider (f32 under
    // mixed precision) adds its difference on top of that peak, as static memory.
    double wider_grads = 0;
    for (int t = 0; t < nt; ++t) {
      const auto& info = bg.tensor(t);
      if (is_state_leaf(info)) {
        // A parameter counts with its gradient (state_bytes_factor), an optimizer state once.
        const double factor = state_bytes_factor(bg, t);
        bc.mem_class[t] = info.role == ir::Role::Parameter ? BlockCost::kParam : BlockCost::kOptState;
        bc.static_mem += bc.local_bytes[t] * factor;
        if (info.role == ir::Role::Parameter) {
          bc.param_mem += bc.local_bytes[t];
          bc.grad_mem += bc.local_bytes[t] * (factor - 1);
          wider_grads += bc.local_bytes[t] * (factor - 2);
          bc.param_tensor_bytes.push_back(bc.local_bytes[t]);
        } else {
          bc.opt_mem += bc.local_bytes[t];
        }
      } else if (saved[t]) {
        bc.mem_class[t] = BlockCost::kActivation;
        bc.act_mem += bc.local_bytes[t];
      }
    }
    const double searched_static = bc.static_mem - wider_grads;  // the static part of the search's peak
    bc.transient = std::max(0.0, p.peak_memory - searched_static - bc.act_mem);
    {
      // Where the peak is: at an update (the new value and states beside the old ones) or not.
      const cost::Liveness lv = cost::liveness(bg, false);
      const std::vector<double> at = cost::live_bytes(lv, bc.local_bytes);
      double upd_peak = 0, rest_peak = 0;
      for (std::size_t q = 0; q < at.size(); ++q) {
        double& peak = phase[sg.original_op[lv.order[q]]] == pipeline::OpPhase::Update ? upd_peak : rest_peak;
        peak = std::max(peak, at[q]);
      }
      bc.upd_excess = std::clamp(upd_peak - searched_static - bc.act_mem, 0.0, bc.transient);
      bc.rest_excess = std::clamp(rest_peak - searched_static - bc.act_mem, 0.0, bc.transient);
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

std::map<std::string, std::string> Context::megatron_fixed(const pipeline::StageGraph& sg,
                                                           const MeshOption& m) const {
  WEFT_ASSERT(m.mesh.ndim() == 1, "Megatron's tensor-parallel stages are 1-D meshes");
  const MegatronSpecs& ms = megatron.at(static_cast<int>(m.mesh.size()));
  std::map<std::string, std::string> out;
  const ir::Graph& bg = sg.graph;
  const auto readers = bg.consumer_index();
  for (ir::TensorId t = 0; t < static_cast<ir::TensorId>(bg.tensors().size()); ++t) {
    const auto& info = bg.tensor(t);
    // A leaf: a parameter or optimizer state the block reads (its boundary activations keep the
    // replicated boundary); a result: one the block makes.
    const bool leaf = info.producer == ir::kNoOp;
    if (leaf && (!is_state_leaf(info) || readers[static_cast<std::size_t>(t)].empty())) continue;
    // By the tensor of the training graph (a block graph's leaf may stand for another tensor).
    auto it = ms.fixed.find(g_.tensor(sg.original_tensor[static_cast<std::size_t>(t)]).name);
    if (it != ms.fixed.end()) out.emplace(info.name, it->second);
  }
  return out;
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

// ---------------------------------------------------------------- crossings between blocks

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
  const std::vector<std::int64_t> key{
      bs,  m.key, variant, forced_dp, block_key(ab, bp, m, forced_dp), block_key(ab, bc, m, forced_dp),
      *ip, *ic};
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
  permute(block_grad_bytes);
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

}  // namespace weft::plan::detail
