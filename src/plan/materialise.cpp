// Materialising a candidate into a Plan (materialise): its stages placed on devices (given, or
// the pipeline replicated by pipeline::replicate_pipeline), each stage's times and memory with its
// recomputation and its replicas (gradient synchronisation, ZeRO) on the placed devices, the
// layouts the lowering reads, the tensors crossing stages resharded by the reshard planner, the
// memory per device under the schedule and the simulated step.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "planner_detail.hpp"
#include "weft/cluster/alpha_beta.hpp"
#include "weft/cluster/device_mesh.hpp"
#include "weft/core/error.hpp"
#include "weft/core/units.hpp"
#include "weft/pipeline/grouping.hpp"
#include "weft/pipeline/submesh.hpp"
#include "weft/reshard/decompose.hpp"
#include "weft/reshard/plan.hpp"
#include "weft/sharding/reshard.hpp"
#include "weft/sharding/sharding_spec.hpp"

namespace weft::plan::detail {

double step_allreduce_time(const cluster::Cluster& c, const PlanOptions& o, std::vector<int> devices) {
  std::sort(devices.begin(), devices.end());
  devices.erase(std::unique(devices.begin(), devices.end()), devices.end());
  if (o.step_allreduce_bytes <= 0 || devices.size() < 2) return 0;
  const cluster::DeviceMesh all({static_cast<std::int64_t>(devices.size())}, devices);
  return cluster::all_reduce_time(cluster::axis_links(c, all)[0], o.step_allreduce_bytes);
}

sharding::ShardingSpec parse_spec_or_replicated(const std::string& text,
                                                const std::vector<std::int64_t>& shape,
                                                const std::vector<std::int64_t>& mesh) {
  if (text.empty()) return sharding::ShardingSpec::replicated(shape, mesh);
  // A partial result is reduced before it leaves its stage: what crosses is the reduced layout.
  return sharding::ShardingSpec::parse(text, shape, mesh).reduced();
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
  p.block_cuts = ctx.block_cuts;
  // The buckets the replicas' collectives were priced in (the lowering lays them out so; without
  // overlap_grad_sync they are priced exposed, not one per tensor).
  p.grad_bucket_bytes = opt.grad_bucket_bytes;
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
    StageAgg a = !st.recompute_set.empty() || !st.selective_set.empty()
                     ? recomputed_per_block(plain, st.recompute_set, st.selective_set)
                     : recomputed(plain, st.recompute);
    stage.recompute = std::string(recompute_name(a.recompute));
    // Some blocks only: in the grouping's own numbering (what the lowering's units are).
    for (int b : a.recompute_set)
      stage.recompute_blocks.push_back(ctx.original_block[static_cast<std::size_t>(st.first + b)]);
    std::sort(stage.recompute_blocks.begin(), stage.recompute_blocks.end());
    for (int b : a.selective_set)
      stage.selective_blocks.push_back(ctx.original_block[static_cast<std::size_t>(st.first + b)]);
    std::sort(stage.selective_blocks.begin(), stage.selective_blocks.end());
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
  // The stages over their devices' usable memory; the report names the worst (the largest peak
  // over usable), with its parts.
  int over_count = 0, worst = -1;
  double worst_ratio = 0, worst_usable = 0;
  for (int s = 0; s < S; ++s) {
    auto& st = p.stages[s];
    st.in_flight = inflight[s];
    // A chunk of an interleaved / V schedule holds 1/v of the stage's activations (as pipeline_of).
    st.peak_memory =
        st.static_memory + st.in_flight * st.activation_memory / sched.virtual_stages() + st.transient_memory;
    peak = std::max(peak, st.peak_memory);
    double usable = kInf;
    for (int d : st.devices) usable = std::min(usable, ctx.usable_of_device(d));
    if (st.peak_memory > usable * (1 + 1e-9)) {
      ++over_count;
      const double ratio = usable > 0 ? st.peak_memory / usable : kInf;
      if (worst < 0 || ratio > worst_ratio) worst = s, worst_ratio = ratio, worst_usable = usable;
    }
    for (int d : st.devices) {
      p.devices_used.push_back(d);
      p.device_memory.push_back(st.peak_memory);
    }
  }
  // The training loop's per-step all-reduce, after the last backward and before the updates.
  const double step_sync = step_allreduce_time(c, opt, p.devices_used);
  for (auto& st : p.stages) st.optimizer_time += step_sync;
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
  out.feasible = worst < 0;
  if (!out.feasible) {
    const auto& st = p.stages[static_cast<std::size_t>(worst)];
    const double act = st.activation_memory / sched.virtual_stages();
    out.note = fmt::format(
        "stage {}{}: peak {}/device > {} usable ({:.2f}x): static {} (parameters, gradients, optimizer "
        "states{}), activations {} x {} in flight, transient {}{}; {}",
        worst, S > 1 ? fmt::format(" (the worst of {} over)", over_count) : std::string(),
        format_bytes(st.peak_memory), format_bytes(worst_usable), worst_ratio, format_bytes(st.static_memory),
        st.zero > 0 ? fmt::format(" under ZeRO-{}", st.zero) : std::string(), format_bytes(act), st.in_flight,
        format_bytes(st.transient_memory),
        st.recompute != "none" ? fmt::format(", recompute {}", st.recompute) : std::string(),
        usable_memory_text(opt, c.device(st.devices.front()).spec));
  }
  return out;
}

Built materialise(Context& ctx, const std::vector<SubmeshOptions>& subs, const Candidate& cand,
                  reshard::Balancer balancer) {
  // A candidate found in a stage-ILP block order is materialised in that order.
  BlockOrderScope scope(ctx, cand.block_order);
  return materialise_in_place(ctx, subs, cand, balancer);
}

}  // namespace weft::plan::detail
