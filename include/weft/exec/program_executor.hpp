#pragma once
// CPU reference executor of lowered programs (lower::Program): every rank is a thread of this
// process, holding its tiles as dense row-major f64 arrays (exec's tile layout); compute runs the
// interpreter's kernels (ir/kernels.hpp: one kernel per op kind, shared) on the local tiles;
// collectives move real values between the threads inside their groups. It is the proof that a
// plan computes the training step of one device: execute_reference runs the same steps on one
// device with the same kernels, and the tests compare losses, parameters and gradients.
//
// Data and initial values (init.hpp) are a pure function of (seed, tensor, step, global element
// index), so a rank initialises its shard locally and it equals the slice of the global value.
// dtype F32 rounds every stored value (leaves, kernel results, collective results) to float, with
// f64 arithmetic inside a kernel (f32 storage, f64 accumulation).
//
// Bytes: a rank's bytes sent per collective kind are those of the algorithm the cost model prices
// (ring all-reduce 2(k−1)/k·B, all-gather (k−1)·B_in, reduce-scatter (k−1)·B_out, all-to-all the
// elements that change rank), counted element by element in the graph tensor's dtype.
// Errors: a rank that throws stops the others; a rank blocked at a collective longer than
// timeout_s fails with an error naming the rank and the instruction (never a hang).
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "weft/core/dtype.hpp"
#include "weft/ir/graph.hpp"
#include "weft/ir/interpreter.hpp"
#include "weft/lower/program.hpp"

namespace weft::exec {

struct ExecuteOptions {
  int steps = 3;
  std::uint64_t seed = 0;
  DType dtype = DType::F64;  // F64 or F32 (storage precision)
  // Global values of Input leaves by name, used at every step (others are generated per step).
  std::map<std::string, ir::HostTensor> inputs;
  double timeout_s = 30;  // a rank waiting longer than this at a collective fails
  // Parameters without a value drawn from the seed even in a graph whose parameters are its own
  // (the user's init="seed"; exec/init.hpp). Buffers and Constants are never seeded.
  bool seed_all_parameters = false;
};

struct RankStats {
  std::map<std::string, std::int64_t> bytes_sent;      // per collective kind name, resharding edges
  std::map<std::string, std::int64_t> bytes_received;  // the same, received
  std::int64_t internal_bytes_sent = 0;  // collectives inside an op (vocab-parallel statistics)
  std::int64_t peak_bytes = 0;           // largest live buffer bytes (f64 storage) during a step
  double seconds = 0;
  std::int64_t total_sent() const;
};

struct ExecutionResult {
  std::vector<double> losses;                          // one per step
  std::map<std::string, ir::HostTensor> parameters;    // after the last step, global
  std::map<std::string, ir::HostTensor> gradients;     // of the last step, global
  std::vector<RankStats> ranks;                        // empty for the reference
  double seconds = 0;
};

ExecutionResult execute_program(const lower::Program& program, const ExecuteOptions& options = {});
ExecutionResult execute_reference(const ir::Graph& step, const ExecuteOptions& options = {});

}  // namespace weft::exec
