// plan::Plan: JSON (exact round trip: doubles are written with max_digits10 by nlohmann), the
// readable summary, and the pipeline the simulator runs for a plan (so that the stored step time
// can be checked independently from the stored stage numbers).
#include "weft/plan/plan.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "weft/core/error.hpp"
#include "weft/core/json_reader.hpp"
#include "weft/core/units.hpp"

namespace weft::plan {

using nlohmann::json;

namespace {

json to_j(const ParamSpec& p) {
  return json{
      {"name", p.name}, {"shape", p.shape}, {"spec", p.spec}, {"bytes_per_device", p.bytes_per_device}};
}

json to_j(const ReplicaComm& r) {
  const sim::ReplicaCollectives& c = r.collectives;
  return json{{"gather_forward", c.gather_forward},
              {"gather_backward", c.gather_backward},
              {"reduce_backward", c.reduce_backward},
              {"step_sync", c.step_sync},
              {"step_gather", c.step_gather},
              {"gather_unit", c.gather_unit},
              {"reduce_unit", c.reduce_unit},
              {"sync_unit", c.sync_unit},
              {"prefetch", c.prefetch},
              {"in_forward", r.in_forward},
              {"in_backward", r.in_backward},
              {"in_optimizer", r.in_optimizer}};
}

json to_j(const Stage& s) {
  json params = json::array(), layouts = json::array(), leaves = json::array();
  for (const auto& p : s.params) params.push_back(to_j(p));
  for (const auto& l : s.op_layouts)
    layouts.push_back(json{{"op", l.op}, {"factors", l.factors}, {"inner_strides", l.inner_strides}});
  for (const auto& l : s.leaf_specs) leaves.push_back(json{{"tensor", l.tensor}, {"spec", l.spec}});
  return json{{"index", s.index},
              {"first_block", s.first_block},
              {"last_block", s.last_block},
              {"ops", s.ops},
              {"devices", s.devices},
              {"mesh_shape", s.mesh_shape},
              {"params", params},
              {"op_layouts", layouts},
              {"leaf_specs", leaves},
              {"forward_time", s.forward_time},
              {"backward_time", s.backward_time},
              {"weight_time", s.weight_time},
              {"optimizer_time", s.optimizer_time},
              {"compute_time", s.compute_time},
              {"comm_time", s.comm_time},
              {"static_memory", s.static_memory},
              {"activation_memory", s.activation_memory},
              {"transient_memory", s.transient_memory},
              {"in_flight", s.in_flight},
              {"peak_memory", s.peak_memory},
              {"recompute", s.recompute},
              {"recompute_blocks", s.recompute_blocks},
              {"selective_blocks", s.selective_blocks},
              {"zero", s.zero},
              {"zero_group", s.zero_group},
              {"zero_blocks", s.zero_blocks},
              {"replica", to_j(s.replica)}};
}

json to_j(const CrossTensor& c) {
  return json{{"name", c.name},
              {"from_stage", c.from_stage},
              {"to_stage", c.to_stage},
              {"shape", c.shape},
              {"dtype", c.dtype},
              {"bytes", c.bytes},
              {"src_spec", c.src_spec},
              {"dst_spec", c.dst_spec},
              {"reshard_time", c.reshard_time},
              {"lower_bound", c.lower_bound},
              {"reshard_summary", c.reshard_summary},
              {"per_step", c.per_step},
              {"refresh", c.refresh}};
}

json to_j(const Alternative& a) {
  return json{{"strategy", a.strategy},       {"layout", a.layout},     {"step_time", a.step_time},
              {"peak_memory", a.peak_memory}, {"feasible", a.feasible}, {"note", a.note}};
}

constexpr JsonReader kReader("Plan JSON");

// Typed field access with the JSON path in the error (integers integral and in range, numbers finite).
template <typename T>
T field(const json& j, const char* key, const std::string& path) {
  return kReader.field<T>(j, key, path);
}

const json& array_field(const json& j, const char* key, const std::string& path) {
  return kReader.array(kReader.at(j, key, path), JsonReader::join(path, key));
}

ParamSpec param_from(const json& j, const std::string& path) {
  ParamSpec p;
  p.name = field<std::string>(j, "name", path);
  p.shape = field<std::vector<std::int64_t>>(j, "shape", path);
  p.spec = field<std::string>(j, "spec", path);
  p.bytes_per_device = field<double>(j, "bytes_per_device", path);
  return p;
}

OpLayout op_layout_from(const json& j, const std::string& path) {
  OpLayout l;
  l.op = field<std::string>(j, "op", path);
  l.factors = field<std::vector<int>>(j, "factors", path);
  l.inner_strides = field<std::vector<std::int64_t>>(j, "inner_strides", path);
  WEFT_CHECK(l.factors.size() == l.inner_strides.size(),
             "Plan JSON: {} has {} factors but {} inner_strides (one of each per SPMD mesh axis)", path,
             l.factors.size(), l.inner_strides.size());
  return l;
}

TensorLayout tensor_layout_from(const json& j, const std::string& path) {
  TensorLayout l;
  l.tensor = field<std::string>(j, "tensor", path);
  l.spec = field<std::string>(j, "spec", path);
  return l;
}

Stage stage_from(const json& j, const std::string& path) {
  Stage s;
  s.index = field<int>(j, "index", path);
  s.first_block = field<int>(j, "first_block", path);
  s.last_block = field<int>(j, "last_block", path);
  s.ops = field<std::vector<std::string>>(j, "ops", path);
  s.devices = field<std::vector<int>>(j, "devices", path);
  s.mesh_shape = field<std::vector<std::int64_t>>(j, "mesh_shape", path);
  const auto& ps = array_field(j, "params", path);
  for (std::size_t i = 0; i < ps.size(); ++i)
    s.params.push_back(param_from(ps[i], fmt::format("{}.params[{}]", path, i)));
  if (j.contains("op_layouts")) {  // absent in plans written before lowering
    const auto& ls = array_field(j, "op_layouts", path);
    for (std::size_t i = 0; i < ls.size(); ++i)
      s.op_layouts.push_back(op_layout_from(ls[i], fmt::format("{}.op_layouts[{}]", path, i)));
  }
  if (j.contains("leaf_specs")) {
    const auto& ls = array_field(j, "leaf_specs", path);
    for (std::size_t i = 0; i < ls.size(); ++i)
      s.leaf_specs.push_back(tensor_layout_from(ls[i], fmt::format("{}.leaf_specs[{}]", path, i)));
  }
  s.forward_time = field<double>(j, "forward_time", path);
  s.backward_time = field<double>(j, "backward_time", path);
  s.weight_time = field<double>(j, "weight_time", path);
  s.optimizer_time = field<double>(j, "optimizer_time", path);
  s.compute_time = field<double>(j, "compute_time", path);
  s.comm_time = field<double>(j, "comm_time", path);
  s.static_memory = field<double>(j, "static_memory", path);
  s.activation_memory = field<double>(j, "activation_memory", path);
  s.transient_memory = field<double>(j, "transient_memory", path);
  s.in_flight = field<int>(j, "in_flight", path);
  s.peak_memory = field<double>(j, "peak_memory", path);
  if (j.contains("recompute")) {  // absent in plans written before recomputation
    s.recompute = field<std::string>(j, "recompute", path);
    WEFT_CHECK(s.recompute == "none" || s.recompute == "selective" || s.recompute == "full",
               "Plan JSON: {}.recompute must be none, selective or full, got '{}'", path, s.recompute);
  }
  if (j.contains("recompute_blocks")) {
    s.recompute_blocks = field<std::vector<int>>(j, "recompute_blocks", path);
    WEFT_CHECK(s.recompute_blocks.empty() || s.recompute == "full",
               "Plan JSON: {}.recompute_blocks lists blocks but recompute is '{}', not full", path,
               s.recompute);
  }
  if (j.contains("selective_blocks")) {  // absent in plans written before per-block selective
    s.selective_blocks = field<std::vector<int>>(j, "selective_blocks", path);
    WEFT_CHECK(s.selective_blocks.empty() || s.recompute == "selective" ||
                   (s.recompute == "full" && !s.recompute_blocks.empty()),
               "Plan JSON: {}.selective_blocks lists blocks but recompute is '{}'{}", path, s.recompute,
               s.recompute == "full" ? " on every block (recompute_blocks is empty)"
                                     : ", not selective or full on some blocks");
    for (int b : s.selective_blocks)
      WEFT_CHECK(
          std::find(s.recompute_blocks.begin(), s.recompute_blocks.end(), b) == s.recompute_blocks.end(),
          "Plan JSON: {} names block {} in both recompute_blocks and selective_blocks", path, b);
  }
  for (const auto* list : {&s.recompute_blocks, &s.selective_blocks})
    for (std::size_t i = 1; i < list->size(); ++i)
      WEFT_CHECK(std::find(list->begin(), list->begin() + static_cast<std::ptrdiff_t>(i), (*list)[i]) ==
                     list->begin() + static_cast<std::ptrdiff_t>(i),
                 "Plan JSON: {}.{} names block {} twice", path,
                 list == &s.selective_blocks ? "selective_blocks" : "recompute_blocks", (*list)[i]);
  if (j.contains("zero")) {  // absent in plans written before sharded data parallelism
    s.zero = field<int>(j, "zero", path);
    s.zero_group = field<int>(j, "zero_group", path);
    WEFT_CHECK(s.zero >= 0 && s.zero <= 3, "Plan JSON: {}.zero must be 0..3, got {}", path, s.zero);
    WEFT_CHECK(s.zero_group >= 1, "Plan JSON: {}.zero_group must be >= 1, got {}", path, s.zero_group);
  }
  if (j.contains("zero_blocks")) {
    s.zero_blocks = field<std::vector<int>>(j, "zero_blocks", path);
    WEFT_CHECK(s.zero_blocks.empty() || s.zero == 1 || s.zero == 2,
               "Plan JSON: {}.zero_blocks lists ZeRO-3 blocks but the stage's level is {}, not 1 or 2", path,
               s.zero);
  }
  WEFT_CHECK(s.forward_time >= 0 && s.backward_time >= 0 && s.weight_time >= 0 && s.optimizer_time >= 0 &&
                 s.weight_time <= s.backward_time,
             "Plan JSON: {} has negative times or weight_time > backward_time", path);
  if (j.contains("replica")) {  // absent in plans written before the simulator ran the collectives
    const std::string rp = path + ".replica";
    const json& r = j.at("replica");
    WEFT_CHECK(r.is_object(), "Plan JSON: {} must be an object", rp);
    sim::ReplicaCollectives& c = s.replica.collectives;
    c.gather_forward = field<double>(r, "gather_forward", rp);
    c.gather_backward = field<double>(r, "gather_backward", rp);
    c.reduce_backward = field<double>(r, "reduce_backward", rp);
    c.step_sync = field<double>(r, "step_sync", rp);
    c.step_gather = field<double>(r, "step_gather", rp);
    c.gather_unit = field<double>(r, "gather_unit", rp);
    c.reduce_unit = field<double>(r, "reduce_unit", rp);
    c.sync_unit = field<double>(r, "sync_unit", rp);
    c.prefetch = field<bool>(r, "prefetch", rp);
    s.replica.in_forward = field<double>(r, "in_forward", rp);
    s.replica.in_backward = field<double>(r, "in_backward", rp);
    s.replica.in_optimizer = field<double>(r, "in_optimizer", rp);
    for (double v : {c.gather_forward, c.gather_backward, c.reduce_backward, c.step_sync, c.step_gather,
                     s.replica.in_forward, s.replica.in_backward, s.replica.in_optimizer})
      WEFT_CHECK(std::isfinite(v) && v >= 0, "Plan JSON: {} has a negative or non-finite time", rp);
    for (double u : {c.gather_unit, c.reduce_unit, c.sync_unit})
      WEFT_CHECK(u > 0 && u <= 1, "Plan JSON: {}'s overlap units must be in (0, 1], got {}", rp, u);
    WEFT_CHECK(s.replica.in_forward <= s.forward_time * (1 + 1e-9) + 1e-15 &&
                   s.replica.in_backward <= (s.backward_time - s.weight_time) * (1 + 1e-9) + 1e-15 &&
                   s.replica.in_optimizer <= s.optimizer_time * (1 + 1e-9) + 1e-15,
               "Plan JSON: {} holds more collective time than the stage's times it is part of", rp);
  }
  std::int64_t prod = 1;
  for (auto x : s.mesh_shape) prod *= x;
  WEFT_CHECK(!s.devices.empty() && prod == static_cast<std::int64_t>(s.devices.size()),
             "Plan JSON: {}.mesh_shape holds {} devices but devices lists {}", path, prod, s.devices.size());
  return s;
}

CrossTensor cross_from(const json& j, const std::string& path) {
  CrossTensor c;
  c.name = field<std::string>(j, "name", path);
  c.from_stage = field<int>(j, "from_stage", path);
  c.to_stage = field<int>(j, "to_stage", path);
  c.shape = field<std::vector<std::int64_t>>(j, "shape", path);
  c.dtype = field<std::string>(j, "dtype", path);
  c.bytes = field<std::int64_t>(j, "bytes", path);
  c.src_spec = field<std::string>(j, "src_spec", path);
  c.dst_spec = field<std::string>(j, "dst_spec", path);
  c.reshard_time = field<double>(j, "reshard_time", path);
  c.lower_bound = field<double>(j, "lower_bound", path);
  c.reshard_summary = field<std::string>(j, "reshard_summary", path);
  if (j.contains("per_step")) c.per_step = field<bool>(j, "per_step", path);  // absent in older plans
  if (j.contains("refresh")) c.refresh = field<bool>(j, "refresh", path);
  return c;
}

json to_j(const AdaptivePolicy& a) {
  json frontier = json::array(), windows = json::array();
  for (const auto& c : a.frontier)
    frontier.push_back(json{{"k", c.k}, {"micro_batch_size", c.micro_batch_size}, {"num_micro", c.num_micro},
                            {"peak_memory", c.peak_memory}});
  for (const auto& w : a.windows)
    windows.push_back(json{{"start", w.start}, {"end", w.end}, {"candidate", w.candidate}, {"step", w.step}});
  return json{{"frontier", frontier},       {"windows", windows},       {"fixed_step", a.fixed_step},
              {"step", a.step},             {"best_fixed", a.best_fixed}, {"one_f_one_b", a.one_f_one_b},
              {"window_s", a.window_s},     {"duration_s", a.duration_s}, {"optimizer_time", a.optimizer_time}};
}

AdaptivePolicy adaptive_from(const json& j, const std::string& path) {
  AdaptivePolicy a;
  const auto& fr = array_field(j, "frontier", path);
  for (std::size_t i = 0; i < fr.size(); ++i) {
    const std::string p = fmt::format("{}.frontier[{}]", path, i);
    sim::Candidate c;
    c.k = field<int>(fr[i], "k", p);
    c.micro_batch_size = field<int>(fr[i], "micro_batch_size", p);
    c.num_micro = field<int>(fr[i], "num_micro", p);
    c.peak_memory = field<double>(fr[i], "peak_memory", p);
    if (c.k < 1 || c.micro_batch_size < 1 || c.num_micro < 1)
      kReader.bad(p, "k, micro_batch_size and num_micro must be >= 1");
    a.frontier.push_back(c);
  }
  const int C = static_cast<int>(a.frontier.size());
  const auto& ws = array_field(j, "windows", path);
  for (std::size_t i = 0; i < ws.size(); ++i) {
    const std::string p = fmt::format("{}.windows[{}]", path, i);
    AdaptiveWindow w;
    w.start = field<double>(ws[i], "start", p);
    w.end = field<double>(ws[i], "end", p);
    w.candidate = field<int>(ws[i], "candidate", p);
    w.step = field<double>(ws[i], "step", p);
    if (w.candidate < 0 || w.candidate >= C)
      kReader.bad(p + ".candidate", fmt::format("must index the frontier (size {}), got {}", C, w.candidate));
    a.windows.push_back(w);
  }
  a.fixed_step = field<std::vector<double>>(j, "fixed_step", path);
  if (static_cast<int>(a.fixed_step.size()) != C)
    kReader.bad(path + ".fixed_step", fmt::format("needs one entry per frontier point ({})", C));
  a.step = field<double>(j, "step", path);
  a.best_fixed = field<int>(j, "best_fixed", path);
  a.one_f_one_b = field<int>(j, "one_f_one_b", path);
  if (C > 0 && (a.best_fixed < 0 || a.best_fixed >= C))
    kReader.bad(path + ".best_fixed", fmt::format("must index the frontier (size {})", C));
  if (a.one_f_one_b < -1 || a.one_f_one_b >= C)
    kReader.bad(path + ".one_f_one_b", fmt::format("must be -1 or index the frontier (size {})", C));
  a.window_s = field<double>(j, "window_s", path);
  a.duration_s = field<double>(j, "duration_s", path);
  a.optimizer_time = field<double>(j, "optimizer_time", path);
  return a;
}

Alternative alt_from(const json& j, const std::string& path) {
  Alternative a;
  a.strategy = field<std::string>(j, "strategy", path);
  a.layout = field<std::string>(j, "layout", path);
  a.step_time = field<double>(j, "step_time", path);
  a.peak_memory = field<double>(j, "peak_memory", path);
  a.feasible = field<bool>(j, "feasible", path);
  a.note = field<std::string>(j, "note", path);
  return a;
}

// Figures with a unit that keeps their digits visible (core/units.hpp).
std::string gb(double b) { return format_bytes(b); }
std::string seconds(double s) { return format_seconds(s); }

}  // namespace

std::string Plan::to_json() const {
  json stages_j = json::array(), cross_j = json::array(), alts_j = json::array();
  for (const auto& s : stages) stages_j.push_back(to_j(s));
  for (const auto& c : cross_tensors) cross_j.push_back(to_j(c));
  for (const auto& a : alternatives) alts_j.push_back(to_j(a));
  json j{{"format", "weft.plan/1"},
         {"model", model},
         {"graph_fingerprint", graph_fingerprint},
         {"cluster", cluster},
         {"strategy", strategy},
         {"schedule", schedule},
         {"schedule_k", schedule_k},
         {"schedule_v", schedule_v},
         {"num_microbatches", num_microbatches},
         {"microbatch_size", microbatch_size},
         {"data_parallel", data_parallel},
         {"replica_microbatch", replica_microbatch},
         {"split_fraction", split_fraction},
         {"num_blocks", num_blocks},
         {"block_cuts", block_cuts},
         {"grad_bucket_bytes", grad_bucket_bytes},
         {"stages", stages_j},
         {"cross_tensors", cross_j},
         {"send_time", send_time},
         {"boundary_bytes", boundary_bytes},
         {"step_time", step_time},
         {"bubble_fraction", bubble_fraction},
         {"throughput", throughput},
         {"model_flops", model_flops},
         {"cluster_peak_flops", cluster_peak_flops},
         {"mfu", mfu},
         {"peak_memory", peak_memory},
         {"device_memory", device_memory},
         {"devices_used", devices_used},
         {"memory_limit", memory_limit},
         {"plan_seconds", plan_seconds},
         {"search_space", search_space},
         {"search_status", search_status},
         {"feasible", feasible},
         {"infeasible_reason", infeasible_reason},
         {"alternatives", alts_j}};
  if (adaptive) j["adaptive"] = to_j(*adaptive);
  return j.dump(1);
}

Plan Plan::from_json(std::string_view text) {
  const json j = kReader.parse(text);
  const std::string root = "plan";
  WEFT_CHECK(j.is_object(), "Plan JSON: the document must be an object");
  const auto fmt_tag = field<std::string>(j, "format", root);
  WEFT_CHECK(fmt_tag == "weft.plan/1", "Plan JSON: unknown format '{}' (expected weft.plan/1)", fmt_tag);
  Plan p;
  p.model = field<std::string>(j, "model", root);
  if (j.contains("graph_fingerprint")) p.graph_fingerprint = field<std::string>(j, "graph_fingerprint", root);
  p.cluster = field<std::string>(j, "cluster", root);
  p.strategy = field<std::string>(j, "strategy", root);
  p.schedule = field<std::string>(j, "schedule", root);
  p.schedule_k = field<int>(j, "schedule_k", root);
  p.schedule_v = field<int>(j, "schedule_v", root);
  p.num_microbatches = field<int>(j, "num_microbatches", root);
  p.microbatch_size = field<std::int64_t>(j, "microbatch_size", root);
  p.data_parallel = field<int>(j, "data_parallel", root);
  if (j.contains("replica_microbatch"))  // absent in plans written before uneven data parallelism
    p.replica_microbatch = field<std::vector<std::int64_t>>(j, "replica_microbatch", root);
  if (j.contains("split_fraction"))  // absent in plans written before the uneven tensor split
    p.split_fraction = field<std::vector<double>>(j, "split_fraction", root);
  p.num_blocks = field<int>(j, "num_blocks", root);
  if (j.contains("block_cuts"))  // absent in plans written before blocks followed the layers
    p.block_cuts = field<std::vector<int>>(j, "block_cuts", root);
  p.grad_bucket_bytes =
      kReader.field_or<double>(j, "grad_bucket_bytes", root, 25e6);  // absent before buckets
  WEFT_CHECK(p.grad_bucket_bytes >= 0, "Plan JSON: grad_bucket_bytes must be >= 0, got {}",
             p.grad_bucket_bytes);
  const auto& st = array_field(j, "stages", root);
  for (std::size_t i = 0; i < st.size(); ++i)
    p.stages.push_back(stage_from(st[i], fmt::format("plan.stages[{}]", i)));
  const auto& cr = array_field(j, "cross_tensors", root);
  for (std::size_t i = 0; i < cr.size(); ++i)
    p.cross_tensors.push_back(cross_from(cr[i], fmt::format("plan.cross_tensors[{}]", i)));
  p.send_time = field<std::vector<double>>(j, "send_time", root);
  p.boundary_bytes = field<std::vector<double>>(j, "boundary_bytes", root);
  p.step_time = field<double>(j, "step_time", root);
  p.bubble_fraction = field<double>(j, "bubble_fraction", root);
  p.throughput = field<double>(j, "throughput", root);
  p.model_flops = field<double>(j, "model_flops", root);
  p.cluster_peak_flops = field<double>(j, "cluster_peak_flops", root);
  p.mfu = field<double>(j, "mfu", root);
  p.peak_memory = field<double>(j, "peak_memory", root);
  p.device_memory = field<std::vector<double>>(j, "device_memory", root);
  p.devices_used = field<std::vector<int>>(j, "devices_used", root);
  p.memory_limit = field<double>(j, "memory_limit", root);
  p.plan_seconds = field<double>(j, "plan_seconds", root);
  if (j.contains("search_space"))  // absent in plans written before the planner reported it
    p.search_space = field<std::string>(j, "search_space", root);
  if (j.contains("search_status")) {
    p.search_status = field<std::string>(j, "search_status", root);
    if (p.search_status != "complete" && p.search_status != "timeout")
      kReader.bad(JsonReader::join(root, "search_status"),
                  fmt::format("must be \"complete\" or \"timeout\", got \"{}\"", p.search_status));
  }
  if (j.contains("feasible")) p.feasible = field<bool>(j, "feasible", root);  // absent before allow_infeasible
  if (j.contains("infeasible_reason")) p.infeasible_reason = field<std::string>(j, "infeasible_reason", root);
  if (j.contains("adaptive")) p.adaptive = adaptive_from(j.at("adaptive"), root + ".adaptive");
  const auto& al = array_field(j, "alternatives", root);
  for (std::size_t i = 0; i < al.size(); ++i)
    p.alternatives.push_back(alt_from(al[i], fmt::format("plan.alternatives[{}]", i)));
  // Consistency.
  WEFT_CHECK(!p.stages.empty(), "Plan JSON: plan.stages is empty");
  auto at_least = [&](const char* field, std::int64_t v, std::int64_t lo) {
    if (v < lo) kReader.bad(JsonReader::join(root, field), fmt::format("must be >= {}, got {}", lo, v));
  };
  at_least("num_microbatches", p.num_microbatches, 1);
  at_least("microbatch_size", p.microbatch_size, 1);
  at_least("data_parallel", p.data_parallel, 1);
  at_least("schedule_k", p.schedule_k, 1);
  at_least("schedule_v", p.schedule_v, 1);
  at_least("num_blocks", p.num_blocks, 1);
  WEFT_CHECK(p.block_cuts.empty() || static_cast<int>(p.block_cuts.size()) == p.num_blocks - 1,
             "Plan JSON: {}.block_cuts has {} cuts for {} blocks (num_blocks - 1, or none)", root,
             p.block_cuts.size(), p.num_blocks);
  for (std::size_t i = 0; i < p.block_cuts.size(); ++i)
    if (p.block_cuts[i] < 1 || (i > 0 && p.block_cuts[i] <= p.block_cuts[i - 1]))
      kReader.bad(JsonReader::index(root + ".block_cuts", i), "cuts must be ascending positions >= 1");
  // The per-block lists name layer-grouping blocks: 0 .. num_blocks - 1.
  for (std::size_t i = 0; i < p.stages.size(); ++i)
    for (const auto* list :
         {&p.stages[i].recompute_blocks, &p.stages[i].selective_blocks, &p.stages[i].zero_blocks})
      for (int b : *list)
        WEFT_CHECK(b >= 0 && b < p.num_blocks,
                   "Plan JSON: {}.stages[{}].{} names block {}, the plan has {} blocks", root, i,
                   list == &p.stages[i].zero_blocks        ? "zero_blocks"
                   : list == &p.stages[i].selective_blocks ? "selective_blocks"
                                                           : "recompute_blocks",
                   b, p.num_blocks);
  for (std::size_t i = 0; i < p.replica_microbatch.size(); ++i)
    if (p.replica_microbatch[i] < 0)
      kReader.bad(JsonReader::index(root + ".replica_microbatch", i), "a share must be >= 0");
  for (std::size_t i = 0; i < p.split_fraction.size(); ++i)
    if (!(p.split_fraction[i] > 0))
      kReader.bad(JsonReader::index(root + ".split_fraction", i), "must be > 0");
  for (const char* f : {"step_time", "peak_memory", "memory_limit", "plan_seconds", "throughput"}) {
    const double v = field<double>(j, f, root);
    if (v < 0) kReader.bad(JsonReader::join(root, f), fmt::format("must be >= 0, got {}", v));
  }
  const std::size_t nb = p.stages.size() - 1;
  WEFT_CHECK(p.send_time.size() == nb && p.boundary_bytes.size() == nb,
             "Plan JSON: plan.send_time and plan.boundary_bytes need {} entries (stages - 1)", nb);
  for (std::size_t i = 0; i < p.stages.size(); ++i)
    WEFT_CHECK(p.stages[i].index == static_cast<int>(i), "Plan JSON: plan.stages[{}].index is {}", i,
               p.stages[i].index);
  WEFT_CHECK(p.replica_microbatch.empty() || static_cast<int>(p.replica_microbatch.size()) == p.data_parallel,
             "Plan JSON: plan.replica_microbatch needs data_parallel ({}) entries, has {}", p.data_parallel,
             p.replica_microbatch.size());
  WEFT_CHECK(p.split_fraction.empty() ||
                 (p.stages.size() == 1 && p.split_fraction.size() == p.stages[0].devices.size()),
             "Plan JSON: plan.split_fraction needs one stage and a fraction per device of it");
  for (std::size_t i = 0; i < p.stages.size(); ++i) {
    // The layouts are on the SPMD mesh: mesh_shape without the replica axis.
    const auto& st = p.stages[i];
    const std::size_t spmd_ndim =
        st.mesh_shape.size() - (p.data_parallel > 1 && !st.mesh_shape.empty() ? 1 : 0);
    for (std::size_t k = 0; k < st.op_layouts.size(); ++k)
      WEFT_CHECK(st.op_layouts[k].factors.size() == spmd_ndim,
                 "Plan JSON: plan.stages[{}].op_layouts[{}] has {} factors for a {}-axis SPMD mesh", i, k,
                 st.op_layouts[k].factors.size(), spmd_ndim);
  }
  WEFT_CHECK(p.device_memory.size() == p.devices_used.size(),
             "Plan JSON: plan.device_memory and plan.devices_used differ in length");
  for (const auto& c : p.cross_tensors)
    WEFT_CHECK(
        c.from_stage >= 0 && c.to_stage >= 0 && c.from_stage < p.num_stages() && c.to_stage < p.num_stages(),
        "Plan JSON: cross tensor '{}' names a stage out of range", c.name);
  // The schedule must be constructible.
  (void)schedule_of(p);
  return p;
}

std::int64_t Plan::global_batch() const {
  std::int64_t per = 0;
  for (auto b : replica_microbatch) per += b;
  if (replica_microbatch.empty()) per = microbatch_size * data_parallel;
  return num_microbatches * per;
}

std::string Plan::to_string() const {
  return fmt::format(
      "Plan({} on {}: {}, {} stage(s), {} x{} micro-batches of {}, step {}, {:.4g} samples/s, "
      "MFU {:.1f}%, peak {}/device)",
      model, cluster, strategy, stages.size(), schedule, num_microbatches, microbatch_size,
      seconds(step_time), throughput, mfu * 100, gb(peak_memory));
}

std::string Plan::summary() const {
  std::string s;
  s += fmt::format("Plan for {} on {}\n", model, cluster);
  if (!feasible)
    s += fmt::format("  INFEASIBLE    does not fit ({}/device over the limit): {}\n",
                     gb(std::max(0.0, peak_memory - memory_limit)), infeasible_reason);
  s += fmt::format("  strategy      {} ({} stage{}, {} blocks)\n", strategy, stages.size(),
                   stages.size() == 1 ? "" : "s", num_blocks);
  s += fmt::format(
      "  schedule      {}{}, {} micro-batches of {} samples x {} data-parallel replica{} (global batch {})\n",
      schedule,
      schedule == "kfkb"               ? fmt::format(" k={}", schedule_k)
      : schedule == "kfkb_interleaved" ? fmt::format(" k={} v={}", schedule_k, schedule_v)
      : schedule == "interleaved" || schedule == "zb_interleaved" ? fmt::format(" v={}", schedule_v)
                                                                  : std::string(),
      num_microbatches, microbatch_size, data_parallel, data_parallel == 1 ? "" : "s", global_batch());
  {
    std::vector<std::string> modes;
    bool any = false;
    for (const auto& st : stages) {
      // Per-block modes: "[0] full on 1, selective on 2 of 4 blocks".
      std::vector<std::string> some;
      if (!st.recompute_blocks.empty()) some.push_back(fmt::format("full on {}", st.recompute_blocks.size()));
      if (!st.selective_blocks.empty())
        some.push_back(fmt::format("selective on {}", st.selective_blocks.size()));
      modes.push_back(some.empty() ? fmt::format("[{}] {}", st.index, st.recompute)
                                   : fmt::format("[{}] {} of {} blocks", st.index, fmt::join(some, ", "),
                                                 st.last_block - st.first_block + 1));
      any = any || st.recompute != "none";
    }
    s += fmt::format("  recompute     {}\n", any ? fmt::format("{}", fmt::join(modes, " ")) : std::string("none"));
  }
  if (data_parallel > 1) {
    std::vector<std::string> levels;
    bool any = false;
    for (const auto& st : stages) {
      const std::string at = stages.size() == 1 ? std::string() : fmt::format("[{}] ", st.index);
      levels.push_back(st.zero == 0 ? at + "ZeRO-0 (replicated)"
                       : st.zero_group == data_parallel
                           ? fmt::format("{}ZeRO-{} over {} replicas", at, st.zero, st.zero_group)
                           : fmt::format("{}ZeRO-{} hybrid: {} groups of {}", at, st.zero,
                                         data_parallel / st.zero_group, st.zero_group));
      if (!st.zero_blocks.empty())
        levels.back() += fmt::format(" (ZeRO-3 on {} blocks)", st.zero_blocks.size());
      any = any || st.zero != 0;
    }
    s += fmt::format("  zero          {}\n", any ? fmt::format("{}", fmt::join(levels, "; "))
                                                 : std::string("ZeRO-0 (replicated states)"));
  }
  // Runs of equal values: "8 x 60, 8 x 36".
  auto runs = [](const auto& v, auto show) {
    std::string out;
    for (std::size_t i = 0; i < v.size();) {
      std::size_t k = i;
      while (k < v.size() && v[k] == v[i]) ++k;
      out += fmt::format("{}{} x {}", out.empty() ? "" : ", ", k - i, show(v[i]));
      i = k;
    }
    return out;
  };
  if (!replica_microbatch.empty())
    s += fmt::format("  shares        uneven samples per micro-batch per replica: {}\n",
                     runs(replica_microbatch, [](std::int64_t x) { return std::to_string(x); }));
  if (!split_fraction.empty())
    s += fmt::format("  split         uneven: fraction of every split dimension per device: {}\n",
                     runs(split_fraction, [](double x) { return fmt::format("{:.4f}", x); }));
  s += fmt::format("  step time     {}  (bubble {:.1f}%)\n", seconds(step_time), bubble_fraction * 100);
  s += fmt::format("  throughput    {:.2f} samples/s\n", throughput);
  s += fmt::format("  MFU           {:.1f}%  ({} per step over {} peak)\n", mfu * 100,
                   format_flops(model_flops), format_flops(cluster_peak_flops, true));
  if (replica_microbatch.empty() && split_fraction.empty())
    s += fmt::format("  peak memory   {} per device (usable {})\n", gb(peak_memory), gb(memory_limit));
  else  // mixed GPU kinds: each device is checked against its own kind's memory
    s += fmt::format(
        "  peak memory   {} on the fullest device (each within its own kind's memory; smallest usable {})\n",
        gb(peak_memory), gb(memory_limit));
  s += "  stages:\n";
  for (const auto& st : stages) {
    std::string devs;
    if (st.devices.size() <= 8) {
      for (std::size_t i = 0; i < st.devices.size(); ++i)
        devs += (i ? "," : "") + std::to_string(st.devices[i]);
    } else {
      devs = fmt::format("{}..{} ({})", st.devices.front(), st.devices.back(), st.devices.size());
    }
    s += fmt::format("    [{}] blocks {}-{}, {} ops on devices {} as mesh ({})\n", st.index, st.first_block,
                     st.last_block, st.ops.size(), devs, fmt::join(st.mesh_shape, "x"));
    s += fmt::format("        F {} B {} (W {}) update {}; compute {} comm {} per micro-batch\n",
                     seconds(st.forward_time), seconds(st.backward_time), seconds(st.weight_time),
                     seconds(st.optimizer_time), seconds(st.compute_time), seconds(st.comm_time));
    s += fmt::format("        memory: static {} + {} in flight x {} + transient {} = {}\n",
                     gb(st.static_memory), st.in_flight, gb(st.activation_memory), gb(st.transient_memory),
                     gb(st.peak_memory));
    if (st.zero > 0)
      s += fmt::format("        ZeRO-{} across {} replicas{}: {} sharded\n", st.zero, st.zero_group,
                       st.zero_group < data_parallel ? " (hybrid: replicated across the groups)" : "",
                       st.zero == 1   ? "optimizer states"
                       : st.zero == 2 ? "optimizer states and gradients"
                                      : "optimizer states, gradients and parameters (gathered per block)");
    if (!st.zero_blocks.empty())
      s +=
          fmt::format("        ZeRO-3 on blocks {}: their parameters sharded too, gathered before each use\n",
                      fmt::join(st.zero_blocks, ","));
    if (!st.recompute_blocks.empty())
      s += fmt::format(
          "        recompute full on blocks {}: their forward runs again in the backward (B includes "
          "it); {}\n",
          fmt::join(st.recompute_blocks, ","),
          st.selective_blocks.empty() ? "the other blocks keep their activations" : "only their inputs kept");
    if (!st.selective_blocks.empty())
      s += fmt::format(
          "        recompute selective on blocks {}: their attention cores (scores, softmax, dropout) run "
          "again in the backward (B includes them); {} keep their activations\n",
          fmt::join(st.selective_blocks, ","),
          st.recompute_blocks.empty() ? "the other blocks" : "the blocks in neither list");
    if (st.recompute_blocks.empty() && st.selective_blocks.empty() && st.recompute != "none")
      s += fmt::format(
          "        recompute {}: {} (B includes the recomputed forward; only {} kept)\n", st.recompute,
          st.recompute == "full" ? "the stage's forward runs again in the backward, block by block"
                                 : "attention cores (scores, softmax, dropout) run again in the backward",
          st.recompute == "full" ? "the blocks' inputs are" : "the rest is");
    // The largest parameters' specs.
    std::vector<const ParamSpec*> ps;
    for (const auto& p : st.params) ps.push_back(&p);
    std::stable_sort(ps.begin(), ps.end(), [](const ParamSpec* a, const ParamSpec* b) {
      return a->bytes_per_device > b->bytes_per_device;
    });
    for (std::size_t i = 0; i < std::min<std::size_t>(4, ps.size()); ++i)
      s += fmt::format("        {:<28} [{}] {}\n", ps[i]->name, fmt::join(ps[i]->shape, ","), ps[i]->spec);
    if (ps.size() > 4) s += fmt::format("        ... {} parameters in all\n", ps.size());
  }
  if (!cross_tensors.empty()) {
    s += "  cross-stage tensors:\n";
    for (const auto& c : cross_tensors)
      s += fmt::format("    {} {}->{} [{}] {}: {} -> {}, {} (bound {}){}\n", c.name, c.from_stage, c.to_stage,
                       fmt::join(c.shape, ","), c.dtype, c.src_spec, c.dst_spec, seconds(c.reshard_time),
                       seconds(c.lower_bound),
                       c.refresh    ? ", new value once per step"
                       : c.per_step ? ", once per step"
                                    : "");
  }
  if (!alternatives.empty()) {
    s += "  alternatives considered (best first):\n";
    for (const auto& a : alternatives) {
      if (a.feasible)
        s += fmt::format("    {:<30} {:>12}  {:>9}  {}\n", a.strategy, seconds(a.step_time),
                         gb(a.peak_memory), a.layout);
      else
        s += fmt::format("    {:<30} {:>12}  {}  {}\n", a.strategy, "infeasible", a.layout, a.note);
    }
  }
  if (adaptive) {
    std::string a = adaptive->summary();
    for (std::size_t at = a.find('\n'); at != std::string::npos; at = a.find('\n', at + 1)) a.insert(at + 1, "  ");
    s += "  " + a + "\n";
  }
  if (!search_space.empty()) s += fmt::format("  search space: {}\n", search_space);
  s += fmt::format("  planned in {:.2f} s{}\n", plan_seconds,
                   search_status == "timeout" ? " (time limit reached: the best plan found by then)" : "");
  return s;
}

schedule::Schedule schedule_of(const Plan& p) {
  const int S = p.num_stages();
  const int M = p.num_microbatches;
  WEFT_CHECK(S >= 1 && M >= 1, "plan: needs at least one stage and one micro-batch");
  const auto& k = p.schedule;
  if (k == "1f1b") return schedule::one_f_one_b(S, M);
  if (k == "gpipe") return schedule::gpipe(S, M);
  if (k == "kfkb") return schedule::kfkb(S, M, p.schedule_k);
  if (k == "eager_1f1b") return schedule::eager_1f1b(S, M);
  if (k == "zb_h1") return schedule::zb_h1(S, M);
  if (k == "interleaved") {
    WEFT_CHECK(M >= S || p.schedule_v == 1,
               "plan: the interleaved schedule needs at least as many micro-batches ({}) as stages ({})", M,
               S);
    return schedule::interleaved_1f1b(S, p.schedule_v, M);
  }
  if (k == "zb_interleaved") return schedule::zb_interleaved(S, p.schedule_v, M);
  if (k == "kfkb_interleaved") return schedule::kfkb_interleaved(S, p.schedule_v, M, p.schedule_k);
  if (k == "zbv") return schedule::zbv(S, M);  // two chunks per plan stage in the V shape
  if (k == "dualpipev") return schedule::dualpipev(S, M);
  fail("plan: unknown schedule '{}'", k);
}

namespace {
// Logical stages per plan stage (device group) under the plan's schedule.
int chunks_per_stage(const Plan& p) {
  if (schedule::v_shaped(p.schedule)) return 2;
  if (p.schedule == "interleaved" || p.schedule == "zb_interleaved" || p.schedule == "kfkb_interleaved")
    return p.schedule_v;
  return 1;
}
}  // namespace

sim::Pipeline pipeline_of(const Plan& p) {
  const int S = p.num_stages();
  const bool split = schedule::splits_backward(p.schedule);
  const bool vee = schedule::v_shaped(p.schedule);
  const int v = chunks_per_stage(p);
  sim::Pipeline pipe;
  // Interleaved: logical stage c·S + d is chunk c of plan stage d, 1/v of its work (an
  // approximation: the plan's stages are contiguous block ranges). ZB-V, DualPipeV: logical stage j is a
  // chunk of plan stage j (j < S) or 2S−1−j (the V), half its work.
  for (int c = 0; c < v; ++c)
    for (int i = 0; i < S; ++i) {
      const int d = vee && c == 1 ? S - 1 - i : i;  // the plan stage (device) of logical stage c·S + i
      const auto& st = p.stages[d];
      sim::StageSpec ss;
      // The replica collectives run on the devices' streams: the times less what they hold of them
      // (nothing in plans without collectives).
      const ReplicaComm& rc = st.replica;
      ss.forward_time = std::max(0.0, st.forward_time - rc.in_forward) / v;
      ss.backward_time =
          std::max(0.0, (split ? st.backward_time - st.weight_time : st.backward_time) - rc.in_backward) / v;
      ss.weight_time = split ? st.weight_time / v : 0.0;
      if (vee)  // down the V over boundary d, the tip (stage S−1 → S) stays on its device
        ss.activation_bytes = c == 0 ? (d + 1 < S ? std::max(1.0, p.boundary_bytes[d]) : 1.0)
                                     : (d > 0 ? std::max(1.0, p.boundary_bytes[d - 1]) : 1.0);
      else if (d + 1 < S)
        ss.activation_bytes = std::max(1.0, p.boundary_bytes[d]);
      else if (c + 1 < v && S > 1)  // the wrap-around hop to the next chunk
        ss.activation_bytes =
            std::max(1.0, *std::max_element(p.boundary_bytes.begin(), p.boundary_bytes.end()));
      else
        ss.activation_bytes = 1.0;
      ss.activation_memory = st.activation_memory / v;
      ss.static_memory = (st.static_memory + st.transient_memory) / v;
      ss.optimizer_time = std::max(0.0, st.optimizer_time - rc.in_optimizer) / v;
      ss.replica = rc.collectives;
      for (double* x : {&ss.replica.gather_forward, &ss.replica.gather_backward, &ss.replica.reduce_backward,
                        &ss.replica.step_sync, &ss.replica.step_gather})
        *x /= v;
      pipe.stages.push_back(ss);
    }
  // Links: link d joins device d and d + 1; its transfer takes exactly send_time[d].
  auto link = [&](double bytes, double t) {
    sim::LinkSpec l;
    l.bandwidth = t > 0 ? std::max(1.0, bytes) / t : 1e300;
    l.latency = 0;
    return l;
  };
  if (S > 1) {
    for (int d = 0; d + 1 < S; ++d) pipe.links.push_back(link(p.boundary_bytes[d], p.send_time[d]));
    if (v > 1 && !vee) {  // the V only uses the links between neighbours
      const double t = *std::max_element(p.send_time.begin(), p.send_time.end());
      const double b = *std::max_element(p.boundary_bytes.begin(), p.boundary_bytes.end());
      pipe.links.push_back(link(b, t));
    }
  }
  return pipe;
}

sim::SimResult resimulate(const Plan& p) {
  sim::SimOptions so;
  so.record_timeline = false;
  auto r = sim::simulate(schedule_of(p), pipeline_of(p), so);
  WEFT_CHECK(!r.deadlock, "plan: the schedule deadlocks in simulation: {}", r.deadlock_report);
  return r;
}

}  // namespace weft::plan
