// The simulated execution of a Program (check_dataflow's), for the checks that follow values
// across ranks in the order they would run: a Send's value reaches its Recv, a collective's
// members meet. Private to src/lower.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "weft/lower/program.hpp"

namespace weft::lower {

struct SimulationHooks {
  // Each instruction a rank runs outside a collective, in its order: a Send once its message is
  // posted, a Recv once the Send of its message ran (so its sender's hook came first).
  std::function<void(int rank, std::size_t index)> local;
  // A collective that completes: its group, and the index of the instruction of each member.
  std::function<void(const std::vector<int>& group, const std::vector<std::size_t>& indices)> collective;
};

// Runs the program as check_dataflow does (throws weft::Error on a deadlock or a mismatched
// message); call it only on a program check_dataflow accepted (groups and ids are not re-checked).
void simulate_execution(const Program& p, const SimulationHooks& hooks);

// Which micro-batches each value holds (provenance), followed through the simulated execution: a
// load-input holds its micro-batch, a leaf none, a compute or a collective what its inputs hold
// (an op never mixes two micro-batches, a collective's members hold the same ones), an
// accumulation the union of two disjoint sets. At the end of the step every leaf a rank rewrote,
// every gradient and the loss hold all of its stage's micro-batches or none. This catches an
// accumulation deleted, duplicated or fed the wrong micro-batch, which the per-instruction checks
// cannot tell from a plain copy.
void check_microbatches(const Program& p);

}  // namespace weft::lower
