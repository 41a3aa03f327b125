// Heterogeneous plans scored with one cost model, for the even and the balanced split alike.
//
// Model profile. Every op of a zoo training graph has FLOPs and bytes affine in the batch b
// (the batch dim is a factor of every activation; weights and the optimizer do not depend on
// it), so two graphs built at b = 1 and b = 2 give, per op, flops(b) = f0 + f1·b and
// bytes(b) = b0 + b1·b exactly; the roofline of op o on device d is
//   t_o(b) = max(flops(b) / (peak_d · eff), bytes(b) / (bw_d · eff)) + overhead
// (weft::cost::roofline) and a device's step compute time is Σ_o t_o(b) — the same number as
// costing the graph built at b op by op. Peak memory is the liveness peak (weft::cost::liveness):
// per position p the live bytes are A_p + C_p·b, so peak(b) = max_p (A_p + C_p·b), exact for
// every b and convex in b.
//
// Data parallel: device i computes its share b_i; gradients (param bytes) are all-reduced with
// the α-β model over the group's mesh on the cluster (hierarchical across nodes, each hop the
// slowest link of the mixed nodes: cluster::axis_links). Step = max_i compute_i + exposed
// all-reduce + optimizer (see DataParallelOptions).
//
// Pipeline: stage s on device d_s runs layers [a_s, a_s + L_s) (plus the embedding on the first
// stage and the head on the last); F and B per micro-batch from the same roofline; 1F1B is
// simulated by weft::sim with the cluster's links between consecutive stages; memory of a stage
// = its parameters, gradients and optimizer state + (peak in-flight micro-batches) × stash.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <map>
#include <numeric>
#include <unordered_map>

#include "weft/cluster/alpha_beta.hpp"
#include "weft/cluster/device_mesh.hpp"
#include "weft/core/error.hpp"
#include "weft/core/units.hpp"
#include "weft/cost/collectives.hpp"
#include "weft/cost/gemm_shape.hpp"
#include "weft/cost/memory.hpp"
#include "weft/cost/op_cost.hpp"
#include "weft/cost/roofline.hpp"
#include "weft/models/models.hpp"
#include "weft/pipeline/hetero.hpp"
#include "weft/schedule/schedule.hpp"
#include "weft/sim/simulator.hpp"

namespace weft::pipeline {
namespace {

// Layer index of "<prefix><digits>.<rest>", else -1.
int parse_layer(std::string_view name, std::string_view prefix) {
  if (prefix.empty() || name.size() <= prefix.size() || name.substr(0, prefix.size()) != prefix) return -1;
  std::size_t i = prefix.size();
  std::size_t j = i;
  while (j < name.size() && std::isdigit(static_cast<unsigned char>(name[j]))) ++j;
  if (j == i || j >= name.size() || name[j] != '.') return -1;
  int v = 0;
  std::from_chars(name.data() + i, name.data() + j, v);
  return v;
}

// The forward name an autodiff / optimizer op or tensor derives from: "d:<x>/<what>",
// "d:<t>+1", "adam:<p>#2" -> x, t, p.
std::string anchor(std::string_view s) {
  for (std::string_view p : {"d:", "adam:", "sgd:", "adam_m:", "adam_v:", "master:", "sgd_momentum:"})
    if (s.substr(0, p.size()) == p) {
      s.remove_prefix(p.size());
      break;
    }
  if (auto k = s.find('/'); k != std::string_view::npos) s = s.substr(0, k);
  for (char sep : {'+', '#'}) {
    auto k = s.rfind(sep);
    if (k != std::string_view::npos && k + 1 < s.size() &&
        std::all_of(s.begin() + static_cast<std::ptrdiff_t>(k) + 1, s.end(),
                    [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
      s = s.substr(0, k);
  }
  return std::string(s);
}

double tensor_bytes(const ir::Graph& g, ir::TensorId t) { return static_cast<double>(g.tensor(t).bytes()); }

double op_bytes(const ir::Graph& g, const ir::Op& op) {
  double b = 0;
  for (ir::TensorId t : op.inputs) b += tensor_bytes(g, t);
  for (ir::TensorId t : op.outputs) b += tensor_bytes(g, t);
  return b;
}

std::pair<double, double> affine(double at1, double at2) { return {2 * at1 - at2, at2 - at1}; }

double eval(const std::pair<double, double>& l, double b) { return l.first + l.second * b; }

}  // namespace

ModelProfile ModelProfile::from_builder(const std::function<ir::Graph(std::int64_t)>& build,
                                        const ir::TrainOptions& options, std::string layer_prefix) {
  WEFT_CHECK(static_cast<bool>(build), "ModelProfile: the graph builder is empty");
  const ir::Graph f1 = build(1), f2 = build(2);
  const ir::Graph g1 = ir::build_training_graph(f1, options), g2 = ir::build_training_graph(f2, options);
  WEFT_CHECK(
      g1.ops().size() == g2.ops().size() && g1.tensors().size() == g2.tensors().size() &&
          f1.ops().size() == f2.ops().size(),
      "ModelProfile: the graphs built at batch 1 and 2 differ in structure ({} vs {} ops); the builder must "
      "only change the batch",
      g1.ops().size(), g2.ops().size());
  ModelProfile p;
  p.name_ = f1.name();
  p.param_bytes_ = static_cast<double>(g1.param_bytes());
  const std::size_t nf = f1.ops().size();

  if (layer_prefix.empty()) {
    for (std::string cand : {"layer", "h"}) {
      bool any = false;
      for (const ir::Op& op : f1.ops()) any = any || parse_layer(op.name, cand) >= 0;
      if (any) {
        layer_prefix = cand;
        break;
      }
    }
  }
  // Forward op groups: layer by name; before the first layer op = pre (−1), after = post (L).
  std::vector<int> fgroup(nf, -1);
  int layers = 0;
  std::size_t first_layer_op = nf;
  for (std::size_t i = 0; i < nf; ++i) {
    const int l = parse_layer(f1.ops()[i].name, layer_prefix);
    fgroup[i] = l;
    if (l >= 0) {
      layers = std::max(layers, l + 1);
      first_layer_op = std::min(first_layer_op, i);
    }
  }
  p.num_layers_ = layers;
  for (std::size_t i = 0; i < nf; ++i)
    if (fgroup[i] < 0) fgroup[i] = i < first_layer_op ? -1 : layers;
  std::unordered_map<std::string, int> group_of_name;
  for (std::size_t i = 0; i < nf; ++i) group_of_name.emplace(f1.ops()[i].name, fgroup[i]);
  // Forward tensors: the producer's group; leaves: the first forward consumer's (or the name's).
  const std::size_t nt_f = f1.tensors().size();
  std::vector<int> tgroup(nt_f, -1);
  std::vector<bool> seen(nt_f, false);
  for (std::size_t i = 0; i < nf; ++i)
    for (ir::TensorId t : f1.ops()[i].inputs)
      if (!seen[static_cast<std::size_t>(t)])
        seen[static_cast<std::size_t>(t)] = true, tgroup[static_cast<std::size_t>(t)] = fgroup[i];
  for (std::size_t t = 0; t < nt_f; ++t) {
    const ir::TensorInfo& ti = f1.tensors()[t];
    if (ti.producer != ir::kNoOp) tgroup[t] = fgroup[static_cast<std::size_t>(ti.producer)];
    const int l = parse_layer(ti.name, layer_prefix);
    if (l >= 0) tgroup[t] = l;
    group_of_name.emplace(ti.name, tgroup[t]);
  }
  auto group_of = [&](const std::string& name) {
    const int l = parse_layer(name, layer_prefix);
    if (l >= 0) return l;
    auto it = group_of_name.find(anchor(name));
    return it == group_of_name.end() ? layers : it->second;
  };

  // Ops as affine lines.
  p.ops_.reserve(g1.ops().size());
  for (std::size_t i = 0; i < g1.ops().size(); ++i) {
    const ir::Op& a = g1.ops()[i];
    const ir::Op& b = g2.ops()[i];
    WEFT_CHECK(a.kind == b.kind && a.name == b.name, "ModelProfile: op {} differs between batch 1 and 2", i);
    OpLine o;
    std::tie(o.f0, o.f1) = affine(a.flops(), b.flops());
    std::tie(o.b0, o.b1) = affine(op_bytes(g1, a), op_bytes(g2, b));
    o.dtype = cost::compute_dtype(g1, a);
    auto whole = [](const ir::Op& op) {  // one device runs all of it
      std::vector<double> sz;
      for (const auto& f : op.index_map.factors) sz.push_back(static_cast<double>(f.size));
      return cost::gemm_shape(op, sz);
    };
    if (const auto s1 = whole(a), s2 = whole(b); s1 && s2) {
      o.gemm = true;
      std::tie(o.p0, o.p1) = affine(s1->parallel(), s2->parallel());
      std::tie(o.k0, o.k1) = affine(s1->k, s2->k);
    }
    const bool opt = a.kind == ir::OpKind::AdamUpdate || a.kind == ir::OpKind::SgdUpdate;
    o.phase = i < nf ? 0 : (opt ? 2 : 1);
    o.group = i < nf ? fgroup[i] : group_of(a.name);
    p.ops_.push_back(o);
  }

  // Liveness peak as max of lines, then pruned to the non-dominated ones.
  const cost::Liveness live = cost::liveness(g1);
  std::vector<std::pair<double, double>> tl(g1.tensors().size());
  for (std::size_t t = 0; t < tl.size(); ++t)
    tl[t] = affine(tensor_bytes(g1, static_cast<ir::TensorId>(t)),
                   tensor_bytes(g2, static_cast<ir::TensorId>(t)));
  std::vector<std::pair<double, double>> lines;
  for (const auto& set : live.sets) {
    double A = 0, C = 0;
    for (ir::TensorId t : set)
      A += tl[static_cast<std::size_t>(t)].first, C += tl[static_cast<std::size_t>(t)].second;
    lines.emplace_back(A, C);
  }
  std::sort(lines.begin(), lines.end(),
            [](auto& x, auto& y) { return x.second != y.second ? x.second > y.second : x.first > y.first; });
  double best_a = -1;
  for (const auto& l : lines)  // C descending: keep a line only when its A beats every steeper one
    if (l.first > best_a) p.memory_hull_.push_back(l), best_a = l.first;

  // Per group: static (params + gradients + optimizer state), stash, boundaries.
  const int ng = layers + 2;
  p.group_static_.assign(static_cast<std::size_t>(ng), 0.0);
  p.group_params_.assign(static_cast<std::size_t>(ng), 0.0);
  p.group_stash_.assign(static_cast<std::size_t>(ng), {0.0, 0.0});
  for (std::size_t t = 0; t < g1.tensors().size(); ++t) {
    const ir::TensorInfo& ti = g1.tensors()[t];
    if (ti.producer != ir::kNoOp) continue;
    int grp = 0;
    double mult = 0;
    if (ti.role == ir::Role::Parameter) {
      grp = t < nt_f ? tgroup[t] : group_of(ti.name), mult = 2;  // the parameter and its gradient
    } else if (ti.role == ir::Role::OptimizerState) {
      auto of = g1.grad_of(static_cast<ir::TensorId>(t));
      grp = of && static_cast<std::size_t>(*of) < nt_f ? tgroup[static_cast<std::size_t>(*of)]
                                                       : group_of(ti.name);
      mult = 1;
    } else {
      continue;
    }
    p.group_static_[static_cast<std::size_t>(grp + 1)] += mult * static_cast<double>(ti.bytes());
    if (ti.role == ir::Role::Parameter)
      p.group_params_[static_cast<std::size_t>(grp + 1)] += static_cast<double>(ti.bytes());
  }
  std::vector<bool> read_by_backward(g1.tensors().size(), false);
  for (std::size_t i = nf; i < g1.ops().size(); ++i)
    for (ir::TensorId t : g1.ops()[i].inputs) read_by_backward[static_cast<std::size_t>(t)] = true;
  for (std::size_t t = 0; t < nt_f; ++t) {
    const ir::TensorInfo& ti = f1.tensors()[t];
    if (ti.producer == ir::kNoOp || ti.role != ir::Role::Activation || !read_by_backward[t]) continue;
    auto& s = p.group_stash_[static_cast<std::size_t>(tgroup[t] + 1)];
    s.first += tl[t].first, s.second += tl[t].second;
  }
  // boundary after group l (l = −1 .. L−1): produced in groups ≤ l, read by forward ops in > l.
  p.boundary_.assign(static_cast<std::size_t>(layers + 1), {0.0, 0.0});
  std::vector<int> last_reader(nt_f, -2);
  for (std::size_t i = 0; i < nf; ++i)
    for (ir::TensorId t : f1.ops()[i].inputs)
      last_reader[static_cast<std::size_t>(t)] =
          std::max(last_reader[static_cast<std::size_t>(t)], fgroup[i]);
  for (std::size_t t = 0; t < nt_f; ++t) {
    const ir::TensorInfo& ti = f1.tensors()[t];
    if (ti.producer == ir::kNoOp) continue;
    for (int l = tgroup[t]; l < last_reader[t] && l < layers; ++l) {
      auto& bd = p.boundary_[static_cast<std::size_t>(l + 1)];
      bd.first += tl[t].first, bd.second += tl[t].second;
    }
  }
  return p;
}

ModelProfile ModelProfile::from_preset(std::string_view preset, DType dtype,
                                       const ir::TrainOptions& options) {
  const std::string name(preset);
  return from_builder([&](std::int64_t b) { return models::build_preset(name, b, dtype); }, options);
}

double ModelProfile::flops(double b) const {
  double f = 0;
  for (const OpLine& o : ops_) f += o.f0 + o.f1 * b;
  return f;
}

namespace {
template <class Pred>
double sum_time(const std::vector<ModelProfile::OpLine>& ops, double b, const cluster::Device& d,
                const cost::Calibration& cal, Pred pred) {
  WEFT_CHECK(b >= 0, "batch must be >= 0 (got {})", b);
  double t = 0;
  for (const auto& o : ops) {
    if (!pred(o)) continue;
    const cost::GemmShape shape{1, o.p0 + o.p1 * b, 1, o.k0 + o.k1 * b};
    t += cost::roofline(o.f0 + o.f1 * b, o.b0 + o.b1 * b, o.dtype, d, cal, o.gemm ? &shape : nullptr).total;
  }
  return t;
}
}  // namespace

double ModelProfile::time(double b, const cluster::Device& d, const cost::Calibration& cal) const {
  return sum_time(ops_, b, d, cal, [](const OpLine&) { return true; });
}

double ModelProfile::forward_time(double b, const cluster::Device& d, const cost::Calibration& cal) const {
  return sum_time(ops_, b, d, cal, [](const OpLine& o) { return o.phase == 0; });
}

double ModelProfile::peak_memory(double b) const {
  double m = 0;
  for (const auto& l : memory_hull_) m = std::max(m, eval(l, b));
  return m;
}

LoadModel ModelProfile::memory_line(std::int64_t b_hi) const {
  WEFT_CHECK(b_hi >= 1, "memory_line needs b_hi >= 1 (got {})", b_hi);
  const double p1 = peak_memory(1);
  if (b_hi == 1) {
    double c = 0;  // the steepest line through the peak at 1
    for (const auto& l : memory_hull_)
      if (eval(l, 1) >= p1) c = std::max(c, l.second);
    return LoadModel(std::max(flops(2) - flops(1), 1.0), std::max(0.0, p1 - c), c);
  }
  const double ph = peak_memory(static_cast<double>(b_hi));
  const double c = (ph - p1) / static_cast<double>(b_hi - 1);
  return LoadModel(std::max(flops(2) - flops(1), 1.0), std::max(0.0, p1 - c), std::max(0.0, c));
}

std::string ModelProfile::to_string() const {
  return fmt::format("ModelProfile({}: {} ops, {} layers, {} params, {}/sample)", name_, ops_.size(),
                     num_layers_, format_bytes(param_bytes_), format_flops(flops(2) - flops(1)));
}

double ModelProfile::group_flops(int g, double m) const {
  double f = 0;
  for (const OpLine& o : ops_)
    if (o.group == g && o.phase < 2) f += o.f0 + o.f1 * m;
  return f;
}

double ModelProfile::group_time(int g, double m, const cluster::Device& d, const cost::Calibration& cal,
                                bool forward) const {
  const std::uint8_t ph = forward ? 0 : 1;
  return sum_time(ops_, m, d, cal, [&](const OpLine& o) { return o.group == g && o.phase == ph; });
}

double ModelProfile::group_optimizer_time(int g, const cluster::Device& d,
                                          const cost::Calibration& cal) const {
  return sum_time(ops_, 1, d, cal, [&](const OpLine& o) { return o.group == g && o.phase == 2; });
}

double ModelProfile::group_static_bytes(int g) const {
  WEFT_CHECK(g >= -1 && g <= num_layers_, "group {} out of range [-1, {}]", g, num_layers_);
  return group_static_[static_cast<std::size_t>(g + 1)];
}

double ModelProfile::group_param_bytes(int g) const {
  WEFT_CHECK(g >= -1 && g <= num_layers_, "group {} out of range [-1, {}]", g, num_layers_);
  return group_params_[static_cast<std::size_t>(g + 1)];
}

double ModelProfile::group_stash_bytes(int g, double m) const {
  WEFT_CHECK(g >= -1 && g <= num_layers_, "group {} out of range [-1, {}]", g, num_layers_);
  return eval(group_stash_[static_cast<std::size_t>(g + 1)], m);
}

double ModelProfile::boundary_bytes(int after, double m) const {
  WEFT_CHECK(after >= -1 && after < num_layers_, "boundary after layer {} out of range [-1, {})", after,
             num_layers_);
  return eval(boundary_[static_cast<std::size_t>(after + 1)], m);
}

// ---- data parallel --------------------------------------------------------------------------

std::string DpEvaluation::to_string() const {
  return fmt::format("DpEvaluation(batch=[{}], step={:.4g} s, allreduce={:.4g} s, {:.4g} samples/s{})",
                     fmt::join(batch, ","), step_time, allreduce, throughput, fits ? "" : ", OUT OF MEMORY");
}

namespace {
double optimizer_time(const ModelProfile& m, const cluster::Device& d, const cost::Calibration& cal) {
  double t = 0;
  for (int g = -1; g <= m.num_layers(); ++g) t += m.group_optimizer_time(g, d, cal);
  return t;
}
void check_ids(const cluster::Cluster& c, const std::vector<int>& ids) {
  WEFT_CHECK(!ids.empty(), "no devices given");
  std::vector<int> s = ids;
  std::sort(s.begin(), s.end());
  WEFT_CHECK(std::adjacent_find(s.begin(), s.end()) == s.end(), "device ids must be distinct");
  for (int id : ids)
    WEFT_CHECK(id >= 0 && id < c.num_devices(), "device id {} not in the cluster (0..{})", id,
               c.num_devices() - 1);
}
}  // namespace

DpEvaluation evaluate_data_parallel(const ModelProfile& model, const cluster::Cluster& c,
                                    const std::vector<int>& ids, const std::vector<std::int64_t>& batch,
                                    const DataParallelOptions& opt) {
  check_ids(c, ids);
  WEFT_CHECK(batch.size() == ids.size(), "evaluate_data_parallel: {} batch shares for {} devices",
             batch.size(), ids.size());
  DpEvaluation e;
  e.batch = batch;
  double fb = 0, fwd = 0;  // max over replicas of optimizer + forward + backward, optimizer + forward
  std::int64_t total = 0;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    WEFT_CHECK(batch[i] >= 0, "batch shares must be >= 0 (got {})", batch[i]);
    const cluster::Device& d = c.device(ids[i]);
    const double b = static_cast<double>(batch[i]);
    const double o = optimizer_time(model, d, opt.calibration);
    const double t = model.time(b, d, opt.calibration);
    e.compute.push_back(t);
    e.memory.push_back(model.peak_memory(b));
    e.fits = e.fits && e.memory.back() <= d.spec.memory_bytes;
    // Each replica runs its optimizer right after the all-reduce and goes on with the next step's
    // forward: the replicas meet only at the all-reduce, so the period is set by the slowest
    // optimizer + forward (+ backward), not by the slowest optimizer plus the slowest compute.
    fb = std::max(fb, t);
    fwd = std::max(fwd, o + model.forward_time(b, d, opt.calibration));
    total += batch[i];
  }
  WEFT_CHECK(total > 0, "evaluate_data_parallel: the global batch is 0");
  double ar_bucket = 0;
  if (ids.size() > 1) {
    const cluster::DeviceMesh mesh({static_cast<std::int64_t>(ids.size())}, ids);
    const cluster::AxisLink link = cost::calibrated_axis_links(c, mesh, opt.calibration).at(0);
    e.allreduce = cluster::all_reduce_time(link, model.param_bytes());
    ar_bucket = cluster::all_reduce_time(link, std::min(opt.bucket_bytes, model.param_bytes()));
  }
  e.step_time = opt.overlap_grad_sync ? std::max(fb + ar_bucket, fwd + e.allreduce) : fb + e.allreduce;
  e.throughput = static_cast<double>(total) / e.step_time;
  return e;
}

HeteroShares balance_data_parallel(const ModelProfile& model, const cluster::Cluster& c,
                                   const std::vector<int>& ids, std::int64_t global_batch,
                                   const DataParallelOptions& opt) {
  check_ids(c, ids);
  WEFT_CHECK(global_batch >= 1, "global batch must be >= 1 (got {})", global_batch);
  const double mean = static_cast<double>(global_batch) / static_cast<double>(ids.size());
  const double lo = std::max(1.0, std::floor(mean / 2)), hi = std::max(lo + 1, std::ceil(2 * mean));
  const double fps = (model.flops(hi) - model.flops(lo)) / (hi - lo);
  WEFT_CHECK(fps > 0, "the model's FLOPs do not grow with the batch");
  LoadModel mem = model.memory_line(global_batch);
  std::vector<DeviceCapacity> devs;
  std::vector<LoadModel> loads;
  for (int id : ids) {
    const cluster::Device& d = c.device(id);
    // The optimizer step stays in the fixed part: a replica's period is optimizer + compute (see
    // evaluate_data_parallel), so a slower optimizer leaves that replica fewer samples.
    const double tlo = model.time(lo, d, opt.calibration), thi = model.time(hi, d, opt.calibration);
    const double slope = (thi - tlo) / (hi - lo);
    WEFT_ASSERT(slope > 0, "compute time does not grow with the batch");
    const double eff = fps / slope;  // effective FLOP/s of this device on this model
    devs.emplace_back(eff, d.spec.memory_bytes, fmt::format("{}#{}", d.spec.kind, id));
    loads.emplace_back(fps, mem.static_bytes, mem.bytes_per_unit, std::max(0.0, tlo - slope * lo) * eff);
  }
  HeteroShares r = try_balance_load(devs, loads, global_batch);
  if (!r.feasible)
    fail("data parallel {} on {} devices, global batch {}: {}", model.name(), ids.size(), global_batch,
         r.message);
  return r;
}

// ---- pipeline -------------------------------------------------------------------------------

std::string PipelineEvaluation::to_string() const {
  return fmt::format("PipelineEvaluation(devices=[{}], layers=[{}], step={:.4g} s, {:.4g} samples/s{})",
                     fmt::join(device_order, ","), fmt::join(layers, ","), step_time, throughput,
                     fits ? "" : ", OUT OF MEMORY");
}

std::vector<int> even_layers(int num_layers, int stages) {
  WEFT_CHECK(stages >= 1 && num_layers >= 0, "even_layers needs stages >= 1 (got {})", stages);
  std::vector<int> l(static_cast<std::size_t>(stages), num_layers / stages);
  for (int i = 0; i < num_layers % stages; ++i) ++l[static_cast<std::size_t>(i)];
  return l;
}

PipelineEvaluation evaluate_pipeline(const ModelProfile& model, const cluster::Cluster& c,
                                     const std::vector<int>& order, const std::vector<int>& layers,
                                     const PipelineOptions& opt) {
  check_ids(c, order);
  WEFT_CHECK(opt.replicas >= 1 && order.size() % static_cast<std::size_t>(opt.replicas) == 0,
             "evaluate_pipeline: {} devices do not form {} replicas", order.size(), opt.replicas);
  const int R = opt.replicas;
  const int S = static_cast<int>(order.size()) / R;
  WEFT_CHECK(static_cast<int>(layers.size()) == S, "evaluate_pipeline: {} layer counts for {} stages",
             layers.size(), S);
  WEFT_CHECK(opt.micro_batch >= 1 && opt.num_micro >= 1, "micro_batch and num_micro must be >= 1");
  int sum = 0;
  for (int l : layers) {
    WEFT_CHECK(l >= 0, "layer counts must be >= 0 (got {})", l);
    sum += l;
  }
  WEFT_CHECK(sum == model.num_layers(), "layer counts sum to {}, the model has {} layers", sum,
             model.num_layers());
  const double m = static_cast<double>(opt.micro_batch);
  const auto& cal = opt.calibration;
  auto dev = [&](int s, int j) -> const cluster::Device& {
    return c.device(order[static_cast<std::size_t>(s * R + j)]);
  };
  sim::Pipeline pipe;
  PipelineEvaluation e;
  e.device_order = order;
  e.layers = layers;
  int a = 0;
  for (int s = 0; s < S; ++s) {
    std::vector<int> groups;
    if (s == 0) groups.push_back(-1);
    for (int l = a; l < a + layers[static_cast<std::size_t>(s)]; ++l) groups.push_back(l);
    if (s == S - 1) groups.push_back(model.num_layers());
    sim::StageSpec st;
    st.forward_time = st.backward_time = 0;
    double params = 0;
    for (int j = 0; j < R; ++j) {  // a stage of identical replicas runs at its slowest device
      double f = 0, b = 0, o = 0;
      for (int g : groups) {
        f += model.group_time(g, m, dev(s, j), cal, true);
        b += model.group_time(g, m, dev(s, j), cal, false);
        o += model.group_optimizer_time(g, dev(s, j), cal);
      }
      st.forward_time = std::max(st.forward_time, f);
      st.backward_time = std::max(st.backward_time, b);
      st.optimizer_time = std::max(st.optimizer_time, o);
    }
    for (int g : groups) {
      st.static_memory += model.group_static_bytes(g);
      st.activation_memory += model.group_stash_bytes(g, m);
      params += model.group_param_bytes(g);
    }
    if (R > 1 && params > 0) {  // the stage's gradient all-reduce over its replicas
      std::vector<int> ids(order.begin() + s * R, order.begin() + (s + 1) * R);
      const cluster::DeviceMesh mesh({R}, ids);
      st.optimizer_time += cluster::all_reduce_time(cost::calibrated_axis_links(c, mesh, cal).at(0), params);
    }
    a += layers[static_cast<std::size_t>(s)];
    if (s + 1 < S) st.activation_bytes = model.boundary_bytes(a - 1, m);
    e.stage_time.push_back(st.forward_time + st.backward_time);
    pipe.stages.push_back(st);
  }
  if (S > 1) {
    std::vector<int> first;  // replica 0's devices; every replica has its own links
    for (int s = 0; s < S; ++s) first.push_back(order[static_cast<std::size_t>(s * R)]);
    pipe.links = sim::links_from_cluster(c, first);
  }
  sim::SimOptions so;
  so.record_timeline = false;
  const sim::SimResult r = sim::simulate(schedule::one_f_one_b(S, opt.num_micro), pipe, so);
  WEFT_ASSERT(!r.deadlock, "1F1B deadlocked: " + r.deadlock_report);
  e.step_time = r.step_time;
  e.throughput = static_cast<double>(R) * static_cast<double>(opt.num_micro) * m / r.step_time;
  for (int s = 0; s < S; ++s) {
    e.memory.push_back(r.peak_memory[static_cast<std::size_t>(s)]);
    for (int j = 0; j < R; ++j) e.fits = e.fits && e.memory.back() <= dev(s, j).spec.memory_bytes;
  }
  return e;
}

PipelineEvaluation balance_pipeline(const ModelProfile& model, const cluster::Cluster& c,
                                    const std::vector<int>& ids, const PipelineOptions& opt) {
  check_ids(c, ids);
  WEFT_CHECK(model.num_layers() >= 1, "balance_pipeline: model {} has no layers to split", model.name());
  WEFT_CHECK(opt.micro_batch >= 1 && opt.num_micro >= 1, "micro_batch and num_micro must be >= 1");
  WEFT_CHECK(opt.replicas >= 1 && ids.size() % static_cast<std::size_t>(opt.replicas) == 0,
             "balance_pipeline: {} devices do not form {} replicas", ids.size(), opt.replicas);
  const int R = opt.replicas;
  const int S = static_cast<int>(ids.size()) / R;
  const double m = static_cast<double>(opt.micro_batch);
  const auto& cal = opt.calibration;
  const std::vector<DeviceCapacity> caps = capacities(c, ids, DType::F32, cal);
  std::vector<int> order;
  for (int i : memory_descending_order(caps)) order.push_back(ids[static_cast<std::size_t>(i)]);
  const int L = model.num_layers();
  double layer_flops = 0, layer_static = 0, layer_stash = 0;
  for (int l = 0; l < L; ++l) {
    layer_flops += model.group_flops(l, m);
    layer_static += model.group_static_bytes(l);
    layer_stash += model.group_stash_bytes(l, m);
  }
  layer_flops /= L, layer_static /= L, layer_stash /= L;  // the mean layer (the zoo's layers are identical)
  std::vector<DeviceCapacity> devs;
  std::vector<LoadModel> loads;
  for (int s = 0; s < S; ++s) {
    const double in_flight = std::min(opt.num_micro, S - s);  // 1F1B: stage s holds S − s micro-batches
    double layer_time = 0, fixed_time = 0, memory = 0, stat = 0;
    for (int j = 0; j < R; ++j) {  // the stage's replicas: slowest time, smallest memory
      const cluster::Device& d = c.device(order[static_cast<std::size_t>(s * R + j)]);
      double lt = 0, ft = 0;
      for (int l = 0; l < L; ++l)
        lt += model.group_time(l, m, d, cal, true) + model.group_time(l, m, d, cal, false);
      for (int g : {-1, L})
        if ((g == -1 && s == 0) || (g == L && s == S - 1))
          ft += model.group_time(g, m, d, cal, true) + model.group_time(g, m, d, cal, false);
      layer_time = std::max(layer_time, lt / L);
      fixed_time = std::max(fixed_time, ft);
      memory = j == 0 ? d.spec.memory_bytes : std::min(memory, d.spec.memory_bytes);
    }
    for (int g : {-1, L})
      if ((g == -1 && s == 0) || (g == L && s == S - 1))
        stat += model.group_static_bytes(g) + in_flight * model.group_stash_bytes(g, m);
    const double eff = layer_flops / layer_time;
    const cluster::Device& d0 = c.device(order[static_cast<std::size_t>(s * R)]);
    devs.emplace_back(eff, memory, fmt::format("stage{}:{}#{}", s, d0.spec.kind, d0.id));
    loads.emplace_back(layer_flops, stat, layer_static + in_flight * layer_stash, fixed_time * eff);
  }
  HeteroShares r = try_balance_load(devs, loads, L);
  if (!r.feasible) fail("pipeline {} on {} stages: {}", model.name(), S, r.message);
  std::vector<int> layers;
  for (std::int64_t u : r.units) layers.push_back(static_cast<int>(u));
  return evaluate_pipeline(model, c, order, layers, opt);
}

}  // namespace weft::pipeline
