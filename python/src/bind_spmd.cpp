// Bindings of weft/spmd: the SPMD strategy search (weft.spmd_search wraps _weft.spmd.search) and
// the independent plan evaluator.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "interruptible.hpp"
#include "weft/core/error.hpp"
#include "weft/ir/graph.hpp"
#include "weft/spmd/search.hpp"

namespace py = pybind11;
using namespace weft;
using namespace weft::spmd;

namespace {

Level parse_level(const std::string& s) {
  if (s == "O2" || s == "o2") return Level::O2;
  if (s == "O3" || s == "o3") return Level::O3;
  fail("spmd_search: level must be 'O2' or 'O3', got '{}'", s);
}

MemoryMode parse_mode(const std::string& s) {
  if (s == "ilp") return MemoryMode::Ilp;
  if (s == "shard_largest") return MemoryMode::ShardLargest;
  fail("spmd_search: memory_mode must be 'ilp' or 'shard_largest', got '{}'", s);
}

py::dict report_dict(const SearchReport& r) {
  py::dict d;
  py::list phases;
  for (const auto& [n, t] : r.phase_seconds) phases.append(py::make_tuple(n, t));
  d["phase_seconds"] = phases;
  d["nodes"] = r.nodes;
  d["strategies"] = r.strategies;
  d["edges"] = r.edges;
  d["ilp_variables"] = r.ilp_variables;
  d["ilp_constraints"] = r.ilp_constraints;
  d["ilp_solves"] = r.ilp_solves;
  d["status"] = r.status;
  d["gap"] = r.gap;
  d["compute_time"] = r.compute_time;
  d["comm_time"] = r.comm_time;
  d["peak_memory"] = r.peak_memory;
  d["memory_limit"] = r.memory_limit;
  d["forced_sharded_params"] = r.forced_sharded_params;
  d["segments"] = r.segments;
  d["reused_segments"] = r.reused_segments;
  d["refine_moves"] = r.refine_moves;
  d["o2_dp_seconds"] = r.o2_dp_seconds;
  d["o2_refine_seconds"] = r.o2_refine_seconds;
  d["o2_fallback"] = r.o2_fallback;
  d["memory_price_probes"] = r.memory_price_probes;
  d["memory_price"] = r.memory_price;
  d["total_seconds"] = r.total_seconds();
  py::list params;
  for (const auto& p : r.params) {
    py::dict row;
    row["name"] = p.name;
    row["shape"] = p.shape;
    row["spec"] = p.spec;
    row["bytes_per_device"] = p.bytes_per_device;
    params.append(row);
  }
  d["params"] = params;
  return d;
}

// Tensor name -> spec text for the tensors that have one (SpmdPlan::tensor_specs / shared_specs).
std::map<std::string, std::string> specs_by_name(
    const std::vector<std::optional<sharding::ShardingSpec>>& specs, const ir::Graph& g) {
  std::map<std::string, std::string> out;
  for (std::size_t t = 0; t < specs.size(); ++t)
    if (specs[t]) out[g.tensors()[t].name] = specs[t]->to_string();
  return out;
}

}  // namespace

void bind_spmd(py::module_& root) {
  py::module_ m = root.def_submodule("spmd", "SPMD (intra-operator) strategy search (see weft.spmd)");
  py::class_<SearchReport>(m, "SearchReport",
                           "Phase times, ILP size, status/gap, cost split, memory, parameter specs.")
      .def("to_dict", &report_dict)
      .def("__str__", &SearchReport::to_string)
      .def("__repr__", [](const SearchReport& r) {
        return "SearchReport(status=" + r.status + ", nodes=" + std::to_string(r.nodes) + ")";
      });
  py::class_<SpmdPlan>(m, "SpmdPlan", "The chosen strategy of every op and spec of every tensor.")
      .def_readonly("cost", &SpmdPlan::cost)
      .def_readonly("compute_time", &SpmdPlan::compute_time)
      .def_readonly("comm_time", &SpmdPlan::comm_time)
      .def_readonly("peak_memory", &SpmdPlan::peak_memory)
      .def_readonly("report", &SpmdPlan::report)
      .def(
          "tensor_specs",
          [](const SpmdPlan& p, const ir::Graph& g) { return specs_by_name(p.tensor_specs, g); },
          py::arg("graph"), "Spec text of every tensor by name.")
      .def(
          "op_strategies",
          [](const SpmdPlan& p, const ir::Graph& g, const cluster::DeviceMesh& mesh) {
            std::map<std::string, std::string> out;
            std::vector<std::string> names = mesh.axis_names();
            for (std::size_t o = 0; o < p.op_strategies.size(); ++o)
              out[g.ops()[o].name] = p.op_strategies[o].describe(g.ops()[o].index_map, names);
            return out;
          },
          py::arg("graph"), py::arg("mesh"), "The chosen factor-to-axis assignment of every op by name.")
      .def(
          "shared_specs",
          [](const SpmdPlan& p, const ir::Graph& g) { return specs_by_name(p.shared_specs, g); },
          py::arg("graph"),
          "Tensor name -> the layout it is resharded to once for every reader that needs exactly it (shared "
          "resharding); tensors whose readers reshard on their own are absent.")
      .def("spec_of", &SpmdPlan::spec_of, py::arg("graph"), py::arg("tensor"));
  m.def(
      "search",
      [](const ir::Graph& g, const cluster::Cluster& c, const cluster::DeviceMesh& mesh,
         const std::string& level, double memory_limit, const std::string& memory_mode, double time_limit,
         double relative_gap, bool reuse, bool strided, bool pricing,
         const std::map<std::string, std::string>& fixed, const std::map<std::string, std::string>& outputs,
         const py::object& progress, bool shared, int shared_layouts) {
        SearchOptions o;
        o.level = parse_level(level);
        o.memory_limit = memory_limit;
        o.memory_mode = parse_mode(memory_mode);
        o.time_limit_s = time_limit;
        o.relative_gap = relative_gap;
        o.reuse_repeated_layers = reuse;
        o.strided_candidates = strided;
        o.o2_memory_pricing = pricing;
        o.fixed_specs = fixed;
        o.output_specs = outputs;
        o.shared_resharding = shared;
        o.shared_layouts_per_tensor = shared_layouts;
        if (!progress.is_none()) {
          auto fn = weft::python::python_callback(py::cast<py::function>(progress));
          o.progress = [fn](const Progress& p) {
            py::gil_scoped_acquire gil;
            (*fn)(p.phase, p.fraction, p.message);
          };
        }
        // Off the GIL, answering Ctrl-C (interruptible.hpp).
        return weft::python::run_interruptible([g, c, mesh, o](weft::python::CancelFlag cancel) mutable {
          o.stop = cancel;
          o.progress = weft::python::cancellation_hook<Progress>(std::move(cancel), std::move(o.progress));
          return spmd_search(g, c, mesh, o);
        });
      },
      py::arg("graph"), py::arg("cluster"), py::arg("mesh"), py::arg("level") = "O2",
      py::arg("memory_limit") = 0.0, py::arg("memory_mode") = "ilp", py::arg("time_limit") = 60.0,
      py::arg("relative_gap") = 0.0, py::arg("reuse_repeated_layers") = true,
      py::arg("strided_candidates") = true, py::arg("memory_pricing") = true,
      py::arg("fixed_specs") = std::map<std::string, std::string>{},
      py::arg("output_specs") = std::map<std::string, std::string>{}, py::arg("progress") = py::none(),
      py::arg("shared_resharding") = true, py::arg("shared_layouts_per_tensor") = 2);
  m.def(
      "evaluate_plan",
      [](const ir::Graph& g, const cluster::Cluster& c, const cluster::DeviceMesh& mesh, const SpmdPlan& p) {
        const auto e = evaluate_plan(g, c, mesh, p);
        py::dict d;
        d["cost"] = e.cost;
        d["compute_time"] = e.compute_time;
        d["comm_time"] = e.comm_time;
        d["peak_memory"] = e.peak_memory;
        d["collectives"] = e.collectives;
        d["edges"] = e.edges;
        std::vector<std::string> reduced;  // tensors whose partial sums an edge reduces
        for (ir::TensorId t : e.partial_reductions) reduced.push_back(g.tensor(t).name);
        d["partial_reductions"] = reduced;
        return d;
      },
      py::arg("graph"), py::arg("cluster"), py::arg("mesh"), py::arg("plan"),
      "Independent re-evaluation of a plan: compute, resharding of every edge, peak memory.");
}
