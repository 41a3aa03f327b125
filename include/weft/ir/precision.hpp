#pragma once
// The precision each float tensor of a graph is held at when an executor runs it.
//
// A graph has a base float dtype (its parameters'); an executor runs that base at its own dtype
// (the interpreter f64, `weft.execute` f64 or f32, the torch runtime the run's dtype). A tensor of
// another float dtype is a region the model computes at a different precision on purpose (Hugging
// Face's RMSNorm upcast, an f32 rotary table in an f64 model; a Cast op makes one): one narrower
// than the base is held at its own dtype where the run is wider (an f32 region of an f64 model run
// in f64 is rounded to f32), one wider than the base is never held below its dtype (the f32 region
// of a bf16 model stays f32). For a single-dtype graph every float tensor is at the run's dtype.
#include "weft/core/dtype.hpp"
#include "weft/ir/graph.hpp"
#include "weft/ir/host_tensor.hpp"

namespace weft::ir {

// The most common float dtype of the graph's Parameter leaves, else of its other float tensors
// (optimizer states aside); ties go to the wider; F32 for a graph without floats.
DType base_float_dtype(const Graph& g);

// The dtype a float tensor of dtype `t` is held at when base dtype `base` runs at `run` (integer
// dtypes are returned unchanged). Precision order: bf16 < f16 < f32 < f64 (significand bits).
DType held_dtype(DType t, DType base, DType run);

// x rounded to dtype d, round-to-nearest-even as torch converts a double (bf16 and f16 through
// f32, as c10's constructors do); f64 and integer dtypes unchanged.
double round_to_dtype(double x, DType d);
void round_to_dtype(HostTensor& t, DType d);

}  // namespace weft::ir
