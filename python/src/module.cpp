// The extension module weft._weft: errors and the per-module bindings.
#include <pybind11/pybind11.h>

#include "bindings_list.inc"
#include "weft/core/error.hpp"
#include "weft/core/stop_token.hpp"

PYBIND11_MODULE(_weft, m) {
  m.doc() = "weft C++ core";
  // weft::Error is bad input: it reaches Python as ValueError. Anything else is internal and
  // pybind11 turns std::exception into RuntimeError.
  pybind11::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const weft::Cancelled& e) {  // a search stopped through its StopToken
      PyErr_SetString(PyExc_KeyboardInterrupt, e.what());
    } catch (const weft::InternalError& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    } catch (const weft::Error& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });
  weft_call_bindings(m);
}
