// Bindings of weft/core: dtypes.
#include <pybind11/pybind11.h>

#include <string>

#include "weft/core/dtype.hpp"

namespace py = pybind11;

void bind_core(py::module_& m) {
  m.def("dtype_size", [](const std::string& name) { return weft::dtype_size(weft::parse_dtype(name)); },
        py::arg("dtype"), "Bytes per element of a dtype name such as 'f32' or 'bf16'.");
}
