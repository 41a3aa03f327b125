// Bindings of weft/plan: the planner (make_plan, Megatron-style baseline), the Plan value type with
// JSON and summary, and plan.rebatch. The Pythonic layer is python/weft/planning.py (weft.plan).
#include <fmt/format.h>
#include <pybind11/functional.h>
#include <pybind11/operators.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <optional>
#include <string>

#include "interruptible.hpp"
#include "weft/cluster/cluster.hpp"
#include "weft/core/error.hpp"
#include "weft/ir/graph.hpp"
#include "weft/plan/megatron_specs.hpp"
#include "weft/plan/plan.hpp"
#include "weft/plan/planner.hpp"
#include "weft/plan/rebatch.hpp"

namespace py = pybind11;
using namespace weft::plan;

namespace {

bool is_training_graph(const weft::ir::Graph& g) {
  for (const auto& op : g.ops())
    if (op.kind == weft::ir::OpKind::AdamUpdate || op.kind == weft::ir::OpKind::SgdUpdate) return true;
  return false;
}

}  // namespace

void bind_plan(py::module_& m) {
  py::class_<ParamSpec>(m, "PlanParamSpec", "Sharding spec of one parameter in a plan's stage.")
      .def_readonly("name", &ParamSpec::name)
      .def_readonly("shape", &ParamSpec::shape)
      .def_readonly("spec", &ParamSpec::spec)
      .def_readonly("bytes_per_device", &ParamSpec::bytes_per_device)
      .def("__repr__", [](const ParamSpec& p) {
        return fmt::format("PlanParamSpec({} [{}] {})", p.name, fmt::join(p.shape, ","), p.spec);
      });
  py::class_<OpLayout>(m, "PlanOpLayout",
                       "How a stage's SPMD search laid out one op of the per-micro-batch training graph: "
                       "per axis of the stage's SPMD mesh, the op's index-map factor it splits (-1: "
                       "replicated) and its inner stride (0: the default).")
      .def_readonly("op", &OpLayout::op)
      .def_readonly("factors", &OpLayout::factors)
      .def_readonly("inner_strides", &OpLayout::inner_strides)
      .def(py::self == py::self)
      .def("__repr__", [](const OpLayout& l) {
        return fmt::format("PlanOpLayout({} factors [{}] inner_strides [{}])", l.op,
                           fmt::join(l.factors, ","), fmt::join(l.inner_strides, ","));
      });
  py::class_<Stage>(m, "PlanStage",
                    "One pipeline stage of a Plan (times per micro-batch, memory per device).")
      .def_readonly("index", &Stage::index)
      .def_readonly("first_block", &Stage::first_block)
      .def_readonly("last_block", &Stage::last_block)
      .def_readonly("ops", &Stage::ops)
      .def_readonly("devices", &Stage::devices)
      .def_readonly("mesh_shape", &Stage::mesh_shape)
      .def_readonly("params", &Stage::params)
      .def_readonly("op_layouts", &Stage::op_layouts,
                    "Every op of the stage (ascending op id) with its SPMD layout; empty in plans made "
                    "before lowering existed.")
      .def_property_readonly(
          "leaf_specs",
          [](const Stage& s) {
            py::dict d;
            for (const auto& l : s.leaf_specs) d[py::str(l.tensor)] = l.spec;
            return d;
          },
          "Leaf tensor name -> the spec the SPMD search chose for it, on the stage's SPMD mesh.")
      .def_readonly("forward_time", &Stage::forward_time)
      .def_readonly("backward_time", &Stage::backward_time)
      .def_readonly("weight_time", &Stage::weight_time)
      .def_readonly("optimizer_time", &Stage::optimizer_time)
      .def_readonly("compute_time", &Stage::compute_time)
      .def_readonly("comm_time", &Stage::comm_time)
      .def_readonly("static_memory", &Stage::static_memory)
      .def_readonly("activation_memory", &Stage::activation_memory)
      .def_readonly("transient_memory", &Stage::transient_memory)
      .def_readonly("in_flight", &Stage::in_flight)
      .def_readonly("peak_memory", &Stage::peak_memory)
      .def_readonly(
          "recompute", &Stage::recompute,
          "Activation recomputation of the stage: 'none', 'selective' or 'full', the strongest mode of any "
          "of its blocks (backward_time includes the recomputed forward, activation_memory is what stays "
          "saved); recompute_blocks / selective_blocks say which blocks when not every one.")
      .def_readonly(
          "recompute_blocks", &Stage::recompute_blocks,
          "With recompute 'full': the layer-grouping blocks recomputed whole (the grouping's order); empty = "
          "every block of the stage.")
      .def_readonly(
          "selective_blocks", &Stage::selective_blocks,
          "The layer-grouping blocks whose attention cores are recomputed (the grouping's order): with "
          "recompute 'selective' these only (empty = every block), with 'full' beside recompute_blocks; "
          "blocks in neither list keep their activations.")
      .def_readonly(
          "zero", &Stage::zero,
          "ZeRO level 0..3 of the stage across the plan's data-parallel replicas: 1 optimizer states "
          "sharded, 2 + gradients, 3 + parameters (FSDP); static_memory and the times include it.")
      .def_readonly(
          "zero_group", &Stage::zero_group,
          "Replicas of one ZeRO shard group: data_parallel = fully sharded, fewer = hybrid sharding "
          "(the groups replicate each other; FSDP's HYBRID_SHARD); 1 at level 0.")
      .def_readonly("zero_blocks", &Stage::zero_blocks,
                    "Per-block levels: the layer-grouping blocks at ZeRO-3 (parameters sharded too), the "
                    "stage's others at `zero` (1 or 2); empty = `zero` for every block.")
      .def_property_readonly(
          "replica_collectives", [](const Stage& s) { return s.replica.collectives; },
          "The stage's collectives across its replicas (weft.ReplicaCollectives, seconds at nominal "
          "bandwidth): "
          "the simulator runs them on each device's communication stream.")
      .def_property_readonly(
          "replica_exposed",
          [](const Stage& s) {
            py::dict d;
            d["forward"] = s.replica.in_forward;
            d["backward"] = s.replica.in_backward;
            d["optimizer"] = s.replica.in_optimizer;
            return d;
          },
          "What forward_time / backward_time / optimizer_time hold of those collectives by the planner's "
          "closed-form overlap rule (the simulator takes it out and runs the collectives instead).")
      .def("__repr__", [](const Stage& s) {
        return fmt::format(
            "PlanStage({}: blocks {}-{} on {} devices, mesh ({}), F {:.4g} s B {:.4g} s, peak {:.3g} GB)",
            s.index, s.first_block, s.last_block, s.devices.size(), fmt::join(s.mesh_shape, "x"),
            s.forward_time, s.backward_time, s.peak_memory / 1e9);
      });
  py::class_<CrossTensor>(m, "PlanCrossTensor", "A tensor crossing stages, with its resharding plan's time.")
      .def_readonly("name", &CrossTensor::name)
      .def_readonly("from_stage", &CrossTensor::from_stage)
      .def_readonly("to_stage", &CrossTensor::to_stage)
      .def_readonly("shape", &CrossTensor::shape)
      .def_readonly("dtype", &CrossTensor::dtype)
      .def_readonly("bytes", &CrossTensor::bytes)
      .def_readonly("src_spec", &CrossTensor::src_spec)
      .def_readonly("dst_spec", &CrossTensor::dst_spec)
      .def_readonly("reshard_time", &CrossTensor::reshard_time)
      .def_readonly("lower_bound", &CrossTensor::lower_bound)
      .def_readonly("reshard_summary", &CrossTensor::reshard_summary)
      .def("__repr__", [](const CrossTensor& c) {
        return fmt::format("PlanCrossTensor({} {}->{} {} -> {}, {:.4g} s)", c.name, c.from_stage, c.to_stage,
                           c.src_spec, c.dst_spec, c.reshard_time);
      });
  py::class_<Alternative>(m, "PlanAlternative", "A candidate the planner compared.")
      .def_readonly("strategy", &Alternative::strategy)
      .def_readonly("layout", &Alternative::layout)
      .def_readonly("step_time", &Alternative::step_time)
      .def_readonly("peak_memory", &Alternative::peak_memory)
      .def_readonly("feasible", &Alternative::feasible)
      .def_readonly("note", &Alternative::note)
      .def("__repr__", [](const Alternative& a) {
        return a.feasible ? fmt::format("PlanAlternative({} {}: {:.4g} s)", a.strategy, a.layout, a.step_time)
                          : fmt::format("PlanAlternative({}: infeasible, {})", a.strategy, a.note);
      });
  py::class_<AdaptiveWindow>(m, "AdaptiveWindow", "One window of the trace: the frontier point to run there.")
      .def_readonly("start", &AdaptiveWindow::start, "Trace time, s.")
      .def_readonly("end", &AdaptiveWindow::end, "Trace time, s.")
      .def_readonly("candidate", &AdaptiveWindow::candidate, "Index into the policy's frontier.")
      .def_readonly("step", &AdaptiveWindow::step, "That point's mean step in this window, s.")
      .def("__repr__", [](const AdaptiveWindow& w) {
        return fmt::format("AdaptiveWindow([{:g}, {:g}) s: point {}, {:.4g} s/step)", w.start, w.end, w.candidate,
                           w.step);
      });
  py::class_<AdaptivePolicy>(m, "AdaptivePolicy",
                             "Ada-Grouper's policy for a plan under a bandwidth trace: the (k, micro-batch) "
                             "frontier under the memory limit, the point per trace window, and the expected "
                             "step time against every fixed point and 1F1B (weft.adaptive_policy).")
      .def_readonly("frontier", &AdaptivePolicy::frontier, "weft.Candidate per k (largest micro-batch that fits).")
      .def_readonly("windows", &AdaptivePolicy::windows, "weft.AdaptiveWindow per window of the trace, in order.")
      .def_readonly("fixed_step", &AdaptivePolicy::fixed_step,
                    "Per frontier point: its mean step over the trace when run throughout, s.")
      .def_readonly("step", &AdaptivePolicy::step, "The policy's expected step over the trace, s.")
      .def_readonly("best_fixed", &AdaptivePolicy::best_fixed, "Index of the fastest fixed point.")
      .def_readonly("one_f_one_b", &AdaptivePolicy::one_f_one_b, "Index of the k = 1 point (-1: none fits).")
      .def_readonly("window_s", &AdaptivePolicy::window_s, "Seconds of trace per window.")
      .def_readonly("duration_s", &AdaptivePolicy::duration_s, "Seconds of trace covered.")
      .def_readonly("optimizer_time", &AdaptivePolicy::optimizer_time,
                    "Largest optimizer step of a stage, added to every step time, s.")
      .def_property_readonly("k_per_window",
                             [](const AdaptivePolicy& a) {
                               std::vector<int> ks;
                               for (const auto& w : a.windows)
                                 ks.push_back(a.frontier[static_cast<std::size_t>(w.candidate)].k);
                               return ks;
                             },
                             "The k to run in each window.")
      .def("speedup_vs_1f1b", &AdaptivePolicy::speedup_vs_1f1b)
      .def("speedup_vs_best_fixed", &AdaptivePolicy::speedup_vs_best_fixed)
      .def("summary", &AdaptivePolicy::summary)
      .def("__repr__", &AdaptivePolicy::summary);
  py::class_<Plan>(
      m, "Plan",
      "The planner's answer: stages (blocks, devices, meshes, parameter specs, times, memory), "
      "schedule and micro-batching, cross-stage tensors with resharding plans, predicted step time, "
      "throughput, MFU, peak memory, and the alternatives compared.")
      .def_readonly("model", &Plan::model)
      .def_readonly("graph_fingerprint", &Plan::graph_fingerprint,
                    "Fingerprint (weft.Graph.fingerprint) of the training graph the plan was made for; "
                    "lower refuses another graph.")
      .def_readonly("cluster", &Plan::cluster)
      .def_readonly("strategy", &Plan::strategy)
      .def_readonly("schedule", &Plan::schedule)
      .def_readonly("schedule_k", &Plan::schedule_k)
      .def_readonly("schedule_v", &Plan::schedule_v)
      .def_readonly("num_microbatches", &Plan::num_microbatches)
      .def_readonly("microbatch_size", &Plan::microbatch_size)
      .def_readonly("data_parallel", &Plan::data_parallel)
      .def_readonly("replica_microbatch", &Plan::replica_microbatch,
                    "Uneven data parallelism: samples per micro-batch of each replica (empty: even).")
      .def_readonly("split_fraction", &Plan::split_fraction,
                    "Uneven tensor split (Whale's split over mixed GPUs): the fraction of every split "
                    "dimension each device of the stage holds (empty: even).")
      .def_property_readonly("global_batch", &Plan::global_batch)
      .def_readonly("num_blocks", &Plan::num_blocks)
      .def_readonly("block_cuts", &Plan::block_cuts)
      .def_readwrite("grad_bucket_bytes", &Plan::grad_bucket_bytes,
                     "Bytes per gradient bucket of the replicas' all-reduces, each issued in the last "
                     "micro-batch's backward (0: no buckets); lower() lays them out so.")
      .def_readonly("stages", &Plan::stages)
      .def_property_readonly(
          "recompute",
          [](const Plan& p) {
            std::vector<std::string> r;
            for (const auto& st : p.stages) r.push_back(st.recompute);
            return r;
          },
          "Activation recomputation per stage: 'none', 'selective' or 'full', the strongest mode of its "
          "blocks (PlanStage.recompute_blocks / selective_blocks say which when not every one).")
      .def_property_readonly(
          "zero",
          [](const Plan& p) {
            std::vector<int> r;
            for (const auto& st : p.stages) r.push_back(st.zero);
            return r;
          },
          "ZeRO level per stage across the data-parallel replicas (0 = replicated states).")
      .def_readonly("cross_tensors", &Plan::cross_tensors)
      .def_readonly("send_time", &Plan::send_time)
      .def_readonly("boundary_bytes", &Plan::boundary_bytes)
      .def_readonly("step_time", &Plan::step_time)
      .def_readonly("bubble_fraction", &Plan::bubble_fraction)
      .def_readonly("throughput", &Plan::throughput)
      .def_readonly("model_flops", &Plan::model_flops)
      .def_readonly("cluster_peak_flops", &Plan::cluster_peak_flops)
      .def_readonly("mfu", &Plan::mfu)
      .def_readonly("peak_memory", &Plan::peak_memory)
      .def_readonly("device_memory", &Plan::device_memory)
      .def_readonly("devices_used", &Plan::devices_used)
      .def_property_readonly(
          "memory_by_device",
          [](const Plan& p) {
            std::map<int, double> m;
            for (std::size_t i = 0; i < p.devices_used.size() && i < p.device_memory.size(); ++i)
              m[p.devices_used[i]] = p.device_memory[i];
            return m;
          },
          "Peak memory (bytes) by device id (device_memory is in devices_used order).")
      .def_readonly("memory_limit", &Plan::memory_limit)
      .def_readonly("plan_seconds", &Plan::plan_seconds)
      .def_readonly("search_space", &Plan::search_space,
                    "The search space the planner explored, rule by rule (defaults and limits).")
      .def_readonly("search_status", &Plan::search_status,
                    "'complete', or 'timeout': the time limit cut the search short; the best plan by then.")
      .def_readonly("feasible", &Plan::feasible,
                    "False only for a layout evaluated with allow_infeasible=True that does not fit.")
      .def_readonly("infeasible_reason", &Plan::infeasible_reason,
                    "Why an allow_infeasible layout does not fit (empty when it fits).")
      .def_readonly("alternatives", &Plan::alternatives)
      .def_readonly(
          "adaptive", &Plan::adaptive,
          "With bandwidth_trace= or schedule='adaptive': Ada-Grouper's policy (weft.AdaptivePolicy); "
          "else None.")
      .def_property_readonly("num_stages", &Plan::num_stages)
      .def("summary", &Plan::summary, "Readable multi-line summary.")
      .def("to_json", &Plan::to_json)
      .def_static("from_json", &Plan::from_json, py::arg("text"))
      .def(
          "resimulate_step_time", [](const Plan& p) { return resimulate(p).step_time; },
          "Step time re-simulated from the stored stage numbers (equals step_time).")
      .def(
          "_pipeline",
          [](const Plan& p) {
            auto pl = pipeline_of(p);
            return py::make_tuple(schedule_of(p), pl.stages, pl.links);
          },
          "(schedule, stage specs, links) the simulator runs for this plan (weft.Plan.simulate).")
      .def(py::self == py::self)
      .def("__repr__", &Plan::to_string)
      .def("__str__", &Plan::summary);

  py::class_<MegatronLayout>(m, "MegatronLayout",
                             "Tensor parallel t (inside a node) x pipeline p x data parallel d.")
      .def(py::init([](int t, int p, int d) { return MegatronLayout{t, p, d}; }), py::arg("t"), py::arg("p"),
           py::arg("d"))
      .def_readonly("t", &MegatronLayout::t)
      .def_readonly("p", &MegatronLayout::p)
      .def_readonly("d", &MegatronLayout::d)
      .def("__repr__", [](const MegatronLayout& l) { return "MegatronLayout(" + l.to_string() + ")"; });

  auto options = [](const py::dict& kw) {
    PlanOptions o;
    for (auto [k, v] : kw) {
      const auto key = py::cast<std::string>(k);
      if (key == "schedule")
        o.schedule = py::cast<std::string>(v);
      else if (key == "schedule_k")
        o.schedule_k = py::cast<int>(v);
      else if (key == "schedule_v")
        o.schedule_v = py::cast<int>(v);
      else if (key == "num_microbatches")
        o.num_microbatches = py::cast<int>(v);
      else if (key == "max_microbatches")
        o.max_microbatches = py::cast<int>(v);
      else if (key == "max_data_parallel")
        o.max_data_parallel = py::cast<int>(v);
      else if (key == "max_simulated")
        o.max_simulated = py::cast<int>(v);
      else if (key == "two_d_meshes")
        o.two_d_meshes = py::cast<bool>(v);
      else if (key == "num_blocks")
        o.num_blocks = py::cast<int>(v);
      else if (key == "max_stages")
        o.max_stages = py::cast<int>(v);
      else if (key == "spmd_level") {
        const auto s = py::cast<std::string>(v);
        if (s == "O2")
          o.spmd_level = SpmdLevel::O2;
        else if (s == "O3")
          o.spmd_level = SpmdLevel::O3;
        else
          throw weft::Error("plan: spmd_level must be 'O2' or 'O3' (got '" + s + "')");
      } else if (key == "spmd_time_limit")
        o.spmd_time_limit_s = py::cast<double>(v);
      else if (key == "spmd_relative_gap")
        o.spmd_relative_gap = py::cast<double>(v);
      else if (key == "shared_resharding")
        o.shared_resharding = py::cast<bool>(v);
      else if (key == "time_limit")
        o.time_limit_s = py::cast<double>(v);
      else if (key == "memory_limit")
        o.memory_limit = py::cast<double>(v);
      else if (key == "memory_fraction")
        o.memory_fraction = py::cast<double>(v);
      else if (key == "memory_reserve")
        o.memory_reserve = v.is_none() ? -1.0 : py::cast<double>(v);
      else if (key == "overlap_grad_sync")
        o.overlap_grad_sync = py::cast<bool>(v);
      else if (key == "grad_bucket_bytes")
        o.grad_bucket_bytes = py::cast<double>(v);
      else if (key == "step_allreduce_bytes")
        o.step_allreduce_bytes = py::cast<double>(v);
      else if (key == "whole_nodes_only")
        o.whole_nodes_only = py::cast<bool>(v);
      else if (key == "power_of_two_nodes")
        o.power_of_two_nodes = py::cast<bool>(v);
      else if (key == "all_node_counts")
        o.all_node_counts = py::cast<bool>(v);
      else if (key == "bound_search")
        o.bound_search = py::cast<bool>(v);
      else if (key == "allow_infeasible")
        o.allow_infeasible = py::cast<bool>(v);
      else if (key == "max_logical_shapes")
        o.max_logical_shapes = py::cast<int>(v);
      else if (key == "pipeline")
        o.pipeline = py::cast<bool>(v);
      else if (key == "uniform_partitions")
        o.uniform_partitions = py::cast<bool>(v);
      else if (key == "stage_ilp")
        o.stage_ilp = py::cast<bool>(v);
      else if (key == "compare_megatron")
        o.compare_megatron = py::cast<bool>(v);
      else if (key == "uneven_split")
        o.uneven_split = py::cast<bool>(v);
      else if (key == "sequence_parallel")
        o.sequence_parallel = py::cast<bool>(v);
      else if (key == "recompute") {
        if (!py::isinstance<py::str>(v))
          throw py::type_error("plan: recompute must be a string ('auto', 'none', 'selective' or 'full')");
        o.recompute = weft::plan::parse_recompute(py::cast<std::string>(v));
      } else if (key == "zero") {
        if (py::isinstance<py::str>(v))
          o.zero = weft::plan::parse_zero(py::cast<std::string>(v));
        else if (py::isinstance<py::int_>(v) && !py::isinstance<py::bool_>(v))
          o.zero = py::cast<int>(v);
        else
          throw py::type_error("plan: zero must be 'auto' or a ZeRO level 0, 1, 2 or 3");
        if (o.zero < -1 || o.zero > 3)
          throw py::value_error("plan: zero must be 'auto' or a ZeRO level 0, 1, 2 or 3, got " +
                                std::to_string(o.zero));
      } else if (key == "hybrid_sharding")
        o.hybrid_sharding = py::cast<bool>(v);
      else if (key == "max_alternatives")
        o.max_alternatives = py::cast<int>(v);
      else if (key == "threads")
        o.threads = py::cast<int>(v);
      else if (key == "bandwidth_trace")
        o.bandwidth_trace = py::cast<weft::cluster::BandwidthTrace>(v);
      else if (key == "adaptive_window")
        o.adaptive.window_s = py::cast<double>(v);
      else if (key == "adaptive_k_max")
        o.adaptive.k_max = py::cast<int>(v);
      else if (key == "adaptive_duration")
        o.adaptive.duration_s = py::cast<double>(v);
      else if (key == "adaptive_forward_overhead")
        o.adaptive.forward_overhead_s = py::cast<double>(v);
      else if (key == "adaptive_backward_overhead")
        o.adaptive.backward_overhead_s = py::cast<double>(v);
      else if (key == "progress") {
        if (!v.is_none()) {
          auto fn = weft::python::python_callback(py::cast<py::function>(v));
          o.progress = [fn](const PlanProgress& p) {
            py::gil_scoped_acquire gil;
            (*fn)(p.phase, p.fraction, p.message);
          };
        }
      } else {
        throw weft::Error("plan: unknown option '" + key + "'");
      }
    }
    return o;
  };
  // A planning call off the GIL, answering Ctrl-C (interruptible.hpp): the planner stops at its
  // next progress report once interrupted.
  auto released = [](PlanOptions o, auto plan_fn) {
    return weft::python::run_interruptible([o = std::move(o),
                                            plan_fn](weft::python::CancelFlag cancel) mutable {
      o.stop = cancel;
      o.progress = weft::python::cancellation_hook<PlanProgress>(std::move(cancel), std::move(o.progress));
      return plan_fn(o);
    });
  };
  m.def(
      "adaptive_policy",
      // The trace as an object: weft.BandwidthTrace is bound after this module (bind_sim), so a typed
      // argument would have no name in the signature and the stubs.
      [](const Plan& p, const py::object& trace_obj, double window, int k_max, double duration, int samples,
         double forward_overhead, double backward_overhead) {
        weft::cluster::BandwidthTrace trace;
        if (!trace_obj.is_none()) {
          if (!py::isinstance<weft::cluster::BandwidthTrace>(trace_obj))
            throw py::type_error("adaptive_policy: trace must be a weft.BandwidthTrace or None");
          trace = py::cast<weft::cluster::BandwidthTrace>(trace_obj);
        }
        AdaptiveOptions o;
        o.window_s = window;
        o.k_max = k_max;
        o.duration_s = duration;
        o.samples_per_window = samples;
        o.forward_overhead_s = forward_overhead;
        o.backward_overhead_s = backward_overhead;
        py::gil_scoped_release release;
        return adaptive_policy(p, trace, o);
      },
      py::arg("plan"), py::arg("trace") = py::none(), py::arg("window") = 60.0, py::arg("k_max") = 8,
      py::arg("duration") = 0.0, py::arg("samples_per_window") = 16, py::arg("forward_overhead") = 0.0,
      py::arg("backward_overhead") = 0.0,
      "Ada-Grouper's policy for a plan's pipeline under a bandwidth trace (None: constant): the (k, "
      "micro-batch) frontier under the plan's memory limit, the point per window (s) of the trace, and the "
      "expected step time vs every fixed point and 1F1B.");
  m.def(
      "make_plan",
      [options, released](const weft::ir::Graph& g, const weft::cluster::Cluster& c, const py::kwargs& kw) {
        return released(options(kw), [g, c](const PlanOptions& o) { return make_plan(g, c, o); });
      },
      py::arg("training_graph"), py::arg("cluster"),
      "The fastest plan that fits (options as keyword arguments; see weft.plan).");
  m.def(
      "megatron_plan",
      [options, released](const weft::ir::Graph& g, const weft::cluster::Cluster& c, const MegatronLayout& l,
                          const py::kwargs& kw) {
        return released(options(kw), [g, c, l](const PlanOptions& o) { return megatron_plan(g, c, l, o); });
      },
      py::arg("training_graph"), py::arg("cluster"), py::arg("layout"));
  m.def(
      "best_megatron_plan",
      [options, released](const weft::ir::Graph& g, const weft::cluster::Cluster& c, const py::kwargs& kw) {
        return released(options(kw), [g, c](const PlanOptions& o) { return best_megatron_plan(g, c, o); });
      },
      py::arg("training_graph"), py::arg("cluster"));
  m.def(
      "data_parallel_plan",
      [options, released](const weft::ir::Graph& g, const weft::cluster::Cluster& c,
                          const std::vector<std::int64_t>& shares, int num_microbatches,
                          const py::kwargs& kw) {
        return released(options(kw), [g, c, shares, num_microbatches](const PlanOptions& o) {
          return data_parallel_plan(g, c, shares, num_microbatches, o);
        });
      },
      py::arg("training_graph"), py::arg("cluster"), py::arg("shares"), py::arg("num_microbatches") = 1);
  m.def(
      "split_plan",
      [options, released](const weft::ir::Graph& g, const weft::cluster::Cluster& c,
                          const std::vector<double>& fraction, int num_microbatches, const py::kwargs& kw) {
        return released(options(kw), [g, c, fraction, num_microbatches](const PlanOptions& o) {
          return split_plan(g, c, fraction, num_microbatches, o);
        });
      },
      py::arg("training_graph"), py::arg("cluster"), py::arg("fraction"), py::arg("num_microbatches") = 1);
  m.def(
      "layout_plan",
      [options, released](const weft::ir::Graph& g, const weft::cluster::Cluster& c, const py::list& stages,
                          int num_microbatches, const py::kwargs& kw) {
        std::vector<StageLayout> layout;
        for (const auto& item : stages) {
          const auto t = py::cast<py::tuple>(item);
          if (t.size() != 3 && t.size() != 4)
            throw weft::Error("layout_plan: a stage is (first_block, last_block, devices[, mesh])");
          StageLayout s;
          s.first_block = py::cast<int>(t[0]);
          s.last_block = py::cast<int>(t[1]);
          s.devices = py::cast<std::vector<int>>(t[2]);
          if (t.size() == 4) s.mesh = py::cast<std::vector<std::int64_t>>(t[3]);
          layout.push_back(std::move(s));
        }
        return released(options(kw), [g, c, layout, num_microbatches](const PlanOptions& o) {
          return layout_plan(g, c, layout, num_microbatches, o);
        });
      },
      py::arg("training_graph"), py::arg("cluster"), py::arg("stages"), py::arg("num_microbatches") = 1);
  m.def("megatron_layouts", &megatron_layouts, py::arg("cluster"), py::arg("max_p") = 0);
  m.def(
      "megatron_specs",
      [](const weft::ir::Graph& g, int t, bool sequence_parallel) {
        const auto ms = weft::plan::megatron_specs(g, t, sequence_parallel);
        py::dict params;
        for (const auto& [name, p] : ms.params) {
          py::dict d;
          d["role"] = std::string(weft::plan::megatron_role_name(p.role));
          d["dim"] = p.dim;
          d["stride"] = p.stride;
          d["spec"] = p.spec;
          d["note"] = p.note;
          params[py::str(name)] = d;
        }
        py::dict out;
        out["t"] = ms.t;
        out["params"] = params;
        out["fixed"] = ms.fixed;
        out["results"] = ms.results;
        out["boundaries"] = ms.boundaries;
        out["recognised"] = ms.recognised;
        out["sequence"] = ms.sequence;
        out["summary"] = ms.summary();
        return out;
      },
      py::arg("graph"), py::arg("t"), py::arg("sequence_parallel") = false,
      "Megatron's tensor-parallel roles of the graph's parameters, recognised from its structure, and "
      "their fixed specs on a 1-D mesh of t devices: {'t', 'params': {name: {'role', 'dim', 'stride', "
      "'spec', 'note'}}, 'fixed': {tensor: spec} (parameters, their optimizer states, the results below), "
      "'results': {tensor: spec} (what the split matmuls, the embedding and the activations between a column "
      "and its row make; the gradients the updates read), 'boundaries': {tensor: spec} (what a block "
      "boundary carries), 'recognised', 'summary'} (weft.megatron_specs).");
  m.def("model_state_bytes", &model_state_bytes, py::arg("training_graph"));
  m.def(
      "state_bytes_factor", &weft::plan::state_bytes_factor, py::arg("graph"), py::arg("tensor"),
      "Bytes a device holds per byte of state leaf `tensor` (an id): an optimizer state 1; a parameter with "
      "its gradient, 3 for a bf16 / f16 parameter whose update reads an f32 master copy (weft.Trainer "
      "keeps its gradient in f32), else 2; 0 for any other tensor.");
  py::class_<weft::plan::ZeroMemory>(
      m, "ZeroMemory", "Bytes per device a ZeRO level keeps of a stage's state (weft.zero_memory).")
      .def_readonly("params", &weft::plan::ZeroMemory::params)
      .def_readonly("grads", &weft::plan::ZeroMemory::grads)
      .def_readonly("optimizer", &weft::plan::ZeroMemory::optimizer)
      .def_readonly("working", &weft::plan::ZeroMemory::working,
                    "Transient working set the level adds (a gradient bucket; ZeRO-3's gathered blocks).")
      .def_property_readonly("state", &weft::plan::ZeroMemory::state, "params + grads + optimizer.")
      .def("__repr__", [](const weft::plan::ZeroMemory& z) {
        return fmt::format(
            "ZeroMemory(params {:.4g} GB, grads {:.4g} GB, optimizer {:.4g} GB, working {:.4g} GB)",
            z.params / 1e9, z.grads / 1e9, z.optimizer / 1e9, z.working / 1e9);
      });
  py::class_<weft::plan::ZeroTraffic>(
      m, "ZeroTraffic", "Bytes one device sends for a ZeRO level's collectives (weft.zero_traffic).")
      .def_readonly("per_microbatch", &weft::plan::ZeroTraffic::per_microbatch)
      .def_readonly("per_step", &weft::plan::ZeroTraffic::per_step)
      .def("total", &weft::plan::ZeroTraffic::total, py::arg("microbatches"),
           "Bytes per step with that many micro-batches.");
  m.def("zero_memory", &weft::plan::zero_memory, py::arg("level"), py::arg("param_bytes"),
        py::arg("optimizer_bytes"), py::arg("group"), py::arg("largest_block_param_bytes") = 0.0,
        py::arg("bucket_bytes") = 25e6, py::arg("grad_bytes") = -1.0,
        "Per device: what ZeRO level 0..3 over `group` replicas keeps of P parameter bytes, their gradient "
        "bytes as held (grad_bytes; < 0: as many as P; f32 under mixed precision: state_bytes_factor) and O "
        "optimizer-state bytes, with the working set it adds.");
  m.def("zero_traffic", &weft::plan::zero_traffic, py::arg("level"), py::arg("param_bytes"), py::arg("group"),
        py::arg("groups") = 1,
        "Bytes one device sends per micro-batch and per step for ZeRO level 0..3 over a ring of `group` "
        "replicas (hybrid: `groups` groups, their gradient shards all-reduced per step).");
  m.def("rebatch", &rebatch, py::arg("graph"), py::arg("batch"), "The same graph at another batch size.");
  m.def("batch_size", &batch_size, py::arg("graph"));
  m.def("is_training_graph", &is_training_graph, py::arg("graph"));
}
