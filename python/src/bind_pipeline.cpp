// Bindings of weft/pipeline (grouping, submeshes, DP and ILP stage partition) in the submodule
// _weft.pipeline; the Pythonic layer is python/weft/pipeline.py.
#include <fmt/format.h>
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>

#include "weft/core/error.hpp"
#include "weft/pipeline/grouping.hpp"
#include "weft/pipeline/partition.hpp"
#include "weft/pipeline/submesh.hpp"

namespace py = pybind11;
using namespace weft::pipeline;

namespace {

// A Python cost callback may return None, a number (seconds), a StageCost, or a tuple
// (time_s, memory_bytes, fits_memory).
StageCostFn wrap_cost(py::function fn) {
  return [fn = std::move(fn)](int i, int j, int m) -> std::optional<StageCost> {
    py::object r = fn(i, j, m);
    if (r.is_none()) return std::nullopt;
    if (py::isinstance<StageCost>(r)) return r.cast<StageCost>();
    if (py::isinstance<py::tuple>(r)) {
      auto t = r.cast<py::tuple>();
      WEFT_CHECK(t.size() >= 1 && t.size() <= 3, "stage cost tuple must be (time_s[, memory_bytes[, fits]])");
      StageCost c;
      c.time_s = t[0].cast<double>();
      if (t.size() >= 2) c.memory_bytes = t[1].cast<double>();
      if (t.size() >= 3) c.fits_memory = t[2].cast<bool>();
      return c;
    }
    if (py::isinstance<py::float_>(r) || py::isinstance<py::int_>(r))
      return StageCost{r.cast<double>(), 0, true};
    weft::fail(
        "stage cost callback returned {} for ({}, {}, {}): expected None, a number, a StageCost or a tuple",
        py::str(py::type::of(r)).cast<std::string>(), i, j, m);
  };
}

DpOptions dp_options(int b, double step, double limit, bool bnb = true) {
  DpOptions o;
  o.branch_and_bound = bnb;
  o.num_microbatches = b;
  o.t_max_relative_step = step;
  o.time_limit_s = limit;
  return o;
}

IlpPartitionOptions ilp_options(int s, double eps, bool tight, bool paper, double limit, double gap) {
  IlpPartitionOptions o;
  o.num_stages = s;
  o.epsilon = eps;
  o.bound_tightening = tight;
  o.paper_upper_bound = paper;
  o.time_limit_s = limit;
  o.relative_gap = gap;
  return o;
}

}  // namespace

void bind_pipeline(py::module_& root) {
  py::module_ m = root.def_submodule("pipeline", "pipeline stage partition (see weft.pipeline)");

  // ---- submeshes
  py::class_<SubmeshShape>(m, "SubmeshShape", "A stage's submesh: n whole nodes x G, or a 1 x 2^k slice.")
      .def(py::init<int, int>(), py::arg("nodes"), py::arg("devices_per_node"))
      .def_readonly("nodes", &SubmeshShape::nodes)
      .def_readonly("devices_per_node", &SubmeshShape::devices_per_node)
      .def_property_readonly("num_devices", &SubmeshShape::num_devices)
      .def("__eq__", [](const SubmeshShape& a, const SubmeshShape& b) { return a == b; })
      .def("__hash__",
           [](const SubmeshShape& s) { return py::hash(py::make_tuple(s.nodes, s.devices_per_node)); })
      .def("__repr__", [](const SubmeshShape& s) { return "SubmeshShape(" + s.to_string() + ")"; });
  py::class_<SubmeshPlacement>(m, "SubmeshPlacement")
      .def_readonly("shape", &SubmeshPlacement::shape)
      .def_readonly("device_ids", &SubmeshPlacement::device_ids)
      .def("mesh", &SubmeshPlacement::mesh, py::arg("logical_shape") = std::vector<std::int64_t>{},
           "The devices as a DeviceMesh of that logical shape (default nodes x devices_per_node).")
      .def("__eq__", [](const SubmeshPlacement& a, const SubmeshPlacement& b) { return a == b; })
      .def("__repr__", &SubmeshPlacement::to_string);
  py::class_<ReplicatedPipeline>(m, "ReplicatedPipeline")
      .def_readonly("replicas", &ReplicatedPipeline::replicas)
      .def_readonly("placements", &ReplicatedPipeline::placements)
      .def("__repr__", [](const ReplicatedPipeline& r) {
        return fmt::format("ReplicatedPipeline({} replicas of {} stages)", r.replicas,
                           r.placements.empty() ? 0 : r.placements[0].size());
      });
  m.def("submesh_shapes", &submesh_shapes, py::arg("cluster"));
  m.def("logical_mesh_shapes", &logical_mesh_shapes, py::arg("shape"));
  m.def("assign_submeshes", &assign_submeshes, py::arg("cluster"), py::arg("stages"));
  m.def("replicate_pipeline", &replicate_pipeline, py::arg("cluster"), py::arg("stages"));

  // ---- grouping
  py::enum_<OpPhase>(m, "OpPhase")
      .value("Forward", OpPhase::Forward)
      .value("Backward", OpPhase::Backward)
      .value("Update", OpPhase::Update);
  py::class_<Block>(m, "Block")
      .def_readonly("forward_ops", &Block::forward_ops)
      .def_readonly("ops", &Block::ops)
      .def_readonly("forward_flops", &Block::forward_flops)
      .def_readonly("backward_flops", &Block::backward_flops)
      .def_readonly("update_flops", &Block::update_flops)
      .def_readonly("param_bytes", &Block::param_bytes)
      .def_readonly("boundary_bytes", &Block::boundary_bytes)
      .def_property_readonly("compute_flops", &Block::compute_flops)
      .def("__repr__", &Block::to_string);
  py::class_<LayerGrouping>(m, "LayerGrouping")
      .def_readonly("blocks", &LayerGrouping::blocks)
      .def_readonly("block_of_op", &LayerGrouping::block_of_op)
      .def_readonly("forward_order", &LayerGrouping::forward_order)
      .def_readonly("crossing_bytes", &LayerGrouping::crossing_bytes)
      .def_property_readonly("max_block_flops", &LayerGrouping::max_block_flops)
      .def_property_readonly("cut_bytes", &LayerGrouping::cut_bytes)
      .def("ops_of_range", &LayerGrouping::ops_of_range, py::arg("first"), py::arg("last"))
      .def("__len__", [](const LayerGrouping& g) { return g.blocks.size(); })
      .def("__repr__", &LayerGrouping::to_string);
  m.def("classify_ops", &classify_ops, py::arg("graph"));
  m.def("owner_forward_op", &owner_forward_op, py::arg("graph"));
  m.def(
      "group_layers",
      [](const weft::ir::Graph& g, int num_blocks, const std::vector<int>& cut_positions) {
        return group_layers(g, num_blocks, cut_positions);
      },
      py::arg("graph"), py::arg("num_blocks"), py::arg("cut_positions") = std::vector<int>{});
  py::class_<RepeatedLayers>(m, "RepeatedLayers")
      .def_readonly("count", &RepeatedLayers::count)
      .def_readonly("period", &RepeatedLayers::period)
      .def_readonly("starts", &RepeatedLayers::starts)
      .def_readonly("forward_ops", &RepeatedLayers::forward_ops)
      .def("__repr__", [](const RepeatedLayers& r) {
        return "RepeatedLayers(count=" + std::to_string(r.count) + ", period=" + std::to_string(r.period) +
               ")";
      });
  m.def("repeated_layers", &repeated_layers, py::arg("graph"));
  m.def("group_by_layers", &group_by_layers, py::arg("graph"), py::arg("layers"));
  m.def("extract_stage", &extract_stage, py::arg("graph"), py::arg("ops"));
  m.def(
      "extract_stage_mapped",
      [](const weft::ir::Graph& g, const std::vector<weft::ir::OpId>& ops) {
        auto s = extract_stage_mapped(g, ops);
        return py::make_tuple(std::move(s.graph), s.original_tensor, s.original_op);
      },
      py::arg("graph"), py::arg("ops"),
      "(stage graph, original tensor id per tensor, original op id per op)");

  m.def("structurally_equal", &structurally_equal, py::arg("a"), py::arg("b"),
        "Same ops, attributes, wiring and tensor shapes/dtypes/roles, names ignored.");
  m.def("structural_hash", &structural_hash, py::arg("graph"), "Equal for structurally equal graphs.");

  // ---- DP
  py::class_<StageCost>(m, "StageCost")
      .def(py::init([](double t, double mem, bool fits) {
             return StageCost{t, mem, fits};
           }),
           py::arg("time_s"), py::arg("memory_bytes") = 0.0, py::arg("fits_memory") = true)
      .def_readonly("time_s", &StageCost::time_s)
      .def_readonly("memory_bytes", &StageCost::memory_bytes)
      .def_readonly("fits_memory", &StageCost::fits_memory)
      .def("__eq__", [](const StageCost& a, const StageCost& b) { return a == b; })
      .def("__repr__", [](const StageCost& c) {
        return fmt::format("StageCost({:.6g} s, {:.4g} B, fits={})", c.time_s, c.memory_bytes, c.fits_memory);
      });
  py::class_<DpStage>(m, "DpStage")
      .def_readonly("first_block", &DpStage::first_block)
      .def_readonly("last_block", &DpStage::last_block)
      .def_readonly("submesh_index", &DpStage::submesh_index)
      .def_readonly("cost", &DpStage::cost)
      .def("__repr__", [](const DpStage& s) {
        return fmt::format("DpStage([{}, {}] on submesh {}, {:.6g} s)", s.first_block, s.last_block,
                           s.submesh_index, s.cost.time_s);
      });
  py::class_<DpPartition>(m, "DpPartition")
      .def_readonly("stages", &DpPartition::stages)
      .def_readonly("latency_s", &DpPartition::latency_s)
      .def_readonly("max_stage_s", &DpPartition::max_stage_s)
      .def_readonly("sum_stage_s", &DpPartition::sum_stage_s)
      .def_readonly("cost_calls", &DpPartition::cost_calls)
      .def_readonly("t_max_evaluated", &DpPartition::t_max_evaluated)
      .def_readonly("wall_s", &DpPartition::wall_s)
      .def("__repr__", &DpPartition::to_string);
  m.def(
      "partition_dp",
      [](int L, const std::vector<SubmeshShape>& sub, int D, py::function cost, int B, double step,
         double limit, bool bnb) {
        return partition_dp(L, sub, D, wrap_cost(std::move(cost)), dp_options(B, step, limit, bnb));
      },
      py::arg("num_blocks"), py::arg("submeshes"), py::arg("total_devices"), py::arg("cost"),
      py::arg("num_microbatches") = 1, py::arg("t_max_relative_step") = 0.0, py::arg("time_limit_s") = 60.0,
      py::arg("branch_and_bound") = true);
  m.def(
      "partition_dp_exhaustive",
      [](int L, const std::vector<SubmeshShape>& sub, int D, py::function cost, int B) {
        return partition_dp_exhaustive(L, sub, D, wrap_cost(std::move(cost)), dp_options(B, 0, 60));
      },
      py::arg("num_blocks"), py::arg("submeshes"), py::arg("total_devices"), py::arg("cost"),
      py::arg("num_microbatches") = 1);

  // ---- ILP
  py::class_<PartitionDag>(m, "PartitionDag")
      .def(py::init([](std::vector<double> compute, const std::vector<py::tuple>& values) {
             PartitionDag d;
             d.compute = std::move(compute);
             for (const auto& t : values) {
               WEFT_CHECK(t.size() == 3, "PartitionDag values are (producer, [consumers], bytes) tuples");
               d.values.push_back(
                   {t[0].cast<int>(), t[1].cast<std::vector<int>>(), t[2].cast<std::int64_t>()});
             }
             d.validate();
             return d;
           }),
           py::arg("compute"), py::arg("values"))
      .def_readonly("compute", &PartitionDag::compute)
      .def_readonly("op_of_node", &PartitionDag::op_of_node)
      .def_property_readonly("values",
                             [](const PartitionDag& d) {
                               py::list l;
                               for (const auto& v : d.values)
                                 l.append(py::make_tuple(v.producer, v.consumers, v.bytes));
                               return l;
                             })
      .def_property_readonly("num_nodes", &PartitionDag::num_nodes)
      .def("__repr__", [](const PartitionDag& d) {
        return fmt::format("PartitionDag({} nodes, {} values)", d.num_nodes(), d.values.size());
      });
  py::class_<StageBounds>(m, "StageBounds")
      .def_readonly("lower", &StageBounds::lower)
      .def_readonly("upper", &StageBounds::upper)
      .def_property_readonly("num_fixed", &StageBounds::num_fixed);
  py::class_<IlpPartition>(m, "IlpPartition")
      .def_readonly("stage_of_node", &IlpPartition::stage_of_node)
      .def_readonly("stage_of_op", &IlpPartition::stage_of_op)
      .def_readonly("stage_flops", &IlpPartition::stage_flops)
      .def_readonly("cut_bytes", &IlpPartition::cut_bytes)
      .def_property_readonly(
          "status",
          [](const IlpPartition& p) { return std::string(weft::solver::ilp_status_name(p.status)); })
      .def_readonly("gap", &IlpPartition::gap)
      .def_readonly("wall_s", &IlpPartition::wall_s)
      .def_readonly("solve_s", &IlpPartition::solve_s)
      .def_readonly("num_variables", &IlpPartition::num_variables)
      .def_readonly("num_constraints", &IlpPartition::num_constraints)
      .def_readonly("num_fixed_nodes", &IlpPartition::num_fixed_nodes)
      .def_property_readonly("has_solution", &IlpPartition::has_solution)
      .def("__repr__", &IlpPartition::to_string);
  m.def("dag_from_graph", &dag_from_graph, py::arg("graph"));
  m.def("cut_bytes", &cut_bytes, py::arg("dag"), py::arg("stage_of_node"));
  m.def("stage_compute", &stage_compute, py::arg("dag"), py::arg("stage_of_node"), py::arg("num_stages"));
  m.def("feasible_partition", &feasible_partition, py::arg("dag"), py::arg("stage_of_node"),
        py::arg("num_stages"), py::arg("epsilon"));
  m.def("stage_bounds", &stage_bounds, py::arg("dag"), py::arg("num_stages"), py::arg("epsilon"),
        py::arg("paper_upper") = false);
  m.def(
      "partition_ilp",
      [](const weft::ir::Graph& g, int S, double eps, bool tight, bool paper, double limit, double gap) {
        return partition_ilp(g, ilp_options(S, eps, tight, paper, limit, gap));
      },
      py::arg("graph"), py::arg("num_stages"), py::arg("epsilon") = 0.1, py::arg("bound_tightening") = true,
      py::arg("paper_upper_bound") = false, py::arg("time_limit_s") = 30.0, py::arg("relative_gap") = 0.0);
  m.def(
      "partition_dag_ilp",
      [](const PartitionDag& d, int S, double eps, bool tight, bool paper, double limit, double gap) {
        return partition_dag_ilp(d, ilp_options(S, eps, tight, paper, limit, gap));
      },
      py::arg("dag"), py::arg("num_stages"), py::arg("epsilon") = 0.1, py::arg("bound_tightening") = true,
      py::arg("paper_upper_bound") = false, py::arg("time_limit_s") = 30.0, py::arg("relative_gap") = 0.0);
  m.def("partition_dag_exhaustive", &partition_dag_exhaustive, py::arg("dag"), py::arg("num_stages"),
        py::arg("epsilon"));
}
