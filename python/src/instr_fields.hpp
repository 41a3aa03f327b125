#pragma once
// The fields of a lowered instruction that every binding shows the same way; the callers add how
// they name the op and the buffers (names in Program.instructions, ids in ProgramLayout.instructions).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>

#include "weft/lower/program.hpp"

inline void put_instr_fields(pybind11::dict& d, const weft::lower::Instr& i) {
  d["kind"] = std::string(weft::lower::instr_kind_name(i.kind));
  d["axis"] = i.axis;
  d["group"] = i.group;
  d["reduce"] = i.reduce == weft::lower::ReduceOp::Max ? "max" : "sum";
  d["internal"] = i.internal;
  d["tag"] = i.tag;
  d["bucket"] = i.bucket;
  d["region"] = i.region;
}
