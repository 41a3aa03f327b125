// Bindings of the IR-independent part of weft/cost: roofline, collectives, calibration.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>

#include "weft/core/dtype.hpp"
#include "weft/cost/calibration.hpp"
#include "weft/cost/collectives.hpp"
#include "weft/cost/roofline.hpp"

namespace py = pybind11;
using namespace weft::cost;

void bind_cost(py::module_& m) {
  py::class_<Calibration>(m, "Calibration",
                          "Measured cost-model constants (efficiencies, overhead, α/β scales).")
      .def(py::init<>())
      .def_static("from_json", &Calibration::from_json, py::arg("text"))
      .def("to_json", &Calibration::to_json)
      .def_readwrite("default_compute_efficiency", &Calibration::default_compute_efficiency)
      .def_readwrite("default_memory_efficiency", &Calibration::default_memory_efficiency)
      .def_readwrite("kernel_overhead", &Calibration::kernel_overhead)
      .def_property_readonly("matmul_efficiency",
                             [](const Calibration& c) {
                               py::dict r;
                               for (auto& [kind, mm] : c.matmul_efficiency) {
                                 py::dict d;
                                 for (auto& [t, e] : mm) d[py::str(std::string(weft::dtype_name(t)))] = e;
                                 r[py::str(kind)] = d;
                               }
                               return r;
                             })
      .def_readwrite("alpha_scale", &Calibration::alpha_scale)
      .def_readwrite("beta_scale", &Calibration::beta_scale)
      .def("compute_eff", [](const Calibration& c, const std::string& kind,
                             const std::string& t) { return c.compute_eff(kind, weft::parse_dtype(t)); })
      .def("memory_eff", &Calibration::memory_eff)
      .def("__eq__", [](const Calibration& a, const Calibration& b) { return a == b; })
      .def("__repr__", [](const Calibration& c) { return "Calibration(" + c.to_json() + ")"; });
  m.def("calibrated_cluster", py::overload_cast<const weft::cluster::Cluster&, const Calibration&>(&calibrated), py::arg("cluster"), py::arg("calibration"),
        "The cluster as the calibration measured it: what the calibration gives replaces the devices' defaults "
        "(peaks x given compute efficiency with the default ceiling dropped, a given matmul curve, memory "
        "bandwidth x given memory efficiency, the given kernel overhead); link latency x alpha_scale, "
        "bandwidth / beta_scale.");
  m.def(
      "compute_time",
      [](double flops, double bytes, const std::string& dtype, const weft::cluster::Device& d,
         const Calibration& cal) { return compute_time(flops, bytes, weft::parse_dtype(dtype), d, cal); },
      py::arg("flops"), py::arg("bytes"), py::arg("dtype"), py::arg("device"),
      py::arg("calibration") = Calibration(),
      "Roofline time: max(flops/(peak*ceiling), bytes/(bw*memory efficiency)) + kernel overhead.");
  m.def(
      "roofline",
      [](double flops, double bytes, const std::string& dtype, const weft::cluster::Device& d,
         const Calibration& cal) {
        auto r = roofline(flops, bytes, weft::parse_dtype(dtype), d, cal);
        py::dict o;
        o["compute"] = r.compute;
        o["memory"] = r.memory;
        o["total"] = r.total;
        o["compute_bound"] = r.compute_bound();
        return o;
      },
      py::arg("flops"), py::arg("bytes"), py::arg("dtype"), py::arg("device"),
      py::arg("calibration") = Calibration());
  m.def(
      "collective_time",
      [](const std::string& kind, const weft::cluster::AxisLink& l, double bytes, const Calibration& cal) {
        return collective_time(parse_collective(kind), l, bytes, cal);
      },
      py::arg("kind"), py::arg("link"), py::arg("bytes"), py::arg("calibration") = Calibration(),
      "α-β time of 'all-reduce', 'all-gather', 'reduce-scatter', 'all-to-all' or 'p2p' along one mesh axis.");
}
