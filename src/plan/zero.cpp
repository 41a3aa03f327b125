// Sharded data parallelism across a stage's replicas (include/weft/plan/zero.hpp): the closed
// forms of ZeRO's memory and traffic, and the stage's costs with its replicas (planner_detail.hpp):
// their links, the ZeRO levels and shard groups tried, and how much of a collective overlaps
// the compute it serves (exposed_overlap, exposed_grad_sync).
#include "weft/plan/zero.hpp"

#include <algorithm>
#include <string>

#include "planner_detail.hpp"
#include "weft/cluster/alpha_beta.hpp"

namespace weft::plan {

int parse_zero(std::string_view text) {
  if (text == "auto" || text == "-1") return -1;
  if (text.size() == 1 && text[0] >= '0' && text[0] <= '3') return text[0] - '0';
  fail("zero must be auto, 0, 1, 2 or 3 (ZeRO level across data-parallel replicas), got '{}'", text);
}

ZeroMemory zero_memory(int level, double param_bytes, double optimizer_bytes, int group,
                       double largest_block_param_bytes, double bucket_bytes, double grad_bytes) {
  WEFT_CHECK(level >= 0 && level <= 3, "zero_memory: level {} is not 0..3", level);
  WEFT_CHECK(group >= 1, "zero_memory: a shard group of {} replicas", group);
  const double z = group;
  ZeroMemory m{param_bytes, grad_bytes < 0 ? param_bytes : grad_bytes, optimizer_bytes, 0};
  if (level >= 1) m.optimizer /= z;
  if (level >= 2) m.grads /= z;
  if (level >= 3) m.params /= z;
  if (level == 2 && group > 1) m.working = std::min(param_bytes, bucket_bytes);
  if (level == 3 && group > 1) m.working = 3 * largest_block_param_bytes * (1 - 1 / z);
  return m;
}

ZeroTraffic zero_traffic(int level, double param_bytes, int group, int groups) {
  WEFT_CHECK(level >= 0 && level <= 3, "zero_traffic: level {} is not 0..3", level);
  WEFT_CHECK(group >= 1 && groups >= 1, "zero_traffic: {} groups of {} replicas", groups, group);
  const double ring = (group - 1.0) / group, P = param_bytes;
  ZeroTraffic t;
  switch (level) {
    case 0:  // an all-reduce, or a reduce-scatter and an all-gather: the same bytes
    case 1: t.per_step = 2 * ring * P; break;
    case 2: t.per_microbatch = ring * P, t.per_step = ring * P; break;
    default: t.per_microbatch = 3 * ring * P; break;
  }
  if (level >= 1 && groups > 1) t.per_step += 2 * (groups - 1.0) / groups * P / group;
  return t;
}

namespace detail {

ReplicaLinks replica_links(const cluster::Cluster& c, const std::vector<int>& devices, int replicas,
                           int group) {
  WEFT_ASSERT(replicas >= 1 && group >= 1 && replicas % group == 0 && !devices.empty() &&
                  devices.size() % static_cast<std::size_t>(replicas) == 0,
              "replica_links: bad replica grouping");
  ReplicaLinks l;
  l.replicas = replicas;
  l.group = group;
  if (replicas == 1) return l;
  const auto n = static_cast<std::int64_t>(devices.size()) / replicas;
  // Mesh (groups, group, n) over the replica-major devices: axis 1 rings inside a group, axis 0
  // across the groups (each device with its counterparts in the other groups).
  const cluster::DeviceMesh mesh({replicas / group, group, n}, devices);
  const auto links = cluster::axis_links(c, mesh);
  l.in_group = links[1];
  l.across_groups = links[0];
  return l;
}

std::vector<int> shard_groups(const cluster::Cluster& c, const PlanOptions& o, int replicas, int n) {
  std::vector<int> out{replicas};
  const int node = static_cast<int>(c.devices_of_node(0).size());  // homogeneous clusters
  const int per_node = node / std::max(1, n);
  if (o.hybrid_sharding && n <= node && per_node > 1 && per_node < replicas && replicas % per_node == 0)
    out.push_back(per_node);
  return out;
}

std::vector<int> zero_levels(const PlanOptions& o, int replicas) {
  if (replicas <= 1) return {0};
  if (o.zero >= 0) return {o.zero};
  return {0, 1, 2, 3};
}

double exposed_overlap(const PlanOptions& o, double comm, double window, double unit) {
  if (!o.overlap_grad_sync || comm <= 0) return comm;
  return std::max(comm * std::clamp(unit, 0.0, 1.0), comm - window);
}

double exposed_grad_sync(const PlanOptions& o, double sync, double grad_bytes, double backward) {
  return exposed_overlap(o, sync, backward, grad_bytes > 0 ? o.grad_bucket_bytes / grad_bytes : 1.0);
}

namespace {
double ring(double (*f)(const cluster::AxisLink&, double), const cluster::AxisLink& l, double bytes) {
  return l.size > 1 && bytes > 0 ? f(l, bytes) : 0.0;
}

// The collectives the lowering issues for `total` bytes of the tensors `p` (in the order they
// are ready, or its reverse; scaled to sum to `total`), grouped greedily into buckets of at least
// `cap` bytes (cap <= 0: one collective per tensor), as the lowering groups them (lower.md step 5):
// Σ over the buckets of the collective's time, so its latency term counts the buckets. Without
// tensors: one. A ring collective's time is affine in its bytes (α-β), so the Σ over n buckets is
// one collective of them all plus n − 1 latency terms (the time of 0 bytes): the buckets are
// counted, not priced one by one, and counted once per stage (ParamTensors::buckets).
double bucketed(double (*f)(const cluster::AxisLink&, double), const cluster::AxisLink& l,
                const ParamTensors* p, double total, double cap, bool reverse = false) {
  if (l.size <= 1 || total <= 0) return 0.0;
  if (p == nullptr || p->bytes.empty() || p->sum <= 0) return f(l, total);
  const int n = p->buckets(total / p->sum, cap, reverse);
  return f(l, total) + std::max(0, n - 1) * f(l, 0.0);
}
}  // namespace

int ParamTensors::buckets(double k, double cap, bool reverse) const {
  for (const Count& c : counts_)
    if (c.k == k && c.cap == cap && c.reverse == reverse) return c.n;
  double cur = 0;
  int n = 0;
  auto add = [&](double x) {
    cur += x * k;
    if (cap <= 0 || cur >= cap) {
      n += cur > 0 ? 1 : 0;
      cur = 0;
    }
  };
  if (reverse)
    std::for_each(bytes.rbegin(), bytes.rend(), add);
  else
    std::for_each(bytes.begin(), bytes.end(), add);
  n += cur > 0 ? 1 : 0;
  counts_.push_back({k, cap, reverse, n});
  return n;
}

StageAgg with_replicas(const StageAgg& a, int level, const ReplicaLinks& l, double grad_bytes,
                       const PlanOptions& o) {
  StageAgg r = a;
  const int z = l.group;
  const double G = grad_bytes, P = grad_bytes;
  const double bucket = G > 0 ? std::min(1.0, o.grad_bucket_bytes / G) : 1.0;
  const double block = a.param_mem > 0 ? a.max_block_param / a.param_mem : 1.0;
  const cluster::AxisLink& grp = l.in_group;
  auto AR = [](const cluster::AxisLink& k, double b) { return ring(cluster::all_reduce_time, k, b); };
  auto AG = [](const cluster::AxisLink& k, double b) { return ring(cluster::all_gather_time, k, b); };
  // Per step, outside the micro-batches: the update less its compute and the in-mesh gradient
  // synchronisation, which are re-added below.
  const double rest = a.upd - a.grad_sync - a.upd_compute;
  // The same collectives for the simulator's communication streams (sim::ReplicaCollectives): the
  // overlap units of the rule above, and what the times hold of each collective.
  auto unit = [&](double u) { return o.overlap_grad_sync ? std::clamp(u, 1e-12, 1.0) : 1.0; };
  r.replica = {};
  sim::ReplicaCollectives& rc = r.replica.collectives;
  rc.prefetch = o.overlap_grad_sync;
  auto step_sync = [&](double sync, double grads) {  // bucketed with the last backward
    rc.step_sync = sync;
    rc.sync_unit = unit(grads > 0 ? o.grad_bucket_bytes / grads : 1.0);
    r.replica.in_optimizer = exposed_grad_sync(o, sync, grads, a.bwd);
    return r.replica.in_optimizer;
  };
  // The buckets the lowering makes (lower.md step 5): of grad_bucket_bytes, gradients in the order
  // the backward makes them (the reverse of the parameters'), with or without overlap (which only
  // says whether the compute hides them). Each bucket pays the collective's latency once.
  const double cap = o.grad_bucket_bytes;
  const ParamTensors* tensors = a.param_tensors.get();
  if (level == 0 || l.replicas == 1) {
    // The in-mesh synchronisation and the all-reduce across every replica (one group of all of
    // them) in the gradient buckets, with the last micro-batch's backward.
    WEFT_ASSERT(l.group == l.replicas, "plain data parallelism over a hybrid replica grouping");
    const double sync = bucketed(cluster::all_reduce_time, grp, tensors, G, cap, true);
    r.upd = rest + a.upd_compute + step_sync(a.grad_sync + sync, G);
    r.zero = 0;
    r.zero_group = 1;
    return r;
  }
  const double across = AR(l.across_groups, G / z);  // hybrid: the shards' all-reduce across groups
  const ZeroMemory mem =
      zero_memory(level, a.param_mem, a.opt_mem, z, a.max_block_param, o.grad_bucket_bytes, a.grad_mem);
  r.static_mem = a.static_mem - a.param_mem - a.grad_mem - a.opt_mem + mem.state();
  // The update runs on the shard: where the transient peaked at an update (its new state beside
  // the old), only a shard's worth of it remains.
  const double unsharded = std::max(a.rest_excess, a.upd_excess);
  const double update_saved = unsharded - std::max(a.rest_excess, a.upd_excess / z);
  r.transient = std::max(0.0, a.transient - update_saved) + mem.working;
  r.full_transient = a.full_transient + mem.working;
  r.sel_transient = a.sel_transient + mem.working;
  const double update = a.upd_compute / z;  // each replica updates its shard
  // ZeRO's collectives as the lowering issues them (lower.md step 5): the gradients' reduce-
  // scatters in buckets of grad_bucket_bytes in the order the backward makes them (the reverse of
  // the parameters'), the new parameters' gathers in such buckets in update order, ZeRO-3's
  // gathers one per block (FSDP's unit). Each bucket pays the collective's latency once.
  auto RSb = [&](const cluster::AxisLink& k, double b) {
    return bucketed(cluster::reduce_scatter_time, k, tensors, b, cap, true);
  };
  auto AGb = [&](const cluster::AxisLink& k, double b) {
    return bucketed(cluster::all_gather_time, k, tensors, b, cap);
  };
  if (level == 1) {
    // Gradients accumulate whole; once per step reduce-scattered (with the last backward), the
    // shard updated, the new parameters all-gathered (exposed: the next forward reads them).
    rc.step_gather = AGb(grp, P);
    r.upd = rest + update + step_sync(a.grad_sync + RSb(grp, G) + across, G) + rc.step_gather;
    r.replica.in_optimizer += rc.step_gather;
  } else if (level == 2) {
    // Every micro-batch's gradients reduce-scattered bucket by bucket during its backward.
    const double rs = RSb(grp, G);
    rc.reduce_backward = rs;
    rc.reduce_unit = unit(bucket);
    r.replica.in_backward = exposed_overlap(o, rs, a.bwd, bucket);
    r.bwd = a.bwd + r.replica.in_backward;
    r.comm = a.comm + rs;
    rc.step_gather = AGb(grp, P);
    r.upd = rest + update + step_sync(a.grad_sync + across, G / z) + rc.step_gather;
    r.replica.in_optimizer += rc.step_gather;
  } else {
    // Parameters gathered block by block before the forward and again before the backward (the
    // next block prefetched), gradients reduce-scattered as they are made, every micro-batch.
    // One gather per block with parameters (per tensor where the plan has no buckets).
    double ag = 0, sum = 0;
    for (double x : a.blk_param) sum += x;
    if (cap > 0 && sum > 0)
      for (double x : a.blk_param) ag += AG(grp, P * x / sum);
    else
      ag = AGb(grp, P);
    const double rs = RSb(grp, G);
    rc.gather_forward = rc.gather_backward = ag;
    rc.reduce_backward = rs;
    rc.gather_unit = rc.reduce_unit = unit(block);
    r.replica.in_forward = exposed_overlap(o, ag, a.fwd, block);
    r.replica.in_backward = exposed_overlap(o, ag + rs, a.bwd, block);
    r.fwd = a.fwd + r.replica.in_forward;
    r.bwd = a.bwd + r.replica.in_backward;
    r.comm = a.comm + 2 * ag + rs;
    r.upd = rest + update + step_sync(a.grad_sync + across, G / z);
  }
  r.zero = level;
  r.zero_group = z;
  return r;
}

StageAgg with_mixed_zero(const StageAgg& a, int base, const std::vector<int>& set3, const ReplicaLinks& l,
                         double grad_bytes, const PlanOptions& o) {
  WEFT_ASSERT(base == 1 || base == 2, "with_mixed_zero: the base level is 1 or 2");
  StageAgg r = with_replicas(a, base, l, grad_bytes, o);
  if (set3.empty()) return r;
  const StageAgg all3 = with_replicas(a, 3, l, grad_bytes, o);
  double p3 = 0, largest = 0;
  for (int b : set3) {
    WEFT_ASSERT(b >= 0 && b < static_cast<int>(a.blk_param.size()),
                "with_mixed_zero: a block outside the stage");
    p3 += a.blk_param[static_cast<std::size_t>(b)];
    largest = std::max(largest, a.blk_param[static_cast<std::size_t>(b)]);
  }
  const double f = a.param_mem > 0 ? std::min(1.0, p3 / a.param_mem) : 0.0;
  auto mix = [f](double x, double y) { return x + f * (y - x); };
  {  // the collectives follow the parameters too; ZeRO-3's gathers move the set's blocks
    sim::ReplicaCollectives& c = r.replica.collectives;
    const sim::ReplicaCollectives& c3 = all3.replica.collectives;
    for (auto [x, y] : {std::pair{&c.gather_forward, &c3.gather_forward},
                        {&c.gather_backward, &c3.gather_backward},
                        {&c.reduce_backward, &c3.reduce_backward},
                        {&c.step_sync, &c3.step_sync},
                        {&c.step_gather, &c3.step_gather},
                        {&c.reduce_unit, &c3.reduce_unit},
                        {&c.sync_unit, &c3.sync_unit}})
      *x = mix(*x, *y);
    c.gather_unit = o.overlap_grad_sync && p3 > 0 ? std::clamp(largest / p3, 1e-12, 1.0) : 1.0;
    r.replica.in_forward = mix(r.replica.in_forward, all3.replica.in_forward);
    r.replica.in_backward = mix(r.replica.in_backward, all3.replica.in_backward);
    r.replica.in_optimizer = mix(r.replica.in_optimizer, all3.replica.in_optimizer);
  }
  r.fwd = mix(r.fwd, all3.fwd);
  r.bwd = mix(r.bwd, all3.bwd);
  r.wgt = mix(r.wgt, all3.wgt);
  r.upd = mix(r.upd, all3.upd);
  r.comm = mix(r.comm, all3.comm);
  r.static_mem = mix(r.static_mem, all3.static_mem);
  const double working =
      zero_memory(base, a.param_mem, a.opt_mem, l.group, a.max_block_param, o.grad_bucket_bytes).working;
  const double working3 = zero_memory(3, a.param_mem, a.opt_mem, l.group, largest).working;
  r.transient += std::max(0.0, working3 - working);
  r.zero3_set = set3;
  std::sort(r.zero3_set.begin(), r.zero3_set.end());
  return r;
}

std::vector<int> zero3_order(const StageAgg& a) {
  std::vector<int> order(a.blk_param.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  std::stable_sort(order.begin(), order.end(), [&](int x, int y) {
    return a.blk_param[static_cast<std::size_t>(x)] > a.blk_param[static_cast<std::size_t>(y)];
  });
  return order;
}

}  // namespace detail
}  // namespace weft::plan
