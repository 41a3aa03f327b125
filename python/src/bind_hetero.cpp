// Bindings of weft/pipeline/hetero.hpp (heterogeneous load balancing, Whale's Algorithm 1) in the
// submodule weft._weft.hetero; the Pythonic layer is python/weft/hetero.py.
#include <pybind11/functional.h>
#include <pybind11/operators.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "weft/cluster/cluster.hpp"
#include "weft/core/dtype.hpp"
#include "weft/core/error.hpp"
#include "weft/ir/graph.hpp"
#include "weft/pipeline/hetero.hpp"

namespace py = pybind11;
using namespace weft::pipeline;

void bind_hetero(py::module_& root) {
  py::module_ m =
      root.def_submodule("hetero", "Heterogeneous load balancing (Whale's Algorithm 1, corrected).");

  py::class_<DeviceCapacity>(m, "DeviceCapacity",
                             "A device as the balancer sees it: effective FLOP/s and memory.")
      .def(py::init<double, double, std::string>(), py::arg("flops"), py::arg("memory_bytes"),
           py::arg("name") = "")
      .def_readonly("flops", &DeviceCapacity::flops)
      .def_readonly("memory_bytes", &DeviceCapacity::memory_bytes)
      .def_readonly("name", &DeviceCapacity::name)
      .def("__repr__", &DeviceCapacity::to_string)
      .def(py::self == py::self)
      .def("__hash__",
           [](const DeviceCapacity& d) { return py::hash(py::make_tuple(d.flops, d.memory_bytes, d.name)); });

  py::class_<LoadModel>(m, "LoadModel",
                        "Load of one unit: flops_per_unit; memory = static_bytes + units * bytes_per_unit; "
                        "fixed_flops independent of the load.")
      .def(py::init<double, double, double, double>(), py::arg("flops_per_unit"),
           py::arg("static_bytes") = 0.0, py::arg("bytes_per_unit") = 0.0, py::arg("fixed_flops") = 0.0)
      .def_readonly("flops_per_unit", &LoadModel::flops_per_unit)
      .def_readonly("static_bytes", &LoadModel::static_bytes)
      .def_readonly("bytes_per_unit", &LoadModel::bytes_per_unit)
      .def_readonly("fixed_flops", &LoadModel::fixed_flops)
      .def("memory", &LoadModel::memory, py::arg("units"))
      .def("max_units", &LoadModel::max_units, py::arg("memory_bytes"))
      .def("__repr__", &LoadModel::to_string)
      .def(py::self == py::self)
      .def("__hash__", [](const LoadModel& l) {
        return py::hash(py::make_tuple(l.flops_per_unit, l.static_bytes, l.bytes_per_unit, l.fixed_flops));
      });

  py::class_<HeteroShares>(m, "HeteroShares", "Shares per device, their times and memory, feasibility.")
      .def_readonly("units", &HeteroShares::units)
      .def_readonly("proportional", &HeteroShares::proportional)
      .def_readonly("time", &HeteroShares::time)
      .def_readonly("memory", &HeteroShares::memory)
      .def_readonly("max_time", &HeteroShares::max_time)
      .def_readonly("shifts", &HeteroShares::shifts)
      .def_readonly("feasible", &HeteroShares::feasible)
      .def_readonly("missing_units", &HeteroShares::missing_units)
      .def_readonly("missing_bytes", &HeteroShares::missing_bytes)
      .def_readonly("message", &HeteroShares::message)
      .def("__repr__", &HeteroShares::to_string)
      .def(py::self == py::self);

  m.def(
      "balance_load",
      py::overload_cast<const std::vector<DeviceCapacity>&, const std::vector<LoadModel>&, std::int64_t>(
          &balance_load),
      py::arg("devices"), py::arg("loads"), py::arg("total_units"),
      "Algorithm 1 with one load model per device; ValueError (with the missing memory) when nothing fits.");
  m.def("try_balance_load",
        py::overload_cast<const std::vector<DeviceCapacity>&, const std::vector<LoadModel>&, std::int64_t>(
            &try_balance_load),
        py::arg("devices"), py::arg("loads"), py::arg("total_units"),
        "Like balance_load; infeasible -> feasible=False.");
  m.def("evaluate_load", &evaluate_load, py::arg("devices"), py::arg("loads"), py::arg("units"));
  m.def("even_units", &even_units, py::arg("total_units"), py::arg("devices"));
  m.def("split_dimension", &split_dimension, py::arg("devices"), py::arg("dim_size"),
        py::arg("granularity") = 1, py::arg("per_granule") = LoadModel{});
  m.def("memory_descending_order", &memory_descending_order, py::arg("devices"));
  m.def(
      "capacities",
      [](const weft::cluster::Cluster& c, const std::vector<int>& ids, const std::string& dtype,
         const weft::cost::Calibration& cal) { return capacities(c, ids, weft::parse_dtype(dtype), cal); },
      py::arg("cluster"), py::arg("device_ids"), py::arg("dtype") = "f32",
      py::arg("calibration") = weft::cost::Calibration{});

  py::class_<ModelProfile>(m, "ModelProfile", "A training graph's ops as affine functions of the batch.")
      .def_static(
          "from_builder",
          [](const std::function<weft::ir::Graph(std::int64_t)>& build, const std::string& optimizer,
             const std::string& layer_prefix) {
            weft::ir::TrainOptions o;
            WEFT_CHECK(optimizer == "adam" || optimizer == "sgd" || optimizer == "none",
                       "optimizer must be 'adam', 'sgd' or 'none' (got '{}')", optimizer);
            o.optimizer = optimizer == "adam"  ? weft::ir::Optimizer::Adam
                          : optimizer == "sgd" ? weft::ir::Optimizer::Sgd
                                               : weft::ir::Optimizer::None;
            return ModelProfile::from_builder(build, o, layer_prefix);
          },
          py::arg("build"), py::arg("optimizer") = "adam", py::arg("layer_prefix") = "",
          "Profile of the training graph of build(batch) (built at batch 1 and 2).")
      .def_static(
          "from_preset",
          [](const std::string& name, const std::string& dtype) {
            return ModelProfile::from_preset(name, weft::parse_dtype(dtype));
          },
          py::arg("preset"), py::arg("dtype") = "f32")
      .def_property_readonly("name", &ModelProfile::name)
      .def_property_readonly("num_layers", &ModelProfile::num_layers)
      .def_property_readonly("param_bytes", &ModelProfile::param_bytes)
      .def("flops", &ModelProfile::flops, py::arg("batch"))
      .def("time", &ModelProfile::time, py::arg("batch"), py::arg("device"),
           py::arg("calibration") = weft::cost::Calibration{})
      .def("peak_memory", &ModelProfile::peak_memory, py::arg("batch"))
      .def("memory_line", &ModelProfile::memory_line, py::arg("b_hi"))
      .def("__repr__", &ModelProfile::to_string);

  py::class_<DataParallelOptions>(m, "DataParallelOptions")
      .def(py::init<>())
      .def_readwrite("calibration", &DataParallelOptions::calibration)
      .def_readwrite("overlap_grad_sync", &DataParallelOptions::overlap_grad_sync)
      .def_readwrite("bucket_bytes", &DataParallelOptions::bucket_bytes);
  py::class_<DpEvaluation>(m, "DpEvaluation")
      .def_readonly("batch", &DpEvaluation::batch)
      .def_readonly("compute", &DpEvaluation::compute)
      .def_readonly("memory", &DpEvaluation::memory)
      .def_readonly("allreduce", &DpEvaluation::allreduce)
      .def_readonly("step_time", &DpEvaluation::step_time)
      .def_readonly("throughput", &DpEvaluation::throughput)
      .def_readonly("fits", &DpEvaluation::fits)
      .def("__repr__", &DpEvaluation::to_string);
  m.def("evaluate_data_parallel", &evaluate_data_parallel, py::arg("model"), py::arg("cluster"),
        py::arg("device_ids"), py::arg("batch"), py::arg("options") = DataParallelOptions{});
  m.def("balance_data_parallel", &balance_data_parallel, py::arg("model"), py::arg("cluster"),
        py::arg("device_ids"), py::arg("global_batch"), py::arg("options") = DataParallelOptions{});

  py::class_<PipelineOptions>(m, "PipelineOptions")
      .def(py::init<>())
      .def_readwrite("calibration", &PipelineOptions::calibration)
      .def_readwrite("micro_batch", &PipelineOptions::micro_batch)
      .def_readwrite("num_micro", &PipelineOptions::num_micro)
      .def_readwrite("replicas", &PipelineOptions::replicas);
  py::class_<PipelineEvaluation>(m, "PipelineEvaluation")
      .def_readonly("device_order", &PipelineEvaluation::device_order)
      .def_readonly("layers", &PipelineEvaluation::layers)
      .def_readonly("stage_time", &PipelineEvaluation::stage_time)
      .def_readonly("memory", &PipelineEvaluation::memory)
      .def_readonly("step_time", &PipelineEvaluation::step_time)
      .def_readonly("throughput", &PipelineEvaluation::throughput)
      .def_readonly("fits", &PipelineEvaluation::fits)
      .def("__repr__", &PipelineEvaluation::to_string);
  m.def("evaluate_pipeline", &evaluate_pipeline, py::arg("model"), py::arg("cluster"),
        py::arg("device_order"), py::arg("layers"), py::arg("options") = PipelineOptions{});
  m.def("balance_pipeline", &balance_pipeline, py::arg("model"), py::arg("cluster"), py::arg("device_ids"),
        py::arg("options") = PipelineOptions{});
  m.def("even_layers", &even_layers, py::arg("num_layers"), py::arg("stages"));
}
