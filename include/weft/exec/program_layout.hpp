#pragma once
// exec::ProgramLayout — what a rank of a lowered program needs beyond its instruction list: the
// tile of every buffer on every rank (the global indices each local row holds, its partial term),
// the graph each rank computes (uneven data parallelism runs the program's graph at the replica's
// own share, plan::rebatch), and the numbers an instruction takes from the GLOBAL op (kernel
// contexts, the samples a LoadInput skips, a Scale's factor, whether a rank's cross-entropy
// contributes to the loss's partial sum).
//
// One implementation of this tile math serves the CPU reference executor (program_executor.cpp)
// and the torch runtime (python/weft/runtime, through the bindings), so a buffer's layout cannot
// differ between the proof and the real run.
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "weft/ir/graph.hpp"
#include "weft/ir/kernels.hpp"
#include "weft/lower/program.hpp"
#include "weft/sharding/sharding_spec.hpp"

namespace weft::exec {

// A buffer's tile on one rank (exec's layout: dense row-major over local_shape, global order inside).
struct TileIndex {
  std::vector<std::int64_t> local_shape;
  std::vector<std::vector<std::int64_t>> global;  // per dim: local index -> global index
  std::vector<std::vector<std::int64_t>> local;   // per dim: global index -> local index or -1
  int partial_index = 0, partial_count = 1;       // which term of a partial value this rank holds
  std::vector<std::int64_t> strides;              // row-major strides of local_shape
};

// The tile at `coord` of a spec; with split fractions (Whale's uneven split on a 1-D mesh) a
// sharded dim holds this position's proportional piece instead of the even block.
TileIndex make_tile(const sharding::ShardingSpec& spec, const std::vector<std::int64_t>& coord,
                    const std::vector<double>& split_fraction = {});

class ProgramLayout {
 public:
  explicit ProgramLayout(const lower::Program& p);  // keeps a reference: p must outlive it
  ProgramLayout(const ProgramLayout&) = delete;
  ProgramLayout& operator=(const ProgramLayout&) = delete;

  const lower::Program& program() const { return p_; }
  // Rank r's tile of buffer b (computed on first use; safe from many threads). Throws weft::Error
  // when the buffer lives on another stage.
  const TileIndex& tile(int buffer, int rank) const;
  // The parsed spec of a buffer over its global shape.
  const sharding::ShardingSpec& spec(int buffer) const { return specs_.at(static_cast<std::size_t>(buffer)); }
  const ir::Graph& graph_of(int rank) const { return *rank_graph_.at(static_cast<std::size_t>(rank)); }
  // Samples per micro-batch of the rank's replica with uneven shares; 0 when the stage is even.
  std::int64_t share(int rank) const { return share_.at(static_cast<std::size_t>(rank)); }
  // The global-batch shape of an Input leaf (the program's graph holds one micro-batch).
  ir::Shape global_input_shape(ir::TensorId t) const;
  // Samples of one micro-batch over all replicas of a stage.
  static std::int64_t samples_per_microbatch(const lower::StageMesh& st);
  // Samples of the step's global batch.
  std::int64_t global_batch() const;
  // The positions in the global batch (sorted) whose samples rank r's LoadInput instructions read:
  // every position when it loads an input without a batch dim, none on a stage that loads no input.
  // A run that hands each rank only these rows (the Trainer's local batches) holds every input
  // whole at them and zeros elsewhere.
  std::vector<std::int64_t> rows_read(int rank) const;

  // Compute / Ce* instructions: the kernel context of the op on rank r's tiles at `step` (a cross
  // entropy's ce_valid_fraction is the step's data, left unset: exec::CeValidFractions computes it).
  ir::KernelContext kernel_context(int rank, const lower::Instr& i, int step) const;
  // LoadInput: how many samples of the global batch come before rank r's tile's dim 0 (0 for a
  // leaf without a batch dim).
  std::int64_t load_offset(int rank, const lower::Instr& i) const;
  // Samples of the step's batch before rank r's part of micro-batch `microbatch` (earlier
  // micro-batches, then this micro-batch's earlier replicas).
  std::int64_t sample_offset(int rank, int microbatch) const;
  // Scale: the factor rank r multiplies by (i.scale, times the replica's share when by_share).
  double scale_factor(int rank, const lower::Instr& i) const;
  // CeLoss: whether rank r's statistics enter the loss (coordinate 0 on every class-splitting axis).
  bool contributes(int rank, const lower::Instr& i) const;

 private:
  const lower::Program& p_;
  std::vector<sharding::ShardingSpec> specs_;
  std::map<std::int64_t, ir::Graph> graphs_;  // uneven shares: the graph at each other share
  std::vector<const ir::Graph*> rank_graph_;  // per rank
  std::vector<std::int64_t> share_;           // per rank
  mutable std::mutex mu_;
  mutable std::vector<std::vector<std::unique_ptr<TileIndex>>> tiles_;  // per buffer and rank, lazily
};

}  // namespace weft::exec
