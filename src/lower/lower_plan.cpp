// Lowering of a plan::Plan (see lower.hpp): the stage layouts the planner recorded, on the
// per-micro-batch graph it costed them on.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "weft/core/error.hpp"
#include "weft/lower/lower.hpp"
#include "weft/pipeline/grouping.hpp"
#include "weft/plan/planner.hpp"
#include "weft/plan/rebatch.hpp"

namespace weft::lower {

namespace {

// Megatron's interleaving of a pipeline of D stages with v chunks each: every stage's ops are cut
// into v chunks of consecutive forward ops (with their backward and update ops), balanced by FLOPs;
// the model's k-th chunk (stage k / v, chunk k mod v) becomes logical stage k, on the devices of
// stage k mod D — or, with v_shape (ZB-V, DualPipeV; v = 2), of stage k for k < D and 2D − 1 − k
// after (the V: device d holds chunks d and 2D − 1 − d). The chunks keep their ops' layouts, so
// every stage must have the same mesh shape.
std::vector<PipelineStage> interleave(const ir::Graph& g, const std::vector<PipelineStage>& stages, int v,
                                      bool v_shape = false) {
  const int D = static_cast<int>(stages.size());
  for (const auto& st : stages)
    WEFT_CHECK(
        st.mesh.shape() == stages[0].mesh.shape(),
        "lower: the interleaved schedule moves chunks between stages, which needs one mesh shape; the stages "
        "have {} and {}",
        stages[0].mesh.shape(), st.mesh.shape());
  const auto owner = pipeline::owner_forward_op(g);
  const auto phase = pipeline::classify_ops(g);
  std::vector<double> flops(g.ops().size(), 0);  // per forward op: its own and its owned ops' FLOPs
  for (ir::OpId o = 0; o < static_cast<ir::OpId>(g.ops().size()); ++o)
    if (owner[static_cast<std::size_t>(o)] != ir::kNoOp)
      flops[static_cast<std::size_t>(owner[static_cast<std::size_t>(o)])] += g.op(o).flops();
  std::vector<std::vector<ir::OpId>> chunk_ops(static_cast<std::size_t>(D * v));
  for (int d = 0; d < D; ++d) {
    const auto& st = stages[static_cast<std::size_t>(d)];
    std::vector<char> in_stage(g.ops().size(), 0);
    for (ir::OpId o : st.ops) in_stage[static_cast<std::size_t>(o)] = 1;
    std::vector<ir::OpId> fwd;
    double total = 0;
    for (ir::OpId o : g.topo_order())
      if (in_stage[static_cast<std::size_t>(o)] &&
          phase[static_cast<std::size_t>(o)] == pipeline::OpPhase::Forward) {
        fwd.push_back(o);
        total += flops[static_cast<std::size_t>(o)];
      }
    WEFT_CHECK(static_cast<int>(fwd.size()) >= v, "lower: stage {} has {} forward ops, too few for {} chunks",
               d, fwd.size(), v);
    std::vector<int> chunk_of(g.ops().size(), -1);
    double acc = 0;
    int c = 0;
    for (std::size_t k = 0; k < fwd.size(); ++k) {
      // Cut when the chunk has its share, leaving at least one op for each chunk after it.
      const int left = static_cast<int>(fwd.size() - k);
      if (c + 1 < v && (acc >= total * (c + 1) / v || left <= v - 1 - c) && k > 0) ++c;
      chunk_of[static_cast<std::size_t>(fwd[k])] = c;
      acc += flops[static_cast<std::size_t>(fwd[k])];
    }
    for (ir::OpId o : st.ops) {
      const ir::OpId f = owner[static_cast<std::size_t>(o)];
      const int ch = f != ir::kNoOp && chunk_of[static_cast<std::size_t>(f)] >= 0
                         ? chunk_of[static_cast<std::size_t>(f)]
                         : v - 1;
      chunk_ops[static_cast<std::size_t>(d * v + ch)].push_back(o);
    }
  }
  std::vector<PipelineStage> out;
  for (int k = 0; k < D * v; ++k)  // the ops' layouts and leaf specs are those of their plan stage
    out.push_back(
        {stages[static_cast<std::size_t>(v_shape ? (k < D ? k : 2 * D - 1 - k) : k % D)].mesh,
         std::move(chunk_ops[static_cast<std::size_t>(k)]), stages[static_cast<std::size_t>(k / v)].layout,
         stages[static_cast<std::size_t>(k / v)].recompute_unit, stages[static_cast<std::size_t>(k / v)].zero,
         stages[static_cast<std::size_t>(k / v)].zero_level,
         stages[static_cast<std::size_t>(k / v)].zero_unit});
  return out;
}

// The planner's layer-grouping block of every op (an op owned by no forward op: the last block),
// the unit a full recomputation re-makes at a time: the plan's blocks, cut where it cut them
// (Plan::block_cuts; none: anywhere).
std::vector<int> grouping_blocks(const ir::Graph& g, int num_blocks, const std::vector<int>& cuts) {
  std::vector<int> out(g.ops().size(), 0);
  if (num_blocks < 1) return out;
  const auto gr = pipeline::group_layers(g, num_blocks, cuts);
  for (std::size_t o = 0; o < out.size(); ++o) out[o] = gr.block_of_op[o] >= 0 ? gr.block_of_op[o] : num_blocks - 1;
  return out;
}

}  // namespace

Program lower(const plan::Plan& plan, const ir::Graph& step, const cluster::Cluster& cluster) {
  const std::string step_fp = ir::graph_fingerprint(step);
  if (!plan.graph_fingerprint.empty() && plan.graph_fingerprint != step_fp) {
    // What differs, where it is cheap to say.
    std::string why = "its shapes, ops or dtypes differ from the planned graph's";
    std::int64_t b = -1;
    try {
      b = plan::batch_size(step);
    } catch (const Error&) {
    }
    if (plan.model != step.name())
      why = fmt::format("the plan is for model '{}'", plan.model);
    else if (b >= 0 && b != plan.global_batch())
      why = fmt::format("the plan is for a global batch of {}, the step graph has {}", plan.global_batch(), b);
    fail("lower: the plan was made for another graph: its fingerprint is {}, the step graph '{}' has {} ({}: plan "
         "this graph)",
         plan.graph_fingerprint, step.name(), step_fp, why);
  }
  WEFT_CHECK(!plan.stages.empty(), "lower: the plan has no stages");
  for (const auto& st : plan.stages)
    WEFT_CHECK(
        !st.op_layouts.empty(),
        "lower: stage {} of the plan has no op layouts (a plan made before lowering existed): plan it again "
        "with this version of weft",
        st.index);
  // Equal replica shares are ordinary data parallelism.
  const bool even_shares = std::all_of(plan.replica_microbatch.begin(), plan.replica_microbatch.end(),
                                       [&](std::int64_t s) { return s == plan.microbatch_size; });
  const bool interleaved = (plan.schedule == "interleaved" || plan.schedule == "zb_interleaved" ||
                            plan.schedule == "kfkb_interleaved") &&
                           plan.num_stages() > 1 && plan.schedule_v > 1;
  const bool v_shape =
      schedule::v_shaped(plan.schedule) && plan.num_stages() > 1;  // two chunks per stage, in a V
  WEFT_CHECK(even_shares || (plan.num_stages() == 1 &&
                             static_cast<int>(plan.replica_microbatch.size()) == plan.data_parallel),
             "lower: uneven replica shares are lowered for one-stage plans with one share per replica; this "
             "plan has "
             "{} stages and {} shares for {} replicas",
             plan.num_stages(), plan.replica_microbatch.size(), plan.data_parallel);
  WEFT_CHECK(plan.model == step.name(), "lower: the plan is for model '{}', the step graph is '{}'",
             plan.model, step.name());
  const std::int64_t batch = plan::batch_size(step);
  WEFT_CHECK(plan.global_batch() == batch,
             "lower: the plan is for a global batch of {}, the step graph has {}", plan.global_batch(),
             batch);
  const ir::Graph g = plan.microbatch_size == batch ? step : plan::rebatch(step, plan.microbatch_size);
  std::map<std::string, ir::OpId> op_id;
  for (ir::OpId o = 0; o < static_cast<ir::OpId>(g.ops().size()); ++o) op_id[g.op(o).name] = o;
  const int lead = plan.data_parallel > 1 ? 1 : 0;
  std::vector<PipelineStage> stages;
  std::vector<std::vector<std::int64_t>> spmd_shapes;
  std::vector<char> seen(g.ops().size(), 0);
  for (const auto& st : plan.stages) {
    for (int d : st.devices)
      WEFT_CHECK(d >= 0 && d < cluster.num_devices(),
                 "lower: the plan uses device {}, the cluster has {} devices", d, cluster.num_devices());
    PipelineStage ps{cluster::DeviceMesh(st.mesh_shape, st.devices), {}, {}};
    const std::vector<std::int64_t> spmd_shape(st.mesh_shape.begin() + lead, st.mesh_shape.end());
    ps.layout.op_axes.assign(g.ops().size(), {});
    for (const auto& l : st.op_layouts) {
      auto it = op_id.find(l.op);
      WEFT_CHECK(it != op_id.end(), "lower: the plan lays out op '{}', which the step graph does not have",
                 l.op);
      WEFT_CHECK(l.factors.size() == spmd_shape.size() && l.inner_strides.size() == spmd_shape.size(),
                 "lower: op '{}' has {} axis assignments, stage {}'s SPMD mesh {} axes", l.op,
                 l.factors.size(), st.index, spmd_shape.size());
      WEFT_CHECK(!seen[static_cast<std::size_t>(it->second)], "lower: the plan lays out op '{}' twice", l.op);
      seen[static_cast<std::size_t>(it->second)] = 1;
      auto& axes = ps.layout.op_axes[static_cast<std::size_t>(it->second)];
      for (std::size_t a = 0; a < l.factors.size(); ++a) axes.push_back({l.factors[a], l.inner_strides[a]});
      ps.ops.push_back(it->second);
    }
    for (const auto& l : st.leaf_specs) {
      auto t = g.find_tensor(l.tensor);
      WEFT_CHECK(t.has_value(), "lower: the plan lays out tensor '{}', which the step graph does not have",
                 l.tensor);
      ps.layout.leaf_specs.emplace(*t, sharding::ShardingSpec::parse(l.spec, g.tensor(*t).shape, spmd_shape));
    }
    // Recomputation as planned: full re-makes one layer-grouping block at a time, selective one
    // attention core at a time. Per-block modes: the full blocks' units are the blocks (numbered
    // as the grouping), the selective blocks' attention cores (a core is in the block of its first
    // op, the score contraction) are units numbered after the blocks, the other ops none.
    auto listed = [](const std::vector<int>& l, int b) {
      return std::find(l.begin(), l.end(), b) != l.end();
    };
    if (st.recompute == "full") {
      ps.recompute_unit = grouping_blocks(g, plan.num_blocks, plan.block_cuts);
      if (!st.recompute_blocks.empty())  // some blocks only: the others keep their activations
        for (int& u : ps.recompute_unit)
          if (!listed(st.recompute_blocks, u)) u = -1;
    }
    if (st.recompute == "selective" || !st.selective_blocks.empty()) {
      const std::vector<int> block = st.selective_blocks.empty()
                                         ? std::vector<int>()
                                         : grouping_blocks(g, plan.num_blocks, plan.block_cuts);
      if (ps.recompute_unit.empty()) ps.recompute_unit.assign(g.ops().size(), -1);
      const auto regions = plan::selective_regions(g);
      for (std::size_t r = 0; r < regions.size(); ++r) {
        if (!block.empty() && !listed(st.selective_blocks, block[static_cast<std::size_t>(regions[r][0])]))
          continue;
        for (ir::OpId o : regions[r])  // an op of a full block stays in its block's unit
          if (int& u = ps.recompute_unit[static_cast<std::size_t>(o)]; u < 0)
            u = plan.num_blocks + static_cast<int>(r);
      }
    }
    ps.zero = lead > 0 ? st.zero : 0;
    if (ps.zero > 0 && !st.zero_blocks.empty()) {  // ZeRO-3 on these blocks, the stage's level elsewhere
      ps.zero_level = grouping_blocks(g, plan.num_blocks, plan.block_cuts);
      for (int& z : ps.zero_level)
        z = std::find(st.zero_blocks.begin(), st.zero_blocks.end(), z) != st.zero_blocks.end() ? 3 : ps.zero;
    }
    // FSDP's unit: the planner's blocks (its ZeRO-3 price gathers one block at a time, the next
    // prefetched); a plan without blocks: each op its own unit.
    if (ps.zero > 0 && plan.num_blocks >= 1)
      ps.zero_unit = grouping_blocks(g, plan.num_blocks, plan.block_cuts);
    stages.push_back(std::move(ps));
    spmd_shapes.push_back(spmd_shape);
  }
  for (ir::OpId o = 0; o < static_cast<ir::OpId>(g.ops().size()); ++o)
    WEFT_CHECK(seen[static_cast<std::size_t>(o)], "lower: the plan has no layout for op '{}'", g.op(o).name);
  std::vector<CrossStageSpec> cross;
  for (const auto& c : plan.cross_tensors) {
    if (c.refresh) continue;  // a tied parameter's new value goes between its stages' leaf specs
    auto t = g.find_tensor(c.name);
    WEFT_CHECK(t.has_value(), "lower: the plan sends tensor '{}', which the step graph does not have",
               c.name);
    WEFT_CHECK(c.from_stage >= 0 && c.from_stage < plan.num_stages() && c.to_stage >= 0 &&
                   c.to_stage < plan.num_stages(),
               "lower: cross tensor '{}' names stages {} -> {} of {}", c.name, c.from_stage, c.to_stage,
               plan.num_stages());
    const auto& shape = g.tensor(*t).shape;
    cross.push_back({*t, c.from_stage, c.to_stage,
                     sharding::ShardingSpec::parse(c.src_spec, shape,
                                                   spmd_shapes[static_cast<std::size_t>(c.from_stage)]),
                     sharding::ShardingSpec::parse(c.dst_spec, shape,
                                                   spmd_shapes[static_cast<std::size_t>(c.to_stage)])});
  }
  if (interleaved || v_shape) {
    stages = interleave(g, stages, v_shape ? 2 : plan.schedule_v, v_shape);
    cross.clear();  // the chunks cross other boundaries than the plan's stages: producer layouts
  }
  PipelineOptions po;
  po.replicas = plan.data_parallel;
  po.split_fraction = plan.split_fraction;
  if (!even_shares) {
    // Uneven data parallelism: a device without samples is left out; the others keep their shares.
    auto& st = stages[0];
    const auto& ids = st.mesh.device_ids();
    const std::size_t n = ids.size() / plan.replica_microbatch.size();
    std::vector<int> devs;
    for (std::size_t r = 0; r < plan.replica_microbatch.size(); ++r)
      if (plan.replica_microbatch[r] > 0) {
        po.replica_microbatch.push_back(plan.replica_microbatch[r]);
        devs.insert(devs.end(), ids.begin() + static_cast<std::ptrdiff_t>(r * n),
                    ids.begin() + static_cast<std::ptrdiff_t>((r + 1) * n));
      }
    auto shape = st.mesh.shape();
    shape[0] = static_cast<std::int64_t>(po.replica_microbatch.size());
    if (shape[0] == 1) {  // one replica left: no replica axis
      shape.erase(shape.begin());
      if (shape.empty()) shape = {1};
    }
    po.replicas = static_cast<int>(po.replica_microbatch.size());
    if (po.replicas == 1) po.replica_microbatch.clear();
    st.mesh = cluster::DeviceMesh(shape, devs);
  }
  po.microbatches = plan.num_microbatches;
  po.grad_bucket_bytes = plan.grad_bucket_bytes;
  po.schedule = plan.num_stages() == 1 ? "1f1b" : plan.schedule;
  po.schedule_k = plan.schedule_k;
  Program prog = lower_pipeline(g, cluster, stages, cross, po);
  prog.step_fingerprint = step_fp;
  check_against_plan(prog, plan);
  return prog;
}

std::vector<AdaptiveProgram> lower_adaptive(const plan::Plan& plan, const ir::Graph& step,
                                            const cluster::Cluster& cluster) {
  WEFT_CHECK(plan.adaptive.has_value(),
             "lower_adaptive: the plan has no adaptive policy (plan with schedule='adaptive' or a bandwidth_trace)");
  return lower_adaptive(plan, *plan.adaptive, step, cluster);
}

std::vector<AdaptiveProgram> lower_adaptive(const plan::Plan& plan, const plan::AdaptivePolicy& pol,
                                            const ir::Graph& step, const cluster::Cluster& cluster) {
  WEFT_CHECK(plan.replica_microbatch.empty() ||
                 std::all_of(plan.replica_microbatch.begin(), plan.replica_microbatch.end(),
                             [&](std::int64_t s) { return s == plan.microbatch_size; }),
             "lower_adaptive: uneven replica shares have no kFkB policy");
  const int points = static_cast<int>(pol.frontier.size());
  std::vector<std::vector<int>> used(pol.frontier.size());  // per frontier point: the windows that run it
  for (int w = 0; w < static_cast<int>(pol.windows.size()); ++w) {
    const int point = pol.windows[static_cast<std::size_t>(w)].candidate;
    WEFT_CHECK(point >= 0 && point < points, "lower_adaptive: window {} points at frontier point {} of {}", w,
               point, points);
    used[static_cast<std::size_t>(point)].push_back(w);
  }
  const std::int64_t per_replica = plan.microbatch_size * plan.num_microbatches;
  std::vector<AdaptiveProgram> out;
  for (int point = 0; point < points; ++point) {
    const sim::Candidate& c = pol.frontier[static_cast<std::size_t>(point)];
    WEFT_CHECK(c.micro_batch_size >= 1 && per_replica % c.micro_batch_size == 0,
               "lower_adaptive: micro-batch size {} does not divide the {} samples per replica", c.micro_batch_size,
               per_replica);
    plan::Plan q = plan;
    q.adaptive.reset();
    q.schedule = c.k == 1 ? "1f1b" : "kfkb";
    q.schedule_k = c.k;
    q.microbatch_size = c.micro_batch_size;
    q.num_microbatches = static_cast<int>(per_replica / c.micro_batch_size);
    if (!q.replica_microbatch.empty()) q.replica_microbatch.assign(q.replica_microbatch.size(), q.microbatch_size);
    AdaptiveProgram ap;
    ap.k = c.k;
    ap.microbatch_size = c.micro_batch_size;
    ap.num_microbatches = q.num_microbatches;
    ap.windows = used[static_cast<std::size_t>(point)];
    try {
      ap.program = lower(q, step, cluster);
    } catch (const Error& e) {
      fail("lower_adaptive: point {} ({}): {}", point, c.to_string(), e.what());
    }
    out.push_back(std::move(ap));
  }
  return out;
}

}  // namespace weft::lower
