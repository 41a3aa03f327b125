// Bindings of weft/core: dtypes, figures in adaptive units.
#include <pybind11/pybind11.h>

#include <string>

#include "weft/core/dtype.hpp"
#include "weft/core/units.hpp"

namespace py = pybind11;

void bind_core(py::module_& m) {
  m.def("dtype_size", [](const std::string& name) { return weft::dtype_size(weft::parse_dtype(name)); },
        py::arg("dtype"), "Bytes per element of a dtype name such as 'f32' or 'bf16'.");
  m.def("format_bytes", &weft::format_bytes, py::arg("bytes"),
        "A size in decimal units, 3 significant digits: '497 kB', '30.9 GB' (the C++ summaries' own).");
  m.def("format_seconds", &weft::format_seconds, py::arg("seconds"),
        "A time, 4 significant digits: '478.3 µs', '1.59 ms', '2.5 min' (never '1.59e+03 ms').");
  m.def("format_flops", &weft::format_flops, py::arg("flops"), py::arg("per_second") = false,
        "An amount of work, 3 significant digits: '41.6 MFLOP', '126 TFLOP/s' with per_second.");
}
