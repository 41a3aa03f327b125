// Bindings of weft/sim (pipeline simulator, Ada-Grouper) and of cluster::BandwidthTrace.
#include <fmt/format.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <tuple>
#include <typeinfo>
#include <vector>

#include "weft/cluster/bandwidth_trace.hpp"
#include "weft/cluster/cluster.hpp"
#include "weft/core/error.hpp"
#include "weft/sim/adagrouper.hpp"
#include "weft/sim/simulator.hpp"

namespace py = pybind11;
using namespace weft::sim;
using weft::cluster::BandwidthTrace;

namespace {
void bind_trace(py::module_& m) {
  // The cluster bindings may also expose BandwidthTrace; register it only once.
  if (py::detail::get_type_info(typeid(BandwidthTrace))) return;
  py::class_<BandwidthTrace>(
      m, "BandwidthTrace",
      "Piecewise-constant fraction of a link's nominal bandwidth over time (default 1.0).")
      .def(py::init<>())
      .def(py::init<std::vector<double>, std::vector<double>>(), py::arg("times"), py::arg("fractions"))
      .def_static("constant", &BandwidthTrace::constant, py::arg("fraction"))
      .def_static(
          "preempted",
          [](std::uint64_t seed, double duration, double normal_min, double normal_max, double preempt_min,
             double preempt_max, double low, double high) {
            return BandwidthTrace::preempted(
                seed, {duration, normal_min, normal_max, preempt_min, preempt_max, low, high});
          },
          py::arg("seed"), py::arg("duration") = 600.0, py::arg("normal_min") = 5.0,
          py::arg("normal_max") = 30.0, py::arg("preempt_min") = 5.0, py::arg("preempt_max") = 30.0,
          py::arg("low") = 0.3, py::arg("high") = 0.6,
          "A 'preempted network' trace: stretches at full bandwidth alternating with stretches at a fraction "
          "uniform in [low, high]; deterministic per seed.")
      .def_property_readonly("times", &BandwidthTrace::times)
      .def_property_readonly("fractions", &BandwidthTrace::fractions)
      .def("fraction_at", &BandwidthTrace::fraction_at, py::arg("t"))
      .def("finish_time", &BandwidthTrace::finish_time, py::arg("t0"), py::arg("bytes"),
           py::arg("nominal_bandwidth"))
      .def("mean_fraction", &BandwidthTrace::mean_fraction, py::arg("t0"), py::arg("t1"))
      .def("window", &BandwidthTrace::window, py::arg("t0"), py::arg("t1"))
      .def("to_json", &BandwidthTrace::to_json)
      .def_static("from_json", &BandwidthTrace::from_json, py::arg("text"))
      .def("__len__", &BandwidthTrace::size)
      .def("__eq__", [](const BandwidthTrace& a, const BandwidthTrace& b) { return a == b; })
      .def("__hash__", &BandwidthTrace::hash)
      .def("__repr__", &BandwidthTrace::to_string);
}
}  // namespace

void bind_sim(py::module_& m) {
  bind_trace(m);
  py::class_<ReplicaCollectives>(m, "ReplicaCollectives",
                                 "Collectives across a stage's data-parallel replicas (ZeRO / FSDP / DDP), "
                                 "seconds at nominal bandwidth, run "
                                 "on each device's communication stream by the simulator.")
      .def(py::init(
               [](double gf, double gb, double rb, double ss, double sg, double gu, double ru, double su,
                  bool prefetch) { return ReplicaCollectives{gf, gb, rb, ss, sg, gu, ru, su, prefetch}; }),
           py::arg("gather_forward") = 0.0, py::arg("gather_backward") = 0.0,
           py::arg("reduce_backward") = 0.0, py::arg("step_sync") = 0.0, py::arg("step_gather") = 0.0,
           py::arg("gather_unit") = 1.0, py::arg("reduce_unit") = 1.0, py::arg("sync_unit") = 1.0,
           py::arg("prefetch") = true)
      .def_readonly("gather_forward", &ReplicaCollectives::gather_forward)
      .def_readonly("gather_backward", &ReplicaCollectives::gather_backward)
      .def_readonly("reduce_backward", &ReplicaCollectives::reduce_backward)
      .def_readonly("step_sync", &ReplicaCollectives::step_sync)
      .def_readonly("step_gather", &ReplicaCollectives::step_gather)
      .def_readonly("gather_unit", &ReplicaCollectives::gather_unit)
      .def_readonly("reduce_unit", &ReplicaCollectives::reduce_unit)
      .def_readonly("sync_unit", &ReplicaCollectives::sync_unit)
      .def_readonly("prefetch", &ReplicaCollectives::prefetch)
      .def("__eq__", [](const ReplicaCollectives& a, const ReplicaCollectives& b) { return a == b; })
      .def("__repr__", [](const ReplicaCollectives& c) {
        return fmt::format(
            "ReplicaCollectives(gather_forward={:g}, gather_backward={:g}, reduce_backward={:g}, "
            "step_sync={:g}, "
            "step_gather={:g})",
            c.gather_forward, c.gather_backward, c.reduce_backward, c.step_sync, c.step_gather);
      });
  py::class_<StageSpec>(m, "StageSpec", "Per-micro-batch times, bytes and memory of one pipeline stage.")
      .def(py::init([](double f, double b, double w, double ab, double am, double sm, double opt,
                       const ReplicaCollectives& rc) { return StageSpec{f, b, w, ab, am, sm, opt, rc}; }),
           py::arg("forward_time") = 1.0, py::arg("backward_time") = 2.0, py::arg("weight_time") = 0.0,
           py::arg("activation_bytes") = 0.0, py::arg("activation_memory") = 0.0,
           py::arg("static_memory") = 0.0, py::arg("optimizer_time") = 0.0,
           py::arg("replica") = ReplicaCollectives{})
      .def_readonly("replica", &StageSpec::replica)
      .def_readonly("forward_time", &StageSpec::forward_time)
      .def_readonly("backward_time", &StageSpec::backward_time)
      .def_readonly("weight_time", &StageSpec::weight_time)
      .def_readonly("activation_bytes", &StageSpec::activation_bytes)
      .def_readonly("activation_memory", &StageSpec::activation_memory)
      .def_readonly("static_memory", &StageSpec::static_memory)
      .def_readonly("optimizer_time", &StageSpec::optimizer_time)
      .def("__eq__", [](const StageSpec& a, const StageSpec& b) { return a == b; })
      .def("__repr__", [](const StageSpec& s) {
        return fmt::format("StageSpec(F={:g}, B={:g}, W={:g}, bytes={:g})", s.forward_time, s.backward_time,
                           s.weight_time, s.activation_bytes);
      });
  py::class_<LinkSpec>(m, "PipelineLink",
                       "A link between neighbouring devices: bytes/s, latency, bandwidth trace.")
      .def(py::init([](double bw, double lat, const BandwidthTrace& t) {
             return LinkSpec{bw, lat, t};
           }),
           py::arg("bandwidth"), py::arg("latency") = 0.0, py::arg("trace") = BandwidthTrace())
      .def_readonly("bandwidth", &LinkSpec::bandwidth)
      .def_readonly("latency", &LinkSpec::latency)
      .def_readonly("trace", &LinkSpec::trace)
      .def("__eq__", [](const LinkSpec& a, const LinkSpec& b) { return a == b; })
      .def("__repr__", [](const LinkSpec& l) {
        return fmt::format("PipelineLink(bandwidth={:g}, latency={:g}, {})", l.bandwidth, l.latency,
                           l.trace.to_string());
      });
  m.def(
      "links_from_cluster", &links_from_cluster, py::arg("cluster"), py::arg("device_ids"),
      py::arg("trace") = BandwidthTrace(), py::arg("wrap") = false,
      "Pipeline links between consecutive devices of a Cluster: intra-node link on one node, the slower NIC "
      "across nodes.");
  py::class_<SimResult>(m, "SimResult", "Outcome of simulate().")
      .def_readonly("step_time", &SimResult::step_time)
      .def_readonly("bubble_fraction", &SimResult::bubble_fraction)
      .def_readonly("busy_time", &SimResult::busy_time)
      .def_readonly("collective_time", &SimResult::collective_time)
      .def_readonly("peak_in_flight", &SimResult::peak_in_flight)
      .def_readonly("peak_in_flight_device", &SimResult::peak_in_flight_device)
      .def_readonly("peak_memory", &SimResult::peak_memory)
      .def_readonly("events", &SimResult::events)
      .def_readonly("num_tasks", &SimResult::num_tasks)
      .def_readonly("deadlock", &SimResult::deadlock)
      .def_readonly("deadlock_report", &SimResult::deadlock_report)
      .def_property_readonly(
          "timeline",
          [](const SimResult& r) {
            std::vector<std::tuple<std::string, int, int, int, int, double, double>> out;
            out.reserve(r.timeline.size());
            for (const auto& e : r.timeline)
              out.emplace_back(task_kind_name(e.kind), e.stage, e.micro, e.device, e.peer, e.start, e.end);
            return out;
          },
          "(kind, stage, micro, device, peer, start, end); kind in F B W Opt act grad gather reduce; peer -1 "
          "for compute and replica collectives.")
      .def("chrome_trace_json", &SimResult::to_chrome_trace)
      .def("__repr__", &SimResult::to_string);
  m.def(
      "_simulate",
      [](const weft::schedule::Schedule& s, const std::vector<StageSpec>& stages,
         const std::vector<LinkSpec>& links, double trace_offset, bool check_pairing, bool record_timeline,
         const BandwidthTrace& replica_trace) {
        SimOptions o;
        o.trace_offset = trace_offset;
        o.check_pairing = check_pairing;
        o.record_timeline = record_timeline;
        py::gil_scoped_release nogil;
        return simulate(s, Pipeline{stages, links, replica_trace}, o);
      },
      py::arg("schedule"), py::arg("stages"), py::arg("links"), py::arg("trace_offset") = 0.0,
      py::arg("check_pairing") = true, py::arg("record_timeline") = true,
      py::arg("replica_trace") = BandwidthTrace());

  py::class_<StageModel>(m, "StageModel", "A stage per sample: F(b) = overhead + per_sample*b, etc.")
      .def(py::init(
               [](double fps, double fo, double bps, double bo, double abps, double amps, double sm,
                  const ReplicaCollectives& rc) { return StageModel{fps, fo, bps, bo, abps, amps, sm, rc}; }),
           py::arg("forward_per_sample") = 0.0, py::arg("forward_overhead") = 0.0,
           py::arg("backward_per_sample") = 0.0, py::arg("backward_overhead") = 0.0,
           py::arg("activation_bytes_per_sample") = 0.0, py::arg("activation_memory_per_sample") = 0.0,
           py::arg("static_memory") = 0.0, py::arg("replica") = ReplicaCollectives{})
      .def("at", &StageModel::at, py::arg("micro_batch_size"))
      .def("__eq__", [](const StageModel& a, const StageModel& b) { return a == b; })
      .def("__repr__", [](const StageModel& s) {
        return fmt::format("StageModel(F={:g}+{:g}b, B={:g}+{:g}b)", s.forward_overhead, s.forward_per_sample,
                           s.backward_overhead, s.backward_per_sample);
      });
  py::class_<Candidate>(m, "Candidate",
                        "An Ada-Grouper plan: group size k, micro-batch size b, M micro-batches.")
      .def(py::init([](int k, int b, int M, double mem) {
             return Candidate{k, b, M, mem};
           }),
           py::arg("k"), py::arg("micro_batch_size"), py::arg("num_micro"), py::arg("peak_memory") = 0.0)
      .def_readonly("k", &Candidate::k)
      .def_readonly("micro_batch_size", &Candidate::micro_batch_size)
      .def_readonly("num_micro", &Candidate::num_micro)
      .def_readonly("peak_memory", &Candidate::peak_memory)
      .def("__eq__", [](const Candidate& a, const Candidate& b) { return a == b; })
      .def("__hash__", [](const Candidate& c) { return std::hash<std::string>{}(c.to_string()); })
      .def("__repr__", [](const Candidate& c) { return "Candidate(" + c.to_string() + ")"; });
  m.def("adagrouper_frontier", &adagrouper_frontier, py::arg("stages"), py::arg("global_batch"),
        py::arg("memory_limit"), py::arg("k_max") = 8);
  m.def("candidate_step_time", &candidate_step_time, py::arg("candidate"), py::arg("stages"),
        py::arg("links"), py::arg("t0") = 0.0, py::arg("replica_trace") = BandwidthTrace());
  py::class_<TuneResult>(m, "TuneResult")
      .def_readonly("best", &TuneResult::best)
      .def_readonly("step_times", &TuneResult::step_times)
      .def("__repr__", [](const TuneResult& t) { return fmt::format("TuneResult(best={})", t.best); });
  m.def("adagrouper_tune", &adagrouper_tune, py::arg("candidates"), py::arg("stages"), py::arg("links"),
        py::arg("t0") = 0.0, py::arg("replica_trace") = BandwidthTrace());
  py::class_<DriverResult>(m, "DriverResult")
      .def_property_readonly("iterations",
                             [](const DriverResult& r) {
                               std::vector<std::tuple<double, double, int>> out;
                               for (const auto& i : r.iterations)
                                 out.emplace_back(i.start, i.step, i.candidate);
                               return out;
                             })
      .def_readonly("end_time", &DriverResult::end_time)
      .def_readonly("switches", &DriverResult::switches)
      .def("mean_step", &DriverResult::mean_step)
      .def("__repr__", &DriverResult::to_string);
  m.def(
      "adagrouper_drive",
      [](const std::vector<Candidate>& c, const std::vector<StageModel>& s, const std::vector<LinkSpec>& l,
         double start, double until, int max_iterations, int retune_every, const std::string& estimate,
         double window, int fixed, const BandwidthTrace& replica_trace) {
        DriverOptions o;
        o.start = start;
        o.until = until;
        o.max_iterations = max_iterations;
        o.retune_every = retune_every;
        WEFT_CHECK(estimate == "lookahead" || estimate == "past_mean",
                   "estimate must be 'lookahead' or 'past_mean', got '{}'", estimate);
        o.estimate =
            estimate == "lookahead" ? DriverOptions::Estimate::Lookahead : DriverOptions::Estimate::PastMean;
        o.window = window;
        o.fixed = fixed;
        py::gil_scoped_release nogil;
        return adagrouper_drive(c, s, l, o, replica_trace);
      },
      py::arg("candidates"), py::arg("stages"), py::arg("links"), py::arg("start") = 0.0,
      py::arg("until") = 600.0, py::arg("max_iterations") = 100000, py::arg("retune_every") = 1,
      py::arg("estimate") = "lookahead", py::arg("window") = 10.0, py::arg("fixed") = -1,
      py::arg("replica_trace") = BandwidthTrace());
}
