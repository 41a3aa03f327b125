#pragma once
// The normaliser of torch's mean cross entropy under micro-batches and data parallelism.
//
// torch's mean over labels with ignore_index and class weights divides by D = Σ_t w[y_t]·[y_t ≠ ii]
// over the WHOLE batch. A program runs the loss per micro-batch (and replica) and takes the mean of
// the parts weighted by their samples (the lowering's `scale`, 1/(M·d) when even): dividing each part
// by its own count is not torch's gradient when the parts hold different numbers of valid labels.
// So each part divides by its share of the step's count, tokens_p·ρ with ρ = D / N (N the step's
// labels): Σ_p (n_p/N)·Σ_{t∈p} ℓ_t / (n_p·ρ) = Σ_t ℓ_t / D exactly. ρ is data: whoever feeds the
// step's inputs computes it (the CPU executor, each torch rank — every rank holds the global batch,
// so no communication) and hands it to the kernels (ir::KernelContext::ce_valid_fraction).
//
// The labels (and class weights) may be computed from the inputs (a causal LM shifts its labels:
// labels[:, 1:]): their producing ops are evaluated on each part's inputs with the f64 kernels,
// micro-batch by micro-batch and replica by replica, at each replica's own share. A cone that reads
// a parameter is refused (the labels of a loss are data).
//
// A run whose ranks hold only the rows they read (the Trainer's local batches,
// ProgramLayout::rows_read) counts instead: each part (replica × micro-batch) is counted by ONE rank,
// the lowest whose rows hold all of the part's samples (tensor-parallel ranks of a replica read the
// same rows: counted once), so the ranks' counts() summed — one all-reduce of two numbers per loss —
// are the step's, and fractions() of the sum is compute(). A part no single rank holds (its batch
// split inside a replica) is counted by rank 0 from its rows gathered first (unheld_rows()).
#include <map>
#include <mutex>
#include <vector>

#include "weft/exec/init.hpp"
#include "weft/exec/program_layout.hpp"
#include "weft/ir/graph.hpp"
#include "weft/ir/host_tensor.hpp"

namespace weft::exec {

class CeValidFractions {
 public:
  // The program's cross entropies that divide by a weighted count (not token_mean), grouped by
  // (labels, weights, ignore_index): a loss and its gradient share one. Throws weft::Error when
  // their labels or weights depend on a parameter or an optimizer state.
  explicit CeValidFractions(const ProgramLayout& layout);
  bool empty() const { return groups_.empty(); }
  // Whether compute() reads leaf t (an Input it needs from `inputs`).
  bool reads(ir::TensorId t) const;
  // ρ of each such op id at `step`: Input leaves from `inputs` (the global batch) where given, else
  // from `leaves` (seeded synthetic data, constants, buffers). weft::Error for a label that is
  // neither the ignore_index nor a class.
  std::map<ir::OpId, double> compute(const LeafValues& leaves,
                                     const std::map<ir::TensorId, const ir::HostTensor*>& inputs,
                                     int step) const;
  // Per group of losses, in order: {Σ w[y]·[y ≠ ii], labels} over the parts `rank` counts (every part
  // when rank < 0). Inputs as compute(); only the rows of the parts counted are read.
  std::vector<double> counts(const LeafValues& leaves,
                             const std::map<ir::TensorId, const ir::HostTensor*>& inputs, int step,
                             int rank = -1) const;
  // ρ of each op id from the step's counts (counts() of every rank, summed).
  std::map<ir::OpId, double> fractions(const std::vector<double>& counts) const;
  // The global-batch rows of the parts no single rank holds whole (sorted; usually none): a run with
  // local batches gathers them to rank 0, which counts those parts.
  std::vector<std::int64_t> unheld_rows() const;

 private:
  // Which rank counts part (replica q, micro-batch m) of every group (lazily: the rows every rank reads).
  void assign_parts() const;
  struct Group {
    std::vector<ir::OpId> ops;
    ir::TensorId labels = -1, weight = -1;
    std::int64_t ignore_index = -100;
    std::vector<ir::OpId> cone;  // the ops that make labels and weights, in topological order
    std::vector<ir::TensorId> leaves;
    std::vector<int> part_ranks;       // one rank per replica of the stage running the loss
    mutable std::vector<int> counter;  // per part q * microbatches + m: the rank counting it (-1: rank 0,
                                       // from gathered rows); filled by assign_parts()
  };
  const ProgramLayout& layout_;
  std::vector<Group> groups_;
  mutable std::once_flag assigned_;
  mutable std::vector<std::int64_t> unheld_;
};

}  // namespace weft::exec
