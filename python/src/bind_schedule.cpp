// Bindings of weft/schedule: pipeline schedules and their static checks.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <tuple>
#include <vector>

#include "weft/core/error.hpp"
#include "weft/schedule/schedule.hpp"

namespace py = pybind11;
using namespace weft::schedule;

namespace {
using OpTuple = std::tuple<std::string, int, int>;
OpKind parse_kind(const std::string& k) {
  if (k == "F") return OpKind::F;
  if (k == "B") return OpKind::B;
  if (k == "W") return OpKind::W;
  weft::fail("unknown op kind '{}' (expected 'F', 'B' or 'W')", k);
}
}  // namespace

void bind_schedule(py::module_& m) {
  py::class_<Op>(m, "ScheduleOp", "One compute op of a schedule: kind 'F', 'B' or 'W', stage, micro-batch.")
      .def_property_readonly("kind", [](const Op& o) { return std::string(op_kind_name(o.kind)); })
      .def_readonly("stage", &Op::stage)
      .def_readonly("micro", &Op::micro)
      .def("__eq__", [](const Op& a, const Op& b) { return a == b; })
      .def("__hash__", [](const Op& o) { return std::hash<std::string>{}(to_string(o)); })
      .def("__repr__", [](const Op& o) { return to_string(o); });

  py::class_<OrderCheck>(m, "OrderCheck", "Result of a schedule's dependency / send-recv pairing check.")
      .def_readonly("ok", &OrderCheck::ok)
      .def_readonly("problems", &OrderCheck::problems)
      .def("__bool__", [](const OrderCheck& c) { return c.ok; })
      .def("__repr__", &OrderCheck::to_string);

  py::class_<Schedule>(m, "Schedule", "A static per-device order of pipeline compute ops.")
      .def(py::init([](std::string name, int S, int D, int M, bool split,
                       const std::vector<std::vector<OpTuple>>& ord, std::vector<int> placement) {
             std::vector<std::vector<Op>> order;
             for (const auto& dev : ord) {
               auto& o = order.emplace_back();
               for (const auto& [k, s, mm] : dev) o.push_back(Op{parse_kind(k), s, mm});
             }
             return Schedule(std::move(name), S, D, M, split, std::move(order), std::move(placement));
           }),
           py::arg("name"), py::arg("num_stages"), py::arg("num_devices"), py::arg("num_micro"),
           py::arg("split_backward"), py::arg("order"), py::arg("placement") = std::vector<int>{},
           "Build from per-device lists of (kind, stage, micro) tuples; validated for completeness. "
           "placement: the device of each logical stage (default: stage s on device s mod D).")
      .def_property_readonly("name", &Schedule::name)
      .def_property_readonly("num_stages", &Schedule::num_stages)
      .def_property_readonly("num_devices", &Schedule::num_devices)
      .def_property_readonly("num_micro", &Schedule::num_micro)
      .def_property_readonly("virtual_stages", &Schedule::virtual_stages)
      .def_property_readonly("split_backward", &Schedule::split_backward)
      .def_property_readonly("num_ops", &Schedule::num_ops)
      .def("device_of", &Schedule::device_of, py::arg("stage"))
      .def_property_readonly("placement", &Schedule::placement, "The device of each logical stage.")
      .def_property_readonly("default_placement", &Schedule::default_placement,
                             "True when stage s lives on device s mod D.")
      .def("chunk_of", &Schedule::chunk_of, py::arg("stage"),
           "The stage's chunk on its device (its rank among the device's stages).")
      .def_property_readonly(
          "order",
          [](const Schedule& s) {
            std::vector<std::vector<OpTuple>> out;
            for (const auto& dev : s.order()) {
              auto& o = out.emplace_back();
              for (const Op& op : dev) o.emplace_back(op_kind_name(op.kind), op.stage, op.micro);
            }
            return out;
          },
          "Per device, the ops as (kind, stage, micro) tuples in execution order.")
      .def("peak_in_flight", &Schedule::peak_in_flight,
           "Per logical stage: max micro-batches with F done, last backward not.")
      .def("peak_in_flight_device", &Schedule::peak_in_flight_device)
      .def("to_text", &Schedule::to_text)
      .def("to_json", &Schedule::to_json)
      .def_static("from_json", &Schedule::from_json, py::arg("text"))
      .def("__eq__", [](const Schedule& a, const Schedule& b) { return a == b; })
      .def("__hash__", &Schedule::hash)
      .def("__repr__", &Schedule::to_string);

  m.def("gpipe", &gpipe, py::arg("stages"), py::arg("micro_batches"));
  m.def("one_f_one_b", &one_f_one_b, py::arg("stages"), py::arg("micro_batches"));
  m.def("kfkb", &kfkb, py::arg("stages"), py::arg("micro_batches"), py::arg("k"));
  m.def("eager_1f1b", &eager_1f1b, py::arg("stages"), py::arg("micro_batches"));
  m.def("interleaved_1f1b", &interleaved_1f1b, py::arg("devices"), py::arg("virtual_stages"),
        py::arg("micro_batches"));
  m.def("zb_h1", &zb_h1, py::arg("stages"), py::arg("micro_batches"));
  m.def("zb_interleaved", &zb_interleaved, py::arg("devices"), py::arg("virtual_stages"),
        py::arg("micro_batches"));
  m.def("zbv", &zbv, py::arg("devices"), py::arg("micro_batches"));
  m.def("dualpipev", &dualpipev, py::arg("devices"), py::arg("micro_batches"));
  m.def("kfkb_interleaved", &kfkb_interleaved, py::arg("devices"), py::arg("virtual_stages"),
        py::arg("micro_batches"), py::arg("k"));
  m.def("loop_placement", &loop_placement, py::arg("stages"), py::arg("devices"));
  m.def("v_placement", &v_placement, py::arg("devices"));
  m.def("make_schedule", &make_schedule, py::arg("kind"), py::arg("stages"), py::arg("micro_batches"),
        py::arg("k") = 1, py::arg("v") = 1);
  m.def("check_order", &check_order, py::arg("schedule"),
        "Dependency (deadlock) and send/recv pairing check.");
  m.def("check_pairing", &check_pairing, py::arg("schedule"));
  m.def("check_dependencies", &check_dependencies, py::arg("schedule"));
}
